"""A published GPU table of pipeline schedules, predicted by the roofline model and the simulator.

The Zero Bubble paper (Qi, Wan, Huang and Lin, ICLR 2024; arXiv 2401.10241v1, Tables 3 and 4)
measured GPT-like models of 1.5B to 28.3B parameters on 8 to 32 A100 SXM 80 GB GPUs (8 per node,
nodes over RoCE), pure pipeline parallelism in Megatron-LM, in samples per GPU per second for
1F1B, interleaved 1F1B (each transformer layer a chunk), ZB-1p and ZB-2p at three micro-batch
counts each. Each configuration here is built as the same transformer stack: the paper's width,
heads and 4x MLP, a 1024-token sequence (a 32 px image in 1 px patches, plus the class token),
and its layers plus two, since the paper balances the first and last stages (which carry the
embedding and the language-model head) by giving them one layer fewer, and the authors' own
bubble model (efficiency.py in their repository) counts the two as a layer each. The stages are
cut evenly by layer. The roofline model (:mod:`harness.planning.roofline`) costs every operator
on an A100 in bf16 (the paper's fp16 has the same peak) at one achieved fraction of the
datasheet, fitted on one configuration (:data:`FIT_ON`, chosen before any prediction was seen:
1F1B at the middle micro-batch count of the middle-sized model) and held for all the others;
the cluster is the ``dgx_nvlink`` preset. Our schedules stand for the paper's: ``1f1b``,
``interleaved_1f1b`` with as many stages per rank as layers, and ``zb_h1`` for ZB-1p (the
paper's Table 5 gives them the same bubble at every configuration). ZB-2p, a schedule its
search finds with twice 1F1B's activation memory, has no counterpart in the registry and is
not predicted.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from types import SimpleNamespace

import pandas as pd

from harness.planning.roofline import gpu, roofline_profile
from harness.planning.simulator import Cluster, SimLayout, predict

SOURCE = (
    "Qi et al., Zero Bubble Pipeline Parallelism, ICLR 2024 (arXiv 2401.10241v1): Table 3 (models), "
    "Table 4 (samples per GPU per second)"
)
GPU_NAME = "NVIDIA A100-SXM4-80GB"
# the paper's column -> our schedule (stages per rank: None for as many as a rank has layers)
SCHEDULES = {"1F1B": ("1f1b", 1), "1F1B-I": ("interleaved_1f1b", None), "ZB-1p": ("zb_h1", 1)}


@dataclass(frozen=True)
class Published:
    model: str
    layers: int
    heads: int
    hidden: int
    gpus: int
    micro_batch: int  # samples per micro-batch
    micro_batches: int
    samples_per_gpu_s: dict[str, float]  # the paper's column -> its figure


def _table() -> list[Published]:
    # Table 3: layers, heads, hidden, GPUs, micro-batch size; Table 4: per micro-batch count m,
    # 1F1B, 1F1B-I, ZB-1p and ZB-2p
    models = {
        "1.5B": (22, 24, 2304, 8, 6),
        "6.2B": (30, 32, 4096, 8, 3),
        "14.6B": (46, 40, 5120, 16, 1),
        "28.3B": (62, 48, 6144, 32, 1),
    }
    figures = {
        "1.5B": {24: (11.8, 13.1, 12.9, 14.5), 32: (12.5, 13.4, 13.4, 14.8), 64: (13.6, 13.9, 14.2, 14.9)},
        "6.2B": {24: (3.50, 4.01, 3.88, 4.32), 32: (3.70, 4.08, 4.00, 4.35), 64: (4.03, 4.19, 4.20, 4.39)},
        "14.6B": {48: (1.40, 1.54, 1.61, 1.81), 64: (1.49, 1.59, 1.67, 1.83), 128: (1.64, 1.66, 1.76, 1.85)},
        "28.3B": {96: (0.76, 0.82, 0.87, 0.99), 128: (0.80, 0.85, 0.90, 1.00), 256: (0.88, 0.90, 0.96, 1.00)},
    }
    return [
        Published(name, *models[name], m, dict(zip(("1F1B", "1F1B-I", "ZB-1p", "ZB-2p"), row)))
        for name, rows in figures.items()
        for m, row in rows.items()
    ]


TABLE = _table()
FIT_ON = ("6.2B", 32, "1F1B")


def model_config(p: Published) -> SimpleNamespace:
    """The paper's transformer stack as this harness's model settings (see the module docstring)."""
    return SimpleNamespace(
        name=f"gpt_{p.model}",
        img_size=32,
        patch_size=1,
        embed_dim=p.hidden,
        depth=p.layers + 2,
        num_heads=p.heads,
        mlp_ratio=4.0,
        num_classes=100,
        qkv_bias=True,
        pretrained=None,
    )


def cluster() -> Cluster:
    """The dgx_nvlink preset (conf/cluster/dgx_nvlink.yaml) with as many nodes as the largest run needs."""
    return Cluster(
        name="dgx_nvlink",
        devices_per_node=8,
        nodes=4,
        intra_node_gbps=150,
        inter_node_gbps=12.5,
        latency_us=5,
        inter_latency_us=10,
        memory_gib=80,
    )


@functools.lru_cache(maxsize=None)
def _profile(model: str, fraction: float):
    """The roofline profile of the paper's ``model`` (one per model: its micro-batch size is fixed)."""
    p = next(p for p in TABLE if p.model == model)
    cfg = model_config(p)
    return roofline_profile(
        cfg, cfg.img_size, p.micro_batch, "bf16", gpu(GPU_NAME, "bf16", fraction), cluster().network()
    )


