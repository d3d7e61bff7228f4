"""A job's wandb run, live: started with the job, fed as training goes, ended with its outcome.

- The run starts before the workers launch (:class:`LiveRun`), with the resolved configuration
  and the machine's description, so a run that never gets to train is there too; its system
  metrics are those of the job's process tree (the launcher and its workers).
- Rank 0 appends a row to ``steps.jsonl`` in the run's folder every ``logger.log_every`` steps
  (loss, learning rate, samples/s, step time, memory) and one per evaluation
  (:mod:`harness.run.progress`); a thread here logs each row as it lands, with its ``step``.
- At the end the summary gets the record's outputs (never its inputs, which are the config),
  the record itself is saved with the run (so ``pipebench results`` reads a wandb folder), and
  the run finishes with the job's exit code: 0, 1 for a failed run, 128 + the signal for an
  interrupted one. A job killed outright leaves a run that never finished, with its logged
  steps, which wandb shows as crashed.

Project, entity and mode come from ``logger.*`` where set, else from ``WANDB_PROJECT``,
``WANDB_ENTITY`` and ``WANDB_MODE``, else ``pipebench``, the account's default and offline.
wandb is never the source of truth: any failure here is one warning line, and the local record
stands.
"""

from __future__ import annotations

import json
import os
import sys
import threading

_SCALARS = (int, float, str, bool, type(None))
STEPS_FILE = "steps.jsonl"
# the record's inputs: in the run's config, not its summary
_INPUTS = {
    "schema_version",
    "started_at",
    "strategy",
    "model",
    "data",
    "world_size",
    "global_batch",
    "micro_batches",
    "steps",
    "seed",
    "repeat",
    "device",
    "precision",
    "augment",
    "tag",
    "block",
    "variant",
    "ignored_strategy_keys",
    "config",
    "environment",
    "target_accuracy",
    "cluster",
    "simulated",
    "threads_per_worker",
    "workers_on_host",
    "host_cores",
    "training_started_at",
    "replicas",
    "boundaries",
    "partition_source",
    "memory_method",
    "peak_source",
    "resumed",
    "resumed_from_step",
}


def settings(mode: str | None, project: str | None, entity: str | None) -> tuple[str, str, str | None]:
    """(mode, project, entity): the config's where set, else wandb's environment variables, else
    offline, ``pipebench`` and the account's default."""
    return (
        mode or os.environ.get("WANDB_MODE") or "offline",
        project or os.environ.get("WANDB_PROJECT") or "pipebench",
        entity or os.environ.get("WANDB_ENTITY") or None,
    )


def _warn(what: str, e: Exception, keeps: str) -> None:
    first_line = str(e).strip().splitlines()[0] if str(e).strip() else ""
    print(
        f"warning: {what} failed ({type(e).__name__}: {first_line}); {keeps} is unaffected", file=sys.stderr, flush=True
    )


def tags(info: dict) -> list[str]:
    """What a wandb user filters by: strategy, variant, block, model, ``w<workers>``, the sweep's tag."""
    found = [
        info.get("strategy"),
        info.get("variant"),
        info.get("block"),
        info.get("model"),
        f"w{info['world_size']}" if info.get("world_size") else None,
        info.get("tag"),
    ]
    return [str(t)[:64] for t in dict.fromkeys(found) if t]  # wandb's limit on a tag's length


def outputs(record: dict) -> dict:
    """The record's measured figures (scalars and the per-rank peaks): the run's summary."""
    out = {k: v for k, v in record.items() if k not in _INPUTS and isinstance(v, _SCALARS)}
    if record.get("peak_memory_per_rank"):
        out["peak_memory_per_rank"] = record["peak_memory_per_rank"]
    for part, value in (record.get("idle_breakdown") or {}).items():
        out[f"idle/{part}"] = value
    return out


def _init(mode: str, **kwargs):
    import wandb  # lazy: a disabled logger never pays for importing it

    os.environ.setdefault("WANDB_SILENT", "true")
    return wandb, wandb.init(mode=mode, reinit="finish_previous", **kwargs)


