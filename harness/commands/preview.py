"""List every job a sweep would launch, validated and predicted, without starting any.

Takes the same overrides as ``pipebench run`` (with or without -m; no overrides means the
main job), expands the sweep the way the sweeper will (same jobs, same order), validates
each job's spec and prints one line per job: strategy and variant, world size (and for Slurm
the nodes and tasks per node it will get), the layout (replicas and boundaries; AshPipe's
plan), the predicted step time, throughput, run time and peak memory per device where a
profile of the model on that device exists (``profiles/<model>-<device>.json``, replayed by the
simulator on the job's ``cluster``), and the refusal, with its reason, of a job that would not
start. With ``hydra/launcher=slurm`` it is the pre-flight check on a login node: jobs are judged
as they will run on the compute nodes (their GPUs need not be on this machine), a world size
that does not fill whole nodes is refused, and a run predicted to outlast the launcher's
``timeout_min`` or the cluster's memory is flagged.

Example:
  pipebench preview -m strategy=dp,hippie,ashpipe world_size=2,4
"""

from __future__ import annotations

import sys

import pandas as pd
from hydra import compose

from harness.cli.hydra_app import SWEEP_FLAGS, composing, overrides_of, refuse_bad_overrides, sweep_jobs
from harness.cli.launcher import placement, slurm_launcher
from harness.config.spec import build_spec
from harness.core.errors import ConfigError
from harness.planning.forecast import forecast

OVERRIDES = True
MAIN_JOB = "experiment=ci"


def describe(job: list[str], shown: list[str]) -> dict:
    """One job's line of the preview (its spec validated, nothing started); ``shown``: its overrides
    as the preview names the job. A job for Slurm is judged as it will run on the compute nodes:
    their GPUs, not this (login) node's; its nodes and tasks from its world size."""
    hydra_cfg = compose(config_name="config", overrides=job, return_hydra_config=True)
    launcher = hydra_cfg.hydra.launcher
    remote = slurm_launcher(hydra_cfg)
    cfg = compose(config_name="config", overrides=job)
    row = {"job": " ".join(shown), "strategy": cfg.strategy.name, "workers": cfg.world_size}
    try:
        if remote:
            nodes, tasks = placement(int(cfg.world_size), int(launcher.get("tasks_per_node") or 1))
            row.update(nodes=nodes, **{"tasks/node": tasks})
        spec = build_spec(cfg, launching=not remote)
        if remote and spec.strategy_cls.processes(spec) != spec.world_size:
            raise ConfigError(
                f"strategy={spec.strategy.name} runs {spec.strategy_cls.processes(spec)} process(es) "
                f"for {spec.world_size} devices, but the Slurm preset starts one task per device: run it "
                "in a job of its own (one task with all of a node's GPUs)"
            )
    except ConfigError as e:
        return {**row, "status": f"refused: {e}"}
    row["strategy"] = spec.strategy.name + (f" ({spec.variant()})" if spec.variant() else "")
    try:
        made = forecast(spec, shipped=True, measure=False)
    except ConfigError as e:
        return {**row, "status": f"ok (no prediction: {e})"}
    if made is None:
        return {**row, "layout": "boundaries measured at start", "status": "ok (no profile: no prediction)"}
    pred = made.prediction
    run_min = pred.iteration_s * spec.steps / 60
    peak_gib = max(pred.peak_memory_per_stage) / 2**30
    row.update(
        {
            "layout": f"replicas {pred.replicas}, boundaries {pred.boundaries}",
            "predicted step ms": round(pred.iteration_s * 1e3, 2),
            "predicted samples/s": round(pred.throughput, 1),
            "predicted run min": round(run_min, 2),
            f"peak GiB/device (of {made.cluster.memory_gib:g})": round(peak_gib, 2),
        }
    )
    notes = []
    if made.cluster.memory_gib and peak_gib > made.cluster.memory_gib:
        notes.append("predicted out of memory")
    if remote and launcher.get("timeout_min") and run_min > launcher.timeout_min:
        notes.append(f"longer than hydra.launcher.timeout_min={launcher.timeout_min}: it will be requeued")
    return {
        **row,
        "status": f"ok (predicted on {made.cluster.name} from {made.source}" + "".join(f"; {n}" for n in notes) + ")",
    }


def main(args: list[str]) -> int:
    args = [a for a in args if a not in SWEEP_FLAGS] or [MAIN_JOB]
    refuse_bad_overrides(args, placed=False)  # a job Slurm cannot place is refused on its own line
    with composing():
        jobs = sweep_jobs(overrides_of(args))
        repeats = any(o.startswith("repeat=") and o != "repeat=0" for job in jobs for o in job)
        rows = [describe(job, job if repeats else [o for o in job if o != "repeat=0"]) for job in jobs]
    table = pd.DataFrame(rows)
    print(table.astype(object).where(table.notna(), None).to_markdown(index=False, missingval="–"))
    refused = sum(str(r["status"]).startswith("refused") for r in rows)
    print(f"\n{len(rows)} job(s), {refused} refused; nothing was started", file=sys.stderr)
    return 0
