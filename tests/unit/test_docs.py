"""The documentation builds as a site and the README stays a front page."""

import filecmp
import os
import subprocess
import sys

from tests.helpers.cli import ROOT

MKDOCS = os.path.join(os.path.dirname(sys.executable), "mkdocs")


def test_the_documentation_builds_strict(tmp_path):
    """mkdocs --strict: every page in the navigation, every link and anchor resolving (not --quiet:
    it hides the warnings that strict counts, and a broken link then passes)."""
    proc = subprocess.run(
        [MKDOCS, "build", "--strict", "-f", os.path.join(ROOT, "mkdocs.yml"), "-d", str(tmp_path / "site")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (tmp_path / "site" / "reference" / "configuration" / "index.html").is_file()


def test_the_readme_is_a_front_page_of_at_most_250_lines():
    with open(os.path.join(ROOT, "README.md")) as f:
        lines = f.read().splitlines()
    assert len(lines) <= 250
    # its two commands, exactly as .ci/run runs the second
    assert "python3 -m venv .venv && .venv/bin/pip install -e . && .venv/bin/python -m harness" in lines
    test_command = "python3 -m venv .venv && .venv/bin/pip install -e '.[dev]' && .venv/bin/python -m pytest"
    assert test_command in lines and test_command in open(os.path.join(ROOT, ".ci", "run")).read()


def test_every_docs_page_is_in_the_navigation():
    import yaml

    nav = str(yaml.safe_load(open(os.path.join(ROOT, "mkdocs.yml")))["nav"])
    pages = [
        os.path.relpath(os.path.join(d, f), os.path.join(ROOT, "docs"))
        for d, _, files in os.walk(os.path.join(ROOT, "docs"))
        for f in files
        if f.endswith(".md")
    ]
    assert pages and all(p in nav for p in pages), [p for p in pages if p not in nav]


def test_the_schedule_timelines_in_the_docs_are_the_committed_studys_figures():
    """docs/methods/timelines/NAME.png is results/schedules/figures/timeline_schedule_NAME.png, byte
    for byte: a page's figure is what `pipebench results results/schedules --check` vouches for."""
    docs = os.path.join(ROOT, "docs", "methods", "timelines")
    names = sorted(n for n in os.listdir(docs) if n.endswith(".png"))
    assert names
    for name in names:
        committed = os.path.join(ROOT, "results", "schedules", "figures", f"timeline_schedule_{name}")
        assert filecmp.cmp(os.path.join(docs, name), committed, shallow=False), name
