"""Profiles and clusters of a run spec, for the commands that measure or predict (profile,
simulate, preview)."""

from __future__ import annotations

import copy
import dataclasses
import os
import re

import torch
from omegaconf import DictConfig

from harness.config.spec import RunSpec
from harness.core.errors import ConfigError
from harness.core.host import threads_per_process
from harness.core.models import num_layers
from harness.planning.planner import Profile
from harness.planning.profiling import Workload, measure_profile
from harness.planning.roofline import GPU_MEMORY_BANDWIDTH, gpu, measured_fraction, roofline_profile
from harness.planning.simulator import Cluster, RuntimeOverhead, fit_runtime_overhead, predict
from harness.run.calibrate import null_step_times
from harness.runtime.partition import stage_ranges
from harness.runtime.schedules import ASYNC


def workload(spec: RunSpec) -> Workload:
    """What a profile of ``spec`` measures: the batch one of its workers computes at a time
    (the strategy's class says how many), with that worker's threads; for a pipeline cut into one
    stage per worker at given boundaries, each stage's own pass too."""
    boundaries = getattr(spec.strategy, "boundaries", None)
    schedule = getattr(spec.strategy, "schedule", None)
    stages = None
    # one stage per worker, run in 1F1B's steady state (AshPipe's too): what the stage factors time
    if boundaries and len(boundaries) + 1 == spec.world_size and schedule in ("1f1b", ASYNC):
        stages = [tuple(r) for r in stage_ranges(list(boundaries), num_layers(spec.model))]
    return Workload(model=spec.model, seed=spec.seed, image_size=spec.data.image_size,
                    samples=spec.strategy_cls.samples_per_forward(spec), workers=spec.world_size,
                    threads=threads_per_process(spec.launch.threads_per_worker, spec.world_size),
                    train=spec.train, num_classes=spec.model.num_classes, precision=spec.train.precision,
                    stages=stages)


def profile_spec(spec: RunSpec, runtime: bool = False) -> Profile:
    """The profile of ``spec`` on this host; with ``runtime``, also the host overheads of its
    strategy's runtime (:func:`measure_runtime_overhead`)."""
    device = torch.device("cuda" if spec.device == "cuda" else "cpu")
    profile = measure_profile(workload(spec), device)
    if runtime:
        profile.runtime = dataclasses.asdict(measure_runtime_overhead(spec, profile))
    return profile


# A model with the same layers (so the same stages, actions and parameter tensors) and almost no
# arithmetic: one token of 8 features. Its runs cost what the runtime costs around the operators.
_NULL_WIDTH = 8


def null_spec(spec: RunSpec, micro_batches: int) -> RunSpec | None:
    """``spec`` on the null model with ``micro_batches`` micro-batches; None where the strategy
    cannot run that many."""
    model = dataclasses.replace(spec.model, embed_dim=_NULL_WIDTH, num_heads=1, mlp_ratio=1.0,
                                patch_size=spec.model.img_size)
    train = dataclasses.replace(spec.train, micro_batches=micro_batches)
    null = dataclasses.replace(spec, model=model, train=train, strategy=copy.deepcopy(spec.strategy),
                               output_dir="", partition_dir="")
    try:
        null.strategy_cls.check(null)
    except ConfigError:
        return None
    return null


