"""The benchmark's ratios and its account of where a pipeline's time goes."""

import pytest

from harness.commands.bench import MICRO_BATCHES, STAGES, configurations, summarise


def _run(throughput, compute_per_sample_s, bubble_measured=0.3, bubble_analytic=None):
    return {"status": "ok", "throughput": throughput, "startup_s": 8.0, "compute_per_sample_s": compute_per_sample_s,
            "bubble_measured": bubble_measured, "bubble_analytic": bubble_analytic}


def test_a_pipelines_ratio_to_its_bound_is_its_share_of_the_schedule_over_its_compute_inflation():
    analytic = (STAGES - 1) / (MICRO_BATCHES + STAGES - 1)
    runs = {name: [_run(100.0, 0.01)] for name in configurations("vit_micro")}
    runs["dp_w1"] = [_run(100.0, 0.01, 0.0, 0.0)]
    runs["hippie"] = [_run(120.0, 0.0125, 0.35, analytic), _run(140.0, 0.0125, 0.35, analytic),
                      _run(130.0, 0.0125, 0.35, analytic)]
    runs["pipelining"] = [_run(110.0, 0.013, 0.4, analytic)]
    s = summarise({"vit_micro": runs})["vit_micro"]
    bound = 2 * 100.0 * (1 - analytic)
    assert s["ratios"]["hippie / bubble bound"] == pytest.approx(130.0 / bound)
    assert s["ratios"]["hippie / best peer 1F1B"] == pytest.approx(130.0 / 110.0)
    hippie = s["profile"]["hippie"]
    assert hippie["compute_inflation"] == pytest.approx(1.25)
    assert hippie["of_schedule"] / hippie["compute_inflation"] == pytest.approx(130.0 / bound)
    assert s["samples_per_s"]["hippie"]["min"] == 120.0 and s["samples_per_s"]["hippie"]["max"] == 140.0
