"""The per-rank training loop shared by every strategy.

It owns what must be identical across strategies for a fair comparison: the
data order, which steps are timed, how memory is measured, when and how
evaluation runs. Rank 0 gathers every rank's measurements, and
:func:`harness.metrics.derive.job_figures` turns them into the record's figures.
"""

from __future__ import annotations

import functools
import json
import os
import socket
import time

import torch

from harness.config.spec import RunSpec
from harness.core import comm as comm_mod
from harness.core.checkpoints import checkpoint_folder
from harness.core.data import BatchOrder, load
from harness.core.host import threads_per_process
from harness.core.models import build_layers, count_parameters
from harness.core.timing import DeviceTimer
from harness.core.training import lr_factor
from harness.metrics.derive import job_figures
from harness.metrics.flops import device_peak
from harness.metrics.meter import StepMeter, peak_rss_bytes, track_cpu_allocations
from harness.run import preemption
from harness.run.progress import StepLog


def train(spec: RunSpec, ctx: comm_mod.DistContext, progress: bool = True, local_world: int = 1) -> dict | None:
    """Train as ``spec`` says on this rank (one of ``local_world`` workers on its host); returns
    the job's result on rank 0, else None."""
    comm = comm_mod.Comm(ctx)
    # before anything else runs on this device: what the FLOP figures are judged against
    peak, peak_source = device_peak(ctx.device, spec.train.precision, torch.get_num_threads())
    dataset = load(spec.data, spec.seed, spec.model.num_classes)
    order = BatchOrder(len(dataset.train), spec.train.global_batch, spec.seed)
    layers = build_layers(spec.model, spec.seed)
    n_params = count_parameters(layers)
    strategy = spec.strategy_cls(spec, layers, ctx, comm)
    meter = StepMeter(ctx.device)
    timer = DeviceTimer(ctx.device)

    t, steps = spec.train, spec.steps
    memory_step = steps - 1 if t.measure_memory else None
    step_times: list[float] = []
    timed: list[int] = []
    # the host's copy of the whole model stays alive for the run (``layers``), so that the layers
    # this rank does not train are left out of its memory peak exactly (see harness.metrics.meter)
    host_only = functools.partial(host_only_tensors, strategy, layers, dataset)
    training_started_at = time.time()  # epoch seconds: start-up is this minus the command's start

    first_step = strategy.start_step()
    # the record's curves and training time so far: a resumed run carries on those of the run it resumes
    history = {"first_step": first_step, "loss_shares": [], "curve": [], "elapsed_s": 0.0, "reached_target_s": None}
    if t.resume:
        first_step, history = _resume(strategy, t.resume, ctx)
    loss_shares, curve, reached_target_s = history["loss_shares"], history["curve"], history["reached_target_s"]
    train_start = time.perf_counter() - history["elapsed_s"]  # time between a stop and its resumption left out
    rate = lr_factor(t, steps)
    log = StepLog(spec, ctx, first_step, lambda k: t.lr * rate(k), bar=progress)
    stopped_at = None  # the step after which a preemption stopped the run (harness.run.preemption)
    stopping = False  # every rank agreed to stop (at this step, or at the next checkpoint)
    for step in range(first_step, steps):
        _inject_fault(spec, ctx.rank, step)
        x, y = dataset.train_batch(order, step)
        x, y = x.to(ctx.device, non_blocking=True), y.to(ctx.device, non_blocking=True)
        if step == memory_step:
            with strategy.memory_step_context(), meter.measure_step(strategy.memory_parts, host_only):
                loss = strategy.train_step(x, y)
            dt = None
        else:
            # the device is idle here (the last step was waited for), so the anchor is exact
            start = timer.anchor()
            loss = strategy.train_step(x, y)
            dt = timer.elapsed(start, timer.mark())  # the one wait for the device in a step
            if step - first_step >= t.warmup_steps:  # a resumed run warms up again
                step_times.append(dt)
                timed.append(step - first_step)  # this process's call, as step_stats counts them
        loss_shares.append(float(loss))  # on the device until now: read once per step, after it
        log.step(step, loss_shares[-1], dt)
        history.update(elapsed_s=time.perf_counter() - train_start, reached_target_s=reached_target_s)
        saved = bool(t.checkpoint_every and ((step + 1) % t.checkpoint_every == 0 or step + 1 == steps))
        if saved:
            _save_checkpoint(strategy, spec, comm, step + 1, history)
        if spec.preemptible and not stopping and step + 1 < steps:
            stopping = _agree_to_stop(comm, preemption.stop_requested(spec.output_dir))
        # a strategy whose checkpoint changes its training stops at its next periodic checkpoint,
        # where the uninterrupted run checkpoints too: the resumed run is then that run exactly
        if (
            stopping
            and step + 1 < steps
            and (saved or not (strategy.checkpoint_changes_training and t.checkpoint_every))
        ):
            if not saved:
                _save_checkpoint(strategy, spec, comm, step + 1, history)
            stopped_at = step + 1
            break
        if t.eval_every and (step + 1) % t.eval_every == 0 and step + 1 < steps:
            point = _evaluate(strategy, dataset, spec, ctx)
            point.update(step=step + 1, elapsed_s=time.perf_counter() - train_start)
            curve.append(point)
            log.evaluated(point)
            if reached_target_s is None and point["accuracy"] >= t.target_accuracy:
                reached_target_s = point["elapsed_s"]
    strategy.finish_training()
    train_time = time.perf_counter() - train_start
    log.close()

    # a preempted run spends its grace time on the checkpoint, not on evaluating
    final = _evaluate(strategy, dataset, spec, ctx) if stopped_at is None else {"accuracy": None, "loss": None}
    final.update(step=stopped_at or steps, elapsed_s=train_time)
    curve.append(final)
    if stopped_at is None:
        log.evaluated(final)
    if reached_target_s is None and stopped_at is None and final["accuracy"] >= t.target_accuracy:
        reached_target_s = train_time

    per_rank = {
        "rank": ctx.rank,
        "host": socket.gethostname(),
        "step_times": step_times,
        "peak_memory_bytes": meter.peak_bytes,
        "memory_breakdown": meter.breakdown,
        "idle": meter.idle,
        "profiled_spans": meter.spans,
        "stages": meter.stages,  # one process driving several stages: each stage's own
        "peak_rss_bytes": peak_rss_bytes(),
        "peak_flops": peak,
        "recomputed_layers": strategy.recomputed_layers(),
        "layout": strategy.layout(),
        "loss_shares": loss_shares,
        **_time_split(strategy.step_stats, timed),
        **strategy.extra_metrics(),
    }
    gathered = comm.gather_objects(per_rank)
    if not ctx.is_main:
        return None
    return job_figures(
        spec,
        strategy,
        gathered,
        {
            "final": final,
            "curve": curve,
            "reached_target_s": reached_target_s,
            "stopped_at": stopped_at,
            "curve_start": history["first_step"],
            "first_step": first_step,
            "resumed": bool(t.resume),
            "train_time_s": train_time,
            "training_started_at": training_started_at,
            "parameters": n_params,
            "device": ctx.device.type,
            "threads": torch.get_num_threads(),
            "local_world": local_world,
            "peak_source": peak_source,
        },
    )


