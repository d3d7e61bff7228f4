"""Comparison tables (and figures) from run records.

A SOURCE is a sweep or run directory (every ``metrics.json`` below it), a
``metrics.json`` file, a wandb offline run folder (the record is saved in its
``files/``), or ``wandb:entity/project[/group]`` (the runs' summaries, online).
Prints the comparison table (harness.report.tables: speedup and ME against DP in
each group) and, with ``--figures``, draws the figures.

Examples:
  pipebench results multirun/2026-12-06/10-00-00
  pipebench results results/accuracy --target 0.4 --format latex --figures figs/
"""

from __future__ import annotations

import argparse
import sys

from harness.report.figures import all_figures
from harness.report.record import RECORD_FILE
from harness.report.statistics import retargeted
from harness.report.tables import load_raw, render, to_frame


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("sources", nargs="+", metavar="SOURCE",
                        help="sweep/run directories, metrics.json files, wandb run folders or wandb:entity/project[/group]")
    parser.add_argument("--format", choices=["md", "csv", "latex"], default="md")
    parser.add_argument("--figures", metavar="DIR", help="also draw the figures (PNG and PDF) into DIR")
    parser.add_argument("--target", type=float, metavar="ACCURACY",
                        help="time and steps to this test accuracy (a fraction), read from the runs' curves, "
                             "instead of the train.target_accuracy each run was given")


def main(args: argparse.Namespace) -> int:
    if args.target is not None and not 0 < args.target <= 1:
        print(f"error: --target {args.target}: give the accuracy as a fraction in (0, 1]", file=sys.stderr)
        return 2
    records = load_raw(args.sources)
    if not records:
        print(f"error: no readable {RECORD_FILE} under {', '.join(args.sources)} (none found, or none of this "
              "harness's record schema)", file=sys.stderr)
        return 2
    if args.target is not None:
        records = retargeted(records, args.target)
    print(render(to_frame(records), args.format))
    if args.figures:
        paths = all_figures(records, args.figures)
        print(f"{len(paths)} figure file(s) written to {args.figures}", file=sys.stderr)
    return 0