def measure_runtime_overhead(spec: RunSpec, profile: Profile) -> RuntimeOverhead:
    """The per-action and per-step host costs of ``spec``'s strategy here: the strategy itself runs
    on the null model (the same workers, schedule and global batch, timed as the worker times a
    step; :mod:`harness.run.calibrate`) with its micro-batches and with twice as many (the action
    count changes, the step count does not), and
    :func:`harness.planning.simulator.fit_runtime_overhead` finds the costs that make the replays
    of those runs, with the null model's own measured layers, take the time they took."""
    device = torch.device("cuda" if spec.device == "cuda" else "cpu")
    cluster = Cluster(name="this host", devices_per_node=spec.world_size, comm_uses_compute=device.type == "cpu")
    cluster.use_network(profile.network)
    nulls, seen = [], []
    for count in (spec.train.micro_batches, 2 * spec.train.micro_batches):
        null = null_spec(spec, count)
        if null is None:
            continue
        layout = null.strategy_cls.simulated(null, profile, cluster)
        if layout not in seen:  # a strategy whose actions do not follow the micro-batches (DP) runs once
            nulls.append(null)
            seen.append(layout)
    measured = null_step_times(nulls)
    # the null model's own layers at each run's micro-batch size; the per-sample costs of layers
    # this small depend on it
    profiles = [measure_profile(workload(null), device, network=profile.network) for null in nulls]
    layouts = [null.strategy_cls.simulated(null, p, cluster) for null, p in zip(nulls, profiles)]
    runs = [(layout, null.world_size, null.train.global_batch, t, p)
            for layout, null, t, p in zip(layouts, nulls, measured, profiles)]
    per_action, per_step = fit_runtime_overhead(cluster, runs)
    calibration = [{"micro_batches": null.train.micro_batches, "measured_step_s": t,
                    "replayed_step_s": predict(p, cluster, layout, null.world_size, null.train.global_batch,
                                               overhead=(per_action, per_step)).iteration_s}
                   for layout, null, t, p in zip(layouts, nulls, measured, profiles)]
    return RuntimeOverhead(layouts[0].strategy, layouts[0].schedule, per_action, per_step, calibration)
def default_path(spec: RunSpec) -> str:
    precision = "" if spec.train.precision == "fp32" else f"-{spec.train.precision}"
    return os.path.join("profiles", f"{spec.model.name}-{spec.device}{precision}.json")


def cluster_of(cfg: DictConfig, profile: Profile) -> Cluster:
    """The simulator's Cluster from the ``cluster`` config node (which mirrors it, plus
    ``use_profile_network``: simulate the profiled machine's own network)."""
    cluster = _configured(cfg)
    if cfg.cluster.use_profile_network:
        cluster.use_network(profile.network)
    return cluster


def _configured(cfg: DictConfig) -> Cluster:
    return Cluster(**{f.name: cfg.cluster[f.name] for f in dataclasses.fields(Cluster)})


def roofline_of(cfg: DictConfig, spec: RunSpec) -> Profile:
    """The roofline profile of ``spec`` on ``sim.gpu`` at the samples one of its workers computes
    per forward; the achieved fraction from ``sim.gpu_profile`` where given, else assumed."""
    sim = cfg.sim
    fraction, source = sim.gpu_fraction, "assumed"
    if sim.gpu_profile:
        if not os.path.isfile(sim.gpu_profile):
            raise ConfigError(f"sim.gpu_profile={sim.gpu_profile} does not exist; make one on the GPU with "
                              "python -m harness.profile launch.device=cuda")
        with open(sim.gpu_profile) as f:
            measured = Profile.from_json(f.read())
        gpu_name = measured.meta.get("gpu") or ""
        if not gpu_name or not any(re.search(p, gpu_name) for p, _ in GPU_MEMORY_BANDWIDTH) or \
                not re.search(re.escape(sim.gpu), gpu_name):
            raise ConfigError(f"sim.gpu_profile={sim.gpu_profile} was measured on '{gpu_name or 'a CPU'}', not on "
                              f"sim.gpu={sim.gpu}")
        fraction = measured_fraction(measured, spec.model, spec.data.image_size, spec.train.precision, gpu_name)
        source = f"measured: {sim.gpu_profile}"
    try:
        device = gpu(sim.gpu, spec.train.precision, fraction, source)
    except ValueError as e:
        raise ConfigError(f"sim.gpu={sim.gpu}: {e}") from None
    return roofline_profile(spec.model, spec.data.image_size, spec.strategy_cls.samples_per_forward(spec),
                            spec.train.precision, device, _configured(cfg).network())
