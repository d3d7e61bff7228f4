"""From a composed Hydra config to a validated run spec, before any process starts.

Hydra's structured schema already refuses unknown keys and wrong types; the
checks here need more than types (a batch that cannot be split, more workers
than GPUs, a missing data set, ...). Each failure is a ConfigError whose one
line says what is wrong and how to fix it.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from dataclasses import dataclass, field

import torch
from omegaconf import DictConfig, OmegaConf

from harness.config.registry import strategy_class, strategy_classes
from harness.config.schema import (
    ClusterConfig,
    DataConfig,
    LaunchConfig,
    LoggerConfig,
    ModelConfig,
    RunConfig,
    SimConfig,
    TrainConfig,
)
from harness.core import data as data_mod
from harness.core.checkpoints import check_checkpoint, checkpoint_folder
from harness.core.errors import ConfigError
from harness.core.models import parameter_shapes, pretrained_weights
from harness.core.options import check_node
from harness.strategies.base import PIPELINE_KEYS, Strategy, StrategyConfig


@dataclass
class RunSpec:
    model: ModelConfig
    data: DataConfig
    strategy: StrategyConfig  # the strategy's own Config: only the keys it reads
    train: TrainConfig
    launch: LaunchConfig
    logger: LoggerConfig
    world_size: int
    seed: int
    tag: str
    block: str
    repeat: int
    steps: int  # resolved from train.steps or train.epochs
    device: str  # cpu | cuda
    strategy_cls: type[Strategy] = Strategy
    # what the simulator predicts it on (commands that predict: simulate, preview, sensitivity)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    sim: SimConfig = field(default_factory=SimConfig)
    # pipeline keys (stages, boundaries, schedule, recompute) a sweep set that this strategy has no concept of
    ignored: dict = field(default_factory=dict)
    steps_per_epoch: int = 0
    output_dir: str = ""  # the run's directory (set at launch; workers write checkpoints there)
    # a sweep's folder of measured partitions, shared by its runs (set at launch; "": measure per run)
    partition_dir: str = ""
    # set at launch: the run stops with a checkpoint when preempted (harness.run.preemption), and
    # how many times it has been stopped and resumed so far
    preemptible: bool = False
    resumed: int = 0

    @property
    def timed_steps(self) -> int:
        return self.steps - self.train.warmup_steps - (1 if self.train.measure_memory else 0)

    def summary(self) -> dict:
        """The fields every record carries about what was run."""
        return {
            "strategy": self.strategy.name,
            "model": self.model.name,
            "data": self.data.label or self.data.name,
            "world_size": self.world_size,
            "global_batch": self.train.global_batch,
            "micro_batches": self.train.micro_batches,
            "steps": self.steps,
            "seed": self.seed,
            "repeat": self.repeat,
            "device": self.device,
            "precision": self.train.precision,
            "augment": data_mod.augments(self.data),
            "tag": self.tag,
            "block": self.block,
            "variant": self.variant(),
            "ignored_strategy_keys": self.ignored,
            "resumed": self.resumed,
        }

    def variant(self) -> str:
        """The strategy options that tell two runs of one strategy apart in a table."""
        return self.strategy_cls.variant(self)


def build_spec(cfg: DictConfig | RunConfig, launching: bool = True) -> RunSpec:
    """Validate ``cfg`` and resolve derived values; raises ConfigError on bad input. ``launching``
    False (profiling, planning, simulating a cluster): the run's GPUs need not be on this host."""
    rc: RunConfig = OmegaConf.to_object(cfg) if isinstance(cfg, DictConfig) else cfg
    t, launch = rc.train, rc.launch

    check_node(rc)  # every closed option set and numeric range the schema declares
    if t.nesterov and (t.optimizer != "sgd" or t.momentum == 0):
        raise ConfigError("train.nesterov=true needs train.optimizer=sgd with train.momentum above 0")
    if rc.model.embed_dim % rc.model.num_heads:
        raise ConfigError(
            f"model.embed_dim={rc.model.embed_dim} must be divisible by model.num_heads={rc.model.num_heads}"
        )

    steps_per_epoch = data_mod.train_size(rc.data) // t.global_batch
    if t.epochs is not None:
        steps = t.epochs * steps_per_epoch
    else:
        steps = t.steps
    if steps < 1:
        raise ConfigError(
            f"train.epochs={t.epochs} of {steps_per_epoch} step(s) each gives no step; "
            "use more epochs or a smaller train.global_batch"
        )

    device = launch.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and launching and torch.cuda.device_count() == 0:
        raise ConfigError("launch.device=cuda but no GPU is visible; use launch.device=cpu")

    cls = strategy_class(rc.strategy.name)
    strategy, ignored = strategy_config(cls, rc.strategy)
    check_node(strategy, "strategy.")  # the strategy's own closed sets and ranges
    if not cls.takes_micro_batches and t.micro_batches not in (None, 1):
        # a sweep may share micro_batches with the synchronous pipelines
        print(
            f"note: strategy={cls.name} moves whole minibatches; train.micro_batches={t.micro_batches} does not "
            "apply (recorded as 1)",
            file=sys.stderr,
        )
        t.micro_batches = 1
    spec = RunSpec(
        model=rc.model,
        data=rc.data,
        strategy=strategy,
        train=t,
        launch=launch,
        logger=rc.logger,
        world_size=rc.world_size,
        seed=rc.seed,
        tag=rc.tag,
        block=rc.block,
        repeat=rc.repeat,
        steps=steps,
        device=device,
        strategy_cls=cls,
        cluster=rc.cluster,
        sim=rc.sim,
        ignored=ignored,
        steps_per_epoch=steps_per_epoch,
    )
    if spec.timed_steps < 1:
        raise ConfigError(
            f"train.steps={steps} leaves no timed step after {t.warmup_steps} warm-up step(s)"
            + (" and the memory step" if t.measure_memory else "")
            + f"; use train.steps>={t.warmup_steps + 1 + int(t.measure_memory)} or lower train.warmup_steps"
        )
    if t.resume is not None:
        checkpoint_folder(t.resume)  # refuses a path without a checkpoint
    if rc.model.pretrained is not None:  # readable, and weights of this model (read at build, not here)
        rc.model.pretrained = os.path.abspath(rc.model.pretrained)  # the record names the file wherever it runs
        if len(pretrained_weights(rc.model)) < len(parameter_shapes(rc.model)):
            print(
                f"note: model.pretrained={rc.model.pretrained} was trained for another number of classes; the "
                f"classifier for model.num_classes={rc.model.num_classes} starts from its initialisation",
                file=sys.stderr,
            )
    data_mod.check_available(rc.data, rc.model.num_classes)
    cls.complete(spec)
    if t.micro_batches is None:  # unset: what this strategy's schedule takes (Strategy.default_micro_batches)
        t.micro_batches = cls.default_micro_batches(spec)
    if t.global_batch < t.micro_batches:
        raise ConfigError(
            f"train.global_batch={t.global_batch} cannot be split into train.micro_batches={t.micro_batches}; "
            "raise the batch or lower the micro-batch count"
        )
    if t.resume is not None:  # every rank's file readable, this strategy's, this model's shapes
        check_checkpoint(t.resume, cls.processes(spec), cls.name, parameter_shapes(rc.model))
    cls.check(spec)
    if device == "cuda" and launching and "WORLD_SIZE" not in os.environ:
        gpus, needed = torch.cuda.device_count(), cls.gpus(spec)
        if needed > gpus:
            raise ConfigError(
                f"world_size={rc.world_size} needs {needed} GPU(s) on this host (one per worker) but "
                f"{gpus} are visible; lower world_size"
            )
    return spec


def strategy_config(cls: type[Strategy], node) -> tuple[StrategyConfig, dict]:
    """``cls``'s own Config from the composed ``strategy`` node, and the pipeline keys it ignores.

    A key set for another strategy is refused in one line naming this strategy's keys; a pipeline
    key this strategy has no concept of (a sweep over strategies sets it for all) is returned as
    ignored, for the record."""
    own = [f.name for f in dataclasses.fields(cls.Config) if f.name != "name"]
    given = {k: v for k, v in vars(node).items() if v is not None and k not in ("name", "_target_")}
    foreign = [k for k in given if k not in own and k not in PIPELINE_KEYS]
    if foreign:
        owners = sorted(
            n for n, c in strategy_classes().items() if foreign[0] in {f.name for f in dataclasses.fields(c.Config)}
        )
        raise ConfigError(
            f"strategy.{foreign[0]}={given[foreign[0]]} does not apply to strategy={cls.name} (it is a key of "
            f"{', '.join(owners)}); strategy={cls.name} takes "
            + (", ".join(f"strategy.{k}" for k in own) or "no strategy keys")
        )
    ignored = {k: v for k, v in given.items() if k not in own}
    return cls.Config(name=cls.name, **{k: v for k, v in given.items() if k in own}), ignored
