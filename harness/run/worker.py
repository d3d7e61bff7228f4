"""The per-rank training loop shared by every strategy.

It owns what must be identical across strategies for a fair comparison: the
data order, which steps are timed, how memory is measured, when and how
evaluation runs. Rank 0 gathers every rank's measurements
(:class:`harness.metrics.measured.RankMeasurement`), adds its account of the run and what
the strategy says of it (its cut, its schedule on paper: plain data, asked here), and
:func:`harness.metrics.derive.job_figures` turns them into the record's figures.
:func:`started_rank` starts a rank's process the one way every worker starts.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import socket
import time
from typing import Iterator

import torch

from harness.config.spec import RunSpec
from harness.core import comm as comm_mod
from harness.core.checkpoints import checkpoint_folder
from harness.core.data import BatchOrder, load
from harness.core.host import threads_per_process
from harness.core.models import build_layers, count_parameters
from harness.core.timing import DeviceTimer
from harness.core.training import lr_factor
from harness.metrics.derive import job_figures, replicas_per_stage
from harness.metrics.flops import device_peak
from harness.metrics.measured import RankMeasurement, RunAccount, StrategyFacts
from harness.metrics.meter import StepMeter, peak_rss_bytes, track_cpu_allocations
from harness.run import preemption
from harness.run.progress import StepLog


def train(spec: RunSpec, ctx: comm_mod.DistContext, progress: bool = True, local_world: int = 1) -> dict | None:
    """Train as ``spec`` says on this rank (one of ``local_world`` workers on its host); returns
    the job's result on rank 0, else None."""
    comm = comm_mod.Comm(ctx)
    # before anything else runs on this device: what the FLOP figures are judged against
    peak, peak_source = device_peak(ctx.device, spec.train.precision, torch.get_num_threads())
    run = _Training(spec, ctx, comm, progress)
    run.steps()
    run.final_evaluation()
    gathered = comm.gather_objects(run.measurement(peak))
    if not ctx.is_main:
        return None
    return job_figures(spec, strategy_facts(run.strategy, gathered), gathered, run.account(peak_source, local_world))


