"""One sweep against another (`pipebench results A --against B`): ratios with intervals, regressions
marked, configurations only one sweep ran listed, failed runs left out, the command's refusals."""

import csv
import io
import math
import os
import shutil
import subprocess

import pandas as pd
import pytest

from harness.commands import main
from harness.report.against import compare, ratio_interval, render
from harness.report.record import failed_record, write
from harness.report.schema import SCHEMA_VERSION
from harness.report.tables import load_records


def _rec(strategy, throughput, seed=0, world_size=2, steps=100, mem=100 * 2**20):
    return {
        "schema_version": SCHEMA_VERSION,
        "status": "ok",
        "error": None,
        "strategy": strategy,
        "model": "vit_micro",
        "data": "synthetic",
        "world_size": world_size,
        "global_batch": 64,
        "micro_batches": 4,
        "throughput": throughput,
        "step_time_s": 64 / throughput,
        "peak_memory_bytes": mem,
        "peak_memory_per_rank": [mem, mem],
        "accuracy": 0.2,
        "final_loss": 3.0,
        "device": "cpu",
        "seed": seed,
        "config": {"train": {"steps": steps}},
    }


def _sweep(folder, runs):
    for i, r in enumerate(runs):
        write(str(folder / str(i)), r)
    return str(folder)


def _repeats(strategy, throughputs, **kw):
    return [_rec(strategy, tp, seed=i, **kw) for i, tp in enumerate(throughputs)]


NOISY = (100.0, 104.0, 97.0, 101.0)


def _row(result, strategy):
    return result.rows[result.rows["strategy"] == strategy].iloc[0]


def test_the_ratio_interval_is_the_delta_method_on_the_log_with_welch_degrees_of_freedom():
    a, b = pd.Series([1.0, 1.2, 1.1]), pd.Series([2.0, 2.0])
    ratio, low, high = ratio_interval(a, b)
    # only A varies: se(ln R)^2 = s^2 / (n m^2) = 0.01 / (3 x 1.21), 2 degrees of freedom (t = 4.3027)
    half = 4.302653 * math.sqrt(0.01 / (3 * 1.21))
    assert ratio == pytest.approx(0.55) and low == pytest.approx(0.55 * math.exp(-half), rel=1e-5)
    assert high == pytest.approx(0.55 * math.exp(half), rel=1e-5)
    # both sides vary: Welch-Satterthwaite degrees of freedom between the smaller side's and the sum
    b = pd.Series([2.0, 2.3, 1.9, 2.1])
    _, low2, high2 = ratio_interval(a, b)
    assert low2 < 1.1 / 2.075 < high2
    once = ratio_interval(pd.Series([3.0]), pd.Series([2.0]))
    assert once[0] == 1.5 and math.isnan(once[1]) and math.isnan(once[2])  # each ran once: no interval
    assert all(math.isnan(x) for x in ratio_interval(pd.Series([1.0]), pd.Series([0.0])))  # no ratio to a 0 mean


def test_identical_sweeps_give_ratio_1_with_an_interval_containing_1(tmp_path):
    runs = _repeats("dp", NOISY) + _repeats("hippie", [x * 1.3 for x in NOISY])
    a, b = _sweep(tmp_path / "a", runs), _sweep(tmp_path / "b", runs)
    result = compare(load_records([a]), load_records([b]))
    assert len(result.rows) == 2 and all(len(result.only[s]) == 0 for s in "AB")
    for strategy in ("dp", "hippie"):
        row = _row(result, strategy)
        assert row["throughput ratio"] == pytest.approx(1.0)
        assert row["throughput low"] < 1 < row["throughput high"]
    md = render(result, "md")
    assert "1.000 [" in md and "↑" not in md.split("*\n")[-1] and "↓" not in md.split("*\n")[-1]
    assert "Only in A: none; only in B: none." in md


