"""List every job a sweep would launch, validated and predicted, without starting any.

Takes the same overrides as ``pipebench run`` (with or without -m; no overrides means the
main job), expands the sweep the way the sweeper will (same jobs, same order), validates
each job's spec and prints one line per job: strategy and variant, world size and nodes,
the layout (replicas and boundaries; AshPipe's plan), the predicted step time and
throughput where a profile of the model on that device exists
(``profiles/<model>-<device>.json``, replayed by the simulator on the job's ``cluster``),
and the refusal, with its reason, of a job that would not start.

Example:
  pipebench preview -m strategy=dp,hippie,ashpipe world_size=2,4
"""

from __future__ import annotations

import sys

import pandas as pd
from hydra import compose

from harness.cli.hydra_app import SWEEP_FLAGS, composing, overrides_of, refuse_bad_overrides, sweep_jobs
from harness.config.spec import build_spec
from harness.core.errors import ConfigError
from harness.planning.forecast import forecast

OVERRIDES = True
MAIN_JOB = "experiment=ci"


def describe(job: list[str], shown: list[str]) -> dict:
    """One job's line of the preview (its spec validated, nothing started); ``shown``: its overrides
    as the preview names the job."""
    launcher = compose(config_name="config", overrides=job, return_hydra_config=True).hydra.launcher
    cfg = compose(config_name="config", overrides=job)
    row = {"job": " ".join(shown), "strategy": cfg.strategy.name, "workers": cfg.world_size,
           "nodes": launcher.get("nodes", 1)}
    try:
        spec = build_spec(cfg)
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
    return {**row, "layout": f"replicas {pred.replicas}, boundaries {pred.boundaries}",
            "predicted step ms": round(pred.iteration_s * 1e3, 2), "predicted samples/s": round(pred.throughput, 1),
            "status": f"ok (predicted on {made.cluster.name} from {made.source})"}


def main(args: list[str]) -> int:
    args = [a for a in args if a not in SWEEP_FLAGS] or [MAIN_JOB]
    refuse_bad_overrides(args)
    with composing():
        jobs = sweep_jobs(overrides_of(args))
        repeats = any(o.startswith("repeat=") and o != "repeat=0" for job in jobs for o in job)
        rows = [describe(job, job if repeats else [o for o in job if o != "repeat=0"]) for job in jobs]
    table = pd.DataFrame(rows)
    print(table.astype(object).where(table.notna(), None).to_markdown(index=False, missingval="–"))
    refused = sum(str(r["status"]).startswith("refused") for r in rows)
    print(f"\n{len(rows)} job(s), {refused} refused; nothing was started", file=sys.stderr)
    return 0
