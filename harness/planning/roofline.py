"""A GPU compute model from FLOPs and bytes moved: a profile without a measurement on the GPU.

Each layer runs once on the meta device (no memory, no arithmetic) under a dispatch mode
that sees every ATen operator it calls, in the forward, in the whole backward and in the
backward's input- and weight-gradient parts as torch pipelining's zero-bubble schedules
run them (its own ``stage_backward_input`` and ``stage_backward_weight``). Each operator
costs its roofline time on a named GPU:

    time = max(FLOPs / (peak FLOP/s x fraction), bytes / (memory bandwidth x fraction), floor)

FLOPs by ``torch.utils.flop_counter``'s formulas (matrix products, convolutions,
attention; element-wise work counts as memory traffic only), bytes as what the operator
reads and writes (its tensor inputs and outputs; views move nothing), eagerly, without
fusion; ``floor`` is a kernel's shortest run. Peaks are the datasheet's dense figures in
the run's precision (:data:`harness.metrics.flops.GPU_PEAKS`), bandwidths the HBM
datasheet figures below. ``fraction`` is how much of both a real run achieves: taken from
a measured profile of that GPU where one exists (:func:`measured_fraction`), otherwise an
assumption the prediction's record states. The optimizer's update moves the parameters,
gradients and two moments (AdamW) through memory once.

The result is a :class:`harness.planning.planner.Profile` like a measured one (sizes from
the same pass), so the simulator and the planner use it unchanged. In bf16 the layers run in
bf16 throughout (autocast's casts of fp32 weights are not counted; norms it keeps in fp32 are
counted in bf16); parameters and their gradients count as fp32 master weights, as every
strategy trains them.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.flop_counter import flop_registry

from harness.core.models import build_layers
from harness.metrics.flops import gpu_peak
from harness.planning.planner import LayerProfile, Network, Profile

# (pattern on the GPU's name, HBM bytes/s from the datasheet), first match wins
GPU_MEMORY_BANDWIDTH: list[tuple[str, float]] = [
    (r"\bH200\b", 4.8e12),
    (r"\bGH200\b", 4.0e12),
    (r"\bH100\b.*\bPCIe\b", 2.0e12),
    (r"\bH100\b.*\bNVL\b", 3.9e12),
    (r"\bH100\b", 3.35e12),  # SXM
    (r"\bA100\b.*\b40GB\b", 1.555e12),
    (r"\bA100\b", 2.039e12),  # 80GB SXM
    (r"\bL40S?\b", 0.864e12),
    (r"\bL4\b", 0.3e12),
    (r"\bA10G?\b", 0.6e12),
    (r"\bV100\b", 0.9e12),
    (r"\bRTX 4090\b", 1.008e12),
]
KERNEL_FLOOR_S = 3e-6  # the shortest a kernel takes, launch to end, on current GPUs
ADAMW_BYTES_PER_PARAM_BYTE = 7.0  # reads parameter, gradient and two moments; writes parameter and moments


@dataclass
class GPU:
    name: str
    peak_flops: float  # dense, in the run's precision
    bandwidth: float  # bytes/s
    fraction: float  # of both that a run achieves
    fraction_source: str  # "assumed" or the measured profile it came from


def gpu(name: str, precision: str, fraction: float, fraction_source: str = "assumed") -> GPU:
    """The named GPU's datasheet figures; ValueError naming the known GPUs if it has none."""
    peak, _ = gpu_peak(name, precision)
    bandwidth = next((bw for pattern, bw in GPU_MEMORY_BANDWIDTH if re.search(pattern, name)), None)
    if peak is None or bandwidth is None:
        known = ", ".join(re.sub(r"\\b|\.\*", " ", p).strip() for p, _ in GPU_MEMORY_BANDWIDTH)
        raise ValueError(f"no {precision} peak or memory bandwidth for GPU '{name}'; known: {known}")
    return GPU(name, peak, bandwidth, fraction, fraction_source)


class _Roofline(TorchDispatchMode):
    """Sums the roofline time of every operator dispatched while it is active."""

    def __init__(self, device: GPU):
        super().__init__()
        self.device = device
        self.seconds = self.flops = self.bytes = 0.0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func.is_view or func._overloadpacket in (torch.ops.aten.detach,):
            return out  # a view moves nothing
        packet = func._overloadpacket
        flops = flop_registry[packet](*args, **kwargs, out_val=out) if packet in flop_registry else 0
        tensors = [t for t in tree_flatten((args, kwargs, out))[0] if isinstance(t, torch.Tensor)]
        moved = sum(t.numel() * t.element_size() for t in tensors)
        d = self.device
        self.seconds += max(flops / (d.peak_flops * d.fraction), moved / (d.bandwidth * d.fraction), KERNEL_FLOOR_S)
        self.flops += flops
        self.bytes += moved
        return out