def predicted(p: Published, column: str, fraction: float) -> float:
    """Samples per GPU per second the simulator predicts for ``p`` under the paper's ``column``."""
    cfg = model_config(p)
    profile = _profile(p.model, fraction)
    schedule, per_rank = SCHEDULES[column]
    per_rank = per_rank or (cfg.depth // p.gpus)
    stages = p.gpus * per_rank
    per_stage = cfg.depth // stages
    # layer 0 is the embedding, the last the head: they join the first and the last stage
    boundaries = [1 + per_stage * s for s in range(1, stages)]
    layout = SimLayout(
        column,
        [1] * p.gpus,
        boundaries,
        p.micro_batches,
        schedule,
        set(),
        hides_allreduce=False,
        stages_per_rank=per_rank,
    )
    pred = predict(profile, cluster(), layout, p.gpus, p.micro_batch * p.micro_batches)
    return pred.throughput / p.gpus


def fit_fraction() -> float:
    """The achieved fraction of the A100's datasheet at which :data:`FIT_ON` predicts its published figure."""
    model, m, column = FIT_ON
    target = next(p for p in TABLE if p.model == model and p.micro_batches == m)
    fraction = 0.5
    for _ in range(2):  # throughput is nearly proportional to the fraction (kernel floors aside)
        fraction *= target.samples_per_gpu_s[column] / predicted(target, column, fraction)
    return fraction


def comparison(progress=None) -> tuple[pd.DataFrame, float]:
    """One row per configuration and schedule: published and predicted samples/GPU/s, the error,
    and each schedule's ratio to 1F1B published and predicted; and the fitted fraction."""
    fraction = fit_fraction()
    rows = []
    for p in TABLE:
        if progress:
            progress(f"{p.model} m={p.micro_batches}")
        ours = {column: predicted(p, column, fraction) for column in SCHEDULES}
        for column, value in ours.items():
            published = p.samples_per_gpu_s[column]
            ratio_pub = published / p.samples_per_gpu_s["1F1B"]
            ratio_ours = value / ours["1F1B"]
            rows.append(
                {
                    "model": p.model,
                    "gpus": p.gpus,
                    "micro_batches": p.micro_batches,
                    "schedule": column,
                    "published": published,
                    "predicted": value,
                    "error": value / published - 1,
                    "ratio_published": ratio_pub,
                    "ratio_predicted": ratio_ours,
                    "ratio_error": ratio_ours / ratio_pub - 1,
                    "fitted": (p.model, p.micro_batches, column) == FIT_ON,
                }
            )
    return pd.DataFrame(rows), fraction
