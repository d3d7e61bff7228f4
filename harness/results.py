"""Comparison tables from run records: ``python -m harness.results DIR [--format md|csv|latex]``.

Runs are grouped by model, data, world size and global batch. Within a group:
- speedup = throughput / DP throughput;
- ME (memory-efficiency index, Hippie's definition) = speedup / (peak memory / DP peak memory),
  with the peak taken as the maximum over ranks;
A group without a successful DP run says so (no speedup is invented); failed runs stay in
the table, marked failed.
"""

from __future__ import annotations

import argparse
import glob
import os
import sys

import pandas as pd
from hydra.experimental.callback import Callback

from harness.record import RECORD_FILE, read

GROUP_KEYS = ["model", "data", "world_size", "global_batch"]
_COLUMNS = ["strategy", "model", "data", "world_size", "global_batch", "micro_batches", "status", "throughput",
            "step_time_s", "speedup", "peak_memory_bytes", "me", "accuracy", "final_loss", "time_to_target_s",
            "error", "path"]


def find_records(sources: list[str]) -> list[str]:
    paths: list[str] = []
    for src in sources:
        if os.path.isfile(src):
            paths.append(src)
        else:
            paths.extend(sorted(glob.glob(os.path.join(src, "**", RECORD_FILE), recursive=True)))
    return paths


def load_records(sources: list[str]) -> pd.DataFrame:
    rows = []
    for path in find_records(sources):
        try:
            rec = read(path)
        except (OSError, ValueError) as e:
            rec = {"status": "failed", "error": f"unreadable record: {e}"}
        rec["path"] = os.path.dirname(path)
        rows.append({k: v for k, v in rec.items() if not isinstance(v, (dict, list)) or k == "peak_memory_per_rank"})
    df = pd.DataFrame(rows)
    for col in _COLUMNS:
        if col not in df.columns:
            df[col] = None
    return df


def comparison(df: pd.DataFrame) -> pd.DataFrame:
    """Add speedup and ME against the DP run of each group."""
    if df.empty:
        return df.reindex(columns=_COLUMNS)
    df = df.copy()
    df["speedup"] = float("nan")
    df["me"] = float("nan")
    df["note"] = ""
    ok = df["status"] == "ok"
    for _, idx in df.groupby(GROUP_KEYS, dropna=False).groups.items():
        group = df.loc[idx]
        dp = group[(group["strategy"] == "dp") & (group["status"] == "ok")]
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
    return df.sort_values(GROUP_KEYS + ["strategy"], kind="stable").reset_index(drop=True)


def presentable(df: pd.DataFrame) -> pd.DataFrame:
    """Rounded, human units, one row per run."""
    out = pd.DataFrame({
        "strategy": df["strategy"],
        "model": df["model"],
        "data": df["data"],
        "workers": df["world_size"],
        "batch": df["global_batch"],
        "micro": df["micro_batches"],
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
    return out


def render(df: pd.DataFrame, fmt: str) -> str:
    table = presentable(comparison(df))
    if fmt == "md":
        return table.to_markdown(index=False, floatfmt="g", missingval="–")
    if fmt == "csv":
        return table.to_csv(index=False)
    if fmt == "latex":
        return table.to_latex(index=False, na_rep="--", float_format="%.3g")
    raise ValueError(f"unknown format {fmt}; use md, csv or latex")


# failed runs of the last sweep this process ran (read by harness/__main__ for the exit code)
SWEEP_FAILURES: list[int] = []


class SweepTableCallback(Callback):
    """Hydra callback: after a multirun, print its comparison table and save it beside the runs."""

    def __init__(self) -> None:
        self.failed = 0

    def on_multirun_end(self, config, **kwargs) -> None:
        sweep_dir = config.hydra.sweep.dir
        df = load_records([sweep_dir])
        if df.empty:
            print(f"no records under {sweep_dir}", file=sys.stderr)
            return
        table = render(df, "md")
        with open(os.path.join(sweep_dir, "results.md"), "w") as f:
            f.write(table + "\n")
        comparison(df).to_csv(os.path.join(sweep_dir, "results.csv"), index=False)
        self.failed = int((df["status"] != "ok").sum())
        SWEEP_FAILURES.append(self.failed)
        print(f"\nResults of {len(df)} run(s) in {sweep_dir} (speedup and ME against DP with the same workers):\n")
        print(table)
        if self.failed:
            print(f"\n{self.failed} run(s) failed; see the note column and each run's metrics.json", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.results", description=__doc__.splitlines()[0])
    parser.add_argument("sources", nargs="+", help="sweep/run directories or metrics.json files")
    parser.add_argument("--format", choices=["md", "csv", "latex"], default="md")
    args = parser.parse_args(argv)
    df = load_records(args.sources)
    if df.empty:
        print(f"error: no {RECORD_FILE} found under {', '.join(args.sources)}", file=sys.stderr)
        return 2
    print(render(df, args.format))
    return 0


if __name__ == "__main__":
    sys.exit(main())