def host_only_tensors(strategy, layers, dataset) -> list[torch.Tensor]:
    """Host tensors a GPU would not hold: the dataset and the layers this rank does not train."""
    owned = set(strategy.owned_layers())
    return [
        *(t for i, layer in enumerate(layers) if i not in owned for t in (*layer.parameters(), *layer.buffers())),
        dataset.train.images,
        dataset.train.labels,
        dataset.test.images,
        dataset.test.labels,
    ]


def _agree_to_stop(comm, requested: bool) -> bool:
    """Whether any rank was asked to stop: every rank learns it at the end of the same step (one
    small all-reduce per step, made only while a run can be preempted, outside the timed step)."""
    flag = torch.tensor([1.0 if requested else 0.0], device=comm.ctx.device)
    return bool(comm.all_reduce(flag).item())


def _inject_fault(spec: RunSpec, rank: int, step: int) -> None:
    """launch.fault: make one rank fail on purpose, to see the job end cleanly."""
    launch = spec.launch
    if launch.fault == "slow" and rank == launch.fault_rank and step >= launch.fault_step:
        if not launch.fault_starts or spec.resumed < launch.fault_starts:  # resumed: earlier starts
            time.sleep(launch.fault_sleep_s)
    if launch.fault in ("none", "slow") or rank != launch.fault_rank or step != launch.fault_step:
        return
    if launch.fault == "raise":
        raise RuntimeError(f"injected fault on rank {rank} at step {step} (launch.fault=raise)")
    if launch.fault == "exit":
        os._exit(3)
    if launch.fault == "hang":
        time.sleep(10**6)


