"""The one interface every training strategy implements, ours and the baselines.

A strategy is built on every rank from the model's layer list and the run
spec, then driven by :mod:`harness.worker` one global batch at a time. It owns
how the batch is split, where layers live, how gradients are combined and
when the optimizer steps; the worker owns timing, memory measurement, data
order and evaluation bookkeeping, so those are identical for all strategies.
"""

from __future__ import annotations

import contextlib
import importlib
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable

import torch
import torch.nn.functional as F
from torch import nn

from harness.errors import ConfigError

if TYPE_CHECKING:
    from harness.comm import Comm, DistContext
    from harness.spec import RunSpec

# strategy name -> "module:Class", imported only when used (baselines pull in heavy libraries)
REGISTRY: dict[str, str] = {
    "dp": "baselines.ddp:DDPStrategy",
    "hippie": "harness.hippie:HippieStrategy",
    "pipelining": "baselines.pipelining:PipeliningStrategy",
    "deepspeed": "baselines.deepspeed_pipe:DeepSpeedPipeStrategy",
    "gpipe": "baselines.gpipe:GPipeStrategy",
    "ashpipe": "harness.ashpipe:AshPipeStrategy",
}


@dataclass
class EvalResult:
    correct: int
    count: int
    loss_sum: float


class Strategy(ABC):
    """Base class. Subclasses implement the abstract methods; see each docstring."""

    name: str = ""

    def __init__(self, spec: "RunSpec", layers: list[nn.Module], ctx: "DistContext", comm: "Comm"):
        self.spec, self.ctx, self.comm = spec, ctx, comm
        self.layers = layers
        # per train_step: where this rank's time went ({compute_s, comm_s, idle_s, events});
        # strategies that cannot split their time leave it empty
        self.step_stats: list[dict] = []

    @classmethod
    def check(cls, spec: "RunSpec") -> None:
        """Refuse a spec this strategy cannot run (raise ConfigError); runs before launch."""

    @classmethod
    def processes(cls, spec: "RunSpec") -> int:
        """Worker processes to start: one per device, unless one process drives several (GPipe)."""
        return spec.world_size

    @abstractmethod
    def train_step(self, x: torch.Tensor, y: torch.Tensor) -> float:
        """One optimizer step on the global batch ``(x, y)`` (every rank gets all of it).

        Returns this rank's share of the global mean loss: the shares of all ranks
        sum to it (ranks that compute no loss return 0). Summing happens once at
        the end of the run, so no step pays for an extra collective.
        Gradients must be released (``set_to_none``) before returning, so that
        only resident state is live between steps.
        """

    @abstractmethod
    def evaluate(self, x: torch.Tensor, y: torch.Tensor) -> EvalResult:
        """Forward-only pass on a global batch; the totals must be valid on rank 0."""

    @abstractmethod
    def resident_tensors(self) -> Iterable[torch.Tensor]:
        """Tensors this rank holds between steps (parameters, optimizer state, stashes, buffers)."""

    def resident_extra_bytes(self) -> int:
        """Bytes held between steps that are known only as a count (activations saved for the
        backward of minibatches still in flight)."""
        return 0

    def start_step(self) -> int:
        """The step to start from (non-zero when resuming from a checkpoint)."""
        return 0

    def finish_training(self) -> None:
        """Called once after the last step, before evaluation (an asynchronous pipeline drains here)."""

    def memory_step_context(self):
        """Context for the one step whose memory is measured (see harness.metrics)."""
        return contextlib.nullcontext()

    def extra_metrics(self) -> dict:
        """Strategy-specific per-rank figures for the record (e.g. time split, events)."""
        return {}

    def layout(self) -> dict:
        """What this rank runs (stage, replica, layers), for the record."""
        return {}

    def owned_layers(self) -> range:
        """Indices of the layers whose parameters this rank holds (all, unless a pipeline stage)."""
        return range(len(self.layers))

    def state_dict_for_check(self) -> dict[str, torch.Tensor]:
        """Copies of this rank's parameters keyed by their name in the full layer list."""
        return {k: v.detach().cpu().clone() for k, v in named_parameters(self.layers, self.owned_layers()).items()}

    def checkpoint_state(self) -> dict:
        """What this rank needs to continue training exactly: its parameters and optimizer state."""
        return {"layers": list(self.owned_layers()), "params": self.state_dict_for_check(),
                "optimizer": self.optimizer.state_dict()}

    def load_checkpoint_state(self, state: dict) -> None:
        if state["layers"] != list(self.owned_layers()):
            raise ConfigError(f"the checkpoint holds layers {state['layers'][0]}..{state['layers'][-1]} but this rank "
                              f"owns {self.owned_layers().start}..{self.owned_layers().stop - 1}; resume with the same "
                              "strategy, world size and stage boundaries")
        params = named_parameters(self.layers, self.owned_layers())
        with torch.no_grad():
            for k, v in state["params"].items():
                params[k].copy_(v)
        self.optimizer.load_state_dict(state["optimizer"])


def eval_counts(logits: torch.Tensor, y: torch.Tensor) -> tuple[float, float, float]:
    """(correct, samples, cross-entropy sum) of one evaluated slice."""
    return (float((logits.argmax(-1) == y).sum()), float(y.numel()),
            float(F.cross_entropy(logits.float(), y, reduction="sum")))


def summed_eval(comm: "Comm", counts: tuple[float, float, float]) -> EvalResult:
    """Sum every rank's evaluation counts (ranks that saw no samples pass zeros)."""
    stats = torch.tensor(counts, dtype=torch.float64, device=comm.ctx.device)
    comm.all_reduce(stats)
    return EvalResult(int(stats[0]), int(stats[1]), float(stats[2]))


def make_optimizer(params: Iterable[nn.Parameter], spec: "RunSpec") -> torch.optim.Optimizer:
    t = spec.train
    params = list(params)
    if t.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=t.lr, weight_decay=t.weight_decay)
    if t.optimizer == "sgd":
        return torch.optim.SGD(params, lr=t.lr, momentum=t.momentum, weight_decay=t.weight_decay)
    raise ConfigError(f"unknown train.optimizer '{t.optimizer}'; use adamw or sgd")


def summed_loss(logits: torch.Tensor, y: torch.Tensor, global_batch: int) -> torch.Tensor:
    """Cross-entropy summed over the local samples and divided by the global batch.

    Summing these over any split of the batch (replicas, micro-batches) gives the
    global mean, so every layout computes the same gradient as one process.
    """
    return F.cross_entropy(logits, y, reduction="sum") / global_batch


def named_parameters(layers: list[nn.Module], indices: Iterable[int]) -> dict[str, nn.Parameter]:
    """Parameters of the given layers keyed ``"<layer index>.<name>"`` (stable across layouts)."""
    return {f"{i}.{n}": p for i in indices for n, p in layers[i].named_parameters()}


def strategy_class(name: str) -> type[Strategy]:
    if name not in REGISTRY:
        raise ConfigError(f"unknown strategy '{name}'; choose one of: {', '.join(sorted(REGISTRY))}")
    module, cls = REGISTRY[name].split(":")
    return getattr(importlib.import_module(module), cls)
