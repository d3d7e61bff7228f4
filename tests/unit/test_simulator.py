"""The simulator replays the executor's schedules with measured costs (no processes); against real
runs it is checked in tests/e2e/test_simulator_validation.py."""

import csv
from dataclasses import replace

import pandas as pd
import pytest

from harness.core.errors import ConfigError
from harness.planning.planner import LayerProfile, Network, Profile
from harness.planning.simulator import Cluster, SimLayout, predict
from harness.runtime.schedules import ASYNC
from tests.helpers.cli import make_spec


def _uniform_profile(n_layers=6, fwd=1e-3, bwd=2e-3):
    layers = [LayerProfile("L", fwd, bwd, 1000, 4000, 1000, 10_000) for _ in range(n_layers)]
    return Profile(layers, Network(1e12, 1e12, 0.0), "cpu", 1)


def _dp(world):
    return SimLayout("dp", [world], [], 1, "1f1b", set(), hides_allreduce=True)


def _sync(stages, micro_batches):
    return SimLayout("hippie", [1] * stages, None, micro_batches, "1f1b", set(), hides_allreduce=True)


def _async(boundaries):
    return SimLayout(
        "ashpipe", [1] * (len(boundaries) + 1), boundaries, 1, ASYNC, set(), hides_allreduce=False, stashes_weights=True
    )


def _free_network_cluster():
    return Cluster(devices_per_node=8, intra_node_gbps=1e6, inter_node_gbps=1e6, latency_us=0, inter_latency_us=0)


@pytest.mark.parametrize("p,m", [(2, 4), (3, 6), (4, 8)])
def test_sync_prediction_has_the_bubble_of_the_schedule(p, m):
    profile = _uniform_profile(n_layers=2 * p)
    pred = predict(profile, _free_network_cluster(), _sync(p, m), p, global_batch=m)
    per_micro = 2 * (1e-3 + 2e-3)  # two layers per stage, one sample per micro-batch
    assert pred.iteration_s == pytest.approx((m + p - 1) * per_micro, rel=1e-6)
    assert pred.bubble_fraction == pytest.approx((p - 1) / (m + p - 1), rel=1e-6)


def test_async_prediction_has_no_bubble_in_steady_state_and_dp_scales_with_allreduce():
    profile = _uniform_profile(n_layers=4)
    pipe = predict(profile, _free_network_cluster(), _async([2]), 2, global_batch=4)
    assert pipe.iteration_s == pytest.approx(4 * 2 * (1e-3 + 2e-3), rel=1e-6)  # slowest stage per minibatch
    slow = Cluster(devices_per_node=8, intra_node_gbps=1e-6, inter_node_gbps=1e-6)  # all-reduce dominates
    assert (
        predict(profile, slow, _dp(4), 4, 4).iteration_s
        > 100 * predict(profile, _free_network_cluster(), _dp(4), 4, 4).iteration_s
    )


def test_stash_and_in_flight_activations_show_in_predicted_memory():
    profile = _uniform_profile(n_layers=4)
    pred = predict(profile, _free_network_cluster(), _async([2]), 2, global_batch=4)
    unstashed = replace(_async([2]), stashes_weights=False)
    plain = predict(profile, _free_network_cluster(), unstashed, 2, global_batch=4).peak_memory_per_stage
    params = 2 * 10_000  # two layers of 10,000 parameter bytes per stage
    # stage 0 has two minibatches in flight, each with its weight copy; the last stage stashes none
    assert pred.peak_memory_per_stage[0] - plain[0] == pytest.approx(2 * params)
    assert pred.peak_memory_per_stage[1] == pytest.approx(plain[1])
    assert plain[0] > plain[1]  # and twice the in-flight activations


