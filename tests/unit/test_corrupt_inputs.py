"""Inputs that cannot be used are named in one line before any worker starts: a checkpoint that
cannot be read, or that another model, layout or strategy wrote; a profile or a partition file
that cannot be read; data whose labels fall outside the model's classes."""

import json
import os

import pytest
import torch

from harness.core.checkpoints import check_checkpoint
from harness.core.data import check_available, load, write_cifar100
from harness.core.errors import ConfigError
from harness.core.models import build_layers, parameter_shapes
from harness.planning.forecast import read_profile
from tests.helpers.cli import compose_config, make_spec


def _checkpoint(folder, model, strategy="dp", ranks=2, **extra):
    """What the worker writes: every rank's parameters (here the whole model's, as DP holds it)."""
    step = folder / "checkpoints" / "step3"
    step.mkdir(parents=True)
    params = {
        f"{i}.{n}": p.detach().clone()
        for i, layer in enumerate(build_layers(model, 0))
        for n, p in layer.named_parameters()
    }
    for rank in range(ranks):
        torch.save(
            {"params": params, "optimizer": {}, "step": 3, "strategy": strategy, "world_size": ranks, **extra},
            step / f"rank{rank}.pt",
        )
    (folder / "checkpoints" / "latest").write_text("step3\n")
    return step


def test_a_checkpoint_of_this_model_and_strategy_passes(tmp_path):
    model = make_spec("world_size=2").model
    step = _checkpoint(tmp_path, model)
    assert check_checkpoint(str(tmp_path), 2, "dp", parameter_shapes(model)) == str(step)


@pytest.mark.parametrize(
    "damage,message",
    [
        ("truncate", "cannot be read"),
        ("zero", "cannot be read"),
        ("missing", "is missing (this run has 2 rank(s))"),
        ("strategy", "was written by strategy=hippie, not dp: resume with strategy=hippie"),
        ("shapes", "holds 0.cls_token of shape"),
    ],
)
def test_an_unusable_checkpoint_is_refused_in_one_line_naming_the_file(tmp_path, damage, message):
    spec_model = make_spec("world_size=2").model
    if damage == "shapes":  # another model's checkpoint: a wider one
        step = _checkpoint(tmp_path, make_spec("world_size=2", "model.embed_dim=96", "model.num_heads=3").model)
    else:
        step = _checkpoint(tmp_path, spec_model, strategy="hippie" if damage == "strategy" else "dp")
    rank1 = step / "rank1.pt"
    if damage == "truncate":
        rank1.write_bytes(rank1.read_bytes()[:2000])
    elif damage == "zero":
        rank1.write_bytes(b"\0" * rank1.stat().st_size)
    elif damage == "missing":
        rank1.unlink()
    with pytest.raises(ConfigError) as e:
        check_checkpoint(str(tmp_path), 2, "dp", parameter_shapes(spec_model))
    text = str(e.value)
    assert message in text and "\n" not in text
    assert "rank1.pt" in text or "rank0.pt" in text
    assert damage in ("strategy",) or "resume from an earlier checkpoint" in text


def test_the_run_spec_refuses_a_corrupt_checkpoint_before_launch(tmp_path):
    step = _checkpoint(tmp_path, make_spec("world_size=2").model)
    (step / "rank0.pt").write_bytes(b"PK\x03\x04 not really")
    with pytest.raises(ConfigError, match="rank0.pt cannot be read"):
        make_spec("world_size=2", f"train.resume={tmp_path}")


def test_labels_outside_the_models_classes_are_refused_naming_the_file_and_label(tmp_path):
    images = torch.zeros(8, 3, 32, 32, dtype=torch.uint8).numpy()
    write_cifar100(
        str(tmp_path), {"train": (images, [0, 1, 2, 150, 3, 4, 5, 6]), "test": (images, list(range(8)))}, ["a"]
    )
    cfg = compose_config(["data=cifar100", f"data.root={tmp_path}", "data.verify_md5=false"]).data
    train = os.path.join(str(tmp_path), "cifar-100-python", "train")
    with pytest.raises(ConfigError, match=f"{train} holds label 150 .*model has 100 classes"):
        check_available(cfg, 100)
    with pytest.raises(ConfigError, match="holds label 150"):
        load(cfg, 0, 100)  # and when a worker loads it
    check_available(cfg, 151)  # a model with the classes takes it
    assert len(load(cfg, 0, 151).train) == 8


def test_synthetic_data_with_more_classes_than_the_model_is_refused():
    with pytest.raises(ConfigError, match="data.num_classes=120 has labels the model's 100 classes do not"):
        make_spec("data.num_classes=120")


def test_a_profile_or_a_partition_file_that_cannot_be_read_is_named(tmp_path):
    bad = tmp_path / "profile.json"
    bad.write_text('{"version": 1, "layers": [')
    with pytest.raises(ConfigError, match=f"the profile {bad} cannot be read"):
        read_profile(str(bad))
    from harness.strategies.layout import _shared_or_measured

    spec = make_spec("strategy=hippie", "world_size=2")
    spec.partition_dir = str(tmp_path / "partitions")
    first = _shared_or_measured(spec, build_layers(spec.model, 0), torch.device("cpu"), [1, 1])
    assert first.source == "measured"
    (path,) = [os.path.join(spec.partition_dir, f) for f in os.listdir(spec.partition_dir)]
    assert json.load(open(path))["boundaries"] == first.boundaries
    open(path, "w").write("{")
    with pytest.raises(ConfigError, match="partition file .* cannot be read .*delete it"):
        _shared_or_measured(spec, build_layers(spec.model, 0), torch.device("cpu"), [1, 1])
