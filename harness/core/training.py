"""What every strategy trains with: the loss, how a batch is shared, the optimizer, the precision.

These rules are the same for every strategy and layout, which is what makes a
pipeline's parameters comparable with single-process training after a step.
"""

from __future__ import annotations

import math
from typing import Callable, Iterable

import torch
import torch.nn.functional as F
from torch import nn

from harness.core.errors import ConfigError


def summed_loss(logits: torch.Tensor, y: torch.Tensor, global_batch: int, label_smoothing: float = 0.0) -> torch.Tensor:
    """Cross-entropy (with ``train.label_smoothing``) summed over the local samples and divided by
    the global batch.

    Summing these over any split of the batch (replicas, micro-batches) gives the
    global mean, so every layout computes the same gradient as one process. The loss is
    computed in fp32 whatever the logits' type (a bf16 run's head returns bf16).
    """
    return F.cross_entropy(logits.float(), y, reduction="sum", label_smoothing=label_smoothing) / global_batch


def mean_loss(logits: torch.Tensor, y: torch.Tensor, label_smoothing: float = 0.0) -> torch.Tensor:
    """The same loss as a mean over the samples given, for the libraries that average over their
    micro-batches themselves (torch pipelining, torchgpipe, DeepSpeed)."""
    return F.cross_entropy(logits.float(), y, label_smoothing=label_smoothing)


def eval_counts(logits: torch.Tensor, y: torch.Tensor) -> tuple[float, float, float]:
    """(correct, samples, cross-entropy sum) of one evaluated slice."""
    return (
        float((logits.argmax(-1) == y).sum()),
        float(y.numel()),
        float(F.cross_entropy(logits.float(), y, reduction="sum")),
    )


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


def make_optimizer(
    params: Iterable[nn.Parameter], train, steps: int | None = None, lr_scale: Callable[[int], float] | None = None
) -> torch.optim.Optimizer:
    """The optimizer ``train`` names (``optimizer``, ``lr``, ``weight_decay``, ``adam_eps``, ``momentum``,
    ``nesterov``), with its learning-rate schedule attached (:func:`attach_schedule`) for a run of
    ``steps`` optimizer steps; ``lr_scale(k)`` multiplies the schedule's rate at step k (an
    asynchronous stage's correction for its delay, :func:`delay_lr_scale`)."""
    params = list(params)
    if train.optimizer == "adamw":
        optimizer = torch.optim.AdamW(params, lr=train.lr, weight_decay=train.weight_decay, eps=train.adam_eps)
    elif train.optimizer == "sgd":
        optimizer = torch.optim.SGD(
            params, lr=train.lr, momentum=train.momentum, weight_decay=train.weight_decay, nesterov=train.nesterov
        )
    else:
        raise ConfigError(f"unknown train.optimizer '{train.optimizer}'; use {' or '.join(OPTIMIZERS)}")
    return attach_schedule(optimizer, train, steps, lr_scale)


LR_SCHEDULES = ("constant", "cosine", "step")


def lr_factor(train, steps: int | None):
    """The learning rate, as a multiple of ``train.lr``, after k optimizer steps: a linear warm-up
    over ``train.lr_warmup_steps``, then constant, a cosine down to ``train.lr_min_ratio`` at step
    ``steps``, or a step decay by ``train.lr_decay_factor`` every ``train.lr_decay_steps``."""
    warmup, schedule = train.lr_warmup_steps, train.lr_schedule

    def factor(k: int) -> float:
        if k < warmup:
            return (k + 1) / warmup
        if schedule == "cosine":
            progress = min(1.0, (k - warmup) / max(1, (steps or 1) - warmup))
            return train.lr_min_ratio + (1 - train.lr_min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))
        if schedule == "step":
            return train.lr_decay_factor ** ((k - warmup) // train.lr_decay_steps)
        return 1.0

    return factor


def attach_schedule(
    optimizer: torch.optim.Optimizer, train, steps: int | None, lr_scale: Callable[[int], float] | None = None
) -> torch.optim.Optimizer:
    """Step ``optimizer``'s learning-rate schedule with every one of its steps (so each AshPipe stage
    follows the same function of its own minibatch count), and carry the schedule's position in the
    optimizer's state dict, so every checkpoint resumes it. Nothing is attached for a constant rate
    without ``lr_scale``."""
    if train.lr_schedule == "constant" and not train.lr_warmup_steps and lr_scale is None:
        return optimizer
    factor = lr_factor(train, steps)
    scaled = factor if lr_scale is None else (lambda k: factor(k) * lr_scale(k))
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, scaled)
    optimizer.register_step_post_hook(lambda *_: schedule.step())
    optimizer.lr_schedule = schedule  # for carry_schedule

    def save(_optimizer, state: dict) -> dict:
        return {**state, "lr_schedule": schedule.state_dict()}

    def load(_optimizer, state: dict) -> dict:
        state = dict(state)
        if "lr_schedule" in state:
            schedule.load_state_dict(state.pop("lr_schedule"))
        return state

    optimizer.register_state_dict_post_hook(save)
    optimizer.register_load_state_dict_pre_hook(load)
    return optimizer


