"""A regular (non-editable) install runs the commands from any folder: conf/ ships inside the package."""

import glob
import json
import os
import site
import subprocess
import sys

from tests.helpers.cli import ROOT, TINY


def test_an_installed_package_runs_a_sweep_from_another_folder(tmp_path):
    target, elsewhere = tmp_path / "site", tmp_path / "elsewhere"
    elsewhere.mkdir()
    build = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--target",
            str(target),
            ROOT,
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert build.returncode == 0, build.stderr[-3000:]
    assert os.path.isfile(target / "harness" / "conf" / "config.yaml")
    # -S: no site hooks, so this checkout's editable install cannot stand in for the installed copy;
    # the dependencies come from this environment's site-packages, after the installed package
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(target), *site.getsitepackages()]), "WANDB_SILENT": "true"}

    def python(*args):
        return subprocess.run(
            [sys.executable, "-S", *args], cwd=elsewhere, env=env, capture_output=True, text=True, timeout=300
        )

    where = python("-c", "import harness; print(harness.__file__)")
    assert where.stdout.strip() == str(target / "harness" / "__init__.py"), where.stderr[-2000:]
    sweep = elsewhere / "sweep"
    proc = python("-m", "harness", "-m", "+case=hippie_w2", *TINY, f"hydra.sweep.dir={sweep}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    (rec,) = [json.load(open(p)) for p in glob.glob(str(sweep / "*" / "metrics.json"))]
    assert rec["strategy"] == "hippie" and rec["status"] == "ok" and rec["environment"]["git_commit"] is None
    assert "speedup" in proc.stdout  # the sweep callback, named in the installed conf/, printed the table
    table = python("-m", "harness.results", str(sweep))
    assert table.returncode == 0 and "| hippie" in table.stdout
