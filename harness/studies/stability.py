"""The stability probe (``pipebench stability``): a job trained through AshPipe's single-process
reference (harness.strategies.ashpipe.reference), without processes or communication.

:func:`probe` trains one job's spec as its strategy computes it (``reference_layout``) and gives its
training loss over its first and last :data:`WINDOW` steps, the step it diverged at and the test
top-1 of its final weights (:func:`top1`); :func:`row` is one job's line of the table, named by the
overrides that tell it from the other jobs of its sweep (:func:`varying`).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from harness.core.data import BatchOrder, load
from harness.core.models import build_layers
from harness.core.training import eval_counts
from harness.strategies.ashpipe.reference import ashpipe_reference

WINDOW = 20  # steps the first and last training losses are averaged over


@torch.no_grad()
def top1(spec, state: dict[str, torch.Tensor], data) -> float:
    """Test top-1 of the weights ``state``, on the samples and in the chunks a run evaluates."""
    model = nn.Sequential(*build_layers(spec.model, spec.seed))
    model.load_state_dict(state)
    model.eval()
    test, batch = data.test, spec.train.global_batch
    limit = len(test) if spec.train.eval_samples <= 0 else min(spec.train.eval_samples, len(test))
    correct = count = 0.0
    for start in range(0, limit - batch + 1, batch):
        x, y = test.batch(torch.arange(start, start + batch))
        c, n, _ = eval_counts(model(x), y)
        correct, count = correct + c, count + n
    return correct / max(count, 1)


def probe(spec) -> dict:
    """Train ``spec``'s job through the reference; its losses, divergence and final top-1."""
    boundaries, switch_at = spec.strategy_cls.reference_layout(spec)
    data = load(spec.data, spec.seed, spec.model.num_classes)
    order = BatchOrder(len(data.train), spec.train.global_batch, spec.seed)
    losses: list[float] = []

    def on_loss(step: int, loss: float) -> bool:
        losses.append(loss)
        return not math.isfinite(loss)

    state = ashpipe_reference(
        spec, (data.train_batch(order, k) for k in range(spec.steps)), boundaries, switch_at, on_loss
    )
    diverged = len(losses) - 1 if losses and not math.isfinite(losses[-1]) else None
    return {
        "steps": len(losses),
        "loss first": sum(losses[:WINDOW]) / min(WINDOW, len(losses)),
        "loss last": sum(losses[-WINDOW:]) / min(WINDOW, len(losses)),
        "diverged at step": diverged,
        "top-1 %": 100 * top1(spec, state, data),
    }


def varying(jobs: list[list[str]]) -> list[str]:
    """The overrides that some jobs of a sweep have and others lack: what tells the jobs apart."""
    return [o for o in dict.fromkeys(o for job in jobs for o in job) if any(o not in job for job in jobs)]


def row(job: list[str], spec, apart: list[str]) -> dict:
    """One job's line: the overrides of ``apart`` it has (all of them, where it has none), its strategy
    (and variant), its rate and what :func:`probe` measured."""
    variant = spec.variant()
    return {
        "job": " ".join(o for o in job if o in apart) or " ".join(job),
        "strategy": spec.strategy.name + (f" ({variant})" if variant else ""),
        "lr": spec.train.lr,
        **probe(spec),
    }
