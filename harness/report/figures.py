"""Paper figures from run records (matplotlib; each written as PDF, vector, and PNG).

Every figure is drawn for a paper's page: 3.5 in wide (one column) or 7 in (both columns, for
figures with many configurations), every text at 8 pt or more. A configuration (strategy,
variant, workers) has one label, its strategy one colour and its variant one marker and one
hatch, the same in every figure of a sweep (:class:`Styles`).

- throughput against workers: the mean of repeats with its 95% interval; points whose speed the
  record marks not comparable (workers sharing cores) hollow and never joined;
- peak memory per rank: stacked bars of the breakdown at the rank's peak (parameters, gradients,
  optimizer state, stashed weights, activations and the rest);
- accuracy and loss against the step: the mean of seeds with a 95% band;
- schedules: throughput against peak memory per rank, one point per pipeline configuration,
  the Pareto front drawn;
- per-rank timelines of one step: our runtime's actions, and every strategy's profiled compute.
"""

from __future__ import annotations

import logging
import os
import re
import textwrap
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Callable, Iterator

import matplotlib
import numpy as np
import pandas as pd

from harness.core.vocabulary import ACTION_LABEL, MEMORY_NAMES, MEMORY_PARTS, REFERENCE_STRATEGY
from harness.report import figure_data
from harness.report.record import config_name, diverged_at, natural_key, variant_text
from harness.report.statistics import interval, intervals
from harness.report.traces import run_name, write_trace

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

# embedding TrueType fonts in a PDF (pdf.fonttype 42) subsets them with fontTools, which logs every
# glyph it keeps at INFO: hundreds of lines in a sweep's log under Hydra's logging
logging.getLogger("fontTools").setLevel(logging.WARNING)

COLUMN_IN, PAGE_IN = 3.5, 7.0  # a paper's column and its two-column text width
_RC = {
    "font.size": 8,
    "axes.titlesize": 8,
    "axes.labelsize": 8,
    "xtick.labelsize": 8,
    "ytick.labelsize": 8,
    "legend.fontsize": 8,
    "legend.title_fontsize": 8,
    "figure.titlesize": 8,
    "pdf.fonttype": 42,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "lines.linewidth": 1.2,
    "lines.markersize": 4,
}

# one colour per strategy (Okabe-Ito, distinguishable in grey and by colour-blind readers);
# a strategy not listed takes the next unused colour
_STRATEGY_COLORS = {
    REFERENCE_STRATEGY: "#000000",
    "hippie": "#D55E00",
    "ashpipe": "#0072B2",
    "pipelining": "#009E73",
    "deepspeed": "#CC79A7",
    "gpipe": "#E69F00",
}
_SPARE_COLORS = ["#56B4E9", "#F0E442", "#999999", "#8C564B"]
_MARKERS = ["o", "s", "^", "D", "v", "P", "X", "<", ">", "*", "h", "p", "d", "8", "H", "1", "2", "3", "4"]
_HATCHES = ["", "////", "\\\\\\\\", "xxx", "...", "---", "+++", "ooo", "|||", "**", "OO"]
_WORKER_LINES = ["-", "--", ":", "-."]


def config_key(record: dict) -> tuple[str, str, int]:
    return (str(record.get("strategy")), variant_text(record), int(record.get("world_size") or 0))


def config_label(record: dict, workers: bool = True) -> str:
    """'hippie (recompute=auto), w=2': the one label of a configuration in every figure (the
    tables' strategy column, and the workers)."""
    name = config_name(record)
    return f"{name}, w={config_key(record)[2]}" if workers else name


def scope(records: list[dict]) -> str:
    """What every figure's title starts with: the model and data of its runs, and the cluster of
    simulated ones ('vit_base on synthetic, simulated dgx_nvlink')."""
    models = ", ".join(sorted({str(r.get("model")) for r in records}))
    data = ", ".join(sorted({str(r.get("data")) for r in records}))
    clusters = ", ".join(sorted({str(r["cluster"]) for r in records if r.get("simulated") and r.get("cluster")}))
    return f"{models} on {data}" + (f", simulated {clusters}" if clusters else "")


