"""Every column of the comparison tables, declared once, and the named sets of them.

A column says where its values come from (a field of the comparison frame, or a
function of it), its label and unit, how it is scaled and rounded, whether a higher
or a lower value is better (a group's unique best is set in bold), whether it is a
measured figure (averaged over repeats with its 95% interval) or part of what identifies
a configuration, and which named sets show it (``pipebench results --columns SET``). The
Markdown, CSV and LaTeX tables are generated from this list (:mod:`harness.report.tables`);
adding a column is one entry (docs: extending/metric).
"""

from __future__ import annotations

import numbers
import re
from dataclasses import dataclass
from typing import Callable, Union

import pandas as pd

from harness.core import vocabulary
from harness.core.vocabulary import idle_field, memory_field
from harness.report.record import config_name

Source = Union[str, Callable[[pd.DataFrame], pd.Series]]


@dataclass(frozen=True)
class Column:
    key: str  # snake_case name (the CSV header, with the unit)
    label: str  # what people read (Markdown and LaTeX headers)
    source: Source  # a column of the comparison frame, or a function of the frame
    unit: str = ""  # of the shown value, after scaling
    scale: float = 1.0
    digits: int | None = None  # decimals shown (None: as it is)
    better: str | None = None  # "higher" or "lower": the unique best value of a group is set in bold
    figure: bool = False  # a measurement: mean ± 95% interval over a configuration's runs
    config: bool = False  # identifies a configuration (the same in all of its runs)
    sets: tuple[str, ...] = ()  # the named column sets that show it (every column is in "all")
    speed: bool = False  # depends on the machine's speed: not comparable where workers share cores
    relative: bool = False  # a ratio to the reference strategy: exactly 1 on its rows, with no interval

    def values(self, df: pd.DataFrame) -> pd.Series:
        """The column's values in its unit, not rounded: rounding is the printing's
        (:func:`figure_text`), after any mean or interval, never before."""
        raw = self.source(df) if callable(self.source) else df[self.source]
        if not (self.figure or self.scale != 1.0 or self.digits is not None):
            return raw
        return pd.to_numeric(raw, errors="coerce").astype(float) * self.scale

    @property
    def csv_header(self) -> str:
        """``peak_memory_mib``: the key and the unit, in snake_case."""
        unit = re.sub(r"[^a-z0-9]+", "_", self.unit.lower().replace("/", " per ").replace("%", "pct")).strip("_")
        return f"{self.key}_{unit}" if unit and unit not in self.key.split("_") else self.key

    def text(self, value, half=None) -> str:
        """One cell as people read it: rounded to the column's decimals, with ``± half`` if given; a
        missing figure is "–", an identifying field that does not apply is blank."""
        if value is None or (isinstance(value, float) and value != value):
            return "" if self.config else "–"  # an identifying field left blank does not apply
        if not isinstance(value, numbers.Real) or isinstance(value, bool):
            return str(value)
        return figure_text(value, half, self.digits)


def figure_text(value: float, half: float | None = None, digits: int | None = None) -> str:
    """The one rounding rule of every table: the value and its interval's half-width to the same
    decimals (``digits``; None: three significant digits for the value, two for the half-width)."""
    if value is None or value != value:
        return "–"
    shown = f"{value:.{digits}f}" if digits is not None else f"{value:g}"
    if half is not None and half == half:
        shown += f" ± {half:.{digits}f}" if digits is not None else f" ± {half:.2g}"
    return shown


SUPERSCRIPT = str.maketrans("0123456789", "⁰¹²³⁴⁵⁶⁷⁸⁹")  # a footnote's mark
MAX_CELL = 40  # characters: a longer cell is abbreviated and its full form given in a footnote


