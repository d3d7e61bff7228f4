"""A record's figures checked against what they cannot be, before the record is written; and
where a set of records came from (:func:`provenance`).

:func:`impossible` names every figure of a record that no measurement can produce: a memory part
below zero, parts that do not add up to their rank's peak, a fraction of a step outside 0-1, a
throughput that is not the global batch over the step time. The worker writes what it finds into
the record's ``figure_errors`` (an empty list: checked and sound), never a silently wrong figure;
the tables leave such a run out of every "best" and footnote it, and ``pipebench results
--check`` fails on it.
"""

from __future__ import annotations

import glob
import json
import math
import os

from harness.core.vocabulary import MEMORY_PARTS

_MIB = 2**20
_FRACTIONS = ("bubble_measured", "bubble_analytic", "bubble_replayed", "mfu", "hfu", "accuracy")


def _fraction_errors(name: str, value) -> list[str]:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return []
    return [] if 0.0 <= value <= 1.0 + 1e-9 else [f"{name} is {value:.4g}, outside 0-1"]


def impossible(record: dict) -> list[str]:
    """One line per impossible figure of ``record`` (none: an empty list)."""
    errors: list[str] = []
    peaks = record.get("peak_memory_per_rank") or []
    for i, rank in enumerate(record.get("per_rank") or []):
        parts = rank.get("memory_breakdown")
        if not parts:
            continue
        below = {k: v for k, v in parts.items() if isinstance(v, (int, float)) and v < 0}
        errors += [
            f"rank {rank.get('rank', i)}'s memory {k} is {v / _MIB:.2f} MiB, below zero" for k, v in below.items()
        ]
        peak = peaks[i] if i < len(peaks) else None
        total = sum(parts.get(k) or 0 for k in MEMORY_PARTS)
        if peak is not None and abs(total - peak) > 1:
            errors.append(
                f"rank {rank.get('rank', i)}'s memory parts add up to {total / _MIB:.2f} MiB, "
                f"not its peak of {peak / _MIB:.2f} MiB"
            )
    for name in _FRACTIONS:
        errors += _fraction_errors(name, record.get(name))
    for i, fraction in enumerate(record.get("bubble_per_rank") or []):
        errors += _fraction_errors(f"bubble_per_rank[{i}]", fraction)
    for part, fraction in (record.get("idle_breakdown") or {}).items():
        errors += _fraction_errors(f"idle_breakdown.{part}", fraction)
    throughput, step, batch = record.get("throughput"), record.get("step_time_s"), record.get("global_batch")
    if throughput and step and batch and not math.isclose(throughput * step, batch, rel_tol=1e-6):
        errors.append(f"throughput {throughput:.6g}/s is not the global batch {batch} over the step time {step:.6g} s")
    return errors


def provenance(records: list[dict]) -> list[str]:
    """A line for runs that came from an uncommitted tree or from several commits: a study whose
    code cannot be named (its records' ``environment``)."""
    envs = [r["environment"] for r in records if r.get("environment")]
    commits = sorted({str(e["git_commit"])[:10] for e in envs if e.get("git_commit")})
    dirty = sum(1 for e in envs if e.get("git_dirty"))
    lines = []
    if dirty:
        lines.append(f"{dirty} of {len(envs)} run(s) came from a tree with uncommitted changes")
    if len(commits) > 1:
        lines.append(f"the runs came from {len(commits)} commits ({', '.join(commits)}), not one")
    return lines


def studies(root: str) -> list[str]:
    """The studies under ``root`` (a checkout's ``results/``): every folder directly below it, and
    in place of a folder that holds several tables, each of its sub-folders with a ``results.md``
    (``papers_regime/roofline``)."""
    found = []
    for top in sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d))):
        tables = sorted(os.path.dirname(p) for p in glob.glob(os.path.join(root, top, "*", "results.md")))
        found += [os.path.relpath(t, root) for t in tables] or [top]
    return found


def environments(folder: str) -> list[tuple[dict, str]]:
    """(environment, start time) of every run record below ``folder``, read without validation
    (a summary of where the runs came from; ``pipebench results`` reads them whole)."""
    out = []
    for path in sorted(glob.glob(os.path.join(folder, "**", "metrics.json"), recursive=True)):
        if f"{os.sep}wandb{os.sep}" in path:  # a run's wandb mirror of its record
            continue
        try:
            with open(path) as f:
                record = json.load(f)
        except (OSError, ValueError):
            continue
        out.append((record.get("environment") or {}, record.get("started_at") or ""))
    return out
