"""The simulator against real runs on this machine: a part of one repeat of `pipebench validate`
(the repeated tables are in results/simulator_validation/)."""

import json
import os

import numpy as np
import pandas as pd
import pytest

from harness import commands
from harness.studies import changed_config
from harness.studies.changed_config import summarise
from tests.helpers.cli import run_cli

# One run on this shared 2-core machine differs from the next run of the same configuration by
# up to 25% (results/simulator_validation/: dp 743-855 samples/s over three repeats, hippie
# 608-713), and the profile a prediction comes from is one more such measurement, so a single
# prediction can be far off by chance: over the validation's runs of configurations it did not
# profile, the per-run error's 90th percentile is 34.7% and its largest +44%, and a fresh-clone
# suite saw this guard at +46% three times in a row (2026-12-07; the next run within the bound).
# The bound is therefore above the largest per-run error measured, and a guard outside it is
# measured again, twice, and judged by its median error. What this guard catches is a cost model
# broken outright (a missing stage, a doubled transfer); each cost's own proof runs without
# processes (tests/unit/test_simulator.py), and the simulator's error on the mean of interleaved
# repeats is what `pipebench validate` shows.
SINGLE_RUN_BOUND = 0.5
REPLAY_FACTOR = 2.0
REMEASURES = 2


# a fast guard (about forty seconds): vit_micro profiled once under our runtime's 1F1B at 4
# micro-batches, then that configuration and one it did not profile (2 micro-batches, half the global
# batch) run and predicted from it; the replay of every other schedule and cost is checked without
# processes (tests/unit/test_simulator.py), the whole matrix by the command
GUARD = ("vit_micro hippie 1f1b m=4 (profiled)", "vit_micro hippie m=2 B=32")


def _in_this_process(args: list[str], cwd: str, run_dir: str | None = None) -> None:
    """One command of the repeat through pipebench's own code path in this process, its workers
    forked from the server this process already runs: a new interpreter per command costs several
    seconds on 2 cores, and the runs are measured in their workers either way."""
    code = commands.main([*args, *([f"hydra.run.dir={run_dir}"] if run_dir else [])])
    if code != 0:
        raise RuntimeError(f"pipebench {' '.join(args)} exited {code}")


def _guard_rows(out: str) -> pd.DataFrame:
    matrix = [c for c in changed_config.configs(("vit_micro",)) if c.label in GUARD]
    changed_config.run_repeat(
        os.path.join(out, "repeat0"), matrix, steps=12, cwd=out, log=lambda _: None, cli=_in_this_process
    )
    return changed_config.collect(out)


def _misjudged(rows: pd.DataFrame) -> float:
    """How far outside its bound the guard is (0: inside): the changed configuration beside the
    profiled runs either side of it (the host's drift since the profile cancels; a missing bubble,
    stage or transfer does not) within 50%, and the profiled configuration's mean within a factor
    of 2 of its replay (the host alone moved 1.8x between a profile and its runs here)."""
    changed = rows[rows["table"] == "changed"]["relative error"].abs().max() - SINGLE_RUN_BOUND
    replay = summarise(rows)
    factor = abs(np.log1p(replay[replay["table"] == "replay"]["error"].iloc[0])) - np.log(REPLAY_FACTOR)
    return max(0.0, changed, factor)


@pytest.mark.timeout(900)  # room for the remeasures
def test_a_configuration_not_profiled_is_predicted_close_to_its_run(workdir):
    """One repeat of ``pipebench validate``'s changed-configuration study on two configurations,
    through the commands a user runs: the other one predicted from the profiled one's profile
    within the bound beside the profiled one's runs, each with a drawn interval around it. A guard
    outside its bounds is measured again, twice, and judged by its median."""
    tries = [_guard_rows(workdir)]
    while _misjudged(tries[-1]) > 0 and len(tries) <= REMEASURES:
        tries.append(_guard_rows(os.path.join(workdir, f"again{len(tries)}")))
    worst = sorted(tries, key=_misjudged)[len(tries) // 2]
    assert set(worst["configuration"]) == set(GUARD) and (worst["table"] == "replay").sum() == 2
    assert _misjudged(worst) == 0, worst.to_dict("records")
    assert ((worst["p10"] < worst["median"]) & (worst["median"] < worst["p90"])).all()
    repeat = os.path.join(workdir, "repeat0")
    profile = json.load(open(os.path.join(repeat, "profiles", "vit_micro.json")))
    assert [(rt["strategy"], rt["schedule"]) for rt in profile["runtime"]] == [("hippie", "1f1b")]
    assert profile["spread"]["level"] and profile["network"]["spread"]
    changed = next(c for c in changed_config.configs(("vit_micro",)) if c.label == GUARD[1])
    rec = json.load(open(os.path.join(repeat, "simulated", changed.folder, "metrics.json")))
    assert rec["simulated"] is True and rec["global_batch"] == 32 and rec["predicted_draws"] == changed_config.DRAWS


def test_validate_refuses_a_run_without_timed_steps(workdir):
    proc = run_cli(["--repeats", "1", "--steps", "5", "--out", workdir], cwd=workdir, verb="validate")
    assert proc.returncode == 2 and "--steps over 5" in proc.stderr
    assert os.listdir(workdir) == []
