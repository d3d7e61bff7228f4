"""Comparison tables from run records (``pipebench results`` prints them).

A source is a sweep or run directory (every ``metrics.json`` below it), a
``metrics.json`` file, a wandb offline run folder (the record is saved in its
``files/``), or ``wandb:entity/project[/group]`` (the runs' summaries, online).

Runs are grouped by model, data, world size, global batch and device (a simulated
cluster counts as a device). Within a group:
- speedup = throughput / DP throughput;
- ME (memory-efficiency index, Hippie's definition) = speedup / (peak memory / DP peak memory),
  with the peak taken as the maximum over ranks;
A group without a successful DP run says so (no speedup is invented); failed runs stay in
the table, marked failed. Where the same configuration ran several times (seeds, or
``repeat=0,1,2``), the table gives per figure the mean, the half-width of its 95%
confidence interval (Student's t) and the number of runs; time to target follows
MLPerf's rule (of five runs the fastest and the slowest are dropped), and beside it the steps
to target (the first evaluated step at or above ``train.target_accuracy``, which does not
depend on the machine's speed) and how many runs reached the target at all.

A table shows a named set of the declared columns (:mod:`harness.report.columns`); a
column that identifies runs but is the same in every row moves into the caption, the sweep's
blocks become sections, and notes become footnotes. The CSV keeps every identifying column
in every row, for programs.
"""

from __future__ import annotations

import glob
import json
import numbers
import os
import sys
from dataclasses import dataclass, field

import pandas as pd

from harness.core.vocabulary import MEMORY_PARTS, REFERENCE_STRATEGY, idle_field, memory_field
from harness.report import columns
from harness.report.checks import impossible
from harness.report.columns import MAX_CELL, SUPERSCRIPT, Column, shorten
from harness.report.environment import environment
from harness.report.figure_data import FigureContractError
from harness.report.figures import all_figures
from harness.report.paired import against_reference
from harness.report.paired import to_markdown as paired_markdown
from harness.report.record import RECORD_FILE, diverged_at, mark_swept, natural_key, read, settings
from harness.report.schema import RecordError, validate
from harness.report.statistics import interval, mlperf_times, steps_to_target

# the device is "cpu", "cuda" or "simulated:<cluster>": simulated rows compare with simulated DP
# (and precision: a bf16 run's speedup is over DP in bf16)
GROUP_KEYS = ["model", "data", "world_size", "global_batch", "device", "precision"]


def _fields() -> list[str]:
    """The record fields a table reads: the declared columns' own, and what the comparison itself uses."""
    return sorted(
        {c.source for c in columns.COLUMNS if isinstance(c.source, str)}
        | {
            "block",
            "started_at",
            "strategy",
            "variant",
            "layout",
            "precision",
            "repeat",
            "step_time_s",
            "bubble_measured",
            "bubble_fraction",
            "error",
            "path",
            "simulated",
            "speed_comparable",
            "workers_on_host",
            "threads_per_worker",
            "host_cores",
            "configuration",
            "swept",
            "diverged_at_step",
            "figure_errors",
            *GROUP_KEYS,
        }
    )


# -- reading ------------------------------------------------------------------


def _inside_wandb(path: str) -> bool:
    return "wandb" in os.path.normpath(path).split(os.sep)


def find_records(sources: list[str]) -> list[str]:
    paths: list[str] = []
    for src in sources:
        if os.path.isfile(src):
            paths.append(src)
            continue
        found = sorted(glob.glob(os.path.join(src, "**", RECORD_FILE), recursive=True))
        if not _inside_wandb(os.path.abspath(src)):
            # a run's wandb mirror keeps a copy of its record: below a sweep, count each run once
            found = [p for p in found if not _inside_wandb(os.path.relpath(p, src))]
        paths.extend(found)
    return paths


