"""The benchmark's ratios and its account of where a pipeline's time goes."""

import pytest

from harness.studies.bench import MICRO_BATCHES, STAGES, configurations, summarise


def _run(throughput, compute_per_sample_s, bubble_measured=0.3, bubble_analytic=None):
    return {
        "status": "ok",
        "throughput": throughput,
        "startup_s": 8.0,
        "compute_per_sample_s": compute_per_sample_s,
        "bubble_measured": bubble_measured,
        "bubble_analytic": bubble_analytic,
    }


def test_a_pipelines_ratio_to_its_bound_is_its_share_of_the_schedule_over_its_compute_inflation():
    analytic = (STAGES - 1) / (MICRO_BATCHES + STAGES - 1)
    runs = {name: [_run(100.0, 0.01)] for name in configurations("vit_micro")}
    runs["dp_w1"] = [_run(100.0, 0.01, 0.0, 0.0)]
    runs["hippie"] = [
        _run(120.0, 0.0125, 0.35, analytic),
        _run(140.0, 0.0125, 0.35, analytic),
        _run(130.0, 0.0125, 0.35, analytic),
    ]
    runs["pipelining"] = [_run(110.0, 0.013, 0.4, analytic)]
    s = summarise({"vit_micro": runs})["vit_micro"]
    bound = 2 * 100.0 * (1 - analytic)
    assert s["ratios"]["hippie / bubble bound"] == pytest.approx(130.0 / bound)
    assert s["ratios"]["hippie / best peer 1F1B"] == pytest.approx(130.0 / 110.0)
    hippie = s["profile"]["hippie"]
    assert hippie["compute_inflation"] == pytest.approx(1.25)
    assert hippie["of_schedule"] / hippie["compute_inflation"] == pytest.approx(130.0 / bound)
    assert s["samples_per_s"]["hippie"]["min"] == 120.0 and s["samples_per_s"]["hippie"]["max"] == 140.0


def test_our_best_schedule_is_set_against_torchs_best_and_its_best_at_no_more_memory_per_rank():
    runs = {name: [_run(100.0, 0.01)] for name in configurations("vit_micro")}
    mib = 2**20
    for name, (speed, peak) in {
        "hippie": (120.0, 16),
        "hippie_zb_h1": (125.0, 17),
        "pipelining": (110.0, 16),
        "pipelining_zb1p": (118.0, 17),
        "pipelining_dualpipev": (140.0, 22),
    }.items():
        runs[name] = [{**_run(speed, 0.01), "peak_memory_bytes": peak * mib}]
    s = summarise({"vit_micro": runs})["vit_micro"]
    assert s["best"] == {
        "hippie": "hippie_zb_h1",
        "torch": "pipelining_dualpipev",
        "torch at no more memory": "pipelining_zb1p",
    }
    assert s["ratios"]["best hippie schedule / best torch schedule"] == pytest.approx(125.0 / 140.0)
    assert s["ratios"]["best hippie schedule / best torch schedule at no more memory per rank"] == pytest.approx(
        125.0 / 118.0
    )
    assert s["ratios"]["hippie_zb_h1 / pipelining_zb1p"] == pytest.approx(125.0 / 118.0)
    assert s["ratios"]["best hippie schedule / best peer 1F1B"] == pytest.approx(125.0 / 110.0)


def test_torchs_schedules_of_two_stages_per_rank_cut_the_same_layers_around_the_two_stage_cut():
    for model in ("vit_micro", "vit_tiny"):
        configs = configurations(model)
        two = next(a for a in configs["hippie"] if a.startswith("strategy.boundaries="))
        cut = int(two.split("=")[1].strip("[]"))
        for name in ("pipelining_zb1p", "pipelining_interleaved", "pipelining_zbv", "pipelining_dualpipev"):
            four = next(a for a in configs[name] if a.startswith("strategy.boundaries="))
            cuts = [int(c) for c in four.split("=")[1].strip("[]").split(",")]
            assert len(cuts) == 3 and cuts[1] == cut, (model, name, cuts)
