"""``python -m harness.soak`` (``pipebench-soak``): many short runs in a row, to show that none hangs.

Runs every strategy family at 2 workers, one after another and round after round, each as
a user runs it (``python -m harness ...`` in its own process, with a deadline), and
checks after each one: did it finish before its deadline (else it is a hang: its whole
process tree is killed and counted), did it leave an ``ok`` record (else a failure, with
the record's error), and did any process it started outlive it (a leftover, counted and
killed). Prints one line per run and a summary, and writes both as ``soak.md`` and
``soak.json``.

    python -m harness.soak --rounds 8 --out results/soak
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time

import pandas as pd
import psutil

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
COMMON = ["world_size=2", "train.steps=10", "train.warmup_steps=2", "data.train_size=512", "data.test_size=64",
          "logger.mode=disabled"]


def _tree(proc: psutil.Process) -> list[psutil.Process]:
    try:
        return [proc, *proc.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def run_once(name: str, overrides: list[str], out: str, deadline_s: float) -> dict:
    """One run: its outcome (ok, failed, hang), seconds, and the processes it left behind."""
    run_dir = os.path.join(out, name)
    started = time.time()
    proc = subprocess.Popen([sys.executable, "-m", "harness", *overrides, *COMMON, f"hydra.run.dir={run_dir}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "WANDB_SILENT": "true"})
    watched = psutil.Process(proc.pid)
    seen: dict[int, psutil.Process] = {}
    outcome, error = "ok", None
    while proc.poll() is None:
        for p in _tree(watched):  # every process the run starts, to look for any left behind
            seen.setdefault(p.pid, p)
        if time.time() - started > deadline_s:
            outcome, error = "hang", f"still running after {deadline_s:.0f} s"
            for p in _tree(watched):
                p.kill()
            break
        time.sleep(0.2)
    _, stderr = proc.communicate()
    if outcome == "ok":
        try:
            with open(os.path.join(run_dir, "metrics.json")) as f:
                record = json.load(f)
            if record["status"] != "ok":
                outcome, error = "failed", record.get("error")
        except (OSError, ValueError) as e:
            outcome, error = "failed", f"no record ({e}); {stderr.strip().splitlines()[-1:] or ''}"
    time.sleep(1.0)  # what outlives its run by a second is left over
    left = [p for p in seen.values() if p.pid != proc.pid and p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    for p in left:
        p.kill()
    return {"run": name, "outcome": outcome, "seconds": round(time.time() - started, 1), "left_over": len(left),
            "error": error}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m harness.soak", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7, help=f"rounds of the {len(FAMILIES)} families")
    parser.add_argument("--deadline", type=float, default=300, help="seconds after which a run counts as a hang")
    parser.add_argument("--out", default="", help="where soak.md and soak.json go (default: only print)")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for r in range(args.rounds):
            for name, overrides in FAMILIES.items():
                row = {"round": r, **run_once(name, [*overrides, f"seed={r}"], os.path.join(scratch, f"{r}"),
                                              args.deadline)}
                rows.append(row)
                print(f"round {r + 1}/{args.rounds} {name}: {row['outcome']} in {row['seconds']} s, "
                      f"{row['left_over']} left over" + (f" ({row['error']})" if row["error"] else ""), flush=True)
    table = pd.DataFrame(rows)
    summary = {"date": datetime.date.today().isoformat(), "runs": len(table),
               "hangs": int((table.outcome == "hang").sum()), "failures": int((table.outcome == "failed").sum()),
               "left_over_processes": int(table.left_over.sum()), "median_seconds": float(table.seconds.median())}
    per_family = table.groupby("run").agg(runs=("outcome", "size"), ok=("outcome", lambda o: int((o == "ok").sum())),
                                          median_s=("seconds", "median"), left_over=("left_over", "sum"))
    text = (f"Soak of {summary['runs']} runs at 2 workers on {summary['date']}: {summary['hangs']} hangs, "
            f"{summary['failures']} failures, {summary['left_over_processes']} processes left over "
            f"(median run {summary['median_seconds']:.1f} s).\n\n{per_family.to_markdown()}\n\nEvery run:\n\n"
            f"{table.to_markdown(index=False)}\n")
    print(text)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "soak.md"), "w") as f:
            f.write(text)
        with open(os.path.join(args.out, "soak.json"), "w") as f:
            json.dump({**summary, "runs_detail": rows}, f, indent=1)
    sys.exit(0 if summary["hangs"] == summary["failures"] == summary["left_over_processes"] == 0 else 1)


if __name__ == "__main__":
    main()