def load_raw(sources: list[str]) -> list[dict]:
    """Every record, whole (curves and per-rank details included)."""
    records = []
    for src in sources:
        if src.startswith("wandb:"):
            records.extend(_wandb_records(src[len("wandb:") :]))
            continue
        for path in find_records([src]):
            try:
                rec = read(path)
            except RecordError as e:  # an older record or another tool's file: not ours to tabulate
                print(f"skipping {e}", file=sys.stderr)
                continue
            except (OSError, ValueError) as e:  # ours, but damaged: it stays in the table, as failed
                rec = {"status": "failed", "error": f"unreadable record: {e}"}
            rec["path"] = os.path.dirname(path)
            records.append(rec)
    return mark_swept(records)


def _wandb_records(path: str) -> list[dict]:
    """Runs of ``entity/project[/group]`` through the wandb API (needs network and a login)."""
    import wandb  # lazy: importing wandb costs about a second, and only this source needs it here

    parts = path.strip("/").split("/")
    if len(parts) not in (2, 3):
        raise SystemExit(f"error: wandb source must be wandb:entity/project[/group], got wandb:{path}")
    filters = {"group": parts[2]} if len(parts) == 3 else {}
    runs = wandb.Api().runs("/".join(parts[:2]), filters=filters)
    records = []
    for run in runs:
        rec = {k: v for k, v in dict(run.summary).items() if not k.startswith("_")}
        if run.job_type != "train" or rec.get("schema_version") is None:  # comparison runs, other tools' runs
            continue
        try:
            validate(rec, run.url)
        except RecordError as e:
            print(f"skipping {e}", file=sys.stderr)
            continue
        rec["path"] = run.url
        records.append(rec)
    return records


# what makes two runs the same configuration, besides their config's settings: seeds and repeats differ
_IDENTITY = (
    "strategy",
    "variant",
    "model",
    "data",
    "world_size",
    "global_batch",
    "micro_batches",
    "device",
    "tag",
    "cluster",
    "replicas",
    "boundaries",
)


def configuration_id(record: dict) -> str:
    """Equal for runs of one configuration (every setting but the seed and the repeat), else different."""
    return json.dumps(
        {**{k: record.get(k) for k in _IDENTITY}, "config": settings(record)}, sort_keys=True, default=str
    )


def layout_text(record: dict) -> str:
    """Workers per stage and the cut, e.g. ``[1, 3] cut [3]`` (a planned run shows its plan)."""
    replicas, boundaries = record.get("replicas"), record.get("boundaries")
    text = str(replicas) if replicas else ""
    return f"{text} cut {boundaries}".strip() if boundaries else text


def peak_rank_memory(record: dict) -> dict:
    """The measured memory breakdown of the rank with the highest peak (``memory_<part>`` bytes)."""
    ranks = [r for r in record.get("per_rank") or [] if r.get("memory_breakdown") and r.get("peak_memory_bytes")]
    if not ranks:
        return {}
    parts = max(ranks, key=lambda r: r["peak_memory_bytes"])["memory_breakdown"]
    return {memory_field(p): parts.get(p) for p in MEMORY_PARTS}


def to_frame(records: list[dict]) -> pd.DataFrame:
    rows = [
        {
            **{k: v for k, v in r.items() if not isinstance(v, (dict, list)) or k == "peak_memory_per_rank"},
            **peak_rank_memory(r),
            **{idle_field(k): v for k, v in (r.get("idle_breakdown") or {}).items()},
            "layout": layout_text(r),
            "configuration": configuration_id(r),
            "steps_to_target": steps_to_target(r),
            "diverged_at_step": diverged_at(r.get("loss_curve")),
            # checked again here: a record edited or written before the checks existed is caught
            "figure_errors": "; ".join(impossible(r)),
        }
        for r in records
    ]
    df = pd.DataFrame(rows)
    for col in _fields():
        if col not in df.columns:
            df[col] = None
    return df


def load_records(sources: list[str]) -> pd.DataFrame:
    return to_frame(load_raw(sources))


# -- comparison ---------------------------------------------------------------


