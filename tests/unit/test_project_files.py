"""The files that make the project citable and reusable: licence, citation, container recipe."""

import os
import subprocess
import sys

import tomllib

from tests.helpers.cli import ROOT


def test_the_licence_file_matches_the_package_metadata():
    meta = tomllib.load(open(os.path.join(ROOT, "pyproject.toml"), "rb"))["project"]
    assert meta["license"]["text"] == "Apache-2.0"
    text = open(os.path.join(ROOT, "LICENSE")).read()
    assert "Apache License" in text and "Version 2.0, January 2004" in text


def test_the_citation_file_is_valid_and_cites_both_methods():
    cffconvert = os.path.join(os.path.dirname(sys.executable), "cffconvert")
    proc = subprocess.run(
        [cffconvert, "--validate", "-i", os.path.join(ROOT, "CITATION.cff")], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    text = open(os.path.join(ROOT, "CITATION.cff")).read()
    assert "AshPipe" in text and "Hippie" in text and "license: Apache-2.0" in text


def test_the_container_recipe_installs_the_pinned_torch_and_every_package():
    """The recipe is built for real by ``.ci/container build`` (minutes, and root: not in the suite);
    here, that it installs torch at the project's pins and copies every folder a package comes from."""
    recipe = open(os.path.join(ROOT, "Containerfile")).read()
    project = tomllib.load(open(os.path.join(ROOT, "pyproject.toml"), "rb"))
    # torch and torchvision first, at the pins the recipe reads from pyproject.toml
    assert "tomllib.load" in recipe and "startswith(('torch==', 'torchvision=='))" in recipe
    assert len([d for d in project["project"]["dependencies"] if d.startswith(("torch==", "torchvision=="))]) == 2
    # every package's top folder is copied into the image before the project is installed from it
    copied = {part for line in recipe.splitlines() if line.startswith("COPY ") for part in line.split()[1:-1]}
    dirs = project["tool"]["setuptools"]["package-dir"]
    folders = {dirs.get(pkg, pkg.replace(".", "/")).split("/")[0] for pkg in project["tool"]["setuptools"]["packages"]}
    assert folders <= copied, folders - copied
    assert all(os.path.exists(os.path.join(ROOT, part)) for part in copied)
    assert "pip install --no-cache-dir /opt/pipebench" in recipe


def test_every_package_folder_is_in_pyproject_packages():
    """The packages are listed rather than found (pyproject.toml says why), so a folder of modules
    missing from the list works in this checkout and an editable install, and is absent from a
    regular install (`pip install .`, the container image): docs/extending/strategy.md."""
    setuptools = tomllib.load(open(os.path.join(ROOT, "pyproject.toml"), "rb"))["tool"]["setuptools"]
    listed = {setuptools["package-dir"].get(pkg, pkg.replace(".", "/")) for pkg in setuptools["packages"]}
    folders = {
        os.path.relpath(folder, ROOT)
        for top in ("harness", "baselines")
        for folder, _, files in os.walk(os.path.join(ROOT, top))
        if any(f.endswith(".py") for f in files)
    }
    missing = sorted(folder.replace("/", ".") for folder in folders - listed)
    assert not missing, f"add to [tool.setuptools] packages in pyproject.toml: {', '.join(missing)}"
    assert all(os.path.isdir(os.path.join(ROOT, path)) for path in listed), [
        p for p in listed if not os.path.isdir(os.path.join(ROOT, p))
    ]
