"""``python -m harness [overrides]``: with no overrides, the reduced-size comparison sweep."""

import sys

from harness.app import main

if __name__ == "__main__":
    if len(sys.argv) == 1:
        sys.argv.append("experiment=ci")
    main()
