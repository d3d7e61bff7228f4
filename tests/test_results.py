"""Tables from fixture records: speedup and ME against DP, failed runs kept, groups without DP."""

import json
import os

import pytest

from harness.record import failed_record, write
from harness.results import comparison, load_records, render


def _rec(strategy, world_size, throughput, mem, model="vit_micro", status="ok", error=None):
    return {"status": status, "error": error, "strategy": strategy, "model": model, "data": "synthetic",
            "world_size": world_size, "global_batch": 64, "micro_batches": 4, "throughput": throughput,
            "step_time_s": 64 / throughput if throughput else None, "peak_memory_bytes": mem,
            "peak_memory_per_rank": [mem, mem], "accuracy": 0.2, "final_loss": 3.0, "device": "cpu"}


@pytest.fixture
def sweep(tmp_path):
    recs = [_rec("dp", 2, 100.0, 200), _rec("hippie", 2, 150.0, 100),
            failed_record({"strategy": "ashpipe", "model": "vit_micro", "data": "synthetic", "world_size": 2,
                           "global_batch": 64}, "rank 1 raised RuntimeError: boom"),
            _rec("hippie", 4, 300.0, 50, model="vit_tiny")]
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
    assert render(df, "md").startswith("| strategy")
    assert render(df, "csv").splitlines()[0].startswith("strategy,model")
    assert "\\begin{tabular}" in render(df, "latex")


def test_unreadable_record_is_reported_as_failed(tmp_path):
    os.makedirs(tmp_path / "x")
    (tmp_path / "x" / "metrics.json").write_text("{not json")
    df = load_records([str(tmp_path)])
    assert df.iloc[0].status == "failed" and "unreadable" in df.iloc[0].error