def test_where_communication_uses_the_compute_cores_sends_and_all_reduce_take_compute_time():
    profile = _uniform_profile(n_layers=4)
    profile.optimizer_s_per_byte = 1e-6
    slow_link = dict(devices_per_node=8, intra_node_gbps=1e-3, inter_node_gbps=1e-3, latency_us=0, inter_latency_us=0)
    gpu_like, cpu_like = Cluster(**slow_link), Cluster(**slow_link, comm_uses_compute=True)
    send_s = 1000 / 1e6  # one sample's 1000 boundary bytes at 1 MB/s
    pipe = {c.comm_uses_compute: predict(profile, c, _sync(2, 2), 2, global_batch=2) for c in (gpu_like, cpu_like)}
    # the first stage's clock moves on by the transfer of a send only where it writes the message
    # itself: gloo does so in the call when the receive is already waiting (the first one here), and
    # later, from its I/O thread, when it is not (see test_schedule)
    first_stage_busy = {k: sum(e.end - e.start for e in p.timeline.stage_events(0)) for k, p in pipe.items()}
    sends = [e.end - e.start for e in pipe[True].timeline.stage_events(0) if e.action.op == "SEND_F"]
    assert sends[0] == pytest.approx(send_s) and all(t in (0.0, pytest.approx(send_s)) for t in sends)
    assert first_stage_busy[True] - first_stage_busy[False] == pytest.approx(sum(sends), rel=1e-6)
    dp = {c.comm_uses_compute: predict(profile, c, _dp(2), 2, global_batch=2) for c in (gpu_like, cpu_like)}
    all_reduce = gpu_like.allreduce_s(4 * 10_000, [0, 1])
    backward = 4 * 2e-3  # one sample through four layers
    assert dp[True].iteration_s - dp[False].iteration_s == pytest.approx(min(all_reduce, backward), rel=1e-6)


def test_each_stage_computes_at_its_own_measured_factor_where_the_profile_timed_that_cut():
    profile = _uniform_profile(n_layers=4)
    profile.step_factor = 1.5
    profile.stage_factors = {"boundaries": [2], "factors": [2.0, 1.0]}
    busy = {}
    for cut in ([2], [1]):
        pred = predict(profile, _free_network_cluster(), _async(cut), 2, global_batch=1)
        busy[cut[0]] = [
            sum(e.end - e.start for e in pred.timeline.stage_events(s) if e.action.op in ("F", "B")) for s in (0, 1)
        ]
    per_layer = 1e-3 + 2e-3
    n = 4 * 2 + 8  # the minibatches the asynchronous replay runs
    # the measured cut: stage 0 at twice its isolated layers' time, stage 1 at once
    assert busy[2] == pytest.approx([n * 2 * per_layer * 2.0, n * 2 * per_layer * 1.0], rel=1e-6)
    # another cut: the profile's step factor for every stage
    assert busy[1] == pytest.approx([n * 1 * per_layer * 1.5, n * 3 * per_layer * 1.5], rel=1e-6)


def test_stage_factors_apply_only_to_one_stage_per_rank_in_1f1b_and_survive_the_profile_file():
    profile = _uniform_profile(n_layers=4)
    profile.step_factor = 1.5
    profile.stage_factors = {"boundaries": [2], "factors": [2.0, 1.0]}
    profile = Profile.from_json(profile.to_json())
    assert profile.stage_factors == {"boundaries": [2], "factors": [2.0, 1.0]}
    one_f_one_b = predict(profile, _free_network_cluster(), replace(_sync(2, 2), boundaries=[2]), 2, 2)
    fill_drain = predict(profile, _free_network_cluster(), replace(_sync(2, 2), boundaries=[2], schedule="gpipe"), 2, 2)
    stage0 = {
        k: sum(e.end - e.start for e in p.timeline.stage_events(0) if e.action.op == "F")
        for k, p in (("1f1b", one_f_one_b), ("gpipe", fill_drain))
    }
    # two micro-batches of one sample through two layers of 1 ms forward
    assert stage0 == pytest.approx({"1f1b": 2 * 2e-3 * 2.0, "gpipe": 2 * 2e-3 * 1.5})  # gpipe: the step factor


