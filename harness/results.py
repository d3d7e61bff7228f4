"""``python -m harness.results SOURCE [SOURCE ...] [--format md|csv|latex] [--figures DIR] [--target ACCURACY]``
(``pipebench-results``).

A SOURCE is a sweep or run directory (every ``metrics.json`` below it), a
``metrics.json`` file, a wandb offline run folder (the record is saved in its
``files/``), or ``wandb:entity/project[/group]`` (the runs' summaries, online).
Prints the comparison table (:mod:`harness.report.tables`: speedup and ME against
DP in each group) and, with ``--figures``, draws the figures.
"""

from __future__ import annotations

import argparse
import sys

from harness.report.figures import all_figures
from harness.report.record import RECORD_FILE
from harness.report.statistics import retargeted
from harness.report.tables import load_raw, render, to_frame


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.results", description="Comparison tables (and figures) from run records")
    parser.add_argument("sources", nargs="+", help="sweep/run directories, metrics.json files, wandb run folders "
                                                   "or wandb:entity/project[/group]")
    parser.add_argument("--format", choices=["md", "csv", "latex"], default="md")
    parser.add_argument("--figures", metavar="DIR", help="also draw the figures (PNG and PDF) into DIR")
    parser.add_argument("--target", type=float, metavar="ACCURACY",
                        help="time and steps to this test accuracy (a fraction), read from the runs' curves, "
                             "instead of the train.target_accuracy each run was given")
    args = parser.parse_args(argv)
    if args.target is not None and not 0 < args.target <= 1:
        parser.error(f"--target {args.target}: give the accuracy as a fraction in (0, 1]")
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


if __name__ == "__main__":
    sys.exit(main())