class Styles:
    """Colour per strategy, marker per variant within its strategy, hatch per variant, line style per
    worker count: built from all the records a sweep's figures draw, so that each figure agrees
    with the others."""

    def __init__(self, records: list[dict]):
        strategies = sorted({config_key(r)[0] for r in records})
        spare = iter(_SPARE_COLORS * 4)
        self.colors = {s: _STRATEGY_COLORS.get(s) or next(spare) for s in strategies}
        variants = sorted({config_key(r)[1] for r in records} - {""}, key=natural_key)
        self.variant_index = {"": 0, **{v: i + 1 for i, v in enumerate(variants)}}
        # markers numbered within each strategy: its colour tells strategies apart, so its
        # variants need distinct markers only among themselves (11 before one repeats)
        self.marker_index: dict[tuple[str, str], int] = {}
        for strategy in strategies:
            own = sorted({config_key(r)[1] for r in records if config_key(r)[0] == strategy}, key=natural_key)
            self.marker_index.update({(strategy, v): i for i, v in enumerate(own)})
        # one strategy alone (a learning-rate sweep): its variants take the colours instead
        palette = [*_STRATEGY_COLORS.values(), *_SPARE_COLORS]
        self.by_variant = len(strategies) == 1 and len(self.variant_index) > 1
        self.variant_colors = {v: palette[i % len(palette)] for v, i in self.variant_index.items()}
        sizes = sorted({config_key(r)[2] for r in records})
        self.worker_lines = {w: _WORKER_LINES[i % len(_WORKER_LINES)] for i, w in enumerate(sizes)}

    def color(self, record: dict) -> str:
        strategy, variant, _ = config_key(record)
        return self.variant_colors[variant] if self.by_variant else self.colors[strategy]

    def marker(self, record: dict) -> str:
        strategy, variant, _ = config_key(record)
        index = self.variant_index[variant] if self.by_variant else self.marker_index[(strategy, variant)]
        return _MARKERS[index % len(_MARKERS)]

    def hatch(self, record: dict) -> str:
        return _HATCHES[self.variant_index[config_key(record)[1]] % len(_HATCHES)]

    def line(self, record: dict) -> str:
        return self.worker_lines[config_key(record)[2]]


@contextmanager
def paper_style() -> Iterator[None]:
    with plt.rc_context(_RC):
        yield


# False: save() writes what each figure draws (its .figure.json) but no PDF or PNG, for a check that
# compares figures through their data (harness.report.reproduce) in a fraction of the time
IMAGES: ContextVar[bool] = ContextVar("images", default=True)


@contextmanager
def data_only() -> Iterator[None]:
    """Within it, figures are saved as the data they draw only (:data:`IMAGES`)."""
    token = IMAGES.set(False)
    try:
        yield
    finally:
        IMAGES.reset(token)


def _fit_page(fig) -> None:
    """Titles wrapped to their axes' width, and a figure whose tick labels stick out past a
    page's width, as saved, narrowed until it fits: the axes give way, the text keeps its size."""
    for _ in range(8):  # the box narrows less than the figure (what sticks out stays): a few rounds
        for ax in fig.axes:  # a title starts at its axes' left edge: wrapped to the axes' width
            width_pt = ax.get_position().width * fig.get_figwidth() * 72
            for title in (ax.title, ax._left_title):
                chars = max(20, int(width_pt / (0.6 * title.get_fontsize())))  # about 0.6 em a character
                title.set_text(textwrap.fill(title.get_text().replace("\n", " "), chars))
        box = fig.get_tightbbox(fig.canvas.get_renderer())
        excess = box.width + 2 * figure_data.PAD_IN - figure_data.MAX_WIDTH_IN
        width = fig.get_figwidth() - excess - 0.05
        if excess <= 0 or width < 2.0:  # fits; or what sticks out is no axis (a wide legend): refused
            return
        fig.set_figwidth(width)


def save(fig, out_dir: str, name: str) -> list[str]:
    """The figure as PDF and PNG, with what it draws beside them (``name.figure.json``), once it meets
    the contract (:mod:`harness.report.figure_data`; a figure that breaks it is not written, nor one
    whose lines and points sit at one x value)."""
    _fit_page(fig)
    data = figure_data.figure_data(fig, name)
    if figure_data.one_valued(data):
        plt.close(fig)
        return []
    try:
        figure_data.check(data)
    except figure_data.FigureContractError:
        plt.close(fig)
        raise
    os.makedirs(out_dir, exist_ok=True)
    paths = []
    for ext in ("pdf", "png") if IMAGES.get() else ():
        path = os.path.join(out_dir, f"{name}.{ext}")
        # no creation date in a PDF: the same data makes the same file, so a regenerated study
        # changes only where its figures do
        metadata = {"CreationDate": None} if ext == "pdf" else None
        fig.savefig(path, bbox_inches="tight", dpi=200, metadata=metadata)
        paths.append(path)
    plt.close(fig)
    return [*paths, figure_data.write(data, out_dir)]


def _ok(records: list[dict], *fields: str) -> list[dict]:
    return [r for r in records if r.get("status") == "ok" and all(r.get(f) for f in fields)]


