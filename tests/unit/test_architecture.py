"""The one-way architecture, enforced: import-linter's contracts (pyproject.toml) hold, they
catch a wrong import, and no module outside a strategy's own file decides by its name."""

import os
import re
import shutil
import subprocess
import sys

import pytest

from tests.helpers.cli import ROOT

LINT_IMPORTS = os.path.join(os.path.dirname(sys.executable), "lint-imports")


def _lint(cwd: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": cwd}  # the tree in cwd, not the installed one
    return subprocess.run([LINT_IMPORTS, "--no-cache"], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def test_the_import_contracts_hold():
    proc = _lint(ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "0 broken" in proc.stdout


@pytest.mark.parametrize(
    "module,line,broken",
    [
        (
            "harness/runtime/partition.py",
            "from harness.config.spec import RunSpec",
            "The runtime and planning never import Hydra, the config, strategies or commands BROKEN",
        ),
        (
            "harness/commands/bench.py",
            "from harness.commands.results import main",
            "Commands do not import each other BROKEN",
        ),
        (
            "harness/strategies/hippie.py",
            "from harness.cli.hydra_app import spec_or_exit",
            "Strategies never import the commands, the CLI, the run layer or Hydra BROKEN",
        ),
        (
            "harness/runtime/stage.py",
            "from harness.runtime.executor import StageExecutor",
            "The runtime in one-way layers, action lists at the bottom BROKEN",
        ),
        (
            "harness/runtime/gradients.py",
            "from harness.runtime.actions import Action",
            "Gradient buckets, sync and clipping know no action list BROKEN",
        ),
    ],
)
def test_a_wrong_import_breaks_the_contracts(tmp_path, module, line, broken):
    for name in ("harness", "baselines"):
        shutil.copytree(os.path.join(ROOT, name), tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(os.path.join(ROOT, "pyproject.toml"), tmp_path)
    with open(tmp_path / module, "a") as f:
        f.write(f"\n{line}  # a wrong import, on purpose\n")
    proc = _lint(str(tmp_path))
    assert proc.returncode != 0
    assert broken in proc.stdout, proc.stdout[-2000:]


def test_no_module_compares_a_strategy_name_outside_that_strategy():
    names = "dp|hippie|ashpipe|pipelining|deepspeed|gpipe"
    pattern = re.compile(r"name *[!=]= *['\"](" + names + r")['\"]")
    found = []
    for folder in ("harness", "baselines"):
        for dirpath, _, files in os.walk(os.path.join(ROOT, folder)):
            for file in files:
                if file.endswith(".py"):
                    path = os.path.join(dirpath, file)
                    for n, line in enumerate(open(path), 1):
                        if pattern.search(line):
                            found.append(f"{os.path.relpath(path, ROOT)}:{n}: {line.strip()}")
    assert not found, "\n".join(found)


def test_the_command_does_not_import_what_only_some_runs_use():
    """A command's own process imports its config, the strategies and torch, not torchvision (the
    CIFAR loader's, 1.8 s with the torch._dynamo it pulls in) nor torch pipelining (the split
    backward's, 1.5 s): every command, refusal and test would pay for them."""
    code = (
        "import sys, harness.cli.hydra_app, harness.config.spec; "
        "print(sorted(m for m in ('torchvision', 'torch.distributed.pipelining') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr[-2000:]


RUFF = os.path.join(os.path.dirname(sys.executable), "ruff")


@pytest.mark.parametrize("args", [["check"], ["format", "--check"]], ids=["lint", "format"])
def test_ruff_passes(args):
    """The linter and the formatter configured in pyproject.toml hold over the whole tree."""
    proc = subprocess.run([RUFF, *args, "."], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
