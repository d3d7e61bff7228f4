"""Structured-config schema for every run.

The dataclasses here are registered in Hydra's ConfigStore as the schema of the
primary config and of each config group, so a misspelt key or a value of the
wrong type is refused by Hydra while composing, before any process starts.
Semantic checks that need more than types (a batch that cannot be split, more
stages than layers, ...) live in :mod:`harness.config.spec`.

The ``strategy`` node's schema is the union of every strategy's own keys
(each strategy's ``Config``), all unset (None) unless a yaml or an override
sets them: Hydra checks their types, and :func:`harness.config.spec.build_spec`
refuses a key that belongs to another strategy in one line. One union schema
(rather than one per strategy) lets a sweep over ``strategy=`` share overrides
such as ``strategy.recompute`` and lets a refused job fail alone.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from typing import Any, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

from harness.config.registry import strategy_classes
from harness.core.options import bounded, choice
from harness.core.training import LR_SCHEDULES, OPTIMIZERS, PRECISIONS


@dataclass
class ModelConfig:
    """A timm Vision Transformer with a 100-class head."""

    name: str = MISSING
    img_size: int = bounded(32, 1)  # input images are resized to this (CIFAR's 32 for ViT-H/14's 224)
    patch_size: int = bounded(4, 1)  # side of a patch in pixels (tokens = (img_size / patch_size)^2 + 1)
    embed_dim: int = bounded(192, 1)  # width of the residual stream
    depth: int = bounded(12, 1)  # transformer blocks; the layer list is [embedding, blocks..., head]
    num_heads: int = bounded(3, 1)  # attention heads (must divide embed_dim)
    mlp_ratio: float = bounded(4.0, 0, above=True)  # MLP hidden width / embed_dim
    num_classes: int = bounded(100, 1)  # the head's outputs
    # biases on the attention's query, key and value projections (timm's default); the key's
    # gradient is zero in exact arithmetic (softmax ignores a shift shared by every key)
    qkv_bias: bool = True
    # start from these weights instead of the seed's (fine-tuning): a local state dict in timm's
    # format (a VisionTransformer's state_dict() saved with torch.save), or a run directory or
    # checkpoints/step<N> folder of this harness. A classifier of another size (num_classes) is
    # left at its initialisation; any other missing or differently shaped weight is refused
    pretrained: Optional[str] = None


@dataclass
class DataConfig:
    name: str = choice(MISSING, "synthetic", "cifar100")
    # the folder that holds cifar-100-python/ (train, test, meta, as the official archive unpacks)
    root: str = "data/cifar100"
    # the name records and tables give the data (unset: name); a set written in CIFAR-100's format names itself
    label: Optional[str] = None
    download: bool = False  # fetch CIFAR-100 into data.root where the network allows
    # check the official MD5 sums (turn off for data you generated in the official format)
    verify_md5: bool = True
    # synthetic only: how many images to generate per split
    train_size: int = bounded(10000, 1)
    test_size: int = bounded(2000, 1)  # synthetic only: images in the test split
    # synthetic only: per-pixel noise around each class prototype; higher is harder
    noise: float = bounded(0.6, 0)
    num_classes: int = bounded(100, 1)  # synthetic only: classes
    image_size: int = bounded(32, 1)  # the images' side in pixels (square, 3 channels)
    # random crop (padding 4) and horizontal flip of training images; unset: on for cifar100 only
    augment: Optional[bool] = None


@dataclass
class TrainConfig:
    global_batch: int = bounded(64, 1)  # samples per optimizer step, over all workers
    # micro-batches per global batch; unset: the strategy's default (1 for DP and AshPipe, which move
    # whole minibatches; for a synchronous pipeline two per stage, fewer where the batch does not split)
    micro_batches: Optional[int] = bounded(None, 1)
    steps: int = bounded(100, 1)  # optimizer steps of the run
    # if set, overrides steps with epochs * (train_size // global_batch)
    epochs: Optional[int] = bounded(None, 1)
    # steps excluded from timing (first iterations pay one-time costs)
    warmup_steps: int = bounded(3, 0)
    optimizer: str = choice("adamw", *OPTIMIZERS)  # adamw, or sgd (with momentum, Nesterov optional)
    lr: float = bounded(2e-3, 0, above=True)  # the peak learning rate
    weight_decay: float = bounded(0.0, 0)  # decoupled for adamw, L2 for sgd (torch's semantics)
    # adamw: the term added to the second moment's root (torch's default); where a gradient is as
    # small as this, the step's size and sign follow the gradient's rounding
    adam_eps: float = bounded(1e-8, 0, above=True)
    momentum: float = bounded(0.9, 0, 1)  # sgd only
    nesterov: bool = False  # sgd: Nesterov momentum
    # the learning rate per optimizer step: a linear warm-up, then constant | cosine (to lr x
    # lr_min_ratio at the run's last step) | step (x lr_decay_factor every lr_decay_steps)
    lr_schedule: str = choice("constant", *LR_SCHEDULES)
    lr_warmup_steps: int = bounded(0, 0)  # steps of linear warm-up before the schedule
    lr_min_ratio: float = bounded(0.0, 0, 1)  # cosine: the last step's rate as a fraction of lr
    lr_decay_steps: int = bounded(30, 1)  # step: steps between two decays
    lr_decay_factor: float = bounded(0.1, 0, 1, above=True)  # step: the rate's factor at each decay
    label_smoothing: float = bounded(0.0, 0, 1)  # of the cross-entropy loss
    # clip the whole model's gradient norm to this (0: off); DeepSpeed through its own setting
    grad_clip_norm: float = bounded(0.0, 0)
    # fp32 | bf16 (autocast with fp32 master weights; DeepSpeed: its own bf16 mode)
    precision: str = choice("fp32", *PRECISIONS)
    # evaluate on the test split every this many steps (0: only at the end)
    eval_every: int = bounded(0, 0)
    # cap on test images evaluated (0: the whole split)
    eval_samples: int = bounded(0, 0)
    # accuracy that defines time-to-accuracy in the record
    target_accuracy: float = bounded(0.05, 0, 1)
    # measure live training bytes with the allocator profiler during the last step (CPU)
    measure_memory: bool = True
    # save every rank's parameters and optimizer state every N steps and at the end (0: never)
    checkpoint_every: int = bounded(0, 0)
    # continue from a checkpoint: a run directory (its latest checkpoint) or a checkpoints/step<N> folder
    resume: Optional[str] = None


@dataclass
class LaunchConfig:
    # seconds every collective and point-to-point operation may take
    collective_timeout: float = bounded(120.0, 0, above=True)
    # seconds after the first worker failure by which all workers are ended
    failure_timeout: float = bounded(30.0, 0, above=True)
    # cpu | cuda | auto (cuda when available)
    device: str = choice("cpu", "cpu", "cuda", "auto")
    # torch intra-op threads per worker (0: cores / workers, at least 1)
    threads_per_worker: int = bounded(0, 0)
    backend: str = choice("auto", "auto", "gloo", "nccl")  # auto: nccl on CUDA, gloo on CPU
    # fault injection, to test failure handling on a cluster: none | raise | exit | hang | slow
    # (slow: a straggler, sleeping launch.fault_sleep_s before each of its steps from fault_step on;
    # the training itself is unchanged, its steps only last longer on the wall clock)
    fault: str = choice("none", "none", "raise", "exit", "hang", "slow")
    fault_rank: int = bounded(1, 0)  # the rank launch.fault fails
    fault_step: int = bounded(2, 0)  # the step at which it fails
    fault_sleep_s: float = bounded(0.1, 0)  # launch.fault=slow: the sleep before each step
    # launch.fault=slow: a straggler only in the job's first N starts (0: in every start), as a
    # slow node a requeue leaves behind
    fault_starts: int = bounded(0, 0)
    # stop at a preemption or time-limit signal with a checkpoint, to be requeued and resume by
    # itself (harness.run.preemption); unset: when the run is a submitit job (Slurm, submitit_local)
    preemptible: Optional[bool] = None


@dataclass
class LoggerConfig:
    # offline (upload later with wandb sync) | online | disabled; unset: WANDB_MODE, else offline
    mode: Optional[str] = choice(None, "offline", "online", "disabled")
    project: Optional[str] = None  # the wandb project; unset: WANDB_PROJECT, else pipebench
    entity: Optional[str] = None  # the wandb entity; unset: WANDB_ENTITY, else the account's default
    group: Optional[str] = None  # unset: one group per sweep (a single run has none)
    # a row of step metrics (steps.jsonl, and wandb) every this many steps; 0: about 1/100 of the
    # run, at least 10
    log_every: int = bounded(0, 0)
    # a plain progress line every this many steps (a multiple of log_every); 0: about 1/10 of the run
    print_every: int = bounded(0, 0)


@dataclass
class ClusterConfig:
    """A cluster for the simulator (harness.planning.simulator.Cluster); presets in conf/cluster/."""

    name: str = "local_cpu"
    devices_per_node: int = bounded(2, 1)  # devices (GPUs, or CPU workers) per node
    nodes: int = bounded(1, 1)  # nodes; the ranks of a job fill node 0 first
    # compute speed relative to the profiled device (1 with a profile taken on the target device)
    compute_scale: float = bounded(1.0, 0, above=True)
    intra_node_gbps: float = bounded(2.8, 0, above=True)  # GB/s between the devices of a node
    # an all-reduce's bus bandwidth among a node's devices, where it differs from the link's (None: the link's)
    allreduce_gbps: Optional[float] = bounded(None, 0, above=True)
    inter_node_gbps: float = bounded(2.8, 0, above=True)  # GB/s between nodes
    latency_us: float = bounded(60.0, 0)  # of a transfer inside a node
    inter_latency_us: float = bounded(60.0, 0)  # of a transfer between nodes
    memory_gib: float = bounded(24.0, 0, above=True)  # per device: a prediction above it is marked failed
    # communication runs on the computing cores (gloo on CPUs): sends occupy the sender,
    # all-reduces do not overlap the backward
    comm_uses_compute: bool = False
    # use the bandwidth and latency measured into the profile (simulating the profiled machine itself)
    use_profile_network: bool = False
    # the profiled host itself: add the runtime's host overheads measured into the profile
    host_overhead: bool = False


@dataclass
class SimConfig:
    # profile JSON written by pipebench profile (None: measure on this machine first)
    profile: Optional[str] = None
    # where pipebench profile writes (None: profiles/<model>-<device>.json)
    out: Optional[str] = None
    # pipebench profile also measures the strategy's runtime overhead on this host (null-model
    # runs of the strategy itself), which a prediction for this host (cluster=local_cpu) adds
    runtime_overhead: bool = True
    # pipebench simulate: also replay this many runs with each compute and transfer drawn from the
    # profile's measured spread (seeded by seed), for a median and a 10-90% interval (0: medians only)
    draws: int = bounded(0, 0)
    # pipebench simulate's compute costs: a measured profile (sim.profile, or measured now), or
    # the roofline model of a named GPU from FLOPs and bytes (harness.planning.roofline)
    compute: str = choice("profile", "profile", "roofline")
    gpu: str = "A100"  # roofline: the GPU (a name its datasheet tables match: H100, H200, A100, L40S, ...)
    # roofline: the fraction of the datasheet's FLOP/s and bandwidth a run achieves (an assumption) ...
    gpu_fraction: float = bounded(0.5, 0, 1, above=True)
    # ... unless taken from a profile measured on that GPU (pipebench profile launch.device=cuda)
    gpu_profile: Optional[str] = None


def _type_name(hint: Any) -> str:
    return hint.__name__ if isinstance(hint, type) else str(hint).replace("typing.", "")


def strategy_schema(classes) -> type:
    """The union of the strategies' ``Config`` keys, every one optional and unset.

    A key two strategies declare is one key of the union, so it must have one type: a strategy
    that reuses another's key name with another type is refused here, at import (every command
    and test stops), in one line naming the key, both classes and both types."""
    types: dict[str, Any] = {}
    declared: dict[str, Any] = {}  # as the first owner wrote it, for the message
    owners: dict[str, list[str]] = {}
    for cls in classes:
        for name, hint in typing.get_type_hints(cls.Config).items():
            if name == "name":
                continue
            where = f"{cls.__module__}.{cls.__qualname__}"
            if name in types and types[name] != (hint if hint is Any else Optional[hint]):
                raise TypeError(
                    f"strategy.{name} is {_type_name(hint)} in {where} but {_type_name(declared[name])} in "
                    f"{', '.join(owners[name])}: the strategies' keys share one schema, where a key has one "
                    f"type; rename {cls.__name__}'s key or declare it {_type_name(declared[name])}"
                )
            types[name] = hint if hint is Any else Optional[hint]  # unset (None) unless given
            declared.setdefault(name, hint)
            owners.setdefault(name, []).append(where)
    fields = [("name", str, MISSING), ("_target_", str, MISSING)]
    fields += [(name, hint, field(default=None)) for name, hint in types.items()]
    schema = dataclasses.make_dataclass("StrategySchema", fields)
    schema.__module__ = __name__  # importable by name, like the other schemas
    return schema


# what Hydra checks a composed ``strategy`` node against; the run then reads the strategy's own
# Config from it (harness.config.spec.strategy_config; each a harness.strategies.base.StrategyConfig)
StrategySchema = strategy_schema(strategy_classes().values())


@dataclass
class RunConfig:
    model: ModelConfig = MISSING
    data: DataConfig = MISSING
    strategy: StrategySchema = MISSING
    logger: LoggerConfig = MISSING
    train: TrainConfig = field(default_factory=TrainConfig)
    launch: LaunchConfig = field(default_factory=LaunchConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    sim: SimConfig = field(default_factory=SimConfig)
    world_size: int = bounded(1, 1)  # worker processes (one GPU each on CUDA)
    seed: int = bounded(0, 0)  # the model's initial weights and the data order (and the synthetic data)
    # which repeat of one configuration this run is (recorded; a sweep over it runs the repeats
    # interleaved in time: -m repeat=0,1,2 strategy=dp,hippie runs dp, hippie, dp, hippie, ...)
    repeat: int = bounded(0, 0)
    # free-form tag recorded with the run (e.g. the experiment name)
    tag: str = ""
    # which block of a comparison table the run belongs to (e.g. speed, memory, replicated);
    # tables list blocks in order of appearance, and compare every block with the same DP runs
    block: str = ""


def register_configs() -> None:
    cs = ConfigStore.instance()
    cs.store(name="run_schema", node=RunConfig)
    cs.store(group="model", name="model_schema", node=ModelConfig)
    cs.store(group="data", name="data_schema", node=DataConfig)
    cs.store(group="strategy", name="strategy_schema", node=StrategySchema)
    cs.store(group="logger", name="logger_schema", node=LoggerConfig)
    cs.store(group="cluster", name="cluster_schema", node=ClusterConfig)