def _order(key: tuple[str, str, int]) -> tuple:
    strategy, variant, w = key
    known = list(_STRATEGY_COLORS)
    return (known.index(strategy) if strategy in known else len(known), strategy, variant, w)


def _by_config(records: list[dict]) -> dict[tuple, list[dict]]:
    """Runs grouped by configuration (repeats and seeds together): DP first, then each strategy
    by its variants and workers, the same order in every figure."""
    groups: dict[tuple, list[dict]] = {}
    for r in records:
        groups.setdefault(config_key(r), []).append(r)
    return dict(sorted(groups.items(), key=lambda kv: _order(kv[0])))


def _mean_and_half(values: list[float]) -> tuple[float, float]:
    mean, half, _ = interval(pd.Series(values, dtype=float))
    return mean, (0.0 if half != half else half)  # NaN (one run): no bar


def _comparable(runs: list[dict]) -> bool:
    return all(r.get("speed_comparable") is not False for r in runs)


def _legend_below(fig, ax, handles=None, labels=None, ncol: int = 2) -> None:
    """The legend under the figure, below the lowest axis label (the x label, or rotated ticks)."""
    handles, labels = (handles, labels) if handles is not None else ax.get_legend_handles_labels()
    if not handles:
        return
    renderer = fig.canvas.get_renderer()
    bottom = min(a.get_tightbbox(renderer).y0 for a in fig.axes) / fig.bbox.height
    for columns in range(ncol, 0, -1):  # as many columns as asked, fewer where they overflow the page
        legend = fig.legend(
            handles,
            labels,
            loc="upper center",
            bbox_to_anchor=(0.5, bottom - 0.01),
            ncol=columns,
            frameon=False,
            handlelength=2.2,
            columnspacing=1.0,
        )
        if columns == 1 or legend.get_window_extent(renderer).width / fig.dpi <= figure_data.MAX_WIDTH_IN - 0.3:
            break
        legend.remove()
    legend.source_handles = list(handles)  # what each entry stands for (harness.report.figure_data)


def throughput_vs_workers(records: list[dict], out_dir: str) -> list[str]:
    """Samples/s against workers, one line per strategy and variant; not drawn where the runs share
    one worker count (the tables hold their speed)."""
    ok = _ok(records, "throughput")
    if not ok:
        return []
    if len({config_key(r)[2] for r in ok}) < 2:  # one worker count: nothing to draw a line through
        return []
    styles = Styles(records)
    lines: dict[tuple, list[tuple[int, list[dict]]]] = {}
    for (strategy, variant, w), runs in _by_config(ok).items():
        lines.setdefault((strategy, variant), []).append((w, runs))
    with paper_style():
        fig, ax = plt.subplots(figsize=(COLUMN_IN, 2.4))
        hollow_seen = False
        for points in lines.values():
            points.sort(key=lambda p: p[0])
            first = points[0][1][0]
            style = dict(color=styles.color(first), marker=styles.marker(first), capsize=2, elinewidth=0.8)
            joined = [(w, *_mean_and_half([r["throughput"] for r in runs])) for w, runs in points if _comparable(runs)]
            apart = [
                (w, *_mean_and_half([r["throughput"] for r in runs])) for w, runs in points if not _comparable(runs)
            ]
            if joined:
                ax.errorbar(
                    *zip(*[(w, m) for w, m, _ in joined]),
                    yerr=[h for _, _, h in joined],
                    linestyle="-",
                    label=config_label(first, workers=False),
                    **style,
                )
            if apart:  # never joined: their speed is not the machine's
                hollow_seen = True
                ax.errorbar(
                    *zip(*[(w, m) for w, m, _ in apart]),
                    yerr=[h for _, _, h in apart],
                    linestyle="none",
                    markerfacecolor="white",
                    label=None if joined else config_label(first, workers=False),
                    **style,
                )
        sizes = sorted({config_key(r)[2] for r in ok})
        if sizes[-1] >= 4 * max(sizes[0], 1):
            ax.set_xscale("log", base=2)
        ax.set_xticks(sizes, [str(s) for s in sizes])
        ax.minorticks_off()
        ax.set_xlabel("workers")
        ax.set_ylabel("samples/s")
        ax.set_title(scope(ok), loc="left")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        handles, labels = ax.get_legend_handles_labels()
        if hollow_seen:
            handles.append(plt.Line2D([], [], color="grey", marker="o", markerfacecolor="white", linestyle="none"))
            labels.append("hollow: speed not comparable")
        _legend_below(fig, ax, handles, labels)
        return save(fig, out_dir, "throughput_vs_workers")


