"""The training pieces every strategy and every reference share, checked against torch itself
(the equivalence tests' single-process references are built from them)."""

import pytest
import torch
import torch.nn.functional as F

from harness.core.errors import ConfigError
from harness.core.training import (
    carry_schedule,
    clip_gradients,
    delay_lr_scale,
    make_optimizer,
    predict_weights_,
    replica_slice,
    summed_loss,
)
from tests.helpers.cli import make_spec


def test_the_optimizer_is_torchs_with_the_configured_settings():
    params = [torch.nn.Parameter(torch.zeros(3))]
    sgd = make_optimizer(
        params, make_spec("train.optimizer=sgd", "train.momentum=0.9", "train.lr=0.3", "train.weight_decay=0.01").train
    )
    assert type(sgd) is torch.optim.SGD and sgd.defaults["momentum"] == 0.9
    assert sgd.defaults["lr"] == 0.3 and sgd.defaults["weight_decay"] == 0.01
    adamw = make_optimizer(
        params, make_spec("train.optimizer=adamw", "train.lr=0.002", "train.weight_decay=0.05").train
    )
    assert type(adamw) is torch.optim.AdamW and adamw.defaults["lr"] == 0.002 and adamw.defaults["weight_decay"] == 0.05


def test_shares_of_the_summed_loss_add_up_to_the_global_mean():
    logits, y = torch.randn(13, 5, generator=torch.Generator().manual_seed(0)), torch.arange(13) % 5
    shares = [summed_loss(logits[replica_slice(13, 3, r)], y[replica_slice(13, 3, r)], 13) for r in range(3)]
    torch.testing.assert_close(sum(shares), F.cross_entropy(logits, y))
    # contiguous, covering every sample once, sizes differing by at most one
    assert [replica_slice(13, 3, r) for r in range(3)] == [slice(0, 4), slice(4, 8), slice(8, 13)]


def _steps_of(optimizer, k: int) -> list[float]:
    """The learning rate before each of ``k`` optimizer steps."""
    rates = []
    for _ in range(k):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
    return rates


def test_learning_rate_schedules_step_with_the_optimizer_and_ride_in_its_state_dict():
    params = [torch.nn.Parameter(torch.zeros(3))]
    warm_cosine = make_spec(
        "train.optimizer=sgd",
        "train.lr=1.0",
        "train.lr_schedule=cosine",
        "train.lr_warmup_steps=2",
        "train.lr_min_ratio=0.1",
        "train.steps=6",
    ).train
    rates = _steps_of(make_optimizer(params, warm_cosine, steps=6), 7)
    assert rates[:2] == pytest.approx([0.5, 1.0])  # linear warm-up over 2 steps
    assert rates[2] == pytest.approx(1.0) and rates[6] == pytest.approx(0.1)  # cosine from 1 to the floor at step 6
    assert all(a >= b for a, b in zip(rates[2:], rates[3:]))
    step = make_spec(
        "train.optimizer=sgd",
        "train.lr=1.0",
        "train.lr_schedule=step",
        "train.lr_decay_steps=2",
        "train.lr_decay_factor=0.5",
    ).train
    assert _steps_of(make_optimizer(params, step), 6) == pytest.approx([1, 1, 0.5, 0.5, 0.25, 0.25])
    # a checkpoint's optimizer state carries the schedule's position: a new optimizer resumes it
    first = make_optimizer(params, warm_cosine, steps=6)
    _steps_of(first, 3)
    resumed = make_optimizer(params, warm_cosine, steps=6)
    resumed.load_state_dict(first.state_dict())
    assert _steps_of(resumed, 4) == pytest.approx(rates[3:])
    constant = make_optimizer(params, make_spec("train.optimizer=sgd", "train.lr=0.3").train)
    assert _steps_of(constant, 3) == [0.3] * 3 and "lr_schedule" not in constant.state_dict()


def test_nesterov_and_label_smoothing_are_torchs():
    params = [torch.nn.Parameter(torch.zeros(3))]
    sgd = make_optimizer(params, make_spec("train.optimizer=sgd", "train.momentum=0.9", "train.nesterov=true").train)
    assert sgd.defaults["nesterov"] is True
    logits, y = torch.randn(13, 5, generator=torch.Generator().manual_seed(0)), torch.arange(13) % 5
    torch.testing.assert_close(summed_loss(logits, y, 13, 0.1), F.cross_entropy(logits, y, label_smoothing=0.1))
    with pytest.raises(ConfigError, match="train.nesterov=true needs train.optimizer=sgd"):
        make_spec("train.optimizer=adamw", "train.nesterov=true")


