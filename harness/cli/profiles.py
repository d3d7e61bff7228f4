"""Profiles and clusters of a run spec, for the commands that measure or predict (profile,
simulate, preview)."""

from __future__ import annotations

import dataclasses
import os

import torch
from omegaconf import DictConfig

from harness.config.spec import RunSpec
from harness.host import threads_per_process
from harness.planning.planner import Profile
from harness.planning.profiling import Workload, measure_profile
from harness.planning.simulator import Cluster


def workload(spec: RunSpec) -> Workload:
    """What a profile of ``spec`` measures: the batch one of its workers computes at a time
    (the strategy's class says how many), with that worker's threads."""
    return Workload(model=spec.model, seed=spec.seed, image_size=spec.data.image_size,
                    samples=spec.strategy_cls.samples_per_forward(spec), workers=spec.world_size,
                    threads=threads_per_process(spec.launch.threads_per_worker, spec.world_size),
                    train=spec.train, num_classes=spec.model.num_classes, precision=spec.train.precision)


def profile_spec(spec: RunSpec) -> Profile:
    device = torch.device("cuda" if spec.device == "cuda" else "cpu")
    return measure_profile(workload(spec), device)


def default_path(spec: RunSpec) -> str:
    precision = "" if spec.train.precision == "fp32" else f"-{spec.train.precision}"
    return os.path.join("profiles", f"{spec.model.name}-{spec.device}{precision}.json")


def cluster_of(cfg: DictConfig, profile: Profile) -> Cluster:
    """The simulator's Cluster from the ``cluster`` config node (which mirrors it, plus
    ``use_profile_network``: simulate the profiled machine's own network)."""
    cluster = Cluster(**{f.name: cfg.cluster[f.name] for f in dataclasses.fields(Cluster)})
    if cfg.cluster.use_profile_network:
        cluster.intra_node_gbps = cluster.inter_node_gbps = profile.network.p2p_bytes_per_s / 1e9
        cluster.latency_us = cluster.inter_latency_us = profile.network.latency_s * 1e6
    return cluster
