"""The simulator's predictions against measured runs on this machine, repeats interleaved.

Three tables from one command. The changed-configuration study
(harness.studies.changed_config) profiles each model once per repeat and predicts, from
that one profile, its profiled configuration (the replay table) and configurations it did
not profile (the changed table: other cuts, micro-batch counts and global batches,
schedules, runtimes, replicas, recomputation), each run for real beside it, each
prediction with a 10-90% interval from runs drawn with the profile's measured spread.
The published-table comparison predicts the Zero Bubble paper's A100 table with the
roofline model (harness.planning.published). With ``--budget full``, the matrix of
configurations each profiled with its own settings runs too: each configuration run,
profiled, run again and predicted from that profile, through the commands a user runs
(``pipebench run``, ``pipebench profile``, ``pipebench simulate``); a shared machine's
speed drifts over tens of seconds, so one run can differ from the next of the same
configuration by more than the simulator's own error, and repeating the round spreads
that drift over every configuration.

Example (about 90 minutes on 2 cores):
  pipebench validate --out results/simulator_validation
"""

from __future__ import annotations

import argparse
import os

from harness.studies import validation as study
from harness.studies.options import add_options, refuse, say
from harness.studies.published_table import write_published


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--budget",
        choices=list(study.BUDGETS),
        default="standard",
        help="quick: vit_micro, one repeat (about 20 min); standard: both models, two repeats "
        "(about 90 min); full: three repeats and the matrix of configurations each profiled "
        "with its own settings too (about 3 h 30)",
    )
    add_options(
        parser,
        repeats=(None, "repeats (default: the budget's)"),
        steps=(30, "training steps per measured run"),
        out=("results/simulator_validation", "where runs and the tables go"),
    )
    parser.add_argument(
        "--only",
        default="",
        help="run only the configurations whose name contains this text "
        "(with the profiled configuration of their model)",
    )
    parser.add_argument(
        "--summarise", action="store_true", help="run nothing: rebuild the tables from the repeats already under --out"
    )
    parser.add_argument(
        "--published",
        action="store_true",
        help="run nothing: only predict the published GPU table (published.md under --out, a minute)",
    )


def main(args: argparse.Namespace) -> int:
    models, repeats, profiled_matrix = study.BUDGETS[args.budget]
    repeats = args.repeats or repeats
    if args.published:
        print(write_published(args.out, log=say))
        return 0
    if args.summarise:
        texts = study.rebuild(args.out)
        if not texts:
            return refuse(
                f"--summarise: no finished configuration under {args.out}/repeat* or "
                f"{os.path.join(args.out, 'changed')}/repeat*"
            )
        for text in texts:
            print(text)
        return 0
    if repeats < 1 or args.steps <= 5:
        return refuse("--repeats must be at least 1 and --steps over 5 (the warm-up steps)")
    matrix = study.changed_matrix(models, args.only)
    configs = study.profiled_configs(args.only) if profiled_matrix else {}
    if not matrix and not configs:
        return refuse(f"--only {args.only!r} matches no configuration; they are: {'; '.join(study.labels(models))}")
    study.run(args.out, matrix, configs, repeats, args.steps, log=say)
    return 0
