import itertools

import pytest
import torch

from harness.errors import ConfigError
from harness.runtime.build import resolve_recompute
from harness.runtime.partition import balanced_boundaries, check_boundaries, measure_layer_costs, stage_ranges


def _brute_force(costs, stages):
    n = len(costs)
    best = None
    for cuts in itertools.combinations(range(1, n), stages - 1):
        edges = [0, *cuts, n]
        worst = max(sum(costs[a:b]) for a, b in zip(edges, edges[1:]))
        if best is None or worst < best[0]:
            best = (worst, list(cuts))
    return best[0]


@pytest.mark.parametrize("costs,stages", [([1, 2, 3, 4, 5, 6], 2), ([5, 1, 1, 1, 1, 5], 3), ([3, 1, 4, 1, 5, 9, 2, 6], 4),
                                          ([1] * 6, 6), ([10, 1, 1], 2)])
def test_balanced_boundaries_minimise_the_slowest_stage(costs, stages):
    b = balanced_boundaries(costs, stages)
    assert len(b) == stages - 1
    worst = max(sum(costs[a:c]) for a, c in stage_ranges(b, len(costs)))
    assert worst == pytest.approx(_brute_force(costs, stages))


def test_boundaries_are_checked():
    assert check_boundaries([2, 4], 6, 3) == [2, 4]
    for bad in ([4, 2], [0, 3], [2, 6], [2]):
        with pytest.raises(ConfigError):
            check_boundaries(bad, 6, 3)
    with pytest.raises(ConfigError, match="at most 3 stages"):
        balanced_boundaries([1, 1, 1], 4)


def test_measured_costs_grow_with_layer_work():
    layers = [torch.nn.Linear(64, 64), torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(30)])]
    costs = measure_layer_costs(layers, torch.randn(256, 64))
    assert costs[1] > 5 * costs[0] > 0


def test_recompute_rules():
    n = 6  # embedding, 4 blocks, head
    assert resolve_recompute("none", n, (0, 3), last_stage=False) == set()
    assert resolve_recompute("auto", n, (0, 3), last_stage=False) == {1, 2}
    assert resolve_recompute("auto", n, (3, 6), last_stage=True) == set()  # last-stage scheduling
    assert resolve_recompute("all", n, (3, 6), last_stage=True) == {3, 4, 5}
    assert resolve_recompute([0, 4], n, (3, 6), last_stage=False) == {4}
    assert resolve_recompute([0, 4], n, (3, 6), last_stage=True) == set()
    with pytest.raises(ConfigError, match="outside"):
        resolve_recompute([9], n, (0, 6), last_stage=False)
    with pytest.raises(ConfigError, match="not understood"):
        resolve_recompute("some", n, (0, 6), last_stage=False)
