"""From a run spec to this rank's piece of a pipeline (shared by Hippie and AshPipe).

Checks a pipeline layout before launch, resolves the recomputation rule,
cuts the layer list (explicit boundaries, or balanced on costs measured on
rank 0 and broadcast so every rank agrees), and creates the per-stage
replica groups.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from harness.comm import Comm, DistContext, new_group
from harness.errors import ConfigError
from harness.models import activation_shapes, num_layers
from harness.runtime.executor import StageModule, StagePlan
from harness.runtime.partition import balanced_boundaries, check_boundaries, measure_layer_costs, stage_ranges
from harness.runtime.topology import Topology

RECOMPUTE_HELP = "use none, auto, all or a list of layer indices such as [1,2]"


def check_layout(spec, replicas: list[int]) -> None:
    """Pre-launch checks common to every pipeline strategy of this runtime."""
    st, t = spec.strategy, spec.train
    n_layers = num_layers(spec.model)
    stages = len(replicas)
    if stages > n_layers:
        raise ConfigError(
            f"strategy.stages={stages} exceeds the {n_layers} layers of {spec.model.name} "
            f"(embedding, {spec.model.depth} blocks, head); use at most {n_layers} stages"
        )
    if any(r < 1 for r in replicas):
        raise ConfigError(f"strategy.replicas={replicas}: every stage needs at least one replica")
    if sum(replicas) != spec.world_size:
        raise ConfigError(
            f"strategy.replicas={replicas} sums to {sum(replicas)} but world_size={spec.world_size}; "
            f"make them match"
        )
    if st.boundaries is not None:
        check_boundaries(list(st.boundaries), n_layers, stages)
    smallest_micro = t.global_batch // t.micro_batches
    if smallest_micro < max(replicas):
        raise ConfigError(
            f"train.global_batch={t.global_batch} in {t.micro_batches} micro-batch(es) gives micro-batches of "
            f"{smallest_micro} sample(s), fewer than the {max(replicas)} replicas of a stage; "
            f"raise train.global_batch to at least {t.micro_batches * max(replicas)} or lower train.micro_batches"
        )
    resolve_recompute(st.recompute, n_layers, (0, n_layers), last_stage=False)


def resolve_recompute(rule, n_layers: int, layer_range: tuple[int, int], last_stage: bool) -> set[int]:
    """Global indices of this stage's layers to recompute in backward.

    - ``none``: nothing;
    - ``auto``: every transformer block, except on the last stage (Hippie's
      last-stage scheduling, as in Merak: 1F1B consumes the last stage's
      activations right after its forward, so recomputing there only costs time);
    - ``all``: every layer of every stage, the last included (an explicit upper bound);
    - a list of layer indices: those layers, except on the last stage.
    """
    lo, hi = layer_range
    if isinstance(rule, str):
        if rule == "none":
            return set()
        if rule == "all":
            return set(range(lo, hi))
        if rule == "auto":
            return set() if last_stage else {i for i in range(lo, hi) if 0 < i < n_layers - 1}
        raise ConfigError(f"strategy.recompute={rule} is not understood; {RECOMPUTE_HELP}")
    try:
        indices = {int(i) for i in rule}
    except (TypeError, ValueError):
        raise ConfigError(f"strategy.recompute={rule} is not understood; {RECOMPUTE_HELP}") from None
    bad = sorted(i for i in indices if not 0 <= i < n_layers)
    if bad:
        raise ConfigError(f"strategy.recompute lists layers {bad} outside 0..{n_layers - 1}; {RECOMPUTE_HELP}")
    return set() if last_stage else {i for i in indices if lo <= i < hi}


@dataclass
class StageBuild:
    plan: StagePlan
    module: StageModule
    layer_range: tuple[int, int]
    boundaries: list[int]
    replica_group: object  # process group of this stage's replicas (None if one replica)
    recompute: set[int]


def build_stage(spec, layers: list[nn.Module], ctx: DistContext, comm: Comm, replicas: list[int],
                boundaries: list[int] | None = None, recompute: set[int] | None = None) -> StageBuild:
    """This rank's stage. ``boundaries`` and ``recompute`` (global layer indices) override
    the spec's rules when a planner has chosen them."""
    topo = Topology(tuple(replicas))
    n_layers = len(layers)
    stage, replica = topo.stage_of(ctx.rank), topo.replica_of(ctx.rank)

    if boundaries is None:
        boundaries = resolve_boundaries(spec, layers, ctx, comm, topo)
    ranges = stage_ranges(boundaries, n_layers)
    lo, hi = ranges[stage]

    # every rank creates every stage's group, in the same order (a collective call)
    groups = [new_group(topo.ranks_of(s), ctx.timeout) for s in range(topo.num_stages)]
    group = groups[stage] if replicas[stage] > 1 else None

    last = stage == topo.num_stages - 1
    if recompute is None:
        recompute = resolve_recompute(spec.strategy.recompute, n_layers, (lo, hi), last_stage=last)
    else:
        recompute = {i for i in recompute if lo <= i < hi}
    module = StageModule([layers[i] for i in range(lo, hi)], {i - lo for i in recompute}).to(ctx.device)

    plan = StagePlan(topo, ctx.rank, stage, replica, spec.train.micro_batches, boundary_shapes(spec, ranges))
    return StageBuild(plan, module, (lo, hi), boundaries, group, recompute)


def resolve_boundaries(spec, layers: list[nn.Module], ctx: DistContext, comm: Comm, topo: Topology) -> list[int]:
    """``strategy.boundaries`` if given, else a balance of costs measured on rank 0 and
    broadcast, so every rank (and every strategy given the same spec) cuts alike."""
    if spec.strategy.boundaries is not None:
        return check_boundaries(list(spec.strategy.boundaries), len(layers), topo.num_stages)
    return comm.broadcast_object(_measured_boundaries(spec, layers, ctx.device, topo) if ctx.rank == 0 else None)


def boundary_shapes(spec, ranges: list[tuple[int, int]]) -> list[tuple[int, ...]]:
    """Per-sample shape of each stage's input, then of the model's output."""
    image = (3, spec.data.image_size, spec.data.image_size)
    layer_shapes = activation_shapes(spec.model, image)
    return [image if a == 0 else layer_shapes[a - 1] for a, _ in ranges] + [layer_shapes[-1]]


def _measured_boundaries(spec, layers: list[nn.Module], device: torch.device, topo: Topology) -> list[int]:
    """Balance forward+backward time measured on this device at the micro-batch size."""
    micro = max(1, spec.train.global_batch // spec.train.micro_batches // max(topo.replicas))
    size = spec.data.image_size
    sample = torch.randn(micro, 3, size, size, device=device)
    moved = [layer.to(device) for layer in layers]
    costs = measure_layer_costs(moved, sample)
    return balanced_boundaries(costs, topo.num_stages)