def test_the_measured_wake_up_lengthens_compute_after_waits_on_the_profiled_host_only():
    profile = _uniform_profile(n_layers=4)
    profile.wake = [[0.001, 1e-4], [0.004, 4e-4]]
    profile = Profile.from_json(profile.to_json())
    assert [profile.wake_s(i) for i in (0.0, 0.0005, 0.001, 0.0025, 0.004, 0.1)] == pytest.approx(
        [0.0, 5e-5, 1e-4, 2.5e-4, 4e-4, 4e-4]
    )
    host = replace(_free_network_cluster(), host_overhead=True)
    pipeline, dp = _sync(2, 4), _dp(2)
    asleep = {
        name: predict(profile, cluster, layout, 2, 4).iteration_s
        for name, cluster, layout in (("pipeline", host, pipeline), ("dp", host, dp))
    }
    profile.wake = None
    awake = {
        name: predict(profile, host, layout, 2, 4).iteration_s for name, layout in (("pipeline", pipeline), ("dp", dp))
    }
    assert asleep["pipeline"] > awake["pipeline"] and asleep["dp"] == awake["dp"]  # data parallelism never waits
    profile.wake = [[0.001, 1e-4], [0.004, 4e-4]]
    elsewhere = predict(profile, _free_network_cluster(), pipeline, 2, 4).iteration_s
    assert elsewhere == pytest.approx(awake["pipeline"])  # another cluster's devices: none


def test_a_stage_factor_makes_the_kept_layers_replay_the_stage_pass_its_process_timed():
    from harness.planning.forecast import workload_of as workload
    from harness.planning.profiling import _stage_factors

    work = workload(make_spec("strategy=hippie", "world_size=2", "strategy.boundaries=[3]"))
    kept = _uniform_profile(n_layers=6).layers  # 3 ms a sample through each layer, forward and backward
    factors = _stage_factors(work, kept, [0.018 * work.samples, 0.009 * work.samples])
    assert factors == {"boundaries": [3], "factors": pytest.approx([2.0, 1.0])}
    assert _stage_factors(work, kept, [0.018, None]) is None  # a stage nobody timed


def test_workloads_time_stages_only_for_one_stage_per_worker_in_1f1b():
    from harness.planning.forecast import workload_of as workload

    cut = ["strategy.boundaries=[3]"]
    assert workload(make_spec("strategy=hippie", "world_size=2", *cut)).stages == [(0, 3), (3, 6)]
    assert workload(make_spec("strategy=ashpipe", "world_size=2", "strategy.replicas=[1,1]", *cut)).stages == [
        (0, 3),
        (3, 6),
    ]
    assert workload(make_spec("strategy=hippie", "world_size=2", "strategy.schedule=gpipe", *cut)).stages is None
    assert workload(make_spec("strategy=hippie", "world_size=2")).stages is None  # cut by the planner
    assert workload(make_spec("strategy=dp", "world_size=2")).stages is None


def test_an_all_reduce_runs_at_the_clusters_bus_bandwidth_where_it_differs_from_the_links():
    link = Cluster(devices_per_node=2, intra_node_gbps=2.0, latency_us=0)
    ring = replace(link, allreduce_gbps=0.5)
    assert link.allreduce_s(1e9, [0, 1]) == pytest.approx(1e9 / 2e9)  # 2 (n-1)/n of the bytes at the link's rate
    assert ring.allreduce_s(1e9, [0, 1]) == pytest.approx(1e9 / 0.5e9)
    profiled = Cluster(devices_per_node=2)
    profiled.use_network(Network(p2p_bytes_per_s=2e9, allreduce_bytes_per_s=0.8e9, latency_s=1e-5))
    assert (profiled.intra_node_gbps, profiled.allreduce_gbps, profiled.latency_us) == pytest.approx((2.0, 0.8, 10.0))


def test_the_optimizer_update_is_charged_once_per_step_from_the_profile():
    profile = _uniform_profile(n_layers=4)
    base = predict(profile, _free_network_cluster(), _dp(1), 1, global_batch=4).iteration_s
    profile.optimizer_s_per_byte = 1e-6
    assert predict(profile, _free_network_cluster(), _dp(1), 1, global_batch=4).iteration_s - base == pytest.approx(
        4 * 10_000 * 1e-6
    )


