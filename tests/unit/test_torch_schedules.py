"""torch.distributed.pipelining's multi-stage schedules as action lists, checked without processes."""

import pytest

from harness.runtime import actions as sch
from harness.runtime import schedules, torch_schedules

MULTI = [s.name for s in schedules.SCHEDULES.values() if s.placement != "one"]

# (ranks, stages per rank, micro-batches)
GRID = [(2, 2, 2), (2, 2, 4), (2, 2, 8), (2, 3, 4), (3, 2, 6), (4, 2, 4), (4, 2, 8), (4, 3, 8)]


def _built(name, P, v, m):
    try:
        return schedules.get(name).lists(P, v, m)
    except schedules.ScheduleError as e:
        return str(e)


@pytest.mark.parametrize("name", sorted(MULTI))
@pytest.mark.parametrize("P,v,m", GRID)
def test_each_stage_forwards_and_backwards_every_micro_batch_once_and_the_replay_finishes(name, P, v, m):
    lists = _built(name, P, v, m)
    if isinstance(lists, str):  # refused by the library's own rule (or V schedules' two per rank)
        assert (schedules.get(name).stages_per_rank and v != 2) or "microbatches" in lists, lists
        return
    where = schedules.get(name).place(P, v)
    assert sorted(where) == sorted(r for r in range(P) for _ in range(v))
    for rank, acts in enumerate(lists):
        assert acts[-1].op == sch.STEP and sum(a.op == sch.STEP for a in acts) == 1
        for s in schedules.get(name).stages_of(P, v, rank):
            assert where[s] == rank
            ops = [a for a in acts if a.stage == s]
            fwd = [a.micro for a in ops if a.op == sch.FWD]
            assert sorted(fwd) == list(range(m))
            # each micro-batch's backward once: whole, or (zero-bubble family) in its two parts
            whole = sorted(a.micro for a in ops if a.op == sch.BWD)
            inputs = sorted(a.micro for a in ops if a.op == sch.BWD_I)
            assert inputs == sorted(a.micro for a in ops if a.op == sch.BWD_W)
            assert sorted(whole + inputs) == list(range(m))
            assert bool(inputs) == schedules.get(name).splits_backward
            for i, a in enumerate(ops):  # a micro-batch's backward parts follow its forward, W after I
                if a.op in (sch.BWD, sch.BWD_I):
                    assert sch.Action(sch.FWD, a.micro, stage=s) in ops[:i]
                if a.op == sch.BWD_W:
                    assert sch.Action(sch.BWD_I, a.micro, stage=s) in ops[:i]
        # every action acts on a stage this rank holds
        assert {a.stage for a in acts if a.op != sch.STEP} <= set(schedules.get(name).stages_of(P, v, rank))
    sch.replay(lists, placement=where)  # raises Deadlock if the lists cannot all finish


@pytest.mark.parametrize("P,v,m", [(2, 2, 4), (2, 2, 8), (2, 3, 6), (3, 2, 6), (4, 2, 8), (4, 3, 8), (4, 2, 12)])
@pytest.mark.parametrize("name", ["interleaved_1f1b", "looped_bfs"])
def test_interleaving_gives_the_interleaved_bubble_formula(name, P, v, m):
    """With balanced stages, v stages per rank shrink 1F1B's bubble to (p-1)/(vm+p-1) (Narayanan et al.)."""
    timeline = sch.replay(_built(name, P, v, m), placement=schedules.get(name).place(P, v))
    for rank in range(P):
        assert timeline.idle_fraction(rank) == pytest.approx((P - 1) / (v * m + P - 1))


@pytest.mark.parametrize("P,m", [(2, 4), (2, 8), (4, 8), (4, 16)])
def test_zero_bubble_schedules_leave_less_idle_than_interleaving_and_zbv_least(P, m):
    def idle(name):
        timeline = sch.replay(_built(name, P, 2, m), placement=schedules.get(name).place(P, 2))
        return sum(timeline.idle_fraction(r) for r in range(P)) / P

    interleaved, zb, zbv = idle("interleaved_1f1b"), idle("zero_bubble"), idle("zbv")
    assert zbv <= zb < interleaved / 2


def test_interleaved_1f1b_holds_fewer_micro_batches_than_looped_bfs():
    """Depth first (interleaved 1F1B) starts backwards early; breadth first forwards every
    micro-batch through each local stage before any backward."""
    P, v, m = 4, 2, 8
    depth = sch.replay(_built("interleaved_1f1b", P, v, m), placement=schedules.get("interleaved_1f1b").place(P, v))
    breadth = sch.replay(_built("looped_bfs", P, v, m), placement=schedules.get("looped_bfs").place(P, v))
    assert [breadth.max_in_flight(r) for r in range(P)] == [v * m] * P
    assert all(depth.max_in_flight(r) < v * m for r in range(P))


def test_v_placement_puts_a_ranks_two_stages_at_both_ends():
    assert schedules.get("zbv").place(4, 2) == [0, 1, 2, 3, 3, 2, 1, 0]
    assert schedules.get("interleaved_1f1b").place(4, 2) == [0, 1, 2, 3, 0, 1, 2, 3]
    assert schedules.get("dualpipev").stages_of(4, 2, 1) == [1, 6]


@pytest.mark.parametrize("name", sorted(MULTI))
def test_the_forward_only_order_finishes_and_forwards_every_micro_batch_through_every_stage(name):
    P, v, m = 3, 2, 4
    lists = schedules.get(name).forward_only(P, v, m)
    timeline = sch.replay(lists, placement=schedules.get(name).place(P, v))
    done = {(e.action.stage, e.action.micro) for e in timeline.events if e.action.op == sch.FWD}
    assert done == {(s, k) for s in range(P * v) for k in range(m)}
    assert len(torch_schedules.to_library(lists[0])) == len(lists[0])


def test_the_library_refuses_in_its_own_words():
    with pytest.raises(schedules.ScheduleError, match="at least as many microbatches as stages"):
        schedules.get("dualpipev").lists(2, 2, 2)
    with pytest.raises(schedules.ScheduleError, match="exactly 2 stages per rank"):
        schedules.get("zbv").lists(2, 3, 4)
