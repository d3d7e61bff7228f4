"""Where a learning rate trains and where it diverges, from AshPipe's single-process reference.

``pipebench stability <overrides>`` takes every job of the sweep the overrides (and an
experiment's swept keys) describe, the jobs ``preview`` lists, and trains each in one process
through AshPipe's sequential reference (harness.strategies.ashpipe.reference, the model the
runtime is tested against): an AshPipe job with its stages' staleness, its switch, weight
prediction and rate correction; every synchronous strategy (DP, Hippie, the baselines, which
compute the same updates) as one stage. Same model, initial weights, data order, augmentation
and recipe as the job (in fp32, whatever ``train.precision`` says), without processes or
communication: a grid of rates costs a fraction
of the runs it helps choose. A job stops at its first non-finite loss. One line per job: the
training loss over its first and last 20 steps, the step it diverged at, and the test top-1 of
its final weights (``train.eval_samples`` of the test split). Choose the points of a real
sweep from it; the runtime's own runs are what a study shows.

Example (the rate sweep of experiment=accuracy_paper_lr_strategies, on its first 2 epochs):
  pipebench stability experiment=accuracy_paper_lr_strategies train.epochs=2 train.lr=0.1,0.3,1,2
"""

from __future__ import annotations

import math
import sys
import time

import pandas as pd
import torch
from hydra import compose
from torch import nn

from harness.cli.hydra_app import SWEEP_FLAGS, composing, overrides_of, refuse_bad_overrides, sweep_jobs
from harness.config.spec import build_spec
from harness.core.data import BatchOrder, check_available, load
from harness.core.errors import ConfigError
from harness.core.models import build_layers
from harness.core.training import eval_counts
from harness.strategies.ashpipe.reference import ashpipe_reference

OVERRIDES = True
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


def main(args: list[str]) -> int:
    args = [a for a in args if a not in SWEEP_FLAGS]
    refuse_bad_overrides(args, placed=False)
    with composing():
        jobs = sweep_jobs(overrides_of(args))
        specs = []
        for job in jobs:  # every job validated before the first trains
            try:
                spec = build_spec(compose(config_name="config", overrides=job), launching=False)
                spec.strategy_cls.reference_layout(spec)
                check_available(spec.data, spec.model.num_classes)  # a missing or corrupt set, in one line
                specs.append(spec)
            except ConfigError as e:
                print(f"error: {' '.join(job)}: {e}", file=sys.stderr)
                return 2
    varying = [o for o in dict.fromkeys(o for job in jobs for o in job) if any(o not in job for job in jobs)]
    rows = []
    for i, (job, spec) in enumerate(zip(jobs, specs), 1):
        started = time.perf_counter()
        variant = spec.variant()
        row = {
            "job": " ".join(o for o in job if o in varying) or " ".join(job),  # what tells the jobs apart
            "strategy": spec.strategy.name + (f" ({variant})" if variant else ""),
            "lr": spec.train.lr,
            **probe(spec),
        }
        rows.append(row)
        print(
            f"[{i}/{len(jobs)}] {row['job']}: top-1 {row['top-1 %']:.1f}% after {row['steps']} step(s)"
            + (f", diverged at step {row['diverged at step']}" if row["diverged at step"] is not None else "")
            + f" ({time.perf_counter() - started:.0f} s)",
            file=sys.stderr,
            flush=True,
        )
    table = pd.DataFrame(rows)
    print(table.astype(object).where(table.notna(), None).to_markdown(index=False, missingval="–", floatfmt=".3g"))
    return 0
