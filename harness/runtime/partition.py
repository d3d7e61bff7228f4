"""Where to cut the layer list into stages.

Boundaries are the index of the first layer of stages 1..S-1. Given or
balanced on measured per-layer cost: the contiguous split that minimises the
slowest stage, found by dynamic programming. Checking given boundaries against
the config is validation's job (:mod:`harness.strategies.layout`).
"""

from __future__ import annotations

import torch
from torch import nn

from harness.core.timing import DeviceTimer


def balanced_boundaries(costs: list[float], num_stages: int) -> list[int]:
    """Contiguous split of ``costs`` into ``num_stages`` non-empty parts minimising the largest sum."""
    n = len(costs)
    if not 1 <= num_stages <= n:
        raise ValueError(f"cannot split {n} layers into {num_stages} stages")
    prefix = [0.0]
    for c in costs:
        prefix.append(prefix[-1] + c)
    inf = float("inf")
    # best[s][i]: minimal max-stage cost of the first i layers in s stages; cut[s][i]: start of the last stage
    best = [[inf] * (n + 1) for _ in range(num_stages + 1)]
    cut = [[0] * (n + 1) for _ in range(num_stages + 1)]
    best[0][0] = 0.0
    for s in range(1, num_stages + 1):
        for i in range(s, n + 1):
            for j in range(s - 1, i):
                v = max(best[s - 1][j], prefix[i] - prefix[j])
                if v < best[s][i]:
                    best[s][i], cut[s][i] = v, j
    bounds, i = [], n
    for s in range(num_stages, 1, -1):
        i = cut[s][i]
        bounds.append(i)
    return sorted(bounds)


def stage_ranges(boundaries: list[int], num_layers: int) -> list[tuple[int, int]]:
    edges = [0, *boundaries, num_layers]
    return list(zip(edges, edges[1:]))


def measure_layer_costs(layers: list[nn.Module], sample: torch.Tensor, repeats: int = 3) -> list[float]:
    """Forward+backward seconds of each layer on ``sample``'s device (median of ``repeats``)."""
    timer = DeviceTimer(sample.device)
    costs = []
    x = sample
    for index, layer in enumerate(layers):
        times = []
        for _ in range(repeats + 1):  # the first run warms up
            # as in training: the model's input needs no gradient
            inp = x.detach().requires_grad_(index > 0 and x.is_floating_point())
            t0 = timer.mark()
            out = layer(inp)
            out.float().sum().backward()
            times.append(timer.elapsed(t0, timer.mark()))
        layer.zero_grad(set_to_none=True)
        costs.append(sorted(times[1:])[len(times[1:]) // 2])
        x = out.detach()
    return costs
