"""A run's figures, derived in one place from what its ranks measured.

The worker loop (:mod:`harness.run.worker`) measures and gathers: every rank's
:class:`~harness.metrics.measured.RankMeasurement` (step times, memory, idle time and spans,
layout and loss shares), rank 0's :class:`~harness.metrics.measured.RunAccount` of the run
(evaluations, times) and the strategy's :class:`~harness.metrics.measured.StrategyFacts` (its
cut, its schedule on paper). :func:`job_figures` turns them into the record's figures, the same
way for every strategy: throughput from the slowest rank's median step, the peak memory over
ranks, the bubble measured, on paper and replayed, FLOPs with MFU and HFU, the host's use, and
the figures no measurement can produce (:mod:`harness.report.checks`). A new
figure is one more entry here and one column (:mod:`harness.report.columns`); docs: extending/metric.
"""

from __future__ import annotations

import os

from harness.metrics import idle
from harness.metrics.flops import layer_flops, utilisation
from harness.metrics.measured import RankMeasurement, RunAccount, StrategyFacts
from harness.metrics.meter import job_idle_fractions, step_time_summary
from harness.report.checks import impossible
from harness.report.record import diverged_at
from harness.runtime.schedules import replayed_timeline, timeline_bubble


def job_figures(spec, facts: StrategyFacts, gathered: list[RankMeasurement], run: RunAccount) -> dict:
    """The record's measured part. ``spec``: the validated run spec (its train, model and data
    keys); ``facts``: what the strategy says of the run (its cut, its schedule on paper);
    ``gathered``: every rank's measurements (their loss shares summed into the loss curve);
    ``run``: rank 0's account of the run."""
    t = spec.train
    losses = [
        [step, sum(vals)] for step, vals in enumerate(zip(*(r.loss_shares for r in gathered)), start=run.curve_start)
    ]
    timing = step_time_summary([r.step_times for r in gathered])
    step_time = timing["step_time_s"]
    peaks = [r.peak_memory_bytes for r in gathered]
    replicas = replicas_per_stage([r.layout for r in gathered], facts.boundaries)
    final = run.final
    figures = {
        **timing,
        "throughput": t.global_batch / step_time if step_time else None,
        "peak_memory_bytes": max(p for p in peaks if p is not None) if any(p is not None for p in peaks) else None,
        "peak_memory_per_rank": peaks,
        "peak_rss_per_rank": [r.peak_rss_bytes for r in gathered],
        "memory_method": ("cuda_max_allocated_step" if run.device == "cuda" else "cpu_allocator_total_step")
        if t.measure_memory
        else None,
        "accuracy": final["accuracy"],
        "test_loss": final["loss"],
        "final_loss": losses[-1][1],
        "loss_curve": losses,
        # the run goes on (its accuracy is what divergence leaves); tables footnote it
        "diverged_at_step": diverged_at(losses),
        "accuracy_curve": run.curve,
        "time_to_target_s": run.reached_target_s,
        "stopped_at_step": run.stopped_at,
        "resumed_from_step": run.first_step if run.resumed else None,
        "target_accuracy": t.target_accuracy,
        "train_time_s": run.train_time_s,
        "training_started_at": run.training_started_at,
        "parameters": run.parameters,
        **_flop_figures(spec, facts.devices, gathered, step_time),
        "peak_source": run.peak_source,
        # the cut every stage used, and whether it was given, measured, shared within the sweep or planned
        "boundaries": facts.boundaries,
        "partition_source": facts.partition_source,
        "replicas": replicas,
        **_bubbles(gathered, replicas, facts),
        **_host_use(run.device, run.threads, run.local_world),
    }
    # after the bubbles, which take the operator intervals out of the measured idle time
    figures["per_rank"] = [r.record() for r in gathered]
    figures["figure_errors"] = impossible({**figures, "global_batch": t.global_batch})
    return figures


def _flop_figures(spec, devices: int, gathered: list[RankMeasurement], step_time: float | None) -> dict:
    """Model and hardware FLOPs per step, TFLOP/s per device, MFU and HFU (harness.metrics.flops):
    every rank's recomputed layers summed, the peaks of the ``devices`` the run used averaged."""
    recomputed: dict[int, float] = {}
    for r in gathered:
        for layer, share in r.recomputed_layers.items():
            recomputed[layer] = recomputed.get(layer, 0.0) + share
    peaks = [r.peak_flops for r in gathered if r.peak_flops]
    peak = sum(peaks) / len(peaks) if peaks else None
    flops = layer_flops(spec.model, spec.train.global_batch, spec.data.image_size)
    return {**utilisation(flops, recomputed, step_time, devices, peak), "peak_flops_per_device": peak}