def test_exposed_communication_is_the_all_reduce_waited_for_not_the_optimizer_update():
    profile = _uniform_profile(n_layers=4)
    profile.optimizer_s_per_byte = 1e-6
    assert predict(profile, _free_network_cluster(), _dp(1), 1, global_batch=4).comm_s == 0.0
    slow = Cluster(
        devices_per_node=8,
        intra_node_gbps=1e-3,
        inter_node_gbps=1e-3,
        latency_us=0,
        inter_latency_us=0,
        comm_uses_compute=False,
    )
    two = predict(profile, slow, SimLayout("dp", [2], [], 1, "1f1b", set(), hides_allreduce=False), 2, global_batch=4)
    allreduce = slow.allreduce_s(4 * 10_000, [0, 1])
    assert two.comm_s == pytest.approx(allreduce)
    assert two.iteration_s > allreduce + 4 * 10_000 * 1e-6


@pytest.mark.parametrize(
    "overrides,replicas,schedule,hides,stashes",
    [
        (["strategy=dp", "world_size=4"], [4], "1f1b", True, False),
        (["strategy=hippie", "world_size=4", "train.micro_batches=4"], [2, 2], "1f1b", True, False),
        (
            ["strategy=pipelining", "world_size=2", "train.micro_batches=4", "strategy.schedule=gpipe"],
            [1, 1],
            "gpipe",
            True,
            False,
        ),
        (["strategy=deepspeed", "world_size=2", "train.micro_batches=4"], [1, 1], "1f1b", False, False),
        (["strategy=gpipe", "world_size=3", "train.micro_batches=4"], [1, 1, 1], "gpipe", False, False),
        (["strategy=ashpipe", "world_size=3", "strategy.replicas=[2,1]"], [2, 1], ASYNC, False, True),
    ],
)
def test_each_strategy_class_gives_the_simulator_its_own_layout(overrides, replicas, schedule, hides, stashes):
    spec = make_spec(*overrides)
    profile = _uniform_profile(n_layers=6)  # vit_micro's six layers
    layout = spec.strategy_cls.simulated(spec, profile, _free_network_cluster())
    assert (layout.replicas, layout.schedule, layout.hides_allreduce, layout.stashes_weights) == (
        replicas,
        schedule,
        hides,
        stashes,
    )
    assert len(layout.boundaries) == len(replicas) - 1 and layout.strategy == spec.strategy.name
    assert predict(profile, _free_network_cluster(), layout, spec.world_size, spec.train.global_batch).throughput > 0


@pytest.mark.parametrize("p,m", [(2, 1), (2, 4), (3, 2), (4, 8), (5, 3)])
def test_deepspeeds_own_schedule_runs_each_micro_batch_once_and_meets_every_blocking_transfer(p, m):
    from baselines.deepspeed_pipe import train_schedule
    from harness.runtime import actions as sch

    lists = [list(acts) for acts in train_schedule(p, m)]
    for acts in lists:
        assert (
            [a.micro for a in acts if a.op == sch.FWD] == [a.micro for a in acts if a.op == sch.BWD] == list(range(m))
        )
        assert acts[-1] == sch.Action(sch.STEP)
    sch.replay(lists, transport=sch.RENDEZVOUS)  # raises Deadlock otherwise


def test_deepspeed_is_replayed_in_its_own_order_with_transfers_that_meet():
    """DeepSpeed sends a forward's output only after its next backward's gradient has arrived, in
    blocking calls: with transfers that cost something its step is longer than 1F1B's on the same
    costs, by the transfers its order serializes; with free transfers it is the same. (Blocking
    calls alone: test_schedule's rendezvous test.)"""
    spec = make_spec("strategy=deepspeed", "world_size=2", "train.micro_batches=4", "strategy.boundaries=[3]")
    profile = _uniform_profile(n_layers=6)
    layout = spec.strategy_cls.simulated(spec, profile, _free_network_cluster())
    assert layout.rendezvous and layout.lists is not None
    ours = replace(layout, lists=None, rendezvous=False)
    free = _free_network_cluster()
    assert predict(profile, free, layout, 2, 4).iteration_s == pytest.approx(
        predict(profile, free, ours, 2, 4).iteration_s
    )
    # 1 ms a sample, sent as NCCL sends (gloo's receiver-driven transfers meet too, see test_schedule)
    slow = Cluster(devices_per_node=8, intra_node_gbps=1e-3, latency_us=0)
    deepspeed, one_f_one_b = (predict(profile, slow, lay, 2, 4).iteration_s for lay in (layout, ours))
    assert deepspeed > one_f_one_b + 1e-3


