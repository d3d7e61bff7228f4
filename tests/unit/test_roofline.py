"""The roofline compute model: a GPU's datasheet, FLOPs and bytes of every operator (meta device)."""

from types import SimpleNamespace

import pytest
import torch

from harness.core.models import build_layers
from harness.metrics.flops import layer_flops
from harness.planning import roofline
from harness.planning.planner import Network


def _vit(depth=2, dim=192, heads=3):
    return SimpleNamespace(
        name="vit",
        img_size=32,
        patch_size=4,
        embed_dim=dim,
        depth=depth,
        num_heads=heads,
        mlp_ratio=4.0,
        num_classes=100,
        qkv_bias=True,
    )


def _time(device, fn):
    with roofline._Roofline(device) as mode:
        fn()
    return mode


def test_a_large_matrix_product_is_compute_bound_and_a_norm_memory_bound():
    gpu = roofline.gpu("NVIDIA A100-SXM4-80GB", "bf16", 0.5)
    a = torch.empty(8192, 8192, device="meta", dtype=torch.bfloat16)
    mm = _time(gpu, lambda: a @ a)
    assert mm.flops == 2 * 8192**3
    assert mm.seconds == pytest.approx(2 * 8192**3 / (312e12 * 0.5))
    x = torch.empty(64, 1024, 1024, device="meta", dtype=torch.bfloat16)
    norm = _time(gpu, lambda: torch.nn.functional.layer_norm(x, (1024,)))
    assert norm.flops == 0 and norm.seconds == pytest.approx(norm.bytes / (2.039e12 * 0.5))
    assert norm.bytes >= 2 * x.numel() * 2  # read and written at least once
    view = _time(gpu, lambda: x.view(64, -1))  # a view moves nothing
    assert view.seconds == 0


def test_layer_times_follow_the_counted_flops_and_the_split_backward_does_the_same_work():
    gpu = roofline.gpu("H100", "bf16", 1.0)
    layers = roofline.roofline_layers(_vit(), 32, 256, "bf16", gpu)
    forward, backward = layer_flops(_vit(), 256, 32)[1]
    block = layers[1]
    assert block.forward_s * 256 >= forward / 989e12  # at least its FLOPs at peak
    # the input- and weight-gradient parts together cost about the whole backward (the split
    # runs the same arithmetic in two passes)
    assert block.backward_input_s + block.backward_weight_s == pytest.approx(block.backward_s, rel=0.35)
    assert layers[0].backward_input_s == 0  # the model's input needs no gradient
    with torch.device("meta"):
        numel = sum(p.numel() for p in build_layers(_vit(), 0)[1].parameters())
    assert block.param_bytes == 4 * numel  # fp32 master weights, though it computes in bf16


def test_the_profile_states_its_gpu_and_whether_the_fraction_was_measured():
    gpu = roofline.gpu("H200", "bf16", 0.4)
    profile = roofline.roofline_profile(_vit(), 32, 16, "bf16", gpu, Network(1e11, 1e11, 1e-6))
    model = profile.meta["compute_model"]
    assert model["kind"] == "roofline" and model["name"] == "H200" and model["fraction"] == 0.4
    assert model["fraction_source"] == "assumed" and model["bandwidth"] == 4.8e12
    assert profile.optimizer_s_per_byte == pytest.approx(7 / (4.8e12 * 0.4))


def test_a_gpu_without_datasheet_figures_is_refused_naming_the_known_ones():
    with pytest.raises(ValueError, match="no bf16 peak or memory bandwidth for GPU 'TPU v5'.*H100"):
        roofline.gpu("TPU v5", "bf16", 0.5)
    with pytest.raises(ValueError, match="no bf16 peak"):
        roofline.gpu("Tesla V100", "bf16", 0.5)  # V100 has no bf16
