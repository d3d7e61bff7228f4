"""A stage of the pipeline: its place (:class:`StagePlan`), its layers (:class:`StageModule`), and
what a rank runs of it (:class:`LocalStage`, with its gradient buckets); and from a pipeline
layout (plain data) to this rank's stages (:func:`build_stages`).

The layout is built and checked by a strategy from the validated run spec
(:mod:`harness.strategies.layout`); the runtime only follows it, so it can be
used and tested without a config.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from harness.core.comm import Comm, DistContext, new_group
from harness.runtime.gradients import GradBuckets, GradSync
from harness.runtime.partition import stage_ranges
from harness.runtime.topology import Topology


@dataclass
class StagePlan:
    """Everything a rank needs to know about one stage's place in the pipeline."""

    topo: Topology
    rank: int
    stage: int
    replica: int
    micro_batches: int
    # per-sample shape of each stage's input (index s) and of the last stage's output (index S)
    boundary_shapes: list[tuple[int, ...]]

    @property
    def is_first(self) -> bool:
        return self.stage == 0

    @property
    def is_last(self) -> bool:
        return self.stage == self.topo.num_stages - 1


class StageModule(nn.Module):
    """The contiguous layers of one stage; layers in ``recompute`` are checkpointed.

    Checkpointed layers keep only their input for backward and run their forward
    again during backward (torch.utils.checkpoint, non-reentrant).
    """

    def __init__(self, layers: list[nn.Module], recompute: set[int]):
        super().__init__()
        self.layers = nn.ModuleList(layers)
        self.recompute = set(recompute)

    def forward(self, x: torch.Tensor, checkpointed: bool = True) -> torch.Tensor:
        """``checkpointed=False``: every layer keeps what its backward needs (the recomputation of
        a split backward, :meth:`harness.runtime.executor.StageExecutor._I`)."""
        for i, layer in enumerate(self.layers):
            if checkpointed and i in self.recompute and torch.is_grad_enabled():
                x = checkpoint(layer, x, use_reentrant=False)
            else:
                x = layer(x)
        return x


@dataclass
class LocalStage:
    """One stage this rank runs: its place, its layers, its gradient buffers and their replica
    all-reduce (None with one replica). A rank of an interleaved or V-shaped schedule runs
    several, each with its own buckets, reduced as soon as that stage's last backward ends."""

    plan: StagePlan
    module: StageModule
    grads: GradBuckets
    grad_sync: GradSync | None

    def __post_init__(self):
        self.names = [n for n, _ in self.module.named_parameters()]
        self.masters = [p for _, p in self.module.named_parameters()]
        self.recompute_at_i = False  # this call's split backward recomputes its forward at I


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