def comparison(df: pd.DataFrame) -> pd.DataFrame:
    """Add speedup and ME against the DP run(s) of each group (the median DP if several seeds;
    :data:`~harness.core.vocabulary.REFERENCE_STRATEGY`)."""
    if df.empty:
        return df.reindex(columns=list(dict.fromkeys([*_fields(), "speedup", "me", "note"])))
    df = df.copy()
    df["speedup"] = float("nan")
    df["me"] = float("nan")
    df["note"] = ""
    ok = df["status"] == "ok"
    for _, idx in df.groupby(GROUP_KEYS, dropna=False).groups.items():
        group = df.loc[idx]
        dp = group[(group["strategy"] == REFERENCE_STRATEGY) & (group["status"] == "ok")]
        if dp.empty:
            df.loc[idx, "note"] = "no DP run in this group: no speedup or ME"
            continue
        dp_tp = dp["throughput"].astype(float).median()
        dp_mem = dp["peak_memory_bytes"].astype(float).median()
        sel = idx[ok.loc[idx].to_numpy()]
        speedup = df.loc[sel, "throughput"].astype(float) / dp_tp
        df.loc[sel, "speedup"] = speedup
        df.loc[sel, "me"] = speedup / (df.loc[sel, "peak_memory_bytes"].astype(float) / dp_mem)
        # DP's runs are the reference (their median, where several): its ratios are 1 by definition
        df.loc[dp.index, ["speedup", "me"]] = 1.0
    diverged = ok & df["diverged_at_step"].notna()
    df.loc[diverged, "note"] = [
        f"diverged: training loss not finite from step {s:.0f}" for s in df.loc[diverged, "diverged_at_step"]
    ]
    unsound = ok & (df["figure_errors"].fillna("") != "")
    df.loc[unsound, "note"] = [
        "; ".join(filter(None, [n, f"impossible figures: {e}"]))
        for n, e in zip(df.loc[unsound, "note"], df.loc[unsound, "figure_errors"])
    ]
    failed = df["status"] != "ok"
    df.loc[failed, "note"] = ("failed: " + df.loc[failed, "error"].fillna("no error recorded")).to_numpy()
    simulated = df["simulated"] == True  # noqa: E712
    df.loc[simulated, "note"] = ("simulated; " + df.loc[simulated, "note"].fillna("")).str.rstrip("; ")
    crowded = (df["speed_comparable"] == False) & ok  # noqa: E712
    df.loc[crowded, "note"] = [
        f"speed and bubble not comparable: {w:.0f} workers x {t:.0f} threads on {c:.0f} cores" + (f"; {n}" if n else "")
        for w, t, c, n in zip(
            df.loc[crowded, "workers_on_host"],
            df.loc[crowded, "threads_per_worker"],
            df.loc[crowded, "host_cores"],
            df.loc[crowded, "note"],
        )
    ]
    # blocks in the order the sweep ran them (their first run's start), then the groups and
    # strategies within each
    df["block"] = df["block"].fillna("")
    started = df.groupby("block")["started_at"].min().fillna("").sort_values(kind="stable")
    df["_block_order"] = df["block"].map({b: i for i, b in enumerate(started.index)})
    # runs that differ in a swept setting in the order of its values (lr=0.03 before lr=0.3 and lr=10)
    swept = sorted(set(df["swept"].fillna("")), key=natural_key)
    df["_swept_order"] = df["swept"].fillna("").map({text: i for i, text in enumerate(swept)})
    df = df.sort_values(["_block_order"] + GROUP_KEYS + ["strategy", "_swept_order"], kind="stable")
    return df.drop(columns=["_block_order", "_swept_order"]).reset_index(drop=True)


# -- the table ----------------------------------------------------------------

# only where a configuration ran more than once: how many of its runs succeeded, how many reached the target
RUNS = Column("runs", "runs", "runs")
REACHED = Column("reached_target", "reached target", "reached_target")


