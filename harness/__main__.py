"""``python -m harness [overrides]`` (also ``pipebench``): with no overrides, the reduced-size comparison sweep."""

import os
import sys

from harness.cli.app import run_task
from harness.cli.common import hydra_command
from harness.cli.sweep import SWEEP_FAILURES


def main() -> None:
    if len(sys.argv) == 1:
        sys.argv.append("experiment=ci")
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