# one colour per part of a rank's peak (harness.core.vocabulary.MEMORY_PARTS, bottom to top)
_PART_COLORS = ["#4C72B0", "#DD8452", "#55A868", "#8172B3", "#BBBBBB"]


def _rank_parts(record: dict) -> list[dict[str, float] | None]:
    """Each rank's peak split into the memory parts (MiB, :mod:`harness.core.vocabulary`), or None
    where the rank recorded no split (then its bar is its peak alone)."""
    out = []
    for rank in record.get("per_rank") or []:
        parts = rank.get("memory_breakdown")
        out.append({k: (parts.get(k) or 0) / 2**20 for k in MEMORY_PARTS} if parts else None)
    return out


def memory_per_rank(records: list[dict], out_dir: str) -> list[str]:
    """One row of bars per configuration, one bar per rank, each rank's peak stacked by what held
    it (the first run of a configuration: its repeats hold the same tensors)."""
    ok = _ok(records, "peak_memory_per_rank")
    if not ok:
        return []
    styles = Styles(records)
    configs = [runs[0] for runs in _by_config(ok).values()]
    with paper_style():
        fig, ax = plt.subplots(
            figsize=(
                COLUMN_IN if len(configs) <= 3 else PAGE_IN * 0.75,
                0.9 + 0.28 * sum(len(r["peak_memory_per_rank"]) for r in configs) ** 0.5 * len(configs) ** 0.5,
            )
        )
        plain_seen = False
        for i, r in enumerate(configs):
            peaks = [(p or 0) / 2**20 for p in r["peak_memory_per_rank"]]
            parts = _rank_parts(r)
            bar = 0.8 / len(peaks)
            for k, peak in enumerate(peaks):
                y = i - 0.4 + (k + 0.5) * bar
                split = parts[k] if k < len(parts) else None
                if split is None:
                    plain_seen = True
                    ax.barh(y, peak, bar * 0.9, color="white", edgecolor="#555555", hatch="....", lw=0.5)
                    continue
                left = 0.0
                for color, key in zip(_PART_COLORS, MEMORY_PARTS):
                    ax.barh(y, split[key], bar * 0.9, left=left, color=color, lw=0)
                    left += split[key]
        # a long configuration's name on two lines or more: the bars keep the page's width
        ax.set_yticks(range(len(configs)), [textwrap.fill(config_label(r), 48) for r in configs])
        for tick, r in zip(ax.get_yticklabels(), configs):
            tick.set_color(styles.color(r))
        ax.invert_yaxis()
        ax.set_xlabel("peak memory per rank (MiB); one bar per rank, rank 0 on top")
        ax.set_title(scope(configs), loc="left")
        ax.grid(axis="x", alpha=0.3)
        handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in _PART_COLORS]
        labels = [MEMORY_NAMES[k] for k in MEMORY_PARTS]
        if plain_seen:
            handles.append(plt.Rectangle((0, 0), 1, 1, facecolor="white", edgecolor="#555555", hatch="...."))
            labels.append("peak, not split")
        _legend_below(fig, ax, handles, labels, ncol=3)
        return save(fig, out_dir, "memory_per_rank")


def _mean_curve(curves: list[list[tuple[float, float]]]) -> tuple[list, list, list]:
    """Steps every run evaluated, the mean there, and the half-width of its 95% interval (0 for one run)."""
    common = sorted(set.intersection(*(set(x for x, _ in c) for c in curves)))
    at = [dict(c) for c in curves]
    values = np.array([[np.nan if a[x] is None else a[x] for a in at] for x in common], dtype=float)
    means, halves = intervals(values.reshape(len(common), len(at)))
    return common, list(means), list(np.nan_to_num(halves))


def _smoothed(values: list[float], window: int) -> list[float]:
    return list(pd.Series(values, dtype=float).rolling(window, min_periods=1).mean())


def curves(records: list[dict], out_dir: str) -> list[str]:
    """Training loss and test accuracy against the step: one line per configuration, the mean of its
    runs (seeds or repeats) with a shaded 95% band where it ran more than once; one figure per
    data set."""
    ok = _ok(records, "loss_curve")
    data_sets = sorted({str(r.get("data")) for r in ok})
    styles = Styles(records)
    paths = []
    for data in data_sets:
        runs = [r for r in ok if str(r.get("data")) == data]
        paths += _curves_of(runs, styles, out_dir, "curves" if len(data_sets) == 1 else f"curves_{data}")
    return paths


