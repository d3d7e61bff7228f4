"""Data parallelism with torch.nn.parallel.DistributedDataParallel: the reference for speedup and ME."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from harness.metrics.meter import optimizer_state_tensors
from harness.planning.simulator import SimLayout
from harness.strategies.base import Strategy, summed_eval
from harness.core.training import clip_gradients, eval_counts, make_optimizer, replica_slice, summed_loss, with_precision


class DDPStrategy(Strategy):
    name = "dp"

    def __init__(self, spec, layers, ctx, comm):
        super().__init__(spec, layers, ctx, comm)
        self.model = nn.Sequential(*with_precision(layers, spec.train.precision)).to(ctx.device)
        # DDP broadcasts rank 0's parameters at construction; all ranks built them
        # from the same seed anyway, so this is a no-op kept for safety.
        self.ddp = DistributedDataParallel(
            self.model, device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None
        )
        self.optimizer = make_optimizer(self.model.parameters(), spec.train, spec.steps)
        self.share = replica_slice(spec.train.global_batch, ctx.world_size, ctx.rank)

    @classmethod
    def simulated(cls, spec, profile, cluster):
        # one stage of all workers; DDP's bucketed all-reduce overlaps the backward
        return SimLayout(spec.strategy.name, [spec.world_size], [], 1, "1f1b", set(), hides_allreduce=True)

    def train_step(self, x, y):
        B = self.spec.train.global_batch
        x, y = x[self.share], y[self.share]
        # DDP averages gradients over ranks; scaling by the world size turns the
        # average of per-rank sums/B into the global mean even for uneven shares.
        t = self.spec.train
        loss = summed_loss(self.ddp(x), y, B, t.label_smoothing) * self.ctx.world_size
        loss.backward()
        clip_gradients(self.model.parameters(), t.grad_clip_norm)  # DDP's averaged gradient: the whole model's
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return loss.detach() / self.ctx.world_size

    @torch.no_grad()
    def evaluate(self, x, y):
        share = replica_slice(x.shape[0], self.ctx.world_size, self.ctx.rank)
        return summed_eval(self.comm, eval_counts(self.model(x[share]), y[share]))

    def memory_parts(self):
        return {"parameters": list(self.model.parameters()), "optimizer_state": optimizer_state_tensors(self.optimizer)}

    def layout(self):
        return {"stage": 0, "replica": self.ctx.rank, "layers": [0, len(self.layers)]}
