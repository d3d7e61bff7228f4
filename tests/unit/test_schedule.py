"""Schedules as data, checked without processes."""

from dataclasses import replace

import pytest

from harness.runtime import actions as sch
from harness.runtime import schedules
from harness.runtime.topology import Topology, micro_ranges, owned_range, transfers

GRID = [(p, m) for p in (1, 2, 3, 4, 6) for m in (1, 2, 3, 4, 8)]


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
@pytest.mark.parametrize("p,m", GRID)
def test_every_backward_follows_its_forward_and_each_micro_batch_runs_once(name, p, m):
    for acts in schedules.get(name).lists(p, 1, m):
        fwd = [a.micro for a in acts if a.op == sch.FWD]
        bwd = [a.micro for a in acts if a.op == sch.BWD]
        assert sorted(fwd) == sorted(bwd) == list(range(m))
        for i, a in enumerate(acts):
            if a.op == sch.BWD:
                assert any(f.op == sch.FWD and f.micro == a.micro for f in acts[:i]), (a, acts)
        assert acts[-1].op == sch.STEP and sum(a.op == sch.STEP for a in acts) == 1
        # exactly one backward starts the gradient all-reduce: the last one
        reduce = [a for a in acts if a.reduce]
        assert len(reduce) == 1 and reduce[0] is [a for a in acts if a.op == sch.BWD][-1]


@pytest.mark.parametrize("name", ["gpipe", "1f1b", "zb_h1"])
@pytest.mark.parametrize("p,m", GRID)
def test_sends_pair_with_receives_and_the_plan_is_deadlock_free(name, p, m):
    lists = schedules.get(name).lists(p, 1, m)
    for s, acts in enumerate(lists):
        for a in acts:
            if a.op == sch.SEND_F:
                assert sch.Action(sch.RECV_F, a.micro) in lists[s + 1]
            if a.op == sch.SEND_B:
                assert sch.Action(sch.RECV_B, a.micro) in lists[s - 1]
    sch.replay(lists)  # raises Deadlock otherwise


def test_the_simulator_detects_a_deadlock_and_an_unmatched_send():
    # both stages receive first: nobody ever sends
    bad = [
        [sch.Action(sch.RECV_B, 0), sch.Action(sch.FWD, 0), sch.Action(sch.SEND_F, 0)],
        [sch.Action(sch.RECV_F, 0), sch.Action(sch.FWD, 0), sch.Action(sch.SEND_B, 0)],
    ]
    with pytest.raises(sch.Deadlock, match="no stage can progress"):
        sch.replay(bad)
    with pytest.raises(sch.Deadlock, match="never received"):
        sch.replay([[sch.Action(sch.FWD, 0), sch.Action(sch.SEND_F, 0)], [sch.Action(sch.FWD, 0)]])


# stage 0 sends at 1; stage 1 computes for 5 before it reaches its receive; a send costs 1
_SEND_THEN_LATE_RECEIVE = [
    [sch.Action(sch.FWD, 0), sch.Action(sch.SEND_F, 0), sch.Action(sch.FWD, 1)],
    [sch.Action(sch.BWD, 9), sch.Action(sch.RECV_F, 0), sch.Action(sch.FWD, 0)],
]


def _forward_1_backward_5(stage, a):
    return {sch.FWD: 1.0, sch.BWD: 5.0}.get(a.op, 1.0)


def test_a_rendezvous_send_waits_for_its_receive_and_holds_its_sender():
    lists, cost = _SEND_THEN_LATE_RECEIVE, _forward_1_backward_5

    def send_and_next_forward(timeline):
        ev = timeline.stage_events(0)
        return ev[1].end, ev[2].start, timeline.stage_events(1)[2].start

    # a posted send arrives at 2 whenever the receiver gets to it
    assert send_and_next_forward(sch.replay(lists, cost, sch.Transport(blocking_sends=True))) == (2.0, 2.0, 5.0)
    # a blocking send meets its receive at 5 and both go on at 6
    assert send_and_next_forward(sch.replay(lists, cost, sch.RENDEZVOUS)) == (6.0, 6.0, 6.0)
    # two stages sending to each other first never meet
    crossed = [
        [sch.Action(sch.SEND_F, 0), sch.Action(sch.RECV_B, 0)],
        [sch.Action(sch.SEND_B, 0), sch.Action(sch.RECV_F, 0)],
    ]
    sch.replay(crossed, cost)
    with pytest.raises(sch.Deadlock, match="no stage can progress"):
        sch.replay(crossed, cost, sch.RENDEZVOUS)


