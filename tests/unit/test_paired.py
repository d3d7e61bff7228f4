"""The accuracy study against DP by seed (harness.report.paired): targets, steps and times to
them read from each run's curve, and the paired differences, on records made by hand."""

import pytest

from harness.report.paired import against_reference, to_markdown


def _run(strategy, seed, curve, world_size=2, variant=None, **extra):
    """A record with an accuracy curve of (step, accuracy, elapsed seconds) points; the last is final."""
    return {
        "status": "ok",
        "strategy": strategy,
        "variant": variant,
        "seed": seed,
        "world_size": world_size,
        "model": "vit_micro",
        "data": "synthetic",
        "global_batch": 64,
        "steps": 300,
        "precision": "fp32",
        "accuracy": curve[-1][1],
        **extra,
        "accuracy_curve": [{"step": s, "accuracy": a, "elapsed_s": t} for s, a, t in curve],
    }


def test_each_configuration_is_judged_against_the_dp_run_of_its_seed():
    records = [
        _run("dp", 0, [(100, 0.30, 10.0), (200, 0.50, 20.0), (300, 0.60, 30.0)]),
        _run("dp", 1, [(100, 0.40, 12.0), (200, 0.70, 24.0), (300, 0.70, 36.0)]),
        # seed 0's target is 0.59: reached at step 200 in 15 s; seed 1's 0.69: at step 300 in 27 s
        _run("ashpipe", 0, [(100, 0.40, 7.5), (200, 0.59, 15.0), (300, 0.62, 22.5)]),
        _run("ashpipe", 1, [(100, 0.40, 9.0), (200, 0.60, 18.0), (300, 0.69, 27.0)]),
        # a 3-worker pipeline pairs with 2-worker DP of its seed; it never reaches seed 0's target
        _run("ashpipe", 0, [(100, 0.20, 5.0), (300, 0.40, 15.0)], world_size=3),
        _run("ashpipe", 1, [(100, 0.20, 5.0), (300, 0.70, 15.0)], world_size=3),
        _run("dp", 2, [(300, 0.9, 1.0)], model="vit_tiny"),  # another model: pairs with nothing here
    ]
    table = against_reference(records).set_index(["configuration", "workers"])
    # two models in the records: each row names what sets its pairing apart
    dp, two, three, tiny = (
        table.loc[(f"{s} [{m}]", w)]
        for s, w, m in (
            ("dp", 2, "vit_micro"),
            ("ashpipe", 2, "vit_micro"),
            ("ashpipe", 3, "vit_micro"),
            ("dp", 2, "vit_tiny"),
        )
    )
    assert tiny["seeds"] == 1 and tiny["top1"] == pytest.approx(90)
    # DP reaches its own target of seed 0 at its last step (30 s), of seed 1 at step 200 (24 s)
    assert dp["reached"] == "2/2" and dp["steps"] == 250 and dp["seconds"] == pytest.approx(27.0)
    assert dp["delta"] != dp["delta"] and dp["saving"] != dp["saving"]  # the reference has nothing to pair
    assert two["top1"] == pytest.approx(65.5) and two["delta"] == pytest.approx(0.5)  # (+2 - 1) / 2 points
    assert two["steps"] == pytest.approx(250) and two["seconds"] == pytest.approx(21.0)
    assert two["saving"] == pytest.approx(100 * ((1 - 15 / 30) + (1 - 27 / 24)) / 2)  # paired by seed
    assert three["reached"] == "1/2" and three["steps"] == 300 and three["saving"] == pytest.approx(100 * (1 - 15 / 24))
    assert three["saving ci95"] != three["saving ci95"]  # one pair: no interval
    text = to_markdown(table.reset_index())
    assert "| ashpipe [vit_micro] | 3 | 2 | 1/2 |" in text
    assert "minus 1 point" in text


def test_no_table_without_two_seeds_paired_with_dp():
    one_seed = [_run("dp", 0, [(300, 0.5, 3.0)]), _run("ashpipe", 0, [(300, 0.4, 2.0)])]
    assert against_reference(one_seed) is None
    assert against_reference([_run("hippie", s, [(300, 0.5, 3.0)]) for s in (0, 1)]) is None  # no DP


def test_runs_pair_with_dp_from_the_same_starting_weights():
    """A fine-tuning study: DP from a pretrained file and DP from scratch side by side; a pipeline
    from the file pairs with DP from the file, seed by seed, whichever DP run comes first."""
    start = {"config": {"model": {"pretrained": "/runs/pretrain"}}}
    scratch = {"config": {"model": {"pretrained": None}}}
    records = [_run("dp", seed, [(300, 0.30, 30.0)], variant="scratch", **scratch) for seed in (0, 1)]
    records += [_run("dp", seed, [(300, 0.90, 30.0)], variant="tuned", **start) for seed in (0, 1)]
    records += [_run("ashpipe", seed, [(300, 0.80 + seed / 100, 30.0)], **start) for seed in (0, 1)]
    table = against_reference(records).set_index("configuration")
    pipeline = table.loc["ashpipe [pretrained=pretrain]"]
    assert pipeline["delta"] == pytest.approx(-9.5)  # against the tuned DP (90%), not the scratch one (30%)
    assert table.loc["dp (scratch)"]["top1"] == pytest.approx(30)


def test_a_rate_sweep_pairs_each_rate_with_dp_at_that_rate():
    records = [
        _run(strategy, seed, [(300, top1 + seed / 100, 30.0)], config={"train": {"lr": lr}})
        for lr, dp, pipeline in ((0.1, 0.50, 0.45), (0.3, 0.80, 0.60))
        for strategy, top1 in (("dp", dp), ("ashpipe", pipeline))
        for seed in (0, 1)
    ]
    table = against_reference(records).set_index("configuration")
    assert table.loc["ashpipe [lr=0.1]"]["delta"] == pytest.approx(-5)
    assert table.loc["ashpipe [lr=0.3]"]["delta"] == pytest.approx(-20)