@dataclass
class Table:
    """A comparison ready to print: one row per run, or per configuration where any ran more than
    once (figures as means, their 95% half-widths in ``<key> ci95``)."""

    rows: pd.DataFrame  # by column key, each value in its column's unit
    shown: list[Column]  # the columns people read: the chosen set and the identifying ones that vary
    every: list[Column]  # the columns of the CSV: the chosen set and every identifying one
    caption: list[str]  # the identifying columns that are the same in every row ("model vit_micro", ...)
    repeated: bool
    bold: set[tuple[int, str]] = field(default_factory=set)  # (row, key) of each group's unique best
    full: dict[int, list[str]] = field(default_factory=dict)  # per row, the cells too long to show whole
    absent: list[str] = field(default_factory=list)  # the chosen figures no run has

    @property
    def blocks(self) -> list[str]:
        """The sweep's blocks in order, where it has more than one."""
        names = list(dict.fromkeys(self.rows["block"]))
        return names if len(names) > 1 else []

    @property
    def sections(self) -> list[str]:
        """The table's sections in order, where it has more than one: the sweep's blocks, and within
        them the comparison groups that differ in more than workers (model, data, batch, device or
        precision)."""
        names = list(dict.fromkeys(self.rows["_section"]))
        return names if len(names) > 1 else []

    def row_note(self, i: int) -> str:
        """Row ``i``'s footnote: its note and the full form of each abbreviated cell."""
        return "; ".join(filter(None, [self.rows.at[i, "note"], *self.full.get(i, [])]))

    def notes(self) -> dict[str, int]:
        """Each distinct footnote, numbered from 1 in the order of the rows."""
        found = (self.row_note(i) for i in self.rows.index)
        return {n: i + 1 for i, n in enumerate(dict.fromkeys(n for n in found if n))}

    def caption_text(self) -> str:
        parts = list(self.caption)
        if len(set(self.rows["block"])) == 1 and self.rows["block"].iloc[0]:
            parts.insert(0, f"block {self.rows['block'].iloc[0]}")
        text = "; ".join(parts)
        keys = {c.key for c in self.shown}
        if keys & {"speedup", "me"}:
            text += (
                ". Speedup and ME against DP with the same model, data, workers, batch, device and precision"
                " (DP's rows are that reference: 1 by definition)"
            )
        if "peak_memory" in keys:
            text += "; peak memory is the largest over ranks"
        if self.repeated:
            text += "; mean ± half-width of the 95% interval over each configuration's runs"
        if self.absent:
            text += f"; no run has {', '.join(self.absent)}"
        return text + "."


def build(df: pd.DataFrame, choice: str = columns.DEFAULT_SET) -> Table:
    """The comparison of the runs in ``df`` (:func:`to_frame`) as a table of the column set or keys
    ``choice``; ValueError for an unknown set or key."""
    chosen = columns.select(choice)
    cmp = comparison(df)
    runs = pd.DataFrame({c.key: c.values(cmp) for c in columns.COLUMNS}, index=cmp.index)
    runs["configuration"] = cmp["configuration"]
    runs["_comparable"] = (cmp["speed_comparable"] != False).to_numpy()  # noqa: E712
    # a run that diverged or holds an impossible figure is never a column's best
    runs["_sound"] = (cmp["diverged_at_step"].isna() & (cmp["figure_errors"].fillna("") == "")).to_numpy()
    runs["_group"] = [json.dumps(g, default=str) for g in zip(cmp["block"], *(cmp[k] for k in GROUP_KEYS))]
    runs["_reference"] = (cmp["strategy"] == REFERENCE_STRATEGY).to_numpy()
    repeated = bool(runs["configuration"].duplicated().any())
    rows = _aggregated(runs) if repeated else runs.reset_index(drop=True)

    identifying = [c for c in columns.COLUMNS if (c.config or c.key in ("seed", "status")) and c.key != "block"]
    extra = [RUNS] if repeated else []
    if repeated and any(c.key == "steps_to_target" for c in chosen):
        extra.append(REACHED)
    context = [c for c in identifying + [RUNS] * repeated if c not in chosen and c.key != "status"]
    varying = [c for c in context if rows[c.key].astype(str).nunique() > 1]
    caption = [
        f"{c.label} {_plain(rows[c.key].iloc[0])}"
        for c in context
        if c not in varying and _plain(rows[c.key].iloc[0]) not in ("", "–")
    ]
    # comparison groups that differ in more than workers are sections, not columns
    sectioned = [c for c in varying if c.key in _SECTIONED]
    rows["_section"] = [
        "; ".join(filter(None, [b, *(f"{c.label} {_plain(v)}" for c, v in zip(sectioned, values))]))
        for b, *values in zip(rows["block"], *(rows[c.key] for c in sectioned))
    ]
    shown = [c for c in columns.COLUMNS if c in chosen or (c in varying and c not in sectioned)] + [
        c for c in extra if c in varying or c not in context
    ]
    # a figure no run has (top-1 of simulated runs) is said once in the caption, not as a column of
    # dashes; a setting that applies to no run (DP's micro-batches) is left out
    empty = [c for c in shown if len(rows) and rows[c.key].map(lambda v: v is None or v != v or v == "").all()]
    absent = [c for c in empty if c.figure]
    shown = [c for c in shown if c not in empty]
    every = [c for c in columns.COLUMNS if c in chosen or c in identifying] + extra
    table = Table(rows, shown, every, caption, repeated, absent=[c.label for c in absent])
    table.bold = _best(table)
    for c in shown:
        for i in rows.index:
            text = _cell(table, i, c)
            if not c.figure and len(text) > MAX_CELL:
                table.full.setdefault(i, []).append(f"{c.label} {text}")
    return table


