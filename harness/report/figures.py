"""Paper figures from run records (matplotlib, written as PNG and PDF).

- throughput against world size, one line per strategy;
- peak memory per rank (stage), one group of bars per strategy;
- accuracy and loss curves of every configuration (the mean of its seeds, with a 95% interval);
- a per-rank pipeline timeline (Gantt chart of forward, backward,
  communication and idle) from the events our runtime recorded for its last timed step;
- the same chart for every strategy, baselines included, from the compute spans of
  its profiled step (harness.metrics.meter: forward, backward and optimizer; gaps are idle).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Callable

import matplotlib
import pandas as pd

from harness.report.statistics import interval

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

# GPU: a CUDA rank's kernels in its profiled step (the device's work is not split by action)
# I, W: the input- and weight-gradient parts of a split backward (zero-bubble schedules)
_COLORS = {"F": "#4C72B0", "B": "#DD8452", "I": "#E8A87C", "W": "#C44E52", "STEP": "#55A868", "RECV": "#C7C7C7",
           "SEND": "#8172B3", "GPU": "#937860"}
_LEGEND = ["forward", "backward", "backward: input grads", "backward: weight grads", "optimizer step",
           "receive / idle", "send", "GPU kernels"]


def save(fig, out_dir: str, name: str) -> list[str]:
    os.makedirs(out_dir, exist_ok=True)
    paths = []
    for ext in ("png", "pdf"):
        path = os.path.join(out_dir, f"{name}.{ext}")
        fig.savefig(path, bbox_inches="tight", dpi=150)
        paths.append(path)
    plt.close(fig)
    return paths


def throughput_vs_workers(records: list[dict], out_dir: str) -> list[str]:
    ok = [r for r in records if r.get("status") == "ok" and r.get("throughput")]
    if not ok:
        return []
    fig, ax = plt.subplots(figsize=(5, 3.5))
    for strategy in sorted({r["strategy"] for r in ok}):
        points = sorted((r["world_size"], r["throughput"]) for r in ok if r["strategy"] == strategy)
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=strategy)
    ax.set_xlabel("workers")
    ax.set_ylabel("throughput (samples/s)")
    ax.set_xticks(sorted({r["world_size"] for r in ok}))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return save(fig, out_dir, "throughput_vs_workers")


def memory_per_rank(records: list[dict], out_dir: str) -> list[str]:
    ok = [r for r in records if r.get("status") == "ok" and r.get("peak_memory_per_rank")]
    if not ok:
        return []
    fig, ax = plt.subplots(figsize=(max(5, 0.9 * len(ok)), 3.5))
    width = 0.8
    for i, r in enumerate(ok):
        peaks = [p or 0 for p in r["peak_memory_per_rank"]]
        n = len(peaks)
        for k, p in enumerate(peaks):
            ax.bar(i - width / 2 + (k + 0.5) * width / n, p / 2**20, width / n, color=f"C{k % 10}",
                   label=f"rank {k}" if i == 0 or k >= len(ok[0]["peak_memory_per_rank"]) else None)
    ax.set_xticks(range(len(ok)))
    ax.set_xticklabels([f"{r['strategy']}\nw={r['world_size']}" for r in ok], fontsize=8)
    ax.set_ylabel("peak live memory (MiB)")
    ax.legend(fontsize=7, ncol=2)
    ax.grid(axis="y", alpha=0.3)
    return save(fig, out_dir, "memory_per_rank")


def _mean_curve(curves: list[list[tuple[float, float]]]) -> tuple[list, list, list]:
    """Steps every run evaluated, the mean there, and the half-width of its 95% interval (0 for one run)."""
    common = sorted(set.intersection(*(set(x for x, _ in c) for c in curves)))
    at = [dict(c) for c in curves]
    means, halves = [], []
    for x in common:
        mean, half, _ = interval(pd.Series([a[x] for a in at]))
        means.append(mean)
        halves.append(0.0 if half != half else half)  # NaN (one run): no band
    return common, means, halves


def curves(records: list[dict], out_dir: str) -> list[str]:
    """Training loss and test accuracy against the step: one line per configuration, the mean of its
    runs (seeds or repeats) with a shaded 95% interval where it ran more than once."""
    ok = [r for r in records if r.get("status") == "ok" and r.get("loss_curve")]
    data_sets = sorted({str(r.get("data")) for r in ok})
    paths = []
    for data in data_sets:  # one figure per data set
        runs = [r for r in ok if str(r.get("data")) == data]
        paths += _curves_of(runs, out_dir, "curves" if len(data_sets) == 1 else f"curves_{data}")
    return paths


def _curves_of(records: list[dict], out_dir: str, name: str) -> list[str]:
    groups: dict[str, list[dict]] = {}
    for r in records:
        variant = f" ({r['variant']})" if r.get("variant") else ""
        groups.setdefault(f"{r['strategy']}{variant} w={r['world_size']}", []).append(r)
    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(12, 4))
    fig.suptitle(f"{records[0].get('model')} on {records[0].get('data')}", fontsize=9)
    for label, runs in groups.items():
        shown = f"{label} x{len(runs)}" if len(runs) > 1 else label
        steps, mean, half = _mean_curve([[(s, v) for s, v in r["loss_curve"]] for r in runs])
        (line,) = ax_loss.plot(steps, mean, label=shown, lw=1)
        ax_loss.fill_between(steps, [m - h for m, h in zip(mean, half)], [m + h for m, h in zip(mean, half)],
                             color=line.get_color(), alpha=0.2, lw=0)
        evaluated = [[(p["step"], 100 * p["accuracy"]) for p in r.get("accuracy_curve") or []
                      if p.get("accuracy") is not None] for r in runs]
        if all(evaluated):
            steps, mean, half = _mean_curve(evaluated)
            ax_acc.errorbar(steps, mean, yerr=half, marker=".", capsize=2, label=shown, color=line.get_color())
    ax_loss.set_xlabel("step")
    ax_loss.set_ylabel("training loss")
    ax_acc.set_xlabel("step")
    ax_acc.set_ylabel("test top-1 (%)")
    for ax in (ax_loss, ax_acc):
        ax.grid(alpha=0.3)
    ax_acc.legend(fontsize=6, loc="center left", bbox_to_anchor=(1.02, 0.5))
    return save(fig, out_dir, name)


def _kind(label: str) -> str:
    for prefix in ("RECV", "SEND", "STEP", "GPU", "F", "B", "I", "W"):
        if label.startswith(prefix):
            return prefix
    return "STEP"


def _stages(layout: dict) -> str:
    """'stage 1', or 'stages 0, 3' for a rank of a multi-stage schedule."""
    if len(layout.get("stages") or ()) > 1:
        return "stages " + ", ".join(map(str, layout["stages"]))
    return f"stage {layout.get('stage', '?')}"


def _run_name(record: dict) -> str:
    variant = re.sub(r"[^A-Za-z0-9]+", "-", record.get("variant") or "").strip("-")
    return f"{record.get('strategy')}{'_' + variant if variant else ''}_w{record.get('world_size')}"


def timeline(record: dict, out_dir: str, name: str | None = None, key: str = "events") -> list[str]:
    """Gantt chart of one step of every rank: ``events`` (our runtime's actions in its last timed
    step) or ``profiled_spans`` (any strategy's compute in its profiled step)."""
    rows = []  # (label, spans): a rank, or each stage of a process that drives several
    for r in record.get("per_rank", []):
        if key == "profiled_spans" and r.get("stages"):
            rows += [(f"rank {r['rank']} (stage {j})", st["profiled_spans"]) for j, st in r["stages"].items()]
        elif r.get(key):
            rows.append((f"rank {r['rank']} ({_stages(r.get('layout', {}))})", r[key]))
    if not rows:
        return []
    fig, ax = plt.subplots(figsize=(9, 0.6 * len(rows) + 1.4))
    # event times are CLOCK_MONOTONIC seconds (profiled spans: epoch seconds), shared by the
    # ranks of one machine
    origin = min(start for _, spans in rows for _, start, _ in spans)
    for row, (_, spans) in enumerate(rows):
        for label, start, end in spans:
            start, end = start - origin, end - origin
            kind = _kind(label)
            ax.barh(row, max(end - start, 1e-5) * 1e3, left=start * 1e3, color=_COLORS[kind], edgecolor="white", lw=0.3)
            if kind in ("F", "B", "I", "W") and end - start > 0.004:
                ax.text((start + end) / 2 * 1e3, row, label.rstrip("*"), ha="center", va="center", fontsize=6)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([label for label, _ in rows], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("time in the step (ms)")
    what = "waiting (grey), sends" if key == "events" else "idle (blank), profiled step"
    ax.set_title(f"{record.get('strategy')} w={record.get('world_size')}: forward, backward, optimizer, {what}",
                 fontsize=9)
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in _COLORS.values()]
    ax.legend(handles, _LEGEND, fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.35), ncol=4, frameon=False)
    prefix = "timeline" if key == "events" else "timeline_profiled"
    return save(fig, out_dir, name or f"{prefix}_{_run_name(record)}")


def timelines(records: list[dict], out_dir: str) -> list[str]:
    """Each run's timelines: our runtime's actions, and every strategy's profiled compute."""
    paths = []
    for r in records:
        if r.get("status") == "ok":
            paths += timeline(r, out_dir) + timeline(r, out_dir, key="profiled_spans")
    return paths


@dataclass(frozen=True)
class Figure:
    name: str
    shows: str
    draw: Callable[[list[dict], str], list[str]]  # (records, folder) -> the files written


# every figure the results command and a sweep draw, in order; adding one is one entry (docs: extending/figure)
FIGURES: list[Figure] = [
    Figure("throughput_vs_workers", "throughput against world size, one line per strategy", throughput_vs_workers),
    Figure("memory_per_rank", "peak memory of each rank, one group of bars per run", memory_per_rank),
    Figure("curves", "training loss and test accuracy against the step, mean and 95% band per configuration",
           curves),
    Figure("timelines", "each run's per-rank timeline of one step (actions, and profiled compute)", timelines),
]


def all_figures(records: list[dict], out_dir: str) -> list[str]:
    return [path for figure in FIGURES for path in figure.draw(records, out_dir)]
