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
the table, marked failed. Where the same configuration ran with several seeds, the
table gives the mean and the standard deviation over them.
"""

from __future__ import annotations

import glob
import json
import os
import platform
import sys

import pandas as pd
import torch

from harness.report.figures import all_figures
from harness.report.record import RECORD_FILE, read

# speedup and ME are against this strategy's runs in the same group (the DP reference)
REFERENCE_STRATEGY = "dp"

# the device is "cpu", "cuda" or "simulated:<cluster>": simulated rows compare with simulated DP
GROUP_KEYS = ["model", "data", "world_size", "global_batch", "device"]
_COLUMNS = ["strategy", "model", "data", "world_size", "global_batch", "micro_batches", "seed", "device", "status", "throughput",
            "step_time_s", "speedup", "peak_memory_bytes", "me", "accuracy", "final_loss", "time_to_target_s",
            "error", "path", "simulated"]
# column -> True if larger is better (for the bold best value in LaTeX)
_BEST = {"samples/s": True, "speedup": True, "ME": True, "top-1 %": True, "peak MiB/rank": False,
         "final loss": False, "s to target": False}


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
            except (OSError, ValueError) as e:
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
        rec.setdefault("strategy", run.job_type)
        rec["path"] = run.url
        records.append(rec)
    return records


def to_frame(records: list[dict]) -> pd.DataFrame:
    rows = [{k: v for k, v in r.items() if not isinstance(v, (dict, list)) or k == "peak_memory_per_rank"}
            for r in records]
    df = pd.DataFrame(rows)
    for col in _COLUMNS:
        if col not in df.columns:
            df[col] = None
    return df


def load_records(sources: list[str]) -> pd.DataFrame:
    return to_frame(load_raw(sources))


# -- comparison ---------------------------------------------------------------


def comparison(df: pd.DataFrame) -> pd.DataFrame:
    """Add speedup and ME against the DP run(s) of each group (the median DP if several seeds)."""
    if df.empty:
        return df.reindex(columns=_COLUMNS)
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
    return df.sort_values(GROUP_KEYS + ["strategy"], kind="stable").reset_index(drop=True)


def presentable(df: pd.DataFrame) -> pd.DataFrame:
    """Rounded, human units, one row per run."""
    variant = df["variant"].fillna("") if "variant" in df else pd.Series([""] * len(df), index=df.index)
    return pd.DataFrame({
        "strategy": [f"{s} ({v})" if v else s for s, v in zip(df["strategy"], variant)],
        "model": df["model"],
        "data": df["data"],
        "workers": df["world_size"],
        "batch": df["global_batch"],
        "micro": df["micro_batches"],
        "device": df["device"],
        "seed": df["seed"],
        "status": df["status"],
        "samples/s": df["throughput"].astype(float).round(1),
        "speedup": df["speedup"].astype(float).round(3),
        "peak MiB/rank": (df["peak_memory_bytes"].astype(float) / 2**20).round(2),
        "ME": df["me"].astype(float).round(3),
        "top-1 %": (df["accuracy"].astype(float) * 100).round(2),
        "final loss": df["final_loss"].astype(float).round(4),
        "s to target": df["time_to_target_s"].astype(float).round(1),
        "note": df.get("note", ""),
    })


def aggregated(table: pd.DataFrame) -> pd.DataFrame:
    """Mean ± standard deviation over repeated runs (seeds) of the same configuration."""
    keys = ["strategy", "model", "data", "workers", "batch", "micro", "device"]
    out = []
    for key, group in table.groupby(keys, dropna=False, sort=False):
        row = dict(zip(keys, key))
        ok = group[group["status"] == "ok"]
        row["runs"] = f"{len(ok)}/{len(group)} ok"
        for col in _BEST:
            vals = ok[col].astype(float).dropna()
            row[col] = (f"{vals.mean():.4g} ± {vals.std():.2g}" if len(vals) > 1 else
                        (f"{vals.iloc[0]:.4g}" if len(vals) else "–"))
        row["note"] = "; ".join(sorted({n for n in group["note"] if n}))
        out.append(row)
    return pd.DataFrame(out)


def _latex(table: pd.DataFrame) -> str:
    """booktabs table, the best value of each figure column in bold (within each group)."""
    shown = table.drop(columns=["note"]).copy()
    bold = pd.DataFrame(False, index=shown.index, columns=shown.columns)
    for _, idx in shown.groupby(["model", "data", "workers", "batch", "device"], dropna=False).groups.items():
        for col, larger in _BEST.items():
            vals = pd.to_numeric(shown.loc[idx, col], errors="coerce")
            if vals.notna().sum() > 1:
                best = vals.max() if larger else vals.min()
                bold.loc[idx, col] = vals == best
    cells = shown.astype(object).where(shown.notna(), "--")
    for col in _BEST:
        cells[col] = [f"{v:.4g}" if isinstance(v, float) else v for v in cells[col]]
    cells = cells.astype(str).map(lambda s: s.replace("_", r"\_").replace("%", r"\%").replace("±", r"$\pm$"))
    cells = cells.where(~bold, "\\textbf{" + cells + "}")
    cells.columns = [c.replace("%", r"\%") for c in cells.columns]
    return cells.style.hide(axis="index").to_latex(hrules=True, column_format="l" * len(cells.columns))


def render(df: pd.DataFrame, fmt: str) -> str:
    table = presentable(comparison(df))
    keys = ["strategy", "model", "data", "workers", "batch", "micro"]
    if (table.groupby(keys, dropna=False)["seed"].nunique() > 1).any():  # the same runs under several seeds
        table = aggregated(table)
    if fmt == "md":
        return table.astype(object).where(table.notna(), None).to_markdown(index=False, floatfmt="g", missingval="–")
    if fmt == "csv":
        return table.to_csv(index=False)
    if fmt == "latex":
        return _latex(table)
    raise ValueError(f"unknown format {fmt}; use md, csv or latex")


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
        json.dump(machine_description(), f, indent=1)
    return tables["md"], all_figures(records, os.path.join(out_dir, "figures"))


def machine_description() -> dict:
    """Where the figures were measured, written beside every table."""
    return {"host": platform.node(), "platform": platform.platform(), "processor": platform.processor(),
            "cpus": os.cpu_count(), "python": platform.python_version(), "torch": torch.__version__,
            "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]}


def log_wandb_table(df: pd.DataFrame, sweep_dir: str, mode: str, project: str, entity: str | None) -> None:
    """The sweep's comparison as a wandb Table in a run of its own (job_type 'comparison')."""
    if mode == "disabled":
        return
    try:
        import wandb  # lazy, as above

        table = presentable(comparison(df)).astype(str)
        run = wandb.init(project=project, entity=entity, group=os.path.basename(os.path.normpath(sweep_dir)),
                         job_type="comparison", name=f"comparison-{os.path.basename(os.path.normpath(sweep_dir))}",
                         dir=sweep_dir, mode=mode, reinit="finish_previous")
        run.log({"comparison": wandb.Table(dataframe=table)})
        run.finish()
    except Exception as e:  # a mirror only; the local tables stand
        print(f"warning: could not log the comparison table to wandb ({type(e).__name__}: {e})", file=sys.stderr)
