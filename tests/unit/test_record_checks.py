"""A record cannot hold a figure no measurement produces (harness.report.checks), and the memory
breakdown of a CPU step is never below zero whatever memory the data set lives in."""

from __future__ import annotations

import copy
import os
import re

import numpy as np
import pytest
import torch

from harness.metrics.meter import StepMeter, track_cpu_allocations
from harness.report.checks import environments, impossible, provenance
from harness.report.tables import build, to_frame
from tests.helpers import studies
from tests.unit.test_results import _rec

MIB = 2**20


def _sound(strategy="dp", throughput=100.0) -> dict:
    parts = {"parameters": 1 * MIB, "gradients": 1 * MIB, "optimizer_state": 2 * MIB, "stashed_weights": 0}
    parts["other"] = 6 * MIB
    return {
        **_rec(strategy, 2, throughput, 10 * MIB),
        "per_rank": [{"rank": r, "memory_breakdown": {**parts, "at_step_start": 3 * MIB}} for r in (0, 1)],
        "bubble_measured": 0.2,
        "bubble_per_rank": [0.1, 0.3],
        "idle_breakdown": {"compute": 0.8, "peer_wait": 0.2},
    }


def _broken(edit) -> dict:
    record = copy.deepcopy(_sound())
    edit(record)
    return record


@pytest.mark.parametrize(
    "edit,error",
    [
        (
            lambda r: r["per_rank"][1]["memory_breakdown"].update(at_step_start=-4 * MIB),
            "rank 1's memory at_step_start is -4.00 MiB, below zero",
        ),
        (
            lambda r: r["per_rank"][0]["memory_breakdown"].update(other=7 * MIB),
            "rank 0's memory parts add up to 11.00 MiB, not its peak of 10.00 MiB",
        ),
        (lambda r: r.update(bubble_measured=1.3), "bubble_measured is 1.3, outside 0-1"),
        (lambda r: r["bubble_per_rank"].__setitem__(0, -0.1), r"bubble_per_rank\[0\] is -0.1, outside 0-1"),
        (lambda r: r["idle_breakdown"].update(host=2.0), "idle_breakdown.host is 2, outside 0-1"),
        (lambda r: r.update(throughput=120.0), "throughput 120/s is not the global batch 64 over the step time"),
    ],
)
def test_each_impossible_figure_is_named(edit, error):
    assert impossible(_sound()) == []
    found = impossible(_broken(edit))
    assert any(re.search(error, e) for e in found), found


def test_a_run_with_an_impossible_figure_is_footnoted_and_never_a_best():
    # the faster Hippie run carries a negative memory part: it is not bolded, and says why
    runs = [_sound("dp", 100.0), _sound("hippie", 150.0), _sound("ashpipe", 120.0)]
    runs[1]["per_rank"][0]["memory_breakdown"]["at_step_start"] = -MIB
    table = build(to_frame(runs), "speed")
    rows = table.rows.set_index("strategy")
    assert "impossible figures: rank 0's memory at_step_start" in rows.loc["hippie", "note"]
    bold = {(table.rows.loc[i, "strategy"], key) for i, key in table.bold}
    assert ("hippie", "throughput") not in bold and ("ashpipe", "throughput") in bold


def test_a_cpu_step_leaves_out_only_what_the_allocator_counted():
    """A data set in numpy's memory or in shared memory is in neither the allocator's total at
    the step's start nor its peak: taking it out of both made the start of a digits step -2.3 MiB."""
    track_cpu_allocations()
    from_numpy = torch.from_numpy(np.ones((1024, 1024), dtype=np.float32))  # 4 MiB torch did not allocate
    shared = torch.ones(1024, 256).share_memory_()  # 1 MiB in shared memory
    owned = torch.ones(256, 256)  # 0.25 MiB from the allocator
    weight = torch.nn.Parameter(torch.randn(64, 64))
    opt = torch.optim.SGD([weight], lr=0.1)
    meter = StepMeter(torch.device("cpu"))
    with meter.measure_step(lambda: {"parameters": [weight]}, lambda: [from_numpy, shared, owned]):
        (weight @ torch.randn(64, 64)).sum().backward()
        opt.step()
    parts = meter.breakdown
    assert parts["host_excluded"] == owned.untyped_storage().nbytes()
    assert parts["at_step_start"] >= 0 and parts["other"] >= 0
    assert impossible({"peak_memory_per_rank": [meter.peak_bytes], "per_rank": [{"memory_breakdown": parts}]}) == []


@pytest.mark.parametrize("study", studies.params(studies.committed(), studies.UNCLEAN))
def test_every_committed_study_ran_from_a_clean_tree_at_one_commit(study):
    found = environments(os.path.join(studies.RESULTS, study))
    assert provenance([{"environment": e} for e, _ in found]) == []
