"""Hippie (Ye et al., ICPP 2021): a data-paralleled synchronous pipeline on our runtime.

- Synchronous pipeline across stages, 1F1B with a flush each iteration
  (``strategy.schedule=gpipe`` gives fill-drain for comparison).
- Data parallelism inside each stage: ``world_size / stages`` replicas per stage.
- Hidden gradient communication: each stage's gradient all-reduce is bucketed
  and started asynchronously while the last backward of the iteration is still
  running (:class:`harness.runtime.executor.GradSync`); the optimizer waits only
  for it.
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
from harness.runtime import schedules
from harness.strategies.base import PipelineKeys, Strategy, summed_eval
from harness.strategies.layout import (check_layout, micro_batch_samples, refuse_unrunnable, simulated_pipeline,
                                      uniform_replicas)
from harness.strategies.pipeline import build_pipeline


@dataclass
class HippieConfig(PipelineKeys):
    recompute: Any = "auto"
    # gradient all-reduce bucket size (MiB) for the hidden communication
    bucket_mb: float = bounded(4.0, 0, above=True)


class HippieStrategy(Strategy):
    """A synchronous pipeline of this runtime: one stage per rank, its schedule, hidden all-reduce."""

    name = "hippie"
    Config = HippieConfig

    def __init__(self, spec, layers, ctx, comm):
        super().__init__(spec, layers, ctx, comm)
        pipe = build_pipeline(spec, layers, ctx, comm, uniform_replicas(spec))
        self.partition, self.build, self.plan = pipe.partition, pipe.build, pipe.plan
        self.params, self.optimizer, self.executor = pipe.params, pipe.optimizer, pipe.executor
        S, m = self.plan.topo.num_stages, pipe.layout.micro_batches
        kind = schedules.get(spec.strategy.schedule)
        self.train_actions = kind.lists(S, 1, m)[self.plan.stage]
        self.eval_actions = kind.forward_only(S, 1, m)[self.plan.stage]

    @classmethod
    def check(cls, spec) -> None:
        name, replicas = spec.strategy.schedule, uniform_replicas(spec)
        ours = schedules.names(ours=True)
        if name not in ours:
            raise ConfigError(f"strategy.schedule={name} is not one of {', '.join(ours)} (the synchronous schedules "
                              "of our runtime)")
        check_layout(spec, replicas)
        refuse_unrunnable(schedules.get(name), len(replicas), 1, spec.train.micro_batches)

    @classmethod
    def samples_per_forward(cls, spec) -> int:
        return micro_batch_samples(spec)

    @classmethod
    def variant(cls, spec) -> str:
        st = spec.strategy
        parts = [f"recompute={st.recompute}"] if st.recompute not in ("none", None) else []
        return ", ".join(parts + ([st.schedule] if st.schedule != "1f1b" else []))

    @classmethod
    def simulated(cls, spec, profile, cluster):
        return simulated_pipeline(spec, profile, uniform_replicas(spec), spec.strategy.schedule,
                                  hides_allreduce=True, recompute_rule=spec.strategy.recompute)

    def train_step(self, x, y):
        self.build.module.train()
        run = self.executor.run(self.train_actions, x, y, training=True)
        self.step_stats.append({"compute_s": run.compute_s, "comm_s": run.comm_s, "idle_s": run.idle_s,
                                "events": run.events, "allreduce": run.allreduce})
        return run.loss

    @torch.no_grad()
    def evaluate(self, x, y):
        self.build.module.eval()
        run = self.executor.run(self.eval_actions, x, y, training=False)
        return summed_eval(self.comm, (run.correct, run.count, run.loss_sum))

    def memory_parts(self):
        return {"parameters": self.params, "optimizer_state": optimizer_state_tensors(self.optimizer)}

    def layout(self):
        return {"stage": self.plan.stage, "replica": self.plan.replica, "layers": list(self.build.layer_range),
                "boundaries": self.partition.boundaries, "recompute": sorted(self.build.recompute),
                "replicas": list(self.plan.topo.replicas)}

    def recomputed_layers(self):
        return {i: 1 / self.plan.topo.replicas[self.plan.stage] for i in self.build.recompute}

    def owned_layers(self):
        return range(*self.build.layer_range)
