"""The schedule registry: every pipeline schedule by name, as data, in one place.

A schedule is, per rank, the list of actions one training step runs
(:mod:`harness.runtime.actions`). Its entry here says how its lists are built, where
its stages live (one per rank, or several in loop or V placement), whether it splits
each backward into an input- and a weight-gradient part, whether it is asynchronous
(no flush), which runtimes run it (our executor, torch.distributed.pipelining) and what
the library calls it. The executor's strategies, the simulator, the preview, the
timeline figure and the torch-pipelining baseline read this table; nothing else lists
schedules. Adding one is one entry (docs: extending/schedule).

Placement of the ``v x P`` stages of a schedule on its ``P`` ranks:

- ``one``: stage s on rank s (one stage per rank); actions carry no stage;
- ``loop``: stage i on rank i mod P (interleaved 1F1B, looped BFS, ZB1P);
- ``v``: rank r holds stages r and 2P-1-r (ZB-V, DualPipeV; exactly two per rank).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable

from harness.runtime import actions as sch
from harness.runtime import torch_schedules


@functools.cache
def _built(schedule: Schedule, ranks: int, v: int, micro_batches: int) -> tuple[tuple[sch.Action, ...], ...]:
    """A schedule's lists of one shape, built once per process (a sweep's jobs and the checks before
    them ask for the same shapes again; the actions are frozen, the lists copied for each caller)."""
    try:
        return tuple(tuple(acts) for acts in schedule.build(ranks, v, micro_batches))
    except torch_schedules.LibraryRefused as e:
        raise ScheduleError(str(e)) from None


@functools.cache
def _finishes(schedule: Schedule, ranks: int, v: int, micro_batches: int) -> None:
    """A replay of the lists without processes (once per shape): ScheduleError where they deadlock."""
    try:
        sch.replay(schedule.lists(ranks, v, micro_batches), placement=schedule.placement_of(ranks, v))
    except sch.Deadlock as e:
        raise ScheduleError(f"{schedule.name} cannot finish: {e}") from None


class ScheduleError(ValueError):
    """A schedule cannot run these ranks, stages and micro-batches; the message says why."""


Lists = list[list[sch.Action]]


@dataclass(frozen=True)
class Schedule:
    name: str
    summary: str
    # (ranks, stages per rank, micro-batches) -> one action list per rank, the step's STEP last
    build: Callable[[int, int, int], Lists]
    placement: str = "one"  # one | loop | v
    # stages each rank holds: an exact count, or None for "two or more"
    stages_per_rank: int | None = 1
    splits_backward: bool = False  # backwards run as input- (I) and weight-gradient (W) parts
    asynchronous: bool = False  # no flush: the lists are one minibatch after another (PipeDream)
    library: str | None = None  # torch.distributed.pipelining's name (get_schedule_class), if it has one
    ours: bool = False  # our executor runs it (Hippie, AshPipe)

    @property
    def default_stages_per_rank(self) -> int:
        return self.stages_per_rank or 2

    def place(self, ranks: int, stages_per_rank: int = 1) -> list[int]:
        """The rank of each stage (index: stage)."""
        total = ranks * stages_per_rank
        if self.placement == "v":
            return [s if s < ranks else total - 1 - s for s in range(total)]
        return [s % ranks for s in range(total)]

    def stages_of(self, ranks: int, stages_per_rank: int, rank: int) -> list[int]:
        """The stages ``rank`` holds, ascending (the order the library expects them in)."""
        return [s for s, r in enumerate(self.place(ranks, stages_per_rank)) if r == rank]

    def placement_of(self, ranks: int, stages_per_rank: int) -> list[int] | None:
        """What the replay needs to route actions that name their stage (None: one stage per rank)."""
        return None if self.placement == "one" else self.place(ranks, stages_per_rank)

    def lists(self, ranks: int, stages_per_rank: int, micro_batches: int) -> Lists:
        """Per rank, the actions of one step. Raises :class:`ScheduleError` with the reason where
        the schedule cannot run this shape (the library's own reason for its schedules)."""
        v = stages_per_rank
        if self.stages_per_rank is not None and v != self.stages_per_rank:
            many = (
                "one stage per rank" if self.stages_per_rank == 1 else f"exactly {self.stages_per_rank} stages per rank"
            )
            raise ScheduleError(f"{self.name} takes {many}")
        if self.stages_per_rank is None and v < 2:
            raise ScheduleError(f"{self.name} puts several stages on each rank; it needs at least 2 per rank")
        return [list(acts) for acts in _built(self, ranks, v, micro_batches)]

    def check(self, ranks: int, stages_per_rank: int, micro_batches: int) -> Lists:
        """The lists, proved to finish by a replay (no processes); ScheduleError otherwise."""
        lists = self.lists(ranks, stages_per_rank, micro_batches)
        _finishes(self, ranks, stages_per_rank, micro_batches)
        return lists

    def analytic_bubble(self, ranks: int, stages_per_rank: int, micro_batches: int) -> float:
        """The idle fraction on paper: 0 without a flush; (p-1)/(m+p-1) for one stage per rank;
        otherwise the lists replayed with the textbook balanced costs (a forward, an input- and a
        weight-gradient part one unit each, transfers free), which gives interleaving's
        (p-1)/(vm+p-1) and what the zero-bubble schedules leave on paper."""
        if self.asynchronous or ranks < 2:
            return 0.0
        if self.placement == "one" and not self.splits_backward:
            return (ranks - 1) / (micro_batches + ranks - 1)
        timeline = sch.replay(
            self.lists(ranks, stages_per_rank, micro_batches), placement=self.placement_of(ranks, stages_per_rank)
        )
        return sum(timeline.idle_fraction(p) for p in range(ranks)) / ranks

    def forward_only(self, ranks: int, stages_per_rank: int, micro_batches: int) -> Lists:
        """Evaluation's order for the same stages: every micro-batch through each of a rank's
        stages in turn (breadth first, so no rank waits on a later stage), a transfer where
        adjacent stages live on different ranks. For one stage per rank that is the forwards of
        every micro-batch in order."""
        if self.placement == "one":
            return sch.forward_only(ranks, micro_batches)
        where = self.place(ranks, stages_per_rank)
        total = len(where)
        out = []
        for rank in range(ranks):
            acts = []
            for s in self.stages_of(ranks, stages_per_rank, rank):
                for k in range(micro_batches):
                    if s > 0 and where[s - 1] != rank:
                        acts.append(sch.Action(sch.RECV_F, k, stage=s))
                    acts.append(sch.Action(sch.FWD, k, stage=s))
                    if s < total - 1 and where[s + 1] != rank:
                        acts.append(sch.Action(sch.SEND_F, k, stage=s))
            out.append(acts)
        return out


def _ours(generator: Callable[[int, int], Lists]) -> Callable[[int, int, int], Lists]:
    return lambda ranks, _v, micro_batches: generator(ranks, micro_batches)


def _library(name: str) -> Callable[[int, int, int], Lists]:
    return lambda ranks, v, m: [list(a) for a in torch_schedules.library_lists(name, ranks, v, m)]


ASYNC = "async_1f1b"

SCHEDULES: dict[str, Schedule] = {
    s.name: s
    for s in (
        Schedule(
            "gpipe",
            "fill-drain: every forward, then every backward, then the step (GPipe)",
            _ours(sch.gpipe),
            library="GPipe",
            ours=True,
        ),
        Schedule(
            "1f1b",
            "one forward one backward with a flush (PipeDream-flush, Megatron's default)",
            _ours(sch.one_f_one_b),
            library="1F1B",
            ours=True,
        ),
        Schedule(
            "zb_h1",
            "zero bubble at 1F1B's memory: split backward, W passes fill 1F1B's bubble (ZB-H1, Qi et al. 2024)",
            _ours(sch.zb_h1),
            splits_backward=True,
            ours=True,
        ),
        Schedule(
            ASYNC,
            "asynchronous 1F1B, no flush, one minibatch at a time (PipeDream, AshPipe)",
            _ours(sch.async_1f1b),
            asynchronous=True,
            ours=True,
        ),
        Schedule(
            "interleaved_1f1b",
            "1F1B over v stages per rank in loop placement (Narayanan et al. 2021)",
            _library("Interleaved1F1B"),
            placement="loop",
            stages_per_rank=None,
            library="Interleaved1F1B",
            ours=True,
        ),
        Schedule(
            "looped_bfs",
            "every micro-batch through a rank's stage before its next (Lamy-Poirier 2023)",
            _library("LoopedBFS"),
            placement="loop",
            stages_per_rank=None,
            library="LoopedBFS",
            ours=True,
        ),
        Schedule(
            "zero_bubble",
            "interleaved zero bubble, ZB1P (Qi et al. 2024)",
            _library("InterleavedZeroBubble"),
            placement="loop",
            stages_per_rank=None,
            splits_backward=True,
            library="InterleavedZeroBubble",
            ours=True,
        ),
        Schedule(
            "zbv",
            "zero bubble in V placement, ZB-V (Qi et al. 2024)",
            _library("ZBVZeroBubble"),
            placement="v",
            stages_per_rank=2,
            splits_backward=True,
            library="ZBVZeroBubble",
            ours=True,
        ),
        Schedule(
            "dualpipev",
            "DeepSeek-V3's DualPipe in V placement",
            _library("DualPipeV"),
            placement="v",
            stages_per_rank=2,
            splits_backward=True,
            library="DualPipeV",
            ours=True,
        ),
    )
}


def get(name: str) -> Schedule:
    if name not in SCHEDULES:
        raise ScheduleError(f"unknown schedule '{name}'; the schedules are {', '.join(SCHEDULES)}")
    return SCHEDULES[name]


def names(*, ours: bool | None = None, library: bool | None = None, asynchronous: bool | None = False) -> list[str]:
    """Schedule names, in the registry's order, filtered by who runs them and whether they flush."""
    return [
        s.name
        for s in SCHEDULES.values()
        if (ours is None or s.ours == ours)
        and (library is None or (s.library is not None) == library)
        and (asynchronous is None or s.asynchronous == asynchronous)
    ]


def backward_part(action: sch.Action) -> float:
    """The share of a whole backward that a backward action computes: B all of it, I and W their
    parts, except on the first stage, whose I does nothing (its input needs no gradient) and
    whose W runs the whole backward."""
    if action.op == sch.BWD:
        return 1.0
    if action.stage == 0:
        return 0.0 if action.op == sch.BWD_I else 1.0
    return 0.5


def replayed_timeline(
    schedules: Lists, busy: list[dict[str, float]], placement: list[int] | None = None
) -> sch.Timeline:
    """``schedules`` replayed with the time each list (a stage, or a rank holding several) spent
    computing in a profiled step, transfers free.

    ``busy[lane]`` holds the measured seconds of each kind of work (``F``, ``B``, ``STEP``, and
    ``I`` and ``W`` where a split backward's parts were timed apart); each kind's time is shared
    among the lane's actions of that kind, a backward's parts by the share of the backward each
    computes (one pool for all backward actions where the parts were not timed apart)."""
    backward = (sch.BWD, sch.BWD_I, sch.BWD_W)

    def weight(a: sch.Action) -> float:
        return backward_part(a) if a.op in backward else 1.0

    per_action = []
    for acts, spent in zip(schedules, busy):
        split = sch.BWD_I in spent or sch.BWD_W in spent
        pool = {op: op if split or op not in backward else sch.BWD for op in {a.op for a in acts}}
        totals: dict[str, float] = {}
        for a in acts:
            totals[pool[a.op]] = totals.get(pool[a.op], 0.0) + weight(a)
        unit = {op: spent.get(op, 0.0) / total for op, total in totals.items() if total > 0}
        per_action.append({op: unit.get(kind, 0.0) for op, kind in pool.items()})
    return sch.replay(schedules, lambda p, a: per_action[p].get(a.op, 0.0) * weight(a), placement=placement)


def replayed_bubble(schedules: Lists, busy: list[dict[str, float]], placement: list[int] | None = None) -> float | None:
    """The idle fraction of ``schedules`` replayed as :func:`replayed_timeline` does."""
    return timeline_bubble(replayed_timeline(schedules, busy, placement), len(schedules))


def timeline_bubble(timeline: sch.Timeline, lanes: int) -> float | None:
    """The idle fraction of a replayed timeline of ``lanes`` lists: the bubble the schedule itself
    leaves a run whose stages take the measured times. A run's measured idle above it is what the
    replay leaves out (transfers, waiting on peers, per-action overhead). The optimizer step counts
    as work, as it does in the measured figure."""
    if timeline.makespan <= 0:
        return None
    work = (sch.STEP, *sch.COMPUTE)
    done = sum(e.end - e.start for p in range(lanes) for e in timeline.stage_events(p) if e.action.op in work)
    return 1 - done / (lanes * timeline.makespan)
