"""Step times of a strategy on a null model: what its runtime costs around the operators.

The simulator replays action lists with measured operator costs; what a runtime spends on
the host besides (dispatching each action, posting and waiting on transfers, its per-step
bookkeeping and the optimizer's Python) is measured here, by running the strategy itself
in real worker processes, set up as the launcher sets them up, on specs whose model has
the same layers but almost no arithmetic. Several specs of one world size (the same
strategy with different micro-batch counts) are built in the same processes and timed in
interleaved rounds, exactly as the worker times a step (``train_step`` on the device
timer, the job's step being the slowest rank's), so a shared host's drift falls on all
of them alike. :func:`harness.planning.simulator.fit_runtime_overhead` turns the times
into a per-action and a per-step cost; :func:`measure_runtime_overhead` does both for a spec
(``pipebench profile`` stores the result in the profile).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import statistics
import tempfile

from harness.config.spec import RunSpec
from harness.core import comm as comm_mod
from harness.core.data import BatchOrder, load
from harness.core.errors import ConfigError
from harness.core.host import start_workers
from harness.core.models import build_layers
from harness.core.timing import DeviceTimer
from harness.planning.forecast import device_of, workload_of
from harness.planning.planner import Profile
from harness.planning.profiling import measure_profile
from harness.planning.simulator import Cluster, RuntimeOverhead, fit_runtime_overhead, predict
from harness.run.worker import started_rank


def null_step_times(specs: list[RunSpec], rounds: int = 5, steps: int = 6, warmup: int = 3) -> list[float]:
    """The median job step time of each spec (all of one world size and strategy), measured in
    ``rounds`` interleaved rounds of ``steps`` steps each after ``warmup`` steps."""
    first = specs[0]
    n = first.strategy_cls.processes(first)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(comm_mod.free_port())
    with tempfile.TemporaryDirectory() as out:
        start_workers(_worker, args=(n, specs, rounds, steps, warmup, out), nprocs=n)
        with open(os.path.join(out, "times.json")) as f:
            return json.load(f)


def _worker(rank: int, world: int, specs: list[RunSpec], rounds: int, steps: int, warmup: int, out: str) -> None:
    spec = specs[0]
    with started_rank(spec, rank, world, rank, world) as ctx:  # as the launcher's workers start
        comm = comm_mod.Comm(ctx)
        data = load(spec.data, spec.seed)
        strategies = [s.strategy_cls(s, build_layers(s.model, s.seed), ctx, comm) for s in specs]
        orders = [BatchOrder(len(data.train), s.train.global_batch, s.seed) for s in specs]
        timer = DeviceTimer(ctx.device)
        times: list[list[float]] = [[] for _ in specs]
        step = 0
        for r in range(rounds + 1):
            for i, strategy in enumerate(strategies):
                for _ in range(warmup if r == 0 else steps):  # round 0 warms every strategy up
                    x, y = data.train_batch(orders[i], step)
                    x, y = x.to(ctx.device), y.to(ctx.device)
                    start = timer.anchor()
                    loss = strategy.train_step(x, y)
                    elapsed = timer.elapsed(start, timer.mark())
                    float(loss)
                    if r:
                        times[i].append(elapsed)
                    step += 1
        for strategy in strategies:
            strategy.finish_training()
        gathered = comm.gather_objects(times)
        if ctx.is_main:  # the job's step is its slowest rank's
            medians = [
                statistics.median(max(per_rank) for per_rank in zip(*(g[i] for g in gathered)))
                for i in range(len(specs))
            ]
            with open(os.path.join(out, "times.json"), "w") as f:
                json.dump(medians, f)


# A model with the same layers (so the same stages, actions and parameter tensors) and almost no
# arithmetic: one token of 8 features. Its runs cost what the runtime costs around the operators.
_NULL_WIDTH = 8


def null_spec(spec: RunSpec, micro_batches: int) -> RunSpec | None:
    """``spec`` on the null model with ``micro_batches`` micro-batches; None where the strategy
    cannot run that many."""
    model = dataclasses.replace(
        spec.model, embed_dim=_NULL_WIDTH, num_heads=1, mlp_ratio=1.0, patch_size=spec.model.img_size
    )
    train = dataclasses.replace(spec.train, micro_batches=micro_batches)
    null = dataclasses.replace(
        spec, model=model, train=train, strategy=copy.deepcopy(spec.strategy), output_dir="", partition_dir=""
    )
    try:
        null.strategy_cls.check(null)
    except ConfigError:
        return None
    return null


def measure_runtime_overhead(spec: RunSpec, profile: Profile) -> RuntimeOverhead:
    """The per-action and per-step host costs of ``spec``'s strategy here: the strategy itself runs
    on the null model (the same workers, schedule and global batch, timed as the worker times a
    step; :mod:`harness.run.calibrate`) with its micro-batches and with twice as many (the action
    count changes, the step count does not), and
    :func:`harness.planning.simulator.fit_runtime_overhead` finds the costs that make the replays
    of those runs, with the null model's own measured layers, take the time they took."""
    device = device_of(spec)
    cluster = Cluster(name="this host", devices_per_node=spec.world_size, comm_uses_compute=device.type == "cpu")
    cluster.use_network(profile.network)
    nulls, seen = [], []
    for count in (spec.train.micro_batches, 2 * spec.train.micro_batches):
        null = null_spec(spec, count)
        if null is None:
            continue
        layout = null.strategy_cls.simulated(null, profile, cluster)
        if layout not in seen:  # a strategy whose actions do not follow the micro-batches (DP) runs once
            nulls.append(null)
            seen.append(layout)
    measured = null_step_times(nulls)
    # the null model's own layers at each run's micro-batch size; the per-sample costs of layers
    # this small depend on it
    profiles = [measure_profile(workload_of(null), device, network=profile.network) for null in nulls]
    layouts = [null.strategy_cls.simulated(null, p, cluster) for null, p in zip(nulls, profiles)]
    runs = [
        (layout, null.world_size, null.train.global_batch, t, p)
        for layout, null, t, p in zip(layouts, nulls, measured, profiles)
    ]
    per_action, per_step = fit_runtime_overhead(cluster, runs)
    calibration = [
        {
            "micro_batches": null.train.micro_batches,
            "measured_step_s": t,
            "replayed_step_s": predict(
                p, cluster, layout, null.world_size, null.train.global_batch, overhead=(per_action, per_step)
            ).iteration_s,
        }
        for layout, null, t, p in zip(layouts, nulls, measured, profiles)
    ]
    return RuntimeOverhead(layouts[0].strategy, layouts[0].schedule, per_action, per_step, calibration)
