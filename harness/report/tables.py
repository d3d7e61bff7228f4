"""Comparison tables from run records (``python -m harness.results`` prints them).

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
"""

from __future__ import annotations

import glob
import json
import os
import sys

import pandas as pd

from harness.report import columns
from harness.report.columns import column, config_labels, figure_labels
from harness.report.environment import environment
from harness.report.figures import all_figures
from harness.report.record import RECORD_FILE, read
from harness.report.schema import RecordError, validate
from harness.report.statistics import interval, mlperf_times, steps_to_target

# speedup and ME are against this strategy's runs in the same group (the DP reference)
REFERENCE_STRATEGY = "dp"

# the device is "cpu", "cuda" or "simulated:<cluster>": simulated rows compare with simulated DP
# (and precision: a bf16 run's speedup is over DP in bf16)
GROUP_KEYS = ["model", "data", "world_size", "global_batch", "device", "precision"]
def _fields() -> list[str]:
    """The record fields a table reads: the declared columns' own, and what the comparison itself uses."""
    return sorted({c.source for c in columns.COLUMNS if isinstance(c.source, str)}
                  | {"block", "started_at", "strategy", "variant", "layout", "precision", "repeat", "step_time_s",
                     "bubble_measured", "bubble_fraction", "error", "path", "simulated", "speed_comparable",
                     "workers_on_host", "threads_per_worker", "host_cores", "configuration", *GROUP_KEYS})


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
            records.extend(_wandb_records(src[len("wandb:"):]))
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
    return records


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


# what makes two runs the same configuration, besides their full config: seeds and repeats differ
_IDENTITY = ("strategy", "variant", "model", "data", "world_size", "global_batch", "micro_batches", "device", "tag",
             "cluster", "replicas", "boundaries", "config")


def configuration_id(record: dict) -> str:
    """Equal for runs of one configuration (every setting but the seed and the repeat), else different."""
    return json.dumps({k: record.get(k) for k in _IDENTITY}, sort_keys=True, default=str)


def layout_text(record: dict) -> str:
    """Workers per stage and the cut, e.g. ``[1, 3] cut [3]`` (a planned run shows its plan)."""
    replicas, boundaries = record.get("replicas"), record.get("boundaries")
    text = str(replicas) if replicas else ""
    return f"{text} cut {boundaries}".strip() if boundaries else text


def to_frame(records: list[dict]) -> pd.DataFrame:
    rows = [{**{k: v for k, v in r.items() if not isinstance(v, (dict, list)) or k == "peak_memory_per_rank"},
             "layout": layout_text(r), "configuration": configuration_id(r), "steps_to_target": steps_to_target(r)}
            for r in records]
    df = pd.DataFrame(rows)
    for col in _fields():
        if col not in df.columns:
            df[col] = None
    return df


def load_records(sources: list[str]) -> pd.DataFrame:
    return to_frame(load_raw(sources))


# -- comparison ---------------------------------------------------------------


def comparison(df: pd.DataFrame) -> pd.DataFrame:
    """Add speedup and ME against the DP run(s) of each group (the median DP if several seeds)."""
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
    df.loc[df["status"] != "ok", "note"] = df.loc[df["status"] != "ok", "error"].fillna("failed")
    simulated = df["simulated"] == True  # noqa: E712
    df.loc[simulated, "note"] = ("simulated; " + df.loc[simulated, "note"].fillna("")).str.rstrip("; ")
    crowded = (df["speed_comparable"] == False) & ok  # noqa: E712
    df.loc[crowded, "note"] = [
        f"speed and bubble not comparable: {w:.0f} workers x {t:.0f} threads on {c:.0f} cores" + (f"; {n}" if n else "")
        for w, t, c, n in zip(df.loc[crowded, "workers_on_host"], df.loc[crowded, "threads_per_worker"],
                              df.loc[crowded, "host_cores"], df.loc[crowded, "note"])]
    # blocks in the order the sweep ran them (their first run's start), then the groups and
    # strategies within each
    df["block"] = df["block"].fillna("")
    started = df.groupby("block")["started_at"].min().fillna("").sort_values(kind="stable")
    df["_block_order"] = df["block"].map({b: i for i, b in enumerate(started.index)})
    df = df.sort_values(["_block_order"] + GROUP_KEYS + ["strategy"], kind="stable")
    return df.drop(columns="_block_order").reset_index(drop=True)


def presentable(df: pd.DataFrame) -> pd.DataFrame:
    """Every declared column (:mod:`harness.report.columns`) in its unit, one row per run."""
    table = pd.DataFrame({c.label: c.values(df) for c in columns.COLUMNS})
    table["configuration"] = df["configuration"]
    return table if (table["block"] != "").any() else table.drop(columns="block")


