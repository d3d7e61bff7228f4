"""Hippie's gradient all-reduce runs under the last backward, measured from its own launches.

With several buckets per stage, every bucket but possibly the last must start before the
last backward of the iteration ends; the test fails if reduction waits for the optimizer step.
"""

import json
import os

from harness.comm import Comm
from harness.data import BatchOrder, load
from harness.models import build_layers
from tests.helpers.cli import make_spec
from tests.helpers.distributed import spawn


def record_overlap(ctx, spec, out_dir):
    strategy = spec.strategy_cls(spec, build_layers(spec.model, spec.seed), ctx, Comm(ctx))
    data = load(spec.data, spec.seed)
    order = BatchOrder(len(data.train), spec.train.global_batch, spec.seed)
    for step in range(3):
        strategy.train_step(*data.train.batch(order.indices(step)))
    with open(os.path.join(out_dir, f"rank{ctx.rank}.json"), "w") as f:
        json.dump([s["allreduce"] for s in strategy.step_stats], f)


def test_hippie_starts_bucket_all_reduces_before_its_last_backward_ends(tmp_path):
    spec = make_spec("strategy=hippie", "world_size=4", "strategy.stages=2", "train.global_batch=16",
                     "train.micro_batches=2", "strategy.bucket_mb=0.02", "strategy.recompute=none",
                     "data.train_size=64", "data.test_size=32")
    spawn(4, record_overlap, spec, str(tmp_path))
    for rank in range(4):
        for step in json.load(open(tmp_path / f"rank{rank}.json")):
            assert step["buckets"] >= 3, step  # small buckets: several per stage
            assert step["buckets_in_backward"] >= step["buckets"] - 1, (rank, step)
            assert step["hidden_allreduce_s"] > 0, (rank, step)
