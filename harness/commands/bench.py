"""Our runtime against its peers on the same schedule, with ratios, repeats interleaved.

A benchmark, not a timed test: in one invocation it runs each configuration
``--repeats`` times, interleaved in time (every configuration once, then again,
...), on two models (``vit_micro`` at global batch 64, and ``vit_tiny`` at 32,
where compute dominates), every run a real ``pipebench run`` command with
one thread per worker, the same given partition for every pipeline, 4
micro-batches and no recomputation but where named:

- ``dp_w1``: DP at one worker (the one-worker, one-thread throughput T1);
- ``dp_w2``: DP at two workers;
- ``hippie``, ``pipelining``, ``deepspeed``: synchronous 1F1B on two stages;
- ``hippie_zb_h1``: Hippie on ZB-H1 (its backward split, W passes in 1F1B's bubble), same stages;
- ``hippie_recompute``, ``hippie_zb_h1_recompute``: both with every layer recomputed
  (``strategy.recompute=all``), for the memory and time recomputation trades;
- ``pipelining_zb1p``, ``pipelining_interleaved``, ``pipelining_zbv``, ``pipelining_dualpipev``:
  torch pipelining's schedules of two stages per rank (ZB1P, interleaved 1F1B, ZB-V, DualPipeV)
  on the same layers cut into four stages (the 2-stage cut kept as the middle one), so that
  each rank holds the same blocks as on two stages;
- ``hippie_zb1p``, ``hippie_interleaved``, ``hippie_zbv``, ``hippie_dualpipev``: the same four
  schedules in our runtime (the library's own action lists), on the same four stages, each also
  with every layer recomputed (``*_recompute``);
- ``ashpipe``: AshPipe as a real two-stage asynchronous pipeline, replicas [1, 1].

It prints, per model, each configuration's median samples/s and its spread
(min-max over the repeats), its peak memory per rank, the start-up time (command start to the
first training step of the 2-worker runs) and the ratios: Hippie's 1F1B and its best schedule
over the best peer 1F1B, Hippie ZB-H1 over Hippie 1F1B and over torch's ZB1P, Hippie's best
schedule over torch pipelining's best and over torch's best at no more peak memory per rank,
each of our runtime's schedules of two stages per rank over torch's run of the same schedule,
Hippie / bubble bound (2 T1 m / (m + p - 1)), AshPipe / DP, AshPipe / no-bubble bound (2 T1).
Where the bounds are missed, it says why from the runs' profiled steps (measured one way for
every strategy): the compute a sample costs in each configuration against one worker alone,
the share of its schedule each spends computing at that cost, and each schedule's measured,
analytic and replayed bubble. ``--out`` gets ``bench.md``, ``bench.json`` and the runs' records.

Example (32 minutes for its 126 runs on 2 cores, 2026-12-07):
  pipebench bench --repeats 3 --out results/bench
"""

from __future__ import annotations

import argparse

from harness.studies import bench as study
from harness.studies.options import add_options, refuse, stamped


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_options(parser, repeats=(3, None), steps=(16, "steps per run (3 warm up, the last measures memory)"))
    parser.add_argument(
        "--models", default=",".join(study.MODELS), help=f"comma-separated, of {', '.join(study.MODELS)}"
    )
    add_options(parser, out=(stamped("bench"), None))


def main(args: argparse.Namespace) -> int:
    models = args.models.split(",")
    unknown = [m for m in models if m not in study.MODELS]
    if unknown or args.repeats < 1 or args.steps < 5:
        return refuse(
            f"--models from {', '.join(study.MODELS)}, --repeats >= 1, --steps >= 5 "
            f"(got {args.models}, {args.repeats}, {args.steps})"
        )
    print(study.run(models, args.repeats, args.steps, args.out))
    return 0
