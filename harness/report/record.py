"""One record per run: metrics.json in the run's output directory.

The local file is the source of truth; wandb is a mirror of it (see
harness.report.wandb_run). Writes are atomic (temporary file, fsync, rename), so a
crash never leaves half a record.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import tempfile

from harness.report.environment import environment
from harness.report.schema import SCHEMA_VERSION, validate

RECORD_FILE = "metrics.json"


def new_record(spec) -> dict:
    """The record of a run about to start; ``spec`` is its validated RunSpec (harness.config.spec)."""
    return {
        "schema_version": SCHEMA_VERSION,
        "status": "running",
        "error": None,
        "started_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        **spec.summary(),
        "throughput": None,
        "step_time_s": None,
        "peak_memory_bytes": None,
        "peak_memory_per_rank": None,
        "accuracy": None,
        "final_loss": None,
        "config": {
            "model": vars(spec.model), "data": vars(spec.data), "strategy": vars(spec.strategy),
            "train": vars(spec.train), "launch": vars(spec.launch),
        },
        "environment": environment(),
    }


def failed_record(fields: dict, error: str) -> dict:
    """A record for a run refused before it started (fields: whatever is known of it)."""
    base = {k: None for k in ("strategy", "model", "data", "world_size", "global_batch", "micro_batches", "device",
                              "throughput", "step_time_s", "peak_memory_bytes", "peak_memory_per_rank",
                              "accuracy", "final_loss")}
    return {"schema_version": SCHEMA_VERSION, **base, **fields, "status": "failed", "error": error,
            "environment": environment()}


def _clean(obj):
    """JSON has no NaN or infinity: store them as null."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    return obj


def write(output_dir: str, record: dict) -> str:
    """Validate ``record`` against the schema and write it atomically; returns its path."""
    record = validate(_clean(record), "the record to write")
    os.makedirs(output_dir, exist_ok=True)
    path = os.path.join(output_dir, RECORD_FILE)
    fd, tmp = tempfile.mkstemp(prefix=".metrics.", dir=output_dir)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(record, f, indent=1, default=str)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    return path


def read(path: str) -> dict:
    """The record at ``path``; RecordError (one line) if it is not a record of this schema version,
    ValueError or OSError if it cannot be read at all."""
    with open(path) as f:
        return validate(json.load(f), path)
