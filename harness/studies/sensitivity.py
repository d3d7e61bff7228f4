"""The sensitivity study (``pipebench sensitivity``): which assumption decides the papers'-regime
speedups, from predictions alone.

The base (:data:`BASE`: ViT-H/14 and ViT-B at global batch 256 on 16 GPUs of ``dgx_nvlink``, an
A100's roofline), the assumptions moved one at a time (:data:`KNOBS`), and :func:`table`: AshPipe's
and Hippie's predicted speedups over DP at each point (harness.planning.forecast, as ``pipebench
simulate`` predicts them).
"""

from __future__ import annotations

from typing import Callable

import pandas as pd
from hydra import compose

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


def table(log: Callable[[str], None] = print) -> pd.DataFrame:
    """Per model: the speedups at the base, with each assumption moved to either end of its range, and
    at the fitted GPU fraction; ``log`` gets a line per point. Within Hydra's ``composing()``."""
    rows = []
    fitted = round(published.fit_fraction(), 4)
    for model in MODELS:
        base = [*BASE, f"model={model}"]
        rows.append({"model": model, "moved": "none (base)", "value": "", **speedups(base)})
        for label, key, values in KNOBS:
            for value in values[::2]:  # the two ends; the middle is the base
                log(f"  {model}: {key}={value} ...")
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


def header() -> str:
    """What the table's rows move from, the first line of its file."""
    return (
        f"Base: {' '.join(BASE)}, Hippie at {MICRO_BATCHES} micro-batches; each row moves one assumption from the base."
    )
