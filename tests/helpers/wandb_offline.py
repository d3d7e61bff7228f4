"""An offline wandb run read back through wandb's own reader (``wandb leet inspect``), not a
parser of its file format."""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys


def _inspect(folder: str, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "wandb", "leet", "inspect", "--json", *args, folder],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "WANDB_SILENT": "true"},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def offline_run(folder: str) -> dict:
    """What wandb says of the offline run in ``folder``: ``state`` (finished, failed, or running
    for a process that ended without finishing: crashed), ``exit_code``, ``step``, ``tags``,
    ``config`` and ``summary`` (as from ``--summary``), plus ``job_type``, ``group``, the
    ``history`` rows, the ``stats`` (system metrics) records, the logged ``artifacts`` and the
    run's ``files``."""
    run = json.loads(_inspect(folder, "--summary"))
    records = [json.loads(line) for line in _inspect(folder).splitlines() if line.strip()]
    (head,) = [r["run"] for r in records if r.get("type") == "run"]
    history = [r["history"]["item"] for r in records if r.get("type") == "history"]
    files = [os.path.relpath(p, folder) for p in glob.glob(os.path.join(folder, "files", "**", "*"), recursive=True)]
    return {
        **run,
        "job_type": head.get("job_type") or head.get("jobType"),
        "group": head.get("run_group") or head.get("runGroup"),
        "history": history,
        "stats": [r for r in records if r.get("type") == "stats"],
        "artifacts": [r["artifact"] for r in records if r.get("type") == "artifact"],
        "files": files,
    }