class _Training:
    """One rank's training: the loop over the steps (:meth:`steps`), and between two steps what
    is due there: a checkpoint (:meth:`_checkpoint_if_due`), the check whether a preemption stops
    the run (:meth:`_stops_here`), a periodic evaluation (:meth:`_evaluate_if_due`); then the final
    evaluation. What the rank measured comes out as a :class:`RankMeasurement`
    (:meth:`measurement`), rank 0's account of the run as a :class:`RunAccount` (:meth:`account`)."""

    def __init__(self, spec: RunSpec, ctx: comm_mod.DistContext, comm: comm_mod.Comm, progress: bool):
        self.spec, self.ctx, self.comm = spec, ctx, comm
        t = spec.train
        self.dataset = load(spec.data, spec.seed, spec.model.num_classes)
        self.order = BatchOrder(len(self.dataset.train), t.global_batch, spec.seed)
        # the host's copy of the whole model stays alive for the run, so that the layers this rank
        # does not train are left out of its memory peak exactly (see harness.metrics.meter)
        self.layers = build_layers(spec.model, spec.seed)
        self.parameters = count_parameters(self.layers)
        self.strategy = spec.strategy_cls(spec, self.layers, ctx, comm)
        self.meter = StepMeter(ctx.device)
        self.timer = DeviceTimer(ctx.device)
        self.memory_step = spec.steps - 1 if t.measure_memory else None
        self.step_times: list[float] = []  # the timed steps' seconds
        self.timed: list[int] = []  # their calls of train_step in this process, as step_stats counts them
        self.host_only = functools.partial(host_only_tensors, self.strategy, self.layers, self.dataset)
        self.started_at = time.time()  # epoch seconds: start-up is this minus the command's start

        self.first_step = self.strategy.start_step()
        # the record's curves and training time so far (saved with every checkpoint): a resumed run
        # carries on those of the run it resumes
        self.history = _new_history(self.first_step)
        if t.resume:
            self.first_step, self.history = _resume(self.strategy, t.resume, ctx)
        self.loss_shares, self.curve = self.history["loss_shares"], self.history["curve"]
        self.train_start = time.perf_counter() - self.history["elapsed_s"]  # a stop's pause left out
        rate = lr_factor(t, spec.steps)
        self.log = StepLog(spec, ctx, self.first_step, lambda k: t.lr * rate(k), bar=progress)
        self.stopped_at: int | None = None  # the step after which a preemption stopped the run
        self.stopping = False  # every rank agreed to stop (at this step, or at the next checkpoint)
        self.last_loss = None  # the last step's loss share, as the strategy returned it
        self.train_time = 0.0
        self.final: dict = {}

    def steps(self) -> None:
        """Train from the first step to the last, or to where a preemption stops the run."""
        for step in range(self.first_step, self.spec.steps):
            self._step(step)
            saved = self._checkpoint_if_due(step + 1)
            if self._stops_here(step + 1, saved):
                self.stopped_at = step + 1
                break
            self._evaluate_if_due(step + 1)
        self.strategy.finish_training()
        self.train_time = time.perf_counter() - self.train_start
        self.log.close()

    def _step(self, step: int) -> None:
        """One optimizer step: timed (after the warm-up), or the one step whose memory is measured."""
        _inject_fault(self.spec, self.ctx.rank, step)
        x, y = self.dataset.train_batch(self.order, step)
        x, y = x.to(self.ctx.device, non_blocking=True), y.to(self.ctx.device, non_blocking=True)
        strategy, timer = self.strategy, self.timer
        if step == self.memory_step:
            with strategy.memory_step_context(), self.meter.measure_step(strategy.memory_parts, self.host_only):
                loss = strategy.train_step(x, y)
            dt = None
        else:
            # the device is idle here (the last step was waited for), so the anchor is exact
            start = timer.anchor()
            loss = strategy.train_step(x, y)
            dt = timer.elapsed(start, timer.mark())  # the one wait for the device in a step
            if step - self.first_step >= self.spec.train.warmup_steps:  # a resumed run warms up again
                self.step_times.append(dt)
                self.timed.append(step - self.first_step)  # this process's call, as step_stats counts them
        self.loss_shares.append(float(loss))  # on the device until now: read once per step, after it
        self.log.step(step, self.loss_shares[-1], dt)
        self.history["elapsed_s"] = time.perf_counter() - self.train_start
        # held until the next step has run, as the loop always held it: the measured memory peak
        # counts it (the strategy's loss share, a scalar)
        self.last_loss = loss

    def _checkpoint_if_due(self, done: int) -> bool:
        """Save a checkpoint after step ``done`` where train.checkpoint_every asks for one (and after
        the last step); whether it did."""
        every = self.spec.train.checkpoint_every
        if not (every and (done % every == 0 or done == self.spec.steps)):
            return False
        _save_checkpoint(self.strategy, self.spec, self.comm, done, self.history)
        return True

    def _stops_here(self, done: int, saved: bool) -> bool:
        """Whether a preemption (harness.run.preemption) stops the run after step ``done``, with the
        checkpoint it resumes from saved (``saved``: one was just saved). Every rank learns of a
        request at the same step."""
        spec = self.spec
        if done >= spec.steps:
            return False
        if spec.preemptible and not self.stopping:
            self.stopping = _agree_to_stop(self.comm, preemption.stop_requested(spec.output_dir))
        # a strategy whose checkpoint changes its training stops at its next periodic checkpoint,
        # where the uninterrupted run checkpoints too: the resumed run is then that run exactly
        waits = self.strategy.checkpoint_changes_training and spec.train.checkpoint_every
        if not self.stopping or not (saved or not waits):
            return False
        if not saved:
            _save_checkpoint(self.strategy, spec, self.comm, done, self.history)
        return True

    def _evaluate_if_due(self, done: int) -> None:
        """Evaluate after step ``done`` where train.eval_every asks for it (not after the last step:
        the final evaluation follows it)."""
        every = self.spec.train.eval_every
        if every and done % every == 0 and done < self.spec.steps:
            point = _evaluate(self.strategy, self.dataset, self.spec, self.ctx)
            point.update(step=done, elapsed_s=time.perf_counter() - self.train_start)
            self._evaluated(point)

    def final_evaluation(self) -> None:
        """The evaluation at the end of the run; a preempted run spends its grace time on the
        checkpoint, not on evaluating (its point has no accuracy)."""
        if self.stopped_at is None:
            self.final = _evaluate(self.strategy, self.dataset, self.spec, self.ctx)
            self.final.update(step=self.spec.steps, elapsed_s=self.train_time)
            self._evaluated(self.final)
        else:
            self.final = {"accuracy": None, "loss": None, "step": self.stopped_at, "elapsed_s": self.train_time}
            self.curve.append(self.final)

    def _evaluated(self, point: dict) -> None:
        """An evaluation's point on the accuracy curve (and whether it reached the target)."""
        self.curve.append(point)
        self.log.evaluated(point)
        if self.history["reached_target_s"] is None and point["accuracy"] >= self.spec.train.target_accuracy:
            self.history["reached_target_s"] = point["elapsed_s"]

    def measurement(self, peak_flops: float | None) -> RankMeasurement:
        """What this rank measured."""
        strategy, meter = self.strategy, self.meter
        return RankMeasurement(
            rank=self.ctx.rank,
            host=socket.gethostname(),
            step_times=self.step_times,
            peak_memory_bytes=meter.peak_bytes,
            memory_breakdown=meter.breakdown,
            idle=meter.idle,
            profiled_spans=meter.spans,
            stages=meter.stages,
            peak_rss_bytes=peak_rss_bytes(),
            peak_flops=peak_flops,
            recomputed_layers=strategy.recomputed_layers(),
            layout=strategy.layout(),
            loss_shares=self.loss_shares,
            **_time_split(strategy.step_stats, self.timed),
            extra=strategy.extra_metrics(),
        )

    def account(self, peak_source: str, local_world: int) -> RunAccount:
        """Rank 0's account of the run."""
        return RunAccount(
            final=self.final,
            curve=self.curve,
            reached_target_s=self.history["reached_target_s"],
            stopped_at=self.stopped_at,
            curve_start=self.history["first_step"],
            first_step=self.first_step,
            resumed=bool(self.spec.train.resume),
            train_time_s=self.train_time,
            training_started_at=self.started_at,
            parameters=self.parameters,
            device=self.ctx.device.type,
            threads=torch.get_num_threads(),
            local_world=local_world,
            peak_source=peak_source,
        )


