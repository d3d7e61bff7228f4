"""Our runtime's stage on this rank, assembled the one way Hippie and AshPipe share.

layout (the shared cut and recomputation rules) -> this rank's stage -> its optimizer ->
its gradient buckets, the replica all-reduce and the clipping rule -> the executor.
What differs between the two methods is one switch, ``asynchronous``: AshPipe's stages
start from their first replica's weights, stash (and may predict) the weights a
minibatch in flight used, and clip their own gradient, since an asynchronous pipeline
never holds the whole model's gradient at once; Hippie's clip the whole model's norm.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from harness.core.training import PRECISIONS, carry_schedule, make_optimizer, with_precision
from harness.runtime.executor import StageExecutor
from harness.runtime.gradients import Clip, GradBuckets, GradSync
from harness.runtime.stage import LocalStage, PipelineLayout, StageBuild, build_stages
from harness.strategies.layout import Partition, pipeline_layout


@dataclass
class Pipeline:
    layout: PipelineLayout
    partition: Partition
    builds: list[StageBuild]  # this rank's stages, ascending (one unless the schedule places several)
    params: list[torch.nn.Parameter]
    optimizer: torch.optim.Optimizer
    executor: StageExecutor

    @property
    def build(self) -> StageBuild:
        """This rank's stage, where it holds one."""
        if len(self.builds) != 1:
            raise ValueError(f"this rank holds stages {[b.plan.stage for b in self.builds]}")
        return self.builds[0]

    @property
    def plan(self):
        return self.build.plan

    @property
    def delay(self) -> int:
        """Updates between a forward of this stage and its own in an asynchronous pipeline."""
        return self.plan.topo.num_stages - 1 - self.plan.stage


def build_pipeline(
    spec,
    layers,
    ctx,
    comm,
    replicas: list[int],
    *,
    partition: Partition | None = None,
    recompute: set[int] | None = None,
    asynchronous: bool = False,
    lr_scale: Callable[[int], Callable[[int], float] | None] | None = None,
    steps_done: int = 0,
    optimizer_state: torch.optim.Optimizer | None = None,
    place: list[int] | None = None,
) -> Pipeline:
    """This rank's stages of a pipeline of ``replicas`` (per stage; collective: every rank calls it).

    ``place`` puts stage s on rank position ``place[s]`` where a rank holds several (a schedule's
    placement; None: one stage per rank);
    ``partition`` and ``recompute`` override the shared rules where a planner chose them;
    ``lr_scale(delay)`` gives the rate multiplier of a stage ``delay`` updates stale (None: none);
    ``steps_done`` and ``optimizer_state`` carry a data-parallel phase's schedule position and
    state over (Switch Parallelism)."""
    layout, partition = pipeline_layout(
        spec, layers, ctx, comm, replicas, partition, recompute, bucket_mb=spec.strategy.bucket_mb, place=place
    )
    builds = build_stages(layout, with_precision(layers, spec.train.precision), ctx, comm)
    plan, group = builds[0].plan, builds[0].replica_group
    params = [p for build in builds for p in build.module.parameters()]
    if asynchronous and group is not None:  # replicas start from the stage's first rank's weights
        first = plan.topo.ranks_of(plan.stage)[0]
        for p in params:
            comm.broadcast(p.data, src=first, group=group)
    delay = plan.topo.num_stages - 1 - plan.stage  # (asynchronous pipelines hold one stage per rank)
    optimizer = make_optimizer(params, spec.train, spec.steps, lr_scale(delay) if lr_scale else None)
    if steps_done:
        carry_schedule(optimizer, steps_done)
    if optimizer_state is not None:
        for p in params:
            if p in optimizer_state.state:
                optimizer.state[p] = optimizer_state.state[p]
    stages = []
    for build in builds:  # each stage's own buckets, reduced when its own last backward ends
        grads = GradBuckets(list(build.module.parameters()), layout.bucket_bytes)
        sync = GradSync(grads, comm, group) if group is not None else None
        stages.append(LocalStage(build.plan, build.module, grads, sync))
    clip = None
    if spec.train.grad_clip_norm:
        # a synchronous pipeline clips the whole model's norm, as one process would (each rank's
        # squared norm weighted by 1 / its stage's replicas); an asynchronous one each stage's own
        clip = (
            Clip(spec.train.grad_clip_norm, whole_model=False)
            if asynchronous
            else Clip(spec.train.grad_clip_norm, whole_model=True, weight=1 / plan.topo.replicas[plan.stage])
        )
    executor = StageExecutor(
        stages,
        comm,
        optimizer,
        dtype=PRECISIONS[spec.train.precision],
        label_smoothing=spec.train.label_smoothing,
        stash_weights=asynchronous and delay > 0,
        predict_weights=asynchronous and bool(getattr(spec.strategy, "weight_prediction", False)),
        clip=clip,
    )
    return Pipeline(layout, partition, builds, params, optimizer, executor)
