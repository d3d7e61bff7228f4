"""Tables from fixture records: speedup and ME against DP, failed runs kept, groups without DP."""

import csv
import io
import os
import shutil
import subprocess

import pytest

from harness.report.figures import curves
from harness.report.record import failed_record, read, write
from harness.report.schema import SCHEMA_VERSION, RecordError
from harness.report.statistics import interval, mlperf_times
from harness.report.tables import comparison, load_records, render


def _rec(strategy, world_size, throughput, mem, model="vit_micro", status="ok", error=None):
    return {
        "schema_version": SCHEMA_VERSION,
        "status": status,
        "error": error,
        "strategy": strategy,
        "model": model,
        "data": "synthetic",
        "world_size": world_size,
        "global_batch": 64,
        "micro_batches": 4,
        "throughput": throughput,
        "step_time_s": 64 / throughput if throughput else None,
        "peak_memory_bytes": mem,
        "peak_memory_per_rank": [mem, mem],
        "accuracy": 0.2,
        "final_loss": 3.0,
        "device": "cpu",
    }


@pytest.fixture
def sweep(tmp_path):
    recs = [
        _rec("dp", 2, 100.0, 200),
        _rec("hippie", 2, 150.0, 100),
        failed_record(
            {"strategy": "ashpipe", "model": "vit_micro", "data": "synthetic", "world_size": 2, "global_batch": 64},
            "rank 1 raised RuntimeError: boom",
        ),
        _rec("hippie", 4, 300.0, 50, model="vit_tiny"),
    ]
    for i, r in enumerate(recs):
        write(str(tmp_path / str(i)), r)
    return str(tmp_path)


def test_speedup_and_me_against_dp(sweep):
    df = comparison(load_records([sweep]))
    hippie = df[(df.strategy == "hippie") & (df.model == "vit_micro")].iloc[0]
    assert hippie.speedup == pytest.approx(1.5)
    assert hippie.me == pytest.approx(1.5 / (100 / 200))  # 3.0
    dp = df[df.strategy == "dp"].iloc[0]
    assert dp.speedup == pytest.approx(1.0) and dp.me == pytest.approx(1.0)


def test_failed_run_is_shown_not_dropped(sweep):
    df = comparison(load_records([sweep]))
    failed = df[df.strategy == "ashpipe"].iloc[0]
    assert failed.status == "failed" and "boom" in failed.note
    assert "failed" in render(load_records([sweep]), "md")


def test_group_without_dp_says_so_instead_of_a_speedup(sweep):
    df = comparison(load_records([sweep]))
    lone = df[df.model == "vit_tiny"].iloc[0]
    assert lone.speedup != lone.speedup  # NaN: no speedup invented
    assert "no DP run" in lone.note


def test_formats(sweep):
    df = load_records([sweep])
    md = render(df, "md")
    assert md.startswith("*model vit_micro;") is False  # two models: each is a section, not the caption
    assert "**model vit_micro**" in md and "**model vit_tiny**" in md
    assert not any(line.startswith("| strategy") and "| model" in line for line in md.splitlines())
    assert render(df, "csv").splitlines()[0].startswith("strategy,workers,layout,micro_batches,model,data")
    tex = render(df, "latex", name="my sweep")
    assert "\\begin{tabular}" in tex and "\\caption{" in tex and "\\label{tab:my-sweep}" in tex


def test_unreadable_record_is_reported_as_failed(tmp_path):
    os.makedirs(tmp_path / "x")
    (tmp_path / "x" / "metrics.json").write_text("{not json")
    df = load_records([str(tmp_path)])
    assert df.iloc[0].status == "failed" and "unreadable" in df.iloc[0].error


