"""AshPipe's runtime against a plain sequential model of its own semantics."""

import json
import os

import pytest
import torch

from harness.core.comm import Comm
from harness.core.data import BatchOrder, load
from harness.core.models import build_layers
from harness.core.training import make_optimizer, summed_loss
from harness.strategies.ashpipe.reference import ashpipe_reference, reference_switch
from tests.helpers.cli import make_spec
from tests.helpers.distributed import assert_matches_reference, merged_rank_states, spawn

STEPS = 5
COMMON = [
    "strategy=ashpipe",
    "train.global_batch=12",
    "train.micro_batches=1",
    "train.optimizer=sgd",
    "train.lr=0.2",
    "train.momentum=0.9",
    "data.train_size=96",
    "data.test_size=32",
    f"train.steps={STEPS}",
]

# a training recipe: warm-up and cosine schedule, Nesterov, label smoothing, clipping that bites
RECIPE = [
    "train.nesterov=true",
    "train.lr_schedule=cosine",
    "train.lr_warmup_steps=2",
    "train.label_smoothing=0.1",
    "train.grad_clip_norm=0.05",
]
ADAMW = ["train.optimizer=adamw", "train.lr=0.01", "train.weight_decay=0.05", "model.qkv_bias=false"]
PREDICT = ["strategy.weight_prediction=true"]
LR_CORRECTION = ["strategy.lr_correction=true", "strategy.lr_correction_steps=3"]
# world size -> (replicas, boundaries, extra overrides)
GRID = {
    2: [
        ([2], None, []),
        ([1, 1], [3], []),
        ([1, 1], [2], ["strategy.switch_step=2"]),
        ([1, 1], [3], ["strategy.switch_step=4", "train.momentum=0.5"]),
        ([1, 1], [3], ["strategy.switch_step=3", *RECIPE]),
        ([1, 1], [3], ["strategy.switch_fraction=0.4"]),
        ([1, 1], [3], ["strategy.switch_plateau=0.1", "strategy.switch_window=1"]),
        ([1, 1], [3], PREDICT),
        ([1, 1], [2], [*PREDICT, *ADAMW]),
        ([1, 1], [3], [*PREDICT, *ADAMW, "strategy.switch_step=2", "train.lr_schedule=cosine"]),
    ],
    3: [
        ([2, 1], [3], []),
        ([1, 2], [2], []),
        ([1, 1, 1], [2, 4], ["strategy.recompute=all"]),
        ([2, 1], [3], ["strategy.switch_step=3"]),
        ([1, 2], [2], RECIPE),
        ([1, 1, 1], [2, 4], LR_CORRECTION),
        ([1, 1, 1], [2, 4], [*LR_CORRECTION, *PREDICT, "strategy.switch_step=1"]),
        ([2, 1], [3], [*PREDICT, *ADAMW, *LR_CORRECTION[:1]]),
    ],
    4: [([2, 1, 1], [2, 4], [])],
    # uneven shares on both sides and partial many-to-many overlaps: a global batch of 13 splits
    # 7/6 over stage 0's replicas and 5/4/4 over stage 1's, so every stage-0 replica sends to
    # two of stage 1's, and stage 1's all-reduce sums unequal shares
    5: [([2, 3], [3], ["train.global_batch=13"])],
}


def _batches(spec):
    data = load(spec.data, spec.seed)
    order = BatchOrder(len(data.train), spec.train.global_batch, spec.seed)
    return [data.train.batch(order.indices(i)) for i in range(STEPS)]


def _spec(world, replicas, boundaries, extra):
    b = [f"strategy.boundaries=[{','.join(map(str, boundaries))}]"] if boundaries else []
    return make_spec(*COMMON, f"world_size={world}", f"strategy.replicas=[{','.join(map(str, replicas))}]", *b, *extra)


def train_and_save(ctx, specs, out_dir):
    for i, spec in enumerate(specs):
        strategy = spec.strategy_cls(spec, build_layers(spec.model, spec.seed), ctx, Comm(ctx))
        in_flight = []  # after each pipelined call: sends started, and those not yet waited for
        for x, y in _batches(spec):
            strategy.train_step(x, y)
            if getattr(strategy, "executor", None) is not None:
                in_flight.append(list(strategy.executor.send_counts()))
        strategy.finish_training()
        os.makedirs(os.path.join(out_dir, str(i)), exist_ok=True)
        torch.save(strategy.state_dict_for_check(), os.path.join(out_dir, str(i), f"rank{ctx.rank}.pt"))
        with open(os.path.join(out_dir, str(i), f"switch{ctx.rank}.json"), "w") as f:
            json.dump([strategy.switch_at, strategy.switch_reason], f)
        with open(os.path.join(out_dir, str(i), f"sends{ctx.rank}.json"), "w") as f:
            json.dump(in_flight, f)


