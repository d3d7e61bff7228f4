"""One sweep against another (``pipebench results A --against B``).

A configuration is what the tables aggregate over (:func:`harness.report.tables.configuration_id`:
every setting but the seed and the repeat), less the sweep's free-form ``tag``, so that the same
configuration in two sweeps is one. Per configuration that ran in both, each measured figure of
the chosen column set gives the ratio A/B of its means over the configuration's successful runs
(failed runs are not compared; speedup and ME are each against their own sweep's DP run).

The interval is the delta method on the log of the ratio of means: with ``s`` a side's standard
deviation, ``n`` its runs and ``m`` its mean, ``se(ln R)^2 = s_A^2/(n_A m_A^2) + s_B^2/(n_B m_B^2)``,
and ``R exp(± t se)`` with Student's t at Welch–Satterthwaite degrees of freedom. A side that ran
once counts as exact (no term); where both ran once there is no interval. An interval that
excludes 1 is marked with ↑ or ↓, and set in bold where that is worse for A by the column's
direction, so that a regression stands out.

Configurations that ran in only one of the two are listed under the table (with the settings that
kept otherwise equal ones apart, such as ``train.steps``), never silently dropped.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field, replace

import pandas as pd
from scipy import stats

from harness.report import columns
from harness.report.columns import Column
from harness.report.statistics import interval, mlperf_times
from harness.report.tables import FORMATS, Table, comparison, escape_tex, to_latex, to_markdown

METHOD = "delta method on the log ratio, Student's t with Welch–Satterthwaite degrees of freedom"
SIDES = ("A", "B")
SWEEP_LABELS = ("tag",)  # identify a sweep, not a configuration: left out when matching two sweeps
RUNS = Column("runs", "runs", "runs")  # the successful runs on each side, "A 3, B 3"


def ratio_interval(a: pd.Series, b: pd.Series, confidence: float = 0.95) -> tuple[float, float, float]:
    """(mean of ``a`` / mean of ``b``, low, high): the ratio of means and its ``confidence`` interval
    by the delta method on the log ratio, with Welch–Satterthwaite degrees of freedom; NaN where
    there is no ratio (no value, a mean not above 0) or no interval (each side one value)."""
    a, b = a.astype(float).dropna(), b.astype(float).dropna()
    (mean_a, _, n_a), (mean_b, _, n_b) = interval(a), interval(b)
    nan = float("nan")
    if not (n_a and n_b and mean_b > 0 and mean_a >= 0):
        return nan, nan, nan
    ratio = mean_a / mean_b
    # each side with repeats: the variance of its log mean (delta method) and its degrees of freedom
    terms = [(v.var(ddof=1) / (n * m * m), n - 1) for v, m, n in ((a, mean_a, n_a), (b, mean_b, n_b)) if n > 1]
    if not terms or mean_a == 0:
        return ratio, nan, nan
    var = sum(t for t, _ in terms)
    if var == 0:  # repeats that all agree (a deterministic figure): the interval is the ratio itself
        return ratio, ratio, ratio
    dof = var**2 / sum(t**2 / d for t, d in terms)
    half = stats.t.ppf((1 + confidence) / 2, dof) * math.sqrt(var)
    return ratio, ratio * math.exp(-half), ratio * math.exp(half)


def across(configuration: str, ignore: tuple[str, ...] = ()) -> str:
    """A :func:`~harness.report.tables.configuration_id` without the sweep's own labels (and the
    settings ``ignore``, such as ``train.steps``): equal for the same configuration in two sweeps."""
    identity = json.loads(configuration)
    for name in (*SWEEP_LABELS, *ignore):
        _drop(identity, name)
    return json.dumps(identity, sort_keys=True)


def _drop(identity: dict, name: str) -> bool:
    """Remove an identifying field (``micro_batches``) or a setting (``train.steps``, under ``config``);
    whether it was there."""
    if name in identity:
        del identity[name]
        return True
    settings = identity.get("config") or {}  # flat: {"train.steps": 100, ...}
    if name in settings:
        del settings[name]
        return True
    return False


@dataclass
class Against:
    """The comparison of two sweeps, numeric: one row per configuration in both."""

    rows: pd.DataFrame  # identifying keys, block, runs, note; per figure <key> a, <key> b, <key> ratio/low/high
    figures: list[Column]  # the chosen set's measured figures
    identifying: list[Column]
    only: dict[str, pd.DataFrame]  # side -> identifying values of the configurations only it ran
    differing: list[str] = field(default_factory=list)  # settings that kept otherwise equal configurations apart
    names: tuple[str, str] = SIDES  # what A and B are (their sources)
    ignored: tuple[str, ...] = ()  # settings left out of the match


def _runs(df: pd.DataFrame, figures: list[Column], ignore: tuple[str, ...]) -> pd.DataFrame:
    """One row per run: identifying values, status, note, the cross-sweep configuration and each
    figure unrounded (rounding is for the eye, not for a ratio)."""
    cmp = comparison(df)
    identifying = [c for c in columns.COLUMNS if c.config]
    runs = pd.DataFrame({c.key: c.values(cmp) for c in identifying}, index=cmp.index)
    for c in figures:
        runs[c.key] = replace(c, digits=None).values(cmp)
    runs["status"], runs["note"] = cmp["status"], cmp["note"].fillna("")
    runs["configuration"] = cmp["configuration"]
    runs["match"] = [across(c, ignore) for c in cmp["configuration"]]
    return runs


def compare(
    a: pd.DataFrame,
    b: pd.DataFrame,
    choice: str = columns.DEFAULT_SET,
    names: tuple[str, str] = SIDES,
    ignore: tuple[str, ...] = (),
) -> Against:
    """Sweep ``a`` against sweep ``b`` (frames of :func:`harness.report.tables.to_frame`) on the
    measured figures of the column set or keys ``choice``, matching configurations regardless of
    the settings ``ignore``; ValueError for an unknown set, key or setting."""
    figures = [c for c in columns.select(choice) if c.figure]
    identifying = [c for c in columns.COLUMNS if c.config and c.key != "block"]
    configurations = pd.concat([a["configuration"], b["configuration"]])
    unknown = [n for n in ignore if n in SWEEP_LABELS or not any(_drop(json.loads(c), n) for c in configurations)]
    if unknown:
        raise ValueError(
            f"--ignore {','.join(unknown)}: not a setting of these runs (a key such as train.steps or micro_batches)"
        )
    runs = dict(zip(SIDES, (_runs(a, figures, ignore), _runs(b, figures, ignore))))
    keys = {s: list(dict.fromkeys(r["match"])) for s, r in runs.items()}
    both = [k for k in keys["A"] if k in set(keys["B"])]
    rows = []
    for key in both:
        group = {s: r[r["match"] == key] for s, r in runs.items()}
        ok = {s: g[g["status"] == "ok"] for s, g in group.items()}
        first = group["A"].iloc[0]
        row = {c.key: first[c.key] for c in identifying}
        row["block"] = first["block"]
        row["runs"] = ", ".join(
            f"{s} {len(ok[s])}" + (f" (+{len(group[s]) - len(ok[s])} failed)" if len(group[s]) > len(ok[s]) else "")
            for s in SIDES
        )
        for s in SIDES:
            row[f"runs {s}"], row[f"failed {s}"] = len(ok[s]), len(group[s]) - len(ok[s])
        for c in figures:
            values = {s: mlperf_times(o[c.key]) if c.key == "time_to_target" else o[c.key] for s, o in ok.items()}
            for s in SIDES:
                row[f"{c.key} {s}"] = interval(values[s])[0]
            row[f"{c.key} ratio"], row[f"{c.key} low"], row[f"{c.key} high"] = ratio_interval(values["A"], values["B"])
        notes = {s: set(group[s]["note"]) - {""} for s in SIDES}
        row["note"] = "; ".join(
            f"{' and '.join(s for s in SIDES if n in notes[s])}: {n}" for n in sorted(notes["A"] | notes["B"])
        )
        rows.append(row)
    frame = pd.DataFrame(rows, columns=[*(c.key for c in identifying), "block", "runs", "note"] if not rows else None)
    only = {s: runs[s][runs[s]["match"].isin(set(keys[s]) - set(both))].drop_duplicates("match") for s in SIDES}
    return Against(frame, figures, identifying, only, _differing(only), names, tuple(ignore))


def _differing(only: dict[str, pd.DataFrame]) -> list[str]:
    """The settings in which a configuration only in A differs from one only in B that is the same
    in everything else, as ``train.steps (40 in A, 100 in B)``."""
    seen: dict[str, set] = {}
    for ka in only["A"]["match"]:
        for kb in only["B"]["match"]:
            ia, ib = json.loads(ka), json.loads(kb)
            if {k: v for k, v in ia.items() if k != "config"} != {k: v for k, v in ib.items() if k != "config"}:
                continue
            fa, fb = ia.get("config") or {}, ib.get("config") or {}
            for name in sorted(set(fa) | set(fb)):
                if fa.get(name) != fb.get(name):
                    seen.setdefault(name, set()).add((str(fa.get(name)), str(fb.get(name))))
    return [
        f"{name} (" + " or ".join(f"{x} in A, {y} in B" for x, y in sorted(pairs)) + ")" for name, pairs in seen.items()
    ]


# -- the table ----------------------------------------------------------------


def _ratio_text(row: pd.Series, c: Column) -> tuple[str, bool]:
    """``1.043 [0.990, 1.100] ↑`` and whether it is worse for A (an interval excluding 1 in the
    column's wrong direction)."""
    ratio, low, high = row[f"{c.key} ratio"], row[f"{c.key} low"], row[f"{c.key} high"]
    if ratio != ratio:
        return "–", False
    if low != low:
        return f"{ratio:.3f}", False
    text = f"{ratio:.3f} [{low:.3f}, {high:.3f}]"
    up, down = low > 1, high < 1
    if up or down:
        text += " ↑" if up else " ↓"
    return text, (up and c.better == "lower") or (down and c.better == "higher")


def _plain(value) -> str:
    return "–" if value is None or value != value else str(value)


def describe(values: pd.Series, shown: list[Column]) -> str:
    """One configuration in a line: its strategy and the identifying values that tell it apart."""
    return " ".join(
        [str(values["strategy"])] + [f"{c.label} {_plain(values[c.key])}" for c in shown if c.key != "strategy"]
    )


@dataclass
class _AgainstTable(Table):
    text: str = ""  # the caption

    def caption_text(self) -> str:
        return self.text


def _caption(result: Against, constant: list[str]) -> str:
    keys = {c.key for c in result.figures}
    text = (
        f"A {result.names[0]} against B {result.names[1]}: per configuration in both, each figure's mean in A "
        "over its mean in B (successful runs only: failed runs are not compared)"
    )
    if keys & {"speedup", "me"}:
        text += "; speedup and ME against each sweep's own DP run"
    if result.ignored:
        text += f"; matched regardless of {', '.join(result.ignored)}"
    text += (
        f"; [low, high] is the 95% interval of the ratio ({METHOD}), none where both ran once; "
        "↑/↓ the interval excludes 1, bold where that is worse for A"
    )
    return text + ("; " + "; ".join(constant) if constant else "") + "."


def _unmatched(result: Against) -> str:
    """``only in A: ...; only in B: ...``, and what kept otherwise equal configurations apart."""
    shown = [
        c
        for c in result.identifying
        if pd.concat([result.only[s][c.key] for s in SIDES]).astype(str).nunique() > 1 or c.key == "strategy"
    ]
    parts = [
        f"only in {s}: " + (", ".join(describe(r, shown) for _, r in result.only[s].iterrows()) or "none")
        for s in SIDES
    ]
    text = "; ".join(parts) + "."
    if result.differing:
        text += (
            " Otherwise equal configurations differ in "
            + "; ".join(result.differing)
            + ": --ignore "
            + ",".join(d.split(" ")[0] for d in result.differing)
            + " compares them."
        )
    return text


def table(result: Against) -> Table:
    """The comparison as a :class:`~harness.report.tables.Table` of ratio cells (text), for the
    Markdown and LaTeX writers of the other tables."""
    rows = result.rows.copy()
    context = [*result.identifying, RUNS]
    varying = [c for c in context if rows[c.key].astype(str).nunique() > 1]
    constant = [
        f"{c.label} {_plain(rows[c.key].iloc[0])}"
        for c in context
        if c not in varying and len(rows) and _plain(rows[c.key].iloc[0]) not in ("", "–")
    ]
    bold = set()
    shown_figures = [replace(c, figure=True) for c in result.figures]  # right-aligned text
    for c in result.figures:
        cells = [_ratio_text(row, c) for _, row in rows.iterrows()]
        rows[c.key] = [t for t, _ in cells]
        bold |= {(i, c.key) for i, (_, worse) in zip(rows.index, cells) if worse}
    rows["_section"] = rows["block"]
    return _AgainstTable(rows, varying + shown_figures, [], [], False, bold, text=_caption(result, constant))


def to_csv(result: Against) -> str:
    """Every identifying column, the runs and per figure both means, the ratio and its interval,
    numeric; configurations only in one sweep as rows with ``in`` saying which."""

    def frame(rows: pd.DataFrame, where: str) -> pd.DataFrame:
        out = {"in": [where] * len(rows), "block": list(rows["block"])}
        out.update({c.csv_header: list(rows[c.key]) for c in result.identifying})
        for s in SIDES:
            out[f"runs_{s.lower()}"] = list(rows[f"runs {s}"]) if f"runs {s}" in rows else [None] * len(rows)
            out[f"failed_{s.lower()}"] = list(rows[f"failed {s}"]) if f"failed {s}" in rows else [None] * len(rows)
        for c in result.figures:
            for s in SIDES:
                out[f"{c.csv_header}_{s.lower()}"] = (
                    list(rows[f"{c.key} {s}"]) if f"{c.key} {s}" in rows else [None] * len(rows)
                )
            for part in ("ratio", "low", "high"):
                name = f"{c.key}_ratio" if part == "ratio" else f"{c.key}_ratio_{part}"
                out[name] = list(rows[f"{c.key} {part}"]) if f"{c.key} {part}" in rows else [None] * len(rows)
        out["note"] = list(rows["note"]) if "note" in rows else [""] * len(rows)
        return pd.DataFrame(out)

    parts = [frame(result.rows, "both")] + [frame(result.only[s], f"{s} only") for s in SIDES]
    return pd.concat([p for p in parts if len(p)] or parts[:1], ignore_index=True).to_csv(index=False)


def _latex_arrows(text: str) -> str:
    return text.replace("↑", r"$\uparrow$").replace("↓", r"$\downarrow$")


def render(result: Against, fmt: str, name: str = "against") -> str:
    if fmt == "csv":
        return to_csv(result).rstrip("\n")
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt}; use {', '.join(FORMATS)}")
    shown = table(result)
    unmatched = _unmatched(result)
    if fmt == "md":
        body = (
            to_markdown(shown)
            if len(result.rows)
            else f"*{shown.caption_text()}*\n\nNo configuration ran in both A and B."
        )
        return f"{body}\n\n{unmatched[0].upper()}{unmatched[1:]}"
    tex = to_latex(shown, name)
    end = r"\end{table*}"
    extra = rf"\par\smallskip\footnotesize {escape_tex(unmatched[0].upper() + unmatched[1:])}"
    return _latex_arrows(tex[: -len(end)] + extra + "\n" + end)


def write(result: Against, out_dir: str, name: str = "against") -> list[str]:
    """against.{md,csv,tex} in ``out_dir``; returns their paths."""
    os.makedirs(out_dir, exist_ok=True)
    written = []
    for fmt, ext in FORMATS.items():
        path = os.path.join(out_dir, f"against.{ext}")
        with open(path, "w") as f:
            f.write(render(result, fmt, name) + "\n")
        written.append(path)
    return written
