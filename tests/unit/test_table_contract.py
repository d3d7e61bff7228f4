"""The table contract (harness.report.tables, harness.report.columns): the reference row reads exactly
1 with no interval, a field that does not apply is blank, at most ten columns beside the label, no
cell over 40 characters, one rounding rule, and a caption on every table."""

import io
import re

import pandas as pd
import pytest

from harness.core.vocabulary import WHOLE_MINIBATCH_STRATEGIES
from harness.report import columns
from harness.report.columns import MAX_CELL, figure_text
from harness.report.paired import against_reference
from harness.report.paired import to_markdown as paired_markdown
from harness.report.tables import build, render, to_frame, to_latex, to_markdown
from tests.unit.test_results import _rec

MIB = 2**20


def _repeated(strategy, throughputs, mem, **extra):
    return [{**_rec(strategy, 2, t, mem), "seed": seed, **extra} for seed, t in enumerate(throughputs)]


def _row(md: str, strategy: str) -> list[str]:
    line = next(line for line in md.splitlines() if line.startswith(f"| {strategy} "))
    return [cell.strip().strip("*") for cell in line.strip("|").split("|")]


def _header(md: str) -> list[str]:
    return [
        cell.strip() for cell in next(line for line in md.splitlines() if line.startswith("| ")).strip("|").split("|")
    ]


def test_the_reference_row_reads_exactly_one_with_no_interval():
    # three DP repeats that differ by 40%: the others' speedups carry an interval, DP's own is 1
    df = to_frame(_repeated("dp", [80.0, 100.0, 120.0], 20 * MIB) + _repeated("hippie", [90.0, 150.0, 160.0], 10 * MIB))
    md = render(df, "md")
    row = dict(zip(_header(md), _row(md, "dp")))
    assert row["speedup"] == "1.000" and row["ME"] == "1.000"
    assert "±" in _row(md, "hippie")[_header(md).index("speedup")]
    assert "±" in row["samples/s"]  # DP's own spread stays visible where it is measured
    csv = pd.read_csv(io.StringIO(render(df, "csv")))
    dp = csv[csv.strategy == "dp"].iloc[0]
    assert dp.speedup_x_dp == 1.0 and pd.isna(dp.speedup_x_dp_ci95)


def test_micro_batches_are_blank_where_they_do_not_apply():
    df = to_frame(
        [_rec("dp", 2, 100.0, 20 * MIB), _rec("ashpipe", 2, 120.0, 10 * MIB), _rec("hippie", 2, 90.0, 8 * MIB)]
    )
    md = render(df, "md")
    micro = _header(md).index("micro")
    assert {s: _row(md, s)[micro] for s in ("dp", "ashpipe", "hippie")} == {"dp": "", "ashpipe": "", "hippie": "4"}


def test_the_strategies_that_take_no_micro_batches_are_the_vocabulary_s():
    from harness.config.registry import strategy_classes

    assert {c.name for c in strategy_classes().values() if not c.takes_micro_batches} == WHOLE_MINIBATCH_STRATEGIES


@pytest.mark.parametrize("name", [s for s in columns.set_names() if s != "all"])
def test_every_column_set_has_at_most_ten_columns_beside_the_label(name):
    # every identifying value varies (two models, devices, precisions) and the runs repeat: the varying
    # comparison groups become sections, so the columns stay those of the set and the runs
    records = []
    for model in ("vit_micro", "vit_tiny"):
        for device in ("cpu", "cuda"):
            for strategy, mem in (("dp", 20 * MIB), ("hippie", 10 * MIB)):
                records += _repeated(strategy, [100.0, 110.0], mem, model=model, device=device)
    table = build(to_frame(records), name)
    assert len(table.shown) - 1 <= 10, [c.label for c in table.shown]
    md = to_markdown(table)
    assert "**model vit_micro; device cpu**" in md and "**model vit_tiny; device cuda**" in md


def test_a_long_layout_is_abbreviated_and_given_in_full_in_a_footnote():
    long = {**_rec("ashpipe", 16, 100.0, 20 * MIB), "replicas": [1] * 16, "boundaries": list(range(3, 48, 3))}
    table = build(to_frame([long, {**_rec("dp", 16, 90.0, 20 * MIB), "replicas": [16]}]))
    md, tex = to_markdown(table), to_latex(table)
    cells = [c.strip("* ") for line in md.splitlines() if line.startswith("| ") for c in line.strip("|").split("|")]
    assert max(len(re.sub("[⁰¹²³⁴⁵⁶⁷⁸⁹]", "", c)) for c in cells) <= MAX_CELL
    full = (
        "[1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1] cut [3, 6, 9, 12, 15, 18, 21, 24, 27, 30, 33, 36, 39, 42, 45]"
    )
    assert "[1×16] cut [3, 6, 9" in md and f"layout {full}" in md
    assert r"[1$\times$16] cut" in tex and "layout [1, 1, 1" in tex
    assert full in render(to_frame([long]), "csv")  # programs get the whole value


def test_a_figure_no_run_has_is_said_in_the_caption_not_drawn_as_dashes():
    df = to_frame(
        [{**_rec("dp", 2, 100.0, 20 * MIB), "accuracy": None}, {**_rec("hippie", 2, 90.0, 8 * MIB), "accuracy": None}]
    )
    md = render(df, "md")
    assert "top-1 %" not in _header(md) and "no run has top-1 %" in md.splitlines()[0]


def test_every_table_has_a_caption():
    records = _repeated("dp", [80.0, 100.0], 20 * MIB) + _repeated("hippie", [90.0, 150.0], 10 * MIB)
    df = to_frame(records)
    for name in columns.set_names():
        assert render(df, "md", name).startswith("*") and r"\caption{" in render(df, "latex", name)


def test_one_rounding_rule_in_the_results_and_the_paired_tables():
    # the same runs' final top-1 over three seeds reads the same in both tables
    curve = [{"step": 100, "accuracy": 0.1, "elapsed_s": 1.0}]
    records = []
    # the digits study's DP: 88.125 rounded to 88.12 before averaging moved its interval's last digit
    for seed, (a_dp, a_h) in enumerate(((0.825, 0.60111), (0.88125, 0.63333), (0.88125, 0.69999))):
        for strategy, acc in (("dp", a_dp), ("hippie", a_h)):
            records.append(
                {
                    **_rec(strategy, 2, 100.0, 10 * MIB),
                    "seed": seed,
                    "accuracy": acc,
                    "steps": 100,
                    "precision": "fp32",
                    "accuracy_curve": [*curve, {"step": 200, "accuracy": acc, "elapsed_s": 2.0}],
                }
            )
    md = render(to_frame(records), "md")
    paired = paired_markdown(against_reference(records))
    for strategy in ("dp", "hippie"):
        top1 = _row(md, strategy)[_header(md).index("top-1 %")]
        assert f"| {top1} |" in next(line for line in paired.splitlines() if line.startswith(f"| {strategy}"))
    assert figure_text(61.234, 4.5678, 2) == "61.23 ± 4.57" and figure_text(float("nan")) == "–"


def test_a_setting_that_applies_to_no_row_is_left_out():
    md = render(to_frame([{**_rec("dp", 2, 100.0, 20 * MIB), "seed": s} for s in (0, 1)]), "md")
    assert "micro" not in _header(md)