def test_a_sweep_20_percent_slower_is_flagged(tmp_path):
    a = _sweep(tmp_path / "a", _repeats("dp", [x * 0.8 for x in NOISY]) + _repeats("hippie", NOISY))
    b = _sweep(tmp_path / "b", _repeats("dp", NOISY) + _repeats("hippie", NOISY))
    result = compare(load_records([a]), load_records([b]), "throughput,peak_memory")
    dp = _row(result, "dp")
    assert dp["throughput ratio"] == pytest.approx(0.8) and dp["throughput high"] < 1
    md = render(result, "md")
    dp_line = next(line for line in md.splitlines() if line.startswith("| dp"))
    hippie_line = next(line for line in md.splitlines() if line.startswith("| hippie"))
    assert "**0.800 [" in dp_line and "↓**" in dp_line  # lower throughput: a regression, in bold
    assert "↓" not in hippie_line and "**" not in hippie_line
    assert "1.000 [1.000, 1.000]" in dp_line  # the same memory in every repeat: an exact ratio, not flagged
    assert "delta method on the log ratio" in md.splitlines()[0]  # the method is named in the caption


def test_less_memory_is_an_improvement_not_a_regression(tmp_path):
    a = _sweep(tmp_path / "a", [_rec("dp", tp, seed=i, mem=80 * 2**20 + i) for i, tp in enumerate(NOISY)])
    b = _sweep(tmp_path / "b", [_rec("dp", tp, seed=i, mem=100 * 2**20 + i) for i, tp in enumerate(NOISY)])
    md = render(compare(load_records([a]), load_records([b]), "peak_memory"), "md")
    line = next(line for line in md.splitlines() if line.startswith("| 0.800"))
    assert "↓" in line and "**" not in line  # lower and better: marked, not bold


def test_repeats_produce_an_interval_and_single_runs_do_not(tmp_path):
    single = compare(
        load_records([_sweep(tmp_path / "a1", [_rec("dp", 100.0)])]),
        load_records([_sweep(tmp_path / "b1", [_rec("dp", 110.0)])]),
    )
    row = single.rows.iloc[0]
    assert row["throughput ratio"] == pytest.approx(100 / 110) and math.isnan(row["throughput low"])
    assert "0.909 |" in render(single, "md") and "[" not in render(single, "md").split("\n\n")[1]
    repeated = compare(
        load_records([_sweep(tmp_path / "a3", _repeats("dp", NOISY))]),
        load_records([_sweep(tmp_path / "b3", [_rec("dp", 110.0)])]),
    )  # repeats on one side suffice
    row = repeated.rows.iloc[0]
    assert row["throughput low"] < row["throughput ratio"] < row["throughput high"]
    assert row["runs"] == "A 4, B 1"


def test_configurations_in_one_sweep_only_are_listed_with_what_kept_them_apart(tmp_path):
    a = _sweep(tmp_path / "a", [_rec("dp", 100.0), _rec("hippie", 90.0), _rec("gpipe", 80.0, steps=40)])
    b = _sweep(tmp_path / "b", [_rec("dp", 100.0), _rec("ashpipe", 95.0, world_size=4), _rec("gpipe", 80.0)])
    result = compare(load_records([a]), load_records([b]))
    assert list(result.rows["strategy"]) == ["dp"]
    md = render(result, "md")
    last = md.splitlines()[-1]
    assert last.startswith("Only in A: ") and "hippie" in last.split("; only in B: ")[0]
    assert "ashpipe workers 4" in last.split("; only in B: ")[1]
    assert "train.steps (40 in A, 100 in B): --ignore train.steps compares them" in last
    rows = list(csv.DictReader(io.StringIO(render(result, "csv"))))
    assert sorted((r["in"], r["strategy"]) for r in rows) == [
        ("A only", "gpipe"),
        ("A only", "hippie"),
        ("B only", "ashpipe"),
        ("B only", "gpipe"),
        ("both", "dp"),
    ]
    ignoring = compare(load_records([a]), load_records([b]), ignore=("train.steps",))
    assert sorted(ignoring.rows["strategy"]) == ["dp", "gpipe"]
    with pytest.raises(ValueError, match="train.step: not a setting"):
        compare(load_records([a]), load_records([b]), ignore=("train.step",))


