"""One job of ``pipebench run``: validate, launch, record, mirror, summarise (a single run, or one
point of a sweep); the command itself is :mod:`harness.commands.run`."""

from __future__ import annotations

import os
import sys

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from harness.cli.sweep import sweep_group
from harness.config.spec import build_spec
from harness.core.comm import env_rank_info
from harness.core.errors import ConfigError
from harness.report import record as record_mod
from harness.report.environment import environment
from harness.report.traces import write_trace
from harness.report.wandb_run import LiveRun
from harness.run import launch, preemption


def known_fields(cfg: DictConfig) -> dict:
    """What a refused run's record can still say about it (interpolations may be broken)."""
    get = lambda key: OmegaConf.select(cfg, key, default=None, throw_on_missing=False)  # noqa: E731
    return {
        "strategy": get("strategy.name"),
        "model": get("model.name"),
        "data": get("data.name"),
        "world_size": get("world_size"),
        "global_batch": get("train.global_batch"),
        "micro_batches": get("train.micro_batches"),
    }


def summary_line(rec: dict, output_dir: str) -> str:
    head = f"{rec.get('strategy')} w={rec.get('world_size')} {rec.get('model')}/{rec.get('data')}"
    if rec.get("status") != "ok":
        return f"FAILED {head}: {rec.get('error')}  [{output_dir}]"
    mem = rec.get("peak_memory_bytes")
    mem_s = f"{mem / 2**20:.1f} MiB" if mem else "n/a"
    speed = (
        f"{rec['throughput']:.1f} samples/s (step {rec['step_time_s'] * 1e3:.1f} ms)"
        if rec.get("throughput")
        else "no timed step"
    )
    loss = rec.get("final_loss")
    loss_s = (
        f"diverged at step {rec['diverged_at_step']}"
        if rec.get("diverged_at_step") is not None
        else f"loss {loss:.3f}"
        if loss is not None
        else "no loss"
    )
    top1 = f"{rec['accuracy'] * 100:.1f}%" if rec.get("accuracy") is not None else "n/a"
    return f"ok {head}: {speed}, peak {mem_s}/rank, top-1 {top1}, {loss_s}  [{output_dir}]"


def _run_preemptible(spec, output_dir: str) -> dict:
    """Run ``spec``; where it can be preempted (a submitit job, or ``launch.preemptible=true``), a
    preemption or time-limit signal stops it after a checkpoint and the job is handed back to the
    scheduler to be requeued, and a job that starts where such a run stopped resumes from there
    (harness.run.preemption)."""
    preemptible = spec.launch.preemptible
    spec.preemptible = preemption.under_scheduler() if preemptible is None else preemptible
    if not spec.preemptible:
        return launch.run(spec, output_dir)
    resume_dir, stops = preemption.resume_point(output_dir)
    if resume_dir and not spec.train.resume:
        spec.train.resume, spec.resumed = resume_dir, stops
        print(f"resuming {output_dir} from its checkpoint (stopped {stops} time(s) before)", flush=True)
    with preemption.Watch(output_dir) as watch:
        rec = launch.run(spec, output_dir)
        stopped = rec.get("stopped_at_step")
        if stopped is None:
            return rec
        count = watch.record_stop(stopped)
        rec.update(
            status="failed",
            error=f"stopped by {watch.signum.name} after step {stopped} with a checkpoint "
            f"(stop {count}); a requeued job resumes it, or train.resume={output_dir}",
        )
        record_mod.write(output_dir, rec)
        print("\n" + summary_line(rec, output_dir), file=sys.stderr, flush=True)
        watch.hand_over()  # submitit requeues the job and ends this process
        return rec


def task(cfg: DictConfig) -> None:
    """One job (a single run, or one point of a sweep)."""
    hc = HydraConfig.get()
    output_dir = hc.runtime.output_dir
    multirun = hc.mode == RunMode.MULTIRUN
    try:
        spec = build_spec(cfg)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        record_mod.write(output_dir, record_mod.failed_record(known_fields(cfg), f"invalid config: {e}"))
        if multirun:
            return  # the other jobs of the sweep go on; the table shows this one as failed
        raise SystemExit(2) from None

    spec.output_dir = output_dir
    if multirun:  # every run of the sweep cuts the model where its first pipeline measured the cut
        spec.partition_dir = os.path.join(hc.sweep.dir, "partitions")
    joined = env_rank_info()
    live = None
    if joined is None or joined[0] == 0:  # one wandb run per job, on rank 0's process
        group = spec.logger.group or (sweep_group(hc.sweep.dir) if multirun else None)
        live = LiveRun(
            output_dir,
            spec.logger.mode,
            spec.logger.project,
            spec.logger.entity,
            group,
            "train",
            {**OmegaConf.to_container(cfg, resolve=True), "variant": spec.variant(), "environment": environment()},
            spec.summary(),
        ).follow()
    try:
        rec = _run_preemptible(spec, output_dir)
    except launch.Interrupted as e:
        if live is not None:
            live.finish(_written(output_dir), 128 + e.signum)
        raise
    if rec.get("status") == "running":  # a non-zero rank under torchrun/Slurm: rank 0 reports
        return
    write_trace(rec, output_dir)  # the run's step for Perfetto, beside its record
    live.finish(rec, 0 if rec["status"] == "ok" else 1)
    if rec["status"] == "ok":
        print(summary_line(rec, output_dir), flush=True)
    else:  # on a line of its own: a failed worker's progress bar may end without one
        print("\n" + summary_line(rec, output_dir), file=sys.stderr, flush=True)
    if rec["status"] != "ok" and not multirun:
        raise SystemExit(1)


def _written(output_dir: str) -> dict:
    try:
        return record_mod.read(os.path.join(output_dir, "metrics.json"))
    except Exception:  # the wandb run ends with its exit code all the same
        return {}
