"""Starting the workers of one run, and turning their outcome into one record.

Two ways in:
- **local** (the default): this process starts ``world_size`` workers on this
  machine (:func:`harness.core.host.start_workers`: forked from a server that has
  already imported torch and the runtime), watches them, and ends all of them when
  one fails (``launch.failure_timeout`` bounds how long that takes);
- **join**: when torchrun or Slurm started this process as one rank
  (RANK/WORLD_SIZE/MASTER_ADDR set), it trains as that rank; rank 0 writes the
  record.
Either way the record is written by this module, so a crashed worker still
leaves ``metrics.json`` with ``status: failed``.
"""

from __future__ import annotations

import glob
import json
import os
import pickle
import re
import signal
import threading
import time
import traceback

import torch.multiprocessing as tmp

from harness.config.registry import strategy_modules
from harness.config.spec import RunSpec
from harness.core import comm as comm_mod
from harness.core.errors import ConfigError, Interrupted
from harness.core.host import start_workers
from harness.report import record as record_mod
from harness.run import preemption
from harness.run.worker import started_rank, train, worker_main

_RESULT_FILE = ".worker_result.json"


def run(spec: RunSpec, output_dir: str, progress: bool = True) -> dict:
    """Train ``spec`` and return its record (also written to ``output_dir/metrics.json``). A SIGINT or
    SIGTERM stops the run on purpose: its workers are ended, its record is written (failed, with the
    signal's name in ``interrupted``) and :class:`Interrupted` goes on up, to end the command."""
    os.makedirs(output_dir, exist_ok=True)
    record = record_mod.new_record(spec)
    started = time.perf_counter()
    joined = comm_mod.env_rank_info()
    try:
        with _Stop() as stop:
            if joined is not None:
                result = _run_joined(spec, joined)
                if joined[0] != 0:
                    return record  # only rank 0 writes the record
            else:
                result = _run_local(spec, output_dir, progress, stop)
        record.update(result)
        record["status"] = "ok"
    except Interrupted as e:
        if joined is not None and joined[0] != 0:
            raise
        seconds = time.perf_counter() - started
        record.update(
            status="failed",
            interrupted=e.name,
            wall_time_s=seconds,
            error=f"interrupted by {e.name} after {seconds:.0f} s (stopped on purpose; its workers were ended)",
        )
        path = record_mod.write(output_dir, record)
        raise Interrupted(
            e.signum, f"interrupted by {e.name}: the run stopped, its record (marked failed) is {path}"
        ) from e
    except WorkerFailure as e:
        record.update(status="failed", error=str(e), failed_rank=e.rank, traceback=e.details)
    except ConfigError:
        raise
    except Exception as e:  # a failure in this process (joined mode): keep the record
        record.update(status="failed", error=_joined_error(e), traceback=traceback.format_exc(limit=8))
    record["wall_time_s"] = time.perf_counter() - started
    record_mod.write(output_dir, record)
    return record


def _joined_error(e: Exception) -> str:
    """One line for a rank's failure in a job whose tasks are the ranks: which peer died is known
    to the scheduler (its task's exit), not to this rank, which sees the peer's connection close."""
    text = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
    if "Connection reset by peer" in text or "Connection closed by peer" in text:
        return f"another rank's process ended during the run (its connection closed; the scheduler's log says which): {text}"
    return text


class WorkerFailure(RuntimeError):
    def __init__(self, rank: int | None, message: str, details: str | None = None):
        super().__init__(message)
        self.rank, self.details = rank, details


def _run_joined(spec: RunSpec, info: tuple[int, int, int]) -> dict:
    rank, world_size, local_rank = info
    expected = spec.strategy_cls.processes(spec)
    if world_size != expected:
        raise ConfigError(
            f"world_size={spec.world_size} with strategy={spec.strategy.name} needs {expected} process(es) "
            f"but the launcher started {world_size}; start {expected} task(s) or change world_size"
        )
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    with started_rank(spec, rank, world_size, local_rank, local_world) as ctx:
        return train(spec, ctx, local_world=local_world) or {}