def test_a_receiver_driven_message_moves_once_its_receive_is_reached():
    lists, cost = _SEND_THEN_LATE_RECEIVE, _forward_1_backward_5

    def send_and_receiver_forward(timeline):
        return timeline.stage_events(0)[1].end, timeline.stage_events(1)[2].start

    # the receive comes late: the message moves from 5, arrives at 6; the sender went on at once
    assert send_and_receiver_forward(sch.replay(lists, cost, sch.GLOO)) == (1.0, 6.0)

    # the receive is waiting (stage 1 reaches it at 0.5): the message moves at once, holding its
    # sender, and arrives at 2
    def half(stage, a):
        return 0.5 if a.op == sch.BWD else cost(stage, a)

    assert send_and_receiver_forward(sch.replay(lists, half, sch.GLOO)) == (2.0, 2.0)
    # whichever list the replay reaches first: the receiving stage listed first gives the same times
    swapped = sch.replay(
        [[replace(a, stage=1) for a in lists[1]], [replace(a, stage=0) for a in lists[0]]],
        lambda stage, a: cost(1 - stage, a),
        sch.GLOO,
        placement=[1, 0],
    )
    assert (swapped.stage_events(1)[1].end, swapped.stage_events(0)[2].start) == (1.0, 6.0)
    # crossed non-blocking sends still never deadlock
    crossed = [
        [sch.Action(sch.SEND_F, 0), sch.Action(sch.RECV_B, 0)],
        [sch.Action(sch.SEND_B, 0), sch.Action(sch.RECV_F, 0)],
    ]
    assert sch.replay(crossed, cost, sch.Transport(receiver_driven=True)).makespan == 1.0


def test_a_late_receive_waits_more_while_its_sender_computes_and_not_while_it_waits():
    def receiver_forward(lists):
        return sch.replay(lists, _forward_1_backward_5, replace(sch.GLOO, busy_sender_s=0.25)).stage_events(1)[2].start

    # stage 0 computes (a backward, then F1) from 1 to 7 when stage 1 reaches its receive at 5
    busy = [
        [sch.Action(sch.FWD, 0), sch.Action(sch.SEND_F, 0), sch.Action(sch.BWD, 1), sch.Action(sch.FWD, 1)],
        [sch.Action(sch.BWD, 9), sch.Action(sch.RECV_F, 0), sch.Action(sch.FWD, 0)],
    ]
    assert receiver_forward(busy) == 6.25
    # stage 0 waits (for a gradient stage 1 sends only after its forward) when stage 1 gets there
    waiting = [
        [sch.Action(sch.FWD, 0), sch.Action(sch.SEND_F, 0), sch.Action(sch.RECV_B, 0)],
        [sch.Action(sch.BWD, 9), sch.Action(sch.RECV_F, 0), sch.Action(sch.FWD, 0), sch.Action(sch.SEND_B, 0)],
    ]
    assert receiver_forward(waiting) == 6.0


def test_a_compute_action_after_a_wait_pays_the_wake_up_for_that_wait():
    # stage 1 waits 3 for its receive (stage 0's forward), then computes; stage 0 never waits
    lists = [
        [sch.Action(sch.FWD, 0), sch.Action(sch.SEND_F, 0), sch.Action(sch.FWD, 1)],
        [sch.Action(sch.RECV_F, 0), sch.Action(sch.FWD, 0), sch.Action(sch.BWD, 0)],
    ]

    def cost(stage, a):
        return {sch.FWD: 3.0, sch.BWD: 1.0}.get(a.op, 0.0)

    waits = []

    def wake(idle):
        waits.append(idle)
        return idle / 10

    t = sch.replay(lists, cost, wake=wake)
    assert waits == [3.0]  # once, for the one wait; the backward right after pays nothing
    assert [(e.start, e.end) for e in t.stage_events(1)] == [(3.0, 3.0), (3.0, 6.3), (6.3, 7.3)]
    assert t.stage_events(0)[-1].end == 6.0
    assert sch.replay(lists, cost).makespan == 7.0