def shorten(text: str) -> str:
    """``text`` in at most :data:`MAX_CELL` characters: runs of three or more of a list element written
    once with their count (``[1×16]``), and what still does not fit cut with an ellipsis."""
    if len(text) <= MAX_CELL:
        return text

    def runs(match: re.Match) -> str:
        items = [i.strip() for i in match.group(1).split(",")]
        out: list[str] = []
        for item in items:
            if out and out[-1][0] == item:
                out[-1][1] += 1
            else:
                out.append([item, 1])
        return "[" + ", ".join(f"{i}×{n}" if n > 2 else ", ".join([i] * n) for i, n in out) + "]"

    text = re.sub(r"\[([^\[\]]*)\]", runs, text)
    return text if len(text) <= MAX_CELL else text[: MAX_CELL - 1] + "…"


def _strategy(df: pd.DataFrame) -> pd.Series:
    """The strategy with the options that tell its runs apart, ``hippie (recompute=auto)``."""
    parts = [df[k] if k in df else pd.Series(None, index=df.index, dtype=object) for k in ("variant", "swept")]
    return pd.Series(
        [config_name({"strategy": s, "variant": v, "swept": w}) for s, v, w in zip(df["strategy"], *parts)],
        index=df.index,
    )


def _bubble(df: pd.DataFrame) -> pd.Series:
    # a simulated row's idle share is the prediction of what a run measures (its other figures too)
    return df["bubble_measured"].where(df["simulated"] != True, df["bubble_fraction"])  # noqa: E712


def _micro_batches(df: pd.DataFrame) -> pd.Series:
    # blank where they do not apply: a strategy that moves whole minibatches ignores the setting
    return df["micro_batches"].where(~df["strategy"].isin(vocabulary.WHOLE_MINIBATCH_STRATEGIES))


def _field(name: str) -> Callable[[pd.DataFrame], pd.Series]:
    """A frame field that older records may not have (then empty)."""
    return lambda df: df[name] if name in df else pd.Series(None, index=df.index, dtype=object)


PAPER, SPEED, MEMORY, ACCURACY, IDLE = "paper", "speed", "memory", "accuracy", "idle"
_WHO = (PAPER, SPEED, MEMORY, ACCURACY, IDLE)  # what every set shows first: which runs these are
_MiB = 2**-20

