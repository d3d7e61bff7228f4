"""torch.distributed.pipelining's multi-stage schedules, as this harness's action lists.

Interleaved 1F1B, looped BFS, interleaved zero-bubble (ZB1P), ZB-V and DualPipeV put
``v`` stages on each of ``P`` ranks. The action lists here are the library's own: the
schedule class computes its order for every rank, with the sends and receives its
runtime will issue (``_schedule_visualizer.get_schedule_ops``, which builds the
schedule on placeholder stages, no process needed; each receive placed where the runtime
waits for it), translated action for action into
:class:`harness.runtime.schedule.Action` with the stage each one acts on. So the
simulator replays exactly what a run executes, and the checks before launch refuse
exactly what the library would refuse (its own error, in one line).

Placement, as each schedule requires: loop (stage i on rank i mod P) for interleaved
1F1B, looped BFS and zero-bubble; V (rank r holds stages r and 2P-1-r) for ZB-V and
DualPipeV, which take exactly two stages per rank.
"""

from __future__ import annotations

import contextlib
import functools
import io
import logging
from dataclasses import dataclass

from harness.runtime import schedule as sch


@dataclass(frozen=True)
class Multi:
    """One of the library's multi-stage schedules."""

    library_name: str  # torch.distributed.pipelining.schedules.get_schedule_class's name
    placement: str  # "loop" or "v"
    exact_stages_per_rank: int | None = None  # V schedules take exactly two
    splits_backward: bool = False  # the zero-bubble family: I and W instead of B


MULTI = {
    "interleaved_1f1b": Multi("Interleaved1F1B", "loop"),
    "looped_bfs": Multi("LoopedBFS", "loop"),
    "zero_bubble": Multi("InterleavedZeroBubble", "loop", splits_backward=True),
    "zbv": Multi("ZBVZeroBubble", "v", exact_stages_per_rank=2, splits_backward=True),
    "dualpipev": Multi("DualPipeV", "v", exact_stages_per_rank=2, splits_backward=True),
}


def splits_backward(name: str) -> bool:
    """Whether schedule ``name`` runs backwards as input- and weight-gradient parts."""
    return name in MULTI and MULTI[name].splits_backward


def placement(name: str, ranks: int, stages_per_rank: int) -> list[int]:
    """The rank of each stage (index: stage)."""
    total = ranks * stages_per_rank
    if MULTI[name].placement == "v":
        return [s if s < ranks else total - 1 - s for s in range(total)]
    return [s % ranks for s in range(total)]


def stages_of(name: str, ranks: int, stages_per_rank: int, rank: int) -> list[int]:
    """The stages ``rank`` holds, in the order the library expects them (ascending)."""
    where = placement(name, ranks, stages_per_rank)
    return [s for s, r in enumerate(where) if r == rank]


class ScheduleError(ValueError):
    """The library cannot build this schedule (its own reason)."""


_OPS = {"F": sch.FWD, "B": sch.BWD, "I": sch.BWD_I, "W": sch.BWD_W, "SEND_F": sch.SEND_F,
        "RECV_F": sch.RECV_F, "SEND_B": sch.SEND_B, "RECV_B": sch.RECV_B}
# actions for sharded or replicated data parallelism, no-ops for the stage modules run here
_NO_OPS = ("UNSHARD", "RESHARD", "REDUCE_GRAD")


@functools.lru_cache(maxsize=64)
def action_lists(name: str, ranks: int, stages_per_rank: int, micro_batches: int) -> tuple[tuple[sch.Action, ...], ...]:
    """Per rank, the actions the library's runtime runs in one step, then the optimizer's STEP.

    Raises :class:`ScheduleError` with the library's reason when it cannot build them."""
    from torch.distributed.pipelining._schedule_visualizer import get_schedule_ops

    multi = MULTI[name]
    if multi.exact_stages_per_rank and stages_per_rank != multi.exact_stages_per_rank:
        raise ScheduleError(f"{name} takes exactly {multi.exact_stages_per_rank} stages per rank")
    if stages_per_rank < 2:
        raise ScheduleError(f"{name} puts several stages on each rank; it needs at least 2 per rank")
    # the library logs its schedule at INFO and prints a failing one; keep both out of the run's output
    quiet = logging.getLogger("torch.distributed.pipelining")
    level = quiet.level
    quiet.setLevel(logging.WARNING)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            # the runtime posts a receive early and waits for it at the compute that needs it: the
            # deferred placement puts it there, where this harness's replay blocks on it
            ops = get_schedule_ops(multi.library_name, ranks, micro_batches, num_stages_per_rank=stages_per_rank,
                                   with_comms=True, defer_pp_recv=True)
    except (ValueError, AssertionError, RuntimeError) as e:
        raise ScheduleError(str(e).strip().splitlines()[0]) from None
    finally:
        quiet.setLevel(level)
    return tuple(tuple(_translated(rank_ops)) + (sch.Action(sch.STEP),) for rank_ops in ops)


def _translated(rank_ops) -> list[sch.Action]:
    out = []
    for a in rank_ops:
        if a is None:
            continue
        kind = a.computation_type.value
        if kind in _NO_OPS:
            continue
        if a.sub_actions:  # OVERLAP_F_B: a forward and a backward the runtime runs one after the other
            out += _translated(a.sub_actions)
            continue
        if kind not in _OPS:
            raise ScheduleError(f"the library's schedule has an action this harness cannot replay: {a}")
        out.append(sch.Action(_OPS[kind], a.microbatch_index, stage=a.stage_index))
    return out


def backward_part(action: sch.Action) -> float:
    """The share of a whole backward that a backward action computes in the library's runtime:
    B all of it, I and W their parts, except on the first stage, whose I does nothing (its input
    needs no gradient) and whose W runs the whole backward."""
    if action.op == sch.BWD:
        return 1.0
    if action.stage == 0:
        return 0.0 if action.op == sch.BWD_I else 1.0
    return 0.5


def forward_only(name: str, ranks: int, stages_per_rank: int, micro_batches: int) -> list[list[sch.Action]]:
    """Evaluation's order for the same stages: every micro-batch through each of a rank's stages in
    turn (breadth first, so no rank waits on a later stage), a transfer where adjacent stages
    live on different ranks. The library's own ``eval`` replays the training order with its
    backwards skipped, which fails for the V schedules (it hands a backward's output between the
    two local stages), so evaluation runs this list instead, the same for every multi-stage
    schedule."""
    where = placement(name, ranks, stages_per_rank)
    total = len(where)
    out = []
    for rank in range(ranks):
        acts = []
        for s in stages_of(name, ranks, stages_per_rank, rank):
            for k in range(micro_batches):
                if s > 0 and where[s - 1] != rank:
                    acts.append(sch.Action(sch.RECV_F, k, stage=s))
                acts.append(sch.Action(sch.FWD, k, stage=s))
                if s < total - 1 and where[s + 1] != rank:
                    acts.append(sch.Action(sch.SEND_F, k, stage=s))
        out.append(acts)
    return out


def to_library(actions: list[sch.Action]) -> list:
    """Actions in the library's own form (``_Action``), for its runtime to run."""
    from torch.distributed.pipelining.schedules import _Action, _ComputationType

    kinds = {ours: theirs for theirs, ours in _OPS.items()}
    return [_Action(a.stage, _ComputationType.from_str(kinds[a.op]), a.micro) for a in actions]
