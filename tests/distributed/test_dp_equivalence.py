"""DDP after one step equals single-process training on the same global batch."""

import os

import torch

from harness.core.data import load
from harness.core.models import build_layers
from tests.helpers.cli import make_spec
from tests.helpers.distributed import assert_matches_reference, merged_rank_states, reference_step, spawn


def _global_batch(spec):
    ds = load(spec.data, spec.seed)
    return ds.train.batch(torch.arange(spec.train.global_batch))


def train_one_step_and_save(ctx, spec, out_dir):
    from harness.core.comm import Comm

    strategy = spec.strategy_cls(spec, build_layers(spec.model, spec.seed), ctx, Comm(ctx))
    x, y = _global_batch(spec)
    strategy.train_step(x, y)
    torch.save(strategy.state_dict_for_check(), os.path.join(out_dir, f"rank{ctx.rank}.pt"))


def test_ddp_two_workers_uneven_shares_equal_single_process(tmp_path):
    # 11 samples over 2 ranks: shares of 5 and 6, so the loss scaling matters
    spec = make_spec(
        "world_size=2",
        "train.global_batch=11",
        "train.optimizer=sgd",
        "train.lr=0.5",
        "data.train_size=64",
        "data.test_size=32",
    )
    spawn(2, train_one_step_and_save, spec, str(tmp_path))
    x, y = _global_batch(spec)
    reference = reference_step(spec, x, y)
    assert_matches_reference(merged_rank_states(str(tmp_path), 2), reference)
    # and the step really changed the weights (the comparison is not vacuous)
    initial = {
        f"{i}.{n}": p for i, l in enumerate(build_layers(spec.model, spec.seed)) for n, p in l.named_parameters()
    }
    assert any(not torch.allclose(initial[k], reference[k]) for k in reference)
