"""The training pieces every strategy and every reference share, checked against torch itself
(the equivalence tests' single-process references are built from them)."""

import torch
import torch.nn.functional as F

from harness.training import make_optimizer, replica_slice, summed_loss
from tests.helpers.cli import make_spec


def test_the_optimizer_is_torchs_with_the_configured_settings():
    params = [torch.nn.Parameter(torch.zeros(3))]
    sgd = make_optimizer(params, make_spec("train.optimizer=sgd", "train.momentum=0.9", "train.lr=0.3",
                                           "train.weight_decay=0.01").train)
    assert type(sgd) is torch.optim.SGD and sgd.defaults["momentum"] == 0.9
    assert sgd.defaults["lr"] == 0.3 and sgd.defaults["weight_decay"] == 0.01
    adamw = make_optimizer(params, make_spec("train.optimizer=adamw", "train.lr=0.002", "train.weight_decay=0.05").train)
    assert type(adamw) is torch.optim.AdamW and adamw.defaults["lr"] == 0.002 and adamw.defaults["weight_decay"] == 0.05


def test_shares_of_the_summed_loss_add_up_to_the_global_mean():
    logits, y = torch.randn(13, 5, generator=torch.Generator().manual_seed(0)), torch.arange(13) % 5
    shares = [summed_loss(logits[replica_slice(13, 3, r)], y[replica_slice(13, 3, r)], 13) for r in range(3)]
    torch.testing.assert_close(sum(shares), F.cross_entropy(logits, y))
    # contiguous, covering every sample once, sizes differing by at most one
    assert [replica_slice(13, 3, r) for r in range(3)] == [slice(0, 4), slice(4, 8), slice(8, 13)]