# the comparison's group keys (GROUP_KEYS) other than the workers, as column keys: where they vary,
# each group is a section of its own
_SECTIONED = ("model", "data", "batch", "device", "precision")


def _aggregated(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per configuration: its identifying values, and per figure the mean of its successful
    runs and the half-width of the 95% interval (``<key> ci95``)."""
    out = []
    for _, group in runs.groupby("configuration", sort=False):
        row = {c.key: group[c.key].iloc[0] for c in columns.COLUMNS if c.config}
        row.update({k: group[k].iloc[0] for k in ("_comparable", "_group", "_reference", "configuration")})
        row["_sound"] = bool(group["_sound"].all())
        ok = group[group["status"] == "ok"]
        row["status"] = "ok" if len(ok) == len(group) else "failed"
        row["seed"] = ",".join(sorted({str(s) for s in group["seed"].dropna()}, key=lambda s: (len(s), s)))
        row["runs"] = f"{len(ok)}/{len(group)} ok"
        # the times to target average the runs that reached it: say how many did
        row["reached_target"] = f"{ok['steps_to_target'].notna().sum()}/{len(ok)}"
        for c in columns.COLUMNS:
            if c.figure:
                values = mlperf_times(ok[c.key]) if c.key == "time_to_target" else ok[c.key]
                mean, half, _ = interval(values)
                if c.relative and row["_reference"]:  # the reference's ratio to itself: 1, no interval
                    half = float("nan")
                row[c.key], row[f"{c.key} ci95"] = mean, half
        row["note"] = "; ".join(sorted({n for n in group["note"] if n}))
        out.append(row)
    return pd.DataFrame(out)


def _best(table: Table) -> set[tuple[int, str]]:
    """Per group, the cells of a column with a better direction holding its unique best value,
    among the successful runs that neither diverged nor hold an impossible figure (and, for speed figures, the runs whose speed is comparable); with
    repeats, only where its 95% interval does not overlap the runner-up's (a best that the
    noise could reverse is not set apart)."""
    bold = set()
    rows = table.rows
    for c in table.shown:
        if not c.better:
            continue
        values = pd.to_numeric(rows[c.key], errors="coerce")
        if c.digits is not None:  # a best is one the printed table shows apart
            values = values.round(c.digits)
        eligible = (rows["status"] == "ok") & rows["_sound"] & values.notna() & (rows["_comparable"] | (not c.speed))
        for _, idx in rows[eligible].groupby("_group").groups.items():
            group = values.loc[idx]
            if len(group) < 2:
                continue
            ranked = group.sort_values(ascending=c.better != "higher")
            (first, best), (second, runner_up) = list(ranked.items())[:2]
            if best == runner_up:
                continue
            halves = rows[f"{c.key} ci95"].fillna(0.0) if f"{c.key} ci95" in rows else pd.Series(0.0, rows.index)
            if abs(best - runner_up) > halves.loc[first] + halves.loc[second]:
                bold.add((first, c.key))
    return bold


def _plain(value) -> str:
    if value is None or (isinstance(value, float) and value != value):
        return "–"
    return f"{value:g}" if isinstance(value, float) else str(value)


def _cell(table: Table, i: int, c: Column) -> str:
    half = table.rows.at[i, f"{c.key} ci95"] if f"{c.key} ci95" in table.rows else None
    return c.text(table.rows.at[i, c.key], half)


def _shown(table: Table, i: int, c: Column) -> str:
    """A cell as printed: identifying text abbreviated (:func:`~harness.report.columns.shorten`; the
    footnote holds the full form)."""
    text = _cell(table, i, c)
    return text if c.figure else shorten(text)


def _numeric(table: Table, c: Column) -> bool:
    values = table.rows[c.key].dropna()
    return c.figure or (
        len(values) > 0 and all(isinstance(v, numbers.Real) and not isinstance(v, bool) for v in values)
    )


def _sections(table: Table) -> list[tuple[str, list[int]]]:
    """(section, its rows) in order; one untitled section where the table has one."""
    if not table.sections:
        return [("", list(table.rows.index))]
    return [(b, list(table.rows.index[table.rows["_section"] == b])) for b in table.sections]


def to_markdown(table: Table) -> str:
    notes = table.notes()
    header = [c.label for c in table.shown]
    align = ["right" if _numeric(table, c) else "left" for c in table.shown]
    parts = [f"*{table.caption_text()}*"]
    for block, idx in _sections(table):
        cells = []
        for i in idx:
            row = [_shown(table, i, c) for c in table.shown]
            row = [f"**{v}**" if (i, c.key) in table.bold else v for v, c in zip(row, table.shown)]
            note = table.row_note(i)
            if note:
                row[0] += str(notes[note]).translate(SUPERSCRIPT)
            cells.append(row)
        grid = pd.DataFrame(cells, columns=header).to_markdown(index=False, colalign=align, disable_numparse=True)
        parts += [f"**{block}**\n\n{grid}" if block else grid]
    if notes:
        parts.append("\n".join(f"{str(n).translate(SUPERSCRIPT)} {text}  " for text, n in notes.items()).rstrip())
    return "\n\n".join(parts)


def _printed(values: pd.Series, c: Column) -> pd.Series:
    """A figure's values to the decimals its cells print (the one rounding rule), numeric."""
    if not c.figure or c.digits is None:
        return values
    return pd.to_numeric(values, errors="coerce").round(c.digits)