def test_hippie_recomputation_rule_reaches_the_simulated_layout():
    spec = make_spec("strategy=hippie", "world_size=2", "strategy.recompute=auto", "strategy.boundaries=[3]")
    layout = spec.strategy_cls.simulated(spec, _uniform_profile(n_layers=6), _free_network_cluster())
    assert layout.recompute == {1, 2}  # blocks of stage 0; none on the last stage


def test_a_profile_of_another_depth_is_refused_in_one_line():
    from harness.core.errors import ConfigError

    spec = make_spec("strategy=hippie", "world_size=2")
    with pytest.raises(ConfigError, match="the profile has 4 layers but vit_micro as configured has 6"):
        spec.strategy_cls.simulated(spec, _uniform_profile(n_layers=4), _free_network_cluster())


def test_a_replay_of_balanced_measured_costs_gives_the_analytic_bubble_and_imbalance_adds_to_it():
    from harness.runtime import actions as sch
    from harness.runtime.schedules import replayed_bubble

    def busy(m, forward, backward):  # seconds a stage spent on each kind in one step of m micro-batches
        return {"F": m * forward, "B": m * backward, "STEP": 0.0}

    for m in (1, 4, 8):
        balanced = replayed_bubble(sch.one_f_one_b(2, m), [busy(m, 1, 2), busy(m, 1, 2)])
        assert balanced == pytest.approx(1 / (m + 1))  # (p - 1) / (m + p - 1)
    assert replayed_bubble(sch.one_f_one_b(2, 4), [busy(4, 1, 2), busy(4, 2, 4)]) > 0.2
    assert replayed_bubble(sch.gpipe(2, 4), [busy(4, 1, 2), busy(4, 1, 2)]) == pytest.approx(0.2)


def test_a_replay_of_a_ranks_several_stages_shares_its_time_among_them():
    """Interleaved 1F1B with v=2: a rank's measured forward time is spread over its 2m forwards,
    which gives (p-1)/(vm+p-1) when balanced; a zero-bubble schedule whose backward parts were
    not timed apart shares the backward time among its I and W actions."""
    from harness.runtime.schedules import get, replayed_bubble

    P, v, m = 2, 2, 4
    busy = [{"F": v * m * 1.0, "B": v * m * 2.0, "STEP": 0.0}] * P
    lists = get("interleaved_1f1b").lists(P, v, m)
    assert replayed_bubble(lists, busy, get("interleaved_1f1b").place(P, v)) == pytest.approx((P - 1) / (v * m + P - 1))
    zb = get("zero_bubble").lists(P, v, m)
    zb_idle = replayed_bubble(zb, busy, get("zero_bubble").place(P, v))
    assert 0 < zb_idle < (P - 1) / (v * m + P - 1)
    # timed apart, the same work: rank 0's stage 0 does nothing in I and its whole backward in W
    split = [{"F": 8.0, "I": 4.0, "W": 12.0, "STEP": 0.0}, {"F": 8.0, "I": 8.0, "W": 8.0, "STEP": 0.0}]
    assert replayed_bubble(zb, split, get("zero_bubble").place(P, v)) == pytest.approx(zb_idle)


