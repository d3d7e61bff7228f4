"""The one-way architecture, enforced: import-linter's contracts (pyproject.toml) hold, they
catch a wrong import, and no module outside a strategy's own file decides by its name."""

import os
import re
import shutil
import subprocess
import sys

from tests.helpers.cli import ROOT

LINT_IMPORTS = os.path.join(os.path.dirname(sys.executable), "lint-imports")


def _lint(cwd: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": cwd}  # the tree in cwd, not the installed one
    return subprocess.run([LINT_IMPORTS, "--no-cache"], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def test_the_import_contracts_hold():
    proc = _lint(ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "0 broken" in proc.stdout


def test_a_wrong_import_breaks_the_contracts(tmp_path):
    for name in ("harness", "baselines"):
        shutil.copytree(os.path.join(ROOT, name), tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(os.path.join(ROOT, "pyproject.toml"), tmp_path)
    with open(tmp_path / "harness" / "runtime" / "partition.py", "a") as f:
        f.write("\nfrom harness.config.spec import RunSpec  # the runtime reading the config: not allowed\n")
    proc = _lint(str(tmp_path))
    assert proc.returncode != 0
    assert "harness.runtime.partition -> harness.config.spec" in proc.stdout
    assert "The runtime and planning never import Hydra, the config, strategies or commands BROKEN" in proc.stdout


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
