"""What every strategy trains with: the loss, how a batch is shared, the optimizer, the precision.

These rules are the same for every strategy and layout, which is what makes a
pipeline's parameters comparable with single-process training after a step.
"""

from __future__ import annotations

from typing import Iterable

import torch
import torch.nn.functional as F
from torch import nn

from harness.errors import ConfigError


def summed_loss(logits: torch.Tensor, y: torch.Tensor, global_batch: int) -> torch.Tensor:
    """Cross-entropy summed over the local samples and divided by the global batch.

    Summing these over any split of the batch (replicas, micro-batches) gives the
    global mean, so every layout computes the same gradient as one process. The loss is
    computed in fp32 whatever the logits' type (a bf16 run's head returns bf16).
    """
    return F.cross_entropy(logits.float(), y, reduction="sum") / global_batch


def eval_counts(logits: torch.Tensor, y: torch.Tensor) -> tuple[float, float, float]:
    """(correct, samples, cross-entropy sum) of one evaluated slice."""
    return (float((logits.argmax(-1) == y).sum()), float(y.numel()),
            float(F.cross_entropy(logits.float(), y, reduction="sum")))


def replica_slice(batch_size: int, replicas: int, replica: int) -> slice:
    """Contiguous share of a batch for one of ``replicas`` replicas.

    Replica r takes ``(B + r) // n`` samples (AshPipe's rule), which sums to B
    for any B >= n, so uneven batches are split without dropping samples.
    """
    start = sum((batch_size + r) // replicas for r in range(replica))
    return slice(start, start + (batch_size + replica) // replicas)


OPTIMIZERS = ("adamw", "sgd")
PRECISIONS = {"fp32": torch.float32, "bf16": torch.bfloat16}


class Autocast(nn.Module):
    """One layer run under ``torch.autocast`` to ``dtype``: mixed precision with the layer's
    fp32 weights as master weights (matrix products in bf16, reductions and norms in fp32).

    Per layer rather than around a whole step, so that it holds wherever the layer runs:
    in a library's worker thread (torchgpipe computes partitions there, and autocast is
    per thread), and when a checkpointed layer is recomputed in backward."""

    def __init__(self, layer: nn.Module, dtype: torch.dtype):
        super().__init__()
        self.layer, self.dtype = layer, dtype

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast(x.device.type, dtype=self.dtype):
            return self.layer(x)


def with_precision(layers: list[nn.Module], precision: str) -> list[nn.Module]:
    """``layers`` as they train in ``precision`` (fp32: unchanged; bf16: each under autocast).
    The wrappers hold the same parameter objects, so the layer list still names them."""
    if precision not in PRECISIONS:
        raise ConfigError(f"unknown train.precision '{precision}'; use {' or '.join(PRECISIONS)}")
    if precision == "fp32":
        return list(layers)
    return [Autocast(layer, PRECISIONS[precision]) for layer in layers]


def make_optimizer(params: Iterable[nn.Parameter], train) -> torch.optim.Optimizer:
    """The optimizer ``train`` (``optimizer``, ``lr``, ``weight_decay``, ``momentum``) names."""
    params = list(params)
    if train.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=train.lr, weight_decay=train.weight_decay)
    if train.optimizer == "sgd":
        return torch.optim.SGD(params, lr=train.lr, momentum=train.momentum, weight_decay=train.weight_decay)
    raise ConfigError(f"unknown train.optimizer '{train.optimizer}'; use {' or '.join(OPTIMIZERS)}")