def test_latex_is_booktabs_with_the_best_value_in_bold(tmp_path):
    write(str(tmp_path / "dp"), _rec("dp", 2, 100.0, 200 * 2**20))
    write(str(tmp_path / "hippie"), _rec("hippie", 2, 150.0, 100 * 2**20))
    tex = render(load_records([str(tmp_path)]), "latex")
    assert "\\toprule" in tex and "\\midrule" in tex and "\\bottomrule" in tex
    hippie = next(line for line in tex.splitlines() if line.startswith("hippie"))
    assert "\\textbf{150.0}" in hippie and "\\textbf{100.0}" in hippie  # best throughput and memory of its group
    dp = next(line for line in tex.splitlines() if line.startswith("dp "))
    assert "200.0" in dp and "\\textbf" not in dp  # more memory, slower; its top-1 ties hippie's: not bold
    # numbers right-aligned (the layout, empty in every row, is left out)
    assert tex.split("tabular}{")[1].split("}")[0] == "l" + "r" * 7


def test_repeated_seeds_are_reported_with_a_95_percent_interval(tmp_path):
    for i, tp in enumerate((100.0, 110.0, 120.0)):
        write(str(tmp_path / f"dp{i}"), {**_rec("dp", 2, tp, 200), "seed": i})
    md = render(load_records([str(tmp_path)]), "md")
    # t(0.975, 2 dof) = 4.303; 4.303 x 10 / sqrt(3) = 24.8
    assert "110.0 ± 24.8" in md and "runs 3/3 ok" in md.splitlines()[0]  # the same for every row: the caption
    text = render(load_records([str(tmp_path)]), "csv")
    assert "throughput_samples_per_s,throughput_samples_per_s_ci95" in text.splitlines()[0]
    assert ",110.0,24.8," in text  # numeric columns stay numeric


def test_a_best_within_the_runner_ups_interval_is_not_set_apart(tmp_path):
    for r, (dp, hippie) in enumerate(((100.0, 104.0), (110.0, 116.0), (120.0, 122.0))):
        write(str(tmp_path / f"dp{r}"), {**_rec("dp", 2, dp, 200 * 2**20), "repeat": r})
        write(str(tmp_path / f"hippie{r}"), {**_rec("hippie", 2, hippie, 100 * 2**20), "repeat": r})
    hippie = next(line for line in render(load_records([str(tmp_path)]), "md").splitlines() if "| hippie" in line)
    assert "114.0 ±" in hippie and "**114.0" not in hippie  # 114 against 110, each ± 20 or more
    assert "**100.0 ± 0.0**" in hippie  # its memory is the same in every repeat: a best beyond doubt


def test_repeats_of_one_configuration_are_aggregated_too(tmp_path):
    for r, tp in enumerate((100.0, 104.0)):
        write(str(tmp_path / f"dp{r}"), {**_rec("dp", 2, tp, 200), "seed": 0, "repeat": r})
    assert "2/2 ok" in render(load_records([str(tmp_path)]), "md")


def test_interval_and_mlperf_rule():
    import pandas as pd

    mean, half, n = interval(pd.Series([1.0, 2.0, 3.0, 4.0]))
    assert (mean, n) == (2.5, 4) and half == pytest.approx(3.182446 * 1.2909944 / 2, rel=1e-5)
    assert interval(pd.Series([5.0]))[1] != interval(pd.Series([5.0]))[1]  # one run: no interval (NaN)
    assert list(mlperf_times(pd.Series([9.0, 1.0, 5.0, 3.0, 7.0]))) == [3.0, 5.0, 7.0]  # five: drop extremes
    assert len(mlperf_times(pd.Series([1.0, 2.0, 3.0]))) == 3


def test_a_foreign_or_old_file_is_named_in_one_line_and_skipped(tmp_path, capsys):
    write(str(tmp_path / "ours"), _rec("dp", 2, 100.0, 200))
    for name, content in (
        ("old", '{"status": "ok", "strategy": "dp"}'),
        ("other", '{"loss": [1, 2]}'),
        ("future", '{"schema_version": 99, "status": "ok"}'),
    ):
        os.makedirs(tmp_path / name)
        (tmp_path / name / "metrics.json").write_text(content)
    df = load_records([str(tmp_path)])
    assert len(df) == 1 and df.iloc[0].strategy == "dp"
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 3 and all(line.startswith("skipping ") for line in lines)
    assert any("old/metrics.json: no schema_version" in line for line in lines)
    assert any("schema_version 99, this harness reads" in line for line in lines)