def test_clipping_a_split_model_clips_by_the_whole_models_norm():
    """Two stages, the second with two replicas holding the same gradient: the weighted squared
    norms summed over the three ranks give the whole model's, and every rank scales alike."""
    whole = [torch.nn.Parameter(torch.zeros(4)), torch.nn.Parameter(torch.zeros(2))]
    whole[0].grad, whole[1].grad = torch.tensor([3.0, 0, 0, 0]), torch.tensor([0, 4.0])  # norm 5
    ranks = [
        [whole[0].detach().clone().requires_grad_()],
        [whole[1].detach().clone().requires_grad_()],
        [whole[1].detach().clone().requires_grad_()],
    ]
    for rank, source in zip(ranks, (whole[0], whole[1], whole[1])):
        rank[0].grad = source.grad.clone()
    weights = [1.0, 0.5, 0.5]
    squared = sum(w * float(r[0].grad.pow(2).sum()) for r, w in zip(ranks, weights))
    for rank, weight in zip(ranks, weights):  # the all-reduce's sum, as every rank would receive it
        clip_gradients(rank, 1.0, all_reduce=lambda t: torch.full_like(t, squared), weight=weight)
    clip_gradients(whole, 1.0)
    torch.testing.assert_close(ranks[0][0].grad, whole[0].grad)
    torch.testing.assert_close(ranks[1][0].grad, whole[1].grad)
    assert float(torch.cat([p.grad for p in whole]).norm()) == pytest.approx(1.0, rel=1e-5)
    unclipped = [torch.nn.Parameter(torch.zeros(2))]
    unclipped[0].grad = torch.tensor([0.3, 0.4])
    clip_gradients(unclipped, 1.0)  # a norm under the limit is left alone
    torch.testing.assert_close(unclipped[0].grad, torch.tensor([0.3, 0.4]))


def test_the_delay_correction_divides_by_the_delay_then_anneals_to_the_full_rate():
    params = [torch.nn.Parameter(torch.zeros(3))]
    spec = make_spec("train.optimizer=sgd", "train.lr=1.0")
    stale = make_optimizer(params, spec.train, lr_scale=delay_lr_scale(4, lambda: 2, anneal_steps=4))
    carry_schedule(stale, 2)  # the pipeline starts after two synchronous steps
    # 4 ** -p with p = 1, 3/4, 1/2, 1/4, 0, then the full rate
    assert _steps_of(stale, 6) == pytest.approx([4**-p for p in (1, 0.75, 0.5, 0.25, 0, 0)])
    # one update stale: 1 ** -p leaves the rate alone; the schedule's own factor still applies
    warm = make_spec("train.optimizer=sgd", "train.lr=1.0", "train.lr_warmup_steps=2").train
    assert _steps_of(make_optimizer(params, warm, lr_scale=delay_lr_scale(1, lambda: 0, 4)), 3) == pytest.approx(
        [0.5, 1, 1]
    )


def test_weight_prediction_extrapolates_the_optimizers_own_update():
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(5))
    g = torch.randn(5)
    sgd = torch.optim.SGD([w], lr=0.1, momentum=0.9)
    copy = [w.detach().clone()]
    predict_weights_(copy, [w], sgd, delay=3)  # no step yet: no direction
    assert torch.equal(copy[0], w.detach())
    w.grad = g.clone()
    sgd.step()
    copy = [w.detach().clone()]
    predict_weights_(copy, [w], sgd, delay=3)
    torch.testing.assert_close(copy[0], w.detach() - 3 * 0.1 * sgd.state[w]["momentum_buffer"])
    # AdamW without averaging (betas 0): while the gradient holds, the prediction is where the
    # weights will be (to first order in lr x weight decay over several steps)
    adamw = torch.optim.AdamW([w], lr=0.01, betas=(0.0, 0.0), weight_decay=0.1)
    adamw.step()
    for delay in (1, 2):
        copy = [w.detach().clone()]
        predict_weights_(copy, [w], adamw, delay=delay)
        ahead = w.detach().clone()
        for _ in range(delay):
            ahead = ahead * (1 - 0.01 * 0.1) - 0.01 * g / (g.abs() + 1e-8)
        torch.testing.assert_close(copy[0], ahead, atol=1e-6 if delay == 1 else 5e-5, rtol=0)
