"""Data parallelism over every rank, with torch's DistributedDataParallel: the DP baseline
(:mod:`baselines.ddp`) and AshPipe's data-parallel phase before its switch run this one class.

Every rank holds the whole model and takes its share of the global batch by AshPipe's rule
(``(B + r) // n``); DDP all-reduces the gradients in buckets under the backward and
averages them, so each rank's loss is its samples' cross-entropy sum over B times the
world size: the average of those is the global mean's gradient, even for uneven shares.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from harness.core.training import (
    clip_gradients,
    eval_counts,
    make_optimizer,
    replica_slice,
    summed_loss,
    with_precision,
)
from harness.metrics.meter import optimizer_state_tensors
from harness.strategies.base import EvalResult, summed_eval


class DataParallel:
    def __init__(self, spec, layers: list[nn.Module], ctx, comm, bucket_mb: float | None = None):
        """``bucket_mb``: DDP's bucket size (None: DDP's default, 25 MiB)."""
        self.spec, self.ctx, self.comm = spec, ctx, comm
        self.model = nn.Sequential(*with_precision(layers, spec.train.precision)).to(ctx.device)
        # DDP broadcasts rank 0's parameters at construction; every rank built them from the same
        # seed anyway, so this is a no-op kept for safety
        buckets = {} if bucket_mb is None else {"bucket_cap_mb": bucket_mb}
        self.ddp = DistributedDataParallel(
            self.model, device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None, **buckets
        )
        self.params = list(self.model.parameters())
        self.optimizer = make_optimizer(self.params, spec.train, spec.steps)
        self.share = replica_slice(spec.train.global_batch, ctx.world_size, ctx.rank)

    def train_step(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """One step on the global batch; returns this rank's share of the global mean loss (on the device)."""
        t = self.spec.train
        self.model.train()
        x, y = x[self.share], y[self.share]
        loss = summed_loss(self.ddp(x), y, t.global_batch, t.label_smoothing) * self.ctx.world_size
        loss.backward()
        clip_gradients(self.params, t.grad_clip_norm)  # DDP's averaged gradient: the whole model's
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return loss.detach() / self.ctx.world_size

    @torch.no_grad()
    def evaluate(self, x: torch.Tensor, y: torch.Tensor) -> EvalResult:
        self.model.eval()
        share = replica_slice(x.shape[0], self.ctx.world_size, self.ctx.rank)
        return summed_eval(self.comm, eval_counts(self.model(x[share]), y[share]))

    def memory_parts(self) -> dict:
        return {"parameters": self.params, "optimizer_state": optimizer_state_tensors(self.optimizer)}

    def close(self) -> None:
        """Stop DDP's gradient hooks and free its buckets: the parameters outlive it (AshPipe's
        switch hands them to pipeline stages, which reduce their own gradients)."""
        self.ddp._remove_autograd_hooks()
        del self.ddp
        for p in self.params:
            p.grad = None
