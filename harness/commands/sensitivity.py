"""Which assumption decides the papers'-regime speedups: predictions only, nothing runs.

For each papers'-regime point (ViT-H/14 and ViT-B at global batch 256 on 16 GPUs of
``dgx_nvlink``, bf16, the roofline model of an A100), the predicted speedup over DP of
AshPipe (its planner's plan) and of Hippie (2 stages x 8 replicas, 1F1B), first at the
base assumptions, then moving one at a time: the fraction of the GPU's datasheet a run
achieves (``sim.gpu_fraction``), the inter-node bandwidth (``cluster.inter_node_gbps``)
and the micro-batch count (``train.micro_batches``, Hippie only); and once more at the
fraction fitted on the Zero Bubble paper's published A100 table
(harness.planning.published: the one GPU measurement of this kind the project can compare
with, on GPT-like layers rather than ViT's). Every prediction is the
simulator's, through the same specs, strategy classes and prediction as ``pipebench
simulate`` (harness.planning.forecast); nothing runs.

Example:
  pipebench sensitivity --out results/papers_regime/sensitivity.md
"""

from __future__ import annotations

import argparse
import os

from harness.cli.hydra_app import composing
from harness.studies import sensitivity as study
from harness.studies.options import add_options, say


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_options(parser, out=("", "also write the table (markdown) to this file"))


def main(args: argparse.Namespace) -> int:
    with composing():
        df = study.table(log=say)
    text = df.to_markdown(index=False, floatfmt=".3f")
    print(text)
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            f.write(f"{study.header()}\n\n{text}\n")
    return 0
