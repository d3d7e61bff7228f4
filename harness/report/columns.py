"""Every column of the comparison tables, declared once.

A column says where its values come from (a field of the comparison frame, or a
function of it), its label and unit, how it is scaled and rounded, whether a higher
or a lower value is better (the best one is set in bold in LaTeX) and whether it is a
measured figure (averaged over repeats with its 95% interval) or part of what identifies
a configuration. The Markdown, CSV and LaTeX tables are generated from this list
(:mod:`harness.report.tables`); adding a column is one entry (docs: extending/metric).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Union

import pandas as pd

Source = Union[str, Callable[[pd.DataFrame], pd.Series]]


@dataclass(frozen=True)
class Column:
    key: str  # snake_case name (CSV header, with the unit)
    label: str  # what people read (Markdown and LaTeX headers)
    source: Source  # a column of the comparison frame, or a function of the frame
    unit: str = ""  # of the shown value, after scaling
    scale: float = 1.0
    digits: int | None = None  # rounding of the shown value (None: as it is)
    better: str | None = None  # "higher" or "lower": the best value of a group is marked
    figure: bool = False  # a measurement: mean ± 95% interval over a configuration's runs
    config: bool = False  # identifies a configuration (the same in all of its runs)

    def values(self, df: pd.DataFrame) -> pd.Series:
        raw = self.source(df) if callable(self.source) else df[self.source]
        if not (self.figure or self.scale != 1.0 or self.digits is not None):
            return raw
        shown = raw.astype(float) * self.scale
        return shown.round(self.digits) if self.digits is not None else shown


def _strategy(df: pd.DataFrame) -> pd.Series:
    """The strategy with the options that tell its runs apart, ``hippie (recompute=auto)``."""
    variant = df["variant"].fillna("") if "variant" in df else pd.Series([""] * len(df), index=df.index)
    return pd.Series([f"{s} ({v})" if v else s for s, v in zip(df["strategy"], variant)], index=df.index)


def _bubble(df: pd.DataFrame) -> pd.Series:
    # a simulated row's idle share is the prediction of what a run measures (its other figures too)
    return df["bubble_measured"].where(df["simulated"] != True, df["bubble_fraction"])  # noqa: E712


COLUMNS: list[Column] = [
    Column("block", "block", lambda df: df["block"].fillna(""), config=True),
    Column("strategy", "strategy", _strategy, config=True),
    Column("layout", "layout", lambda df: df["layout"].fillna(""), config=True),
    Column("model", "model", "model", config=True),
    Column("data", "data", "data", config=True),
    Column("workers", "workers", "world_size", config=True),
    Column("batch", "batch", "global_batch", config=True),
    Column("micro_batches", "micro", "micro_batches", config=True),
    Column("device", "device", "device", config=True),
    Column("precision", "precision", lambda df: df["precision"].fillna(""), config=True),
    Column("seed", "seed", "seed"),
    Column("status", "status", "status"),
    Column("throughput", "samples/s", "throughput", "samples/s", digits=1, better="higher", figure=True),
    Column("speedup", "speedup", "speedup", "x DP", digits=3, better="higher", figure=True),
    Column("peak_memory", "peak MiB/rank", "peak_memory_bytes", "MiB", scale=2**-20, digits=2, better="lower",
           figure=True),
    Column("me", "ME", "me", "x DP", digits=3, better="higher", figure=True),
    Column("top1", "top-1 %", "accuracy", "%", scale=100, digits=2, better="higher", figure=True),
    Column("final_loss", "final loss", "final_loss", digits=4, better="lower", figure=True),
    Column("time_to_target", "s to target", "time_to_target_s", "s", digits=1, better="lower", figure=True),
    Column("steps_to_target", "steps to target", "steps_to_target", "steps", better="lower", figure=True),
    Column("bubble", "bubble %", _bubble, "%", scale=100, digits=1, better="lower", figure=True),
    Column("bubble_analytic", "analytic %", "bubble_analytic", "%", scale=100, digits=1, figure=True),
    Column("bubble_replayed", "replayed %", "bubble_replayed", "%", scale=100, digits=1, figure=True),
    Column("hidden_allreduce", "hidden AR ms", "hidden_allreduce_s", "ms", scale=1e3, digits=2, figure=True),
    Column("tflops_per_device", "TFLOP/s/dev", "tflops_per_device", "TFLOP/s", digits=3, figure=True),
    Column("mfu", "MFU %", "mfu", "%", scale=100, digits=1, figure=True),
    Column("hfu", "HFU %", "hfu", "%", scale=100, digits=1, figure=True),
    Column("note", "note", lambda df: df["note"] if "note" in df else pd.Series("", index=df.index)),
]



# read at each use, so that a column added to COLUMNS (docs: extending/metric) is in every table
def column(label: str) -> Column:
    return next(c for c in COLUMNS if c.label == label)


def config_labels() -> list[str]:
    return [c.label for c in COLUMNS if c.config]


def figure_labels() -> list[str]:
    return [c.label for c in COLUMNS if c.figure]
