"""Preemption and time limits: checkpoint, then let the scheduler requeue the job.

Slurm (and submitit's local executor) warn a job shortly before they stop it, with
``SIGUSR2`` by default (``SUBMITIT_PREEMPT_SIGNAL`` names another). submitit's own
handler then resubmits the job's callable (hydra's submitit launcher makes every sweep
point resubmittable) and exits. :class:`Watch` stands in front of that handler for the
length of one run: the signal only asks the run to stop. Every rank then agrees, at the
end of the same step, to stop (one small all-reduce per step, only while a watch is on),
writes a checkpoint and returns; afterwards the watch records the stop in the run
directory (``preempted.json``) and hands the signal to submitit, which requeues. The
requeued job starts in the same run directory, finds the record of the stop and the
checkpoint, and resumes from it by itself (:func:`resume_point`), counting the resumption.

In a job whose tasks are the ranks (Slurm, one task per GPU) each task receives the signal
itself; where the harness spawned its workers, the watch leaves a stop file in the run
directory that the workers look for at each step.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

STOP_FILE = ".stop"  # in the run directory: the workers stop at the end of a step
MARKER = "preempted.json"  # in the run directory: the last stop, and how many there were
_requested = False  # this process received the signal (a rank that is its own task)


def preemption_signal() -> signal.Signals:
    """The signal a scheduler warns with (submitit's convention: ``SUBMITIT_PREEMPT_SIGNAL``, else USR2)."""
    name = os.environ.get("SUBMITIT_PREEMPT_SIGNAL", "USR2").upper()
    return getattr(signal, name if name.startswith("SIG") else "SIG" + name)


def under_scheduler() -> bool:
    """Whether this process runs as a submitit job (local or Slurm), which can be requeued."""
    return bool(os.environ.get("SUBMITIT_EXECUTOR"))


def stop_requested(run_dir: str) -> bool:
    """This rank's own view: the signal reached this process, or the watch left the stop file."""
    return _requested or os.path.exists(os.path.join(run_dir, STOP_FILE))


def listen() -> None:
    """In a spawned worker: the preemption signal marks this rank's stop request (a scheduler may send
    it to every process of the job, and its default would kill the worker)."""

    def request(signum, frame) -> None:
        global _requested
        _requested = True

    signal.signal(preemption_signal(), request)


class Watch:
    """For the length of one run in ``run_dir``: the preemption signal asks the run to stop (see the
    module docstring) instead of ending the process; :meth:`hand_over` then passes it on."""

    def __init__(self, run_dir: str):
        self.run_dir = run_dir
        self.signum = preemption_signal()
        self.signalled = False
        self._previous = None

    def __enter__(self) -> "Watch":
        global _requested
        _requested = False
        self._clear()
        self._previous = signal.signal(self.signum, self._on_signal)
        return self

    def __exit__(self, *exc) -> None:
        signal.signal(self.signum, self._previous)
        self._clear()

    def _on_signal(self, signum, frame) -> None:
        global _requested
        _requested = self.signalled = True
        os.makedirs(self.run_dir, exist_ok=True)
        with open(os.path.join(self.run_dir, STOP_FILE), "w") as f:
            f.write(f"{time.time()}\n")

    def _clear(self) -> None:
        path = os.path.join(self.run_dir, STOP_FILE)
        if os.path.exists(path):
            os.remove(path)

    def record_stop(self, step: int | None) -> int:
        """Note the stop in the run directory; returns how many times this run has stopped so far."""
        previous = read_marker(self.run_dir)
        count = (previous or {}).get("stops", 0) + 1
        tmp = os.path.join(self.run_dir, MARKER + ".tmp")
        with open(tmp, "w") as f:
            json.dump({"stops": count, "step": step, "time": time.time(), "signal": self.signum.name}, f)
        os.replace(tmp, os.path.join(self.run_dir, MARKER))
        return count

    def hand_over(self) -> None:
        """Give the signal to the handler that was there before (submitit's: on the job's first task it
        resubmits the job and ends the process; on the others it returns); with none to requeue,
        end the process as the signal's default would, now that the checkpoint is written."""
        signal.signal(self.signum, self._previous)
        if not callable(self._previous):
            raise SystemExit(128 + self.signum)
        try:
            self._previous(self.signum, None)
        except subprocess.CalledProcessError as e:
            if not (e.returncode < 0 and "requeue" in e.cmd):
                raise
            # Slurm's requeue ends this attempt at once, the `scontrol requeue` that asked for it
            # included (seen here: killed by the job's SIGTERM before it returned): the requeue is
            # under way, and letting the error through would write a failed result for the job
            sys.exit(-1)  # as submitit ends a task it requeued


def read_marker(run_dir: str) -> dict | None:
    path = os.path.join(run_dir, MARKER)
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        return json.load(f)


def resume_point(run_dir: str) -> tuple[str | None, int]:
    """(the run directory to resume from, how many times it was stopped) for a job starting in
    ``run_dir``: a run that a preemption stopped after its checkpoint continues from it, and so
    does a job Slurm requeued (``SLURM_RESTART_COUNT``) from its latest periodic checkpoint."""
    if not os.path.isfile(os.path.join(run_dir, "checkpoints", "latest")):
        return None, 0
    marker = read_marker(run_dir)
    # Slurm counts every requeue of the job, warned or not; the marker counts the warned stops
    restarts = int(os.environ.get("SLURM_RESTART_COUNT") or 0)
    if marker is not None:
        return run_dir, max(marker["stops"], restarts)
    # requeued by Slurm without a warning (scontrol requeue, a node failure): from its last
    # periodic checkpoint (train.checkpoint_every)
    return (run_dir, restarts) if restarts else (None, 0)