class _Stop:
    """For the length of one run: the first SIGINT (Ctrl-C) or SIGTERM stops it, as
    :class:`Interrupted` raised in this process's main thread (the run's cleanup ends the workers);
    a second one ends the command at once, its workers killed. Under a scheduler (a submitit
    job) SIGTERM keeps submitit's own meaning, and its preemption signal its requeue
    (harness.run.preemption)."""

    def __init__(self):
        self.workers: list = []  # the processes a second signal kills
        self._first: int | None = None
        self._previous: dict = {}

    def __enter__(self) -> "_Stop":
        if threading.current_thread() is threading.main_thread():  # handlers live in the main thread
            signals = [signal.SIGINT] + ([] if preemption.under_scheduler() else [signal.SIGTERM])
            self._previous = {s: signal.signal(s, self._handle) for s in signals}
        return self

    def __exit__(self, *exc) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)

    def _handle(self, signum, frame) -> None:
        if self._first is not None:
            for p in self.workers:
                if p.is_alive():
                    p.kill()
            os._exit(128 + signum)
        self._first = signum
        raise Interrupted(signum)


def _run_local(spec: RunSpec, output_dir: str, progress: bool, stop: _Stop) -> dict:
    result_path = os.path.join(output_dir, _RESULT_FILE)
    for stale in glob.glob(glob.escape(result_path) + "*"):
        os.remove(stale)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(comm_mod.free_port())
    n = spec.strategy_cls.processes(spec)
    ctx = start_workers(
        worker_main, args=(spec, n, n, result_path, progress), nprocs=n, join=False, preload=strategy_modules()
    )
    stop.workers = ctx.processes
    try:
        # join() returns True when all exited cleanly; on the first failure it
        # terminates the others (SIGTERM, then SIGKILL after the grace period)
        # and raises with the failing rank's traceback.
        while not ctx.join(timeout=0.5, grace_period=spec.launch.failure_timeout):
            pass
    except tmp.ProcessRaisedException as e:
        rank, text = _first_failed(ctx, result_path, e.error_index, str(e))
        raise WorkerFailure(rank, f"rank {rank} raised {_last_line(text)}", text) from None
    except tmp.ProcessExitedException as e:
        how = (
            f"was killed by {signal.Signals(-e.exit_code).name}"
            if e.exit_code < 0
            else f"exited with code {e.exit_code}"
        )
        raise WorkerFailure(e.error_index, f"rank {e.error_index} {how}") from None
    finally:
        _end_all(ctx)
        for mark in glob.glob(glob.escape(result_path) + ".failed.*"):
            os.remove(mark)
    with open(result_path) as f:
        result = json.load(f)
    os.remove(result_path)
    return result


def _first_failed(ctx, result_path: str, reported: int, text: str) -> tuple[int, str]:
    """The rank that raised first, and its traceback. join() reports whichever failed process
    it looks at first, which may be a peer that raised only because the first one went away
    (a closed connection); each raising rank marks the time it failed before it tears down."""
    marks = {}
    for rank in range(len(ctx.processes)):
        try:
            with open(f"{result_path}.failed.{rank}") as f:
                marks[rank] = float(f.read())
        except (OSError, ValueError):
            continue
    first = min(marks, key=marks.get, default=reported)
    if first != reported:
        try:
            with open(ctx.error_files[first], "rb") as f:
                return first, pickle.load(f)
        except (OSError, EOFError, pickle.UnpicklingError):
            pass
    return reported, text


def _end_all(ctx) -> None:
    """Never leave a worker behind, whatever happened above."""
    for p in ctx.processes:
        if p.is_alive():
            p.kill()
    for p in ctx.processes:
        p.join(timeout=5)


_EXCEPTION_LINE = re.compile(r"^([A-Za-z_][\w.]*(Error|Exception|Interrupt|Timeout|Exit))(:.*)?$")


def _last_line(text: str) -> str:
    """The last 'SomeError: message' line of a traceback (messages may span lines)."""
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    for i in range(len(lines) - 1, -1, -1):
        if _EXCEPTION_LINE.match(lines[i]):
            rest = lines[i + 1 : i + 3] if lines[i].endswith(":") else []
            return " ".join([lines[i], *rest])
    return lines[-1] if lines else text