def aggregated(table: pd.DataFrame) -> pd.DataFrame:
    """One row per configuration run several times (seeds or repeats): for every figure its mean
    and the half-width of its 95% confidence interval (``<figure> ±95%``), and the runs counted."""
    out = []
    for _, group in table.groupby("configuration", sort=False):
        row = {k: group[k].iloc[0] for k in config_labels() if k in group}
        ok = group[group["status"] == "ok"]
        row["runs"] = f"{len(ok)}/{len(group)} ok"
        # the times to target average the runs that reached it: say how many did
        row["reached target"] = f"{ok['steps to target'].notna().sum()}/{len(ok)}"
        for col in figure_labels():
            values = mlperf_times(ok[col]) if col == "s to target" else ok[col]
            row[col], row[f"{col} ±95%"], _ = interval(values)
        row["note"] = "; ".join(sorted({n for n in group["note"] if n}))
        out.append(row)
    return pd.DataFrame(out)


def _with_intervals(table: pd.DataFrame) -> pd.DataFrame:
    """``mean ± half-width`` in one cell per figure, for tables read by people (Markdown, LaTeX)."""
    shown = table.copy()
    for col in figure_labels():
        half = f"{col} ±95%"
        if half in shown:
            shown[col] = [("–" if pd.isna(m) else f"{m:.4g}" if pd.isna(h) else f"{m:.4g} ± {h:.2g}")
                          for m, h in zip(shown[col], shown.pop(half))]
    return shown


def _latex(table: pd.DataFrame) -> str:
    """booktabs table, the best value of each figure column in bold (within each group)."""
    shown = table.drop(columns=["note"]).copy()
    bold = pd.DataFrame(False, index=shown.index, columns=shown.columns)
    for _, idx in shown.groupby(["model", "data", "workers", "batch", "device", "precision"], dropna=False).groups.items():
        for col in (c.label for c in columns.COLUMNS if c.better):
            vals = pd.to_numeric(shown.loc[idx, col], errors="coerce")
            if vals.notna().sum() > 1:
                best = vals.max() if column(col).better == "higher" else vals.min()
                bold.loc[idx, col] = vals == best
    cells = shown.astype(object).where(shown.notna(), "--")
    for col in figure_labels():
        cells[col] = [f"{v:.4g}" if isinstance(v, float) else v for v in cells[col]]
    cells = cells.astype(str).map(lambda s: s.replace("_", r"\_").replace("%", r"\%").replace("±", r"$\pm$"))
    cells = cells.where(~bold, "\\textbf{" + cells + "}")
    cells.columns = [c.replace("%", r"\%") for c in cells.columns]
    return cells.style.hide(axis="index").to_latex(hrules=True, column_format="l" * len(cells.columns))


def render(df: pd.DataFrame, fmt: str) -> str:
    table = comparison_table(df)
    if fmt != "csv" and any(f"{col} ±95%" in table for col in figure_labels()):
        table = _with_intervals(table)
    if fmt == "md":
        return table.astype(object).where(table.notna(), None).to_markdown(index=False, floatfmt="g", missingval="–")
    if fmt == "csv":
        return table.to_csv(index=False)
    if fmt == "latex":
        return _latex(table)
    raise ValueError(f"unknown format {fmt}; use md, csv or latex")


def comparison_table(df: pd.DataFrame) -> pd.DataFrame:
    """The comparison, one row per run, or per configuration with intervals where any ran several
    times (seeds or repeats); numeric columns stay numeric."""
    table = presentable(comparison(df))
    if table["configuration"].duplicated().any():
        table = aggregated(table)
    return table.drop(columns=["configuration"], errors="ignore")


def write_outputs(sources: list[str], out_dir: str) -> tuple[str, list[str]]:
    """Tables (md, csv, tex) and figures for ``sources`` into ``out_dir``; returns the Markdown table."""
    records = load_raw(sources)
    df = to_frame(records)
    os.makedirs(out_dir, exist_ok=True)
    tables = {fmt: render(df, fmt) for fmt in ("md", "csv", "latex")}
    for fmt, ext in (("md", "md"), ("csv", "csv"), ("latex", "tex")):
        with open(os.path.join(out_dir, f"results.{ext}"), "w") as f:
            f.write(tables[fmt] + "\n")
    with open(os.path.join(out_dir, "machine.json"), "w") as f:
        json.dump(environment(), f, indent=1)
    return tables["md"], all_figures(records, os.path.join(out_dir, "figures"))
