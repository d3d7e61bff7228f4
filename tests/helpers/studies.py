"""The committed studies the suite checks, and those whose runs predate a rule they are checked by."""

from __future__ import annotations

import os

import pytest

from harness.report.checks import studies
from tests.helpers.cli import ROOT

RESULTS = os.path.join(ROOT, "results")

# study -> what brings it under a rule; a strict xfail: the rerun that fixes one fails the suite
# until its line goes. Runs from one commit and a clean tree:
UNCLEAN = {"simulator_validation": "five commits, some dirty: rerun with the simulator's rework (issue 54)"}
# what today's code makes from the records, with no impossible figure:
UNREPRODUCED = {"accuracy_paper_digits": "its memory figures predate the digits memory fix (e343568): rerun (55 min)"}


def params(names: list[str], pending: dict[str, str]) -> list:
    """``names`` as pytest parameters, those ``pending`` marked."""
    return [
        pytest.param(n, marks=pytest.mark.xfail(strict=True, reason=pending[n])) if n in pending else n for n in names
    ]


def committed() -> list[str]:
    """Every study under results/ (harness.report.checks.studies)."""
    return studies(RESULTS)


def tabled() -> list[str]:
    """The studies with a comparison table, which ``pipebench results --check`` regenerates."""
    return [s for s in committed() if os.path.isfile(os.path.join(RESULTS, s, "results.md"))]