def test_failed_runs_are_not_compared_and_the_table_says_so(tmp_path):
    boom = failed_record(
        {
            "strategy": "dp",
            "model": "vit_micro",
            "data": "synthetic",
            "world_size": 2,
            "global_batch": 64,
            "micro_batches": 4,
            "device": "cpu",
            "seed": 9,
            "config": {"train": {"steps": 100}},
        },
        "rank 1 raised RuntimeError: boom",
    )
    a = _sweep(tmp_path / "a", _repeats("dp", [100.0, 100.0]) + [boom])
    b = _sweep(tmp_path / "b", _repeats("dp", [100.0, 100.0]))
    result = compare(load_records([a]), load_records([b]))
    row = result.rows.iloc[0]
    assert row["throughput ratio"] == 1.0 and row["runs"] == "A 2 (+1 failed), B 2"
    md = render(result, "md")
    assert "failed runs are not compared" in md.splitlines()[0] and "A: failed: rank 1 raised RuntimeError: boom" in md


def test_the_formats(tmp_path):
    a = _sweep(tmp_path / "a", _repeats("dp", [x * 0.8 for x in NOISY]))
    b = _sweep(tmp_path / "b", _repeats("dp", NOISY))
    result = compare(load_records([a]), load_records([b]))
    (row,) = csv.DictReader(io.StringIO(render(result, "csv")))
    assert float(row["throughput_ratio"]) == pytest.approx(0.8) and float(row["throughput_ratio_high"]) < 1
    assert float(row["throughput_samples_per_s_b"]) == pytest.approx(sum(NOISY) / 4) and row["runs_a"] == "4"
    tex = render(result, "latex", "a against b")
    assert "\\label{tab:a-against-b}" in tex and "$\\downarrow$" in tex and "↓" not in tex
    assert "\\textbf{0.800 [" in tex and tex.rstrip().endswith("\\end{table*}")
    with pytest.raises(ValueError, match="unknown format"):
        render(result, "html")


@pytest.mark.skipif(shutil.which("pdflatex") is None, reason="pdflatex is not installed (texlive-latex-recommended)")
def test_the_latex_table_compiles(tmp_path):
    a = _sweep(tmp_path / "a", _repeats("dp", [x * 0.8 for x in NOISY]) + [_rec("hippie", 50.0)])
    b = _sweep(tmp_path / "b", _repeats("dp", NOISY) + [_rec("gpipe", 50.0)])
    body = render(compare(load_records([a]), load_records([b])), "latex")
    (tmp_path / "t.tex").write_text(
        "\\documentclass{article}\\usepackage{booktabs}\\usepackage[margin=1cm]{geometry}"
        "\\begin{document}\n" + body + "\n\\end{document}\n"
    )
    done = subprocess.run(
        ["pdflatex", "-interaction=nonstopmode", "-halt-on-error", "t.tex"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout[-2000:]


def test_the_command_compares_writes_and_refuses_in_one_line(tmp_path, capsys):
    a = _sweep(tmp_path / "a", _repeats("dp", [x * 0.8 for x in NOISY]))
    b = _sweep(tmp_path / "b", _repeats("dp", NOISY))
    assert main(["results", a, "--against", b]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"*A {a} against B {b}:") and "↓**" in out
    assert main(["results", a, "--against", b, "--format", "csv"]) == 0
    assert capsys.readouterr().out.startswith("in,block,strategy,")
    assert main(["results", a, "--against", b, "--out", str(tmp_path / "out")]) == 0
    assert sorted(os.listdir(tmp_path / "out")) == ["against.csv", "against.md", "against.tex"]
    assert "3 file(s) written" in capsys.readouterr().err
    os.makedirs(tmp_path / "empty")
    for args, message in (
        ([a, "--against", str(tmp_path / "missing")], "missing: no such file or folder"),
        ([str(tmp_path / "missing"), "--against", b], "missing: no such file or folder"),
        ([a, "--against", str(tmp_path / "empty")], "no readable metrics.json under"),
        ([a, "--against", b, "--ignore", "train.step"], "train.step: not a setting"),
        ([a, "--against", b, "--figures", str(tmp_path / "f")], "--figures draws one sweep's"),
        ([a, "--ignore", "train.steps"], "--ignore is for matching configurations"),
    ):
        assert main(["results", *args]) == 2, args
        err = capsys.readouterr().err
        assert err.startswith("error: ") and message in err and len(err.strip().splitlines()) == 1, err