def test_records_are_validated_when_written_and_read(tmp_path):
    with pytest.raises(RecordError, match="accuracy"):
        write(str(tmp_path / "bad"), {**_rec("dp", 2, 100.0, 200), "accuracy": 2.0})
    assert not os.path.exists(tmp_path / "bad" / "metrics.json")
    path = write(str(tmp_path / "good"), _rec("dp", 2, 100.0, 200))
    assert read(path)["schema_version"] == SCHEMA_VERSION


def test_figures_are_drawn_from_records(tmp_path):
    from harness.report.figures import all_figures

    rec = {
        **_rec("hippie", 2, 150.0, 100),
        "loss_curve": [[0, 4.6], [1, 4.4]],
        "accuracy_curve": [{"step": 2, "accuracy": 0.1, "loss": 4.0}],
        "per_rank": [
            {
                "rank": 0,
                "layout": {"stage": 0},
                "events": [
                    ["F0", 10.0, 10.01],
                    ["RECV_B0", 10.01, 10.02],
                    ["B0*", 10.02, 10.04],
                    ["STEP", 10.04, 10.05],
                ],
            },
            {
                "rank": 1,
                "layout": {"stage": 1},
                "events": [
                    ["RECV_F0", 10.0, 10.01],
                    ["F0", 10.01, 10.02],
                    ["B0*", 10.02, 10.03],
                    ["SEND_B0", 10.03, 10.031],
                ],
            },
        ],
    }
    profiled = {
        **_rec("pipelining", 2, 120.0, 100),
        "variant": "gpipe",
        "per_rank": [
            {"rank": r, "layout": {"stage": r}, "profiled_spans": [["F", 5.0 + r, 5.01 + r], ["B", 5.02 + r, 5.04 + r]]}
            for r in (0, 1)
        ],
    }
    # DP at two worker counts: speed against workers has a line to draw
    paths = all_figures([rec, _rec("dp", 2, 100.0, 200), _rec("dp", 4, 180.0, 100), profiled], str(tmp_path))
    names = {os.path.basename(p) for p in paths}
    single = all_figures([rec, _rec("dp", 2, 100.0, 200)], str(tmp_path / "one"))
    assert not any("throughput_vs_workers" in p for p in single)  # one worker count: a table's, not a line
    for stem in (
        "throughput_vs_workers",
        "memory_per_rank",
        "curves",
        "timeline_hippie_w2",
        "timeline_profiled_pipelining_gpipe_w2",
    ):
        assert {f"{stem}.png", f"{stem}.pdf", f"{stem}.figure.json"} <= names  # the figure, and what it draws
    assert all(os.path.getsize(p) > 1000 for p in paths if not p.endswith(".json"))


def test_a_schedule_two_runtimes_ran_is_drawn_once_with_both_runs_on_one_axis(tmp_path):
    from harness.report.figures import schedule_timelines

    def run(strategy, start, schedule="zbv", recompute="none"):
        return {
            **_rec(strategy, 2, 100.0, 100),
            "model": "vit_micro",
            "config": {
                "strategy": {"name": strategy, "schedule": schedule, "stages_per_rank": 2, "recompute": recompute}
            },
            "per_rank": [
                {
                    "rank": r,
                    "layout": {"stage": r, "stages": [r, 3 - r]},
                    "profiled_spans": [["F", start + r, start + r + 0.01], ["W", start + 0.02, start + 0.05]],
                }
                for r in (0, 1)
            ],
        }

    runs = [
        run("hippie", 10.0),
        run("pipelining", 500.0),
        run("pipelining", 9.0, "interleaved_1f1b"),
        run("hippie", 7.0, recompute="all"),
    ]
    paths = schedule_timelines(runs, str(tmp_path))
    # zbv ran by both runtimes without recomputation; interleaved and zbv with recomputation by one only
    assert sorted(os.path.basename(p) for p in paths) == [
        "timeline_schedule_zbv_v2_w2.figure.json",
        "timeline_schedule_zbv_v2_w2.pdf",
        "timeline_schedule_zbv_v2_w2.png",
    ]


