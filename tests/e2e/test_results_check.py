"""`pipebench results STUDY --check`: a committed study is what today's code makes from its records,
and the check fails when a record is edited or a figure's colour map is broken."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from harness.report import figures
from harness.report.reproduce import differences
from tests.helpers import studies
from tests.helpers.cli import ROOT, pipebench

SCHEDULES = os.path.join(ROOT, "results", "schedules")
# three runs of the schedules study: DP, and ZB-V in our runtime and in torch's
RUNS = ("0_dp_w2", "19_hippie_w2", "12_pipelining_w2")


@pytest.mark.parametrize("name", studies.params(studies.tabled(), studies.UNREPRODUCED))
def test_every_committed_study_is_what_todays_code_makes_from_its_records(name):
    """Its tables and figures from its records, no impossible figure, one commit and a clean tree."""
    assert differences(os.path.join(studies.RESULTS, name)) == []


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """A study of three committed runs, its tables and figures written by today's code: checked,
    it is reproduced."""
    from harness import commands

    folder = tmp_path_factory.mktemp("pristine") / "study"
    for run in RUNS:
        shutil.copytree(os.path.join(SCHEDULES, run), folder / run)
    with figures.data_only():  # what the figures draw is what is checked: no PNG or PDF needed
        assert commands.main(["results", str(folder), "--out", str(folder)]) == 0
    assert commands.main(["results", str(folder), "--check"]) == 0
    return folder


@pytest.fixture
def study(pristine, tmp_path):
    return shutil.copytree(pristine, tmp_path / "study")


def test_an_edited_record_fails_the_check_naming_what_differs(study, capfd):
    path = study / RUNS[1] / "metrics.json"
    record = json.loads(path.read_text())
    record["throughput"] *= 1.5
    record["step_time_s"] /= 1.5
    path.write_text(json.dumps(record))
    proc = pipebench(capfd, "results", str(study), "--check")
    assert proc.returncode == 1
    assert "results.md differs from what today's code writes" in proc.stdout
    assert "figure schedules draws other data than committed" in proc.stdout


def test_a_broken_colour_map_fails_the_check(study, capfd, monkeypatch):
    # the send drawn in the receive's colour: the timelines draw other data, and break the contract
    monkeypatch.setitem(figures._KINDS, "SEND", (figures._KINDS["RECV"][0], "send"))
    proc = pipebench(capfd, "results", str(study), "--check")
    assert proc.returncode == 1
    assert "legend entries receive / wait, send look the same" in proc.stdout


def test_an_impossible_figure_and_a_mixed_provenance_fail_the_check(study, capfd):
    path = study / RUNS[0] / "metrics.json"
    record = json.loads(path.read_text())
    record["per_rank"][0]["memory_breakdown"]["at_step_start"] = -1.0
    record["environment"]["git_commit"] = "0" * 40
    path.write_text(json.dumps(record))
    proc = pipebench(capfd, "results", str(study), "--check")
    assert proc.returncode == 1
    assert "rank 0's memory at_step_start is -0.00 MiB, below zero" in proc.stdout
    assert "the runs came from 2 commits" in proc.stdout
    # the table is still printed, the provenance said in one line
    proc = pipebench(capfd, "results", str(study))
    assert proc.returncode == 0 and "warning: the runs came from 2 commits" in proc.stderr