def strategy_facts(strategy, gathered: list[RankMeasurement]) -> StrategyFacts:
    """What rank 0's strategy says of the run: its cut, and its schedule over the job's pipeline
    (as long as the ranks' layouts say) on paper and to replay; the devices it used."""
    spec, partition = strategy.spec, strategy.partition
    boundaries = partition.boundaries if partition else None
    pipeline = len(replicas_per_stage([r.layout for r in gathered], boundaries))
    lists, placement = strategy.replayed_schedule(spec, pipeline) or (None, None)
    return StrategyFacts(
        boundaries=boundaries,
        partition_source=partition.source if partition else None,
        analytic_bubble=strategy.analytic_bubble(spec, pipeline),
        replay_lists=lists,
        replay_placement=placement,
        devices=spec.strategy_cls.gpus(spec),
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
    return step, state.get("history") or _new_history(step)


def _new_history(first_step: int) -> dict:
    """The record's history of a run that starts at ``first_step``: the loss shares of its steps,
    its accuracy curve, the seconds it trained and when it reached the target accuracy (None: not
    yet). A checkpoint holds it as a plain dict."""
    return {"first_step": first_step, "loss_shares": [], "curve": [], "elapsed_s": 0.0, "reached_target_s": None}


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


@contextlib.contextmanager
def started_rank(
    spec: RunSpec, rank: int, world_size: int, local_rank: int, local_world: int
) -> Iterator[comm_mod.DistContext]:
    """Start this process as rank ``rank`` of ``world_size`` (the ``local_rank``-th of the
    ``local_world`` workers on its host), as every worker of the harness starts (the launcher's,
    a torchrun or Slurm task, the calibration's): memory tracked the one way it is measured, its
    share of the host's threads, the process group joined; left on the way out."""
    if spec.device == "cpu":  # CPU memory is measured through the allocator's own accounting
        track_cpu_allocations()
    torch.set_num_threads(threads_per_process(spec.launch.threads_per_worker, local_world))
    ctx = comm_mod.init_process_group(
        rank=rank,
        world_size=world_size,
        local_rank=local_rank,
        device=spec.device,
        backend=spec.launch.backend,
        timeout_s=spec.launch.collective_timeout,
    )
    try:
        yield ctx
    finally:
        comm_mod.destroy()


def worker_main(
    rank: int, spec: RunSpec, world_size: int, local_world: int, result_path: str | None, progress: bool
) -> None:
    """Entry point of one spawned worker process."""
    if spec.preemptible:  # a scheduler may signal the workers too: the signal asks to stop, not to die
        preemption.listen()
    with started_rank(spec, rank, world_size, rank % max(local_world, 1), local_world) as ctx:
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
