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
into a per-action and a per-step cost.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile

import torch

from harness.core import comm as comm_mod
from harness.config.spec import RunSpec
from harness.core.data import BatchOrder, load
from harness.core.host import start_workers, threads_per_process
from harness.metrics.meter import track_cpu_allocations
from harness.core.models import build_layers
from harness.core.timing import DeviceTimer


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
    if spec.device == "cpu":  # as the launcher's workers run
        track_cpu_allocations()
    torch.set_num_threads(threads_per_process(spec.launch.threads_per_worker, world))
    ctx = comm_mod.init_process_group(rank=rank, world_size=world, local_rank=rank, device=spec.device,
                                      backend=spec.launch.backend, timeout_s=spec.launch.collective_timeout)
    try:
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
            medians = [statistics.median(max(per_rank) for per_rank in zip(*(g[i] for g in gathered)))
                       for i in range(len(specs))]
            with open(os.path.join(out, "times.json"), "w") as f:
                json.dump(medians, f)
    finally:
        comm_mod.destroy()
