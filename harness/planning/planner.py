"""AshPipe's planner: stage boundaries and a replica count per stage, from measurements.

PipeDream's profile + dynamic programming, extended (as AshPipe does) with a
replica count per stage. Inputs are measured: per-layer forward and backward
time, output bytes, bytes saved for backward and parameter bytes on the target
device, and point-to-point and all-reduce bandwidth between workers
(:mod:`harness.planning.profiling`); this module only decides.

Cost of a stage over layers [i, j) with m replicas, for a global batch B
(every AshPipe stage processes all of B, each replica B/m of it):

    time    = compute(i..j) * B/m  +  allreduce(params, m)  +  transfer in + out
    compute = forward + backward per sample (+ forward again if recomputed)
    allreduce(P, m) = 2 * P / bandwidth * (m - 1) / m  (+ latency)
    transfer = B/m * boundary activation bytes / p2p bandwidth, per side

The AshPipe reference divides (compute + allreduce) by m, PipeDream's rule for
round-robin replicas; in AshPipe's runtime (and ours) every replica all-reduces
after every minibatch, so the all-reduce is not divided: we model what runs.

Memory of a replica of stage s (S stages): ``versions = S - s`` (warm-up + 1)
stashed weight versions and minibatches in flight,

    memory = versions * (B/m * saved bytes + params) + params + optimizer state

and if that exceeds the limit the stage falls back to recomputation (only
layer inputs are kept). The search minimises the slowest stage (the
steady-state time per minibatch of an asynchronous pipeline) over all
contiguous splits and replica counts that use exactly ``world_size`` workers.
"""

from __future__ import annotations

import functools
import json
from dataclasses import asdict, dataclass, field

import numpy as np

from harness.core.errors import ConfigError

PROFILE_VERSION = 1


@dataclass
class LayerProfile:
    name: str
    forward_s: float  # per sample
    backward_s: float  # per sample
    output_bytes: int  # per sample
    saved_bytes: int  # per sample: tensors autograd keeps for backward (parameters excluded)
    input_bytes: int  # per sample
    param_bytes: int
    # per sample: the backward's input-gradient and weight-gradient parts when run apart, as the
    # zero-bubble schedules run them (None in a profile made before they were timed)
    backward_input_s: float | None = None
    backward_weight_s: float | None = None


@dataclass
class Network:
    p2p_bytes_per_s: float
    allreduce_bytes_per_s: float  # bus bandwidth: 2*(n-1)/n * size / time
    latency_s: float = 0.0
    # gloo moves a message once its receive is posted: what a receive posted after its send waits
    # more when the sender is computing then than when it is idle (0: not measured)
    late_receive_s: float = 0.0
    # each measured round trip of a small message over their median: how a transfer's time varies
    # (the replay's draws; None: not measured)
    spread: list[float] | None = None


@dataclass
class Profile:
    layers: list[LayerProfile]
    network: Network
    device: str
    batch: int  # samples per measurement
    optimizer_state_per_param_byte: float = 2.0  # AdamW keeps two moments
    meta: dict = field(default_factory=dict)
    # measured forward, loss and backward of a whole model over the sum of the isolated layer
    # times at the same batch: what layer-by-layer timing leaves out
    step_factor: float = 1.0
    # measured optimizer update (AdamW) seconds per parameter byte
    optimizer_s_per_byte: float = 0.0
    version: int = PROFILE_VERSION
    # the host's own costs of the runtimes measured (per action, per step), one entry per strategy
    # and schedule, each from null-model runs (harness.planning.simulator.RuntimeOverhead's fields):
    # the strategy profiled, and any added later (pipebench profile sim.profile=...); None: none
    runtime: list[dict] | None = None
    # workers measuring side by side, started together pass after pass: the slowest one's time over
    # one's (harness.planning.profiling.meeting_factor); 1 for one worker
    meeting_factor: float = 1.0
    # a pipeline of one stage per worker, each stage's steady-state pass (as 1F1B runs it) timed by
    # its own process while the others time theirs (harness.planning.profiling): {"boundaries": first
    # layer of stages 1..S-1, "factors": per stage, its pass over the sum of its layers' isolated
    # times}; None: not measured (the step factor applies to every stage)
    stage_factors: dict | None = None
    # a CPU host's processes compute slower after sleeping in a wait: [seconds asleep, what a forward
    # or a backward then adds], ascending (harness.planning.profiling._wake_s); None: not measured
    wake: list | None = None
    # how a compute's time varies (harness.planning.profiling.compute_spread): {"level": each
    # measuring round's median whole pass over their median, "jitter": each pass over its round's};
    # the replay draws from them (harness.planning.simulator.predict_spread); None: not measured
    spread: dict | None = None

    def wake_s(self, idle: float) -> float:
        """What a forward or a backward adds after ``idle`` seconds of waiting: linear between the
        measured sleeps (from none after no sleep), the longest's beyond it."""
        if not self.wake or idle <= 0:
            return 0.0
        return float(np.interp(idle, [0.0, *(i for i, _ in self.wake)], [0.0, *(e for _, e in self.wake)]))

    def stage_factors_for(self, boundaries: list[int]) -> list[float] | None:
        """The measured factor that scales each stage's isolated layer times to its pass, for a
        pipeline cut at ``boundaries``; None where the profile did not time that cut."""
        sf = self.stage_factors
        return list(sf["factors"]) if sf and list(sf["boundaries"]) == list(boundaries) else None

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)

    @staticmethod
    def from_json(text: str) -> "Profile":
        d = json.loads(text)
        if d.get("version") != PROFILE_VERSION:
            raise ConfigError(f"profile version {d.get('version')} is not {PROFILE_VERSION}; profile again")
        return Profile(
            layers=[LayerProfile(**l) for l in d["layers"]],
            network=Network(**d["network"]),
            device=d["device"],
            batch=d["batch"],
            optimizer_state_per_param_byte=d.get("optimizer_state_per_param_byte", 2.0),
            meta=d.get("meta", {}),
            step_factor=d.get("step_factor", 1.0),
            optimizer_s_per_byte=d.get("optimizer_s_per_byte", 0.0),
            runtime=_runtimes(d.get("runtime")),
            meeting_factor=d.get("meeting_factor", 1.0),
            stage_factors=d.get("stage_factors"),
            wake=d.get("wake"),
            spread=d.get("spread"),
        )


