"""Comparison tables (and figures) from run records.

A SOURCE is a sweep or run directory (every ``metrics.json`` below it), a
``metrics.json`` file, a wandb offline run folder (the record is saved in its
``files/``), or ``wandb:entity/project[/group]`` (the runs' summaries, online).
Prints the comparison table (harness.report.tables: speedup and ME against DP in
each group) of a named column set; ``--out`` writes it in every format with the figures.
With ``--against B``, per configuration in both it gives each figure's ratio A/B with its 95%
interval (harness.report.against) and lists the configurations only one of them ran.

Examples:
  pipebench results multirun/2026-12-06/10-00-00
  pipebench results results/ci --columns memory --format latex
  pipebench results results/accuracy --target 0.4 --out paper/accuracy
  pipebench results multirun/after --against multirun/before --out paper/regression
"""

from __future__ import annotations

import argparse
import os
import sys

from harness.report import against, columns
from harness.report.checks import provenance
from harness.report.figure_data import FigureContractError
from harness.report.figures import all_figures
from harness.report.record import RECORD_FILE
from harness.report.reproduce import differences
from harness.report.statistics import retargeted
from harness.report.tables import FORMATS, load_raw, render, to_frame, write_outputs


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "sources",
        nargs="+",
        metavar="SOURCE",
        help="sweep/run directories, metrics.json files, wandb run folders or wandb:entity/project[/group]",
    )
    parser.add_argument("--format", choices=list(FORMATS), default="md")
    parser.add_argument(
        "--columns",
        default=columns.DEFAULT_SET,
        metavar="SET|KEYS",
        help=f"a column set ({', '.join(columns.set_names())}; default {columns.DEFAULT_SET}) or "
        "comma-separated column keys (docs: reference/commands)",
    )
    parser.add_argument(
        "--out",
        metavar="DIR",
        help="write results.{md,csv,tex} and figures/ into DIR instead of printing the table (and "
        "paired.{md,csv}, each configuration against DP by seed, where seeds pair with DP); a figure "
        "in DIR/figures that today's code no longer draws is removed",
    )
    parser.add_argument("--figures", metavar="DIR", help="also draw the figures (PNG and PDF) into DIR")
    parser.add_argument(
        "--against",
        nargs="+",
        metavar="B",
        help="compare the SOURCE runs (A) with these: per configuration in both, each figure's "
        "ratio A/B with its 95%% interval; --out writes against.{md,csv,tex}",
    )
    parser.add_argument(
        "--ignore",
        metavar="SETTINGS",
        default="",
        help="with --against: comma-separated settings (train.steps, micro_batches) to leave out "
        "when matching configurations",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="for each SOURCE study (a folder with results.md): regenerate its tables and figures from "
        "its records with this code and fail on any difference (figures compared through the data "
        "they draw), on a record holding an impossible figure, or on runs from an uncommitted tree "
        "or several commits",
    )
    parser.add_argument(
        "--target",
        type=float,
        metavar="ACCURACY",
        help="time and steps to this test accuracy (a fraction), read from the runs' curves, "
        "instead of the train.target_accuracy each run was given",
    )


def main(args: argparse.Namespace) -> int:
    if args.target is not None and not 0 < args.target <= 1:
        print(f"error: --target {args.target}: give the accuracy as a fraction in (0, 1]", file=sys.stderr)
        return 2
    try:
        columns.select(args.columns)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.against is None and args.ignore:
        print("error: --ignore is for matching configurations with --against", file=sys.stderr)
        return 2
    if args.against is not None and args.figures:
        print("error: --figures draws one sweep's figures; run it without --against", file=sys.stderr)
        return 2
    missing = [
        s for s in [*args.sources, *(args.against or [])] if not s.startswith("wandb:") and not os.path.exists(s)
    ]
    if missing:
        print(f"error: {missing[0]}: no such file or folder", file=sys.stderr)
        return 2
    if args.check:
        return _check(args.sources)
    sides = [args.sources] + ([args.against] if args.against is not None else [])
    loaded = []
    for sources in sides:
        records = load_raw(sources)
        if not records:
            print(
                f"error: no readable {RECORD_FILE} under {', '.join(sources)} (none found, or none of this "
                "harness's record schema)",
                file=sys.stderr,
            )
            return 2
        loaded.append(retargeted(records, args.target) if args.target is not None else records)
    if args.against is not None:
        return _against(args, *loaded)
    records = loaded[0]
    for line in provenance(records):  # a table whose code cannot be named: said, not refused
        print(f"warning: {line}", file=sys.stderr)
    if args.out:
        _, written, broken = write_outputs(records, args.out, args.columns)
        print(f"{len(written)} file(s) written to {args.out}", file=sys.stderr)
        for line in broken:
            print(f"pipebench results: not drawn: {line}", file=sys.stderr)
        return 1 if broken else 0
    name = os.path.basename(os.path.normpath(args.sources[0]))
    print(render(to_frame(records), args.format, args.columns, name))
    if args.figures:
        try:
            paths = all_figures(records, args.figures)
        except FigureContractError as e:
            print(f"pipebench results: not drawn: {e}", file=sys.stderr)
            return 1
        print(f"{len(paths)} figure file(s) written to {args.figures}", file=sys.stderr)
    return 0


def _check(studies: list[str]) -> int:
    """``--check``: each study against what this code makes from its records (harness.report.reproduce)."""
    not_studies = [s for s in studies if not os.path.isfile(os.path.join(s, "results.md"))]
    if not_studies:
        print(f"error: {not_studies[0]}: not a study (no results.md); --check takes study folders", file=sys.stderr)
        return 2
    failed = 0
    for study in studies:
        found = differences(study)
        print(f"{study}: " + ("reproduced" if not found else f"{len(found)} difference(s)"))
        for line in found:
            print(f"  {line}")
        failed += bool(found)
    return 1 if failed else 0


def _against(args: argparse.Namespace, a: list[dict], b: list[dict]) -> int:
    names = tuple(", ".join(sources) for sources in (args.sources, args.against))
    try:
        result = against.compare(
            to_frame(a), to_frame(b), args.columns, names, tuple(k.strip() for k in args.ignore.split(",") if k.strip())
        )
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    name = " against ".join(os.path.basename(os.path.normpath(s[0])) for s in (args.sources, args.against))
    if args.out:
        written = against.write(result, args.out, name)
        print(f"{len(written)} file(s) written to {args.out}", file=sys.stderr)
        return 0
    print(against.render(result, args.format, name))
    return 0
