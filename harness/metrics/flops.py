"""Training FLOPs of a model, counted once, and the peak they are judged against (MFU, HFU).

FLOPs are counted by ``torch.utils.flop_counter`` on the meta device (no memory,
no compute): per layer, the forward and the backward at the run's global batch
(the first layer's input needs no gradient). Like every MFU figure in the
literature, only matrix products, convolutions and attention count; norms,
activations and element-wise work are free.

- Model FLOPs per step: forward + backward of every layer, once.
- Hardware FLOPs per step: that plus the forwards run again by recomputation
  (activation checkpointing), as each strategy reports what it recomputes.
- MFU and HFU: those FLOPs per second per device, over the device's dense peak
  for the run's precision. GPUs: a table of vendors' datasheet figures (no
  sparsity; fp32 means plain fp32, not TF32), matched on the device's name; a
  GPU not in the table gets no MFU rather than a guess. CPUs: the peak is
  measured, the fastest of the dense matrix-product kernels a model's layers
  call (``torch.mm`` and ``torch.nn.functional.linear``, which take different
  kernels on CPUs: in bf16 without native support the linear one is about 3x
  faster; timing one kernel gave an MFU above 1) in the run's precision with
  the worker's threads, at the start of the run.
"""

from __future__ import annotations

import re
import time

import torch
from torch.utils.flop_counter import FlopCounterMode

from harness.core.models import build_layers

# (pattern on torch.cuda.get_device_name, {precision: dense FLOP/s}), first match wins
GPU_PEAKS: list[tuple[str, dict[str, float]]] = [
    (r"\bH200\b", {"bf16": 989e12, "fp32": 67e12}),
    (r"\bGH200\b", {"bf16": 989e12, "fp32": 67e12}),
    (r"\bH100\b.*\bPCIe\b", {"bf16": 756e12, "fp32": 51e12}),
    (r"\bH100\b.*\bNVL\b", {"bf16": 835e12, "fp32": 60e12}),
    (r"\bH100\b", {"bf16": 989e12, "fp32": 67e12}),  # SXM
    (r"\bA100\b", {"bf16": 312e12, "fp32": 19.5e12}),
    (r"\bL40S\b", {"bf16": 362e12, "fp32": 91.6e12}),
    (r"\bL40\b", {"bf16": 181e12, "fp32": 90.5e12}),
    (r"\bL4\b", {"bf16": 121e12, "fp32": 30.3e12}),
    (r"\bA10G?\b", {"bf16": 125e12, "fp32": 31.2e12}),
    (r"\bV100\b", {"fp32": 15.7e12}),
    (r"\bRTX 4090\b", {"bf16": 165e12, "fp32": 82.6e12}),
]


def layer_flops(model_cfg, samples: int, image_size: int) -> list[tuple[int, int]]:
    """(forward, backward) FLOPs of each layer of ``model_cfg`` at ``samples`` samples."""
    with torch.device("meta"):
        layers = build_layers(model_cfg, seed=0)
    x = torch.empty(samples, 3, image_size, image_size, device="meta")
    counted: dict[tuple, tuple[int, int]] = {}  # identical blocks are counted once
    flops = []
    for i, layer in enumerate(layers):
        key = (type(layer).__name__, tuple(tuple(p.shape) for p in layer.parameters()), tuple(x.shape))
        inp = x.detach().requires_grad_(i > 0)
        if key not in counted:
            with FlopCounterMode(display=False) as forward:
                y = layer(inp)
            with FlopCounterMode(display=False) as backward:
                y.backward(torch.ones_like(y))
            counted[key] = (forward.get_total_flops(), backward.get_total_flops())
        else:
            with torch.no_grad():
                y = layer(inp)
        flops.append(counted[key])
        x = y.detach()
    return flops


def device_peak(device: torch.device, precision: str, threads: int) -> tuple[float | None, str]:
    """Dense peak FLOP/s of one device in ``precision``, and where the figure comes from."""
    if device.type == "cuda":
        return gpu_peak(torch.cuda.get_device_name(device), precision)
    rate = measured_matmul_peak(device, precision)
    return rate, f"CPU: measured {precision} matmul, {threads} thread(s)"


def gpu_peak(name: str, precision: str) -> tuple[float | None, str]:
    """The datasheet peak of the GPU ``name`` (as torch.cuda.get_device_name says it)."""
    for pattern, peaks in GPU_PEAKS:
        if re.search(pattern, name):
            if precision in peaks:
                return peaks[precision], f"{name}: datasheet dense {precision}"
            return None, f"{name}: no {precision} peak in harness.metrics.flops.GPU_PEAKS (no MFU)"
    return None, f"{name}: not in harness.metrics.flops.GPU_PEAKS (no MFU)"


def measured_matmul_peak(device: torch.device, precision: str, n: int = 512, budget_s: float = 0.3) -> float:
    """The best rate of an n x n x n matrix product in ``precision`` on ``device``, over the
    product kernels layers call (``mm``, ``linear``), each timed within ``budget_s``."""
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    best = float("inf")
    for product in (torch.mm, torch.nn.functional.linear):
        product(a, b)  # warm up
        started = time.perf_counter()
        while time.perf_counter() - started < budget_s:
            t0 = time.perf_counter()
            product(a, b)
            best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best


def utilisation(
    flops: list[tuple[int, int]],
    recomputed: dict[int, float],
    step_time_s: float | None,
    devices: int,
    peak: float | None,
) -> dict:
    """The record's FLOP figures: ``recomputed`` maps a layer to the share of the batch whose
    forward runs again (summed over ranks)."""
    model = sum(f + b for f, b in flops)
    hardware = model + sum(flops[i][0] * share for i, share in recomputed.items())
    per_device = model / step_time_s / devices if step_time_s else None
    return {
        "flops_per_step": model,
        "hardware_flops_per_step": hardware,
        "tflops_per_device": per_device / 1e12 if per_device else None,
        "mfu": per_device / peak if per_device and peak else None,
        "hfu": hardware / step_time_s / devices / peak if step_time_s and peak else None,
    }