def carry_schedule(optimizer: torch.optim.Optimizer, steps_done: int) -> None:
    """Start ``optimizer``'s learning-rate schedule at its position after ``steps_done`` steps
    (Switch Parallelism's stage optimizers take over where the data-parallel one stopped)."""
    schedule = getattr(optimizer, "lr_schedule", None)
    if schedule is None:
        return
    schedule.last_epoch = steps_done
    for group, base, rate in zip(optimizer.param_groups, schedule.base_lrs, schedule.lr_lambdas):
        group["lr"] = base * rate(steps_done)
    schedule._last_lr = [group["lr"] for group in optimizer.param_groups]


def delay_lr_scale(delay: int, start: Callable[[], int], anneal_steps: int) -> Callable[[int], float]:
    """PipeMare's learning-rate rescheduling for a stage whose gradients arrive ``delay`` updates late:
    at its k-th optimizer step the rate is divided by ``delay ** p``, with p falling linearly from 1
    at the stage's first asynchronous step (``start()``) to 0 ``anneal_steps`` later."""

    def scale(k: int) -> float:
        if delay <= 1:
            return 1.0
        p = 1.0 - min(1.0, max(0, k - start()) / anneal_steps)
        return delay**-p

    return scale


@torch.no_grad()
def predict_weights_(
    weights: list[torch.Tensor], masters: list[nn.Parameter], optimizer: torch.optim.Optimizer, delay: int
) -> None:
    """Weight prediction for a forward whose gradient will be applied ``delay`` updates later:
    ``weights`` (a copy of ``masters``) moved ``delay`` steps along the optimizer's current update,
    at its current rate. For momentum SGD the update is the momentum buffer (SpecTrain, Chen et al.
    2018; with Nesterov too, the buffer stands for the next gradient's term); for AdamW it is
    Adam's bias-corrected m / (sqrt(v) + eps) plus the decoupled weight decay (XPipe, Guan et al.
    2019). Before the optimizer's first step there is no direction and nothing moves."""
    states = [optimizer.state.get(p) for p in masters]
    if delay <= 0 or not states or not all(states):
        return
    group = optimizer.param_groups[0]  # make_optimizer builds one group
    lr = group["lr"]
    if isinstance(optimizer, torch.optim.SGD):
        torch._foreach_add_(weights, [s["momentum_buffer"] for s in states], alpha=-delay * lr)
    elif isinstance(optimizer, torch.optim.AdamW):
        beta1, beta2 = group["betas"]
        step = float(states[0]["step"])  # a CPU tensor for torch's default (not capturable) AdamW
        denom = torch._foreach_sqrt([s["exp_avg_sq"] for s in states])
        torch._foreach_div_(denom, math.sqrt(1 - beta2**step))
        torch._foreach_add_(denom, group["eps"])
        if group["weight_decay"]:
            torch._foreach_mul_(weights, 1 - delay * lr * group["weight_decay"])
        torch._foreach_addcdiv_(weights, [s["exp_avg"] for s in states], denom, value=-delay * lr / (1 - beta1**step))
    else:
        raise ConfigError(f"weight prediction knows SGD and AdamW, not {type(optimizer).__name__}")


def clip_gradients(params: Iterable[nn.Parameter], max_norm: float, all_reduce=None, weight: float = 1.0) -> None:
    """Scale the gradients so that the whole model's gradient norm is at most ``max_norm`` (0: off).

    A rank that holds part of the model passes ``all_reduce`` (a sum over the job's ranks) and
    ``weight``, 1 / the number of ranks holding the same gradients (a stage's replicas), so the sum
    of every rank's weighted squared norm is the whole model's; every rank then applies the same
    coefficient, as one process clipping the whole model would."""
    if not max_norm:
        return
    grads = [p.grad for p in params if p.grad is not None]
    device = grads[0].device if grads else torch.device("cpu")
    squared = torch.stack([g.float().pow(2).sum() for g in grads]).sum() if grads else torch.zeros((), device=device)
    squared = squared * weight
    if all_reduce is not None:
        squared = all_reduce(squared.reshape(1)).reshape(())
    coefficient = torch.clamp(max_norm / (squared.sqrt() + 1e-6), max=1.0)
    for g in grads:
        g.mul_(coefficient.to(g.dtype))