def _runtimes(stored) -> list[dict] | None:
    """A profile's runtime overheads as a list (profiles written before several could be kept hold one)."""
    return [stored] if isinstance(stored, dict) else stored


@dataclass
class StageChoice:
    first: int
    last: int  # exclusive
    replicas: int
    versions: int
    recompute: bool
    compute_s: float
    allreduce_s: float
    transfer_s: float
    memory_bytes: float

    @property
    def time_s(self) -> float:
        return self.compute_s + self.allreduce_s + self.transfer_s


@dataclass
class Plan:
    stages: list[StageChoice]
    global_batch: int
    world_size: int

    @property
    def replicas(self) -> list[int]:
        return [s.replicas for s in self.stages]

    @property
    def boundaries(self) -> list[int]:
        return [s.first for s in self.stages[1:]]

    @property
    def step_s(self) -> float:
        return max(s.time_s for s in self.stages)

    @property
    def recompute_layers(self) -> list[int]:
        return [i for s in self.stages if s.recompute for i in range(s.first, s.last)]

    def describe(self, layer_names: list[str] | None = None, data_parallel: "StageChoice | None" = None) -> str:
        n_layers = self.stages[-1].last
        names = layer_names or [str(i) for i in range(n_layers)]
        lines = [
            f"AshPipe plan for {self.world_size} workers, global batch {self.global_batch}: "
            f"{len(self.stages)} stage(s), replicas {self.replicas}, boundaries {self.boundaries}",
            f"predicted time per minibatch {self.step_s * 1e3:.2f} ms "
            f"({self.global_batch / self.step_s:.1f} samples/s in steady state)",
            f"{'stage':>5} {'layers':>14} {'replicas':>8} {'compute ms':>10} {'allreduce ms':>12} "
            f"{'transfer ms':>11} {'total ms':>9} {'memory MiB':>10}  note",
        ]
        slowest = max(range(len(self.stages)), key=lambda k: self.stages[k].time_s)
        for k, s in enumerate(self.stages):
            notes = []
            if k == slowest:
                notes.append("bottleneck")
            if s.recompute:
                notes.append("recomputes (did not fit otherwise)")
            layer_desc = f"{s.first}..{s.last - 1}" if s.last - s.first > 1 else f"{s.first}"
            lines.append(
                f"{k:>5} {layer_desc:>14} {s.replicas:>8} {s.compute_s * 1e3:>10.2f} {s.allreduce_s * 1e3:>12.2f} "
                f"{s.transfer_s * 1e3:>11.2f} {s.time_s * 1e3:>9.2f} {s.memory_bytes / 2**20:>10.1f}  "
                + ", ".join(notes)
            )
        kinds = []
        for i, name in enumerate(names):
            if kinds and kinds[-1][0] == name:
                kinds[-1][2] = i
            else:
                kinds.append([name, i, i])
        lines.append("layers: " + ", ".join(f"{a}..{b} {n}" if a != b else f"{a} {n}" for n, a, b in kinds))
        lines.append(
            "why: every contiguous split and replica count using all workers was costed; this one has "
            "the fastest slowest stage, which sets the time per minibatch of an asynchronous pipeline."
        )
        if data_parallel is not None:
            lines.append(
                f"versus data parallelism on all {self.world_size} workers: {data_parallel.time_s * 1e3:.2f} ms "
                f"per minibatch (compute {data_parallel.compute_s * 1e3:.2f}, all-reduce "
                f"{data_parallel.allreduce_s * 1e3:.2f}); predicted speedup "
                f"{data_parallel.time_s / self.step_s:.3f}x"
            )
        return "\n".join(lines)


