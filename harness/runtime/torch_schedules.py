"""torch.distributed.pipelining's schedules, as this harness's action lists.

The library's multi-stage schedules (interleaved 1F1B, looped BFS, ZB1P, ZB-V,
DualPipeV; their entries and placements are in :mod:`harness.runtime.schedules`) put
``v`` stages on each of ``P`` ranks. The action lists here are the library's own: the
schedule class computes its order for every rank, with the sends and receives its
runtime will issue (``_schedule_visualizer.get_schedule_ops``, which builds the
schedule on placeholder stages, no process needed; each receive placed where the runtime
waits for it), translated action for action into
:class:`harness.runtime.actions.Action` with the stage each one acts on. So the
simulator replays exactly what a run executes, and the checks before launch refuse
exactly what the library would refuse (its own error, in one line).
"""

from __future__ import annotations

import contextlib
import functools
import io
import logging

from harness.runtime import actions as sch


class LibraryRefused(ValueError):
    """The library cannot build this schedule (its own reason, one line)."""


_OPS = {
    "F": sch.FWD,
    "B": sch.BWD,
    "I": sch.BWD_I,
    "W": sch.BWD_W,
    "SEND_F": sch.SEND_F,
    "RECV_F": sch.RECV_F,
    "SEND_B": sch.SEND_B,
    "RECV_B": sch.RECV_B,
}
# actions for sharded or replicated data parallelism, no-ops for the stage modules run here
_NO_OPS = ("UNSHARD", "RESHARD", "REDUCE_GRAD")


@functools.lru_cache(maxsize=64)
def library_lists(
    library_name: str, ranks: int, stages_per_rank: int, micro_batches: int
) -> tuple[tuple[sch.Action, ...], ...]:
    """Per rank, the actions the library's runtime runs in one step of its schedule
    ``library_name`` (``get_schedule_class``'s name), then the optimizer's STEP.

    Raises :class:`LibraryRefused` with the library's reason when it cannot build them."""
    from torch.distributed.pipelining._schedule_visualizer import get_schedule_ops

    # the library logs its schedule at INFO and prints a failing one; keep both out of the run's output
    quiet = logging.getLogger("torch.distributed.pipelining")
    level = quiet.level
    quiet.setLevel(logging.WARNING)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            # the runtime posts a receive early and waits for it at the compute that needs it: the
            # deferred placement puts it there, where this harness's replay blocks on it
            ops = get_schedule_ops(
                library_name,
                ranks,
                micro_batches,
                num_stages_per_rank=stages_per_rank,
                with_comms=True,
                defer_pp_recv=True,
            )
    except (ValueError, AssertionError, RuntimeError) as e:
        raise LibraryRefused(str(e).strip().splitlines()[0]) from None
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
            raise LibraryRefused(f"the library's schedule has an action this harness cannot replay: {a}")
        out.append(sch.Action(_OPS[kind], a.microbatch_index, stage=a.stage_index))
    return out


def to_library(actions: list[sch.Action]) -> list:
    """Actions in the library's own form (``_Action``), for its runtime to run."""
    from torch.distributed.pipelining.schedules import _Action, _ComputationType

    kinds = {ours: theirs for theirs, ours in _OPS.items()}
    return [_Action(a.stage, _ComputationType.from_str(kinds[a.op]), a.micro) for a in actions]