@pytest.mark.parametrize("world", sorted(GRID))
def test_ashpipe_matches_its_sequential_model(world, tmp_path):
    specs = [_spec(world, *case) for case in GRID[world]]
    spawn(world, train_and_save, specs, str(tmp_path))
    failures = []
    for i, (spec, (replicas, boundaries, extra)) in enumerate(zip(specs, GRID[world])):
        merged = merged_rank_states(os.path.join(tmp_path, str(i)), world)
        switched = [json.load(open(os.path.join(tmp_path, str(i), f"switch{r}.json"))) for r in range(world)]
        st = spec.strategy
        if st.switch_plateau is not None:  # the reference decides by itself, from its own losses
            switch = reference_switch(spec, _batches(spec), st.switch_window, st.switch_plateau)
            assert switch is not None and 0 < switch < STEPS, switch  # the case must switch mid-run
        else:
            switch = {None: st.switch_step or 0, 0.4: 2}[st.switch_fraction]
        if switch:
            assert all(at == switch and reason for at, reason in switched), (extra, switch, switched)
        # gloo completes a send only once it is waited for: after each call a rank holds at most the
        # sends of its last two calls (before, every send of the run, each with its tensor)
        for r in range(world):
            counts = json.load(open(os.path.join(tmp_path, str(i), f"sends{r}.json")))  # (started, held)
            assert all(held <= started - counts[k - 2][0] for k, (started, held) in enumerate(counts) if k >= 2), (
                replicas,
                extra,
                r,
                counts,
            )
        reference = ashpipe_reference(spec, _batches(spec), boundaries or [], switch_at=switch)
        try:
            assert_matches_reference(merged, reference, atol=5e-5, rtol=5e-4)
        except AssertionError as e:
            failures.append(f"replicas {replicas} boundaries {boundaries} {extra}: {str(e)[:300]}")
    assert not failures, "\n".join(failures)


def test_one_stage_ashpipe_is_exactly_data_parallel(tmp_path):
    spec = _spec(2, [2], None, [])
    spawn(2, train_and_save, [spec], str(tmp_path))
    # synchronous DP for the same steps, as one process
    batches = _batches(spec)
    layers = build_layers(spec.model, spec.seed)
    model = torch.nn.Sequential(*layers)
    opt = make_optimizer(model.parameters(), spec.train)
    for xb, yb in batches:
        summed_loss(model(xb), yb, xb.shape[0]).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    reference = {f"{i}.{n}": p.detach() for i, l in enumerate(layers) for n, p in l.named_parameters()}
    assert_matches_reference(merged_rank_states(os.path.join(tmp_path, "0"), 2), reference)


def test_the_async_reference_is_not_synchronous_training():
    """The comparison above would be vacuous if staleness changed nothing."""
    spec = _spec(2, [1, 1], [3], [])
    batches = _batches(spec)
    asynchronous = ashpipe_reference(spec, batches, [3])
    synchronous = ashpipe_reference(spec, batches, [])  # one stage: no staleness
    assert any(not torch.allclose(asynchronous[k], synchronous[k], atol=1e-4) for k in asynchronous)


@pytest.mark.parametrize("mitigation", [PREDICT, [*PREDICT, *ADAMW], LR_CORRECTION])
def test_each_mitigation_changes_the_reference(mitigation):
    """The mitigations' comparisons above would be vacuous if the reference ignored them (a
    three-stage pipeline: its first stage is two updates stale, so PipeMare's correction bites)."""
    extra = mitigation[len(PREDICT) :] if mitigation[0] == PREDICT[0] else []
    plain, mitigated = _spec(3, [1, 1, 1], [2, 4], extra), _spec(3, [1, 1, 1], [2, 4], mitigation)
    a, b = (ashpipe_reference(spec, _batches(spec), [2, 4]) for spec in (plain, mitigated))
    assert any(not torch.allclose(a[k], b[k], atol=1e-4) for k in a)
