"""What every study shares: run a matrix of configurations round after round, each run as a user
runs it (``python -m harness <verb> ...`` in its own process, with a deadline), read what it
recorded through the record module, and write the study's tables.

Repeats are interleaved in time (every configuration once, then again, ...), so a shared
machine's drift falls on every configuration alike. A run that outlives its deadline is a
hang: its whole process tree is killed. Any process a run started that outlives it by a
second is counted as left over, and killed.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, TypeVar

import psutil

from harness.report.record import RECORD_FILE, read
from harness.report.schema import RecordError

T = TypeVar("T")


@dataclass
class Outcome:
    """How one command ended: ``ok`` (exit 0, and an ``ok`` record where one was expected),
    ``failed`` or ``hang``; its record; the processes it left behind."""

    status: str
    seconds: float
    returncode: int | None = None
    record: dict | None = None
    error: str | None = None
    left_over: int = 0
    started_at: float = field(default_factory=time.time)


def _tree(proc: psutil.Process) -> list[psutil.Process]:
    try:
        return [proc, *proc.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def run_command(args: list[str], run_dir: str | None = None, deadline_s: float = 900, cwd: str = ".",
                env: dict | None = None) -> Outcome:
    """``python -m harness args`` (``hydra.run.dir=run_dir`` added where given), watched until it ends
    or its deadline passes; its record read from ``run_dir``."""
    cmd = [sys.executable, "-m", "harness", *args] + ([f"hydra.run.dir={run_dir}"] if run_dir else [])
    started = time.time()
    proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "WANDB_SILENT": "true", **(env or {})})
    watched = psutil.Process(proc.pid)
    seen: dict[int, psutil.Process] = {}
    hung = False
    while proc.poll() is None:
        for p in _tree(watched):  # every process the run starts, to look for any left behind
            seen.setdefault(p.pid, p)
        if time.time() - started > deadline_s:
            hung = True
            for p in _tree(watched):
                p.kill()
            break
        time.sleep(0.2)
    _, stderr = proc.communicate()
    stderr_lines = (stderr or "").strip().splitlines()
    time.sleep(1.0)  # what outlives its run by a second is left over
    left = [p for p in seen.values() if p.pid != proc.pid and _alive(p)]
    for p in left:
        p.kill()
    seconds = round(time.time() - started, 1)
    if hung:
        return Outcome("hang", seconds, None, None, f"still running after {deadline_s:.0f} s", len(left), started)
    record, error = read_record(run_dir) if run_dir else (None, None)
    recorded_ok = run_dir is None or (record or {}).get("status") == "ok"  # a command that records must say ok
    if proc.returncode == 0 and recorded_ok:
        return Outcome("ok", seconds, 0, record, None, len(left), started)
    error = (record or {}).get("error") or error or (stderr_lines[-1] if stderr_lines else "no output")
    return Outcome("failed", seconds, proc.returncode, record, error, len(left), started)


def _alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def read_record(run_dir: str) -> tuple[dict | None, str | None]:
    """The record in ``run_dir``, or None and why not (one line)."""
    path = os.path.join(run_dir, RECORD_FILE)
    try:
        return read(path), None
    except RecordError as e:
        return None, str(e)
    except (OSError, ValueError) as e:
        return None, f"no readable record at {path} ({type(e).__name__}: {e})"


def interleaved(configs: dict[str, T], repeats: int, run_one: Callable[[str, T, int], Outcome],
                shown: Callable[[Outcome], str] | None = None) -> dict[str, list[Outcome]]:
    """Every configuration once per round, ``repeats`` rounds; prints one line per run."""
    results: dict[str, list[Outcome]] = {name: [] for name in configs}
    total, done = repeats * len(configs), 0
    for r in range(repeats):
        for name, config in configs.items():
            outcome = run_one(name, config, r)
            results[name].append(outcome)
            done += 1
            text = shown(outcome) if shown and outcome.status == "ok" else outcome.status + (
                f" ({outcome.error})" if outcome.error else "")
            print(f"[{done}/{total}] {name} repeat {r}: {text} in {outcome.seconds:.0f} s", flush=True)
    return results


def write(out: str, stem: str, markdown: str, data: dict) -> None:
    """``<out>/<stem>.md`` and ``<out>/<stem>.json``."""
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, f"{stem}.md"), "w") as f:
        f.write(markdown.rstrip() + "\n")
    with open(os.path.join(out, f"{stem}.json"), "w") as f:
        json.dump(data, f, indent=1, default=str)


def median(values: Iterable[float | None]) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None
