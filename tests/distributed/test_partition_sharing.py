"""One partition per sweep: the first pipeline of a sweep measures the cut, every later run reads it."""

import glob
import json
import os

from harness.core.comm import Comm
from harness.core.models import build_layers
from tests.helpers.cli import make_spec
from tests.helpers.distributed import spawn

COMMON = ["world_size=2", "train.global_batch=16", "train.micro_batches=4", "data.train_size=64", "data.test_size=32"]


def build_and_report(ctx, specs, out_dir):
    for name, spec in specs:
        strategy = spec.strategy_cls(spec, build_layers(spec.model, spec.seed), ctx, Comm(ctx))
        if ctx.rank == 0:
            with open(os.path.join(out_dir, f"{name}.json"), "w") as f:
                json.dump({"boundaries": strategy.partition.boundaries, "source": strategy.partition.source}, f)


def _spec(partitions, *overrides):
    spec = make_spec(*COMMON, *overrides)
    spec.partition_dir = partitions
    return spec


def _report(tmp_path, name):
    return json.load(open(tmp_path / f"{name}.json"))


def test_the_first_pipeline_measures_the_cut_and_every_later_run_of_the_sweep_reads_it(tmp_path):
    partitions = str(tmp_path / "partitions")
    spawn(2, build_and_report, [("hippie", _spec(partitions, "strategy=hippie"))], str(tmp_path))
    first = _report(tmp_path, "hippie")
    (path,) = glob.glob(os.path.join(partitions, "*.json"))
    assert first["source"] == "measured" and json.load(open(path))["boundaries"] == first["boundaries"]
    assert "vit_micro" in os.path.basename(path) and "micro4-stages2" in os.path.basename(path)

    # another cut in the shared file: a later run must take it, not measure its own
    other = [2] if first["boundaries"] != [2] else [4]
    json.dump({"boundaries": other}, open(path, "w"))
    later = [
        ("pipelining", _spec(partitions, "strategy=pipelining")),
        ("deepspeed", _spec(partitions, "strategy=deepspeed")),
        ("given", _spec(partitions, "strategy=hippie", "strategy.boundaries=[1]")),
        ("other_batch", _spec(partitions, "strategy=hippie", "train.micro_batches=2")),
    ]
    spawn(2, build_and_report, later, str(tmp_path))
    spawn(1, build_and_report, [("gpipe", _spec(partitions, "strategy=gpipe", "world_size=2"))], str(tmp_path))
    for name in ("pipelining", "deepspeed", "gpipe"):  # gpipe: one process, the same micro-batch of 4
        assert _report(tmp_path, name) == {"boundaries": other, "source": "shared"}, name
    assert _report(tmp_path, "given") == {"boundaries": [1], "source": "given"}
    assert _report(tmp_path, "other_batch")["source"] == "measured"  # micro-batches of 8: a cut of its own
    assert len(glob.glob(os.path.join(partitions, "*.json"))) == 2