COLUMNS: list[Column] = [
    Column("block", "block", lambda df: df["block"].fillna(""), config=True),
    Column("strategy", "strategy", _strategy, config=True, sets=_WHO),
    Column("workers", "workers", "world_size", config=True, sets=_WHO),
    Column("layout", "layout", lambda df: df["layout"].fillna(""), config=True, sets=_WHO),
    Column("micro_batches", "micro", _micro_batches, config=True, sets=(PAPER, SPEED, MEMORY)),
    Column("model", "model", "model", config=True),
    Column("data", "data", "data", config=True),
    Column("batch", "batch", "global_batch", config=True),
    Column("device", "device", "device", config=True),
    Column("precision", "precision", lambda df: df["precision"].fillna(""), config=True),
    Column("seed", "seed", "seed"),
    Column("status", "status", "status"),
    Column(
        "throughput",
        "samples/s",
        "throughput",
        "samples/s",
        digits=1,
        better="higher",
        figure=True,
        sets=(PAPER, SPEED),
        speed=True,
    ),
    Column(
        "speedup",
        "speedup",
        "speedup",
        "x DP",
        digits=3,
        better="higher",
        figure=True,
        sets=(PAPER, SPEED),
        speed=True,
        relative=True,
    ),
    Column(
        "step_time",
        "step ms",
        "step_time_s",
        "ms",
        scale=1e3,
        digits=1,
        better="lower",
        figure=True,
        sets=(SPEED,),
        speed=True,
    ),
    Column(
        "peak_memory",
        "peak MiB/rank",
        "peak_memory_bytes",
        "MiB",
        scale=_MiB,
        digits=1,
        better="lower",
        figure=True,
        sets=(PAPER, MEMORY),
    ),
    Column(
        "me",
        "ME",
        "me",
        "x DP",
        digits=3,
        better="higher",
        figure=True,
        sets=(PAPER, MEMORY),
        speed=True,
        relative=True,
    ),
    # the peak rank's measured breakdown (harness.metrics.meter); "other" is activations and the rest
    *(
        Column(
            memory_field(p.key),
            f"{p.short} MiB",
            memory_field(p.key),
            "MiB",
            scale=_MiB,
            digits=1,
            figure=True,
            sets=(MEMORY,),
        )
        for p in vocabulary.MEMORY
    ),
    Column(
        "top1", "top-1 %", "accuracy", "%", scale=100, digits=2, better="higher", figure=True, sets=(PAPER, ACCURACY)
    ),
    Column("final_loss", "final loss", "final_loss", digits=4, better="lower", figure=True, sets=(ACCURACY,)),
    Column(
        "time_to_target",
        "s to target",
        "time_to_target_s",
        "s",
        digits=1,
        better="lower",
        figure=True,
        sets=(ACCURACY,),
        speed=True,
    ),
    Column(
        "steps_to_target",
        "steps to target",
        "steps_to_target",
        "steps",
        digits=0,
        better="lower",
        figure=True,
        sets=(ACCURACY,),
    ),
    Column(
        "bubble",
        "bubble %",
        _bubble,
        "%",
        scale=100,
        digits=1,
        better="lower",
        figure=True,
        sets=(PAPER, SPEED, IDLE),
        speed=True,
    ),
    Column("bubble_analytic", "analytic %", "bubble_analytic", "%", scale=100, digits=1, figure=True, sets=(IDLE,)),
    Column("bubble_replayed", "replayed %", "bubble_replayed", "%", scale=100, digits=1, figure=True, sets=(IDLE,)),
    # of the job's profiled step, mean over ranks (harness.metrics.idle): the parts add up to 100
    *(
        Column(
            idle_field(p.key),
            f"{p.short} %",
            _field(idle_field(p.key)),
            "%",
            scale=100,
            digits=1,
            figure=True,
            sets=(IDLE,),
            speed=True,
        )
        for p in vocabulary.IDLE
    ),
    Column(
        "hidden_allreduce",
        "hidden AR ms",
        "hidden_allreduce_s",
        "ms",
        scale=1e3,
        digits=2,
        figure=True,
        sets=(SPEED,),
        speed=True,
    ),
    Column(
        "tflops_per_device",
        "TFLOP/s/dev",
        "tflops_per_device",
        "TFLOP/s",
        digits=3,
        figure=True,
        sets=(SPEED,),
        speed=True,
    ),
    Column("mfu", "MFU %", "mfu", "%", scale=100, digits=1, figure=True, sets=(SPEED,), speed=True),
    Column("hfu", "HFU %", "hfu", "%", scale=100, digits=1, figure=True, speed=True),
    Column("note", "note", lambda df: df["note"] if "note" in df else pd.Series("", index=df.index)),
]

DEFAULT_SET = PAPER


# read at each use, so that a column added to COLUMNS (docs: extending/metric) is in every table
def by_key(key: str) -> Column:
    return next(c for c in COLUMNS if c.key == key)


def set_names() -> list[str]:
    return [*dict.fromkeys(s for c in COLUMNS for s in c.sets), "all"]


def select(choice: str) -> list[Column]:
    """The columns of a named set (``paper``, ``speed``, ``memory``, ``accuracy``, ``idle``, ``all``)
    or of a comma-separated list of keys, in the declared order; ValueError naming what exists."""
    if choice == "all":
        return [c for c in COLUMNS if c.key not in ("block", "note")]
    if choice in set_names():
        return [c for c in COLUMNS if choice in c.sets]
    keys = [k.strip() for k in choice.split(",") if k.strip()]
    unknown = [k for k in keys if k not in {c.key for c in COLUMNS}]
    if unknown or not keys:
        raise ValueError(
            f"--columns {choice}: {', '.join(unknown) or 'nothing'} is not a column set or key; "
            f"sets: {', '.join(set_names())}; keys: {', '.join(c.key for c in COLUMNS)}"
        )
    return [by_key(k) for k in keys]
