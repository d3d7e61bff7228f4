"""The documentation's extending examples train correctly: the strategy of docs/extending/strategy.md
and Hippie on the schedule of docs/extending/schedule.md, each taken from its page and run on two
gloo workers, end one step on the parameters of single-process training."""

import os

import torch

from harness.core.comm import Comm
from harness.core.data import load
from harness.core.models import build_layers
from harness.strategies.hippie import HippieStrategy
from tests.helpers.cli import make_spec
from tests.helpers.distributed import assert_matches_reference, merged_rank_states, reference_step, spawn
from tests.helpers.docs import code_blocks, run_block


def _batch(spec):
    return load(spec.data, spec.seed).train.batch(torch.arange(spec.train.global_batch))


def _save(strategy, spec, out_dir, rank):
    strategy.train_step(*_batch(spec))
    torch.save(strategy.state_dict_for_check(), os.path.join(out_dir, f"rank{rank}.pt"))


def _strategy_example(ctx, source, spec, out_dir):
    cls = run_block(source, "allreduce_dp").AllReduceDPStrategy
    _save(cls(spec, build_layers(spec.model, spec.seed), ctx, Comm(ctx)), spec, out_dir, ctx.rank)


def test_the_strategy_example_trains_like_one_process(tmp_path):
    source = code_blocks("extending/strategy.md", "python")[0]
    assert run_block(source, "allreduce_dp").AllReduceDPStrategy.name == "allreduce_dp"
    spec = make_spec(
        "world_size=2",
        "train.global_batch=13",
        "train.optimizer=sgd",
        "train.momentum=0",
        "train.lr=0.5",
        "data.train_size=64",
        "data.test_size=32",
    )
    spawn(2, _strategy_example, source, spec, str(tmp_path))
    assert_matches_reference(merged_rank_states(str(tmp_path), 2), reference_step(spec, *_batch(spec)))


def _schedule_example(ctx, source, spec, out_dir):
    from harness.runtime import schedules

    run_block(source, "fill_drain_in_order")  # in this worker, as a strategy's module importing it registers it
    strategy = HippieStrategy(spec, build_layers(spec.model, spec.seed), ctx, Comm(ctx))
    # the executor runs the example's own lists: the backwards in the forwards' order
    assert strategy.train_actions == schedules.get("fill_drain_in_order").lists(2, 1, 4)[ctx.rank]
    assert [a.micro for a in strategy.train_actions if a.op == "B"] == [0, 1, 2, 3]
    _save(strategy, spec, out_dir, ctx.rank)


def test_hippie_on_the_schedule_example_trains_like_one_process(tmp_path, monkeypatch):
    from harness.runtime import schedules

    monkeypatch.setattr(schedules, "SCHEDULES", dict(schedules.SCHEDULES))
    source = code_blocks("extending/schedule.md", "python")[0]
    run_block(source, "fill_drain_in_order")  # for the spec's check, in this process
    # plain SGD, as the other equivalence tests: AdamW's first step moves a weight whose gradient
    # is near zero by about its rate whichever way rounding tips it (a 5.7e-5 miss on a new host)
    spec = make_spec(
        "strategy=hippie",
        "world_size=2",
        "strategy.schedule=fill_drain_in_order",
        "train.micro_batches=4",
        "train.global_batch=16",
        "strategy.recompute=none",
        "strategy.boundaries=[3]",
        "data.train_size=64",
        "data.test_size=32",
        "train.optimizer=sgd",
        "train.momentum=0",
        "train.lr=0.5",
    )
    spawn(2, _schedule_example, source, spec, str(tmp_path))
    assert_matches_reference(merged_rank_states(str(tmp_path), 2), reference_step(spec, *_batch(spec)))
