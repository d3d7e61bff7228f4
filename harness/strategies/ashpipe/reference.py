"""A plain single-process model of AshPipe's semantics: the reference its runtime must match.

Minibatch j runs forward and backward through all stages in one process, with
stage s using its weights after ``max(0, j - w_s)`` of its own updates
(``w_s = S - 1 - s``, the warm-up of PipeDream's asynchronous 1F1B): that is
the version the stage's forward saw, and weight stashing makes the backward
use the same one. Each stage then applies its update for minibatch j at once.
Replicas do not appear: the sum of per-replica gradients of ``loss_sum / B``
is the full batch's gradient. With ``switch_at = k`` the first k minibatches
are plain data-parallel (synchronous) steps on the whole model; with
``switch_plateau=(window, threshold)`` the data-parallel steps go on until
AshPipe's plateau rule fires on their losses (:func:`reference_switch`). The training recipe
(learning-rate schedule, label smoothing, clipping) applies as AshPipe defines it:
the data-parallel steps clip the whole model's gradient, the pipelined ones each
stage's own, and each stage's schedule counts its own updates, continuing the
data-parallel one's after the switch. The staleness mitigations are written out here on their
own: with ``strategy.weight_prediction`` a stage's forward (and, stashed, its backward) uses the
version it saw moved ``d`` updates along the optimizer's update direction at that version
(``d`` = the updates that land before the minibatch's own); with ``strategy.lr_correction`` a
stage ``tau`` updates stale steps at its scheduled rate divided by ``tau ** p``, ``p`` falling
from 1 at the switch to 0 over ``lr_correction_steps``.

The tests hold the runtime to it (tests/distributed/test_ashpipe.py); ``pipebench stability``
runs it over a learning-rate grid, where training a configuration costs one process and no
communication. It keeps only the weight versions a stage can still be asked for (S - s of them).
"""

from __future__ import annotations

from itertools import islice
from typing import Callable, Iterable

import torch
from torch import nn
from torch.func import functional_call

from harness.core.models import build_layers
from harness.core.training import carry_schedule, clip_gradients, make_optimizer, summed_loss
from harness.runtime.partition import stage_ranges
from harness.strategies.ashpipe.switch import plateau


def reference_switch(spec, batches, window: int, threshold: float) -> int | None:
    """The step at which synchronous data-parallel training of ``batches`` meets the plateau rule
    (None: it never does)."""
    layers = build_layers(spec.model, spec.seed)
    full = nn.Sequential(*layers)
    opt = make_optimizer(full.parameters(), spec.train, spec.steps)
    losses: list[float] = []
    for k, (x, y) in enumerate(batches):
        if plateau(losses, window, threshold) is not None:
            return k
        loss = summed_loss(full(x), y, x.shape[0], spec.train.label_smoothing)
        loss.backward()
        clip_gradients(full.parameters(), spec.train.grad_clip_norm)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return None


def _update_direction(opt: torch.optim.Optimizer, params) -> dict[str, torch.Tensor]:
    """The optimizer's next update per parameter, as learning rate x direction (zero before its first step)."""
    group = opt.param_groups[0]
    lr, out = group["lr"], {}
    for n, p in params:
        state = opt.state.get(p)
        if not state:
            out[n] = torch.zeros_like(p)
        elif isinstance(opt, torch.optim.SGD):
            out[n] = lr * state["momentum_buffer"]
        else:
            beta1, beta2 = group["betas"]
            t = float(state["step"])
            m_hat = state["exp_avg"] / (1 - beta1**t)
            v_hat = state["exp_avg_sq"] / (1 - beta2**t)
            out[n] = lr * (m_hat / (v_hat.sqrt() + group["eps"]) + group["weight_decay"] * p.detach())
    return out


def ashpipe_reference(
    spec,
    batches: Iterable,
    boundaries: list[int],
    switch_at: int = 0,
    on_loss: Callable[[int, float], bool] | None = None,
) -> dict[str, torch.Tensor]:
    """The parameters after training on ``batches`` (keyed "<layer>.<name>"), the first ``switch_at``
    synchronously on the whole model, the rest through ``boundaries``' stages. ``on_loss(step,
    loss)``, where given, sees each step's loss and may end the training early by returning True."""
    layers = build_layers(spec.model, spec.seed)
    full = nn.Sequential(*layers)
    train = spec.train
    batches = iter(batches)
    dp_opt = make_optimizer(full.parameters(), train, spec.steps)
    for k, (x, y) in enumerate(islice(batches, switch_at)):
        loss = summed_loss(full(x), y, x.shape[0], train.label_smoothing)
        loss.backward()
        clip_gradients(full.parameters(), train.grad_clip_norm)
        dp_opt.step()
        dp_opt.zero_grad(set_to_none=True)
        if on_loss is not None and on_loss(k, loss.item()):
            return _state(layers)

    ranges = stage_ranges(boundaries, len(layers))
    S = len(ranges)
    stages = [nn.Sequential(*layers[lo:hi]) for lo, hi in ranges]
    opts = []
    # (a synchronous strategy's spec, trained as one stage, has no staleness mitigations)
    correct = getattr(spec.strategy, "lr_correction", False)
    predict = getattr(spec.strategy, "weight_prediction", False)
    anneal = getattr(spec.strategy, "lr_correction_steps", None) or spec.steps_per_epoch
    for s, st in enumerate(stages):
        tau = S - 1 - s
        # (a stage at most one update stale keeps its rate: 1 ** -p = 1)
        scale = (lambda k, tau=tau: tau ** -(1 - min(1.0, (k - switch_at) / anneal))) if correct and tau > 1 else None
        opt = make_optimizer(st.parameters(), train, spec.steps, scale)
        carry_schedule(opt, switch_at)
        for p in st.parameters():
            if p in dp_opt.state:
                opt.state[p] = dp_opt.state[p]
        opts.append(opt)

    def snapshot(s):  # a stage's weights after an update, and the optimizer's next update then
        named = list(stages[s].named_parameters())
        return {n: p.detach().clone() for n, p in named}, _update_direction(opts[s], named)

    versions = [{0: snapshot(s)} for s in range(S)]

    def used_by(s, j):
        seen = max(0, j - (S - 1 - s))
        weights, update = versions[s][seen]
        d = j - seen if predict else 0
        return {n: (w - d * update[n]).requires_grad_(True) for n, w in weights.items()}

    for j, (x, y) in enumerate(batches):
        used = [used_by(s, j) for s in range(S)]
        h = x
        for st, weights in zip(stages, used):
            h = functional_call(st, weights, (h,))
        loss = summed_loss(h, y, x.shape[0], train.label_smoothing)
        loss.backward()
        for s, st in enumerate(stages):
            for n, p in st.named_parameters():
                p.grad = used[s][n].grad
            clip_gradients(st.parameters(), train.grad_clip_norm)
            opts[s].step()
            opts[s].zero_grad(set_to_none=True)
            versions[s][j + 1] = snapshot(s)
            versions[s].pop(j - (S - 1 - s), None)  # the version minibatch j used: no later one uses it
        if on_loss is not None and on_loss(switch_at + j, loss.item()):
            break
    return _state(layers)


def _state(layers: list[nn.Module]) -> dict[str, torch.Tensor]:
    return {f"{i}.{n}": p.detach().clone() for i, layer in enumerate(layers) for n, p in layer.named_parameters()}