def _save_checkpoint(strategy, spec: RunSpec, comm, step: int, history: dict) -> None:
    """Every rank writes its own file atomically (its state, and the record's ``history`` so far:
    its loss shares, the accuracy curve, the training time); rank 0 then points ``latest`` at the
    folder."""
    folder = os.path.join(spec.output_dir, "checkpoints", f"step{step}")
    os.makedirs(folder, exist_ok=True)
    strategy.quiesce()
    state = {
        **strategy.checkpoint_state(),
        "step": step,
        "strategy": spec.strategy.name,
        "world_size": spec.world_size,
        "history": history,
    }
    tmp = os.path.join(folder, f".rank{comm.ctx.rank}.pt.tmp")
    torch.save(state, tmp)
    os.replace(tmp, os.path.join(folder, f"rank{comm.ctx.rank}.pt"))
    comm.barrier()
    if comm.ctx.is_main:
        latest = os.path.join(spec.output_dir, "checkpoints", "latest")
        with open(latest + ".tmp", "w") as f:
            f.write(f"step{step}\n")
        os.replace(latest + ".tmp", latest)


def _resume(strategy, path: str, ctx) -> tuple[int, dict]:
    """Load this rank's checkpoint into ``strategy``: (the step to continue from, the record's history
    so far; a checkpoint written before histories were kept starts a new one at its step)."""
    folder = checkpoint_folder(path)
    state = torch.load(os.path.join(folder, f"rank{ctx.rank}.pt"), map_location=ctx.device)
    strategy.load_checkpoint_state(state)
    step = int(state["step"])
    return step, state.get("history") or {
        "first_step": step,
        "loss_shares": [],
        "curve": [],
        "elapsed_s": 0.0,
        "reached_target_s": None,
    }


def _time_split(step_stats: list[dict], timed: list[int]) -> dict:
    """Mean per timed step of where this rank's time went, and the events of the last timed step."""
    stats = [step_stats[i] for i in timed if i < len(step_stats)]
    if not stats:
        return {}
    keys = ("compute_s", "comm_s", "idle_s")
    split = {
        "time_split": {k: sum(s[k] for s in stats) / len(stats) for k in keys},
        "events": stats[-1].get("events", []),
    }
    reduces = [s["allreduce"] for s in stats if s.get("allreduce")]
    if reduces:  # a stage with replicas: its all-reduce, mean per timed step
        split["allreduce"] = {k: sum(r[k] for r in reduces) / len(reduces) for k in reduces[0]}
    return split


@torch.no_grad()
def _evaluate(strategy, dataset, spec: RunSpec, ctx) -> dict:
    """Top-1 and loss on the test split, in chunks of exactly the global batch.

    Using the training batch shape lets every strategy evaluate (some baselines fix
    their micro-batch shapes at build time); the tail that does not fill a batch
    is left out, the same samples for every strategy.
    """
    test, B = dataset.test, spec.train.global_batch
    limit = len(test) if spec.train.eval_samples <= 0 else min(spec.train.eval_samples, len(test))
    correct = count = 0
    loss_sum = 0.0
    for start in range(0, limit - B + 1, B):
        x, y = test.batch(torch.arange(start, start + B))
        r = strategy.evaluate(x.to(ctx.device), y.to(ctx.device))
        correct, count, loss_sum = correct + r.correct, count + r.count, loss_sum + r.loss_sum
    return {"accuracy": correct / max(count, 1), "loss": loss_sum / max(count, 1), "count": count}


def worker_main(
    rank: int, spec: RunSpec, world_size: int, local_world: int, result_path: str | None, progress: bool
) -> None:
    """Entry point of one spawned worker process."""
    if spec.preemptible:  # a scheduler may signal the workers too: the signal asks to stop, not to die
        preemption.listen()
    if spec.device == "cpu":  # CPU memory is measured through the allocator's own accounting
        track_cpu_allocations()
    torch.set_num_threads(threads_per_process(spec.launch.threads_per_worker, local_world))
    ctx = comm_mod.init_process_group(
        rank=rank,
        world_size=world_size,
        local_rank=rank % max(local_world, 1),
        device=spec.device,
        backend=spec.launch.backend,
        timeout_s=spec.launch.collective_timeout,
    )
    try:
        result = train(spec, ctx, progress=progress, local_world=local_world)
        if result is not None and result_path:
            tmp = result_path + ".tmp"
            with open(tmp, "w") as f:
                json.dump(result, f)
            os.replace(tmp, result_path)
    except BaseException:
        if result_path:  # when this rank failed, before its peers can see it (see launch._first_failed)
            with open(f"{result_path}.failed.{rank}", "w") as f:
                f.write(repr(time.time()))
        raise
    finally:
        comm_mod.destroy()