def to_csv(table: Table) -> str:
    return frame_for_programs(table).to_csv(index=False)


def frame_for_programs(table: Table) -> pd.DataFrame:
    """Every identifying column and the chosen figures, numeric, under snake_case headers with units."""
    out = {}
    if table.blocks:
        out["block"] = table.rows["block"]
    for c in table.every:
        out[c.csv_header] = _printed(table.rows[c.key], c)
        if f"{c.key} ci95" in table.rows and c.figure:
            out[f"{c.csv_header}_ci95"] = _printed(table.rows[f"{c.key} ci95"], c)
    out["note"] = table.rows["note"]
    return pd.DataFrame(out)


_LATEX_SPECIAL = {
    "\\": r"\textbackslash{}",
    "&": r"\&",
    "%": r"\%",
    "$": r"\$",
    "#": r"\#",
    "_": r"\_",
    "{": r"\{",
    "}": r"\}",
    "~": r"\textasciitilde{}",
    "^": r"\textasciicircum{}",
    "–": "--",
    "±": r"$\pm$",
    "≥": r"$\geq$",
    "×": r"$\times$",
}


def escape_tex(text: str) -> str:
    return "".join(_LATEX_SPECIAL.get(ch, ch) for ch in str(text))


def to_latex(table: Table, name: str = "results") -> str:
    """A booktabs ``table*`` float: caption and label, numbers right-aligned, blocks as sections,
    notes under the rule; needs ``\\usepackage{booktabs}``."""
    notes = table.notes()
    n = len(table.shown)
    spec = "".join("r" if _numeric(table, c) else "l" for c in table.shown)
    # table*: a 10-column table spans both columns of a two-column paper (in one column, as table)
    lines = [
        r"\begin{table*}[t]",
        r"\centering",
        r"\footnotesize",
        r"\setlength{\tabcolsep}{3pt}",
        rf"\caption{{{escape_tex(table.caption_text())}}}",
        rf"\label{{tab:{''.join(ch if ch.isalnum() else '-' for ch in name)}}}",
        rf"\begin{{tabular}}{{{spec}}}",
        r"\toprule",
        " & ".join(escape_tex(c.label) for c in table.shown) + r" \\",
    ]
    for block, idx in _sections(table):
        lines.append(r"\midrule")
        if block:
            lines.append(rf"\multicolumn{{{n}}}{{l}}{{\textit{{{escape_tex(block)}}}}} \\")
        for i in idx:
            cells = [escape_tex(_shown(table, i, c)) for c in table.shown]
            cells = [rf"\textbf{{{v}}}" if (i, c.key) in table.bold else v for v, c in zip(cells, table.shown)]
            note = table.row_note(i)
            if note:
                cells[0] += rf"\textsuperscript{{{notes[note]}}}"
            lines.append(" & ".join(cells) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}"]
    if notes:
        lines.append(r"\par\smallskip\footnotesize")
        lines += [rf"\textsuperscript{{{k}}}\,{escape_tex(text)}\\" for text, k in notes.items()]
    lines.append(r"\end{table*}")
    return "\n".join(lines)