def _curves_of(records: list[dict], styles: Styles, out_dir: str, name: str) -> list[str]:
    groups = _by_config(records)
    steps_max = max(len(r["loss_curve"]) for r in records)
    window = max(1, steps_max // 25)
    # the accuracy panel where the runs were evaluated at two steps or more (one point is a table's)
    evaluations = {p["step"] for r in records for p in r.get("accuracy_curve") or [] if p.get("accuracy") is not None}
    with paper_style():
        if len(evaluations) > 1:
            fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(PAGE_IN, 2.4))
        else:
            fig, ax_loss = plt.subplots(figsize=(PAGE_IN, 2.4))
            ax_acc = None
        finite_top = []  # the highest smoothed loss of each configuration none of whose runs diverged
        for runs in groups.values():
            first = runs[0]
            diverged = sum(diverged_at(r["loss_curve"]) is not None for r in runs)
            notes = ([f"x{len(runs)}"] if len(runs) > 1 else []) + (
                [f"{diverged} diverged" if len(runs) > 1 else "diverged"] if diverged else []
            )
            label = config_label(first) + (f" ({', '.join(notes)})" if notes else "")
            style = dict(
                color=styles.color(first),
                linestyle=styles.line(first),
                marker=styles.marker(first),
                zorder=3 if first.get("strategy") == REFERENCE_STRATEGY else 2,
            )  # the reference on top
            steps, mean, half = _mean_curve([[(s, v) for s, v in r["loss_curve"]] for r in runs])
            smoothed = _smoothed(mean, window)
            if not diverged:
                finite_top.append(max(smoothed))
            ax_loss.plot(steps, smoothed, label=label, markevery=max(1, len(steps) // 8), **style)
            if any(half):
                low, high = (
                    _smoothed([m - h for m, h in zip(mean, half)], window),
                    _smoothed([m + h for m, h in zip(mean, half)], window),
                )
                ax_loss.fill_between(steps, low, high, color=style["color"], alpha=0.15, lw=0)
            evaluated = [
                [
                    (p["step"], 100 * p["accuracy"])
                    for p in r.get("accuracy_curve") or []
                    if p.get("accuracy") is not None
                ]
                for r in runs
            ]
            if ax_acc is not None and all(evaluated):
                steps, mean, half = _mean_curve(evaluated)
                ax_acc.plot(steps, mean, markevery=max(1, len(steps) // 8), **style)
                if any(half):
                    ax_acc.fill_between(
                        steps,
                        [max(0.0, m - h) for m, h in zip(mean, half)],
                        [min(100.0, m + h) for m, h in zip(mean, half)],
                        color=style["color"],
                        alpha=0.15,
                        lw=0,
                    )
        if finite_top and len(finite_top) < len(groups):  # a diverged run's blow-up would flatten the rest
            ax_loss.set_ylim(0, 1.15 * max(finite_top))
        ax_loss.set_ylabel("training loss" + (f" ({window}-step mean)" if window > 1 else ""))
        if ax_acc is not None:
            ax_acc.set_ylabel("test top-1 (%)")
            ax_acc.set_ylim(0, min(100.0, ax_acc.get_ylim()[1]))
        for ax in fig.axes:
            ax.set_xlabel("step")
            ax.grid(alpha=0.3)
        ax_loss.set_title(scope(records), loc="left")
        longest = max(len(label) for label in ax_loss.get_legend_handles_labels()[1])
        _legend_below(fig, ax_loss, ncol=3 if longest <= 36 else 2)  # within the page's width at 8 pt
        return save(fig, out_dir, name)


def sensitivity(records: list[dict], out_dir: str) -> list[str]:
    """Final top-1 against each numeric setting a sweep varied within a configuration (a sweep over
    ``train.lr``, :func:`harness.report.record.mark_swept`): one line per strategy, variant,
    workers and the other varied settings, mean and 95% interval over seeds; one figure per
    setting (``sensitivity_lr``). A run that diverged keeps its point, at the accuracy it ended with."""
    ok = [r for r in records if r.get("status") == "ok" and r.get("accuracy") is not None]
    names = dict.fromkeys(
        name
        for r in ok
        for name, value in (r.get("swept_settings") or {}).items()
        if isinstance(value, (int, float)) and not isinstance(value, bool)
    )
    paths = []
    for name in names:
        lines: dict[tuple, dict[float, list[dict]]] = {}
        for r in ok:
            swept = r.get("swept_settings") or {}
            if name not in swept:
                continue
            # a line is a configuration less the swept setting, styled as the other figures style it
            line = {**r, "swept": ", ".join(f"{n}={v}" for n, v in swept.items() if n != name)}
            lines.setdefault(config_key(line), {}).setdefault(float(swept[name]), []).append(line)
        if not any(len(points) > 1 for points in lines.values()):
            continue
        values = sorted({x for points in lines.values() for x in points})
        styles = Styles([r for points in lines.values() for runs in points.values() for r in runs])
        with paper_style():
            fig, ax = plt.subplots(figsize=(COLUMN_IN, 2.4))
            for key, points in sorted(lines.items(), key=lambda kv: _order(kv[0])):
                strategy, variant, w = key
                xs = sorted(points)
                means = [_mean_and_half([r["accuracy"] * 100 for r in points[x]]) for x in xs]
                label = f"{config_name({'strategy': strategy, 'variant': variant})}, w={w}"
                first = points[xs[0]][0]
                ax.errorbar(
                    xs,
                    [m for m, _ in means],
                    yerr=[h for _, h in means],
                    label=label,
                    capsize=2,
                    elinewidth=0.8,
                    color=styles.color(first),
                    marker=styles.marker(first),
                    linestyle=styles.line(first),
                    zorder=3 if strategy == REFERENCE_STRATEGY else 2,
                )  # the reference on top
            if values[0] > 0 and values[-1] >= 10 * values[0]:
                ax.set_xscale("log")
            ax.set_xticks(values, [f"{x:g}" for x in values])
            ax.minorticks_off()
            ax.set_xlabel(name)
            ax.set_ylabel("final test top-1 (%)")
            ax.set_title(scope(ok), loc="left")
            ax.set_ylim(bottom=0)
            ax.grid(alpha=0.3)
            _legend_below(fig, ax, ncol=1)
            paths += save(fig, out_dir, f"sensitivity_{re.sub(r'[^A-Za-z0-9]+', '_', name)}")
    return paths


def _pareto(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The points no other beats on both memory (lower) and throughput (higher), by memory."""
    front, best = [], float("-inf")
    for memory, speed in sorted(points, key=lambda p: (p[0], -p[1])):
        if speed > best:
            front.append((memory, speed))
            best = speed
    return front


def schedules(records: list[dict], out_dir: str) -> list[str]:
    """Samples/s against peak memory per rank, one point per pipeline configuration (more than one
    stage; mean of repeats), with the Pareto front of the comparable ones: one panel per worker
    count, so that no two points of a panel share a look."""
    ok = [r for r in _ok(records, "throughput", "peak_memory_bytes") if len(r.get("replicas") or []) > 1]
    groups = _by_config(ok)
    if len(groups) < 2:
        return []
    styles = Styles(records)
    workers = sorted({w for _, _, w in groups})
    with paper_style():
        fig, axes = plt.subplots(
            1, len(workers), figsize=(COLUMN_IN if len(workers) == 1 else PAGE_IN, 2.6), sharey=True, squeeze=False
        )
        legend: dict[str, object] = {}
        for ax, w in zip(axes[0], workers):
            comparable = []
            for (_, _, size), runs in groups.items():
                if size != w:
                    continue
                first = runs[0]
                speed, half = _mean_and_half([r["throughput"] for r in runs])
                memory = sum(r["peak_memory_bytes"] for r in runs) / len(runs) / 2**20
                fair = _comparable(runs)
                drawn = ax.errorbar(
                    memory,
                    speed,
                    yerr=half,
                    color=styles.color(first),
                    marker=styles.marker(first),
                    ms=5,
                    capsize=2,
                    linestyle="none",
                    markerfacecolor=None if fair else "white",
                )
                legend.setdefault(config_label(first, workers=False), drawn)
                if fair:
                    comparable.append((memory, speed))
            front = _pareto(comparable)
            if len(front) > 1:
                (line,) = ax.step(*zip(*front), where="post", color="grey", lw=0.8, linestyle="--", zorder=0)
                legend.setdefault("Pareto front", line)
            ax.set_xlabel("peak memory per rank (MiB)")
            ax.set_title(f"{w} workers", loc="right")
            ax.grid(alpha=0.3)
        axes[0][0].set_ylabel("samples/s")
        axes[0][0].set_title(scope(ok), loc="left")
        labels = sorted(legend, key=lambda label: label == "Pareto front")  # the front last
        handles = [legend[label] for label in labels]
        if not all(_comparable(runs) for runs in groups.values()):
            handles.append(plt.Line2D([], [], color="grey", marker="o", markerfacecolor="white", linestyle="none"))
            labels.append("hollow: speed not comparable (not on the front)")
        _legend_below(fig, axes[0][0], handles, labels, ncol=1 if len(workers) == 1 else 2)
        return save(fig, out_dir, "schedules")


# GPU: a CUDA rank's kernels in its profiled step (the device's work is not split by action)
# I, W: the input- and weight-gradient parts of a split backward (zero-bubble schedules)
_KINDS = {
    "F": ("#4C72B0", "forward"),
    "B": ("#DD8452", "backward"),
    "I": ("#E8A87C", "backward: input grads"),
    "W": ("#C44E52", "backward: weight grads"),
    "STEP": ("#55A868", "optimizer step"),
    "RECV": ("#C7C7C7", "receive / wait"),
    "SEND": ("#8172B3", "send"),
    "GPU": ("#937860", "GPU kernels"),
}


def _kind(label: str) -> str:
    """The colour key of an action's label (``F3``, ``2SEND_F1``, ``1B0*``): a label that is no
    action is refused, never drawn as some other kind."""
    found = ACTION_LABEL.match(label)
    if not found:
        raise ValueError(f"a timeline span is labelled {label!r}, which names no schedule action")
    return found.group(2).split("_")[0]  # RECV_F, RECV_B: receive


def _stages(layout: dict) -> str:
    """'stage 1', or 'stages 0, 3' for a rank of a multi-stage schedule."""
    if len(layout.get("stages") or ()) > 1:
        return "stages " + ", ".join(map(str, layout["stages"]))
    return f"stage {layout.get('stage', '?')}"


def timeline_rows(record: dict, key: str) -> list[tuple[str, list]]:
    """(label, spans) of each row of a timeline: a rank, or each stage of a process that drives
    several; ``key`` is ``events`` (our runtime's actions in its last timed step) or
    ``profiled_spans`` (any strategy's compute in its profiled step)."""
    rows = []
    for r in record.get("per_rank", []):
        if key == "profiled_spans" and r.get("stages"):
            rows += [(f"rank {r['rank']} (stage {j})", st["profiled_spans"]) for j, st in r["stages"].items()]
        elif r.get(key):
            rows.append((f"rank {r['rank']} ({_stages(r.get('layout', {}))})", r[key]))
    return rows


def timeline(record: dict, out_dir: str, name: str | None = None, key: str = "events") -> list[str]:
    """Gantt chart of one step of every rank (see :func:`timeline_rows`)."""
    rows = _from_origin(timeline_rows(record, key))
    if not rows:
        return []
    what = "our runtime's actions, last timed step" if key == "events" else "profiled step, blank: idle"
    prefix = "timeline" if key == "events" else "timeline_profiled"
    title = f"{scope([record])}, {config_label(record)}: {what}"
    return _gantt(rows, title, out_dir, name or f"{prefix}_{run_name(record)}")


def _from_origin(rows: list[tuple[str, list]]) -> list[tuple[str, list]]:
    """``rows`` with times in seconds from the first span's start: event times are CLOCK_MONOTONIC
    seconds (profiled spans: epoch seconds), shared by the ranks of one machine."""
    if not rows:
        return []
    origin = min(start for _, spans in rows for _, start, _ in spans)
    return [(label, [(kind, start - origin, end - origin) for kind, start, end in spans]) for label, spans in rows]


def _gantt(rows: list[tuple[str, list]], title: str, out_dir: str, name: str) -> list[str]:
    """One bar per span, one row per (label, spans), times in seconds from the step's start."""
    makespan = max(end for _, spans in rows for _, _, end in spans)
    with paper_style():
        fig, ax = plt.subplots(figsize=(PAGE_IN, 0.3 * len(rows) + 0.9))
        points_per_s = PAGE_IN * 0.8 * 72 / max(makespan, 1e-9)  # the axis is about 80% of the width
        kinds = []
        bars: dict[tuple[int, str], list[tuple[float, float]]] = {}  # (row, kind) -> its (start, length) in ms
        for row, (_, spans) in enumerate(rows):
            for label, start, end in spans:
                kind = _kind(label)
                kinds.append(kind)
                bars.setdefault((row, kind), []).append((start * 1e3, max(end - start, 1e-5) * 1e3))
                text = label.rstrip("*")
                # a label only where it fits in its bar at 8 pt (about 5 pt per character)
                if kind in ("F", "B", "I", "W") and (end - start) * points_per_s > 5 * len(text) + 2:
                    ax.text((start + end) / 2 * 1e3, row, text, ha="center", va="center")
        # one collection per row and kind: a step holds thousands of spans, and a patch each is slow
        for (row, kind), spans in bars.items():
            ax.broken_barh(
                spans, (row - 0.4, 0.8), facecolors=_KINDS[kind][0], edgecolor="white", lw=0.3, gid=figure_data.BARS
            )
        ax.set_yticks(range(len(rows)), [label for label, _ in rows])
        ax.invert_yaxis()
        ax.set_xlabel("time in the step (ms)")
        ax.set_title(title, loc="left")
        shown = [k for k in _KINDS if k in kinds]
        handles = [plt.Rectangle((0, 0), 1, 1, color=_KINDS[k][0]) for k in shown]
        _legend_below(fig, ax, handles, [_KINDS[k][1] for k in shown], ncol=min(4, len(shown)))
        return save(fig, out_dir, name)


def schedule_timelines(records: list[dict], out_dir: str) -> list[str]:
    """For each schedule that several runtimes ran in the sweep (same model, workers, stages per
    rank and recomputation), their profiled steps one above the other on one time axis, each run
    from its own step's start: where one runtime idles and the other computes."""
    groups: dict[tuple, list[dict]] = {}
    for r in records:
        st = (r.get("config") or {}).get("strategy") or {}
        if r.get("status") == "ok" and st.get("schedule") and timeline_rows(r, "profiled_spans"):
            key = (
                r.get("model"),
                r.get("world_size"),
                st["schedule"],
                st.get("stages_per_rank") or 1,
                str(st.get("recompute")),
            )
            groups.setdefault(key, []).append(r)
    paths = []
    for (_model, world, schedule, v, recompute), runs in groups.items():
        if len({r["strategy"] for r in runs}) < 2:
            continue
        runs = sorted(runs, key=lambda r: (r["strategy"] != "hippie", r["strategy"]))
        rows = [
            (f"{r['strategy']}: {label}", spans)
            for r in runs
            for label, spans in _from_origin(timeline_rows(r, "profiled_spans"))
        ]
        recomputed = recompute not in ("none", "None")
        title = f"{scope(runs)}, {schedule} (v={v}{f', recompute={recompute}' if recomputed else ''}), {world} workers"
        paths += _gantt(
            rows,
            f"{title}: profiled step of each runtime, blank: idle",
            out_dir,
            f"timeline_schedule_{schedule}_v{v}_w{world}" + (f"_recompute-{recompute}" if recomputed else ""),
        )
    return paths


def timelines(records: list[dict], out_dir: str) -> list[str]:
    """Each run's timelines: our runtime's actions, and every strategy's profiled compute."""
    paths = []
    for r in records:
        if r.get("status") == "ok":
            paths += timeline(r, out_dir) + timeline(r, out_dir, key="profiled_spans")
    return paths


def traces(records: list[dict], out_dir: str) -> list[str]:
    """Each run's step as a Chrome trace for Perfetto (harness.report.traces), beside its timelines."""
    return [path for r in records for path in [write_trace(r, out_dir)] if path]


@dataclass(frozen=True)
class Figure:
    name: str
    shows: str
    draw: Callable[[list[dict], str], list[str]]  # (records, folder) -> the files written


# every figure the results command and a sweep draw, in order; adding one is one entry (docs: extending/figure)
FIGURES: list[Figure] = [
    Figure(
        "throughput_vs_workers",
        "samples/s against workers, mean and 95% interval of repeats; hollow: speed not comparable",
        throughput_vs_workers,
    ),
    Figure(
        "memory_per_rank",
        "each rank's peak memory, stacked by parameters, gradients, optimizer state, stashed "
        "weights, activations and the rest",
        memory_per_rank,
    ),
    Figure("curves", "training loss and test accuracy against the step, mean and 95% band per configuration", curves),
    Figure(
        "sensitivity",
        "final test top-1 against a numeric setting the sweep varied (sensitivity_lr), one line "
        "per configuration, mean and 95% interval over seeds",
        sensitivity,
    ),
    Figure(
        "schedules",
        "samples/s against peak memory per rank, one point per pipeline configuration, with the Pareto front",
        schedules,
    ),
    Figure("timelines", "each run's per-rank timeline of one step (actions, and profiled compute)", timelines),
    Figure(
        "schedule_timelines",
        "each schedule that several runtimes ran, their profiled steps one above the other",
        schedule_timelines,
    ),
    Figure(
        "traces",
        "each run's step as a Chrome trace (JSON) for Perfetto: ranks, their idle time, and the simulator's replay",
        traces,
    ),
]


def all_figures(records: list[dict], out_dir: str) -> list[str]:
    """Every figure of :data:`FIGURES` that the records allow; one that breaks the contract stops
    only itself, and is named in one error once the others are written (the error's ``paths``)."""
    paths, broken = [], []
    for figure in FIGURES:
        try:
            paths += figure.draw(records, out_dir)
        except figure_data.FigureContractError as e:
            broken.append(str(e))
    if broken:
        raise figure_data.FigureContractError("; ".join(broken), paths)
    return paths
