"""The device timer, FLOP counts and utilisation, precision, and how waits are made per backend."""

import time
from datetime import timedelta

import pytest
import torch
from torch import nn

from harness.config.schema import ModelConfig
from harness.core.comm import Comm, DistContext, Pending
from harness.core.errors import ConfigError
from harness.core.timing import DeviceTimer
from harness.core.training import Autocast, summed_loss, with_precision
from harness.metrics.flops import gpu_peak, layer_flops, measured_matmul_peak, utilisation
from tests.helpers.cli import make_spec

MICRO = ModelConfig(name="vit_micro", embed_dim=64, depth=4, num_heads=4, mlp_ratio=2.0)


def test_the_cpu_timer_reads_the_host_clock():
    timer = DeviceTimer(torch.device("cpu"))
    start = timer.anchor()
    time.sleep(0.05)
    end = timer.mark()
    assert 0.04 < timer.elapsed(start, end) < 0.5
    assert timer.seconds([start, end]) == [start, end]  # already host-clock seconds


def test_a_block_is_counted_as_its_matrix_products():
    flops = layer_flops(MICRO, samples=8, image_size=32)
    assert len(flops) == MICRO.depth + 2
    n, d, h = 65, 64, 128  # tokens (64 patches and the class token), width, MLP width
    block = 2 * n * (3 * d * d + d * d + 2 * d * h) + 2 * 2 * n * n * d  # qkv, proj, MLP; QK^T and AV
    assert flops[1] == (8 * block, 2 * 8 * block)  # backward: input and weight gradients
    assert flops[-1] == (2 * 8 * d * 100, 2 * 2 * 8 * d * 100)  # the classifier
    assert flops[0][1] == flops[0][0]  # the patch embedding needs no gradient of the images


def test_flops_scale_with_the_batch():
    assert [f * 4 for pair in layer_flops(MICRO, 2, 32) for f in pair] == [
        f for pair in layer_flops(MICRO, 8, 32) for f in pair
    ]


def test_recomputation_counts_in_hfu_not_mfu():
    flops = [(10, 20), (100, 200), (5, 10)]
    u = utilisation(flops, {1: 0.5}, step_time_s=2.0, devices=2, peak=100.0)
    assert u["flops_per_step"] == 345 and u["hardware_flops_per_step"] == 345 + 50
    assert u["mfu"] == pytest.approx(345 / 2 / 2 / 100) and u["hfu"] == pytest.approx(395 / 2 / 2 / 100)
    assert u["tflops_per_device"] == pytest.approx(345 / 2 / 2 / 1e12)
    assert utilisation(flops, {}, None, 2, 100.0)["mfu"] is None


@pytest.mark.parametrize(
    "name,precision,peak",
    [
        ("NVIDIA H100 80GB HBM3", "bf16", 989e12),
        ("NVIDIA H100 PCIe", "bf16", 756e12),
        ("NVIDIA H200", "fp32", 67e12),
        ("NVIDIA A100-SXM4-80GB", "bf16", 312e12),
        ("NVIDIA L40S", "bf16", 362e12),
        ("NVIDIA L4", "bf16", 121e12),
        ("Tesla V100-SXM2-32GB", "bf16", None),
        ("Some Future GPU", "bf16", None),
    ],
)
def test_gpu_peaks_come_from_the_datasheet_table_or_not_at_all(name, precision, peak):
    value, source = gpu_peak(name, precision)
    assert value == peak and name in source


def test_the_cpu_peak_is_measured():
    assert measured_matmul_peak(torch.device("cpu"), "fp32", n=128, budget_s=0.05) > 1e8


def test_bf16_layers_keep_fp32_master_weights_and_the_loss_is_fp32():
    layer = nn.Linear(8, 4)
    (wrapped,) = with_precision([layer], "bf16")
    assert isinstance(wrapped, Autocast) and list(wrapped.parameters()) == list(layer.parameters())
    out = wrapped(torch.randn(3, 8))
    assert out.dtype == torch.bfloat16 and layer.weight.dtype == torch.float32
    assert summed_loss(out, torch.tensor([0, 1, 2]), 3).dtype == torch.float32
    assert with_precision([layer], "fp32") == [layer]


def test_a_precision_outside_the_set_is_refused():
    with pytest.raises(ConfigError, match="train.precision=fp16 is not one of fp32, bf16"):
        make_spec("train.precision=fp16")


class _Work:
    """Records how it was waited for (NCCL cannot run here; the routing is what is tested)."""

    def __init__(self):
        self.args = None

    def wait(self, *args):
        self.args = args
        return True


def _ctx(backend: str) -> DistContext:
    return DistContext(0, 2, 0, torch.device("cpu"), backend, timedelta(seconds=7))


def test_nccl_waits_order_streams_and_leave_the_timeout_to_the_process_group():
    assert Comm(_ctx("nccl")).wait_timeout is None
    work = _Work()
    Pending(work, "receive from rank 1", Comm(_ctx("nccl")).wait_timeout).wait()
    assert work.args == ()  # a plain wait(): no host-blocking poll


def test_gloo_waits_carry_the_timeout():
    work = _Work()
    Pending(work, "receive from rank 1", Comm(_ctx("gloo")).wait_timeout).wait()
    assert work.args == (timedelta(seconds=7),)


def test_busy_time_is_the_union_of_work_and_the_rest_is_idle():
    from harness.metrics.meter import busy_blocks

    ms = 1_000_000
    ops = [(0, 4 * ms, "GPU"), (2 * ms, 5 * ms, "GPU"), (7 * ms, 8 * ms, "GPU")]  # overlap counts once
    blocks, idle = busy_blocks(ops, 0, 10 * ms)
    assert idle["compute_s"] == pytest.approx(0.006) and idle["idle_fraction"] == pytest.approx(0.4)
    assert [(k, round(s * 1e3), round(e * 1e3)) for k, s, e in blocks] == [("GPU", 0, 5), ("GPU", 7, 8)]
    assert busy_blocks([], None, None) == ([], None)
