"""Data parallelism with torch.nn.parallel.DistributedDataParallel: the reference for speedup and ME.

The training itself is :class:`harness.strategies.data_parallel.DataParallel`, which AshPipe's
data-parallel phase runs too.
"""

from __future__ import annotations

from harness.planning.simulator import SimLayout
from harness.strategies.base import Strategy
from harness.strategies.data_parallel import DataParallel


class DDPStrategy(Strategy):
    name = "dp"

    def __init__(self, spec, layers, ctx, comm):
        super().__init__(spec, layers, ctx, comm)
        self.dp = DataParallel(spec, layers, ctx, comm)
        self.optimizer = self.dp.optimizer

    @classmethod
    def simulated(cls, spec, profile, cluster):
        # one stage of all workers; DDP's bucketed all-reduce overlaps the backward
        return SimLayout(spec.strategy.name, [spec.world_size], [], 1, "1f1b", set(), hides_allreduce=True)

    def train_step(self, x, y):
        return self.dp.train_step(x, y)

    def evaluate(self, x, y):
        return self.dp.evaluate(x, y)

    def memory_parts(self):
        return self.dp.memory_parts()

    def layout(self):
        return {"stage": 0, "replica": self.ctx.rank, "layers": [0, len(self.layers)]}