def _timed(device: GPU, fn) -> tuple[object, float]:
    with _Roofline(device) as mode:
        result = fn()
    return result, mode.seconds


def _saved_bytes(fn) -> tuple[object, int]:
    """(fn's result, bytes of the distinct storages autograd saved, parameters left out)."""
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor):
        if not isinstance(t, torch.nn.Parameter):
            saved[t.untyped_storage()._cdata] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return out, sum(saved.values())


def roofline_layers(model_cfg, image_size: int, samples: int, precision: str, device: GPU) -> list[LayerProfile]:
    """Per-sample layer profiles of ``model_cfg`` at ``samples`` samples per forward on ``device``."""
    # torch pipelining's own split of the backward (importing the library costs about 2 s, which the
    # commands that only check a configuration should not pay)
    from torch.distributed.pipelining._backward import stage_backward_input, stage_backward_weight

    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    with torch.device("meta"):
        layers = [layer.to(dtype) for layer in build_layers(model_cfg, seed=0)]
    x = torch.empty(samples, 3, image_size, image_size, device="meta", dtype=dtype)
    cache: dict[tuple, LayerProfile] = {}
    out = []
    for i, layer in enumerate(layers):
        name = type(layer).__name__
        key = (name, tuple(tuple(p.shape) for p in layer.parameters()), tuple(x.shape))
        needs_grad = i > 0  # the model's input needs no gradient
        if key not in cache:
            inp = x.detach().requires_grad_(needs_grad)
            (y, saved), forward_s = _timed(device, lambda: _saved_bytes(lambda: layer(inp)))
            _, backward_s = _timed(device, lambda: y.backward(torch.ones_like(y)))
            inp = x.detach().requires_grad_(needs_grad)
            y = layer(inp)
            if needs_grad:
                (_, groups), input_s = _timed(
                    device, lambda: stage_backward_input([y], [torch.ones_like(y)], [inp], layer.parameters())
                )
                _, weight_s = _timed(device, lambda: stage_backward_weight(layer.parameters(), groups))
            else:  # the first stage's whole backward is its weight part
                input_s, weight_s = 0.0, backward_s
            cache[key] = LayerProfile(
                name,
                forward_s / samples,
                backward_s / samples,
                y[0].numel() * y.element_size(),
                saved // samples,
                x[0].numel() * x.element_size(),
                # fp32 master weights (and gradients), whatever the compute precision
                sum(p.numel() * 4 for p in layer.parameters()),
                input_s / samples,
                weight_s / samples,
            )
            x = y.detach()
        else:
            with torch.no_grad():
                x = layer(x)
        out.append(LayerProfile(**{**asdict(cache[key]), "name": name}))
    return out


def roofline_profile(
    model_cfg, image_size: int, samples: int, precision: str, device: GPU, network: Network
) -> Profile:
    """A profile of ``model_cfg`` on ``device`` from FLOPs and bytes (see the module docstring)."""
    layers = roofline_layers(model_cfg, image_size, samples, precision, device)
    return Profile(
        layers,
        network,
        f"roofline:{device.name}",
        samples,
        optimizer_s_per_byte=ADAMW_BYTES_PER_PARAM_BYTE / (device.bandwidth * device.fraction),
        meta={
            "model": getattr(model_cfg, "name", None),
            "precision": precision,
            "compute_model": {"kind": "roofline", **asdict(device), "kernel_floor_s": KERNEL_FLOOR_S},
        },
    )


def measured_fraction(measured: Profile, model_cfg, image_size: int, precision: str, name: str) -> float:
    """The fraction of the datasheet a measured profile of GPU ``name`` achieved: the roofline's
    forward and backward time at full peak over the measured one (step factor included)."""
    full = gpu(name, precision, 1.0)
    ideal = roofline_layers(model_cfg, image_size, measured.batch, precision, full)
    ideal_s = sum(l.forward_s + l.backward_s for l in ideal)
    measured_s = sum(l.forward_s + l.backward_s for l in measured.layers) * measured.step_factor
    return ideal_s / measured_s
