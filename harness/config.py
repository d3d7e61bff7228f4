"""Structured-config schema for every run.

The dataclasses here are registered in Hydra's ConfigStore as the schema of the
primary config and of each config group, so a misspelt key or a value of the
wrong type is refused by Hydra while composing, before any process starts.
Semantic checks that need more than types (a batch that cannot be split, more
stages than layers, ...) live in :mod:`harness.spec`.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from typing import Any, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING


@dataclass
class ModelConfig:
    """A timm Vision Transformer with a 100-class head."""

    name: str = MISSING
    img_size: int = 32
    patch_size: int = 4
    embed_dim: int = 192
    depth: int = 12
    num_heads: int = 3
    mlp_ratio: float = 4.0
    num_classes: int = 100


@dataclass
class DataConfig:
    name: str = MISSING  # synthetic | cifar100
    root: str = "data/cifar100"
    download: bool = False
    # check the official MD5 sums (turn off for data you generated in the official format)
    verify_md5: bool = True
    # synthetic only: how many images to generate per split
    train_size: int = 10000
    test_size: int = 2000
    # synthetic only: per-pixel noise around each class prototype; higher is harder
    noise: float = 0.6
    num_classes: int = 100
    image_size: int = 32


@dataclass
class StrategyConfig:
    """One schema for all strategies; each strategy reads the keys it uses.

    Keeping a single schema (rather than one per strategy) lets a sweep over
    ``strategy=`` share overrides such as ``strategy.stages``.
    """

    name: str = MISSING
    # pipeline layout: number of stages and, optionally, explicit boundaries
    # (index of the first layer of stages 1..S-1)
    stages: int = 1
    boundaries: Optional[list[int]] = None
    # replicas per stage (AshPipe: non-uniform); None means world_size / stages each
    replicas: Optional[list[int]] = None
    # pipeline schedule: 1f1b | gpipe
    schedule: str = "1f1b"
    # activation recomputation: none | auto | all | a list of layer indices
    recompute: Any = "none"
    # Hippie: gradient all-reduce bucket size (MiB) for the hidden communication
    bucket_mb: float = 4.0
    # torchgpipe checkpoint mode: always | except_last | never
    checkpoint: str = "except_last"
    # DeepSpeed partition method: harness (our boundaries) | parameters | uniform | type:<regex>
    partition_method: str = "harness"
    # AshPipe: how to choose replicas and boundaries when strategy.replicas is unset (auto: the planner)
    plan: str = "auto"
    # AshPipe planner: memory per worker in GiB (None: the GPU's memory; unlimited on CPU)
    memory_limit: Optional[float] = None
    # AshPipe planner: assumed point-to-point and all-reduce bandwidth in GB/s (None: measured between workers)
    bandwidth_gbps: Optional[float] = None
    # AshPipe Switch Parallelism: plain DP for this many steps (or epochs), then the hybrid plan
    switch_step: Optional[int] = None
    switch_epoch: Optional[int] = None
    # AshPipe: start in hybrid mode from a switch checkpoint directory
    resume_from: Optional[str] = None


@dataclass
class TrainConfig:
    global_batch: int = 64
    micro_batches: int = 1
    steps: int = 100
    # if set, overrides steps with epochs * (train_size // global_batch)
    epochs: Optional[int] = None
    # steps excluded from timing (first iterations pay one-time costs)
    warmup_steps: int = 3
    optimizer: str = "adamw"  # adamw | sgd
    lr: float = 2e-3
    weight_decay: float = 0.0
    momentum: float = 0.9
    # evaluate on the test split every this many steps (0: only at the end)
    eval_every: int = 0
    # cap on test images evaluated (0: the whole split)
    eval_samples: int = 0
    # accuracy that defines time-to-accuracy in the record
    target_accuracy: float = 0.05
    # measure live training bytes with the allocator profiler during the last step (CPU)
    measure_memory: bool = True
    # save every rank's parameters and optimizer state every N steps and at the end (0: never)
    checkpoint_every: int = 0
    # continue from a checkpoint: a run directory (its latest checkpoint) or a checkpoints/step<N> folder
    resume: Optional[str] = None


@dataclass
class LaunchConfig:
    # seconds every collective and point-to-point operation may take
    collective_timeout: float = 120.0
    # seconds after the first worker failure by which all workers are ended
    failure_timeout: float = 30.0
    # cpu | cuda | auto (cuda when available)
    device: str = "cpu"
    # torch intra-op threads per worker (0: cores / workers, at least 1)
    threads_per_worker: int = 0
    backend: str = "auto"  # auto | gloo | nccl
    # fault injection, to test failure handling on a cluster: none | raise | exit | hang
    fault: str = "none"
    fault_rank: int = 1
    fault_step: int = 2


@dataclass
class LoggerConfig:
    mode: str = "offline"  # offline | online | disabled
    project: str = "pipebench"
    entity: Optional[str] = None
    group: Optional[str] = None


@dataclass
class ClusterConfig:
    """A cluster for the simulator (harness.simulator.Cluster); presets in conf/cluster/."""

    name: str = "local_cpu"
    devices_per_node: int = 2
    nodes: int = 1
    compute_scale: float = 1.0
    intra_node_gbps: float = 2.8
    inter_node_gbps: float = 2.8
    latency_us: float = 60.0
    inter_latency_us: float = 60.0
    memory_gib: float = 24.0
    # communication runs on the computing cores (gloo on CPUs): sends occupy the sender,
    # all-reduces do not overlap the backward
    comm_uses_compute: bool = False
    # use the bandwidth and latency measured into the profile (simulating the profiled machine itself)
    use_profile_network: bool = False


@dataclass
class SimConfig:
    # profile JSON written by python -m harness.profile (None: measure on this machine first)
    profile: Optional[str] = None
    # where python -m harness.profile writes (None: profiles/<model>-<device>.json)
    out: Optional[str] = None


@dataclass
class RunConfig:
    model: ModelConfig = MISSING
    data: DataConfig = MISSING
    strategy: StrategyConfig = MISSING
    logger: LoggerConfig = MISSING
    train: TrainConfig = field(default_factory=TrainConfig)
    launch: LaunchConfig = field(default_factory=LaunchConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    sim: SimConfig = field(default_factory=SimConfig)
    world_size: int = 1
    seed: int = 0
    # free-form tag recorded with the run (e.g. the experiment name)
    tag: str = ""


def register_configs() -> None:
    cs = ConfigStore.instance()
    cs.store(name="run_schema", node=RunConfig)
    cs.store(group="model", name="model_schema", node=ModelConfig)
    cs.store(group="data", name="data_schema", node=DataConfig)
    cs.store(group="strategy", name="strategy_schema", node=StrategyConfig)
    cs.store(group="logger", name="logger_schema", node=LoggerConfig)
    cs.store(group="cluster", name="cluster_schema", node=ClusterConfig)


def unknown_choice(overrides: list[str], config_dir: str) -> str | None:
    """The first override choosing a config-group option that has no file in ``conf/<group>/``,
    as one line listing the options (Hydra's own refusal spreads them over a dozen lines with its
    search path). Malformed overrides and interpolations are left to Hydra."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import ChoiceSweep

    overrides = [a for a in overrides if "=" in a and not a.startswith("-")]  # not Hydra's flags (-m, -cn x)
    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except Exception:
        return None
    for override in parsed:
        group = override.key_or_group
        folder = os.path.join(config_dir, group)
        if group.startswith("hydra") or override.is_delete() or not os.path.isdir(folder):
            continue
        if override.is_sweep_override():
            values = list(override.sweep_string_iterator()) if isinstance(override.value(), ChoiceSweep) else []
        else:
            values = [override.value()] if isinstance(override.value(), str) else []
        options = sorted(name[: -len(".yaml")] for name in os.listdir(folder) if name.endswith(".yaml"))
        for value in values:
            if value not in options and not value.startswith("${"):
                return f"unknown {group} '{value}': choose one of {', '.join(options)} (conf/{group}/)"
    return None


def refuse_unknown_choices(argv: list[str], config_dir: str) -> None:
    """Exit 2 with one ``error:`` line before Hydra composes anything, if an option is unknown."""
    message = unknown_choice(argv, config_dir)
    if message:
        print(f"error: {message}", file=sys.stderr)
        raise SystemExit(2)
