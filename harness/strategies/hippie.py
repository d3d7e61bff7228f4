"""Hippie (Ye et al., ICPP 2021): a data-paralleled synchronous pipeline on our runtime.

- Synchronous pipeline across stages, 1F1B with a flush each iteration, or any
  synchronous schedule of the registry our executor runs (``strategy.schedule``:
  fill-drain, ZB-H1's split backward, and with ``strategy.stages_per_rank`` stages on
  each rank interleaved 1F1B, ZB1P, ZB-V, DualPipeV).
- Data parallelism inside each stage: ``world_size / stages`` replicas per stage.
- Hidden gradient communication: each stage's gradient all-reduce is bucketed
  and started asynchronously while the last backward of the iteration is still
  running (:class:`harness.runtime.gradients.GradSync`; under a split backward, as
  each bucket's last weight-gradient pass ends, and on a rank of several stages as
  each stage's ends, under the others' work); the optimizer waits only for it.
- Last-stage scheduling and selective recomputation: see
  :func:`harness.strategies.layout.resolve_recompute` (the last stage runs
  without recomputation under ``auto`` and layer lists).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from harness.core.errors import ConfigError
from harness.core.options import bounded
from harness.metrics.meter import optimizer_state_tensors
from harness.runtime import actions as sch
from harness.runtime import schedules
from harness.strategies.base import MultiStageKeys, Strategy, multi_stage_variant, summed_eval
from harness.strategies.layout import (
    check_layout,
    check_stages_per_rank,
    micro_batch_samples,
    refuse_unrunnable,
    simulated_synchronous_pipeline,
    uniform_replicas,
)
from harness.strategies.pipeline import build_pipeline


@dataclass
class HippieConfig(MultiStageKeys):
    recompute: Any = "auto"
    # gradient all-reduce bucket size (MiB) for the hidden communication
    bucket_mb: float = bounded(4.0, 0, above=True)


class HippieStrategy(Strategy):
    """A synchronous pipeline of this runtime: its stages on each rank, its schedule, hidden all-reduce."""

    name = "hippie"
    Config = HippieConfig

    def __init__(self, spec, layers, ctx, comm):
        super().__init__(spec, layers, ctx, comm)
        schedule, v = schedules.get(spec.strategy.schedule), spec.strategy.stages_per_rank
        positions = uniform_replicas(spec)  # replicas per rank position
        P, m = len(positions), spec.train.micro_batches
        pipe = build_pipeline(spec, layers, ctx, comm, positions * v, place=schedule.placement_of(P, v))
        self.partition, self.builds = pipe.partition, pipe.builds
        self.params, self.optimizer, self.executor = pipe.params, pipe.optimizer, pipe.executor
        self.topo = self.builds[0].plan.topo
        self.position = self.topo.position_of(ctx.rank)
        lists = sch.reducing(schedule.lists(P, v, m))
        self.train_actions = lists[self.position]
        # each peer's messages received in the order it sends them, as NCCL pairs them
        self.posting = sch.receive_order(lists, schedule.placement_of(P, v))[self.position]
        self.eval_actions = schedule.forward_only(P, v, m)[self.position]

    @classmethod
    def check(cls, spec) -> None:
        st, replicas = spec.strategy, uniform_replicas(spec)
        ours = schedules.names(ours=True)
        if st.schedule not in ours:
            raise ConfigError(
                f"strategy.schedule={st.schedule} is not one of {', '.join(ours)} (the synchronous "
                "schedules of our runtime)"
            )
        schedule = schedules.get(st.schedule)
        check_stages_per_rank(spec, schedule, ours)
        check_layout(spec, replicas, stages_per_rank=st.stages_per_rank)
        refuse_unrunnable(schedule, len(replicas), st.stages_per_rank, spec.train.micro_batches)

    @classmethod
    def samples_per_forward(cls, spec) -> int:
        return micro_batch_samples(spec)

    @classmethod
    def variant(cls, spec) -> str:
        return multi_stage_variant(spec.strategy, recompute_first=True)

    @classmethod
    def simulated(cls, spec, profile, cluster):
        return simulated_synchronous_pipeline(spec, profile)

    def _modules(self, mode: str) -> None:
        for build in self.builds:
            getattr(build.module, mode)()

    def train_step(self, x, y):
        self._modules("train")
        run = self.executor.run(self.train_actions, x, y, training=True, posting=self.posting)
        self.step_stats.append(run.step_stats())
        return run.loss

    @torch.no_grad()
    def evaluate(self, x, y):
        self._modules("eval")
        run = self.executor.run(self.eval_actions, x, y, training=False)
        return summed_eval(self.comm, (run.correct, run.count, run.loss_sum))

    def memory_parts(self):
        return {"parameters": self.params, "optimizer_state": optimizer_state_tensors(self.optimizer)}

    def layout(self):
        # "stage" is the rank's position along the pipeline, as for torch pipelining's runs
        ranges = [list(b.layer_range) for b in self.builds]
        several = {"stages": [b.plan.stage for b in self.builds]} if len(self.builds) > 1 else {}
        return {
            "stage": self.position,
            **several,
            "replica": self.builds[0].plan.replica,
            "layers": ranges if several else ranges[0],
            "boundaries": self.partition.boundaries,
            "recompute": sorted(i for b in self.builds for i in b.recompute),
            "replicas": [self.topo.replicas_at(p) for p in range(self.topo.positions)],
        }

    def recomputed_layers(self):
        share = 1 / self.topo.replicas_at(self.position)
        return {i: share for b in self.builds for i in b.recompute}

    def owned_layers(self):
        return [i for b in self.builds for i in range(*b.layer_range)]
