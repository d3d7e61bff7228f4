"""``pipebench stability``: each job of a sweep trained through AshPipe's single-process reference, as its
strategy says (``reference_layout``)."""

import pytest
import torch

from harness.commands import stability
from harness.core.data import BatchOrder, load
from harness.core.errors import ConfigError
from harness.strategies.ashpipe.reference import ashpipe_reference
from tests.helpers.cli import TINY, make_spec
from tests.helpers.distributed import reference_steps

SGD = ["train.optimizer=sgd", "train.momentum=0.9", "train.lr=0.1"]


def test_a_job_is_trained_as_its_strategy_computes():
    dp = make_spec(*TINY, *SGD, "strategy=dp", "world_size=2")
    assert dp.strategy_cls.reference_layout(dp) == ([], 0)  # synchronous: one stage
    sp = make_spec(*TINY, *SGD, "+case=accuracy/ashpipe_w2", "strategy.switch_fraction=0.4")
    assert sp.strategy_cls.reference_layout(sp) == ([3], 2)  # 0.4 of 5 steps synchronous, then two stages
    # one stage through the reference is plain single-process training (with momentum)
    data = load(dp.data, dp.seed, dp.model.num_classes)
    order = BatchOrder(len(data.train), dp.train.global_batch, dp.seed)
    batches = [data.train_batch(order, k) for k in range(dp.steps)]
    expected = reference_steps(dp, batches)
    got = ashpipe_reference(dp, batches, [], 0)
    for name, tensor in expected.items():
        torch.testing.assert_close(got[name], tensor, rtol=0, atol=0)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["strategy=ashpipe", "world_size=2", "strategy.replicas=[1,1]"], "strategy.boundaries"),
        (["+case=accuracy/ashpipe_w2", "strategy.switch_plateau=0.1"], "fixed one"),
    ],
)
def test_a_job_the_reference_cannot_compute_is_refused(overrides, message):
    spec = make_spec(*TINY, *SGD, *overrides)
    with pytest.raises(ConfigError, match=message):
        spec.strategy_cls.reference_layout(spec)


def test_the_command_reports_each_job_and_stops_one_that_diverges(capsys):
    assert stability.main([*TINY, *SGD, "+case=accuracy/dp_w2,accuracy/ashpipe_w3", "train.lr=0.01,1e4"]) == 0
    out = capsys.readouterr()
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in out.out.splitlines() if "+case=" in line]
    # the job column names what tells the jobs apart; the diverged-at-step column
    diverged = {frozenset(job.split()): cells[5] for job, *cells in rows}
    assert len(diverged) == 4, out.out
    for case in ("+case=accuracy/dp_w2", "+case=accuracy/ashpipe_w3"):
        assert diverged[frozenset({case, "train.lr=0.01"})] == "–"
        assert int(diverged[frozenset({case, "train.lr=10000.0"})]) < 5
    assert "[4/4]" in out.err


@pytest.mark.parametrize(
    "bad, message",
    [
        (["strategy=ashpipe", "strategy.boundaries=null"], "strategy.boundaries"),
        (["data=digits", "data.root=/nonexistent"], "/nonexistent"),
    ],
)
def test_the_command_refuses_before_training_anything(capsys, bad, message):
    assert stability.main([*TINY, *SGD, "+case=accuracy/dp_w2,accuracy/ashpipe_w2", *bad]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err and "[1/" not in err