FORMATS = {"md": "md", "csv": "csv", "latex": "tex"}  # format -> file extension


def render(df: pd.DataFrame, fmt: str, choice: str = columns.DEFAULT_SET, name: str = "results") -> str:
    table = build(df, choice)
    if fmt == "md":
        return to_markdown(table)
    if fmt == "csv":
        return to_csv(table).rstrip("\n")
    if fmt == "latex":
        return to_latex(table, name)
    raise ValueError(f"unknown format {fmt}; use {', '.join(FORMATS)}")


def write_outputs(
    sources: list[str] | list[dict],
    out_dir: str,
    choice: str = columns.DEFAULT_SET,
    machine: bool = False,
    figures: bool = True,
) -> tuple[str, list[str], list[str]]:
    """Tables (md, csv, tex) and figures for ``sources`` (or records already read) into ``out_dir``
    (and, at a sweep's end, this machine's description); returns the Markdown table, the files
    written and the figures not drawn for breaking the contract (why, in one line each). The
    LaTeX label is the folder's name."""
    records = mark_swept(sources) if sources and isinstance(sources[0], dict) else load_raw(sources)
    df = to_frame(records)
    os.makedirs(out_dir, exist_ok=True)
    name = os.path.basename(os.path.normpath(out_dir))
    tables = {fmt: render(df, fmt, choice, name) for fmt in FORMATS}
    written = []
    for fmt, ext in FORMATS.items():
        path = os.path.join(out_dir, f"results.{ext}")
        with open(path, "w") as f:
            f.write(tables[fmt] + "\n")
        written.append(path)
    pairs = against_reference(records)
    if pairs is not None:  # seeds of an accuracy study: each configuration against DP's run of its seed
        for path, text in (
            (os.path.join(out_dir, "paired.md"), paired_markdown(pairs)),
            (os.path.join(out_dir, "paired.csv"), pairs.to_csv(index=False).rstrip("\n")),
        ):
            with open(path, "w") as f:
                f.write(text + "\n")
            written.append(path)
    if machine:
        with open(os.path.join(out_dir, "machine.json"), "w") as f:
            json.dump(environment(), f, indent=1)
    broken = []
    if figures:
        folder = os.path.join(out_dir, "figures")
        before = set(os.listdir(folder)) if os.path.isdir(folder) else set()
        try:
            drawn = all_figures(records, folder)
        except FigureContractError as e:  # the tables and every other figure are written
            drawn = e.paths
            broken.append(str(e))
        written += drawn
        # the folder is this command's: a figure today's code no longer draws goes (a rerun that
        # changes which figures apply leaves none of the old ones beside the new)
        for stale in before - {os.path.basename(p) for p in drawn}:
            if stale.endswith((".png", ".pdf", ".json")):
                os.remove(os.path.join(folder, stale))
    return tables["md"], written, broken
