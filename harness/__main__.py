"""``python -m harness [overrides]``: with no overrides, the reduced-size comparison sweep."""

import os
import sys

from harness.app import CONFIG_DIR, main
from harness.config import refuse_unknown_choices

if __name__ == "__main__":
    if len(sys.argv) == 1:
        sys.argv.append("experiment=ci")
    if os.environ.get("RANK", "0") != "0" or os.environ.get("SLURM_PROCID", "0") != "0":
        # one rank of a torchrun/Slurm job: rank 0 alone writes the run directory
        sys.argv += ["hydra.output_subdir=null", "hydra/job_logging=none", "hydra/hydra_logging=none"]
    refuse_unknown_choices(sys.argv[1:], CONFIG_DIR)
    main()
    from harness.results import SWEEP_FAILURES

    # a sweep runs every job even when some fail; its exit status still says so
    if SWEEP_FAILURES and SWEEP_FAILURES[-1]:
        sys.exit(1)
