"""The README's add-a-strategy example, taken from the README itself, is a working strategy:
one step on two gloo workers equals single-process training."""

import os
import re
import types

import torch

from harness.core.data import load
from harness.core.models import build_layers
from harness.core.comm import Comm
from tests.helpers.cli import ROOT, make_spec
from tests.helpers.distributed import assert_matches_reference, merged_rank_states, reference_step, spawn


def _readme_strategy_source() -> str:
    text = open(os.path.join(ROOT, "README.md")).read()
    section = text[text.index("### Adding a strategy"):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def _example_class(source: str):
    module = types.ModuleType("allreduce_dp")
    exec(compile(source, "README.md", "exec"), module.__dict__)
    return module.AllReduceDPStrategy


def _batch(spec):
    return load(spec.data, spec.seed).train.batch(torch.arange(spec.train.global_batch))


def run_example(ctx, source, spec, out_dir):
    strategy = _example_class(source)(spec, build_layers(spec.model, spec.seed), ctx, Comm(ctx))
    strategy.train_step(*_batch(spec))
    torch.save(strategy.state_dict_for_check(), os.path.join(out_dir, f"rank{ctx.rank}.pt"))


def test_the_readme_strategy_example_trains_like_one_process(tmp_path):
    source = _readme_strategy_source()
    assert _example_class(source).name == "allreduce_dp"
    spec = make_spec("world_size=2", "train.global_batch=13", "train.optimizer=sgd", "train.momentum=0",
                     "train.lr=0.5", "data.train_size=64", "data.test_size=32")
    spawn(2, run_example, source, spec, str(tmp_path))
    assert_matches_reference(merged_rank_states(str(tmp_path), 2), reference_step(spec, *_batch(spec)))