@pytest.mark.parametrize("schedule,v", [("1f1b", 1), ("zbv", 2), ("interleaved_1f1b", 2)])
def test_the_runtime_overhead_fit_recovers_the_costs_that_made_the_runs(schedule, v):
    """Null-model runs made by the simulator with known per-action and per-step costs: the fit
    finds those costs again from the step times alone (two micro-batch counts), and a prediction
    for the host adds them only where the profile measured this strategy's runtime."""
    from harness.planning.simulator import RuntimeOverhead, fit_runtime_overhead, host_overhead

    cluster, profile = _free_network_cluster(), _uniform_profile(fwd=1e-5, bwd=2e-5)
    profile.layers = [replace(l, backward_input_s=1.2e-5, backward_weight_s=1e-5) for l in profile.layers]
    per_action, per_step = 4e-4, 1.5e-3
    runs = []
    for m in (4, 8):
        layout = SimLayout("pipelining", [1, 1], None, m, schedule, set(), hides_allreduce=True, stages_per_rank=v)
        made = predict(profile, cluster, layout, 2, 64, overhead=(per_action, per_step)).iteration_s
        runs.append((layout, 2, 64, made, profile))
    assert fit_runtime_overhead(cluster, runs) == pytest.approx((per_action, per_step), rel=1e-6)
    # one run (or a strategy without micro-batches) can only say per step
    assert fit_runtime_overhead(cluster, runs[:1])[0] == 0.0

    layout = runs[0][0]
    # a profile keeps one entry per strategy and schedule measured: each prediction takes its own
    other = "gpipe" if schedule != "gpipe" else "1f1b"
    profile.runtime = [
        vars(RuntimeOverhead("pipelining", other, 9e-4, 9e-3)),
        vars(RuntimeOverhead("pipelining", schedule, per_action, per_step)),
    ]
    here = replace(cluster, host_overhead=True)
    assert host_overhead(profile, here, layout) == (per_action, per_step)
    assert host_overhead(profile, here, replace(layout, schedule=other)) == (9e-4, 9e-3)
    assert host_overhead(profile, cluster, layout) == (0.0, 0.0)  # a cluster other than this host
    assert host_overhead(profile, here, replace(layout, strategy="hippie")) == (0.0, 0.0)


def test_the_runtime_overhead_fit_never_pushes_every_replay_past_its_run():
    """Noisy null runs that no non-negative costs fit exactly: the run with more actions took longer
    per action than the replay, yet both took less in all than the replay with those per-action
    costs (a per-step cost of -3.5 ms would fit them). Least squares keeps both costs non-negative
    and comes closer to both runs than the per-action cost that explains the difference alone
    (which, with nothing per step, replays each run 3.5 ms too slow)."""
    from harness.planning.simulator import fit_runtime_overhead

    cluster, profile = _free_network_cluster(), _uniform_profile(fwd=1e-5, bwd=2e-5)
    per_action, per_step, noise = 4e-4, 1.5e-3, 5e-3
    runs = []
    for m in (4, 8):
        layout = SimLayout("hippie", [1, 1], None, m, "1f1b", set(), hides_allreduce=True)
        made = predict(profile, cluster, layout, 2, 64, overhead=(per_action, per_step)).iteration_s
        runs.append((layout, 2, 64, made - noise, profile))

    def squared_error(costs):
        return sum((t - predict(p, cluster, lay, w, b, overhead=costs).iteration_s) ** 2 for lay, w, b, t, p in runs)

    fitted = fit_runtime_overhead(cluster, runs)
    assert fitted[1] == 0.0 and 0.0 <= fitted[0] < per_action
    assert squared_error(fitted) < squared_error((per_action, 0.0)) / 2
    assert any(t >= predict(p, cluster, lay, w, b, overhead=fitted).iteration_s for lay, w, b, t, p in runs)


def test_data_parallel_on_the_profiled_host_lasts_as_long_as_its_slowest_worker():
    """The lockstep measurement's slowest-over-typical ratio stretches DP's compute on the profiled
    host (its replicas meet after every step), and nothing else: not a pipeline, not a GPU cluster."""
    from harness.planning.profiling import meeting_factor

    assert meeting_factor([[1.0, 1.0, 1.0]]) == 1.0  # one worker meets no one
    assert meeting_factor([[1.0, 1.2, 1.0, 1.2], [1.2, 1.0, 1.2, 1.0]]) == pytest.approx(1.2 / 1.1)
    profile = replace(_uniform_profile(), meeting_factor=1.25)
    host = replace(_free_network_cluster(), host_overhead=True)
    plain = replace(profile, meeting_factor=1.0)
    dp = predict(profile, host, _dp(2), 2, 64).iteration_s
    assert dp == pytest.approx(1.25 * predict(plain, host, _dp(2), 2, 64).iteration_s, rel=1e-3)
    for cluster, layout in ((_free_network_cluster(), _dp(2)), (host, _sync(2, 4))):
        assert (
            predict(profile, cluster, layout, 2, 64).iteration_s == predict(plain, cluster, layout, 2, 64).iteration_s
        )


