"""Whether the Slurm cluster the `slurm` tests need is up (.ci/slurm-cluster up)."""

from __future__ import annotations

import shutil
import subprocess


def cluster_down() -> str | None:
    """Why no Slurm cluster can take jobs here (one line), or None when one can."""
    if shutil.which("sinfo") is None:
        return "no Slurm client (sinfo); start a cluster with .ci/slurm-cluster up"
    done = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=30)
    if done.returncode != 0 or not {"idle", "mixed", "allocated"} & set(done.stdout.split()):
        return f"no Slurm node up ({(done.stderr or done.stdout).strip() or 'sinfo lists none'}); .ci/slurm-cluster up"
    return None
