"""Print AshPipe's plan (stages, replicas, predicted time and memory) without training.

Profiles the model's layers on this machine's device (identical blocks are
measured once, so ViT-H/14 takes seconds) and plans for ``world_size``
workers. The network is measured between two local gloo workers unless
``strategy.bandwidth_gbps`` gives the target cluster's bandwidth; a GPU
cluster's memory per worker comes from ``strategy.memory_limit`` (GiB).

Inside a job (``strategy=ashpipe`` without ``strategy.replicas``) the same
planner runs on rank 0 with the network measured between the job's workers
(:func:`harness.planning.in_job.plan_in_job`).

Example:
  pipebench plan model=vit_h14 world_size=8 strategy.bandwidth_gbps=12.5 strategy.memory_limit=80
"""

from __future__ import annotations

import sys

import torch
from omegaconf import DictConfig

from harness.cli.hydra_app import NO_OUTPUT_DIR, hydra_command, spec_or_exit
from harness.core.errors import ConfigError
from harness.core.models import build_layers
from harness.planning.in_job import assumed_network, plan_here
from harness.planning.planner import data_parallel_cost
from harness.planning.profiling import measure_local_network
from harness.strategies.ashpipe import AshPipeStrategy

OVERRIDES = True


def task(cfg: DictConfig) -> None:
    spec = spec_or_exit(cfg, launching=False)  # plans for a cluster, not for this host
    if not issubclass(spec.strategy_cls, AshPipeStrategy):
        print(
            f"error: pipebench plan plans AshPipe's stages and replicas; strategy={spec.strategy.name} "
            "has no planner (drop the strategy override, or use pipebench preview to see its layout)",
            file=sys.stderr,
        )
        raise SystemExit(2)
    try:
        device = torch.device("cuda" if spec.device == "cuda" else "cpu")
        network = assumed_network(spec)
        if network is None:
            print("measuring point-to-point and all-reduce bandwidth between 2 local workers ...", flush=True)
            network = measure_local_network()
        print(f"profiling {spec.model.name} on {device} ...", flush=True)
        layers = build_layers(spec.model, spec.seed)
        chosen, profile = plan_here(spec, layers, device, network, spec.world_size)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    print(
        f"network: p2p {network.p2p_bytes_per_s / 1e9:.2f} GB/s, all-reduce {network.allreduce_bytes_per_s / 1e9:.2f} "
        f"GB/s, latency {network.latency_s * 1e6:.0f} us"
    )
    dp = data_parallel_cost(profile, spec.world_size, spec.train.global_batch)
    print(chosen.describe([type(l).__name__ for l in layers], dp))


def main(args: list[str]) -> int:
    if not any(a.startswith("strategy=") for a in args):
        args = [*args, "strategy=ashpipe"]
    hydra_command(task, args, NO_OUTPUT_DIR)
    return 0
