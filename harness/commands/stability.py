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

import sys
import time

import pandas as pd
from hydra import compose

from harness.cli.hydra_app import SWEEP_FLAGS, composing, overrides_of, refuse_bad_overrides, sweep_jobs
from harness.config.spec import build_spec
from harness.core.data import check_available
from harness.core.errors import ConfigError
from harness.studies import stability as study

OVERRIDES = True


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
    apart = study.varying(jobs)
    rows = []
    for i, (job, spec) in enumerate(zip(jobs, specs), 1):
        started = time.perf_counter()
        row = study.row(job, spec, apart)
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
