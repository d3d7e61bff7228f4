"""The simulator against real runs on this machine: one repeat of `pipebench validate`
(the repeated table is in results/simulator_validation/)."""

import json
import os

import pytest

from harness.commands.validate import CONFIGS, validate_once
from tests.helpers.cli import run_cli

# One run on this shared 2-core machine differs from the next run of the same configuration by
# up to 25% (results/simulator_validation/: dp 743-855 samples/s over three repeats, hippie
# 608-713), and the profile a prediction comes from is one more such measurement, so a single
# prediction can be more than 35% off by chance (seen once in CI: hippie +29%, pipelining +38%,
# the next run within 12%). A configuration outside the bound, or ranked against a clear measured
# gap, is therefore measured again, twice, and judged by its median error: chance does not repeat
# three times, a broken cost model (a missing stage, a doubled transfer, no bubble) does. The
# simulator's own error (within 15% on the mean of interleaved repeats) is what
# `pipebench validate` shows.
SINGLE_RUN_BOUND = 0.35
REMEASURES = 2


def _error(pair):
    measured, predicted = pair
    return predicted / measured - 1


def _misjudged(pairs) -> set[str]:
    """Configurations outside the bound, or ranked the other way round from a clear measured gap
    (configurations the simulator predicts alike, such as hippie and pipelining on the same 1F1B
    schedule, may come out either way)."""
    names = {k for k, pair in pairs.items() if abs(_error(pair)) > SINGLE_RUN_BOUND}
    for a, (measured_a, predicted_a) in pairs.items():
        for b, (measured_b, predicted_b) in pairs.items():
            if measured_a > 1.15 * measured_b and predicted_a < 0.97 * predicted_b:
                names |= {a, b}
    return names


# a fast guard (about a minute): our runtime's 1F1B on vit_micro; the replay of every other schedule
# and cost is checked without processes (tests/unit/test_simulator.py), the whole matrix by the command
GUARD = ["vit_micro B=64 hippie m=4"]


@pytest.mark.timeout(900)  # room for the remeasures
def test_predicted_throughput_is_close_to_measured_and_ranks_alike(workdir):
    """One repeat of ``pipebench validate`` on a few configurations: each measured,
    profiled (its runtime overhead included), measured again and predicted, through the commands
    a user runs."""
    configs = {name: CONFIGS[name] for name in GUARD}
    pairs = validate_once(workdir, steps=12, configs=configs, cwd=workdir)
    for name in sorted(_misjudged(pairs)):
        tries = [pairs[name]] + [validate_once(os.path.join(workdir, f"again{i}"), steps=12, cwd=workdir,
                                               configs={name: CONFIGS[name]})[name] for i in range(REMEASURES)]
        pairs[name] = sorted(tries, key=_error)[len(tries) // 2]
    assert not _misjudged(pairs), {k: (*pair, _error(pair)) for k, pair in pairs.items()}
    for name in pairs:
        folder = name.replace(" ", "_").replace("=", "")
        rec = json.load(open(os.path.join(workdir, "simulated", folder, "metrics.json")))
        assert rec["simulated"] is True and rec["device"] == "simulated:local_cpu"
        profile = json.load(open(os.path.join(workdir, "profiles", f"{folder}.json")))
        assert profile["runtime"]["strategy"] == rec["strategy"]  # the prediction added its runtime's overhead


def test_validate_refuses_a_run_without_timed_steps(workdir):
    proc = run_cli(["--repeats", "1", "--steps", "5", "--out", workdir], cwd=workdir, verb="validate")
    assert proc.returncode == 2 and "--steps over 5" in proc.stderr
    assert os.listdir(workdir) == []
