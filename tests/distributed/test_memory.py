"""The measured step's live-bytes peak and idle time move the way the methods say they should
(CPU, real gloo workers).

Each test names the mechanism it would miss: the allocator's running total (blocks made
before the step, such as DDP's buckets), recomputation, the schedule's in-flight
micro-batches, AshPipe's weight stashing.
"""

import json
import os

from harness.core.comm import Comm
from harness.core.data import BatchOrder, load
from harness.core.models import build_layers
from harness.metrics.meter import StepMeter, job_idle_fractions
from harness.run.worker import host_only_tensors
from tests.helpers.cli import make_spec
from tests.helpers.distributed import spawn

COMMON = [
    "strategy=hippie",
    "world_size=2",
    "train.global_batch=64",
    "train.micro_batches=4",
    "strategy.boundaries=[3]",
    "data.train_size=256",
    "data.test_size=32",
]
CASES = {
    "1f1b_none": ["strategy.recompute=none"],
    "1f1b_all": ["strategy.recompute=all"],
    "1f1b_auto": ["strategy.recompute=auto"],
    "gpipe_none": ["strategy.schedule=gpipe", "strategy.recompute=none"],
}


def measured_step(ctx, spec, warmup: int = 1) -> dict:
    """The worker's measurement of one step after ``warmup`` steps: peak and breakdown."""
    layers = build_layers(spec.model, spec.seed)
    strategy = spec.strategy_cls(spec, layers, ctx, Comm(ctx))
    data = load(spec.data, spec.seed)
    order = BatchOrder(len(data.train), spec.train.global_batch, spec.seed)
    for step in range(warmup):  # creates optimizer state (and fills an asynchronous pipeline)
        strategy.train_step(*data.train.batch(order.indices(step)))
    meter = StepMeter(ctx.device)
    x, y = data.train.batch(order.indices(warmup))
    with (
        strategy.memory_step_context(),
        meter.measure_step(strategy.memory_parts, lambda: host_only_tensors(strategy, layers, data)),
    ):
        strategy.train_step(x, y)
    strategy.finish_training()
    return {
        "peak": meter.peak_bytes,
        **meter.breakdown,
        "batch": x.nbytes + y.nbytes,
        "idle": meter.idle,
        "stages": meter.stages,
    }


def measure(ctx, specs, out_dir):
    results = {name: measured_step(ctx, spec) for name, spec in specs.items()}
    with open(os.path.join(out_dir, f"rank{ctx.rank}.json"), "w") as f:
        json.dump(results, f)


def run(tmp_path, world_size, specs) -> list[dict]:
    spawn(world_size, measure, specs, str(tmp_path))
    return [json.load(open(tmp_path / f"rank{r}.json")) for r in range(world_size)]


def test_recomputation_lowers_and_gpipe_raises_peak_memory(tmp_path):
    stage0, stage1 = run(tmp_path, 2, {name: make_spec(*COMMON, *extra) for name, extra in CASES.items()})
    for peaks in (stage0, stage1):
        assert peaks["1f1b_all"]["peak"] < peaks["1f1b_none"]["peak"]
        # m=4 micro-batches in flight instead of at most S - s
        assert peaks["gpipe_none"]["peak"] > peaks["1f1b_none"]["peak"]
    # auto recomputes on stage 0 only (last-stage scheduling)
    assert stage0["1f1b_auto"]["peak"] < stage0["1f1b_none"]["peak"]
    # (the last stage's peak moves by up to a few buffers from run to run with message timing)
    assert abs(stage1["1f1b_auto"]["peak"] - stage1["1f1b_none"]["peak"]) < 0.1 * stage1["1f1b_none"]["peak"]