def test_validation_tables_are_rebuilt_from_an_interrupted_run(tmp_path):
    """``pipebench validate --summarise``: a repeat that stopped part-way counts for the
    configurations it finished, and each row says over how many repeats it stands."""
    import json as _json

    from harness.commands import main
    from harness.report import record as record_mod
    from harness.studies.validation import CONFIGS

    first, second = list(CONFIGS)[:2]

    def write(repeat, name, before, after, predicted):
        base = name.replace(" ", "_").replace("=", "")
        for sub, value in (
            (f"measured/{base}-before", before),
            (f"measured/{base}-after", after),
            (f"simulated/{base}", predicted),
        ):
            # a record of this harness's schema, as the commands write them (read through the record module)
            record_mod.write(
                str(tmp_path / f"repeat{repeat}" / sub),
                {**record_mod.failed_record({}, ""), "status": "ok", "error": None, "throughput": value},
            )

    write(0, first, 90.0, 110.0, 110.0)
    write(0, second, 50.0, 50.0, 40.0)
    write(1, first, 100.0, 100.0, 100.0)  # interrupted before the second configuration
    assert main(["validate", "--summarise", "--out", str(tmp_path)]) == 0
    table = {row["configuration"]: row for row in csv.DictReader(open(tmp_path / "validation.csv"))}
    assert table[first]["repeats"] == "2" and float(table[first]["error of means"]) == pytest.approx(0.05)
    assert table[second]["repeats"] == "1" and float(table[second]["error of means"]) == pytest.approx(-0.2)
    verdict = _json.load(open(tmp_path / "validation.json"))
    assert verdict["configurations"] == 2 and verdict["within 10%"] == 1 and verdict["targets met"] is False


def test_drawn_runs_spread_as_the_profile_measured_and_their_jitter_averages_over_steps():
    """A data-parallel step is all compute: with the host's level drawn from {0.8, 1, 1.25} and no
    jitter, a run's throughput is the medians' over one of those levels, so its 10-90% interval
    spans them, however many steps it averages; a jitter drawn per action averages out over a
    run's steps, so 25 steps spread less than one; the same seed gives the same quantiles; a
    spread of one value gives the medians' prediction back."""
    from harness.planning.simulator import predict_spread

    profile, cluster, layout = _uniform_profile(n_layers=4), _free_network_cluster(), _dp(2)
    base = predict(profile, cluster, layout, 2, 8).throughput
    profile.spread = {"level": [1.0], "jitter": [1.0]}
    flat = predict_spread(profile, cluster, layout, 2, 8, draws=20, steps=3)
    assert flat.p10 == pytest.approx(base) and flat.p90 == pytest.approx(base)

    profile.spread = {"level": [0.8, 1.0, 1.25], "jitter": [1.0]}
    for steps in (1, 25):
        level = predict_spread(profile, cluster, layout, 2, 8, draws=200, steps=steps, seed=3)
        assert (level.p10, level.p50, level.p90) == pytest.approx((base / 1.25, base, base / 0.8))

    profile.spread = {"level": [1.0], "jitter": [0.8, 1.25]}
    one = predict_spread(profile, cluster, layout, 2, 8, draws=200, steps=1, seed=3)
    many = predict_spread(profile, cluster, layout, 2, 8, draws=200, steps=25, seed=3)
    assert base / 1.25 <= one.p10 < one.p90 <= base / 0.8
    assert many.p90 - many.p10 < 0.5 * (one.p90 - one.p10)
    assert predict_spread(profile, cluster, layout, 2, 8, draws=200, steps=25, seed=3) == many

    # a pipeline's transfers draw from the network's spread
    pipe = _sync(2, 4)
    net = replace(
        profile, spread={"level": [1.0], "jitter": [1.0]}, network=Network(1e12, 1e12, 0.0, spread=[0.5, 2.0])
    )
    drawn = predict_spread(net, replace(cluster, intra_node_gbps=1e-3), pipe, 2, 8, draws=50, steps=1)
    assert drawn.p10 < drawn.p90

    profile.spread = None
    with pytest.raises(ConfigError, match="no measured spread"):
        predict_spread(profile, cluster, layout, 2, 8, draws=10, steps=1)


