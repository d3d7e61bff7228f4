"""``python -m harness.results SOURCE ...``: the interface DESIGN.md keeps for scripts; the same as
``pipebench results`` (harness/commands/results.py)."""

import sys

from harness.commands import main

if __name__ == "__main__":
    sys.exit(main(["results", *sys.argv[1:]]))
