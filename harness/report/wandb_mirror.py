"""Mirror a run's record to wandb: curves as history, the record as the summary.

wandb is a mirror, never the source of truth: any failure here (no network,
no login, a broken offline directory) is reported as a warning and the local
record stands. Nothing secret is put into the run: only the record, whose
fields come from the config and the measurements.
"""

from __future__ import annotations

import os
import sys

_SCALARS = (int, float, str, bool, type(None))


def _init(mode: str, **kwargs):
    import wandb  # lazy: a disabled logger never pays for importing it

    os.environ.setdefault("WANDB_SILENT", "true")
    return wandb, wandb.init(mode=mode, reinit="finish_previous", **kwargs)


def _warn(what: str, e: Exception, keeps: str) -> None:
    first_line = str(e).strip().splitlines()[0] if str(e).strip() else ""
    print(f"warning: {what} failed ({type(e).__name__}: {first_line}); {keeps} is unaffected", file=sys.stderr,
          flush=True)


def run_config(record: dict) -> dict:
    """The wandb config of a run: what was run (the record's config: model, data, strategy, train
    and launch settings, each with its name) and the keys a wandb user filters and groups by."""
    config = dict(record.get("config") or {})
    keys = ("strategy", "variant", "model", "data", "world_size", "global_batch", "micro_batches", "seed", "repeat",
            "device", "precision", "tag", "cluster")
    # a name the nested config already holds (strategy.name, model.name) is not flattened over it
    return {**config, **{k: record[k] for k in keys if k in record and k not in config}}


def mirror(record: dict, output_dir: str, mode: str, project: str, entity: str | None, group: str | None,
           job_type: str = "train") -> str | None:
    """Log ``record`` as one wandb run of role ``job_type`` (``train`` for a measured run,
    ``simulate`` for a prediction); returns the run's local directory, or None."""
    if mode == "disabled":
        return None
    try:
        _, run = _init(mode, project=project, entity=entity, group=group, job_type=job_type,
                       name=os.path.basename(os.path.normpath(output_dir)), dir=output_dir,
                       tags=[t for t in (record.get("strategy"), record.get("tag")) if t], config=run_config(record))
        try:
            for step, loss in record.get("loss_curve") or []:
                run.log({"train/loss": loss}, step=step)
            for point in record.get("accuracy_curve") or []:
                run.log({"test/accuracy": point["accuracy"], "test/loss": point["loss"]}, step=point["step"])
            run.summary.update({k: v for k, v in record.items() if isinstance(v, _SCALARS)})
            run.summary["peak_memory_per_rank"] = record.get("peak_memory_per_rank")
            # the whole record travels with the run, so `python -m harness.results` can read a wandb folder
            run.save(os.path.join(output_dir, "metrics.json"), base_path=output_dir, policy="now")
            return run.dir
        finally:
            run.finish(exit_code=0 if record.get("status") == "ok" else 1)
    except Exception as e:  # the local record must survive any wandb problem
        _warn("wandb mirror", e, f"the local record {os.path.join(output_dir, 'metrics.json')}")
        return None


def log_comparison(table, sweep_dir: str, outputs: list[str], mode: str, project: str, entity: str | None,
                   group: str | None) -> None:
    """A sweep's comparison as a run of its own (role ``comparison``): the table as a wandb Table
    (numeric columns stay numeric) and the sweep's tables, figures and machine description as
    one artifact of type ``results``."""
    if mode == "disabled":
        return
    name = f"comparison-{group or os.path.basename(os.path.normpath(sweep_dir))}"
    try:
        wandb, run = _init(mode, project=project, entity=entity, group=group, job_type="comparison", name=name,
                           dir=sweep_dir)
        try:
            run.log({"comparison": wandb.Table(dataframe=table)})
            artifact = wandb.Artifact(f"results-{group or 'sweep'}", type="results",
                                      description=f"tables, figures and machine description of {sweep_dir}")
            for path in outputs:
                (artifact.add_dir if os.path.isdir(path) else artifact.add_file)(path)
            run.log_artifact(artifact)
        finally:
            run.finish()
    except Exception as e:  # a mirror only; the local tables stand
        _warn("logging the comparison to wandb", e, f"the tables in {sweep_dir}")
