"""The suite mirrors the layout: unit/ (no processes), distributed/ (real gloo process groups),
e2e/ (the commands, as a user runs them), gpu/ (one CUDA device; skipped without one), slurm/ (a
real Slurm cluster, .ci/slurm-cluster up; skipped without one). Each
folder's tests carry its marker, so ``pytest -m "not e2e"`` is the fast loop and ``pytest -m
unit`` the fastest."""

from __future__ import annotations

import os

import pytest

_KINDS = ("unit", "distributed", "e2e", "gpu", "slurm")


def pytest_collection_modifyitems(config, items):
    here = os.path.dirname(__file__)
    for item in items:
        kind = os.path.relpath(str(item.path), here).split(os.sep)[0]
        if kind in _KINDS:
            item.add_marker(getattr(pytest.mark, kind))


@pytest.fixture
def workdir(tmp_path):
    return str(tmp_path)