@pytest.mark.parametrize("p,m", GRID)
def test_1f1b_keeps_at_most_p_minus_s_micro_batches_in_flight(p, m):
    timeline = sch.replay(sch.one_f_one_b(p, m))
    for s in range(p):
        assert timeline.max_in_flight(s) == min(p - s, m)


@pytest.mark.parametrize("p,m", GRID)
def test_zb_h1_splits_every_backward_keeps_1f1b_memory_and_leaves_less_bubble(p, m):
    lists = schedules.get("zb_h1").lists(p, 1, m)
    for acts in lists:
        position = {(a.op, a.micro): i for i, a in enumerate(acts)}
        for op in (sch.FWD, sch.BWD_I, sch.BWD_W):
            assert sorted(a.micro for a in acts if a.op == op) == list(range(m)), (op, acts)
        assert all(position[sch.FWD, k] < position[sch.BWD_I, k] < position[sch.BWD_W, k] for k in range(m))
        assert not any(a.op == sch.BWD for a in acts)
        # the step's last weight-gradient pass starts the all-reduce; the step comes last
        assert [a for a in acts if a.reduce] == [[a for a in acts if a.op == sch.BWD_W][-1]]
        assert acts[-1].op == sch.STEP and sum(a.op == sch.STEP for a in acts) == 1
    zb, one_f_one_b = sch.replay(lists), sch.replay(sch.one_f_one_b(p, m))
    for s in range(p):  # held from its forward to its W: at most 1F1B's peak, that of its first stage
        assert zb.max_in_flight(s) <= min(p, m)
    idle = lambda t: sum(t.idle_fraction(s) for s in range(p)) / p  # noqa: E731
    assert idle(zb) < idle(one_f_one_b) if p > 1 else idle(zb) == idle(one_f_one_b) == 0
    if m >= p:  # the paper's bubble, (p - 1)(F + I - W), with every pass one unit
        assert sch.replay(lists, lambda _, a: 1.0 if a.op in sch.COMPUTE else 0.0).makespan == 3 * m + p - 1


@pytest.mark.parametrize("p,m", [(2, 4), (4, 4), (4, 8), (3, 5)])
def test_gpipe_keeps_all_micro_batches_in_flight(p, m):
    timeline = sch.replay(sch.gpipe(p, m))
    assert all(timeline.max_in_flight(s) == m for s in range(p))


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
@pytest.mark.parametrize("p,m", GRID)
def test_unit_cost_idle_fraction_is_the_bubble_formula(name, p, m):
    timeline = sch.replay(schedules.get(name).lists(p, 1, m))
    assert timeline.makespan == 3 * (m + p - 1)  # a forward one unit, a backward two
    for s in range(p):
        assert timeline.idle_fraction(s) == pytest.approx((p - 1) / (m + p - 1))


def test_text_timeline():
    text = sch.render(sch.replay(sch.one_f_one_b(2, 3)))
    lines = text.splitlines()
    assert lines[0].startswith("stage 0: F0  F1  .   .   B0  B0  F2  B1  B1  .   B2  B2")
    assert lines[1].startswith("stage 1: .   F0  B0  B0  F1  B1  B1  F2  B2  B2")


