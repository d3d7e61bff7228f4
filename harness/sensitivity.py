"""``python -m harness.sensitivity`` (``pipebench-sensitivity``): which assumption decides the
papers'-regime speedups.

For each papers'-regime point (ViT-H/14 and ViT-B at global batch 256 on 16 GPUs of
``dgx_nvlink``, bf16, the roofline model of an A100), the predicted speedup over DP of
AshPipe (its planner's plan) and of Hippie (2 stages x 8 replicas, 1F1B), first at the
base assumptions, then moving one at a time: the fraction of the GPU's datasheet a run
achieves (``sim.gpu_fraction``), the inter-node bandwidth (``cluster.inter_node_gbps``)
and the micro-batch count (``train.micro_batches``, Hippie only). Every prediction is the
simulator's, through the same specs and strategy classes as ``python -m harness.simulate``;
nothing runs.

    python -m harness.sensitivity --out results/papers_regime/sensitivity.md
"""

from __future__ import annotations

import argparse
import os

import pandas as pd
from hydra import compose, initialize_config_dir

from harness.cli.profiles import cluster_of, roofline_of
from harness.config.registry import CONFIG_DIR
from harness.config.schema import register_configs
from harness.config.spec import build_spec
from harness.planning.simulator import predict

BASE = ["train.global_batch=256", "train.precision=bf16", "cluster=dgx_nvlink", "sim.compute=roofline", "sim.gpu=A100",
        "world_size=16", "logger.mode=disabled"]
MODELS = ("vit_h14", "vit_base")
MICRO_BATCHES = 8  # Hippie's, at the base (DP and AshPipe move whole minibatches)
# (what moves, the override, its values); the base value of each is the middle one
KNOBS = [("GPU fraction", "sim.gpu_fraction", (0.3, 0.5, 0.7)),
         ("inter-node GB/s", "cluster.inter_node_gbps", (6.25, 12.5, 25.0)),
         ("micro-batches", "train.micro_batches", (4, MICRO_BATCHES, 16))]


def throughput(overrides: list[str]) -> float:
    """The predicted samples/s of one spec (as ``python -m harness.simulate`` would predict it)."""
    cfg = compose(config_name="config", overrides=overrides)
    spec = build_spec(cfg, launching=False)
    profile = roofline_of(cfg, spec)
    cluster = cluster_of(cfg, profile)
    layout = spec.strategy_cls.simulated(spec, profile, cluster)
    return predict(profile, cluster, layout, spec.world_size, spec.train.global_batch).throughput


def speedups(overrides: list[str], micro_batches: int = MICRO_BATCHES) -> dict[str, float]:
    dp = throughput(["strategy=dp", *overrides])
    hippie = throughput(["strategy=hippie", f"train.micro_batches={micro_batches}", *overrides])
    return {"DP samples/s": dp, "AshPipe speedup": throughput(["strategy=ashpipe", *overrides]) / dp,
            "Hippie speedup": hippie / dp}


def table() -> pd.DataFrame:
    rows = []
    for model in MODELS:
        base = [*BASE, f"model={model}"]
        rows.append({"model": model, "moved": "none (base)", "value": "", **speedups(base)})
        for label, key, values in KNOBS:
            for value in values[::2]:  # the two ends; the middle is the base
                print(f"  {model}: {key}={value} ...", flush=True)
                moved = speedups(base, value) if key == "train.micro_batches" else speedups([*base, f"{key}={value}"])
                rows.append({"model": model, "moved": label, "value": value, **moved})
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m harness.sensitivity", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="", help="also write the table (markdown) to this file")
    args = parser.parse_args(argv)
    register_configs()
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        df = table()
    text = df.to_markdown(index=False, floatfmt=".3f")
    print(text)
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            f.write(f"Base: {' '.join(BASE)}, Hippie at {MICRO_BATCHES} micro-batches; each row moves one "
                    f"assumption from the base.\n\n{text}\n")


if __name__ == "__main__":
    main()
