"""Several steps, with optimizer state carried between them, equal single-process training.

One step with plain SGD would not see an optimizer state that a strategy keeps wrongly
(momentum buffers of a replica that missed an all-reduce, AdamW moments of a stage that
stepped twice, a DeepSpeed engine that scales gradients once more per step). Every
synchronous strategy runs three steps over three different global batches, in the harness's
data order, with SGD momentum and with AdamW.
"""

import os

import pytest
import torch

from harness.core.comm import Comm
from harness.core.data import BatchOrder, load
from harness.core.models import build_layers
from tests.helpers.cli import make_spec
from tests.helpers.distributed import assert_matches_reference, merged_rank_states, reference_steps, spawn

STEPS = 3
# AdamW moves an element by lr * m / (sqrt(v) + eps). With torch's eps (1e-8), an element whose
# gradient is of the order of eps moves by a good part of lr in whichever direction the gradient's
# rounding tips it: the summation order differs between a pipeline and one process (and between
# hosts), so the step is noise there, and the weights after it cannot be compared on any host. The
# test's eps (1e-3, above the rounding by five orders) keeps AdamW's whole mechanism (both moments,
# their bias correction, the decoupled decay, one step per batch) and makes the step a smooth
# function of the gradient, so the weights are held to the same tolerance as SGD's: a wrong moment,
# a missed all-reduce or a double step moves elements by a good part of lr (2e-3), 40 times that.
ADAMW = ["train.optimizer=adamw", "train.weight_decay=0.05", "train.lr=0.002", "train.adam_eps=1e-3"]
DATA = ["data.train_size=64", "data.test_size=32", "train.lr=0.05"]
OPTIMIZERS = {"sgd_momentum": ["train.optimizer=sgd", "train.momentum=0.9"], "adamw": ADAMW}
# (world size, launched processes) -> strategies' overrides; uneven shares where the strategy allows
GROUPS = {
    "w2": (
        2,
        2,
        {
            "dp": ["strategy=dp", "train.global_batch=13"],
            "hippie": ["strategy=hippie", "train.global_batch=13", "train.micro_batches=3", "strategy.recompute=auto"],
            "pipelining": ["strategy=pipelining", "train.global_batch=16", "train.micro_batches=2"],
            # our split backward: W passes deferred into 1F1B's bubble
            "hippie_zb_h1": [
                "strategy=hippie",
                "strategy.schedule=zb_h1",
                "train.global_batch=13",
                "train.micro_batches=4",
                "strategy.recompute=auto",
            ],
        },
    ),
    # our runtime with two stages per rank, loop and V placement
    "hippie_multi": (
        2,
        2,
        {
            s: [
                "strategy=hippie",
                f"strategy.schedule={s}",
                "train.global_batch=13",
                "train.micro_batches=4",
                "strategy.recompute=auto",
            ]
            for s in ("interleaved_1f1b", "zero_bubble", "zbv", "dualpipev")
        },
    ),
    "deepspeed": (2, 2, {"deepspeed": ["strategy=deepspeed", "train.global_batch=16", "train.micro_batches=2"]}),
    # torch pipelining's multi-stage schedules: two stages per rank, loop and V placement
    "pipelining_multi": (
        2,
        2,
        {
            s: ["strategy=pipelining", f"strategy.schedule={s}", "train.global_batch=16", "train.micro_batches=4"]
            for s in ("interleaved_1f1b", "looped_bfs", "zero_bubble", "zbv", "dualpipev")
        },
    ),
    "w4": (
        4,
        4,
        {
            "hippie_2x2": [
                "strategy=hippie",
                "strategy.stages=2",
                "train.global_batch=13",
                "train.micro_batches=2",
                "strategy.bucket_mb=0.01",
            ],
            "hippie_2x2_zb_h1": [
                "strategy=hippie",
                "strategy.stages=2",
                "strategy.schedule=zb_h1",
                "train.global_batch=13",
                "train.micro_batches=3",
                "strategy.bucket_mb=0.01",
            ],
            "hippie_2x2_zbv": [
                "strategy=hippie",
                "strategy.stages=2",
                "strategy.schedule=zbv",
                "train.global_batch=13",
                "train.micro_batches=4",
                "strategy.bucket_mb=0.01",
            ],
        },
    ),
    "gpipe": (2, 1, {"gpipe": ["strategy=gpipe", "train.global_batch=13", "train.micro_batches=3"]}),
}
# the recipe ViTs are trained with on CIFAR: Nesterov momentum, a warm-up then a cosine learning rate,
# label smoothing, and the whole model's gradient clipped (small enough to bite at every step)
RECIPE = [
    "train.optimizer=sgd",
    "train.momentum=0.9",
    "train.nesterov=true",
    "train.lr_schedule=cosine",
    "train.lr_warmup_steps=1",
    "train.steps=4",
    "train.warmup_steps=0",
    "train.label_smoothing=0.1",
    "train.grad_clip_norm=0.05",
]
RECIPE_GROUPS = {
    "w2": (
        2,
        2,
        {
            "dp": ["strategy=dp", "train.global_batch=13"],
            "hippie": ["strategy=hippie", "train.global_batch=13", "train.micro_batches=3"],
            "hippie_zb_h1": [
                "strategy=hippie",
                "strategy.schedule=zb_h1",
                "train.global_batch=13",
                "train.micro_batches=3",
            ],
            "pipelining_zbv": [
                "strategy=pipelining",
                "strategy.schedule=zbv",
                "train.global_batch=16",
                "train.micro_batches=4",
            ],
            "hippie_zbv": [
                "strategy=hippie",
                "strategy.schedule=zbv",
                "train.global_batch=13",
                "train.micro_batches=4",
            ],
        },
    ),
    "w4": (
        4,
        4,
        {
            "hippie_2x2": ["strategy=hippie", "strategy.stages=2", "train.global_batch=13", "train.micro_batches=2"],
            "pipelining_2x2": [
                "strategy=pipelining",
                "strategy.stages=2",
                "train.global_batch=16",
                "train.micro_batches=2",
            ],
            "hippie_2x2_interleaved": [
                "strategy=hippie",
                "strategy.stages=2",
                "strategy.schedule=interleaved_1f1b",
                "train.global_batch=13",
                "train.micro_batches=4",
            ],
        },
    ),
    "deepspeed": (2, 2, {"deepspeed": ["strategy=deepspeed", "train.global_batch=16", "train.micro_batches=2"]}),
    "gpipe": (2, 1, {"gpipe": ["strategy=gpipe", "train.global_batch=13", "train.micro_batches=3"]}),
}


