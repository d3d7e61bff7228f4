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

import pandas as pd
from hydra import compose

from harness.cli.hydra_app import composing
from harness.config.spec import build_spec
from harness.planning import published
from harness.planning.forecast import forecast

BASE = [
    "train.global_batch=256",
    "train.precision=bf16",
    "cluster=dgx_nvlink",
    "sim.compute=roofline",
    "sim.gpu=A100",
    "world_size=16",
    "logger.mode=disabled",
]
MODELS = ("vit_h14", "vit_base")
MICRO_BATCHES = 8  # Hippie's, at the base (DP and AshPipe move whole minibatches)
# (what moves, the override, its values); the base value of each is the middle one
KNOBS = [
    ("GPU fraction", "sim.gpu_fraction", (0.3, 0.5, 0.7)),
    ("inter-node GB/s", "cluster.inter_node_gbps", (6.25, 12.5, 25.0)),
    ("micro-batches", "train.micro_batches", (4, MICRO_BATCHES, 16)),
]


def throughput(overrides: list[str]) -> float:
    """The predicted samples/s of one spec (as ``pipebench simulate`` would predict it)."""
    spec = build_spec(compose(config_name="config", overrides=overrides), launching=False)
    return forecast(spec).prediction.throughput


def speedups(overrides: list[str], micro_batches: int = MICRO_BATCHES) -> dict[str, float]:
    dp = throughput(["strategy=dp", *overrides])
    hippie = throughput(["strategy=hippie", f"train.micro_batches={micro_batches}", *overrides])
    return {
        "DP samples/s": dp,
        "AshPipe speedup": throughput(["strategy=ashpipe", *overrides]) / dp,
        "Hippie speedup": hippie / dp,
    }


def table() -> pd.DataFrame:
    rows = []
    fitted = round(published.fit_fraction(), 4)
    for model in MODELS:
        base = [*BASE, f"model={model}"]
        rows.append({"model": model, "moved": "none (base)", "value": "", **speedups(base)})
        for label, key, values in KNOBS:
            for value in values[::2]:  # the two ends; the middle is the base
                print(f"  {model}: {key}={value} ...", flush=True)
                moved = speedups(base, value) if key == "train.micro_batches" else speedups([*base, f"{key}={value}"])
                rows.append({"model": model, "moved": label, "value": value, **moved})
        rows.append(
            {
                "model": model,
                "moved": "GPU fraction fitted on a published A100 table",
                "value": fitted,
                **speedups([*base, f"sim.gpu_fraction={fitted}"]),
            }
        )
    return pd.DataFrame(rows)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default="", help="also write the table (markdown) to this file")


def main(args: argparse.Namespace) -> int:
    with composing():
        df = table()
    text = df.to_markdown(index=False, floatfmt=".3f")
    print(text)
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            f.write(
                f"Base: {' '.join(BASE)}, Hippie at {MICRO_BATCHES} micro-batches; each row moves one "
                f"assumption from the base.\n\n{text}\n"
            )
    return 0