def test_every_block_live_before_the_step_is_counted_ddp_buckets_included(tmp_path):
    """DDP's reducer holds a flat bucket copy of every gradient from construction on: live when
    the step starts, never allocated inside it. A stage of our runtime holds its gradients in
    persistent buckets (the parameters' .grad are views into them), without replicas too."""
    data = ["train.global_batch=32", "data.train_size=128", "data.test_size=32"]
    ddp = make_spec("strategy=dp", "world_size=2", *data)
    hippie = make_spec(
        *COMMON[:2], *data, "train.micro_batches=2", "strategy.boundaries=[3]", "strategy.recompute=none"
    )
    ranks = run(tmp_path, 2, {"dp": ddp, "hippie": hippie})
    m = hippie.model
    boundary = (32 // 2) * ((m.img_size // m.patch_size) ** 2 + 1) * m.embed_dim * 4  # fp32, 2 micro-batches
    for rank in ranks:
        dp, stage = rank["dp"], rank["hippie"]
        persistent = dp["parameters"] + dp["optimizer_state"] + dp["batch"]
        buckets = dp["at_step_start"] - persistent
        assert 0.95 * dp["parameters"] <= buckets <= 1.3 * dp["parameters"], (buckets, dp)
        # the stage's buckets are its gradients themselves, live at the start and counted once, and
        # at most one kept receive buffer per micro-batch (a boundary activation or its gradient)
        extra = stage["at_step_start"] - (stage["parameters"] + stage["optimizer_state"] + stage["batch"])
        assert 0.95 * stage["gradients"] <= extra <= stage["gradients"] + 2 * boundary, stage
        for m in (dp, stage):
            assert m["gradients"] == m["parameters"]  # every parameter gets a gradient of its size
            assert m["peak"] >= m["at_step_start"] + m["gradients"] * 0.5
            assert m["host_excluded"] > 0


def test_ashpipe_counts_one_stashed_weight_version_per_minibatch_in_flight(tmp_path):
    """Stage s of an S-stage asynchronous pipeline has S - s minibatches in flight: at the end of
    a step the master weights, S - s - 1 stashed versions and the one whose backward has just
    finished, kept for the next forward to reuse (the last stage stashes nothing)."""
    spec = make_spec(
        "strategy=ashpipe",
        "world_size=2",
        "strategy.replicas=[1,1]",
        "strategy.boundaries=[3]",
        "train.micro_batches=1",
        "train.global_batch=32",
        "data.train_size=256",
        "data.test_size=32",
    )
    spawn(2, _measure_ashpipe, spec, str(tmp_path))
    for s, m in enumerate(json.load(open(tmp_path / f"ash{r}.json")) for r in (0, 1)):
        assert m["stashed_weights"] == (2 - s if s < 1 else 0) * m["parameters"], (s, m)
        # the copy stashed during the step is live at the peak as well
        assert m["peak"] >= m["parameters"] * (1 + 2 - s) + m["optimizer_state"], (s, m)


def _measure_ashpipe(ctx, spec, out_dir):
    with open(os.path.join(out_dir, f"ash{ctx.rank}.json"), "w") as f:
        json.dump(measured_step(ctx, spec, warmup=3), f)


def test_measured_idle_follows_the_schedule_for_our_runtime_and_a_baseline(tmp_path):
    """The bubble measured from the profiled step's operator spans shrinks with more micro-batches
    (analytic (p-1)/(m+p-1): 50% at m=1, 11% at m=8), for Hippie and for torch pipelining alike."""
    base = [
        "world_size=2",
        "train.global_batch=256",
        "strategy.boundaries=[3]",
        "data.train_size=512",
        "data.test_size=32",
        "strategy.recompute=none",
    ]
    specs = {
        f"{s}_m{m}": make_spec(f"strategy={s}", f"train.micro_batches={m}", *base)
        for s, ms in (("hippie", (1, 8)), ("pipelining", (2, 8)))
        for m in ms
    }
    ranks = run(tmp_path, 2, specs)
    job = {name: job_idle_fractions([rank[name]["idle"] for rank in ranks]) for name in specs}
    for strategy, few in (("hippie", 1), ("pipelining", 2)):
        sparse, dense = job[f"{strategy}_m{few}"], job[f"{strategy}_m8"]
        # judged over the job, as the bubble is defined: a rank's measured idle also holds the host's
        # time between operators, which grows with more, smaller micro-batches (in CI torch
        # pipelining's last rank once measured 0.42 at m=2 and 0.47 at m=8 while the job's fell)
        assert sum(sparse) / 2 > sum(dense) / 2 + 0.05, (strategy, job)


def test_each_stage_a_process_drives_is_measured_apart_and_a_split_backward_in_its_parts(tmp_path):
    """torchgpipe drives both partitions from one process: each partition's forward, recomputation
    and backward are found (its stage span, autograd's sequence numbers) and nearly all of the
    process's compute is given to one of them. torch pipelining's ZB-V: the library's action
    spans tell the input- from the weight-gradient part of each backward."""
    base = [
        "world_size=2",
        "train.global_batch=32",
        "train.micro_batches=4",
        "data.train_size=128",
        "data.test_size=32",
    ]
    gpipe = {
        f"gpipe_{c}": make_spec("strategy=gpipe", f"strategy.checkpoint={c}", *base) for c in ("except_last", "never")
    }
    (process,) = run(tmp_path, 1, gpipe)
    for name, measured in process.items():
        stages = measured["stages"]
        assert sorted(stages) == ["0", "1"], name
        work = {k: measured["idle"]["busy_s"][k] for k in ("F", "B")}
        for kind, total in work.items():
            split = [stages[j]["idle"]["busy_s"].get(kind, 0.0) for j in ("0", "1")]
            assert sum(split) >= 0.9 * total and min(split) > 0.25 * total, (name, kind, split, total)
    zbv = {"zbv": make_spec("strategy=pipelining", "strategy.schedule=zbv", *base)}
    for rank in run(tmp_path, 2, zbv):
        assert {"F", "I", "W"} <= set(rank["zbv"]["idle"]["busy_s"]), rank["zbv"]["idle"]["busy_s"]
