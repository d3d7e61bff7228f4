"""A split backward on recomputed layers recomputes them once per micro-batch, as a whole backward
does. Through torch's checkpoint each autograd call of the weight-gradient part would run a
checkpointed layer's forward again (a ViT block once in I and six times in W, torchtitan issue
773); our executor runs the stage's forward once more at I and splits that graph's backward
(its results equal single-process training: tests/distributed/test_pipeline_equivalence.py)."""

import collections
import json
import os

import torch

from harness.core.comm import Comm
from harness.core.data import load
from harness.core.models import build_layers
from tests.helpers.cli import make_spec
from tests.helpers.distributed import spawn

MICRO = 3


def _count_forwards(ctx, specs, out_dir):
    counts = {}
    for name, spec in specs.items():
        strategy = spec.strategy_cls(spec, build_layers(spec.model, spec.seed), ctx, Comm(ctx))
        modules = [st.module for st in strategy.executor.stages]  # several in V placement
        calls = collections.Counter()
        for j, module in enumerate(modules):
            for i, layer in enumerate(module.layers):
                layer.register_forward_pre_hook(lambda *_, key=(j, i): calls.update([key]))
        x, y = load(spec.data, spec.seed).train.batch(torch.arange(spec.train.global_batch))
        strategy.train_step(x, y)
        keys = [(j, i) for j, module in enumerate(modules) for i in range(len(module.layers))]
        counts[name] = {
            "calls": [calls[key] for key in keys],
            "recomputed": [n for n, (j, i) in enumerate(keys) if i in modules[j].recompute],
        }
    with open(os.path.join(out_dir, f"rank{ctx.rank}.json"), "w") as f:
        json.dump(counts, f)


def test_a_split_backward_recomputes_each_checkpointed_layer_once_per_micro_batch(tmp_path):
    common = [
        "strategy=hippie",
        "world_size=2",
        f"train.micro_batches={MICRO}",
        "train.global_batch=12",
        "strategy.recompute=all",
        "data.train_size=64",
        "data.test_size=32",
    ]
    specs = {s: make_spec(*common, f"strategy.schedule={s}") for s in ("1f1b", "zb_h1", "zbv", "zero_bubble")}
    spawn(2, _count_forwards, specs, str(tmp_path))
    for rank in range(2):
        counts = json.load(open(os.path.join(tmp_path, f"rank{rank}.json")))
        for schedule, c in counts.items():
            assert c["recomputed"], (rank, schedule)  # the case is one with recomputation
            # a forward and one recomputation per micro-batch, on every layer that is recomputed;
            # no layer runs more (at I the stage runs forward once more, whole)
            assert all(c["calls"][i] == 2 * MICRO for i in c["recomputed"]), (rank, schedule, c)
            assert max(c["calls"]) == 2 * MICRO, (rank, schedule, c)
