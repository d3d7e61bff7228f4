"""GPipe as torchgpipe 0.0.7 runs it: one process driving ``world_size`` devices.

``torchgpipe.GPipe(nn.Sequential(layers), balance, devices, chunks=m,
checkpoint=strategy.checkpoint)`` with the balance taken from the same stage
boundaries as our runtime. The harness starts a single worker for it
(:meth:`GPipeStrategy.processes`), which uses ``cuda:0..N-1`` on GPU. On CPU
every "device" is the same CPU and torchgpipe serves all partitions from one
worker thread, so it measures correctness and memory there, not parallel
speed. torchgpipe cannot run under DDP, so it has no data parallelism.
"""

from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass
from queue import Queue
from typing import Optional

import torch
import torchgpipe.pipeline
from torch import nn
from torchgpipe import GPipe

from harness.core.errors import ConfigError
from harness.core.models import num_layers
from harness.core.options import bounded, choice
from harness.core.training import clip_gradients, eval_counts, make_optimizer, mean_loss, with_precision
from harness.metrics.meter import optimizer_state_tensors, stage_annotation
from harness.runtime import actions as sch
from harness.runtime.partition import stage_ranges
from harness.strategies.base import EvalResult, Strategy, StrategyConfig
from harness.strategies.layout import check_layout, resolve_boundaries, simulated_pipeline

_CHECKPOINT_MODES = ("always", "except_last", "never")


@dataclass
class GPipeConfig(StrategyConfig):
    # one partition per device; unset: world_size (the only value torchgpipe can run)
    stages: Optional[int] = bounded(None, 1)
    boundaries: Optional[list[int]] = None  # first layer of partitions 1..S-1; unset: balanced on measured cost
    # torchgpipe's recomputation: always | except_last | never
    checkpoint: str = choice("except_last", *_CHECKPOINT_MODES)
    # GPUs the partitions are spread over, partition i on cuda:(i mod devices); unset: one per
    # partition. Fewer than the partitions (devices=1 puts them all on one GPU) checks the path on
    # a single GPU; it measures no pipeline parallelism.
    devices: Optional[int] = bounded(None, 1)


