"""Train one configuration, or a sweep of them with -m; with no overrides, the main job.

The main job (``experiment=ci``) is the reduced-size comparison: every strategy on a small
ViT and CIFAR-100-shaped data that needs no download, 2 CPU workers, 14 runs in three
blocks, ending with the comparison table. One run writes ``metrics.json`` (the record)
into its run directory (``outputs/<date>/<time>_<strategy>_w<N>``, or
``hydra.run.dir=...``); a sweep writes one per job under ``multirun/<date>/<time>`` and
ends with the table, ``results.{md,csv,tex}`` and ``figures/``. A refused configuration
is one ``error:`` line (exit 2) before any worker starts; a failed run has a record
marked failed (exit 1); in a sweep the other jobs go on.

Examples:
  pipebench run strategy=hippie world_size=2 train.micro_batches=4
  pipebench run -m strategy=dp,hippie,ashpipe world_size=2
  pipebench run experiment=schedules
"""

from __future__ import annotations

import os

OVERRIDES = True
MAIN_JOB = "experiment=ci"
# Hydra's flags that print and exit instead of running a job
_NO_RUN = {"--help", "-h", "--hydra-help", "--cfg", "-c", "--info", "-i", "--shell-completion", "-sc"}


def one_rank_of_a_job() -> bool:
    """Started by torchrun or Slurm as one rank: this process trains, it starts no workers."""
    return os.environ.get("RANK") is not None or int(os.environ.get("SLURM_NTASKS", "1")) > 1


def main(args: list[str]) -> int:
    from harness.config.registry import strategy_modules  # both import nothing heavy
    from harness.core.host import prestart

    args = list(args) or [MAIN_JOB]
    if not one_rank_of_a_job() and not _NO_RUN.intersection(a.split("=")[0] for a in args):
        # the worker processes' server imports torch, the runtime and the strategies while this process
        # imports Hydra, checks the overrides and composes the config (harness.core.host)
        prestart(strategy_modules())
    # imported after the server started, for the overlap above
    from harness.cli.hydra_app import hydra_command
    from harness.cli.job import task
    from harness.cli.sweep import SWEEP_FAILURES

    extra = []
    if os.environ.get("RANK", "0") != "0" or os.environ.get("SLURM_PROCID", "0") != "0":
        # one rank of a torchrun/Slurm job: rank 0 alone writes the run directory
        extra = ["hydra.output_subdir=null", "hydra/job_logging=none", "hydra/hydra_logging=none"]
    sweeps_before = len(SWEEP_FAILURES)
    hydra_command(task, args, extra)
    # a sweep runs every job even when some fail; its exit status still says so
    return 1 if any(SWEEP_FAILURES[sweeps_before:]) else 0
