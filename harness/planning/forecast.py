"""From a validated run spec to a prediction: the one path simulate, preview and sensitivity take.

``spec`` is a validated run spec (read only): its strategy's class gives the layout it
would run (``simulated``), ``spec.cluster`` the cluster and ``spec.sim`` where the
compute costs come from: the roofline model of a named GPU (``sim.compute=roofline``,
its achieved fraction assumed or taken from ``sim.gpu_profile``), a profile file
(``sim.profile``), a profile in ``profiles/`` for the model and device (where the caller
takes shipped ones: the preview), or one measured now.
"""

from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass

import torch

from harness.core.errors import ConfigError
from harness.core.host import threads_per_process
from harness.core.models import num_layers
from harness.planning.planner import Profile
from harness.planning.profiling import Workload, measure_profile
from harness.planning.roofline import GPU_MEMORY_BANDWIDTH, gpu, measured_fraction, roofline_profile
from harness.planning.simulator import Cluster, Prediction, Spread, predict, predict_spread
from harness.runtime.partition import stage_ranges
from harness.runtime.schedules import ASYNC

# the checkout's shipped profiles (a regular install has none: pass sim.profile)
SHIPPED = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "profiles")


@dataclass
class Forecast:
    prediction: Prediction
    profile: Profile
    cluster: Cluster
    source: str  # where the compute costs came from
    spread: Spread | None = None  # the replay's draws (sim.draws), where asked for


# a drawn run's throughput averages at most this many replayed steps: the jitter of more averages
# out (a 25-step run's mean varies a fifth as much as one step), the host's level does not
SPREAD_STEPS = 25


def workload_of(spec) -> Workload:
    """What a profile of ``spec`` measures: the batch one of its workers computes at a time (the
    strategy's class says how many), with that worker's threads; for a pipeline cut into one stage
    per worker at given boundaries, each stage's own pass too."""
    boundaries = getattr(spec.strategy, "boundaries", None)
    schedule = getattr(spec.strategy, "schedule", None)
    stages = None
    # one stage per worker, run in 1F1B's steady state (AshPipe's too): what the stage factors time
    if boundaries and len(boundaries) + 1 == spec.world_size and schedule in ("1f1b", ASYNC):
        stages = [tuple(r) for r in stage_ranges(list(boundaries), num_layers(spec.model))]
    return Workload(
        model=spec.model,
        seed=spec.seed,
        image_size=spec.data.image_size,
        samples=spec.strategy_cls.samples_per_forward(spec),
        workers=spec.world_size,
        threads=threads_per_process(spec.launch.threads_per_worker, spec.world_size),
        train=spec.train,
        num_classes=spec.model.num_classes,
        precision=spec.train.precision,
        stages=stages,
    )


def device_of(spec) -> torch.device:
    return torch.device("cuda" if spec.device == "cuda" else "cpu")


def shipped_name(spec) -> str:
    """``<model>-<device>[-<precision>].json``: what ``pipebench profile`` writes by default."""
    precision = "" if spec.train.precision == "fp32" else f"-{spec.train.precision}"
    return f"{spec.model.name}-{spec.device}{precision}.json"


def read_profile(path: str, key: str = "sim.profile") -> Profile:
    """The profile at ``path``; one line naming the file where it is missing or cannot be read."""
    if not os.path.isfile(path):
        raise ConfigError(f"{key}={path} does not exist; make one with pipebench profile")
    try:
        with open(path) as f:
            return Profile.from_json(f.read())
    except ConfigError:
        raise
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ConfigError(
            f"the profile {path} cannot be read ({type(e).__name__}: {e}); make it again with pipebench profile"
        ) from None


