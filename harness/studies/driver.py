"""What every study shares: run a matrix of configurations round after round, each run as a user
runs it (``python -m harness <verb> ...`` in its own process, with a deadline), read what it
recorded through the record module, and write the study's tables.

Repeats are interleaved in time (every configuration once, then again, ...), so a shared
machine's drift falls on every configuration alike. A run that outlives its deadline is a
hang: every process of it is killed. Any process a run started that outlives it by 3 seconds
is counted as left over, and killed; a job's processes are found by a mark in their
environment, whoever their parent is by then.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
import uuid
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
    stderr: list[str] = field(default_factory=list)  # what the command printed on its standard error


MARK = "PIPEBENCH_JOB"  # set in a command's environment, inherited by every process it starts


def job_processes(mark: str) -> list[psutil.Process]:
    """Every live process of the job whose environment carries ``mark``: the command, the server
    that forks its workers, the workers, multiprocessing's resource tracker; found by what they
    share, whoever their parent is now (a process whose parent died is re-parented)."""
    found = []
    for p in psutil.process_iter():
        try:
            if p.environ().get(MARK) == mark and p.status() != psutil.STATUS_ZOMBIE:
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


@dataclass(frozen=True)
class Interruption:
    """A signal sent to a running job ``after`` seconds after its workers appeared (and its run folder,
    where one is named): to the command
    (``command``), its process group (``group``: the command then runs in a session of its own, as
    a terminal's foreground job does), one of its workers (``worker``) or the server that forks
    them (``server``)."""

    signum: int
    target: str
    after: float

    def __str__(self) -> str:
        return f"{signal.Signals(self.signum).name} to the {self.target} after {self.after:.1f} s"


def _workers_and_server(command: psutil.Process) -> tuple[list[psutil.Process], psutil.Process | None]:
    try:
        servers = [c for c in command.children() if "forkserver" in " ".join(c.cmdline())]
        return ([w for s in servers for w in s.children()], servers[0] if servers else None)
    except psutil.NoSuchProcess:
        return [], None


def _interrupt(proc: subprocess.Popen, how: Interruption, workers: list[psutil.Process], server) -> None:
    if how.target == "command":
        os.kill(proc.pid, how.signum)
    elif how.target == "group":
        os.killpg(proc.pid, how.signum)
    elif how.target == "worker" and workers:
        workers[-1].send_signal(how.signum)
    elif how.target == "server" and server is not None:
        server.send_signal(how.signum)


def run_command(
    args: list[str],
    run_dir: str | None = None,
    deadline_s: float = 900,
    cwd: str = ".",
    env: dict | None = None,
    interruption: Interruption | None = None,
) -> Outcome:
    """``python -m harness args`` (``hydra.run.dir=run_dir`` added where given), watched until it ends
    or its deadline passes (a hang: every process of the job is killed), its record read from
    ``run_dir``; ``interruption``: a signal sent to it once its workers run. Any process of the job
    alive 3 s after the command ended is left over (counted, then killed)."""
    cmd = [sys.executable, "-m", "harness", *args] + ([f"hydra.run.dir={run_dir}"] if run_dir else [])
    mark = uuid.uuid4().hex
    started = time.time()
    proc = subprocess.Popen(
        cmd,
        cwd=cwd,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "WANDB_SILENT": "true", **(env or {}), MARK: mark},
        start_new_session=interruption is not None and interruption.target == "group",
    )
    command = psutil.Process(proc.pid)
    hung, workers_seen = False, None
    stderr: list[str] = []  # read as it comes: a full pipe would stall the command
    reader = threading.Thread(target=lambda: stderr.extend(proc.stderr), daemon=True)
    reader.start()
    while proc.poll() is None:
        if interruption is not None:
            workers, server = _workers_and_server(command)
            # the clock starts once the job trains: its workers run and its folder is there (the
            # signal is meant for a run under way, not for the command's start-up)
            if workers_seen is None and workers and (run_dir is None or os.path.isdir(run_dir)):
                workers_seen = time.time()
            if workers_seen is not None and time.time() - workers_seen >= interruption.after:
                _interrupt(proc, interruption, workers, server)
                interruption = None
        if time.time() - started > deadline_s:
            hung = True
            for p in job_processes(mark):
                p.kill()
            break
        time.sleep(0.1)
    proc.wait()
    reader.join(timeout=5)
    # what outlives its command by 3 s is left over (wandb's service polls its parent every second
    # or so and ends by itself when a command was killed outright)
    waited = time.time()
    while job_processes(mark) and time.time() - waited < 3.0:
        time.sleep(0.2)
    left = job_processes(mark)
    for p in left:
        p.kill()
    stderr_lines = "".join(stderr).strip().splitlines()
    seconds = round(time.time() - started, 1)
    if hung:
        return Outcome(
            "hang", seconds, None, None, f"still running after {deadline_s:.0f} s", len(left), started, stderr_lines
        )
    record, error = read_record(run_dir) if run_dir else (None, None)
    recorded_ok = run_dir is None or (record or {}).get("status") == "ok"  # a command that records must say ok
    if proc.returncode == 0 and recorded_ok:
        return Outcome("ok", seconds, 0, record, None, len(left), started, stderr_lines)
    error = (record or {}).get("error") or error or (stderr_lines[-1] if stderr_lines else "no output")
    return Outcome("failed", seconds, proc.returncode, record, error, len(left), started, stderr_lines)


def run_or_raise(args: list[str], cwd: str = ".", run_dir: str | None = None) -> None:
    """``pipebench <args>`` as :func:`run_command` runs it (a 900 s deadline); a failure or a hang
    raises RuntimeError with the command's reason, ending the study that needed it."""
    outcome = run_command(args, run_dir, deadline_s=900, cwd=cwd)
    if outcome.status != "ok":
        raise RuntimeError(f"pipebench {' '.join(args)} {outcome.status}: {outcome.error}")


def read_record(run_dir: str) -> tuple[dict | None, str | None]:
    """The record in ``run_dir``, or None and why not (one line)."""
    path = os.path.join(run_dir, RECORD_FILE)
    try:
        return read(path), None
    except RecordError as e:
        return None, str(e)
    except (OSError, ValueError) as e:
        return None, f"no readable record at {path} ({type(e).__name__}: {e})"


def measured_on(*folders: str) -> str:
    """The day (ISO) the latest run under ``folders`` started, from the runs' records (their files'
    times change with every checkout); today where none says."""
    days = []
    for root, _, files in (walked for folder in folders for walked in os.walk(folder)):
        if RECORD_FILE in files:
            record, _ = read_record(root)
            if record and record.get("started_at"):
                days.append(record["started_at"][:10])
    return max(days, default=time.strftime("%Y-%m-%d"))


def interleaved(
    configs: dict[str, T],
    repeats: int,
    run_one: Callable[[str, T, int], Outcome],
    shown: Callable[[Outcome], str] | None = None,
) -> dict[str, list[Outcome]]:
    """Every configuration once per round, ``repeats`` rounds; prints one line per run."""
    results: dict[str, list[Outcome]] = {name: [] for name in configs}
    total, done = repeats * len(configs), 0
    for r in range(repeats):
        for name, config in configs.items():
            outcome = run_one(name, config, r)
            results[name].append(outcome)
            done += 1
            text = (
                shown(outcome)
                if shown and outcome.status == "ok"
                else outcome.status + (f" ({outcome.error})" if outcome.error else "")
            )
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