def _batches(spec):
    data = load(spec.data, spec.seed)
    order = BatchOrder(len(data.train), spec.train.global_batch, spec.seed)
    return [data.train.batch(order.indices(step)) for step in range(STEPS)]


def train_and_save(ctx, specs, out_dir):
    for name, spec in specs.items():
        strategy = spec.strategy_cls(spec, build_layers(spec.model, spec.seed), ctx, Comm(ctx))
        for x, y in _batches(spec):
            strategy.train_step(x, y)
        os.makedirs(os.path.join(out_dir, name), exist_ok=True)
        torch.save(strategy.state_dict_for_check(), os.path.join(out_dir, name, f"rank{ctx.rank}.pt"))


@pytest.mark.parametrize("group", sorted(GROUPS))
def test_several_steps_with_momentum_and_adamw_equal_single_process(group, tmp_path):
    world, processes, strategies = GROUPS[group]
    specs = {
        f"{name}-{opt}": make_spec(f"world_size={world}", *DATA, *overrides, *OPTIMIZERS[opt])
        for name, overrides in strategies.items()
        for opt in OPTIMIZERS
    }
    spawn(processes, train_and_save, specs, str(tmp_path))
    failures = []
    for name, spec in specs.items():
        merged = merged_rank_states(os.path.join(tmp_path, name), processes)
        reference = reference_steps(spec, _batches(spec))
        try:
            assert_matches_reference(merged, reference, atol=5e-5, rtol=5e-4)
        except AssertionError as e:
            failures.append(f"{name}: {str(e)[:300]}")
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("group", sorted(RECIPE_GROUPS))
def test_several_steps_of_a_training_recipe_equal_single_process(group, tmp_path):
    """Schedules, Nesterov, label smoothing and clipping are the same for every synchronous strategy:
    clipping by the whole model's norm (an all-reduce over the stages, each stage's replicas counted
    once; DeepSpeed's own clipping) is where a wrong layout would show."""
    world, processes, strategies = RECIPE_GROUPS[group]
    specs = {
        name: make_spec(f"world_size={world}", *DATA, *overrides, *RECIPE) for name, overrides in strategies.items()
    }
    spawn(processes, train_and_save, specs, str(tmp_path))
    failures = []
    for name, spec in specs.items():
        merged = merged_rank_states(os.path.join(tmp_path, name), processes)
        try:
            assert_matches_reference(merged, reference_steps(spec, _batches(spec)), atol=5e-5, rtol=5e-4)
        except AssertionError as e:
            failures.append(f"{name}: {str(e)[:300]}")
    assert not failures, "\n".join(failures)