def replicas_per_stage(layouts: list[dict], boundaries: list[int] | None) -> list[int]:
    """Workers per pipeline stage, from the ranks' layouts and the cut ``boundaries`` ([world size]
    for data parallelism; one process per stage for a strategy that drives every stage from one
    process). Its length is the pipeline's, which the worker asks the strategy's schedule about."""
    stages = [lay.get("stage") for lay in layouts]
    if all(isinstance(s, int) for s in stages):
        return [stages.count(s) for s in range(max(stages) + 1)]
    if stages == ["all"] and boundaries is not None:
        return [1] * (len(boundaries) + 1)
    return [len(layouts)]


def _bubbles(gathered: list[RankMeasurement], replicas: list[int], facts: StrategyFacts) -> dict:
    """The measured idle fraction (mean over the pipeline's devices, from the profiled step: each
    rank, or each stage of a process that drives several) and where the idle time went
    (:mod:`harness.metrics.idle`, one machine's devices), the analytic one for this schedule,
    the schedule replayed with the measured costs (and its timeline, for the trace), and the
    replica all-reduce hidden under backward (mean over ranks that have one)."""
    units = _measured_units(gathered)
    idles = [u["idle"] for u in units]
    hidden = [r.allreduce["hidden_allreduce_s"] for r in gathered if r.allreduce]
    # one machine's ranks share the profiler's clock; across machines each rank's own span is used
    same_host = len({u["host"] for u in units}) == 1
    measured = bool(units) and all(idles) and len(units) >= len(replicas)
    fractions = (job_idle_fractions(idles) if same_host else [i["idle_fraction"] for i in idles]) if measured else None
    replay = facts.replay_lists if measured else None
    timeline = _replayed(replay, facts.replay_placement, units) if replay is not None else None
    classified = (
        idle.classify(
            [
                {
                    "compute": u["idle"].get("union"),
                    "comm": u["idle"].get("comm"),
                    "start": u["idle"]["start_s"],
                    "end": u["idle"]["end_s"],
                }
                for u in units
            ]
        )
        if measured and same_host
        else None
    )
    parts, origin = classified or (None, 0.0)
    mean, seconds = idle.breakdown(parts) if parts else (None, None)
    for u in units:  # thousands of operator intervals: read here, not kept in the record
        (u["idle"] or {}).pop("union", None)
    return {
        "bubble_measured": sum(fractions) / len(fractions) if measured else None,
        "bubble_per_rank": fractions,
        "bubble_analytic": facts.analytic_bubble,
        "bubble_replayed": timeline_bubble(timeline, len(replay)) if timeline else None,
        "idle_breakdown": mean,
        # per device: its label, seconds per part, and the parts in time order (the trace's idle track)
        "idle_per_device": [
            {"device": u["label"], **sec, "waits": idle.waits(lane, origin, 1e-4)}
            for u, sec, lane in zip(units, seconds, parts)
        ]
        if parts
        else None,
        "replay_timeline": [
            [(str(e.action), e.start, e.end) for e in timeline.stage_events(p)] for p in range(len(replay))
        ]
        if timeline
        else None,
        "hidden_allreduce_s": sum(hidden) / len(hidden) if hidden else None,
    }


def _measured_units(gathered: list[RankMeasurement]) -> list[dict]:
    """Every device the job ran on (each rank, or each stage of a process that drives several,
    as torchgpipe does): its stage, profiled idle and compute spans, host and label."""
    units = []
    for r in gathered:
        if r.stages:
            units += [
                {
                    "stage": int(j),
                    "idle": st["idle"],
                    "spans": st["profiled_spans"],
                    "host": r.host,
                    "label": f"rank {r.rank} stage {j}",
                }
                for j, st in sorted(r.stages.items(), key=lambda kv: int(kv[0]))
            ]
        else:
            units.append(
                {
                    "stage": r.layout.get("stage"),
                    "idle": r.idle,
                    "spans": r.profiled_spans,
                    "host": r.host,
                    "label": f"rank {r.rank}",
                }
            )
    return units


def _replayed(schedule, placement, units: list[dict]):
    """The schedule replayed by the simulator with the time of each kind (forward, backward and its
    parts, optimizer) each rank position of the pipeline spent in the profiled step (mean over its
    replicas); None where the profile does not split the time by kind (a GPU's kernels)."""
    if not all("F" in u["idle"]["busy_s"] for u in units):
        return None
    busy = []
    for lane in range(len(schedule)):
        spent = [u["idle"]["busy_s"] for u in units if u["stage"] == lane]
        busy.append({kind: sum(b.get(kind, 0.0) for b in spent) / len(spent) for kind in set().union(*spent)})
    return replayed_timeline(schedule, busy, placement)


def _host_use(device: str, threads: int, local_world: int) -> dict:
    """Whether this host's workers could each run their threads on cores of their own: on an
    oversubscribed CPU host, speed is not comparable (memory, accuracy and correctness still are)."""
    cores = os.cpu_count() or 1
    return {
        "threads_per_worker": threads,
        "workers_on_host": local_world,
        "host_cores": cores,
        "speed_comparable": device != "cpu" or local_world * threads <= cores,
    }
