"""``python -m harness [overrides]`` (also ``pipebench``): with no overrides, the reduced-size comparison sweep."""

import os
import sys

from harness.core.host import prestart


def _one_rank_of_a_job() -> bool:
    """Started by torchrun or Slurm as one rank: this process trains, it starts no workers."""
    return os.environ.get("RANK") is not None or int(os.environ.get("SLURM_NTASKS", "1")) > 1


# Hydra's flags that print and exit instead of running a job
_NO_RUN = {"--help", "-h", "--hydra-help", "--cfg", "-c", "--info", "-i", "--shell-completion", "-sc", "--version"}


def main() -> None:
    if len(sys.argv) == 1:
        sys.argv.append("experiment=ci")
    joined = _one_rank_of_a_job()
    if not joined and not _NO_RUN.intersection(a.split("=")[0] for a in sys.argv[1:]):
        # the worker processes' server imports torch and the runtime while this process imports Hydra
        # and the rest (harness.core.host); a refused configuration still starts no worker
        prestart()
    from harness.cli.app import run_task
    from harness.cli.common import hydra_command
    from harness.cli.sweep import SWEEP_FAILURES

    extra = []
    if os.environ.get("RANK", "0") != "0" or os.environ.get("SLURM_PROCID", "0") != "0":
        # one rank of a torchrun/Slurm job: rank 0 alone writes the run directory
        extra = ["hydra.output_subdir=null", "hydra/job_logging=none", "hydra/hydra_logging=none"]
    hydra_command(run_task, extra)
    # a sweep runs every job even when some fail; its exit status still says so
    if SWEEP_FAILURES and SWEEP_FAILURES[-1]:
        sys.exit(1)


if __name__ == "__main__":
    main()
