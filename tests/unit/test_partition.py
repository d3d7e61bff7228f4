import itertools

import pytest
import torch

from harness.core.errors import ConfigError
from harness.planning.planner import LayerProfile, Network, Profile, plan, stage_cost
from harness.runtime.partition import balanced_boundaries, measure_layer_costs, stage_ranges
from harness.strategies.layout import check_boundaries, resolve_recompute


def _brute_force(costs, stages):
    n = len(costs)
    best = None
    for cuts in itertools.combinations(range(1, n), stages - 1):
        edges = [0, *cuts, n]
        worst = max(sum(costs[a:b]) for a, b in zip(edges, edges[1:]))
        if best is None or worst < best[0]:
            best = (worst, list(cuts))
    return best[0]


@pytest.mark.parametrize(
    "costs,stages",
    [([1, 2, 3, 4, 5, 6], 2), ([5, 1, 1, 1, 1, 5], 3), ([3, 1, 4, 1, 5, 9, 2, 6], 4), ([1] * 6, 6), ([10, 1, 1], 2)],
)
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
    with pytest.raises(ValueError, match="3 layers into 4 stages"):
        balanced_boundaries([1, 1, 1], 4)


def test_measured_costs_grow_with_layer_work():
    layers = [torch.nn.Linear(64, 64), torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(30)])]
    # thirty times the work; the median of nine timings and a tenfold margin hold on a host whose
    # other work preempts a few of them
    costs = measure_layer_costs(layers, torch.randn(256, 64), repeats=9)
    assert costs[1] > 3 * costs[0] > 0


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


def _profile(costs, params, out_bytes=1000, bandwidth=1e9):
    layers = [
        LayerProfile(f"L{i}", c / 3, 2 * c / 3, out_bytes, 4 * out_bytes, out_bytes, p)
        for i, (c, p) in enumerate(zip(costs, params))
    ]
    return Profile(layers, Network(bandwidth, bandwidth, 0.0), "cpu", 1)


def _brute_force_plan(profile, world, batch, memory_limit):
    """Every contiguous split and every replica assignment using exactly ``world`` workers."""
    n = len(profile.layers)
    best = float("inf")
    for S in range(1, min(n, world) + 1):
        for cuts in itertools.combinations(range(1, n), S - 1):
            edges = [0, *cuts, n]
            for reps in itertools.product(range(1, world + 1), repeat=S):
                if sum(reps) != world:
                    continue
                stages = [
                    stage_cost(profile, a, b, m, S - s, batch, memory_limit)
                    for s, (a, b, m) in enumerate(zip(edges, edges[1:], reps))
                ]
                if all(stages):
                    best = min(best, max(st.time_s for st in stages))
    return best


@pytest.mark.parametrize(
    "costs,params,world,limit",
    [
        ([1.0, 4.0, 4.0, 1.0], [100, 100, 100, 100], 4, None),
        ([3.0, 1.0, 1.0, 1.0, 2.0], [5e8, 1e6, 1e6, 1e6, 1e6], 5, None),  # a heavy all-reduce on layer 0
        ([1.0, 1.0, 1.0, 1.0], [1e3, 1e3, 1e3, 1e3], 3, 30_000.0),  # memory forces replicas/recompute
    ],
)
def test_planner_finds_the_hand_checked_optimum(costs, params, world, limit):
    profile = _profile(costs, params)
    chosen = plan(profile, world, global_batch=8, memory_limit=limit)
    assert sum(chosen.replicas) == world
    assert chosen.step_s == pytest.approx(_brute_force_plan(profile, world, 8, limit))


def test_planner_hand_computed_case():
    """Two equal heavy layers and two light ones on 4 workers, free network: the best plan
    gives each heavy layer two replicas (4 units each over 2 = 2 per stage)."""
    chosen = plan(_profile([0.0, 4.0, 4.0, 0.0], [1, 1, 1, 1], bandwidth=1e15), 4, global_batch=1)
    assert chosen.step_s == pytest.approx(2.0)
