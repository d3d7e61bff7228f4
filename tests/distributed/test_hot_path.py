"""Our executor allocates its step's buffers once: gradients, receive buffers and stashed weights.

After the first steps, each step's gradients are views into the same bucket buffers (reduced
in place across replicas), its received tensors come from the same kept buffers, and an
asynchronous stage's stashed weight versions are the same tensors, refilled. The test fails
if gradients are freed and reallocated per step, or if a buffer is allocated per micro-batch.
"""

import json
import os

import pytest

from harness.core.comm import Comm
from harness.core.data import BatchOrder, load
from harness.core.models import build_layers
from tests.helpers.cli import make_spec
from tests.helpers.distributed import spawn


def _storages(tensors) -> list[int]:
    return sorted({t.untyped_storage().data_ptr() for t in tensors})


def record_buffers(ctx, spec, out_dir):
    strategy = spec.strategy_cls(spec, build_layers(spec.model, spec.seed), ctx, Comm(ctx))
    executor = strategy.executor
    data = load(spec.data, spec.seed)
    order = BatchOrder(len(data.train), spec.train.global_batch, spec.seed)
    steps, held = [], []  # the tensors are held, so a new one can never take a freed one's address
    for step in range(5):
        strategy.train_step(*data.train.batch(order.indices(step)))
        received = [b for free in executor._received.values() for b in free]
        stashed = executor.stashed_tensors()
        held += received + stashed
        steps.append(
            {
                "grads": _storages(p.grad for p in strategy.params),
                "buckets": _storages(f for st in executor.stages for f in st.grads.flats),
                "received": _storages(received),
                "stashed": sorted(id(t) for t in stashed),
            }
        )
    strategy.finish_training()  # settles the sends still in flight (see test_hidden_allreduce)
    with open(os.path.join(out_dir, f"rank{ctx.rank}.json"), "w") as f:
        json.dump(steps, f)


def _check(tmp_path, world_size: int) -> list[list[dict]]:
    ranks = [json.load(open(tmp_path / f"rank{r}.json")) for r in range(world_size)]
    for rank, steps in enumerate(ranks):
        for step in steps:
            assert step["grads"] == step["buckets"], (rank, step)  # every gradient lives in a bucket
        settled = steps[2:]  # an asynchronous pipeline fills in its first steps
        for key in ("buckets", "received", "stashed"):
            assert all(s[key] == settled[0][key] for s in settled), (rank, key, steps)
    return ranks


@pytest.mark.parametrize("schedule,micro_batches", [("1f1b", 2), ("zbv", 4)])
def test_hippie_keeps_its_gradient_and_receive_buffers_across_steps(tmp_path, schedule, micro_batches):
    # zbv: two stages per rank, each with its own buckets, and the turn of the V handed over in place
    spec = make_spec(
        "strategy=hippie",
        "world_size=4",
        "strategy.stages=2",
        "train.global_batch=16",
        f"strategy.schedule={schedule}",
        f"train.micro_batches={micro_batches}",
        "strategy.bucket_mb=0.02",
        "strategy.recompute=none",
        "data.train_size=128",
        "data.test_size=32",
    )
    spawn(4, record_buffers, spec, str(tmp_path))
    ranks = _check(tmp_path, 4)
    assert all(len(steps[-1]["buckets"]) >= 3 for steps in ranks)  # several buckets per stage
    assert all(steps[-1]["received"] for steps in ranks)  # both stages receive (activations, gradients)


def test_ashpipe_reuses_its_stashed_weight_versions(tmp_path):
    spec = make_spec(
        "strategy=ashpipe",
        "world_size=2",
        "strategy.replicas=[1,1]",
        "strategy.boundaries=[3]",
        "train.global_batch=16",
        "data.train_size=128",
        "data.test_size=32",
    )
    spawn(2, record_buffers, spec, str(tmp_path))
    ranks = _check(tmp_path, 2)
    assert ranks[0][-1]["stashed"] and not ranks[1][-1]["stashed"]  # stage 0 stashes, the last stage not
