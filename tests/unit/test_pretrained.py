"""``model.pretrained``: a run starts from weights in timm's format or from a checkpoint of this
harness (fine-tuning), and weights it cannot use are refused in one line before any worker."""

import dataclasses

import pytest
import torch

from harness.core.errors import ConfigError
from harness.core.models import build_layers, build_timm_vit, parameter_shapes, pretrained_weights
from tests.helpers.cli import make_spec
from tests.unit.test_corrupt_inputs import _checkpoint
from tests.unit.test_models import _model_cfg


def _timm_file(path, cfg, seed=123, **changes):
    """A state dict of timm's own VisionTransformer, as ``torch.save(model.state_dict())`` writes it."""
    torch.manual_seed(seed)
    vit = build_timm_vit(dataclasses.replace(cfg, **changes))
    torch.save(vit.state_dict(), path)
    return vit


def _cut_short(path, cfg):
    _timm_file(path, cfg)
    path.write_bytes(path.read_bytes()[:5000])


def _forward(layers, x):
    with torch.no_grad():
        for layer in layers:
            x = layer.eval()(x)
    return x


def test_weights_in_timms_format_give_timms_model_exactly(tmp_path):
    cfg = _model_cfg("vit_micro")
    vit = _timm_file(tmp_path / "vit.pt", cfg).eval()
    layers = build_layers(dataclasses.replace(cfg, pretrained=str(tmp_path / "vit.pt")), seed=0)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        expected = vit(x)
    torch.testing.assert_close(_forward(layers, x), expected, rtol=0, atol=0)
    # and not the seed's own weights
    assert not torch.equal(_forward(build_layers(cfg, seed=0), x), expected)


def test_a_checkpoint_of_this_harness_gives_its_weights(tmp_path):
    cfg = _model_cfg("vit_micro")
    _checkpoint(tmp_path, cfg, ranks=2)  # the seed-0 weights, in every rank's file as DP writes them
    saved = {f"{i}.{n}": p for i, layer in enumerate(build_layers(cfg, 0)) for n, p in layer.named_parameters()}
    layers = build_layers(dataclasses.replace(cfg, pretrained=str(tmp_path)), seed=7)
    loaded = {f"{i}.{n}": p for i, layer in enumerate(layers) for n, p in layer.named_parameters()}
    assert loaded.keys() == saved.keys() and all(torch.equal(loaded[k], saved[k]) for k in saved)


def test_a_classifier_for_other_classes_keeps_the_models_own(tmp_path):
    cfg = _model_cfg("vit_micro")
    _timm_file(tmp_path / "vit10.pt", cfg, num_classes=10)
    weights = pretrained_weights(dataclasses.replace(cfg, pretrained=str(tmp_path / "vit10.pt")))
    head = len(build_layers(cfg, 0)) - 1
    assert set(parameter_shapes(cfg)) - set(weights) == {f"{head}.head.weight", f"{head}.head.bias"}


@pytest.mark.parametrize(
    "make,message",
    [
        (lambda p, cfg: None, "does not exist"),
        (lambda p, cfg: p.write_bytes(b"not a torch file"), "cannot be read: not a whole file"),
        (lambda p, cfg: _cut_short(p, cfg), "cannot be read: not a whole file"),
        (lambda p, cfg: _timm_file(p, cfg, depth=cfg.depth - 1), "has no such weight for blocks."),
        (lambda p, cfg: _timm_file(p, cfg, embed_dim=32), "has shape (1, 1, 32) for cls_token"),
        (lambda p, cfg: torch.save({"model": 1}, p), "holds model"),
    ],
)
def test_weights_it_cannot_use_are_refused_in_one_line_naming_the_file(tmp_path, make, message):
    cfg = _model_cfg("vit_micro")
    path = tmp_path / "weights.pt"
    make(path, cfg)
    with pytest.raises(ConfigError) as e:
        pretrained_weights(dataclasses.replace(cfg, pretrained=str(path)))
    assert message in str(e.value) and "\n" not in str(e.value) and str(path) in str(e.value)


def test_the_run_spec_refuses_unusable_weights_before_launch(tmp_path):
    _timm_file(tmp_path / "small.pt", _model_cfg("vit_micro"), embed_dim=32)
    with pytest.raises(ConfigError, match="model.pretrained=.*small.pt has shape"):
        make_spec("world_size=2", f"model.pretrained={tmp_path / 'small.pt'}")
