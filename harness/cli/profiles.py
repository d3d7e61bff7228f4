"""A profile of a run spec: what ``python -m harness.profile`` saves and ``harness.simulate``
measures when given none."""

from __future__ import annotations

import os

import torch

from harness.config.spec import RunSpec
from harness.host import threads_per_process
from harness.planning.planner import Profile
from harness.planning.profiling import Workload, measure_profile


def workload(spec: RunSpec) -> Workload:
    """What a profile of ``spec`` measures: the batch one of its workers computes at a time
    (the strategy's class says how many), with that worker's threads."""
    return Workload(model=spec.model, seed=spec.seed, image_size=spec.data.image_size,
                    samples=spec.strategy_cls.samples_per_forward(spec), workers=spec.world_size,
                    threads=threads_per_process(spec.launch.threads_per_worker, spec.world_size),
                    train=spec.train, num_classes=spec.model.num_classes)


def profile_spec(spec: RunSpec) -> Profile:
    device = torch.device("cuda" if spec.device == "cuda" else "cpu")
    return measure_profile(workload(spec), device)


def default_path(spec: RunSpec) -> str:
    return os.path.join("profiles", f"{spec.model.name}-{spec.device}.json")
