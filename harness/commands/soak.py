"""Many short runs of every strategy in a row: hangs, failures and processes left over, counted.

Runs every strategy family at 2 workers, one after another and round after round, each as
a user runs it (``pipebench run ...`` in its own process, with a deadline), and
checks after each one: did it finish before its deadline (else it is a hang: its whole
process tree is killed and counted), did it leave an ``ok`` record (else a failure, with
the record's error), and did any process it started outlive it (a leftover, counted and
killed). Prints one line per run and a summary, and writes both as ``soak.md`` and
``soak.json``. Exit status 1 if any run hung, failed or left a process behind.

Example (about 20 minutes on 2 cores):
  pipebench soak --rounds 7 --out results/soak
"""

from __future__ import annotations

import argparse
import datetime

from harness.studies import soak as study
from harness.studies.driver import write
from harness.studies.options import add_options, refuse, say


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_options(parser, rounds=(7, f"rounds of the {len(study.FAMILIES)} families"))
    parser.add_argument(
        "--interrupts",
        type=int,
        default=0,
        metavar="N",
        help="instead: N runs across the families, each sent a random signal at a random moment "
        "once its workers train (Ctrl-C or SIGTERM to the command or its group, SIGKILL to a "
        "worker, the server or the command); counts runs without a record and processes left",
    )
    add_options(
        parser,
        seed=(0, "of the interruptions' draw"),
        deadline=(300, "seconds after which a run counts as a hang"),
        out=("", "where soak.md and soak.json go (default: only print)"),
    )


def main(args: argparse.Namespace) -> int:
    if args.rounds < 1 or args.interrupts < 0:
        return refuse("--rounds must be at least 1 and --interrupts at least 0")
    if args.interrupts:
        rows = study.interrupted(args.interrupts, args.seed, args.deadline, log=say)
        summary, text = study.interrupt_report(rows, datetime.date.today().isoformat())
        stem = "soak_interrupts"
    else:
        rows = study.rounds(args.rounds, args.deadline)
        summary, text = study.report(rows, datetime.date.today().isoformat())
        stem = "soak"
    print(text)
    if args.out:
        write(args.out, stem, text, {**summary, "runs_detail": rows})
    return 0 if study.clean(summary) else 1
