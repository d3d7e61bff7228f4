"""PyTorch's own pipeline: torch.distributed.pipelining, as its users run it.

``PipelineStage`` over the same layer list, cut by the same rule as our runtime,
with any of the library's schedules (``strategy.schedule``: every entry of the
schedule registry, :mod:`harness.runtime.schedules`, that names a library class):
one stage per rank (``gpipe``, ``1f1b``), or ``strategy.stages_per_rank`` (v) stages
per rank, ``v x strategy.stages`` stages in all, in the entry's placement
(interleaved 1F1B, looped BFS, ZB1P, ZB-V, DualPipeV). The zero-bubble family
splits each backward into its input- and weight-gradient parts.

Data parallelism across pipeline replicas: with ``world_size = stages * n`` there
are n pipelines, each stage module wrapped in DDP over its n replicas (pipelining
runs DDP's ``no_sync`` for all but the last backward). Each pipeline takes
``B / n`` samples in ``m`` equal micro-batches; the loss is the micro-batch mean
and the schedule divides gradients by m, so one step equals single-process
training on the global batch. ``strategy.recompute`` checkpoints layers by the
rule every strategy shares (:func:`harness.strategies.layout.resolve_recompute`).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from harness.core.comm import new_group
from harness.core.errors import ConfigError
from harness.core.options import choice
from harness.core.training import PRECISIONS, clip_gradients, eval_counts, make_optimizer, mean_loss, with_precision
from harness.metrics.meter import optimizer_state_tensors
from harness.runtime import schedules, torch_schedules
from harness.runtime.partition import stage_ranges
from harness.runtime.stage import StageModule
from harness.runtime.topology import Topology
from harness.strategies.base import MultiStageKeys, Strategy, multi_stage_variant, summed_eval
from harness.strategies.layout import (
    check_layout,
    check_stages_per_rank,
    micro_batch_samples,
    recompute_of_stages,
    resolve_boundaries,
    simulated_synchronous_pipeline,
    uniform_replicas,
)


@dataclass
class PipeliningConfig(MultiStageKeys):
    # every schedule of the registry the library has (docs/reference/schedules.md)
    schedule: str = choice("1f1b", *schedules.names(library=True))


class PipeliningStrategy(Strategy):
    name = "pipelining"
    Config = PipeliningConfig

    @classmethod
    def check(cls, spec) -> None:
        st, m = spec.strategy, spec.train.micro_batches
        replicas = uniform_replicas(spec)
        P, n, v = len(replicas), replicas[0], st.stages_per_rank
        schedule = schedules.get(st.schedule)
        check_stages_per_rank(spec, schedule, schedules.names(library=True))
        check_layout(spec, replicas, stages_per_rank=v)
        B = spec.train.global_batch
        if B % (n * m):
            raise ConfigError(
                f"torch.distributed.pipelining needs equal micro-batches: train.global_batch={B} must be divisible by "
                f"{n} pipeline replica(s) x {m} micro-batches; use a multiple of {n * m}"
            )
        if n > 1 and schedule.splits_backward:
            raise ConfigError(
                f"strategy.schedule={st.schedule} splits the backward, which skips the hooks DDP reduces gradients "
                f"with (torch 2.14, pytorch/pytorch#144530: replicas end a step with different weights); run one "
                f"pipeline, world_size={P}, or interleaved_1f1b or looped_bfs across {n} replicas"
            )
        if schedule.placement == "one":
            if m < P:
                raise ConfigError(
                    f"torch.distributed.pipelining's schedules need at least one micro-batch per stage: "
                    f"train.micro_batches={m} with {P} stages; set train.micro_batches>={P}"
                )
            return
        try:  # the library's own rules, by building its schedule; then a replay proves it finishes
            schedule.check(P, v, m)
        except schedules.ScheduleError as e:
            raise ConfigError(
                f"strategy.schedule={st.schedule} cannot run train.micro_batches={m} on {P} rank(s) x "
                f"{v} stage(s) per rank: {e}"
            ) from None

    @classmethod
    def samples_per_forward(cls, spec) -> int:
        return micro_batch_samples(spec)

    @classmethod
    def variant(cls, spec) -> str:
        return multi_stage_variant(spec.strategy, recompute_first=False)

    @classmethod
    def simulated(cls, spec, profile, cluster):
        return simulated_synchronous_pipeline(spec, profile)

    def __init__(self, spec, layers, ctx, comm):
        # the library (with torch._dynamo, about 2 s to import here) only where this strategy runs:
        # every command that checks a configuration imports this module
        from torch.distributed.pipelining import PipelineStage
        from torch.distributed.pipelining.schedules import get_schedule_class

        super().__init__(spec, layers, ctx, comm)
        st = spec.strategy
        replicas = uniform_replicas(spec)
        topo = Topology(tuple(replicas))
        P, n, v = topo.num_stages, replicas[0], st.stages_per_rank
        S = P * v  # stages in all
        # this rank's position in its pipeline (a "stage" for the harness's per-rank figures)
        self.stage, self.replica = topo.stage_of(ctx.rank), topo.replica_of(ctx.rank)
        self.n_replicas, self.num_stages = n, S
        schedule = schedules.get(st.schedule)
        self.stage_indices = schedule.stages_of(P, v, self.stage)

        self.partition = resolve_boundaries(spec, layers, ctx, comm, [n] * S)
        ranges = stage_ranges(self.partition.boundaries, len(layers))
        self.layer_ranges = [ranges[i] for i in self.stage_indices]
        self.recompute = recompute_of_stages(st.recompute, len(layers), ranges)
        # all ranks create all groups, in the same order
        pipe_groups = [new_group([s * n + j for s in range(P)], ctx.timeout) for j in range(n)]
        dp_groups = [new_group(topo.ranks_of(s), ctx.timeout) for s in range(P)]

        precise = with_precision(layers, spec.train.precision)
        self.modules, pipe_stages = [], []
        for i, (lo, hi) in zip(self.stage_indices, self.layer_ranges):
            module = StageModule(precise[lo:hi], {j - lo for j in self.recompute if lo <= j < hi})
            if spec.train.precision != "fp32":  # cross stages in the run's precision, compute from fp32, as ours
                module = nn.Sequential(
                    *([_Cast(torch.float32)] if i > 0 else []),
                    module,
                    *([_Cast(PRECISIONS[spec.train.precision])] if i < S - 1 else []),
                )
            module = module.to(ctx.device)
            self.modules.append(module)
            submodule = module
            if n > 1:
                # find_unused_parameters: without it DDP's first-step bucket rebuild records the
                # parameters of every micro-batch's backward, not only the synchronised last one, and
                # the second step fails ("rebuilt parameter indices size is not same as original model
                # parameters size", 28 versus 56 at 2 micro-batches); with it DDP skips the rebuild and
                # walks the last micro-batch's graph once per step, plus one small all-reduce of its map
                # of used parameters (the price, stated in the README)
                submodule = DistributedDataParallel(
                    module,
                    process_group=dp_groups[self.stage],
                    find_unused_parameters=True,
                    device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None,
                )
            pipe_stages.append(PipelineStage(submodule, i, S, ctx.device, group=pipe_groups[self.replica]))
        self.params = [p for module in self.modules for p in module.parameters()]
        self.optimizer = make_optimizer(self.params, spec.train, spec.steps)

        m = spec.train.micro_batches
        self.local_batch = spec.train.global_batch // n
        # shapes are inferred by pipelining on the first (untimed) step, as its users run it
        self._eval_order = None
        library = get_schedule_class(schedule.library)
        if schedule.placement == "one":  # the single-stage classes take one stage, the others a list
            self.schedule = library(pipe_stages[0], n_microbatches=m, loss_fn=self._loss)
        else:
            self.schedule = library(pipe_stages, n_microbatches=m, loss_fn=self._loss)
            # the runtime runs the lowered order it keeps per rank; evaluation swaps in a forward-only one
            forward = schedule.forward_only(P, v, m)
            self._eval_order = {r: torch_schedules.to_library(acts) for r, acts in enumerate(forward)}
        self.first, self.last = 0 in self.stage_indices, S - 1 in self.stage_indices

    def _loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return mean_loss(output, target, self.spec.train.label_smoothing)

    def _share(self, x, y):
        lo = self.replica * self.local_batch
        return x[lo : lo + self.local_batch], y[lo : lo + self.local_batch]

    def _call(self, fn, x, y, losses):
        args = (x,) if self.first else ()
        kwargs = {"target": y, "losses": losses} if self.last else {}
        return fn(*args, **kwargs)

    def train_step(self, x, y):
        for module in self.modules:
            module.train()
        x, y = self._share(x, y)
        losses: list[torch.Tensor] = []
        self._call(self.schedule.step, x, y, losses)
        # the whole model's norm: every rank's stages, its weight 1/n for the n pipelines that hold them
        clip_gradients(self.params, self.spec.train.grad_clip_norm, self.comm.all_reduce, 1 / self.n_replicas)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if not losses:
            return 0.0
        return torch.stack([l.detach() for l in losses]).mean() / self.n_replicas

    @torch.no_grad()
    def evaluate(self, x, y):
        for module in self.modules:
            module.eval()
        x, y = self._share(x, y)
        losses: list[torch.Tensor] = []
        with self._evaluation_order():
            out = self._call(self.schedule.eval, x, y, losses)
        return summed_eval(self.comm, eval_counts(out, y) if self.last else (0.0, 0.0, 0.0))

    @contextlib.contextmanager
    def _evaluation_order(self):
        """A multi-stage schedule runs :meth:`harness.runtime.schedules.Schedule.forward_only` while
        it evaluates, then its training order again: the library's own ``eval`` replays the training
        order with its backwards skipped, which fails for the V schedules in torch 2.14 (it hands a
        backward's output between the two local stages)."""
        if self._eval_order is None:
            yield
            return
        training = self.schedule.pipeline_order_with_comms
        self.schedule.pipeline_order_with_comms = self._eval_order
        try:
            yield
        finally:
            self.schedule.pipeline_order_with_comms = training

    def memory_parts(self):
        return {"parameters": self.params, "optimizer_state": optimizer_state_tensors(self.optimizer)}

    def layout(self):
        return {
            "stage": self.stage,
            "replica": self.replica,
            "stages": self.stage_indices,
            "layers": [list(r) for r in self.layer_ranges]
            if len(self.layer_ranges) > 1
            else list(self.layer_ranges[0]),
        }

    def owned_layers(self):
        return [i for lo, hi in self.layer_ranges for i in range(lo, hi)]

    def recomputed_layers(self):
        share = 1.0 / self.n_replicas
        return {i: share for i in self.owned_layers() if i in self.recompute}


class _Cast(nn.Module):
    """The stage's output in the type it crosses to the next stage in (a no-op in fp32)."""

    def __init__(self, dtype: torch.dtype):
        super().__init__()
        self.dtype = dtype

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.to(self.dtype)
