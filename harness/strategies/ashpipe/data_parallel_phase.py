"""Switch Parallelism's first phase: plain data parallelism, the DP baseline's own training
(:class:`harness.strategies.data_parallel.DataParallel`), plus what the switch rule needs.

The plateau rule decides from the job's loss at every step, which no single rank has:
each step's loss share is summed over the ranks by an asynchronous all-reduce started
after the step and read only at the next decision, so no step waits for it.
"""

from __future__ import annotations

import torch

from harness.strategies.data_parallel import DataParallel


class DataParallelPhase(DataParallel):
    def __init__(self, spec, layers, ctx, comm, global_losses: bool = False):
        """``global_losses``: sum each step's loss over the ranks (for the plateau rule)."""
        super().__init__(spec, layers, ctx, comm, bucket_mb=spec.strategy.bucket_mb)
        self.losses: list[float] = []  # the job's loss per step, when summed
        self._summing = global_losses
        self._pending_loss = None

    def train_step(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = super().train_step(x, y)
        if self._summing:  # summed in the background, read at the next decision
            total = loss.clone()
            self._pending_loss = (total, self.comm.all_reduce_async(total) if self.ctx.world_size > 1 else None)
        return loss

    def global_losses(self) -> list[float]:
        """The job's loss of every step so far (each rank's share summed over the ranks)."""
        if self._pending_loss is not None:
            total, work = self._pending_loss
            if work is not None:
                work.wait()
            self.losses.append(float(total))
            self._pending_loss = None
        return self.losses
