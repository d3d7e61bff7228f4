"""Pipeline layouts from a run spec: the rules every pipeline strategy shares.

Checks a pipeline layout before launch (ConfigErrors that name the config keys
live here, never in the runtime), resolves the recomputation rule, cuts the
layer list (explicit boundaries, or balanced on costs measured on rank 0 and
broadcast so every rank agrees), and hands the runtime a plain
:class:`harness.runtime.stage.PipelineLayout`. Our strategies and the pipeline
baselines use the same rules, so they compare on the same partition.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import dataclass

import torch
from torch import nn

from harness.core.comm import Comm, DistContext
from harness.core.errors import ConfigError
from harness.core.models import activation_shapes, num_layers, visiting
from harness.core.training import with_precision
from harness.planning.planner import Profile
from harness.planning.simulator import SimLayout
from harness.runtime.executor import StageExecutor
from harness.runtime.partition import balanced_boundaries, measure_layer_costs, stage_ranges
from harness.runtime.schedules import SCHEDULES, Schedule, ScheduleError
from harness.runtime.stage import PipelineLayout

RECOMPUTE_HELP = "use none, auto, all or a list of layer indices such as [1,2]"


def check_boundaries(boundaries: list[int], n_layers: int, stages: int) -> list[int]:
    b = list(boundaries)
    if len(b) != stages - 1:
        raise ConfigError(
            f"strategy.boundaries={b} must list {stages - 1} layer index(es) for {stages} stages "
            "(the first layer of each stage after the first)"
        )
    if any(not 0 < x < n_layers for x in b) or any(x >= y for x, y in zip(b, b[1:])):
        raise ConfigError(
            f"strategy.boundaries={b} must be strictly increasing layer indices between 1 and {n_layers - 1}"
        )
    return b


def uniform_replicas(spec) -> list[int]:
    """``world_size / stages`` replicas in every stage (Hippie and the pipeline baselines)."""
    stages = spec.strategy.stages
    if stages < 1:
        raise ConfigError(f"strategy.stages={stages} must be at least 1")
    if spec.world_size % stages:
        raise ConfigError(
            f"world_size={spec.world_size} is not divisible by strategy.stages={stages}; "
            f"{spec.strategy.name} needs the same number of replicas in every stage"
        )
    return [spec.world_size // stages] * stages


def micro_batch_samples(spec) -> int:
    """Samples one worker of a uniform pipeline puts through a forward: a micro-batch's share of
    its stage's replicas."""
    return max(1, spec.train.global_batch // spec.train.micro_batches // uniform_replicas(spec)[0])


def check_layout(spec, replicas: list[int], stages_per_rank: int = 1) -> None:
    """Pre-launch checks common to every pipeline strategy (``replicas`` per rank position of a
    pipeline; each position holds ``stages_per_rank`` stages)."""
    st, t = spec.strategy, spec.train
    n_layers = num_layers(spec.model)
    stages = len(replicas) * stages_per_rank
    if stages > n_layers:
        many = f" x strategy.stages_per_rank={stages_per_rank} = {stages} stages" if stages_per_rank > 1 else ""
        raise ConfigError(
            f"strategy.stages={len(replicas)}{many} exceeds the {n_layers} layers of {spec.model.name} "
            f"(embedding, {spec.model.depth} blocks, head); use at most {n_layers} stages"
        )
    if any(r < 1 for r in replicas):
        raise ConfigError(f"strategy.replicas={replicas}: every stage needs at least one replica")
    if sum(replicas) != spec.world_size:
        raise ConfigError(
            f"strategy.replicas={replicas} sums to {sum(replicas)} but world_size={spec.world_size}; make them match"
        )
    if st.boundaries is not None:
        check_boundaries(list(st.boundaries), n_layers, stages)
    smallest_micro = t.global_batch // t.micro_batches
    if smallest_micro < max(replicas):
        raise ConfigError(
            f"train.global_batch={t.global_batch} in {t.micro_batches} micro-batch(es) gives micro-batches of "
            f"{smallest_micro} sample(s), fewer than the {max(replicas)} replicas of a stage; "
            f"raise train.global_batch to at least {t.micro_batches * max(replicas)} or lower train.micro_batches"
        )
    resolve_recompute(getattr(st, "recompute", "none"), n_layers, (0, n_layers), last_stage=False)


def check_stages_per_rank(spec, schedule: Schedule, offered: list[str]) -> None:
    """Refuse several stages per rank under a schedule that places one (``offered``: the
    schedules the strategy runs, of which those that place several are named)."""
    v = spec.strategy.stages_per_rank
    if schedule.placement == "one" and v != 1:
        several = [s for s in offered if SCHEDULES[s].placement != "one"]
        raise ConfigError(
            f"strategy.schedule={schedule.name} runs one stage per rank; set strategy.stages_per_rank=1 "
            f"or use a schedule with several: {', '.join(several)}"
        )


def refuse_unrunnable(schedule: Schedule, ranks: int, stages_per_rank: int, micro_batches: int) -> None:
    """Refuse before launch a schedule our executor cannot run: one that cannot take this shape or
    cannot finish (replayed without processes), or one with an action kind the executor has no
    method for."""
    try:
        lists = schedule.check(ranks, stages_per_rank, micro_batches)
    except ScheduleError as e:
        raise ConfigError(
            f"strategy.schedule={schedule.name} cannot run train.micro_batches={micro_batches} on {ranks} stage(s): {e}"
        ) from None
    missing = StageExecutor.unsupported(lists)
    if missing:
        raise ConfigError(
            f"strategy.schedule={schedule.name} has actions {', '.join(missing)} that our runtime's executor "
            f"does not run (it runs {', '.join(StageExecutor.ACTIONS)})"
        )


def resolve_recompute(rule, n_layers: int, layer_range: tuple[int, int], last_stage: bool) -> set[int]:
    """Global indices of this stage's layers to recompute in backward.

    - ``none``: nothing;
    - ``auto``: every transformer block, except on the last stage (Hippie's
      last-stage scheduling, as in Merak: 1F1B consumes the last stage's
      activations right after its forward, so recomputing there only costs time);
    - ``all``: every layer of every stage, the last included (an explicit upper bound);
    - a list of layer indices: those layers, except on the last stage.
    """
    lo, hi = layer_range
    if isinstance(rule, str):
        if rule == "none":
            return set()
        if rule == "all":
            return set(range(lo, hi))
        if rule == "auto":
            return set() if last_stage else {i for i in range(lo, hi) if 0 < i < n_layers - 1}
        raise ConfigError(f"strategy.recompute={rule} is not understood; {RECOMPUTE_HELP}")
    try:
        indices = {int(i) for i in rule}
    except (TypeError, ValueError):
        raise ConfigError(f"strategy.recompute={rule} is not understood; {RECOMPUTE_HELP}") from None
    bad = sorted(i for i in indices if not 0 <= i < n_layers)
    if bad:
        raise ConfigError(f"strategy.recompute lists layers {bad} outside 0..{n_layers - 1}; {RECOMPUTE_HELP}")
    return set() if last_stage else {i for i in indices if lo <= i < hi}


def recompute_of_stages(rule, n_layers: int, ranges: list[tuple[int, int]]) -> frozenset[int]:
    """The rule applied to every stage (the last stage is the last range)."""
    return frozenset(
        i for s, r in enumerate(ranges) for i in resolve_recompute(rule, n_layers, r, last_stage=s == len(ranges) - 1)
    )


@dataclass(frozen=True)
class Partition:
    """Where a run cut the layer list, and how it came by the cut (for its record)."""

    boundaries: list[int]
    # given (strategy.boundaries) | measured (by this run) | shared (measured by an earlier run of
    # the sweep, read from its partitions/ folder) | planned (AshPipe's planner) | deepspeed's <method>
    source: str


def resolve_boundaries(spec, layers: list[nn.Module], ctx: DistContext, comm: Comm, replicas: list[int]) -> Partition:
    """``strategy.boundaries`` if given, else a balance of per-layer costs measured on rank 0 and
    broadcast, so every rank cuts alike. Within a sweep (``spec.partition_dir`` set) the cut is
    measured once per model, device, micro-batch size and stage count and every later run of the
    sweep reuses it, so every strategy of a sweep compares on the same partition."""
    if spec.strategy.boundaries is not None:
        return Partition(list(spec.strategy.boundaries), "given")
    found = None
    if ctx.rank == 0:
        try:
            found = _shared_or_measured(spec, layers, ctx.device, replicas)
        except ConfigError as e:  # every rank raises it, none waits for a cut that does not come
            found = e
    found = comm.broadcast_object(found)
    if isinstance(found, ConfigError):
        raise found
    return found


def _micro_batch(spec, replicas: list[int]) -> int:
    """Samples one replica computes per micro-batch: the batch layer costs are measured at."""
    return max(1, spec.train.global_batch // spec.train.micro_batches // max(replicas))


def _shared_or_measured(spec, layers: list[nn.Module], device: torch.device, replicas: list[int]) -> Partition:
    if not spec.partition_dir:
        return Partition(_measured_boundaries(spec, layers, device, replicas), "measured")
    model = hashlib.sha1(json.dumps(vars(spec.model), sort_keys=True, default=str).encode()).hexdigest()[:8]
    name = f"{spec.model.name}-{model}-{device.type}-micro{_micro_batch(spec, replicas)}-stages{len(replicas)}.json"
    path = os.path.join(spec.partition_dir, name)
    if not os.path.isfile(path):
        measured = {
            "boundaries": _measured_boundaries(spec, layers, device, replicas),
            "measured_by": spec.strategy.name,
            "micro_batch": _micro_batch(spec, replicas),
        }
        os.makedirs(spec.partition_dir, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=spec.partition_dir, prefix=".partition.")
        with os.fdopen(fd, "w") as f:
            json.dump(measured, f)
        try:
            os.link(tmp, path)  # atomic, and fails if a run in parallel measured first: its cut wins
            return Partition(measured["boundaries"], "measured")
        except FileExistsError:
            pass
        except OSError:  # a file system without hard links: a whole file by rename, the last one stands
            os.replace(tmp, path)
            return Partition(measured["boundaries"], "measured")
        finally:
            if os.path.exists(tmp):
                os.remove(tmp)
    try:
        with open(path) as f:
            return Partition(list(json.load(f)["boundaries"]), "shared")
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ConfigError(
            f"the sweep's partition file {path} cannot be read ({type(e).__name__}: {e}); delete it "
            "and the sweep's next pipeline measures the cut again"
        ) from None


def _measured_boundaries(spec, layers: list[nn.Module], device: torch.device, replicas: list[int]) -> list[int]:
    """Balance forward+backward time measured on this device at the micro-batch size."""
    size = spec.data.image_size
    sample = torch.randn(_micro_batch(spec, replicas), 3, size, size, device=device)
    with visiting(layers, device):  # timed in the run's precision
        return balanced_boundaries(
            measure_layer_costs(with_precision(layers, spec.train.precision), sample), len(replicas)
        )


def boundary_shapes(spec, ranges: list[tuple[int, int]]) -> tuple[tuple[int, ...], ...]:
    """Per-sample shape of each stage's input, then of the model's output."""
    image = (3, spec.data.image_size, spec.data.image_size)
    layer_shapes = activation_shapes(spec.model, image)
    return tuple(image if a == 0 else layer_shapes[a - 1] for a, _ in ranges) + (layer_shapes[-1],)


def pipeline_layout(
    spec,
    layers: list[nn.Module],
    ctx: DistContext,
    comm: Comm,
    replicas: list[int],
    partition: Partition | None = None,
    recompute: set[int] | None = None,
    bucket_mb: float = 4.0,
    place: list[int] | None = None,
) -> tuple[PipelineLayout, Partition]:
    """The runtime's layout for this spec, and its partition. ``replicas`` are per stage, and
    ``place`` the rank position of each where a rank holds several. ``partition`` and
    ``recompute`` (global layer indices) override the spec's rules when a planner has chosen
    them. Collective when the boundaries are measured."""
    if partition is None:
        partition = resolve_boundaries(spec, layers, ctx, comm, replicas)
    boundaries = partition.boundaries
    n = len(layers)
    ranges = stage_ranges(boundaries, n)
    if recompute is None:
        recompute = recompute_of_stages(getattr(spec.strategy, "recompute", "none"), n, ranges)
    layout = PipelineLayout(
        replicas=tuple(replicas),
        boundaries=tuple(boundaries),
        micro_batches=spec.train.micro_batches,
        recompute=frozenset(recompute),
        boundary_shapes=boundary_shapes(spec, ranges),
        bucket_bytes=int(bucket_mb * 2**20),
        place=tuple(place) if place is not None else None,
    )
    return layout, partition


def simulated_synchronous_pipeline(spec, profile: Profile) -> SimLayout:
    """The simulator's layout of a synchronous pipeline with uniform replicas whose replica
    all-reduce overlaps the last backward (Hippie's buckets, DDP across torch pipelining's
    replicas), on the strategy's schedule, recomputation rule and stages per rank."""
    st = spec.strategy
    return simulated_pipeline(
        spec,
        profile,
        uniform_replicas(spec),
        st.schedule,
        hides_allreduce=True,
        recompute_rule=st.recompute,
        stages_per_rank=st.stages_per_rank,
    )


def simulated_pipeline(
    spec,
    profile: Profile,
    replicas: list[int],
    schedule: str,
    *,
    hides_allreduce: bool,
    recompute_rule="none",
    stashes_weights: bool = False,
    micro_batches: int | None = None,
    stages_per_rank: int = 1,
) -> SimLayout:
    """A pipeline strategy's layout for the simulator, cut by the same rule as a real run
    (given boundaries, else balanced on the profile's per-layer costs into ``stages_per_rank``
    stages per rank position)."""
    n = len(profile.layers)
    if n != num_layers(spec.model):
        raise ConfigError(
            f"the profile has {n} layers but {spec.model.name} as configured has {num_layers(spec.model)}; "
            "profile this model as configured (pipebench profile with the same model.* keys)"
        )
    boundaries = getattr(spec.strategy, "boundaries", None)
    if boundaries is None:
        costs = [l.forward_s + l.backward_s for l in profile.layers]
        stages = len(replicas) * stages_per_rank
        boundaries = balanced_boundaries(costs, stages) if stages > 1 else []
    ranges = stage_ranges(list(boundaries), n)
    return SimLayout(
        strategy=spec.strategy.name,
        replicas=list(replicas),
        boundaries=list(boundaries),
        micro_batches=micro_batches or spec.train.micro_batches,
        schedule=schedule,
        recompute=set(recompute_of_stages(recompute_rule, n, ranges)),
        hides_allreduce=hides_allreduce,
        stashes_weights=stashes_weights,
        stages_per_rank=stages_per_rank,
    )
