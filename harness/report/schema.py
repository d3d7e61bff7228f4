"""The record's schema: one definition, versioned, checked when a record is written and read.

``schema_version`` changes whenever a field changes meaning or goes away; fields may be
added without a new version (readers ignore what they do not know). A file that is
not a record of this version (an older record, another tool's ``metrics.json``) is
refused with one line saying why, and the results command skips it.
"""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from harness.core.vocabulary import IDLE_PARTS

SCHEMA_VERSION = 1


class RunRecord(BaseModel):
    """The fields every record has (measured runs, refused runs and simulated predictions);
    the rest (curves, per-rank details, the config) is free-form."""

    model_config = ConfigDict(extra="allow", protected_namespaces=())

    schema_version: Literal[SCHEMA_VERSION]
    status: Literal["ok", "failed"]
    error: Optional[str]
    strategy: Optional[str]
    model: Optional[str]
    data: Optional[str]
    world_size: Optional[int]
    global_batch: Optional[int]
    micro_batches: Optional[int]
    device: Optional[str]
    throughput: Optional[float] = Field(ge=0)
    step_time_s: Optional[float] = Field(ge=0)
    peak_memory_bytes: Optional[float] = Field(ge=0)
    peak_memory_per_rank: Optional[list[Optional[float]]]
    accuracy: Optional[float] = Field(ge=0, le=1)
    final_loss: Optional[float]
    diverged_at_step: Optional[int] = Field(default=None, ge=0)  # the first step whose loss is not finite
    environment: Optional[dict] = None  # harness.report.environment (None only for a record made elsewhere)
    precision: Optional[Literal["fp32", "bf16"]] = None
    flops_per_step: Optional[float] = Field(default=None, ge=0)
    tflops_per_device: Optional[float] = Field(default=None, ge=0)
    mfu: Optional[float] = Field(default=None, ge=0)
    hfu: Optional[float] = Field(default=None, ge=0)
    # harness.metrics.idle: the mean fraction of the step per part (the idle columns read it)
    idle_breakdown: Optional[dict[Literal[IDLE_PARTS], float]] = None


class RecordError(ValueError):
    """A file that is not a record of this schema version; the message is one line."""


def validate(record: dict, source: str = "record") -> dict:
    """``record`` if it is a valid record of this version, else RecordError naming ``source``."""
    if not isinstance(record, dict):
        raise RecordError(f"{source}: not a record (a JSON {type(record).__name__}, not an object)")
    version = record.get("schema_version")
    if version != SCHEMA_VERSION:
        what = (
            "no schema_version (an older record or another tool's file)"
            if version is None
            else f"schema_version {version!r}, this harness reads {SCHEMA_VERSION}"
        )
        raise RecordError(f"{source}: {what}")
    try:
        RunRecord.model_validate(record)
    except ValidationError as e:
        first = e.errors()[0]
        raise RecordError(
            f"{source}: field '{'.'.join(map(str, first['loc']))}' {first['msg'].lower()} "
            f"({e.error_count()} problem(s))"
        ) from None
    return record