def stage_cost(
    profile: Profile, first: int, last: int, replicas: int, versions: int, global_batch: int, memory_limit: float | None
) -> StageChoice | None:
    """The stage's cost, with recomputation if needed to fit; None if it cannot fit at all."""
    layers = profile.layers[first:last]
    share = global_batch / replicas
    params = sum(l.param_bytes for l in layers)
    net = profile.network
    allreduce = 0.0
    if replicas > 1:
        allreduce = 2 * params / net.allreduce_bytes_per_s * (replicas - 1) / replicas + net.latency_s
    transfer = 0.0
    if first > 0:
        transfer += share * profile.layers[first - 1].output_bytes / net.p2p_bytes_per_s + net.latency_s
    if last < len(profile.layers):
        transfer += share * layers[-1].output_bytes / net.p2p_bytes_per_s + net.latency_s
    fixed = params * (1 + profile.optimizer_state_per_param_byte)
    for recompute in (False, True):
        kept = sum(l.input_bytes for l in layers) if recompute else sum(l.saved_bytes for l in layers)
        memory = versions * (share * kept + params) + fixed
        if memory_limit is None or memory <= memory_limit:
            compute = share * sum(l.forward_s * (2 if recompute else 1) + l.backward_s for l in layers)
            return StageChoice(first, last, replicas, versions, recompute, compute, allreduce, transfer, memory)
    return None


def data_parallel_cost(profile: Profile, world_size: int, global_batch: int) -> StageChoice:
    """Plain data parallelism as a one-stage plan (no memory limit), for comparison."""
    return stage_cost(profile, 0, len(profile.layers), world_size, 1, global_batch, None)


def plan(
    profile: Profile,
    world_size: int,
    global_batch: int,
    memory_limit: float | None = None,
    max_stages: int | None = None,
) -> Plan:
    """Minimise the slowest stage over splits and replica counts using exactly ``world_size`` workers.

    Dynamic programming over suffixes: ``best(i, w, k)`` is the best pipeline for
    layers i.. with w workers whose first stage is k stages from the end (so it
    keeps k weight versions).
    """
    n = len(profile.layers)
    max_stages = min(n, world_size, max_stages or n)
    inf = float("inf")
    cost = functools.lru_cache(maxsize=None)(
        lambda i, j, m, k: stage_cost(profile, i, j, m, k, global_batch, memory_limit)
    )
    # best[(i, w, k)] = (slowest stage time, first stage choice, next key)
    best: dict[tuple[int, int, int], tuple[float, StageChoice | None, tuple | None]] = {(n, 0, 0): (0.0, None, None)}
    for k in range(1, max_stages + 1):
        for i in range(n - 1, -1, -1):
            for w in range(1, world_size + 1):
                top = (inf, None, None)
                for j in range(i + 1, n + 1):
                    for m in range(1, w + 1):
                        rest = best.get((j, w - m, k - 1))
                        if rest is None or rest[0] >= top[0]:
                            continue
                        choice = cost(i, j, m, k)
                        if choice is None:
                            continue
                        value = max(choice.time_s, rest[0])
                        if value < top[0]:
                            top = (value, choice, (j, w - m, k - 1))
                if top[1] is not None:
                    best[(i, w, k)] = top
    candidates = [(best[(0, world_size, k)][0], k) for k in range(1, max_stages + 1) if (0, world_size, k) in best]
    if not candidates:
        limit = f"{memory_limit / 2**30:.3g} GiB" if memory_limit else "none"
        raise ConfigError(
            f"no AshPipe plan fits strategy.memory_limit ({limit}) for {world_size} workers and global batch "
            f"{global_batch}, even with recomputation; raise the limit, add workers or lower train.global_batch"
        )
    _, k = min(candidates)
    stages, key = [], (0, world_size, k)
    while key is not None and best[key][1] is not None:
        _, choice, nxt = best[key]
        stages.append(choice)
        key = nxt
    return Plan(stages, global_batch, world_size)
