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
import os
import random
import signal
import sys
import tempfile

import pandas as pd

from harness.studies.driver import Interruption, interleaved, run_command, write

# one short run of each family: our two methods, every baseline, a multi-stage schedule, a
# checkpoint and resume of the asynchronous pipeline
FAMILIES = {
    "dp": ["strategy=dp"],
    "hippie": ["strategy=hippie", "train.micro_batches=4"],
    "ashpipe": ["strategy=ashpipe", "strategy.replicas=[1,1]", "train.checkpoint_every=4"],
    "ashpipe_sp": ["strategy=ashpipe", "strategy.switch_step=4"],
    "pipelining": ["strategy=pipelining", "train.micro_batches=4"],
    "pipelining_zbv": ["strategy=pipelining", "strategy.schedule=zbv", "train.micro_batches=4"],
    "deepspeed": ["strategy=deepspeed", "train.micro_batches=4"],
    "gpipe": ["strategy=gpipe", "train.micro_batches=4"],
}
COMMON = [
    "world_size=2",
    "train.steps=10",
    "train.warmup_steps=2",
    "data.train_size=512",
    "data.test_size=64",
    "logger.mode=disabled",
]


# what interrupts a run in --interrupts: the command's own stops, and a process of the job dying
SIGNALS = [
    (signal.SIGINT, "command"),
    (signal.SIGINT, "group"),
    (signal.SIGTERM, "command"),
    (signal.SIGTERM, "group"),
    (signal.SIGKILL, "worker"),
    (signal.SIGKILL, "server"),
    (signal.SIGKILL, "command"),
]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rounds", type=int, default=7, help=f"rounds of the {len(FAMILIES)} families")
    parser.add_argument(
        "--interrupts",
        type=int,
        default=0,
        metavar="N",
        help="instead: N runs across the families, each sent a random signal at a random moment "
        "once its workers train (Ctrl-C or SIGTERM to the command or its group, SIGKILL to a "
        "worker, the server or the command); counts runs without a record and processes left",
    )
    parser.add_argument("--seed", type=int, default=0, help="of the interruptions' draw")
    parser.add_argument("--deadline", type=float, default=300, help="seconds after which a run counts as a hang")
    parser.add_argument("--out", default="", help="where soak.md and soak.json go (default: only print)")


def main(args: argparse.Namespace) -> int:
    if args.rounds < 1 or args.interrupts < 0:
        print("error: --rounds must be at least 1 and --interrupts at least 0", file=sys.stderr)
        return 2
    if args.interrupts:
        return interrupts(args)
    with tempfile.TemporaryDirectory() as scratch:
        outcomes = interleaved(
            FAMILIES,
            args.rounds,
            lambda name, overrides, r: run_command(
                [*overrides, *COMMON, f"seed={r}"], os.path.join(scratch, str(r), name), args.deadline
            ),
            shown=lambda o: f"ok, {o.left_over} left over",
        )
    rows = [
        {"round": r, "run": name, "outcome": o.status, "seconds": o.seconds, "left_over": o.left_over, "error": o.error}
        for name, results in outcomes.items()
        for r, o in enumerate(results)
    ]
    table = pd.DataFrame(rows).sort_values(["round"], kind="stable")
    summary = {
        "date": datetime.date.today().isoformat(),
        "runs": len(table),
        "hangs": int((table.outcome == "hang").sum()),
        "failures": int((table.outcome == "failed").sum()),
        "left_over_processes": int(table.left_over.sum()),
        "median_seconds": float(table.seconds.median()),
    }
    per_family = table.groupby("run").agg(
        runs=("outcome", "size"),
        ok=("outcome", lambda o: int((o == "ok").sum())),
        median_s=("seconds", "median"),
        left_over=("left_over", "sum"),
    )
    text = (
        f"Soak of {summary['runs']} runs at 2 workers on {summary['date']}: {summary['hangs']} hangs, "
        f"{summary['failures']} failures, {summary['left_over_processes']} processes left over "
        f"(median run {summary['median_seconds']:.1f} s).\n\n{per_family.to_markdown()}\n\nEvery run:\n\n"
        f"{table.to_markdown(index=False)}\n"
    )
    print(text)
    if args.out:
        write(args.out, "soak", text, {**summary, "runs_detail": rows})
    return 0 if summary["hangs"] == summary["failures"] == summary["left_over_processes"] == 0 else 1


def interrupts(args: argparse.Namespace) -> int:
    """``--interrupts N``: each run interrupted at a random moment; a run is right when it ended with
    a record (every stop but SIGKILL to the command itself, which nothing can outlive to write one)
    and its expected exit status, and left no process of its job alive."""
    rng = random.Random(args.seed)
    names = list(FAMILIES)
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for k in range(args.interrupts):
            name = names[k % len(names)]
            signum, target = rng.choice(SIGNALS)
            how = Interruption(signum, target, round(rng.uniform(0.5, 6.0), 1))
            o = run_command(
                [*FAMILIES[name], *COMMON, "train.steps=40", f"seed={k}"],
                os.path.join(scratch, str(k), name),
                args.deadline,
                interruption=how,
            )
            expected_record = not (signum == signal.SIGKILL and target == "command")
            record = (o.record or {}).get("status")
            row = {
                "run": k,
                "family": name,
                "signal": signal.Signals(signum).name,
                "to": target,
                "after_s": how.after,
                "exit": o.returncode,
                "record": record or "none",
                "interrupted": (o.record or {}).get("interrupted"),
                "left_over": o.left_over,
                "seconds": o.seconds,
                "right": o.left_over == 0 and (record is not None or not expected_record) and o.status != "hang",
            }
            rows.append(row)
            print(
                f"[{k + 1}/{args.interrupts}] {name}, {how}: exit {o.returncode}, record {row['record']}, "
                f"{o.left_over} left over in {o.seconds:.0f} s",
                flush=True,
            )
    summary, text = interrupt_report(rows, datetime.date.today().isoformat())
    print(text)
    if args.out:
        write(args.out, "soak_interrupts", text, {**summary, "runs_detail": rows})
    return 0 if summary["wrong"] == 0 else 1


def interrupt_report(rows: list[dict], date: str) -> tuple[dict, str]:
    """The counts of an interruption soak, and its Markdown (per signal and target, then every run)."""
    table = pd.DataFrame(rows)
    killed_outright = (table.signal == "SIGKILL") & (table.to == "command")  # nothing can write a record
    summary = {
        "date": date,
        "runs": len(table),
        "wrong": int((~table.right).sum()),
        "without_record": int(((table.record == "none") & ~killed_outright).sum()),
        "left_over_processes": int(table.left_over.sum()),
        "finished_before_the_signal": int((table.record == "ok").sum()),
    }
    by_signal = (
        table.groupby(["signal", "to"])
        .agg(runs=("run", "size"), right=("right", "sum"), left_over=("left_over", "sum"))
        .reset_index()
    )
    text = (
        f"Soak of {summary['runs']} interrupted runs at 2 workers on {date}: {summary['without_record']} without a "
        f"record, {summary['left_over_processes']} processes left over, {summary['wrong']} wrong; "
        f"{summary['finished_before_the_signal']} finished before their signal.\n\n"
        f"{by_signal.to_markdown(index=False)}\n\nEvery run:\n\n{table.to_markdown(index=False)}\n"
    )
    return summary, text
