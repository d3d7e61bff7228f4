"""Hippie (Ye et al., ICPP 2021): a data-paralleled synchronous pipeline on our runtime.

- Synchronous pipeline across stages, 1F1B with a flush each iteration
  (``strategy.schedule=gpipe`` gives fill-drain for comparison).
- Data parallelism inside each stage: ``world_size / stages`` replicas per stage.
- Hidden gradient communication: each stage's gradient all-reduce is bucketed
  and started asynchronously while the last backward of the iteration is still
  running (:class:`harness.runtime.executor.GradSync`); the optimizer waits only
  for it.
- Last-stage scheduling and selective recomputation: see
  :func:`harness.runtime.build.resolve_recompute` (the last stage runs
  without recomputation under ``auto`` and layer lists).
"""

from __future__ import annotations

from harness.errors import ConfigError
from harness.metrics import optimizer_state_tensors
from harness.runtime import schedule as sch
from harness.runtime.build import build_stage, check_layout
from harness.runtime.executor import GradSync, StageExecutor
from harness.strategy import Strategy, make_optimizer, summed_eval

import torch


def uniform_replicas(spec) -> list[int]:
    stages = spec.strategy.stages
    if stages < 1:
        raise ConfigError(f"strategy.stages={stages} must be at least 1")
    if spec.world_size % stages:
        raise ConfigError(
            f"world_size={spec.world_size} is not divisible by strategy.stages={stages}; "
            f"{spec.strategy.name} needs the same number of replicas in every stage"
        )
    return [spec.world_size // stages] * stages


class PipelineStrategy(Strategy):
    """A synchronous pipeline of this runtime: build one stage per rank, run its schedule."""

    def __init__(self, spec, layers, ctx, comm, replicas: list[int]):
        super().__init__(spec, layers, ctx, comm)
        self.build = build_stage(spec, layers, ctx, comm, replicas)
        self.plan = self.build.plan
        self.params = list(self.build.module.parameters())
        self.optimizer = make_optimizer(self.params, spec)
        grad_sync = None
        if self.build.replica_group is not None:
            bucket = int(spec.strategy.bucket_mb * 2**20)
            grad_sync = GradSync(self.params, comm, self.build.replica_group, bucket)
        self.executor = StageExecutor(self.plan, self.build.module, comm, self.optimizer, grad_sync)
        S, m = self.plan.topo.num_stages, spec.train.micro_batches
        self.train_actions = sch.SCHEDULES[spec.strategy.schedule](S, m)[self.plan.stage]
        self.eval_actions = sch.forward_only(S, m)[self.plan.stage]

    @classmethod
    def check(cls, spec) -> None:
        if spec.strategy.schedule not in sch.SCHEDULES:
            raise ConfigError(f"strategy.schedule={spec.strategy.schedule} is not one of {', '.join(sch.SCHEDULES)}")
        check_layout(spec, cls.replicas_for(spec))

    @classmethod
    def replicas_for(cls, spec) -> list[int]:
        return uniform_replicas(spec)

    def train_step(self, x, y):
        self.build.module.train()
        run = self.executor.run(self.train_actions, x, y, training=True)
        self.step_stats.append({"compute_s": run.compute_s, "comm_s": run.comm_s, "idle_s": run.idle_s,
                                "events": run.events})
        return run.loss

    @torch.no_grad()
    def evaluate(self, x, y):
        self.build.module.eval()
        run = self.executor.run(self.eval_actions, x, y, training=False)
        return summed_eval(self.comm, (run.correct, run.count, run.loss_sum))

    def resident_tensors(self):
        yield from self.params
        yield from self.build.module.buffers()
        yield from optimizer_state_tensors(self.optimizer)

    def layout(self):
        return {"stage": self.plan.stage, "replica": self.plan.replica, "layers": list(self.build.layer_range),
                "boundaries": self.build.boundaries, "recompute": sorted(self.build.recompute),
                "replicas": list(self.plan.topo.replicas)}

    def owned_layers(self):
        return range(*self.build.layer_range)


class HippieStrategy(PipelineStrategy):
    name = "hippie"

    def __init__(self, spec, layers, ctx, comm):
        super().__init__(spec, layers, ctx, comm, uniform_replicas(spec))
