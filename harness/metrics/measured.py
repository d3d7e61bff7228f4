"""What the run layer hands :func:`harness.metrics.derive.job_figures`: plain data, each field
declared here with what it holds.

RankMeasurement  what one rank measured; every rank's is gathered to rank 0 (pickled across
                 processes), and its :meth:`RankMeasurement.record` is that rank's ``per_rank``
                 entry of the record
RunAccount       rank 0's account of the run: its evaluations, its times, the model's size, the host
StrategyFacts    what the strategy says of the run: where it cut the layers, the bubble its schedule
                 has on paper, the action lists to replay with the measured costs, the devices used

The worker (:mod:`harness.run.worker`) fills them in, asking the strategy for its facts, so the
metrics never call back up into a strategy.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class RankMeasurement:
    """One rank's measurements of its run (harness.metrics.meter measures most of them)."""

    rank: int  # the process's rank in the job
    host: str  # its host's name: the ranks of one host share the profiler's clock
    step_times: list[float]  # seconds of each timed step (after the warm-up; the memory step left out)
    peak_memory_bytes: int | None  # the measured step's live training memory at its peak; None: not measured
    memory_breakdown: dict[str, int] | None  # that peak by part (parameters, gradients, ..., other)
    idle: dict | None  # the profiled step's idle time (idle_fraction, busy_s by kind, start_s, end_s, ...)
    profiled_spans: list  # the profiled step's merged compute blocks: (name, start, end), epoch seconds
    # a process that drives several stages (torchgpipe): each stage's own {"idle", "profiled_spans"},
    # by stage; empty for a rank of one stage
    stages: dict[int, dict]
    peak_rss_bytes: int  # the process's peak resident set size
    peak_flops: float | None  # the device's dense peak FLOP/s the FLOP figures are judged against
    recomputed_layers: dict[int, float]  # layers recomputed in backward: share of the global batch each
    layout: dict  # what this rank runs (stage, replica, layers), as the strategy says
    # this rank's share of the global mean loss at each step of this process (the shares of all
    # ranks sum to it); summed into the loss curve, not kept per rank in the record
    loss_shares: list[float]
    # mean per timed step of where the time went (compute_s, comm_s, idle_s); None where the
    # strategy does not split its time
    time_split: dict[str, float] | None = None
    events: list | None = None  # the events of the last timed step (with time_split)
    allreduce: dict[str, float] | None = None  # a stage with replicas: its all-reduce, mean per timed step
    extra: dict[str, Any] = field(default_factory=dict)  # the strategy's own per-rank figures (extra_metrics)

    def record(self) -> dict:
        """This rank's ``per_rank`` entry of the record: every field but the loss shares, the time
        split and the all-reduce only where measured, the strategy's own figures last."""
        out = {
            "rank": self.rank,
            "host": self.host,
            "step_times": self.step_times,
            "peak_memory_bytes": self.peak_memory_bytes,
            "memory_breakdown": self.memory_breakdown,
            "idle": self.idle,
            "profiled_spans": self.profiled_spans,
            "stages": self.stages,
            "peak_rss_bytes": self.peak_rss_bytes,
            "peak_flops": self.peak_flops,
            "recomputed_layers": self.recomputed_layers,
            "layout": self.layout,
        }
        if self.time_split is not None:
            out.update(time_split=self.time_split, events=self.events)
        if self.allreduce is not None:
            out["allreduce"] = self.allreduce
        return {**out, **self.extra}


@dataclass
class RunAccount:
    """Rank 0's account of the run."""

    # the last evaluation ({accuracy, loss, count, step, elapsed_s}); accuracy and loss None for a
    # run a preemption stopped (it spends its grace time on the checkpoint)
    final: dict
    curve: list[dict]  # every evaluation, the final one last; a resumed run's carries its predecessor's
    reached_target_s: float | None  # training seconds until an evaluation first reached the target accuracy
    stopped_at: int | None  # the step after which a preemption stopped the run; None: it ran to the end
    # the step the loss curve starts at: 0, also for a resumed run, which carries its predecessor's curve
    curve_start: int
    first_step: int  # the step this process started at
    resumed: bool  # whether this process resumed from a checkpoint
    train_time_s: float  # seconds of training, a resumed run's predecessors' included
    training_started_at: float  # epoch seconds when training started: start-up is this minus the command's start
    parameters: int  # the model's parameter count
    device: str  # the device type the ranks ran on: cuda | cpu
    threads: int  # torch threads of each worker
    local_world: int  # workers on this host
    peak_source: str  # where the device's peak FLOP/s comes from (a datasheet, a measured matmul)


@dataclass
class StrategyFacts:
    """What the strategy rank 0 ran says of the run, for the figures judged against it."""

    boundaries: list[int] | None  # where the pipeline cut the layer list; None: no cut
    partition_source: str | None  # how it came by the cut: given, measured, shared, planned, ...
    analytic_bubble: float  # the idle fraction its schedule has on paper over the job's pipeline
    # the action lists of each rank position of the pipeline, to replay with the measured costs
    # (``bubble_replayed``); None where there is no synchronous pipeline schedule to replay
    replay_lists: list[list] | None
    replay_placement: list[int] | None  # the rank position of each stage where a rank holds several, else None
    devices: int  # the devices the run used (torchgpipe may drive several stages from one process)
