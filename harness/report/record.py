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
import re
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
            "model": vars(spec.model),
            "data": vars(spec.data),
            "strategy": vars(spec.strategy),
            "train": vars(spec.train),
            "launch": vars(spec.launch),
        },
        "environment": environment(),
    }


def failed_record(fields: dict, error: str) -> dict:
    """A record for a run refused before it started (fields: whatever is known of it)."""
    base = {
        k: None
        for k in (
            "strategy",
            "model",
            "data",
            "world_size",
            "global_batch",
            "micro_batches",
            "device",
            "throughput",
            "step_time_s",
            "peak_memory_bytes",
            "peak_memory_per_rank",
            "accuracy",
            "final_loss",
        )
    }
    return {
        "schema_version": SCHEMA_VERSION,
        **base,
        **fields,
        "status": "failed",
        "error": error,
        "environment": environment(),
    }


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


def diverged_at(loss_curve) -> int | None:
    """The first step whose training loss is not finite ([step, loss] pairs), None if none is."""
    return next((step for step, loss in loss_curve or [] if loss is None or not math.isfinite(loss)), None)


# settings that never change what a run measures: where data lives, how it is launched or resumed
_NOT_SWEPT = ("data.root", "data.download", "data.verify_md5", "train.resume", "launch.")
# what the tables and figures already show of a run (its columns and caption)
_SHOWN = ("strategy", "variant", "world_size", "model", "data", "global_batch", "micro_batches", "device", "precision")


def _leaves(node, prefix: str = "") -> dict:
    if isinstance(node, dict):
        return {k: v for key, child in node.items() for k, v in _leaves(child, f"{prefix}{key}.").items()}
    return {prefix.rstrip("."): json.dumps(node) if isinstance(node, (list, dict)) else node}


def settings(record: dict) -> dict:
    """The record's config as ``{"train.lr": 0.3, ...}``, less what does not change what it measures."""
    return {k: v for k, v in _leaves(record.get("config") or {}).items() if not k.startswith(_NOT_SWEPT)}


def shown(value):
    """A setting's value as tables and figures name it: a file or folder by its last part
    (``model.pretrained=/home/me/runs/pretrain`` is ``pretrain``), anything else as it is."""
    if isinstance(value, str) and os.path.isabs(value):
        return os.path.basename(value.rstrip(os.sep)) or value
    return value


def mark_swept(records: list[dict]) -> list[dict]:
    """Set each record's ``swept``: the settings (``lr=0.3``) that tell it apart from records a
    table or figure would otherwise show as the same configuration (a sweep over ``train.lr``
    of one strategy), '' where nothing does, and ``swept_settings`` ({"lr": 0.3}). Idempotent;
    returns ``records``."""
    groups: dict[tuple, list[tuple[dict, dict]]] = {}
    for r in records:
        r["swept"], r["swept_settings"] = "", {}
        if not r.get("config"):  # refused before it started, or unreadable: nothing to compare
            continue
        groups.setdefault(tuple(str(r.get(k)) for k in _SHOWN), []).append((r, settings(r)))
    for members in groups.values():
        keys = sorted({k for _, leaves in members for k in leaves})
        varying = [k for k in keys if len({json.dumps(leaves.get(k), default=str) for _, leaves in members}) > 1]
        names = {k: k.rsplit(".", 1)[-1] for k in varying}
        if len(set(names.values())) < len(names):  # two settings of one name: give their paths
            names = {k: k for k in varying}
        for r, leaves in members:
            r["swept_settings"] = {names[k]: shown(leaves.get(k)) for k in varying}
            r["swept"] = ", ".join(f"{name}={value}" for name, value in r["swept_settings"].items())
    return records


def variant_text(record: dict) -> str:
    """The options and swept settings that tell a strategy's runs apart, '' for none."""
    return "; ".join(p for p in (record.get("variant"), record.get("swept")) if isinstance(p, str) and p)


def config_name(record: dict) -> str:
    """``hippie (recompute=auto)``, ``dp (lr=0.3)``: the strategy with what tells its runs apart."""
    variant = variant_text(record)
    return f"{record.get('strategy')} ({variant})" if variant else str(record.get("strategy"))


def natural_key(text: str) -> list:
    """A sort key that orders the numbers in ``text`` by value: 'lr=2' before 'lr=10'."""
    return [
        (0, float(part), "") if i % 2 else (1, 0.0, part)
        for i, part in enumerate(re.split(r"(-?\d+(?:\.\d+)?(?:e-?\d+)?)", text))
    ]
