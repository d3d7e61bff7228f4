import pytest
import torch

from harness.config.schema import ModelConfig
from harness.core.models import build_layers, build_timm_vit, count_parameters, num_layers
from tests.helpers.cli import compose_config


def _model_cfg(name: str) -> ModelConfig:
    from omegaconf import OmegaConf

    return OmegaConf.to_object(compose_config([f"model={name}"])).model


@pytest.mark.parametrize("name", ["vit_micro", "vit_tiny"])
def test_layer_list_composes_to_the_timm_model(name):
    cfg = _model_cfg(name)
    layers = build_layers(cfg, seed=3)
    assert len(layers) == num_layers(cfg) == cfg.depth + 2
    torch.manual_seed(3)
    vit = build_timm_vit(cfg).eval()
    x = torch.randn(2, 3, 32, 32)
    out = x
    with torch.no_grad():
        for layer in layers:
            out = layer.eval()(out)
        expected = vit(x)
    assert out.shape == (2, 100)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)


def test_same_seed_same_weights_other_seed_differs():
    cfg = _model_cfg("vit_micro")
    a, b, c = (build_layers(cfg, s) for s in (0, 0, 1))
    pa, pb, pc = ([p for l in ls for p in l.parameters()] for ls in (a, b, c))
    assert all(torch.equal(x, y) for x, y in zip(pa, pb))
    assert not all(torch.equal(x, y) for x, y in zip(pa, pc))


def test_vit_h14_has_about_632m_parameters():
    cfg = _model_cfg("vit_h14")
    with torch.device("meta"):
        layers = build_layers(cfg, 0)
    n = count_parameters(layers)
    assert 625e6 < n < 640e6, n
    assert cfg.img_size == 224 and cfg.patch_size == 14


def test_vit_h14_embedding_resizes_cifar_inputs():
    cfg = _model_cfg("vit_h14")
    with torch.device("meta"):
        emb = build_layers(cfg, 0)[0]
        out = emb(torch.empty(2, 3, 32, 32, device="meta"))
    assert out.shape == (2, 1 + (224 // 14) ** 2, 1280)
