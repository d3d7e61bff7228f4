"""PyTorch's own pipeline: torch.distributed.pipelining, as its users run it.

``PipelineStage`` over the same layer list and stage boundaries as our runtime,
``ScheduleGPipe`` or ``Schedule1F1B`` (``strategy.schedule``), and data
parallelism across pipeline replicas: with ``world_size = stages * n`` there
are n pipelines, each stage module wrapped in DDP over its n replicas
(pipelining runs DDP's ``no_sync`` for all but the last backward). Each
pipeline takes ``B / n`` samples in ``m`` equal micro-batches; the loss is the
micro-batch mean and the schedule divides gradients by m, so one step equals
single-process training on the global batch.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
from torch.nn.parallel import DistributedDataParallel

from harness.comm import new_group
from harness.errors import ConfigError
from harness.metrics import optimizer_state_tensors
from harness.runtime.partition import stage_ranges
from harness.runtime.topology import Topology
from harness.strategies.base import PipelineKeys, Strategy, summed_eval
from harness.strategies.layout import check_layout, resolve_boundaries, simulated_pipeline, uniform_replicas
from harness.training import PRECISIONS, eval_counts, make_optimizer, with_precision

_SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}


class PipeliningStrategy(Strategy):
    name = "pipelining"
    Config = PipelineKeys

    @classmethod
    def check(cls, spec) -> None:
        if spec.strategy.schedule not in _SCHEDULES:
            raise ConfigError(f"strategy.schedule={spec.strategy.schedule} is not one of {', '.join(_SCHEDULES)}")
        replicas = uniform_replicas(spec)
        check_layout(spec, replicas)
        n, m, B = replicas[0], spec.train.micro_batches, spec.train.global_batch
        if B % (n * m):
            raise ConfigError(
                f"torch.distributed.pipelining needs equal micro-batches: train.global_batch={B} must be divisible by "
                f"{n} pipeline replica(s) x {m} micro-batches; use a multiple of {n * m}"
            )
        if m < len(replicas):
            raise ConfigError(f"torch.distributed.pipelining's schedules need at least one micro-batch per stage: "
                              f"train.micro_batches={m} with {len(replicas)} stages; set train.micro_batches>={len(replicas)}")
        if spec.strategy.recompute not in ("none", None):
            raise ConfigError("strategy=pipelining has no recomputation in this harness; set strategy.recompute=none")

    def __init__(self, spec, layers, ctx, comm):
        super().__init__(spec, layers, ctx, comm)
        replicas = uniform_replicas(spec)
        topo = Topology(tuple(replicas))
        S, n = topo.num_stages, replicas[0]
        self.stage, self.replica = topo.stage_of(ctx.rank), topo.replica_of(ctx.rank)
        self.n_replicas, self.num_stages = n, S

        self.partition = resolve_boundaries(spec, layers, ctx, comm, replicas)
        ranges = stage_ranges(self.partition.boundaries, len(layers))
        self.layer_range = ranges[self.stage]
        # all ranks create all groups, in the same order
        pipe_groups = [new_group([s * n + j for s in range(S)], ctx.timeout) for j in range(n)]
        dp_groups = [new_group(topo.ranks_of(s), ctx.timeout) for s in range(S)]

        lo, hi = self.layer_range
        stage_layers = with_precision(layers[lo:hi], spec.train.precision)
        if spec.train.precision != "fp32":  # cross stages in the run's precision, compute from fp32, as ours
            if self.stage > 0:
                stage_layers.insert(0, _Cast(torch.float32))
            if self.stage < S - 1:
                stage_layers.append(_Cast(PRECISIONS[spec.train.precision]))
        self.module = nn.Sequential(*stage_layers).to(ctx.device)
        submodule = self.module
        if n > 1:
            submodule = DistributedDataParallel(self.module, process_group=dp_groups[self.stage],
                                                device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None)
        self.optimizer = make_optimizer(self.module.parameters(), spec.train)

        m = spec.train.micro_batches
        self.local_batch = spec.train.global_batch // n
        # shapes are inferred by pipelining on the first (untimed) step, as its users run it
        self.pipe_stage = PipelineStage(submodule, self.stage, S, ctx.device, group=pipe_groups[self.replica])
        self.schedule = _SCHEDULES[spec.strategy.schedule](self.pipe_stage, n_microbatches=m, loss_fn=self._loss)

    @classmethod
    def samples_per_forward(cls, spec) -> int:
        return max(1, spec.train.global_batch // spec.train.micro_batches // uniform_replicas(spec)[0])

    @classmethod
    def variant(cls, spec) -> str:
        return spec.strategy.schedule if spec.strategy.schedule != "1f1b" else ""

    @classmethod
    def simulated(cls, spec, profile, cluster):
        # DDP across pipeline replicas overlaps the all-reduce with the last backward
        return simulated_pipeline(spec, profile, uniform_replicas(spec), spec.strategy.schedule, hides_allreduce=True)

    @staticmethod
    def _loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(output.float(), target)

    def _share(self, x, y):
        lo = self.replica * self.local_batch
        return x[lo : lo + self.local_batch], y[lo : lo + self.local_batch]

    def _call(self, fn, x, y, losses):
        first, last = self.stage == 0, self.stage == self.num_stages - 1
        args = (x,) if first else ()
        kwargs = {"target": y, "losses": losses} if last else {}
        return fn(*args, **kwargs)

    def train_step(self, x, y):
        self.module.train()
        x, y = self._share(x, y)
        losses: list[torch.Tensor] = []
        self._call(self.schedule.step, x, y, losses)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if not losses:
            return 0.0
        return torch.stack([l.detach() for l in losses]).mean() / self.n_replicas

    @torch.no_grad()
    def evaluate(self, x, y):
        self.module.eval()
        x, y = self._share(x, y)
        losses: list[torch.Tensor] = []
        out = self._call(self.schedule.eval, x, y, losses)
        last = self.stage == self.num_stages - 1
        return summed_eval(self.comm, eval_counts(out, y) if last else (0.0, 0.0, 0.0))

    def memory_parts(self):
        return {"parameters": list(self.module.parameters()), "optimizer_state": optimizer_state_tensors(self.optimizer)}

    def layout(self):
        return {"stage": self.stage, "replica": self.replica, "layers": list(self.layer_range)}

    def owned_layers(self):
        return range(*self.layer_range)


class _Cast(nn.Module):
    """The stage's output in the type it crosses to the next stage in (a no-op in fp32)."""

    def __init__(self, dtype: torch.dtype):
        super().__init__()
        self.dtype = dtype

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.to(self.dtype)