def profile_for(spec, shipped: bool = False, measure: bool = True) -> tuple[Profile | None, str]:
    """The profile a prediction of ``spec`` uses, and where it came from (see the module docstring):
    with ``shipped``, a profile in ``profiles/`` before measuring one; (None, why) where none exists
    and ``measure`` is off."""
    sim = spec.sim
    if sim.compute == "roofline":
        return roofline_of(spec)
    if sim.profile:
        return read_profile(sim.profile), sim.profile
    for folder in ("profiles", SHIPPED) if shipped else ():
        path = os.path.join(folder, shipped_name(spec))
        if os.path.isfile(path):
            return read_profile(path), path
    if not measure:
        return None, f"no profile of {spec.model.name} on {spec.device} (pipebench profile makes one)"
    return measure_profile(workload_of(spec), device_of(spec)), "measured now"


def roofline_of(spec) -> tuple[Profile, str]:
    """The roofline profile of ``spec`` on ``sim.gpu`` at the samples one of its workers computes
    per forward; the achieved fraction from ``sim.gpu_profile`` where given, else assumed."""
    sim = spec.sim
    fraction, source = sim.gpu_fraction, "assumed"
    if sim.gpu_profile:
        measured = read_profile(sim.gpu_profile, "sim.gpu_profile")
        gpu_name = measured.meta.get("gpu") or ""
        if (
            not gpu_name
            or not any(re.search(p, gpu_name) for p, _ in GPU_MEMORY_BANDWIDTH)
            or not re.search(re.escape(sim.gpu), gpu_name)
        ):
            raise ConfigError(
                f"sim.gpu_profile={sim.gpu_profile} was measured on '{gpu_name or 'a CPU'}', not on sim.gpu={sim.gpu}"
            )
        fraction = measured_fraction(measured, spec.model, spec.data.image_size, spec.train.precision, gpu_name)
        source = f"measured: {sim.gpu_profile}"
    try:
        device = gpu(sim.gpu, spec.train.precision, fraction, source)
    except ValueError as e:
        raise ConfigError(f"sim.gpu={sim.gpu}: {e}") from None
    profile = roofline_profile(
        spec.model,
        spec.data.image_size,
        spec.strategy_cls.samples_per_forward(spec),
        spec.train.precision,
        device,
        configured_cluster(spec).network(),
    )
    return profile, f"roofline {sim.gpu} at {fraction:.2f} of its datasheet ({source})"


def configured_cluster(spec) -> Cluster:
    return Cluster(**{f.name: getattr(spec.cluster, f.name) for f in dataclasses.fields(Cluster)})


def cluster_of(spec, profile: Profile) -> Cluster:
    """The simulator's Cluster from ``spec.cluster`` (which mirrors it, plus ``use_profile_network``:
    simulate the profiled machine's own network)."""
    cluster = configured_cluster(spec)
    if spec.cluster.use_profile_network:
        cluster.use_network(profile.network)
    return cluster


def forecast(spec, profile: Profile | None = None, shipped: bool = False, measure: bool = True) -> Forecast | None:
    """The prediction for ``spec`` on ``spec.cluster``: its strategy's own layout (the same rules a real
    run uses) replayed with the profile's costs (given, else :func:`profile_for`'s); None where there
    is no profile and ``measure`` is off."""
    source = "given"
    if profile is None:
        profile, source = profile_for(spec, shipped, measure)
        if profile is None:
            return None
    cluster = cluster_of(spec, profile)
    layout = spec.strategy_cls.simulated(spec, profile, cluster)
    spread = None
    if spec.sim.draws and spec.sim.compute == "roofline":
        raise ConfigError(
            "sim.draws draws from a measured profile's spread, which the roofline model has not: "
            "give sim.compute=profile with sim.profile, or sim.draws=0"
        )
    if spec.sim.draws:  # a run's measured steps: those after its warm-up
        spread = predict_spread(
            profile,
            cluster,
            layout,
            spec.world_size,
            spec.train.global_batch,
            spec.sim.draws,
            min(SPREAD_STEPS, spec.train.steps - spec.train.warmup_steps),
            seed=spec.seed,
        )
    return Forecast(
        predict(profile, cluster, layout, spec.world_size, spec.train.global_batch), profile, cluster, source, spread
    )
