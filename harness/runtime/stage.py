"""From a pipeline layout (plain data) to this rank's stage: layers, replica group, plan.

The layout is built and checked by a strategy from the validated run spec
(:mod:`harness.strategies.layout`); the runtime only follows it, so it can be
used and tested without a config.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from harness.core.comm import Comm, DistContext, new_group
from harness.runtime.executor import StageModule, StagePlan
from harness.runtime.partition import stage_ranges
from harness.runtime.topology import Topology


@dataclass(frozen=True)
class PipelineLayout:
    """Everything the runtime needs to know about a pipeline, decided before it is built."""

    replicas: tuple[int, ...]  # ranks per stage; stage s takes the next replicas[s] ranks
    boundaries: tuple[int, ...]  # first layer of stages 1..S-1
    micro_batches: int
    recompute: frozenset[int]  # global indices of the layers checkpointed in backward
    # per-sample shape of each stage's input (index s) and of the last stage's output (index S)
    boundary_shapes: tuple[tuple[int, ...], ...]
    bucket_bytes: int  # gradient all-reduce bucket size
    # rank position of each stage where a rank holds several (the schedule's placement); None: one each
    place: tuple[int, ...] | None = None

    @property
    def topology(self) -> Topology:
        return Topology(tuple(self.replicas), self.place)

    def ranges(self, num_layers: int) -> list[tuple[int, int]]:
        return stage_ranges(list(self.boundaries), num_layers)


@dataclass
class StageBuild:
    plan: StagePlan
    module: StageModule
    layer_range: tuple[int, int]
    replica_group: object  # process group of this stage's replicas (None if one replica)
    recompute: set[int]  # global indices of this stage's checkpointed layers


def build_stages(layout: PipelineLayout, layers: list[nn.Module], ctx: DistContext, comm: Comm) -> list[StageBuild]:
    """This rank's stages of ``layout`` (one, unless its schedule places several on a rank),
    ascending. Collective: every rank of the job calls it."""
    topo = layout.topology
    position, replica = topo.position_of(ctx.rank), topo.replica_of(ctx.rank)
    # every rank creates every position's replica group, in the same order (a collective call); the
    # stages of one position share their ranks, so they share the group
    groups = [new_group(topo.ranks_at(p), ctx.timeout) for p in range(topo.positions)]
    group = groups[position] if topo.replicas_at(position) > 1 else None
    builds = []
    for stage in topo.stages_at(position):
        lo, hi = layout.ranges(len(layers))[stage]
        recompute = {i for i in layout.recompute if lo <= i < hi}
        module = StageModule([layers[i] for i in range(lo, hi)], {i - lo for i in recompute}).to(ctx.device)
        plan = StagePlan(topo, ctx.rank, stage, replica, layout.micro_batches, list(layout.boundary_shapes))
        builds.append(StageBuild(plan, module, (lo, hi), group, recompute))
    return builds