@pytest.mark.parametrize("replicas,batch,m", [((2, 1), 10, 1), ((1, 3), 7, 1), ((3, 2), 13, 2), ((2, 2), 12, 3)])
def test_transfers_cover_each_sample_once_between_overlapping_replicas(replicas, batch, m):
    topo = Topology(replicas)
    for k, (lo, hi) in enumerate(micro_ranges(batch, m)):
        pieces = transfers(topo, batch, m, k, stage=0)
        covered = sorted(i for t in pieces for i in range(t.lo, t.hi))
        assert covered == list(range(lo, hi))
        for t in pieces:  # a piece lies inside both the sender's and the receiver's share
            s_lo, s_hi = owned_range(topo, batch, m, k, 0, topo.replica_of(t.src))
            d_lo, d_hi = owned_range(topo, batch, m, k, 1, topo.replica_of(t.dst))
            assert s_lo <= t.lo < t.hi <= s_hi and d_lo <= t.lo < t.hi <= d_hi
    if replicas[0] == replicas[1]:
        assert all(topo.replica_of(t.src) == topo.replica_of(t.dst) for t in transfers(topo, batch, m, 0, 0))


def test_every_schedule_the_registry_gives_our_runtime_has_only_actions_its_executor_runs():
    from harness.runtime.executor import StageExecutor

    for name in schedules.names(ours=True, asynchronous=None):
        kind = schedules.get(name)
        assert StageExecutor.unsupported(kind.lists(3, kind.default_stages_per_rank, 6)) == [], name
    assert StageExecutor.unsupported([[sch.Action(sch.FWD, 0), sch.Action("X", 0), sch.Action(sch.STEP)]]) == ["X"]


def test_an_action_kind_the_executor_lacks_is_refused_before_launch_in_one_line():
    from harness.core.errors import ConfigError
    from harness.strategies.layout import refuse_unrunnable

    refuse_unrunnable(schedules.get("1f1b"), 2, 1, 4)  # runs
    odd = schedules.Schedule(
        "odd",
        "a schedule with an action kind no method runs",
        lambda r, v, m: [[sch.Action(sch.FWD, 0), sch.Action("X", 0), sch.Action(sch.STEP)]],
    )
    with pytest.raises(ConfigError, match="has actions X that our runtime's executor does not run"):
        refuse_unrunnable(odd, 1, 1, 1)
    with pytest.raises(ConfigError, match="at least as many microbatches as stages"):
        refuse_unrunnable(schedules.get("dualpipev"), 2, 2, 2)


def test_the_registry_names_each_schedule_once_with_a_placement_that_covers_its_stages():
    for name, kind in schedules.SCHEDULES.items():
        assert kind.name == name and kind.summary
        v = kind.default_stages_per_rank
        where = kind.place(3, v)
        assert sorted(where) == sorted(r for r in range(3) for _ in range(v))
        assert sorted(s for r in range(3) for s in kind.stages_of(3, v, r)) == list(range(3 * v))
    with pytest.raises(schedules.ScheduleError, match="unknown schedule 'nope'"):
        schedules.get("nope")


def test_a_micro_batch_holds_what_its_stage_keeps_after_i_until_its_w():
    """ZB-H1's last of 2 stages at 4 micro-batches runs F0 I0 F1 I1 W0 F2 I2 W1 F3 I3 W2 W3: one
    unit held from F to I and three from I to W (a stage recomputed at I keeps every activation)
    peak with two micro-batches between their I and W, 3 + 3 (one unit throughout: 2)."""
    timeline = sch.replay(schedules.get("zb_h1").lists(2, 1, 4))
    assert [
        str(e.action).rstrip("*") for e in timeline.stage_events(1) if e.action.op in sch.COMPUTE
    ] == "F0 I0 F1 I1 W0 F2 I2 W1 F3 I3 W2 W3".split()
    assert timeline.peak_live(1, lambda s: 1.0) == 2
    assert timeline.peak_live(1, lambda s: 1.0, lambda s: 3.0) == 6
    assert timeline.peak_live(1, lambda s: 1.0, lambda s: 1.0) == 2