def test_compute_spread_is_each_round_against_the_rounds_and_each_pass_against_its_round():
    from harness.planning.profiling import compute_spread

    spread = compute_spread([[[1.0, 1.0, 1.2], [2.0, 2.2, 2.0]], [[3.0, 3.0, 3.0]]])
    assert spread["level"] == pytest.approx([1.0 / 1.5, 2.0 / 1.5, 1.0])
    assert spread["jitter"] == pytest.approx([1.0, 1.0, 1.2, 1.0, 1.1, 1.0, 1.0, 1.0, 1.0])


def test_the_changed_configuration_verdict_judges_comparable_runs_and_cancels_drift_beside_the_profiled_runs():
    """Three runs: the profiled configuration (two runs), a changed one measured at half its
    predicted throughput while the host ran at half speed (the profiled runs beside it too), and one
    of more workers than cores: on the means the changed one is 100% off, beside the profiled runs
    0%; the crowded run is given apart and left out of the targets, the ranking and the coverage."""
    from harness.studies.changed_config import MORE_WORKERS, summarise, verdict

    def run(configuration, table, measured, predicted, inside, ratio=None):
        row = {
            "repeat": 0,
            "configuration": configuration,
            "model": "m",
            "table": table,
            "measured": measured,
            "predicted": predicted,
            "error": predicted / measured - 1,
            "p10": 0.0,
            "median": predicted,
            "p90": 0.0,
            "inside": inside,
        }
        if ratio is not None:  # measured and predicted over the profiled runs beside it
            row.update(
                {"measured ratio": ratio[0], "predicted ratio": ratio[1], "relative error": ratio[1] / ratio[0] - 1}
            )
        return row

    each = pd.DataFrame(
        [
            run("profiled", "replay", 50.0, 100.0, False),
            run("profiled", "replay", 50.0, 100.0, False),
            run("changed", "changed", 60.0, 120.0, True, ratio=(1.2, 1.2)),
            run("crowded", MORE_WORKERS, 10.0, 200.0, False, ratio=(0.2, 2.0)),
        ]
    )
    result = verdict(summarise(each), each)
    assert result["changed"]["mean absolute error"] == pytest.approx(1.0)
    assert result["changed beside the profiled runs"]["mean absolute error"] == pytest.approx(0.0)
    assert result["changed"]["configurations"] == 1 and result[MORE_WORKERS]["largest"] == pytest.approx(19.0)
    assert result["ranking swapped"] == [] and result["ranking swapped beside the profiled runs"] == []
    assert result["coverage of 80% intervals"] == pytest.approx(1 / 3)
    assert not result["changed targets met"] and result["changed targets met beside the profiled runs"]


def test_our_split_backward_recomputes_a_stage_once_at_i_and_holds_its_activations_until_w():
    """ZB-H1 on 2 stages with one layer of each recomputed: the last stage's I costs its
    backward-input part plus a forward of every layer of the stage, the one not recomputed too
    (the executor runs the stage's forward once more there), its W only the weight part; from I
    to W a micro-batch keeps all its saved bytes (the first stage's W is a whole backward,
    recomputing as 1F1B does)."""
    layers = [LayerProfile("L", 1e-3, 2e-3, 1000, 4000, 1000, 10_000, 1e-3, 1e-3) for _ in range(4)]
    profile = Profile(layers, Network(1e12, 1e12, 0.0), "cpu", 1)

    def zb(recompute):
        layout = SimLayout("hippie", [1, 1], [2], 4, "zb_h1", recompute, hides_allreduce=True)
        return predict(profile, _free_network_cluster(), layout, 2, global_batch=4)

    plain, recomputed = zb(set()), zb({1, 3})
    last = [e for e in recomputed.timeline.stage_events(1) if e.action.op in ("I", "W")]
    assert {round(e.end - e.start, 9) for e in last if e.action.op == "I"} == {2 * (1e-3 + 1e-3)}
    assert {round(e.end - e.start, 9) for e in last if e.action.op == "W"} == {2 * 1e-3}
    # the last stage holds at most two micro-batches from I to W, each with every saved byte
    assert recomputed.peak_memory_per_stage[1] - plain.peak_memory_per_stage[1] == pytest.approx(0.0)
    assert recomputed.peak_memory_per_stage[0] < plain.peak_memory_per_stage[0]
