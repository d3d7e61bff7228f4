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


def mirror(record: dict, output_dir: str, mode: str, project: str, entity: str | None, group: str | None) -> str | None:
    """Log ``record`` as one wandb run; returns the run's local directory, or None."""
    if mode == "disabled":
        return None
    try:
        import wandb  # lazy: a disabled logger never pays for importing it

        os.environ.setdefault("WANDB_SILENT", "true")
        run = wandb.init(
            project=project, entity=entity, group=group, job_type=record.get("strategy"),
            name=os.path.basename(os.path.normpath(output_dir)), dir=output_dir, mode=mode,
            config=record.get("config", {}), reinit="finish_previous",
        )
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
        first_line = str(e).strip().splitlines()[0] if str(e).strip() else ""
        print(f"warning: wandb mirror failed ({type(e).__name__}: {first_line}); the local record "
              f"{os.path.join(output_dir, 'metrics.json')} is unaffected", file=sys.stderr, flush=True)
        return None