class GPipeStrategy(Strategy):
    name = "gpipe"
    Config = GPipeConfig

    @classmethod
    def processes(cls, spec) -> int:
        return 1

    @classmethod
    def complete(cls, spec) -> None:
        if spec.strategy.stages is None:
            spec.strategy.stages = spec.world_size

    @classmethod
    def check(cls, spec) -> None:
        stages = spec.strategy.stages
        if stages != spec.world_size:
            raise ConfigError(
                f"strategy=gpipe places one partition per device: strategy.stages={stages} must equal "
                f"world_size={spec.world_size} (torchgpipe has no data parallelism)"
            )
        check_layout(spec, [1] * stages)
        if spec.strategy.devices is not None and spec.strategy.devices > stages:
            raise ConfigError(f"strategy.devices={spec.strategy.devices} must be between 1 and the {stages} partitions")

    @classmethod
    def gpus(cls, spec) -> int:
        return spec.strategy.devices or spec.world_size

    @classmethod
    def samples_per_forward(cls, spec) -> int:
        return max(1, spec.train.global_batch // spec.train.micro_batches)

    @classmethod
    def variant(cls, spec) -> str:
        return f"checkpoint={spec.strategy.checkpoint}" if spec.strategy.checkpoint != "except_last" else ""

    @classmethod
    def simulated(cls, spec, profile, cluster):
        # fill-drain, one partition per device, no data parallelism (torchgpipe's recomputation not modelled)
        return simulated_pipeline(spec, profile, [1] * spec.world_size, "gpipe", hides_allreduce=False)

    def __init__(self, spec, layers, ctx, comm):
        super().__init__(spec, layers, ctx, comm)
        S = spec.strategy.stages
        # the shared rule: one partition per sweep, measured at the micro-batch size (one replica)
        self.partition = resolve_boundaries(spec, layers, ctx, comm, [1] * S)
        boundaries = self.partition.boundaries
        balance = [hi - lo for lo, hi in stage_ranges(boundaries, num_layers(spec.model))]
        if ctx.device.type == "cuda":
            devices = [torch.device("cuda", i % (spec.strategy.devices or S)) for i in range(S)]
        else:
            devices = [torch.device("cpu")] * S
        self.devices = devices
        self.model = GPipe(
            nn.Sequential(*with_precision(layers, spec.train.precision)),
            balance=balance,
            devices=devices,
            chunks=spec.train.micro_batches,
            checkpoint=spec.strategy.checkpoint,
        )
        self.optimizer = make_optimizer(self.model.parameters(), spec.train, spec.steps)

    def train_step(self, x, y):
        self.model.train()
        out = self.model(x.to(self.devices[0]))
        t = self.spec.train
        loss = mean_loss(out, y.to(out.device), t.label_smoothing)
        loss.backward()
        clip_gradients(self.model.parameters(), t.grad_clip_norm)  # one process holds the whole model
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if self.devices[0].type == "cuda":  # the step's end mark (on the first GPU) comes after every GPU's work
            first = torch.cuda.current_stream(self.devices[0])
            for device in set(self.devices[1:]) - {self.devices[0]}:
                first.wait_stream(torch.cuda.current_stream(device))
        return loss.detach()

    @torch.no_grad()
    def evaluate(self, x, y):
        self.model.eval()
        out = self.model(x.to(self.devices[0]))
        correct, count, loss_sum = eval_counts(out, y.to(out.device))
        return EvalResult(int(correct), int(count), loss_sum)

    def memory_parts(self):
        return {"parameters": list(self.model.parameters()), "optimizer_state": optimizer_state_tensors(self.optimizer)}

    def memory_step_context(self):
        """The profiled step: each partition's forward runs inside its stage's span, so that each
        partition's (device's) work and idle are measured apart (harness.metrics.meter.compute_spans),
        and on CPU torchgpipe's one worker thread runs inline.

        The profiler records CPU allocations of the profiling thread only, and
        torchgpipe computes forwards in a worker thread. On CPU all partitions
        share that single thread and the caller waits on it at every clock
        cycle, so running its tasks inline does the same work in the same
        order, visible to the measurement. Timed steps keep the real threads.
        """
        stack = contextlib.ExitStack()
        for j, partition in enumerate(self.model.partitions):
            stack.enter_context(_annotated(partition, stage_annotation(j)))
        if self.ctx.device.type == "cpu":
            stack.enter_context(_patched(torchgpipe.pipeline, "spawn_workers", _inline_workers))
        return stack

    @classmethod
    def replayed_schedule(cls, spec, stages: int):
        return sch.gpipe(stages, spec.train.micro_batches), None

    def recomputed_layers(self):
        # torchgpipe checkpoints every partition's micro-batches: all of them, or all but the last
        m = self.spec.train.micro_batches
        share = {"always": 1.0, "except_last": (m - 1) / m, "never": 0.0}[self.spec.strategy.checkpoint]
        return {i: share for i in range(len(self.layers))} if share else {}

    def layout(self):
        return {"stage": "all", "devices": [str(d) for d in self.devices], "boundaries": self.partition.boundaries}


class _InlineQueue:
    """Stands in for a worker's input queue: computes each task as it is put."""

    def __init__(self, out_queue: Queue):
        self.out_queue = out_queue

    def put(self, task) -> None:
        if task is None:
            return
        try:
            batch = task.compute()
        except Exception:
            self.out_queue.put((False, sys.exc_info()))
            return
        self.out_queue.put((True, (task, batch)))


@contextlib.contextmanager
def _inline_workers(devices):
    out_queues = [Queue() for _ in devices]
    yield [_InlineQueue(q) for q in out_queues], out_queues


@contextlib.contextmanager
def _annotated(module: nn.Module, name: str):
    """Every forward of ``module`` (recomputations included) inside a profiler span ``name``."""
    open_spans = []

    def enter(_module, _args):
        span = torch.autograd.profiler.record_function(name)
        span.__enter__()
        open_spans.append(span)

    def leave(_module, _args, _output):
        open_spans.pop().__exit__(None, None, None)

    hooks = [module.register_forward_pre_hook(enter), module.register_forward_hook(leave)]
    try:
        yield
    finally:
        for hook in hooks:
            hook.remove()


@contextlib.contextmanager
def _patched(module, name, value):
    original = getattr(module, name)
    setattr(module, name, value)
    try:
        yield
    finally:
        setattr(module, name, original)
