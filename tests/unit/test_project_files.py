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
    proc = subprocess.run([cffconvert, "--validate", "-i", os.path.join(ROOT, "CITATION.cff")], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    text = open(os.path.join(ROOT, "CITATION.cff")).read()
    assert "AshPipe" in text and "Hippie" in text and "license: Apache-2.0" in text


def test_the_container_recipe_pins_what_the_project_pins():
    """(Building it needs a container runtime and a registry, which CI does not have.)"""
    recipe = open(os.path.join(ROOT, "Apptainer.def")).read()
    pins = [d for d in tomllib.load(open(os.path.join(ROOT, "pyproject.toml"), "rb"))["project"]["dependencies"]
            if d.startswith(("torch==", "torchvision=="))]
    assert len(pins) == 2 and all(f'"{pin}"' in recipe for pin in pins)
    assert "DS_BUILD_OPS=1" in recipe and "pip install --no-cache-dir /opt/pipebench" in recipe
