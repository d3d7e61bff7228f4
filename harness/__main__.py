"""``python -m harness [<command>] [args]``: ``pipebench``, where no command means ``run``
(so ``python -m harness`` alone runs the main job, the reduced-size comparison)."""

import sys

from harness.commands import main

if __name__ == "__main__":
    sys.exit(main(default="run"))