class LiveRun:
    """One job's wandb run (see the module docstring); every method is a no-op once wandb failed
    or where the mode is ``disabled``."""

    def __init__(
        self,
        output_dir: str,
        mode: str | None,
        project: str | None,
        entity: str | None,
        group: str | None,
        job_type: str,
        config: dict,
        info: dict,
    ):
        self.output_dir, self.run, self._stop = output_dir, None, threading.Event()
        self._thread: threading.Thread | None = None
        self.mode, self.project, self.entity = settings(mode, project, entity)
        if self.mode == "disabled":
            return
        try:
            import wandb

            _, self.run = _init(
                self.mode,
                project=self.project,
                entity=self.entity,
                group=group,
                job_type=job_type,
                name=os.path.basename(os.path.normpath(output_dir)),
                dir=output_dir,
                tags=tags(info),
                config=config,
                # system metrics of this process and its workers; the transaction log flushed every
                # 2 s, so that a job killed outright keeps what it logged
                settings=wandb.Settings(
                    x_stats_pid=os.getpid(),
                    x_stats_track_process_tree=True,
                    x_stats_sampling_interval=5.0,
                    x_transaction_log_flush_interval=2.0,
                ),
            )
        except Exception as e:
            _warn("starting the wandb run", e, f"the local record in {output_dir}")
            self.run = None

    def follow(self) -> "LiveRun":
        """Log ``steps.jsonl``'s rows as rank 0 writes them, until :meth:`finish`."""
        if self.run is not None:
            self._thread = threading.Thread(target=self._tail, name="wandb-steps", daemon=True)
            self._thread.start()
        return self

    def _tail(self) -> None:
        path, offset = os.path.join(self.output_dir, STEPS_FILE), 0
        while True:
            stopping = self._stop.wait(1.0)
            try:
                with open(path) as f:
                    f.seek(offset)
                    for line in f:
                        if not line.endswith("\n"):
                            break  # a row still being written: read it next time
                        offset += len(line.encode())
                        row = json.loads(line)
                        self.run.log({k: v for k, v in row.items() if k != "step"}, step=int(row["step"]))
            except FileNotFoundError:
                pass
            except Exception as e:
                _warn("logging steps to wandb", e, "the run's steps.jsonl")
                return
            if stopping:
                return

    def finish(self, record: dict, exit_code: int) -> str | None:
        """The last rows, the record's outputs as the summary, the record saved with the run, and
        the end with ``exit_code``; returns the run's folder."""
        if self.run is None:
            return None
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        try:
            self.run.summary.update(outputs(record))
            metrics = os.path.join(self.output_dir, "metrics.json")
            if os.path.exists(metrics):
                self.run.save(metrics, base_path=self.output_dir, policy="now")
            return self.run.dir
        except Exception as e:
            _warn("the wandb summary", e, f"the local record {os.path.join(self.output_dir, 'metrics.json')}")
            return None
        finally:
            try:
                self.run.finish(exit_code=exit_code)
            except Exception as e:
                _warn("finishing the wandb run", e, "the local record")


def log_comparison(
    table,
    sweep_dir: str,
    files: list[str],
    mode: str | None,
    project: str | None,
    entity: str | None,
    group: str | None,
) -> None:
    """A sweep's comparison as a run of its own (role ``comparison``): the table as a wandb Table
    (numeric columns stay numeric) and the sweep's tables, figures and machine description as
    one artifact of type ``results``."""
    mode, project, entity = settings(mode, project, entity)
    if mode == "disabled":
        return
    name = f"comparison-{group or os.path.basename(os.path.normpath(sweep_dir))}"
    try:
        wandb, run = _init(
            mode, project=project, entity=entity, group=group, job_type="comparison", name=name, dir=sweep_dir
        )
        try:
            run.log({"comparison": wandb.Table(dataframe=table)})
            artifact = wandb.Artifact(
                f"results-{group or 'sweep'}",
                type="results",
                description=f"tables, figures and machine description of {sweep_dir}",
            )
            for path in files:
                (artifact.add_dir if os.path.isdir(path) else artifact.add_file)(path)
            run.log_artifact(artifact)
        finally:
            run.finish()
    except Exception as e:  # a mirror only; the local tables stand
        _warn("logging the comparison to wandb", e, f"the tables in {sweep_dir}")
