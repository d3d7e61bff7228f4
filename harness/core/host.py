"""Worker processes on this host: how they start, their torch threads, the CPU allocator's settings.

Shared by the launcher (training workers), the profiler (measuring workers) and the
tests, so all run under the same conditions.

**How they start.** Workers are forked from a server process that has already
imported torch, timm and the runtime (multiprocessing's *forkserver*, with those
modules preloaded), instead of each starting a fresh interpreter (*spawn*): on this
2-core machine each spawned worker spent 3.5-7 s importing torch, timm and
torchvision (torchvision pulls in torch._dynamo) before its first step, two of
them at once. ``python -m harness`` starts the server first thing
(:func:`prestart`), so its imports run beside the command's own.

Not a plain fork of the command itself: the command holds threads (wandb, tqdm,
Hydra's logging), and a fork copies their locks in whatever state they are in. The
server holds none and never runs a torch operation, so no thread pool is forked
either; importing torch does not touch CUDA, so the same holds on GPUs (PyTorch
supports spawn and forkserver with CUDA, not fork).

A forked worker would otherwise see the server's world as it was when the server
started; it is given the caller's at the time of the start instead: the environment
(MASTER_PORT changes per run; DS_ACCELERATOR is read when DeepSpeed is imported,
which the server does not preload) and the standard output and error (a progress
bar goes where the command's output goes). glibc reads its malloc settings once,
when a process starts, so :func:`cpu_worker_environment` is applied before the
server starts.
"""

from __future__ import annotations

import atexit
import multiprocessing as mp
import multiprocessing.forkserver as forkserver
import os
import signal
import sys
from multiprocessing import reduction
from typing import Iterable


def threads_per_process(requested: int, local_world: int) -> int:
    """``requested`` intra-op threads, or (0) the host's cores shared among ``local_world`` workers."""
    if requested > 0:
        return requested
    return max(1, (os.cpu_count() or 1) // max(1, local_world))


# glibc returns freed blocks over 128 KiB to the system at once, so every training step faults
# its activation memory in again (about 2,000 page faults per vit_micro step here), at a cost
# that swings with the host's load; keeping freed memory in the process makes CPU steps
# faster and their times steadier (the knobs PyTorch's CPU performance guide points to)
_CPU_ALLOCATOR_ENV = {
    "MALLOC_MMAP_THRESHOLD_": str(2**30),
    "MALLOC_TRIM_THRESHOLD_": str(2**36),
    "MALLOC_TOP_PAD_": str(2**28),
}


def cpu_worker_environment() -> None:
    """Allocator settings for CPU worker processes started from here (values already set win)."""
    for key, value in _CPU_ALLOCATOR_ENV.items():
        os.environ.setdefault(key, value)


# what every worker imports before it trains, besides the strategies' own modules (named by the
# caller, from the strategy registry: harness.config.registry.strategy_modules): torch, the training
# loop, and timm's ViT, which the command process imports only where it builds a model. DeepSpeed is
# imported by its strategy only when one is built, since it reads the environment at import.
WORKER_IMPORTS = ["torch", "timm.models.vision_transformer", "harness.run.worker"]
START_METHOD = "forkserver"
_preload = list(WORKER_IMPORTS)


def prestart(modules: Iterable[str] = ()) -> None:
    """Start the server now, so that its imports overlap the caller's (once per process), with
    ``modules`` among what it imports first (they are imported by every worker it forks)."""
    _preload.extend(m for m in modules if m not in _preload)
    cpu_worker_environment()
    mp.get_context(START_METHOD).set_forkserver_preload(_preload)
    if _server_pid() is None:
        atexit.register(_stop_server)
    forkserver.ensure_running()


def _server_pid() -> int | None:
    return getattr(forkserver._forkserver, "_forkserver_pid", None)


def _stop_server() -> None:
    """At exit: end the server even while it is still importing (it would otherwise finish its
    imports before it noticed, outliving a command refused in its first second)."""
    pid = _server_pid()
    if pid is None:
        return
    try:
        os.kill(pid, signal.SIGTERM)
        os.waitpid(pid, 0)
    except (ProcessLookupError, ChildProcessError):
        pass


def worker_context():
    """The multiprocessing context workers start from (for synchronisation objects they share)."""
    prestart()
    return mp.get_context(START_METHOD)


def start_workers(fn, args: tuple, nprocs: int, join: bool = True, preload: Iterable[str] = ()):
    """``fn(rank, *args)`` in ``nprocs`` worker processes, through torch.multiprocessing's
    ``start_processes`` (with ``join=False``, its context, to watch and end them); ``preload``: the
    modules the server imports first, if it is not running yet (see :func:`prestart`)."""
    import torch.multiprocessing as tmp  # this module stays importable without torch (the command's first step)

    prestart(preload)
    return tmp.start_processes(
        _entry, args=(_Inherited(), fn, args), nprocs=nprocs, join=join, start_method=START_METHOD
    )


def _entry(rank: int, inherited: "_Inherited", fn, args: tuple) -> None:
    # here, not while unpickling: torch's start_processes sets its own parent-death signal (SIGINT)
    # in between, which a worker that ignores SIGINT would not die of
    _worker_lifetime(inherited.server)
    fn(rank, *args)


class _Inherited:
    """The caller's environment and standard streams, applied while a worker unpickles its
    arguments, and the worker's lifetime rules (:func:`_worker_lifetime`). It comes first among
    them: unpickling ``fn`` and ``args`` may import modules (a baseline's library) that read the
    environment."""

    def __init__(self, server: int | None = None):
        self.server = server  # the pid of the server that forks the workers

    def __reduce__(self):
        # DupFd works only while multiprocessing pickles a new process's arguments: the
        # descriptor is passed to the child alongside them
        streams = [(fd, reduction.DupFd(fd)) for fd in (1, 2) if _is_open(fd)]
        return _restore, (dict(os.environ), streams, _server_pid())


def _restore(env: dict, streams: list, server: int | None) -> _Inherited:
    os.environ.clear()
    os.environ.update(env)
    for target, dup in streams:
        fd = dup.detach()
        os.dup2(fd, target)
        os.close(fd)
    return _Inherited(server)


_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _worker_lifetime(server: int | None) -> None:
    """A worker lives no longer than its job, and the command alone ends it on purpose.

    - It is killed when the server that forked it ends, however that ends: the server ends when
      the command does (it watches a pipe from it), so no worker outlives a command killed
      outright (SIGKILL), and none outlives a server killed on its own. The server hands every
      process it forks a copy of that pipe's writing end, so that it lives while any of them does;
      a worker closes its copy, or the server and the workers would keep each other alive.
    - It ignores SIGINT: a terminal's Ctrl-C reaches every process of the foreground group, and
      the command, which records the run as interrupted, ends its workers itself (no worker dies
      first, leaving a traceback of its own). SIGTERM keeps its default: the command's end of a
      failed job terminates the other workers with it."""
    if sys.platform.startswith("linux"):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        if server is not None and os.getppid() != server:  # the server ended before the request held
            os._exit(1)
    alive = getattr(forkserver._forkserver, "_forkserver_alive_fd", None)
    if alive is not None:
        try:
            os.close(alive)
        except OSError:
            pass
        forkserver._forkserver._forkserver_alive_fd = None
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
        return True
    except OSError:
        return False
