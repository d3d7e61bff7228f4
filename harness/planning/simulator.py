"""Scale-out predictions: the executor's own action lists, replayed with measured costs.

One source of truth: the per-stage action lists come from the schedule registry
(:mod:`harness.runtime.schedules`: the lists the executor or the library runs), and
:func:`harness.runtime.actions.replay` replays them; this module only says
what each action costs on a given cluster, from a measured profile
(:class:`harness.planning.planner.Profile`), in :class:`CostModel`:

- forward / backward of a micro-batch on stage s: per-sample layer times x the
  samples a replica computes, divided by the cluster's compute speed relative
  to the profiled device (recomputed layers pay their forward twice);
- a send: boundary activation (or gradient) bytes of the replica's share over
  the link between the two stages' ranks (intra- or inter-node), plus latency;
- the step: the gradient all-reduce over the stage's replicas (ring:
  ``2 (n-1)/n x bytes / bandwidth``) minus what the layout hides behind the
  last backward (``hides_allreduce``), plus the optimizer update measured into the
  profile. Where communication runs on the computing cores (gloo on CPUs,
  ``Cluster.comm_uses_compute``) nothing is hidden and a send occupies its sender.

Each strategy describes what it runs as a :class:`SimLayout` (its class's
``simulated`` method); nothing here depends on a strategy's name. Synchronous
schedules give the time of one iteration (fill, steady state and drain); the
asynchronous one gives the steady-state interval between minibatches.

A prediction replays the profile's medians (:func:`predict`); :func:`predict_spread` replays
it many times with each compute and transfer drawn from the profile's measured spread
(seeded), for a median and an interval of what a run would measure.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace

import numpy as np

from harness.core.errors import ConfigError
from harness.planning.planner import Network, Profile
from harness.report.environment import environment
from harness.report.schema import SCHEMA_VERSION
from harness.runtime import actions as sch
from harness.runtime import schedules
from harness.runtime.partition import balanced_boundaries, stage_ranges


@dataclass
class SimLayout:
    """What a strategy runs, as the simulator needs it (each strategy class builds its own)."""

    strategy: str  # the label the prediction's record carries
    replicas: list[int]  # per stage
    boundaries: list[int] | None  # first layer of stages 1..S-1 (None: balanced on the profile's costs)
    micro_batches: int
    schedule: str  # a name of the schedule registry (harness.runtime.schedules)
    recompute: set[int]  # global indices of recomputed layers
    hides_allreduce: bool  # the gradient all-reduce overlaps the last backward (bucketed, as DDP does)
    stashes_weights: bool = False  # every stage but the last keeps a weight copy per minibatch in flight
    # stages each rank of a pipeline holds (torch pipelining's multi-stage schedules): ``replicas``
    # is then per rank position, ``boundaries`` cut ``stages_per_rank x len(replicas)`` stages
    stages_per_rank: int = 1
    # the action lists the strategy's library issues, one per stage, where they differ from
    # ``schedule``'s own (DeepSpeed's order of transfers); None: ``schedule``'s
    lists: list[list[sch.Action]] | None = None
    # transfers are blocking calls that meet their receive (harness.runtime.actions.replay)
    rendezvous: bool = False


@dataclass
class Cluster:
    name: str = "local"
    devices_per_node: int = 8
    nodes: int = 1
    # compute speed relative to the device the profile was measured on
    compute_scale: float = 1.0
    intra_node_gbps: float = 100.0  # GB/s between devices of a node (NVLink ~ 150+, PCIe ~ 16)
    # bus bandwidth (GB/s) of an all-reduce among a node's devices, where it differs from the link's:
    # gloo's ring reduces on the CPU, at about 40% of its point-to-point rate here (None: the link's)
    allreduce_gbps: float | None = None
    inter_node_gbps: float = 12.5  # GB/s between nodes (100 Gb/s ~ 12.5)
    latency_us: float = 10.0
    inter_latency_us: float = 20.0
    memory_gib: float = 80.0
    # communication runs on the cores that compute (gloo on CPUs): a send keeps its sender
    # busy and an all-reduce cannot hide behind the backward; GPUs with NCCL overlap both
    comm_uses_compute: bool = False
    # the cluster is the profiled host itself: the runtime's host overheads measured into the
    # profile (RuntimeOverhead) apply; a GPU runs its kernels behind the host's dispatch instead
    host_overhead: bool = False

    @property
    def devices(self) -> int:
        return self.devices_per_node * self.nodes

    @property
    def bus_gbps(self) -> float:
        """An all-reduce's bus bandwidth among a node's devices."""
        return self.allreduce_gbps or self.intra_node_gbps

    def use_network(self, network: Network) -> None:
        """Links, latency and all-reduce as measured between the profiled host's workers."""
        self.intra_node_gbps = self.inter_node_gbps = network.p2p_bytes_per_s / 1e9
        self.latency_us = self.inter_latency_us = network.latency_s * 1e6
        self.allreduce_gbps = network.allreduce_bytes_per_s / 1e9

    def network(self) -> Network:
        """The network between a node's devices, as a profile records one (the inverse of use_network)."""
        return Network(self.intra_node_gbps * 1e9, self.bus_gbps * 1e9, self.latency_us * 1e-6)

    def link(self, rank_a: int, rank_b: int) -> tuple[float, float]:
        """(bytes/s, latency s) between two ranks."""
        same = rank_a // self.devices_per_node == rank_b // self.devices_per_node
        if same:
            return self.intra_node_gbps * 1e9, self.latency_us * 1e-6
        return self.inter_node_gbps * 1e9, self.inter_latency_us * 1e-6

    def allreduce_s(self, nbytes: float, ranks: list[int]) -> float:
        """Hierarchical ring all-reduce (NCCL's shape): a ring inside each node over the
        node's link, then a ring across nodes over the network for the inter-node part."""
        if len(ranks) <= 1:
            return 0.0
        per_node: dict[int, int] = {}
        for r in ranks:
            per_node[r // self.devices_per_node] = per_node.get(r // self.devices_per_node, 0) + 1
        g, k = max(per_node.values()), len(per_node)
        t = 0.0
        if g > 1:
            t += 2 * (g - 1) / g * nbytes / (self.bus_gbps * 1e9) + 2 * (g - 1) * self.latency_us * 1e-6
        if k > 1:
            t += 2 * (k - 1) / k * nbytes / (self.inter_node_gbps * 1e9) + 2 * (k - 1) * self.inter_latency_us * 1e-6
        return t


@dataclass
class Prediction:
    strategy: str
    world_size: int
    global_batch: int
    micro_batches: int
    replicas: list[int]
    boundaries: list[int]
    iteration_s: float
    bubble_fraction: float
    comm_s: float
    peak_memory_per_stage: list[float]
    timeline: sch.Timeline = field(repr=False, default=None)

    @property
    def throughput(self) -> float:
        return self.global_batch / self.iteration_s

    def record(self, model: str, data: str, cluster: str, memory_gib: float | None = None) -> dict:
        """A results-table row marked as simulated (per-rank events kept for the timeline figure).

        A layout whose predicted peak exceeds the cluster's memory per device is
        recorded as failed, as the real run would fail."""
        ranks = []
        first = 0
        for s, n in enumerate(self.replicas):
            events = [(str(e.action), e.start, e.end) for e in self.timeline.stage_events(s)] if self.timeline else []
            ranks.append({"rank": first, "layout": {"stage": s, "replicas": n}, "events": events})
            first += n
        mem = [m for m, n in zip(self.peak_memory_per_stage, self.replicas) for _ in range(n)]
        status, error = "ok", None
        if memory_gib is not None and max(mem) > memory_gib * 2**30:
            status = "failed"
            error = (
                f"predicted peak memory {max(mem) / 2**30:.1f} GiB exceeds the cluster's {memory_gib:g} GiB "
                "per device (out of memory)"
            )
        return {
            "schema_version": SCHEMA_VERSION,
            "environment": environment(),
            "status": status,
            "error": error,
            "simulated": True,
            "cluster": cluster,
            "strategy": self.strategy,
            "model": model,
            "data": data,
            "world_size": self.world_size,
            "global_batch": self.global_batch,
            "micro_batches": self.micro_batches,
            "throughput": self.throughput,
            "step_time_s": self.iteration_s,
            "peak_memory_bytes": max(mem),
            "peak_memory_per_rank": mem,
            "bubble_fraction": self.bubble_fraction,
            "comm_s": self.comm_s,
            "accuracy": None,
            "final_loss": None,
            "device": f"simulated:{cluster}",
            "replicas": self.replicas,
            "boundaries": self.boundaries,
            "per_rank": ranks,
        }


@dataclass
class RuntimeOverhead:
    """What a runtime costs on the host outside any operator: per action (the library's or our
    executor's dispatch and bookkeeping, posting a transfer, waiting on one) and per step (the
    worker loop: the batch's slicing, the loss's read, the optimizer's Python, a data-parallel
    meeting). Measured by running the strategy itself on a null model (the same layers, schedule,
    micro-batches and workers, almost no arithmetic) and taking, by :func:`fit_runtime_overhead`,
    the per-action and per-step costs that make the replay of those runs, with the null model's own
    measured layer costs, take the time they took."""

    strategy: str
    schedule: str
    per_action_s: float
    per_step_s: float
    calibration: list = field(default_factory=list)  # the null runs: micro-batches, measured and replayed step


def _stage_ranks(replicas: list[int]) -> list[list[int]]:
    out, first = [], 0
    for n in replicas:
        out.append(list(range(first, first + n)))
        first += n
    return out


def host_overhead(profile: Profile, cluster: Cluster, layout: SimLayout) -> tuple[float, float]:
    """(per action, per step) seconds the replay adds: the profile's measured runtime overhead
    where the cluster is the profiled host and the profile measured this strategy's runtime (with
    this schedule)."""
    if cluster.host_overhead:
        for rt in profile.runtime or []:
            if (rt["strategy"], rt["schedule"]) == (layout.strategy, layout.schedule):
                return rt["per_action_s"], rt["per_step_s"]
    return 0.0, 0.0


@dataclass
class Draw:
    """One replayed run's random costs: every compute action's time is scaled by the host's
    ``level`` (drawn once per run) and by a ``jitter`` drawn per action, every transfer's by a
    draw of ``transfer``; each from a profile's measured spread."""

    rng: np.random.Generator
    level: float
    jitter: np.ndarray
    transfer: np.ndarray | None

    def compute(self) -> float:
        return self.level * self.jitter[self.rng.integers(len(self.jitter))]

    def send(self) -> float:
        return 1.0 if self.transfer is None else self.transfer[self.rng.integers(len(self.transfer))]


class CostModel:
    """What each action of a layout's lists costs on ``cluster``, from ``profile``'s measurements
    (the model: this module's docstring), and what a lane holds in memory.

    Built once per prediction; :meth:`cost` is the replay's cost function. Stages are numbered
    along the pipeline, lanes are its rank positions (a lane holds ``stages_per_rank`` stages).
    The all-reduce each lane's step waits for is kept as the replay charges it
    (``exposed_allreduce``), for the exposed communication."""

    def __init__(
        self,
        profile: Profile,
        cluster: Cluster,
        layout: SimLayout,
        boundaries: list[int],
        global_batch: int,
        overhead: tuple[float, float] | None = None,
        draw: Draw | None = None,
    ):
        self.profile, self.cluster, self.layout, self.draw = profile, cluster, layout, draw
        self.layers = profile.layers
        self.recompute = set(layout.recompute)
        self.replicas = list(layout.replicas)
        lanes, v = len(self.replicas), layout.stages_per_rank
        self.stages = lanes * v
        self.ranges = stage_ranges(boundaries, len(self.layers))
        self.schedule = schedules.get(layout.schedule)
        self.lane_of = self.schedule.place(lanes, v)
        self.stages_of_lane = [[s for s in range(self.stages) if self.lane_of[s] == p] for p in range(lanes)]
        self.ranks = _stage_ranks(self.replicas)
        # layer times measured in isolation, scaled to what a whole forward and backward measured on
        # the same device took, or each stage's own steady-state pass where the profile timed this cut
        # of one stage per rank (as 1F1B and AshPipe run it); the optimizer update is measured on its
        # own (once per STEP)
        one_f_one_b = v == 1 and set(self.replicas) == {1} and layout.schedule in ("1f1b", schedules.ASYNC)
        self.factor = (one_f_one_b and profile.stage_factors_for(boundaries)) or [profile.step_factor] * self.stages
        self.optimizer_s_per_byte = profile.optimizer_s_per_byte / cluster.compute_scale
        # samples one replica of each stage computes per micro-batch
        self.share_of = [
            global_batch / layout.micro_batches / self.replicas[self.lane_of[s]] for s in range(self.stages)
        ]
        self.hides_allreduce = layout.hides_allreduce and not cluster.comm_uses_compute
        self.per_action, self.per_step = overhead if overhead is not None else host_overhead(profile, cluster, layout)
        # data parallelism on the profiled host: every step ends with the replicas meeting, so it lasts as
        # long as the slowest of them took (the profile's lockstep measurement); a pipeline's ranks meet
        # at every transfer, which the replay itself follows
        meets = cluster.host_overhead and self.stages == 1 and self.replicas[0] > 1
        self.meeting = profile.meeting_factor if meets else 1.0
        self.exposed_allreduce: dict[int, float] = {}  # per lane: the all-reduce time its step waits for

    # -- compute ----------------------------------------------------------------
    def layer_sum(self, s: int, time) -> float:
        """``time(layer)`` summed over stage ``s``'s layers, for the samples a replica computes, at
        the stage's factor and the cluster's speed."""
        lo, hi = self.ranges[s]
        return self.share_of[s] * sum(time(i) for i in range(lo, hi)) * self.factor[s] / self.cluster.compute_scale

    def recomputed_s(self, i: int) -> float:
        """The forward layer ``i`` runs again before its backward (0 where it is not recomputed)."""
        return self.layers[i].forward_s if i in self.recompute else 0.0

    def forward(self, s: int) -> float:
        return self.layer_sum(s, lambda i: self.layers[i].forward_s)

    def backward(self, s: int) -> float:
        return self.layer_sum(s, lambda i: self.layers[i].backward_s + self.recomputed_s(i))

    def recomputes_at_i(self, s: int) -> bool:
        """Our executor (the only one that runs our split schedules) runs a split backward's stage
        with recomputed layers forward once more, whole, at I (harness.runtime.executor.StageExecutor._I);
        the first stage's W is a whole backward."""
        lo, hi = self.ranges[s]
        return self.schedule.ours and s > 0 and any(i in self.recompute for i in range(lo, hi))

    def backward_part(self, s: int, a: sch.Action) -> float:
        """The input- or weight-gradient part, as our executor or the library runs it
        (harness.runtime.torch_schedules)."""
        layers = self.layers
        if s == 0:  # the first stage's I does nothing, its W runs the whole backward
            return self.backward(s) * schedules.backward_part(a)
        if a.op == sch.BWD_I and self.recomputes_at_i(s):
            return self.layer_sum(s, lambda i: layers[i].backward_input_s + layers[i].forward_s)
        if a.op == sch.BWD_I:
            return self.layer_sum(s, lambda i: layers[i].backward_input_s + self.recomputed_s(i))
        return self.layer_sum(s, lambda i: layers[i].backward_weight_s)

    # -- communication and the step ---------------------------------------------
    def param_bytes(self, s: int) -> float:
        lo, hi = self.ranges[s]
        return float(sum(self.layers[i].param_bytes for i in range(lo, hi)))

    def transfer(self, s: int, towards_next: bool) -> float:
        """A send of stage ``s``'s boundary activation (or gradient) over the link to its neighbour."""
        peer = s + 1 if towards_next else s - 1
        boundary = self.ranges[s][1] - 1 if towards_next else self.ranges[s][0] - 1
        bw, lat = self.cluster.link(self.ranks[self.lane_of[s]][0], self.ranks[self.lane_of[peer]][0])
        return self.share_of[s] * self.layers[boundary].output_bytes / bw + lat

    def step(self, p: int) -> float:
        """Lane ``p``'s step: the all-reduce it waits for (what the last backward does not hide),
        then the optimizer update."""
        lane_params = sum(self.param_bytes(s) for s in self.stages_of_lane[p])
        ar = self.cluster.allreduce_s(lane_params, self.ranks[p])
        if self.hides_allreduce:
            ar = max(0.0, ar - min(self.backward(s) for s in self.stages_of_lane[p]))
        self.exposed_allreduce[p] = ar
        return ar + self.optimizer_s_per_byte * lane_params

    # -- what the replay charges --------------------------------------------------
    def work(self, p: int, a: sch.Action) -> float:
        """Action ``a`` of lane ``p`` at its median."""
        s = p if a.stage is None else a.stage
        if a.op == sch.FWD:
            return self.forward(s)
        if a.op == sch.BWD:
            return self.backward(s)
        if a.op in (sch.BWD_I, sch.BWD_W):
            return self.backward_part(s, a)
        if a.op == sch.SEND_F:
            return self.transfer(s, True)
        if a.op == sch.SEND_B:
            return self.transfer(s, False)
        if a.op == sch.STEP:
            return self.step(p)
        return 0.0

    def cost(self, p: int, a: sch.Action) -> float:
        """The replay's cost of action ``a`` on lane ``p``: its work, as slow as data parallelism's
        meeting makes a compute, times the draw's (if any), plus the host's overhead."""
        scale = self.meeting if a.op in sch.COMPUTE else 1.0
        draw = self.draw
        if draw is not None:
            scale *= (
                draw.compute()
                if a.op in (*sch.COMPUTE, sch.STEP)
                else draw.send()
                if a.op in (sch.SEND_F, sch.SEND_B)
                else 1.0
            )
        return self.work(p, a) * scale + (self.per_step if a.op == sch.STEP else self.per_action)

    # -- what a replayed step leaves ----------------------------------------------
    def exposed_comm_s(self, timeline: sch.Timeline) -> float:
        """The busiest lane's exposed communication over the replay: its sends, and the part of
        each step spent waiting for the all-reduce (the optimizer's update in the same action is
        compute)."""
        return max(
            sum(
                e.end - e.start if e.action.op in (sch.SEND_F, sch.SEND_B) else self.exposed_allreduce.get(p, 0.0)
                for e in timeline.stage_events(p)
                if e.action.op in (sch.SEND_F, sch.SEND_B, sch.STEP)
            )
            for p in range(len(self.replicas))
        )

    def kept(self, s: int) -> float:
        """Bytes one micro-batch leaves on stage ``s`` until its backward."""
        lo, hi = self.ranges[s]
        layers = self.layers
        return self.share_of[s] * sum(
            layers[i].input_bytes if i in self.recompute else layers[i].saved_bytes for i in range(lo, hi)
        )

    def kept_after_i(self, s: int) -> float:
        """... and from its I to its W, where I recomputed the stage."""
        if not self.recomputes_at_i(s):
            return self.kept(s)
        lo, hi = self.ranges[s]
        return self.share_of[s] * sum(self.layers[i].saved_bytes for i in range(lo, hi))

    def peak_memory(self, p: int, timeline: sch.Timeline) -> float:
        """Lane ``p``'s peak: parameters, gradients and optimizer state, any stashed weight copies,
        and the most activations the replay left on it at once."""
        resident = sum(self.param_bytes(s) for s in self.stages_of_lane[p])
        stash = 0.0
        if self.layout.stashes_weights and p < self.stages - 1:
            stash = timeline.max_in_flight(p) * resident
        held = timeline.peak_live(p, self.kept, self.kept_after_i)
        return resident * (2 + self.profile.optimizer_state_per_param_byte) + stash + held


def _cut_and_lists(profile: Profile, layout: SimLayout) -> tuple[list[int], list[list[sch.Action]] | None]:
    """``layout``'s cut (balanced on the profile's layer costs where it gives none) and its action
    lists, one per lane (None for an asynchronous schedule: :func:`_replay` replays enough
    minibatches to reach the steady state). ConfigError where the lists split backwards the
    profile did not time in parts."""
    layers = profile.layers
    P, v = len(layout.replicas), layout.stages_per_rank
    S = P * v  # stages
    boundaries = layout.boundaries
    if boundaries is None:
        boundaries = balanced_boundaries([l.forward_s + l.backward_s for l in layers], S) if S > 1 else []
    schedule = schedules.get(layout.schedule)
    if layout.lists is not None:
        lists = [list(acts) for acts in layout.lists]
    elif schedule.asynchronous:
        lists = None
    else:
        lists = schedule.lists(P, v, layout.micro_batches)
    splits = any(a.op in (sch.BWD_I, sch.BWD_W) for acts in lists or [] for a in acts)
    if splits and any(l.backward_input_s is None for l in layers):
        raise ConfigError(
            f"schedule {layout.schedule} splits each backward into its input- and weight-gradient "
            "parts, which this profile does not time; profile again (pipebench profile)"
        )
    return boundaries, lists


def _replay(costs: CostModel, lists: list[list[sch.Action]] | None) -> tuple[sch.Timeline, float]:
    """The lists replayed at ``costs`` on its cluster, and the iteration's time: the replay's span for
    a synchronous schedule; for the asynchronous one, the steady-state interval between minibatches."""
    profile, cluster, layout = costs.profile, costs.cluster, costs.layout
    schedule, S, lane_of, cost = costs.schedule, costs.stages, costs.lane_of, costs.cost
    # on the profiled CPU host, a compute action after a wait pays the measured wake-up
    wake = profile.wake_s if cluster.host_overhead and profile.wake else None

    # gloo (the CPU host's transport) moves a message only once its receive is posted, later still
    # where the sender computes then (measured on the profiled host)
    gloo = cluster.comm_uses_compute
    busy_sender = profile.network.late_receive_s if cluster.host_overhead else 0.0
    transport = replace(sch.GLOO, busy_sender_s=busy_sender) if gloo else sch.NCCL
    if schedule.asynchronous:
        n = 4 * S + 8
        timeline = sch.replay(schedule.lists(S, 1, n), cost, transport, wake=wake)
        # steady state: the interval between consecutive optimizer steps on the busiest stage
        steps = {s: [e.end for e in timeline.stage_events(s) if e.action.op == sch.STEP] for s in range(S)}
        window = slice(2 * S, n - S)
        iteration = max((v[window][-1] - v[window][0]) / (len(v[window]) - 1) for v in steps.values())
    else:
        # blocking calls meet their receive whatever the transport (the others' flags then change nothing)
        transport = sch.RENDEZVOUS if layout.rendezvous else transport
        timeline = sch.replay(lists, cost, transport, placement=lane_of, wake=wake)
        iteration = timeline.makespan
    return timeline, iteration


def predict(
    profile: Profile,
    cluster: Cluster,
    layout: SimLayout,
    world_size: int,
    global_batch: int,
    overhead: tuple[float, float] | None = None,
    draw: Draw | None = None,
) -> Prediction:
    """Replay ``layout``'s action lists with the profile's costs on ``cluster`` (:class:`CostModel`).

    The lists are per rank position of the pipeline (a lane); where a lane holds several
    stages (``stages_per_rank``) each action names its stage and costs that stage's work.
    ``overhead`` (per action, per step; default: :func:`host_overhead`) is added to every
    action but the step, and to the step. With ``draw``, each compute and transfer costs its
    median times a draw (:class:`Draw`)."""
    boundaries, lists = _cut_and_lists(profile, layout)
    costs = CostModel(profile, cluster, layout, boundaries, global_batch, overhead, draw)
    timeline, iteration = _replay(costs, lists)
    lanes = range(len(costs.replicas))
    bubble = sum(timeline.idle_fraction(p) for p in lanes) / len(lanes)
    comm = costs.exposed_comm_s(timeline) * (iteration / timeline.makespan)
    memory = [costs.peak_memory(p, timeline) for p in lanes]
    return Prediction(
        layout.strategy,
        world_size,
        global_batch,
        layout.micro_batches,
        list(costs.replicas),
        list(boundaries),
        iteration,
        bubble,
        comm,
        memory,
        timeline,
    )


@dataclass
class Spread:
    """What :func:`predict_spread` found: the throughput's quantiles over the draws."""

    draws: int
    steps: int  # replayed steps averaged into each draw's throughput
    p10: float
    p50: float
    p90: float

    def record(self) -> dict:
        return {
            "predicted_p10": self.p10,
            "predicted_median": self.p50,
            "predicted_p90": self.p90,
            "predicted_draws": self.draws,
            "predicted_steps": self.steps,
        }


def predict_spread(
    profile: Profile,
    cluster: Cluster,
    layout: SimLayout,
    world_size: int,
    global_batch: int,
    draws: int,
    steps: int,
    seed: int = 0,
) -> Spread:
    """The throughput a run of ``steps`` measured steps would report, as a distribution: ``draws``
    runs, each with one draw of the host's level (how the profile's whole pass varied from one
    round of its measurement to the next, a round lasting about as long as a short run's timed
    steps) and its steps replayed with every compute's jitter and every transfer drawn from the
    profile's measured spread; a run's throughput is the global batch over its mean step (the
    asynchronous schedule's replay already spans many minibatches: one step each). Seeded: the
    same inputs give the same quantiles."""
    spread = profile.spread
    if not spread or not spread.get("level") or not spread.get("jitter"):
        raise ConfigError(
            "the profile has no measured spread to draw from (made before it was kept); "
            "profile again (pipebench profile) or predict with medians (sim.draws=0)"
        )
    rng = np.random.default_rng(seed)
    level, jitter = np.asarray(spread["level"]), np.asarray(spread["jitter"])
    transfer = np.asarray(profile.network.spread) if profile.network.spread else None
    steps = 1 if schedules.get(layout.schedule).asynchronous else max(1, steps)
    throughputs = []
    for _ in range(draws):
        draw = Draw(rng, float(level[rng.integers(len(level))]), jitter, transfer)
        mean_step = np.mean(
            [predict(profile, cluster, layout, world_size, global_batch, draw=draw).iteration_s for _ in range(steps)]
        )
        throughputs.append(global_batch / mean_step)
    p10, p50, p90 = np.quantile(throughputs, [0.1, 0.5, 0.9])
    return Spread(draws, steps, float(p10), float(p50), float(p90))


def fit_runtime_overhead(
    cluster: Cluster, runs: list[tuple[SimLayout, int, int, float, Profile]]
) -> tuple[float, float]:
    """(per action, per step) seconds that make the replay of each null-model run ``(layout, world
    size, global batch, measured step s, the null model's profile)`` take its measured time: the
    least-squares fit with neither cost negative.

    A per-step cost adds itself once to a replayed step (the optimizer step ends every list); a
    per-action cost once per action on the critical path, which runs with different action counts
    (micro-batches) tell apart. For a given per-action cost the best per-step cost is the mean of
    what the runs leave over their replays, or zero where that is negative; the per-action cost is
    searched on a geometric grid up to the longest step, then refined between the best point's
    neighbours. With one run (or where more per-action cost fits no better) it is all per step."""

    def left(run, per_action: float) -> float:  # what a run's measured step leaves for the per-step cost
        layout, world, batch, measured, profile = run
        return measured - predict(profile, cluster, layout, world, batch, overhead=(per_action, 0.0)).iteration_s

    def fit(per_action: float) -> tuple[float, float]:  # (best per-step cost, squared error) at per_action
        remainders = [left(run, per_action) for run in runs]
        per_step = max(0.0, sum(remainders) / len(remainders))
        return per_step, sum((r - per_step) ** 2 for r in remainders)

    if len(runs) < 2:
        return 0.0, fit(0.0)[0]
    high = max(run[3] for run in runs)
    grid = [0.0] + [high * 2.0**-k for k in range(40, -1, -1)]
    errors = [fit(o)[1] for o in grid]
    best = min(range(len(grid)), key=errors.__getitem__)
    bounds = (grid[max(best - 1, 0)], grid[min(best + 1, len(grid) - 1)])
    from scipy.optimize import minimize_scalar  # here: 0.5 s to import, which only a fit needs

    found = minimize_scalar(lambda o: fit(o)[1], bounds=bounds, method="bounded", options={"xatol": 1e-12})
    per_action = found.x if found.fun < errors[best] else grid[best]
    return per_action, fit(per_action)[0]


def scaled_profile(profile: Profile, cluster: Cluster, network: Network) -> Profile:
    """The profile as the cluster's devices would measure it (compute divided by ``compute_scale``),
    with the cluster's network: what a planner for that cluster should see."""
    scale = cluster.compute_scale
    scaled = [
        type(l)(
            **{
                **asdict(l),
                "forward_s": l.forward_s / scale,
                "backward_s": l.backward_s / scale,
                "backward_input_s": l.backward_input_s and l.backward_input_s / scale,
                "backward_weight_s": l.backward_weight_s and l.backward_weight_s / scale,
            }
        )
        for l in profile.layers
    ]
    return Profile(scaled, network, profile.device, profile.batch, profile.optimizer_state_per_param_byte)