def test_wandb_offline_folder_is_a_source(tmp_path):
    run_dir = tmp_path / "run"
    write(str(run_dir), _rec("dp", 2, 100.0, 200))
    mirror_copy = run_dir / "wandb" / "offline-run-x" / "files"
    write(str(mirror_copy), _rec("dp", 2, 100.0, 200))
    assert len(load_records([str(tmp_path)])) == 1  # the mirror's copy is not counted twice
    assert len(load_records([str(run_dir / "wandb")])) == 1  # but a wandb folder can be read on its own


def test_only_runs_of_one_configuration_are_aggregated(tmp_path):
    """Two settings the table's columns do not show (here Hippie's stage count) stay two rows;
    two seeds of one setting become one row with an interval."""
    for name, stages, seed in (("a", 2, 0), ("b", 2, 1), ("c", 4, 0)):
        write(
            str(tmp_path / name),
            {
                **_rec("hippie", 4, 100.0 + seed, 50),
                "seed": seed,
                "config": {"strategy": {"name": "hippie", "stages": stages}},
            },
        )
    md = render(load_records([str(tmp_path)]), "md")
    rows = [line for line in md.splitlines() if line.startswith("| hippie")]
    assert len(rows) == 2 and sum("2/2 ok" in r for r in rows) == 1 and sum("1/1 ok" in r for r in rows) == 1


def test_blocks_keep_their_order_share_the_dp_reference_and_crowded_speed_is_marked(tmp_path):
    recs = [
        {**_rec("dp", 2, 100.0, 200), "block": "speed", "replicas": [2]},
        {**_rec("hippie", 2, 80.0, 100), "block": "speed", "replicas": [1, 1], "boundaries": [3]},
        {
            **_rec("hippie", 2, 60.0, 50),
            "block": "memory",
            "replicas": [1, 1],
            "boundaries": [3],
            "variant": "recompute=auto",
        },
        {
            **_rec("dp", 4, 90.0, 100),
            "block": "replicated",
            "speed_comparable": False,
            "workers_on_host": 4,
            "threads_per_worker": 1,
            "host_cores": 2,
        },
        {**_rec("ashpipe", 4, 95.0, 100), "block": "replicated", "replicas": [1, 3], "boundaries": [2]},
    ]
    for i, r in enumerate(recs):
        r["started_at"] = f"2026-12-03T10:00:{i:02d}+00:00"
    for i, r in enumerate(reversed(recs)):  # found in another order than they ran
        write(str(tmp_path / str(i)), r)
    df = comparison(load_records([str(tmp_path)]))
    assert list(dict.fromkeys(df.block)) == ["speed", "memory", "replicated"]
    memory = df[df.block == "memory"].iloc[0]
    assert memory.speedup == pytest.approx(0.6) and memory.me == pytest.approx(0.6 / (50 / 200))
    table = render(load_records([str(tmp_path)]), "md")
    assert "[1, 3] cut [2]" in table and "[1, 1] cut [3]" in table
    crowded = df[(df.block == "replicated") & (df.strategy == "dp")].iloc[0]
    assert crowded.note.startswith("speed and bubble not comparable: 4 workers x 1 threads on 2 cores")
    assert "not comparable" not in df[df.strategy == "ashpipe"].iloc[0].note


def test_seeds_give_steps_to_target_the_runs_that_reached_it_and_curves_with_a_band(tmp_path):
    def run(seed, accuracies, data="synthetic"):
        curve = [{"step": 10 * (k + 1), "accuracy": a} for k, a in enumerate(accuracies)]
        return {
            **_rec("ashpipe", 2, 100.0, 200),
            "seed": seed,
            "data": data,
            "target_accuracy": 0.5,
            "accuracy_curve": curve,
            "loss_curve": [[s, 4.0 - s / 10] for s in range(30)],
        }

    runs = [run(0, [0.2, 0.5, 0.6]), run(1, [0.6, 0.7, 0.8]), run(2, [0.1, 0.2, 0.3])]
    for i, r in enumerate(runs):
        write(str(tmp_path / f"a{i}"), r)
    (row,) = csv.DictReader(io.StringIO(render(load_records([str(tmp_path)]), "csv", "accuracy")))
    # seeds 0 and 1 reach 50% at steps 20 and 10; seed 2 never does, and the table says so
    assert float(row["steps_to_target"]) == 15 and row["reached_target"] == "2/3"
    write(str(tmp_path / "digits"), run(0, [0.9, 0.95, 0.97], data="digits"))
    records = [read(str(tmp_path / name / "metrics.json")) for name in ("a0", "a1", "a2", "digits")]
    names = sorted(os.path.basename(p) for p in curves(records, str(tmp_path / "figures")))
    assert [n for n in names if not n.endswith(".json")] == [
        "curves_digits.pdf",
        "curves_digits.png",
        "curves_synthetic.pdf",
        "curves_synthetic.png",
    ]


