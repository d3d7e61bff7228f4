"""The soak (``pipebench soak``): many short runs of every strategy family in a row.

Its families (:data:`FAMILIES`, each with the :data:`COMMON` settings), the rounds of them
(:func:`rounds`) and their report (:func:`report`: hangs, failures, processes left over); the
interrupted runs of ``--interrupts`` (:func:`interrupted`, a signal of :data:`SIGNALS` each) and
their report (:func:`interrupt_report`: which ended with a record and left nothing behind); the
verdict on either (:func:`clean`).
"""

from __future__ import annotations

import os
import random
import signal
import tempfile
from typing import Callable

import pandas as pd

from harness.studies.driver import Interruption, interleaved, run_command

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


def rounds(count: int, deadline: float) -> list[dict]:
    """Every family once per round, ``count`` rounds, each run with ``deadline`` seconds before it
    counts as a hang; one row per run (family by family, round by round), one line printed per run."""
    with tempfile.TemporaryDirectory() as scratch:
        outcomes = interleaved(
            FAMILIES,
            count,
            lambda name, overrides, r: run_command(
                [*overrides, *COMMON, f"seed={r}"], os.path.join(scratch, str(r), name), deadline
            ),
            shown=lambda o: f"ok, {o.left_over} left over",
        )
    return [
        {"round": r, "run": name, "outcome": o.status, "seconds": o.seconds, "left_over": o.left_over, "error": o.error}
        for name, results in outcomes.items()
        for r, o in enumerate(results)
    ]


def report(rows: list[dict], date: str) -> tuple[dict, str]:
    """The counts of a soak (hangs, failures, processes left over), and its Markdown (per family,
    then every run)."""
    table = pd.DataFrame(rows).sort_values(["round"], kind="stable")
    summary = {
        "date": date,
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
    return summary, text


def interrupted(count: int, seed: int, deadline: float, log: Callable[[str], None] = print) -> list[dict]:
    """``count`` runs across the families, each interrupted at a random moment (drawn from ``seed``);
    a run is right when it ended with a record (every stop but SIGKILL to the command itself, which
    nothing can outlive to write one) and its expected exit status, and left no process of its job
    alive. One row per run; ``log`` gets one line per run."""
    rng = random.Random(seed)
    names = list(FAMILIES)
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for k in range(count):
            name = names[k % len(names)]
            signum, target = rng.choice(SIGNALS)
            how = Interruption(signum, target, round(rng.uniform(0.5, 6.0), 1))
            o = run_command(
                [*FAMILIES[name], *COMMON, "train.steps=40", f"seed={k}"],
                os.path.join(scratch, str(k), name),
                deadline,
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
            log(
                f"[{k + 1}/{count}] {name}, {how}: exit {o.returncode}, record {row['record']}, "
                f"{o.left_over} left over in {o.seconds:.0f} s"
            )
    return rows


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


def clean(summary: dict) -> bool:
    """The verdict on a soak's counts (:func:`report`'s or :func:`interrupt_report`'s): no run hung,
    failed or left a process behind; of interrupted runs, none wrong."""
    if "wrong" in summary:
        return summary["wrong"] == 0
    return summary["hangs"] == summary["failures"] == summary["left_over_processes"] == 0