def test_a_placed_topology_puts_each_stage_on_its_positions_ranks():
    # two rank positions of two replicas each, four stages in V placement: rank r's stages are
    # r's position's, and the turn of the V (stages 1 and 2) stays on the same ranks
    topo = Topology((2, 2, 2, 2), schedules.get("zbv").place(2, 2))
    assert topo.world_size == 4 and topo.positions == 2
    assert [topo.ranks_of(s) for s in range(4)] == [[0, 1], [2, 3], [2, 3], [0, 1]]
    assert [topo.stages_at(topo.position_of(r)) for r in range(4)] == [[0, 3], [0, 3], [1, 2], [1, 2]]
    assert [topo.replica_of(r) for r in range(4)] == [0, 1, 0, 1]
    assert all(t.src == t.dst for t in transfers(topo, 12, 3, 0, stage=1))
    loop = Topology((1,) * 6, schedules.get("interleaved_1f1b").place(2, 3))
    assert [loop.ranks_of(s)[0] for s in range(6)] == [0, 1, 0, 1, 0, 1]
    with pytest.raises(ValueError, match="same replicas"):
        Topology((2, 1, 2, 2), schedules.get("zbv").place(2, 2))


@pytest.mark.parametrize("name", ["interleaved_1f1b", "zero_bubble", "zbv", "dualpipev"])
def test_each_stage_reduces_under_its_own_last_weight_gradient_action(name):
    kind = schedules.get(name)
    for acts in sch.reducing(kind.lists(2, 2, 4)):
        marked = [a for a in acts if a.reduce]
        assert len(marked) == 2 and {a.stage for a in marked} == {a.stage for a in acts if a.stage is not None}
        for a in marked:  # nothing of its stage's gradients comes after it
            after = acts[acts.index(a) + 1 :]
            assert not [b for b in after if b.stage == a.stage and b.op in (sch.BWD, sch.BWD_W)]
    assert sch.reducing(sch.one_f_one_b(2, 3)) == sch.one_f_one_b(2, 3)  # ours are marked already


def test_receives_are_posted_in_each_senders_order():
    # NCCL pairs two ranks' messages by order: each peer's messages are posted in the order that peer
    # sends them; our schedules already receive so, the library's ZB-V lists do not
    def peer_orders(lists, placement, lane, acts):
        where = placement or list(range(len(lists)))
        by_peer = {}
        for a in acts:
            s = lane if a.stage is None else a.stage
            other = s - 1 if a.op in (sch.RECV_F, sch.SEND_B) else s + 1
            by_peer.setdefault(where[other], []).append((a.op in (sch.RECV_F, sch.SEND_F), a.micro, min(s, other)))
        return by_peer

    for name in schedules.names(ours=True):
        kind = schedules.get(name)
        v = kind.default_stages_per_rank
        for ranks in (2, 3):
            lists, placement = kind.lists(ranks, v, 6), kind.placement_of(ranks, v)
            order = sch.receive_order(lists, placement)
            for lane, acts in enumerate(lists):
                receives = [a for a in acts if a.op in (sch.RECV_F, sch.RECV_B)]
                assert sorted(map(str, order[lane])) == sorted(map(str, receives)), (name, lane)
                if name in ("gpipe", "1f1b", "zb_h1", "interleaved_1f1b"):
                    assert order[lane] == receives, (name, ranks, lane)  # the list's own order
                for peer, taken in peer_orders(lists, placement, lane, order[lane]).items():
                    sends = [a for a in lists[peer] if a.op in (sch.SEND_F, sch.SEND_B)]
                    assert taken == peer_orders(lists, placement, peer, sends)[lane], (name, ranks, lane, peer)
    zbv = schedules.get("zbv")
    lists = zbv.lists(2, 2, 4)
    assert sch.receive_order(lists, zbv.placement_of(2, 2))[1] != [a for a in lists[1] if a.op.startswith("RECV")]
    swapped = sch.gpipe(2, 2)  # stage 1: RECV_F0, F0, RECV_F1, F1, ...
    swapped[1][0], swapped[1][2] = swapped[1][2], swapped[1][0]  # it waits for micro-batch 1 first
    assert sch.receive_order(swapped)[1][:2] == [sch.Action(sch.RECV_F, 0), sch.Action(sch.RECV_F, 1)]
