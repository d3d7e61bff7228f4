"""Each synchronous baseline, after one step, equals single-process training on the same global batch."""

import os

import pytest

from tests.distributed.test_pipeline_equivalence import COMMON, _batch, run_layouts
from tests.helpers.cli import make_spec
from tests.helpers.distributed import assert_matches_reference, merged_rank_states, reference_step, spawn

# equal micro-batches: pipelining and DeepSpeed need global_batch divisible by replicas x micro-batches
EVEN = [o if not o.startswith("train.global_batch") else "train.global_batch=16" for o in COMMON]

MULTI_STAGE = ["interleaved_1f1b", "looped_bfs", "zero_bubble", "zbv", "dualpipev"]
CASES = {
    "pipelining": {
        2: [
            ["strategy.stages=2", "train.micro_batches=4"],
            ["strategy.stages=2", "train.micro_batches=2", "strategy.schedule=gpipe", "strategy.boundaries=[2]"],
            # several stages per rank: each schedule, uneven cuts, recomputation, v=3
            *[["strategy.stages=2", "train.micro_batches=4", f"strategy.schedule={s}"] for s in MULTI_STAGE],
            [
                "strategy.stages=2",
                "train.micro_batches=4",
                "strategy.schedule=zbv",
                "strategy.recompute=auto",
                "strategy.boundaries=[1,2,5]",
            ],
            [
                "strategy.stages=2",
                "train.micro_batches=4",
                "strategy.schedule=interleaved_1f1b",
                "strategy.stages_per_rank=3",
            ],
        ],
        # DDP across two pipelines (the zero-bubble family is refused there: test_config)
        4: [
            ["strategy.stages=2", "train.micro_batches=2"],
            [
                "strategy.stages=2",
                "train.micro_batches=4",
                "strategy.schedule=interleaved_1f1b",
                "strategy.recompute=all",
            ],
            ["strategy.stages=2", "train.micro_batches=4", "strategy.schedule=looped_bfs"],
        ],
    },
    "deepspeed": {
        2: [
            ["strategy.stages=2", "train.micro_batches=4"],
            ["strategy.stages=2", "train.micro_batches=2", "strategy.partition_method=uniform"],
        ],
        4: [["strategy.stages=2", "train.micro_batches=2"]],
    },
}


@pytest.mark.parametrize("strategy,world", [(s, w) for s in CASES for w in CASES[s]])
def test_baseline_one_step_equals_single_process(strategy, world, tmp_path):
    layouts = CASES[strategy][world]
    specs = [make_spec(f"strategy={strategy}", f"world_size={world}", *EVEN, *extra) for extra in layouts]
    spawn(world, run_layouts, specs, str(tmp_path))
    for i, (spec, extra) in enumerate(zip(specs, layouts)):
        merged = merged_rank_states(os.path.join(tmp_path, str(i)), world)
        x, y = _batch(spec)
        try:
            assert_matches_reference(merged, reference_step(spec, x, y))
        except AssertionError as e:
            raise AssertionError(f"{strategy} {extra} at world size {world}: {e}") from None


def test_gpipe_one_process_equals_single_process(tmp_path):
    modes = ["never", "except_last", "always"]
    specs = [
        make_spec("strategy=gpipe", "world_size=2", "train.micro_batches=3", *COMMON, f"strategy.checkpoint={m}")
        for m in modes
    ]
    spawn(1, run_layouts, specs, str(tmp_path))  # torchgpipe: one process drives both partitions
    for i, spec in enumerate(specs):
        x, y = _batch(spec)
        assert_matches_reference(merged_rank_states(os.path.join(tmp_path, str(i)), 1), reference_step(spec, x, y))
