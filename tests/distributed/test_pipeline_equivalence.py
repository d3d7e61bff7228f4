"""After one optimizer step, every synchronous pipeline layout equals single-process training.

Each spawned world runs several layouts one after another (same world size),
so the grid costs a handful of process starts rather than one per case.
"""

import json
import os

import pytest
import torch

from harness.core.comm import Comm
from harness.core.data import load
from harness.core.models import build_layers
from tests.helpers.cli import make_spec
from tests.helpers.distributed import assert_matches_reference, merged_rank_states, reference_step, spawn

COMMON = [
    "train.global_batch=13",
    "train.optimizer=sgd",
    "train.momentum=0",
    "train.lr=0.5",
    "data.train_size=64",
    "data.test_size=32",
]

# world size -> layouts (stages, micro-batches, extra overrides); replicas = world / stages
GRID = {
    2: [
        (2, 1, []),
        (2, 2, []),
        (2, 4, ["strategy.recompute=all"]),
        (2, 3, ["strategy.boundaries=[1]"]),
        (2, 4, ["strategy.schedule=gpipe", "strategy.recompute=auto"]),
        (1, 3, ["strategy.recompute=all"]),
        (2, 4, ["strategy.schedule=zb_h1", "strategy.recompute=none"]),
        (2, 3, ["strategy.schedule=zb_h1", "strategy.recompute=all"]),
        # several stages per rank: loop placement, and V (stages 1 and 2 on rank 1, handed over in place)
        *[(2, 4, [f"strategy.schedule={s}"]) for s in ("interleaved_1f1b", "looped_bfs", "zbv", "dualpipev")],
        (2, 4, ["strategy.schedule=zero_bubble", "strategy.recompute=all"]),
        (2, 4, ["strategy.schedule=zbv", "strategy.recompute=all", "strategy.stages_per_rank=2"]),
        (2, 6, ["strategy.schedule=interleaved_1f1b", "strategy.stages_per_rank=3", "strategy.boundaries=[1,2,3,4,5]"]),
    ],
    3: [(3, 3, ["strategy.boundaries=[1,5]"]), (3, 4, ["strategy.recompute=auto"])],
    4: [
        (4, 4, []),
        (4, 3, ["strategy.recompute=all"]),
        (2, 2, []),
        (2, 3, ["strategy.recompute=all", "strategy.bucket_mb=0.01"]),
        (2, 1, ["strategy.schedule=gpipe"]),
        (4, 6, ["strategy.schedule=zb_h1", "strategy.recompute=all"]),
        (2, 4, ["strategy.schedule=zb_h1", "strategy.bucket_mb=0.01"]),
        (2, 4, ["strategy.schedule=zbv", "strategy.bucket_mb=0.01", "strategy.recompute=auto"]),
        (2, 4, ["strategy.schedule=interleaved_1f1b", "strategy.bucket_mb=0.01"]),
    ],
    6: [(3, 2, ["strategy.recompute=auto"])],
    8: [(4, 2, ["strategy.recompute=all"])],
}


def _spec(world, stages, micro, extra):
    return make_spec(
        "strategy=hippie",
        f"world_size={world}",
        f"strategy.stages={stages}",
        f"train.micro_batches={micro}",
        *COMMON,
        *extra,
    )


def _batch(spec):
    return load(spec.data, spec.seed).train.batch(torch.arange(spec.train.global_batch))


def run_layouts(ctx, specs, out_dir):
    for i, spec in enumerate(specs):
        strategy = spec.strategy_cls(spec, build_layers(spec.model, spec.seed), ctx, Comm(ctx))
        x, y = _batch(spec)
        strategy.train_step(x, y)
        os.makedirs(os.path.join(out_dir, str(i)), exist_ok=True)
        torch.save(strategy.state_dict_for_check(), os.path.join(out_dir, str(i), f"rank{ctx.rank}.pt"))


@pytest.mark.parametrize("world", sorted(GRID))
def test_hippie_one_step_equals_single_process(world, tmp_path):
    specs = [_spec(world, *layout) for layout in GRID[world]]
    spawn(world, run_layouts, specs, str(tmp_path))
    for i, (spec, layout) in enumerate(zip(specs, GRID[world])):
        x, y = _batch(spec)
        merged = merged_rank_states(os.path.join(tmp_path, str(i)), world)
        try:
            assert_matches_reference(merged, reference_step(spec, x, y))
        except AssertionError as e:
            raise AssertionError(f"layout {layout} at world size {world}: {e}") from None
        # replicas of a stage hold identical parameters
        assert all(len(v) == world // spec.strategy.stages for v in merged.values())


def test_a_bf16_pipeline_trains_like_bf16_single_process_training(tmp_path):
    # activations cross the stage boundary in bf16 and the next stage computes from fp32, as one
    # process would: the step matches single-process bf16 (autocast, fp32 master weights) to bf16
    # accuracy, and it is really bf16 (it does not match fp32 training that closely)
    spec = _spec(2, 2, 2, ["train.precision=bf16"])
    spawn(2, run_layouts, [spec], str(tmp_path))
    x, y = _batch(spec)
    merged = merged_rank_states(os.path.join(tmp_path, "0"), 2)
    assert_matches_reference(merged, reference_step(spec, x, y), atol=2e-3, rtol=2e-2)
    fp32 = reference_step(_spec(2, 2, 2, []), x, y)
    with pytest.raises(AssertionError):
        assert_matches_reference(merged, fp32)


class _RecordingComm(Comm):
    """Comm that notes each point-to-point call's peer and tag, in the order they are issued."""

    def __init__(self, ctx):
        super().__init__(ctx)
        self.issued = []

    def isend(self, tensor, dst, tag=0):
        self.issued.append(("send", dst, tag))
        return super().isend(tensor, dst, tag)

    def irecv(self, tensor, src, tag=0):
        self.issued.append(("recv", src, tag))
        return super().irecv(tensor, src, tag)


def _issue_order(ctx, spec, out_dir):
    comm = _RecordingComm(ctx)
    strategy = spec.strategy_cls(spec, build_layers(spec.model, spec.seed), ctx, comm)
    strategy.train_step(*_batch(spec))
    with open(os.path.join(out_dir, f"rank{ctx.rank}.json"), "w") as f:
        json.dump(comm.issued, f)


@pytest.mark.parametrize("world", [2, 4])
def test_each_rank_posts_a_peers_messages_in_the_order_the_peer_sends_them(world, tmp_path):
    # NCCL pairs two ranks' point-to-point messages by order, not tag: under ZB-V, whose lists wait
    # for some messages out of their senders' order, every receive is posted in the sender's order
    spec = _spec(world, 2, 4, ["strategy.schedule=zbv", "strategy.recompute=none"])
    spawn(world, _issue_order, spec, str(tmp_path))
    issued = [json.load(open(tmp_path / f"rank{r}.json")) for r in range(world)]
    pairs = 0
    for src in range(world):
        for dst in range(world):
            sent = [tag for kind, peer, tag in issued[src] if kind == "send" and peer == dst]
            posted = [tag for kind, peer, tag in issued[dst] if kind == "recv" and peer == src]
            assert sent == posted, (src, dst, sent, posted)
            pairs += bool(sent)
    assert pairs == world  # both directions between the two positions, per replica
