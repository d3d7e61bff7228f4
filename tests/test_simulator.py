"""The simulator replays the executor's schedules with measured costs; against real runs here it is
checked by one repeat of `python -m harness.validate` (the repeated table is in results/simulator_validation/)."""

import json
import os

import pytest

from harness.planner import LayerProfile, Network, Profile
from harness.simulator import Cluster, predict
from harness.validate import CONFIGS, validate_once
from tests.conftest import run_cli


def _uniform_profile(n_layers=6, fwd=1e-3, bwd=2e-3):
    layers = [LayerProfile("L", fwd, bwd, 1000, 4000, 1000, 10_000) for _ in range(n_layers)]
    return Profile(layers, Network(1e12, 1e12, 0.0), "cpu", 1)


def _free_network_cluster():
    return Cluster(devices_per_node=8, intra_node_gbps=1e6, inter_node_gbps=1e6, latency_us=0, inter_latency_us=0)


@pytest.mark.parametrize("p,m", [(2, 4), (3, 6), (4, 8)])
def test_sync_prediction_has_the_bubble_of_the_schedule(p, m):
    profile = _uniform_profile(n_layers=2 * p)
    pred = predict(profile, _free_network_cluster(), "hippie", p, global_batch=m, micro_batches=m, stages=p)
    per_micro = 2 * (1e-3 + 2e-3)  # two layers per stage, one sample per micro-batch
    assert pred.iteration_s == pytest.approx((m + p - 1) * per_micro, rel=1e-6)
    assert pred.bubble_fraction == pytest.approx((p - 1) / (m + p - 1), rel=1e-6)


def test_async_prediction_has_no_bubble_in_steady_state_and_dp_scales_with_allreduce():
    profile = _uniform_profile(n_layers=4)
    pipe = predict(profile, _free_network_cluster(), "ashpipe", 2, global_batch=4, replicas=[1, 1], boundaries=[2])
    assert pipe.iteration_s == pytest.approx(4 * 2 * (1e-3 + 2e-3), rel=1e-6)  # slowest stage per minibatch
    slow = Cluster(devices_per_node=8, intra_node_gbps=1e-6, inter_node_gbps=1e-6)  # all-reduce dominates
    assert predict(profile, slow, "dp", 4, 4).iteration_s > 100 * predict(profile, _free_network_cluster(), "dp", 4, 4).iteration_s


def test_stash_and_in_flight_activations_show_in_predicted_memory():
    profile = _uniform_profile(n_layers=4)
    pred = predict(profile, _free_network_cluster(), "ashpipe", 2, global_batch=4, replicas=[1, 1], boundaries=[2])
    first, last = pred.peak_memory_per_stage
    assert first > last  # two minibatches in flight and a stashed copy on the first stage


def test_where_communication_uses_the_compute_cores_sends_and_all_reduce_take_compute_time():
    profile = _uniform_profile(n_layers=4)
    profile.optimizer_s_per_byte = 1e-6
    slow_link = dict(devices_per_node=8, intra_node_gbps=1e-3, inter_node_gbps=1e-3, latency_us=0, inter_latency_us=0)
    gpu_like, cpu_like = Cluster(**slow_link), Cluster(**slow_link, comm_uses_compute=True)
    send_s = 1000 / 1e6  # one sample's 1000 boundary bytes at 1 MB/s
    pipe = {c.comm_uses_compute: predict(profile, c, "hippie", 2, global_batch=2, micro_batches=2, stages=2)
            for c in (gpu_like, cpu_like)}
    # the first stage's clock moves on by the transfer of each of its two sends only where it does them itself
    first_stage_busy = {k: sum(e.end - e.start for e in p.timeline.stage_events(0)) for k, p in pipe.items()}
    assert first_stage_busy[True] - first_stage_busy[False] == pytest.approx(2 * send_s, rel=1e-6)
    dp = {c.comm_uses_compute: predict(profile, c, "dp", 2, global_batch=2) for c in (gpu_like, cpu_like)}
    all_reduce = gpu_like.allreduce_s(4 * 10_000, [0, 1])
    backward = 4 * 2e-3  # one sample through four layers
    assert dp[True].iteration_s - dp[False].iteration_s == pytest.approx(min(all_reduce, backward), rel=1e-6)


def test_the_optimizer_update_is_charged_once_per_step_from_the_profile():
    profile = _uniform_profile(n_layers=4)
    base = predict(profile, _free_network_cluster(), "dp", 1, global_batch=4).iteration_s
    profile.optimizer_s_per_byte = 1e-6
    assert predict(profile, _free_network_cluster(), "dp", 1, global_batch=4).iteration_s - base == pytest.approx(4 * 10_000 * 1e-6)


# One run on this shared 2-core machine differs from the next run of the same configuration by
# up to 25% (results/simulator_validation/: dp 743-855 samples/s over three repeats, hippie
# 608-713), and the profile a prediction comes from is one more such measurement, so a single
# prediction can be more than 35% off by chance (seen once in CI: hippie +29%, pipelining +38%,
# the next run within 12%). A configuration outside the bound, or ranked against a clear measured
# gap, is therefore measured again, twice, and judged by its median error: chance does not repeat
# three times, a broken cost model (a missing stage, a doubled transfer, no bubble) does. The
# simulator's own error (within 15% on the mean of interleaved repeats) is what
# `python -m harness.validate` shows.
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


def test_predicted_throughput_is_close_to_measured_and_ranks_alike(workdir):
    """One repeat of ``python -m harness.validate``: each configuration profiled, measured and
    predicted, through the commands a user runs."""
    pairs = validate_once(workdir, steps=40, cwd=workdir)
    for name in sorted(_misjudged(pairs)):
        tries = [pairs[name]] + [validate_once(os.path.join(workdir, f"again{i}"), steps=40, cwd=workdir,
                                               configs={name: CONFIGS[name]})[name] for i in range(REMEASURES)]
        pairs[name] = sorted(tries, key=_error)[len(tries) // 2]
    assert not _misjudged(pairs), {k: (*pair, _error(pair)) for k, pair in pairs.items()}
    for name in pairs:
        rec = json.load(open(os.path.join(workdir, "simulated", name, "metrics.json")))
        assert rec["simulated"] is True and rec["device"] == "simulated:local_cpu"


def test_validate_refuses_a_run_without_timed_steps(workdir):
    proc = run_cli(["--repeats", "1", "--steps", "5", "--out", workdir], cwd=workdir, module="harness.validate")
    assert proc.returncode == 2 and "--steps over 5" in proc.stderr
    assert os.listdir(workdir) == []
