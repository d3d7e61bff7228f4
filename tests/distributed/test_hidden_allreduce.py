"""Hippie's gradient all-reduce runs under the last backward, measured from its own launches.

With several buckets per stage, every bucket but possibly the last must start before the
last backward of the iteration ends (under a split backward: the last weight-gradient pass;
on a rank of several stages, each stage's own last one, under the other stage's work);
the test fails if reduction waits for the optimizer step.
"""

import json
import os

import pytest

from harness.core.comm import Comm
from harness.core.data import BatchOrder, load
from harness.core.models import build_layers
from tests.helpers.cli import make_spec
from tests.helpers.distributed import spawn


def record_overlap(ctx, spec, out_dir):
    strategy = spec.strategy_cls(spec, build_layers(spec.model, spec.seed), ctx, Comm(ctx))
    data = load(spec.data, spec.seed)
    order = BatchOrder(len(data.train), spec.train.global_batch, spec.seed)
    for step in range(3):
        strategy.train_step(*data.train.batch(order.indices(step)))
    # as the worker loop does: an asynchronous pipeline's last sends are still in flight, and a send
    # dropped unfinished (the strategy going out of scope) is cancelled, leaving its receiver waiting
    strategy.finish_training()
    with open(os.path.join(out_dir, f"rank{ctx.rank}.json"), "w") as f:
        json.dump([s["allreduce"] for s in strategy.step_stats], f)


@pytest.mark.parametrize(
    "schedule,micro_batches", [("1f1b", 2), ("zb_h1", 2), ("interleaved_1f1b", 4), ("zero_bubble", 4), ("zbv", 4)]
)
def test_hippie_starts_bucket_all_reduces_before_its_last_backward_ends(tmp_path, schedule, micro_batches):
    spec = make_spec(
        "strategy=hippie",
        "world_size=4",
        "strategy.stages=2",
        "train.global_batch=16",
        f"train.micro_batches={micro_batches}",
        "strategy.bucket_mb=0.02",
        "strategy.recompute=none",
        f"strategy.schedule={schedule}",
        "data.train_size=64",
        "data.test_size=32",
    )
    spawn(4, record_overlap, spec, str(tmp_path))
    for rank in range(4):
        for step in json.load(open(tmp_path / f"rank{rank}.json")):
            assert step["buckets"] >= 3, step  # small buckets: several per stage
            assert step["buckets_in_backward"] >= step["buckets"] - 1, (rank, step)
            assert step["hidden_allreduce_s"] > 0, (rank, step)


def test_ashpipe_starts_its_replica_all_reduce_under_backward_on_stashing_stages_too(tmp_path):
    # stage 0 stashes weight versions (its backward accumulates into the copies), stage 1 does not;
    # both have two replicas, and every bucket but possibly the last must start before the backward ends
    spec = make_spec(
        "strategy=ashpipe",
        "world_size=4",
        "strategy.replicas=[2,2]",
        "strategy.boundaries=[3]",
        "train.global_batch=16",
        "strategy.bucket_mb=0.02",
        "data.train_size=64",
        "data.test_size=32",
    )
    spawn(4, record_overlap, spec, str(tmp_path))
    for rank in range(4):
        steps = [s for s in json.load(open(tmp_path / f"rank{rank}.json")) if s]
        assert steps, rank  # every rank stepped (stage 0 from its first call, stage 1 too)
        for step in steps:
            assert step["buckets"] >= 3, step
            assert step["buckets_in_backward"] >= step["buckets"] - 1, (rank, step)
            assert step["hidden_allreduce_s"] > 0, (rank, step)