def test_time_to_another_target_is_read_from_the_curves(tmp_path, capsys):
    from harness.commands import main

    curve = [{"step": 10 * k, "accuracy": a, "elapsed_s": 2.0 * k} for k, a in enumerate((0.1, 0.3, 0.5), start=1)]
    write(
        str(tmp_path / "run"),
        {**_rec("dp", 2, 100.0, 200), "target_accuracy": 0.9, "accuracy_curve": curve, "time_to_target_s": None},
    )
    assert main(["results", str(tmp_path), "--format", "csv", "--target", "0.3", "--columns", "accuracy"]) == 0
    (row,) = csv.DictReader(io.StringIO(capsys.readouterr().out))
    assert float(row["time_to_target_s"]) == 4.0 and float(row["steps_to_target"]) == 20  # the run's target was 0.9
    assert main(["results", str(tmp_path), "--target", "40"]) == 2  # a percentage, not a fraction: refused
    assert "give the accuracy as a fraction" in capsys.readouterr().err


@pytest.mark.skipif(shutil.which("pdflatex") is None, reason="pdflatex is not installed (texlive-latex-recommended)")
@pytest.mark.parametrize(
    "choice,page",
    [
        ("paper", "twocolumn]{article}\\usepackage[textwidth=7in]{geometry}"),
        ("all", "]{article}\\usepackage[margin=1cm,landscape]{geometry}"),
    ],
)
def test_the_latex_table_compiles_and_the_paper_set_fits_a_two_column_page(tmp_path, choice, page):
    folder = os.path.join(os.path.dirname(__file__), "..", "..", "results", "ci")
    body = render(load_records([folder]), "latex", choice, name="ci")
    (tmp_path / "t.tex").write_text(
        "\\documentclass[" + page + "\\usepackage{booktabs}\\begin{document}\n" + body + "\n\\end{document}\n"
    )
    done = subprocess.run(
        ["pdflatex", "-interaction=nonstopmode", "-halt-on-error", "t.tex"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout[-2000:]
    assert (tmp_path / "t.pdf").stat().st_size > 0
    if choice == "paper":  # the default table within a 7 in text width (IEEE, ACM), as a table*
        assert "Overfull \\hbox" not in done.stdout


def _drawn(monkeypatch, draw, records, tmp_path) -> list:
    """The matplotlib figures ``draw`` saved (kept open to look at their artists)."""
    from harness.report import figures

    kept = []
    monkeypatch.setattr(figures, "save", lambda fig, out_dir, name: kept.append(fig) or [name])
    draw(records, str(tmp_path))
    return kept


def _texts(fig):
    import matplotlib.text

    return [t for t in fig.findobj(matplotlib.text.Text) if t.get_text().strip() and t.get_visible()]


def test_figures_fit_a_paper_and_keep_one_style_per_configuration(tmp_path, monkeypatch):
    from harness.report import figures

    parts = {
        "parameters": 2**20,
        "gradients": 2**20,
        "optimizer_state": 2 * 2**20,
        "stashed_weights": 0,
        "other": 4 * 2**20,
    }

    def run(strategy, w, tp, variant="", comparable=True, repeat=0):
        return {
            **_rec(strategy, w, tp, 8 * 2**20),
            "variant": variant,
            "speed_comparable": comparable,
            "repeat": repeat,
            "replicas": [1] * w if strategy != "dp" else [w],
            "loss_curve": [[s, 4.0 - s / 100] for s in range(100)],
            "accuracy_curve": [{"step": 10 * k, "accuracy": 0.01 * k} for k in range(1, 11)],
            "per_rank": [{"rank": k, "memory_breakdown": parts} for k in range(w)],
        }

    records = [
        run("dp", 1, 100.0),
        run("dp", 2, 180.0),
        run("dp", 2, 190.0, repeat=1),
        run("dp", 4, 150.0, comparable=False),
        run("hippie", 2, 200.0),
        run("hippie", 2, 170.0, variant="recompute=auto"),
        run("pipelining", 2, 150.0, variant="zbv, v=2"),
    ]
    (fig,) = _drawn(monkeypatch, figures.throughput_vs_workers, records, tmp_path)
    ax = fig.axes[0]
    points = [line for line in ax.lines if line.get_marker() not in ("_", "|")]  # not the error bars' caps
    dp_lines = [line for line in points if line.get_color() == "#000000" and line.get_linestyle() == "-"]
    assert [list(line.get_xdata()) for line in dp_lines] == [[1, 2]]  # w=4 is not joined
    hollow = [line for line in points if line.get_markerfacecolor() == "white"]
    assert [list(line.get_xdata()) for line in hollow] == [[4]]
    assert max(fig.get_size_inches()) <= figures.PAGE_IN
    for each in [fig, *_drawn(monkeypatch, figures.all_figures, records, tmp_path)]:
        assert each.get_size_inches()[0] <= figures.PAGE_IN
        small = [(t.get_text(), t.get_fontsize()) for t in _texts(each) if t.get_fontsize() < 8]
        assert not small, small
    # the same strategy and variant look the same in every figure; hippie's variants differ by marker
    styles = figures.Styles(records)
    assert styles.color(records[4]) == styles.color(records[5]) and styles.marker(records[4]) != styles.marker(
        records[5]
    )
    assert figures.config_label(records[6]) == "pipelining (zbv, v=2), w=2"


def test_memory_bars_stack_the_breakdown_to_each_ranks_peak(tmp_path, monkeypatch):
    from harness.report import figures

    parts = {
        "parameters": 3 * 2**20,
        "gradients": 3 * 2**20,
        "optimizer_state": 6 * 2**20,
        "stashed_weights": 2**20,
        "other": 7 * 2**20,
        "host_excluded": 99 * 2**20,
    }
    rec = {**_rec("ashpipe", 2, 100.0, 20 * 2**20), "per_rank": [{"rank": 0, "memory_breakdown": parts}, {"rank": 1}]}
    (fig,) = _drawn(monkeypatch, figures.memory_per_rank, [rec], tmp_path)
    widths = {}
    for patch in fig.axes[0].patches:
        widths.setdefault(round(patch.get_y(), 6), []).append(patch.get_width())
    assert sorted(sum(w) for w in widths.values()) == [20.0, 20.0]  # rank 1 has no split: its peak alone
    assert sorted(len(w) for w in widths.values()) == [1, 5]


def test_the_pareto_front_keeps_the_points_no_other_beats():
    from harness.report.figures import _pareto

    assert _pareto([(10, 100), (12, 90), (15, 150), (20, 140), (25, 200)]) == [(10, 100), (15, 150), (25, 200)]


def test_runs_that_differ_in_a_swept_setting_are_labelled_by_it_and_a_diverged_run_is_footnoted(tmp_path, monkeypatch):
    """A sweep over train.lr of one strategy: each rate is its own row, line and label (with the
    setting that differs, not the settings that only say where data lives or how a run resumed),
    and a run whose training loss became NaN keeps its row with a footnote saying from which step."""
    from harness.report import figures

    def run(lr, seed, root="data/a", losses=None):
        losses = losses or [[s, 4.0 - s / 100] for s in range(20)]
        return {
            **_rec("dp", 2, 100.0 + seed, 2**20),
            "seed": seed,
            "loss_curve": losses,
            "accuracy_curve": [{"step": 10 * k, "accuracy": 0.1 * k} for k in (1, 2)],
            "config": {
                "train": {"lr": lr, "resume": f"run{seed}"},
                "data": {"root": root},
                "launch": {"collective_timeout": 60 + seed},
            },
        }

    diverged = [[0, 4.0], [1, 9.0], [2, float("nan")], [3, float("nan")]]
    for name, rec in (
        ("a", run(0.1, 0)),
        ("b", run(0.1, 1, root="/scratch/b")),
        ("c", run(0.3, 0)),
        ("d", run(4.0, 0, losses=diverged)),
    ):
        write(str(tmp_path / name), rec)
    md = render(load_records([str(tmp_path)]), "md")
    rows = {line.split("|")[1].strip(): line for line in md.splitlines() if line.startswith("| dp")}
    assert set(rows) == {"dp (lr=0.1)", "dp (lr=0.3)", "dp (lr=4.0)¹"}, md
    assert "2/2 ok" in rows["dp (lr=0.1)"]
    assert "¹ diverged: training loss not finite from step 2" in md

    from harness.report.tables import load_raw

    records = load_raw([str(tmp_path)])
    (fig,) = _drawn(monkeypatch, figures.curves, records, tmp_path)
    labels = sorted(fig.axes[0].get_legend_handles_labels()[1])
    assert labels == ["dp (lr=0.1), w=2 (x2)", "dp (lr=0.3), w=2", "dp (lr=4.0), w=2 (diverged)"], labels
    colours = {line.get_label(): line.get_color() for line in fig.axes[0].get_lines()}
    assert len(set(colours.values())) == 3  # one strategy alone: its rates take the colours
    assert fig.axes[0].get_ylim()[1] < 5  # the diverged run's blow-up does not flatten the others


def test_a_swept_learning_rate_draws_final_accuracy_against_it_one_line_per_configuration(tmp_path, monkeypatch):
    from harness.report import figures
    from harness.report.tables import load_raw

    def run(strategy, lr, seed, accuracy, momentum=0.0, workers=2):
        return {
            **_rec(strategy, workers, 100.0, 2**20),
            "seed": seed,
            "accuracy": accuracy,
            "config": {"train": {"lr": lr, "momentum": momentum}},
        }

    runs = [
        run("dp", 0.1, 0, 0.50),
        run("dp", 0.1, 1, 0.54),
        run("dp", 1.0, 0, 0.70),
        run("dp", 10.0, 0, 0.01),
        run("ashpipe", 0.1, 0, 0.40),
        run("ashpipe", 1.0, 0, 0.20),
        run("ashpipe", 1.0, 0, 0.30, momentum=0.9),
        run("ashpipe", 0.1, 0, 0.30, workers=3),
        run("ashpipe", 1.0, 0, 0.10, workers=3),
    ]
    for i, r in enumerate(runs):
        write(str(tmp_path / str(i)), r)
    drawn = _drawn(monkeypatch, figures.sensitivity, load_raw([str(tmp_path)]), tmp_path)
    assert len(drawn) == 2  # against lr, and against momentum (ashpipe at lr 1.0 ran with both)
    ax = drawn[0].axes[0]
    lines = {c.get_label(): (list(c.lines[0].get_xdata()), list(c.lines[0].get_ydata())) for c in ax.containers}
    assert lines["dp, w=2"] == ([0.1, 1.0, 10.0], [pytest.approx(52.0), 70.0, 1.0])
    assert lines["ashpipe (momentum=0.0), w=2"] == ([0.1, 1.0], [40.0, 20.0])
    assert lines["ashpipe (momentum=0.9), w=2"] == ([1.0], [30.0])
    assert ax.get_xscale() == "log" and ax.get_xlabel() == "lr"
    # styled as the other figures: a line style per worker count, the reference drawn on top
    drawn_lines = {c.get_label(): c.lines[0] for c in ax.containers}
    assert drawn_lines["ashpipe, w=3"].get_linestyle() != drawn_lines["ashpipe (momentum=0.0), w=2"].get_linestyle()
    assert drawn_lines["dp, w=2"].get_zorder() > max(
        line.get_zorder() for label, line in drawn_lines.items() if not label.startswith("dp")
    )
