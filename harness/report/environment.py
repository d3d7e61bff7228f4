"""Where a record was produced: the code's commit, library versions, the devices and the host.

The pieces come from ``torch.utils.collect_env`` (the helpers behind PyTorch's
bug-report script; its slow package listing is skipped) and from the installed
packages' metadata, never from parsing version strings by hand.
"""

from __future__ import annotations

import functools
import importlib.metadata
import os
import platform
import subprocess

import torch
from torch.utils import collect_env

# the libraries whose versions decide what a run measures
PACKAGES = ("torch", "torchvision", "deepspeed", "torchgpipe", "timm", "hydra-core", "wandb", "pipebench")


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


_CHECKOUT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # above harness/


def _git(*args: str) -> str | None:
    """``git args`` in the checkout this code runs from; None for an installed package (even one
    installed into a folder inside some repository: only a checkout whose root holds this very
    ``harness/`` counts)."""

    def run(*a: str) -> str | None:
        try:
            out = subprocess.run(["git", *a], cwd=_CHECKOUT, capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.SubprocessError):
            return None
        return out.stdout.strip() if out.returncode == 0 else None

    top = run("rev-parse", "--show-toplevel")
    if not top or not os.path.samefile(top, _CHECKOUT):
        return None
    return run(*args)


def _cpu_model() -> str | None:
    lscpu = collect_env.get_cpu_info(collect_env.run) or ""
    for line in lscpu.splitlines():
        if line.startswith("Model name:"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or None


def _nccl() -> str | None:
    try:
        version = torch.cuda.nccl.version()
    except Exception:  # a build without NCCL
        return None
    return ".".join(map(str, version)) if isinstance(version, tuple) else str(version)


@functools.cache
def environment() -> dict:
    """This process's environment, for every record (computed once per process)."""
    commit = _git("rev-parse", "HEAD")
    # the code that ran: a study rerun into its committed folder under results/ rewrites tracked
    # records there, which is output, not a change to what runs
    status = _git("status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)results") if commit else None
    gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return {
        "git_commit": commit,
        "git_dirty": bool(status) if commit else None,
        "python": platform.python_version(),
        "packages": {name: _version(name) for name in PACKAGES},
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "nccl": _nccl(),
        "gpus": gpus,
        "gpu_count": len(gpus),
        "nvidia_driver": collect_env.get_nvidia_driver_version(collect_env.run),
        "cpu": _cpu_model(),
        "cpu_cores": os.cpu_count(),
        "os": collect_env.get_os(collect_env.run),
        "host": platform.node(),
    }
