"""Pipeline schedules' action lists as plain data, and a replay that checks and times them.

A schedule is one list of :class:`Action` per stage (all replicas of a stage
run the same list). The executor maps each action to one method; :func:`replay`
runs the same lists with a cost per action, which is how tests prove
deadlock-freedom and bubble sizes without processes, and how the scale-out
simulator (:mod:`harness.planning.simulator`) predicts runs it cannot make. The
registry of named schedules is :mod:`harness.runtime.schedules`.

Where a rank holds several stages (interleaved and V-shaped schedules) the lists
are one per rank and each action names its stage (``Action.stage``); the replay
is told which rank holds which stage. The zero-bubble family splits a backward into its
input-gradient part (``I``, what the previous stage waits for) and its
weight-gradient part (``W``, free to fill a bubble).

Semantics shared by the executor and the simulator: sends never block (they
complete in the background and are waited at the end of the iteration); a
receive blocks until the matching send has been issued by the adjacent stage.
Where a transport moves messages otherwise (gloo on a CPU host, blocking calls), the
replay is told how (:class:`Transport`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

# op codes
RECV_F, FWD, SEND_F, RECV_B, BWD, SEND_B, STEP = "RECV_F", "F", "SEND_F", "RECV_B", "B", "SEND_B", "STEP"
BWD_I, BWD_W = "I", "W"  # a backward split: input gradients, then weight gradients
COMPUTE = (FWD, BWD, BWD_I, BWD_W)


@dataclass(frozen=True)
class Action:
    op: str
    micro: int = -1
    # on a backward: start the bucketed gradient all-reduce as gradients become final
    reduce: bool = False
    # the stage acted on, in lists of a rank that holds several; None: the list's own stage
    stage: int | None = None

    def __str__(self) -> str:
        if self.op == STEP:
            return "STEP" if self.micro < 0 else f"STEP{self.micro}"
        prefix = "" if self.stage is None else str(self.stage)  # torch pipelining's notation: 2F0
        return f"{prefix}{self.op}{self.micro}" + ("*" if self.reduce else "")


def forward_actions(stage: int, num_stages: int, k: int) -> list[Action]:
    """Micro-batch ``k``'s forward on ``stage`` of a one-stage-per-rank pipeline, with its transfers."""
    acts = [Action(RECV_F, k)] if stage > 0 else []
    acts.append(Action(FWD, k))
    if stage < num_stages - 1:
        acts.append(Action(SEND_F, k))
    return acts


def backward_actions(stage: int, num_stages: int, k: int, reduce: bool) -> list[Action]:
    """Micro-batch ``k``'s backward on ``stage``, with its transfers; ``reduce``: the step's last
    backward, under which the replica all-reduce starts as gradients become final."""
    acts = [Action(RECV_B, k)] if stage < num_stages - 1 else []
    acts.append(Action(BWD, k, reduce=reduce))
    if stage > 0:
        acts.append(Action(SEND_B, k))
    return acts


def gpipe(num_stages: int, micro_batches: int) -> list[list[Action]]:
    """Fill-drain: all forwards, then all backwards (last micro-batch first), then the step."""
    out = []
    for s in range(num_stages):
        acts = [a for k in range(micro_batches) for a in forward_actions(s, num_stages, k)]
        order = list(reversed(range(micro_batches)))
        for k in order:
            acts += backward_actions(s, num_stages, k, reduce=(k == order[-1]))
        acts.append(Action(STEP))
        out.append(acts)
    return out


def one_f_one_b(num_stages: int, micro_batches: int) -> list[list[Action]]:
    """1F1B with a flush: stage s runs ``min(S - 1 - s, m)`` warm-up forwards, then
    alternates one forward and one backward, then drains the remaining backwards.
    At most ``S - s`` micro-batches are in flight at stage s."""
    out = []
    for s in range(num_stages):
        warmup = min(num_stages - 1 - s, micro_batches)
        acts: list[Action] = []
        fwd = bwd = 0
        for _ in range(warmup):
            acts += forward_actions(s, num_stages, fwd)
            fwd += 1
        while fwd < micro_batches:
            acts += forward_actions(s, num_stages, fwd)
            fwd += 1
            acts += backward_actions(s, num_stages, bwd, reduce=(bwd == micro_batches - 1))
            bwd += 1
        while bwd < micro_batches:
            acts += backward_actions(s, num_stages, bwd, reduce=(bwd == micro_batches - 1))
            bwd += 1
        acts.append(Action(STEP))
        out.append(acts)
    return out


def zb_h1(num_stages: int, micro_batches: int) -> list[list[Action]]:
    """ZB-H1 (Qi et al., ICLR 2024), one stage per rank: each backward split into its input-gradient
    part ``I`` (what the previous stage waits for) and its weight-gradient part ``W`` (free to
    wait). The forwards and the ``I`` passes keep 1F1B's order (``S - s`` forwards of warm-up,
    then one ``I`` and one forward in turn); stage ``s`` runs each ``W`` ``s`` micro-batches
    after its ``I``, and the deferred ones at the end. A stage so holds at most ``S`` micro-batches
    between a forward and its ``W``, the peak 1F1B reaches on its first stage, and with unit costs
    the step takes ``3m + S - 1`` units against 1F1B's ``3(m + S - 1)``: the bubble
    ``(S - 1)(F + I - W)`` of the paper. Sends never block, so the order holds whatever the real
    costs are. The step's last ``W`` carries ``reduce``: each gradient bucket's replica all-reduce
    starts as soon as that pass has finalised it."""
    S, m = num_stages, micro_batches
    out = []
    for s in range(S):
        acts: list[Action] = []
        forwards = weights = 0

        def weight() -> None:
            nonlocal weights
            acts.append(Action(BWD_W, weights, reduce=weights == m - 1))
            weights += 1

        for _ in range(min(S - s, m)):
            acts += forward_actions(s, S, forwards)
            forwards += 1
        for k in range(m):
            acts += ([Action(RECV_B, k)] if s < S - 1 else []) + [Action(BWD_I, k)]
            acts += [Action(SEND_B, k)] if s > 0 else []
            if k >= s:
                weight()
            if forwards < m:
                acts += forward_actions(s, S, forwards)
                forwards += 1
        while weights < m:
            weight()
        acts.append(Action(STEP))
        out.append(acts)
    return out


def reducing(schedules: list[list[Action]]) -> list[list[Action]]:
    """``schedules`` with each stage's last backward of the step (its last ``B``, or its last ``W``
    under a split backward) marked ``reduce``: the one that finalises the stage's gradients, under
    which its replica all-reduce starts. The library's lists carry no such mark; ours have it."""
    out = []
    for acts in schedules:
        last = {a.stage: i for i, a in enumerate(acts) if a.op in (BWD, BWD_W)}
        out.append([Action(a.op, a.micro, True, a.stage) if i in last.values() else a for i, a in enumerate(acts)])
    return out


def _message(lane: int, a: Action, where: list[int]) -> tuple[int, tuple]:
    """(the other end's list, the message) of a send or receive: (forward?, micro-batch, the lower
    stage of the boundary it crosses)."""
    s = lane if a.stage is None else a.stage
    other = s + 1 if a.op in (SEND_F, RECV_B) else s - 1
    return where[other], (a.op in (SEND_F, RECV_F), a.micro, min(s, other))


def receive_order(schedules: list[list[Action]], placement: list[int] | None = None) -> list[list[Action]]:
    """Per list, its receive actions in the order to post them: each peer's messages in the order
    that peer sends them, each as late as that allows. NCCL pairs two ranks' messages by order,
    not by tag: a receive posted out of its sender's order would take another message. Our
    one-stage schedules receive in send order already (the order is the list's own); the
    library's lists for ZB-V, and for ZB1P and DualPipeV at some rank counts, place a receive
    where the library's runtime waits for it, having posted it earlier, as this order does."""
    where = placement or list(range(len(schedules)))
    sent: dict[tuple[int, int], list] = {}  # (sender, receiver) -> messages in the order sent
    for lane, acts in enumerate(schedules):
        for a in acts:
            if a.op in (SEND_F, SEND_B):
                to, message = _message(lane, a, where)
                sent.setdefault((lane, to), []).append(message)
    out = []
    for lane, acts in enumerate(schedules):
        receives = {a: _message(lane, a, where) for a in acts if a.op in (RECV_F, RECV_B)}
        receive_of = {message: a for a, (_, message) in receives.items()}
        order, posted = [], set()
        for frm, message in receives.values():  # in the list's order
            for earlier in sent[(frm, lane)]:  # what the peer sends up to it, in its order
                if earlier not in posted:
                    posted.add(earlier)
                    order.append(receive_of[earlier])
                if earlier == message:
                    break
        out.append(order)
    return out


# PipeDream-style asynchronous 1F1B (AshPipe): one minibatch at a time, no flush.
# Stage s admits ``S - 1 - s`` minibatches of warm-up, then alternates one
# forward with one backward, and steps its optimizer after every backward. The
# action lists are produced one minibatch at a time, because a run does not know
# in advance how many minibatches it will take.


def async_warmup(num_stages: int, stage: int) -> int:
    return num_stages - 1 - stage


def async_step(num_stages: int, stage: int, minibatch: int) -> list[Action]:
    """What ``stage`` does when minibatch ``minibatch`` enters the pipeline."""
    acts = forward_actions(stage, num_stages, minibatch)
    done = minibatch - async_warmup(num_stages, stage)
    if done >= 0:
        acts += backward_actions(stage, num_stages, done, reduce=True) + [Action(STEP, done)]
    return acts


def async_drain(num_stages: int, stage: int, minibatches: int) -> list[Action]:
    """The backwards (and steps) still owed by ``stage`` after ``minibatches`` have entered."""
    first = max(0, minibatches - async_warmup(num_stages, stage))
    acts: list[Action] = []
    for k in range(first, minibatches):
        acts += backward_actions(stage, num_stages, k, reduce=True) + [Action(STEP, k)]
    return acts


def async_1f1b(num_stages: int, minibatches: int) -> list[list[Action]]:
    """The whole asynchronous run of ``minibatches``, per stage (for simulation and tests)."""
    return [
        [a for i in range(minibatches) for a in async_step(num_stages, s, i)] + async_drain(num_stages, s, minibatches)
        for s in range(num_stages)
    ]


def forward_only(num_stages: int, micro_batches: int) -> list[list[Action]]:
    """Evaluation: forwards of every micro-batch, no backward, no step."""
    return [[a for k in range(micro_batches) for a in forward_actions(s, num_stages, k)] for s in range(num_stages)]


# ---------------------------------------------------------------------------
# simulation


class Deadlock(RuntimeError):
    pass


@dataclass
class Event:
    stage: int  # the list that ran it: a stage, or a rank where a rank holds several stages
    action: Action
    start: float
    end: float


@dataclass
class Timeline:
    events: list[Event] = field(default_factory=list)

    @property
    def makespan(self) -> float:
        return max((e.end for e in self.events), default=0.0)

    def stage_events(self, stage: int) -> list[Event]:
        return [e for e in self.events if e.stage == stage]

    def busy(self, stage: int) -> float:
        return sum(e.end - e.start for e in self.stage_events(stage) if e.action.op in COMPUTE)

    def idle_fraction(self, stage: int) -> float:
        return 1.0 - self.busy(stage) / self.makespan

    def max_in_flight(self, stage: int, of: int | None = None) -> int:
        """Most micro-batches forwarded but not yet backwarded at once on list ``stage`` (only
        those of stage ``of``, where the list holds several stages)."""
        return int(self.peak_live(stage, lambda s: 1.0 if of is None or s == of else 0.0))

    def peak_live(
        self, stage: int, held: Callable[[int], float], held_after_i: Callable[[int], float] | None = None
    ) -> float:
        """The most that list ``stage`` holds at once when each micro-batch forwarded on stage s
        holds ``held(s)`` until its backward (a split backward releases it at the weight part,
        which still needs the saved activations), and ``held_after_i(s)`` from its input-gradient
        part to its weight part where that differs (a stage recomputed at I)."""
        after_i = held_after_i or held
        live = peak = 0.0
        for e in self.stage_events(stage):
            on = stage if e.action.stage is None else e.action.stage
            if e.action.op == FWD:
                live += held(on)
            elif e.action.op == BWD_I:
                live += after_i(on) - held(on)
            elif e.action.op == BWD:
                live -= held(on)
            elif e.action.op == BWD_W:
                live -= after_i(on)
            peak = max(peak, live)
        return peak


def unit_cost(stage: int, action: Action) -> float:
    """The textbook balanced pipeline (the zero-bubble papers' assumption): a forward takes one
    unit, each half of a backward (input and weight gradients) one, a whole backward two;
    transfers and the step are free."""
    return _UNIT.get(action.op, 0.0)


_UNIT = {FWD: 1.0, BWD: 2.0, BWD_I: 1.0, BWD_W: 1.0}


@dataclass(frozen=True)
class Transport:
    """How a replayed send moves its message (a send action's cost is its transfer time): when
    the message starts to move, and when its sender goes on. The transports replayed here are the
    presets :data:`NCCL`, :data:`GLOO` (with a measured ``busy_sender_s``) and :data:`RENDEZVOUS`."""

    # the sender goes on only once its message has arrived (the sending process copies the message
    # itself, as gloo on a CPU does); False: at once (a DMA engine or NCCL moves it)
    blocking_sends: bool = False
    # blocking point-to-point calls (``dist.send`` / ``dist.recv``, as DeepSpeed's pipeline issues
    # them): a send starts moving its message only once the receiver has reached the matching
    # receive, and its sender goes on only when the message has arrived
    rendezvous: bool = False
    # a message moves only once its receive is posted, so a receive reached after its send waits
    # for the whole transfer from then on, however early the send was issued; the sender of a
    # message whose receive is not yet posted goes on at once (``blocking_sends`` holds only a
    # sender whose receive is already waiting, which writes the message in the call)
    receiver_driven: bool = False
    # what such a late receive waits more when its sender is computing then (busy, not waiting
    # itself): the thread that writes the message waits for the computing thread's core
    busy_sender_s: float = 0.0


# sends move their message in the background from their issue, and the sender goes on at once: NCCL
# (a DMA engine moves the message), and the textbook pipeline (the replay's default)
NCCL = Transport()
# gloo's non-blocking transfers on a CPU host: its I/O thread writes a message once the receive is
# posted (on the waiting receiver's idle core), and an ``isend`` whose receive already waits writes
# it in the call
GLOO = Transport(blocking_sends=True, receiver_driven=True)
# blocking ``dist.send`` / ``dist.recv``: a send returns only once its receive is posted
RENDEZVOUS = Transport(rendezvous=True)


def replay(
    schedules: list[list[Action]],
    cost: Callable[[int, Action], float] = unit_cost,
    transport: Transport = NCCL,
    placement: list[int] | None = None,
    wake: Callable[[float], float] | None = None,
) -> Timeline:
    """Replay per-stage action lists; raise Deadlock if they cannot all finish.

    Each stage runs its list in order. An action takes ``cost`` of it; a send's cost is its
    transfer time, and ``transport`` says when its message moves and when its sender goes on
    (:class:`Transport`). A receive waits for the matching send of the adjacent stage (same kind
    and micro-batch, FIFO) to arrive. Every send must be received and every receive sent, or it
    is an error.

    ``wake(idle)`` is what a compute action adds when its list waited ``idle`` seconds (for a
    receive, or for a blocking send's receiver) since its last compute: on a CPU host a process
    that sleeps while it waits computes slower when it wakes (harness.planning.profiling).

    ``placement`` (stage -> list) is for lists of ranks that hold several stages: an action
    acts on its ``stage``, and a send goes to the next (or previous) stage wherever it lives.
    Adjacent stages on one rank pass tensors without a send, in list order.
    """
    return _Replay(schedules, cost, transport, placement, wake).run()


_Message = tuple[str, int, int]  # (F or B, micro-batch, the stage it goes to)


class _Replay:
    """One :func:`replay`: per list, its next action, its clock and its events; the messages in flight."""

    def __init__(self, schedules, cost, transport: Transport, placement, wake):
        self.schedules, self.cost, self.transport, self.wake = schedules, cost, transport, wake
        n = len(schedules)
        self.stages = len(placement) if placement is not None else n
        self.pc = [0] * n
        self.clock = [0.0] * n
        self.idle = [0.0] * n  # per list: time spent waiting since its last compute action
        self.arrived: dict[_Message, list[float]] = {}  # arrival times
        # rendezvous and receiver-driven: receives reached, not yet sent to -> when
        self.posted: dict[_Message, float] = {}
        # receiver-driven: sends whose receive is not yet reached -> (sent at, transfer, sending list)
        self.unclaimed: dict[_Message, list[tuple[float, float, int]]] = {}
        self.timeline = Timeline()
        self.runs: list[list[Event]] = [[] for _ in range(n)]  # each list's events

    def run(self) -> Timeline:
        while waiting := [s for s in range(len(self.schedules)) if self.pc[s] < len(self.schedules[s])]:
            # one action at a time, from the list earliest in time: a receive is then reached before
            # any send issued after it, which is what a receiver-driven send needs to know
            if not any(self._advance(s) for s in sorted(waiting, key=self._earliest)):
                stuck = {s: str(self.schedules[s][self.pc[s]]) for s in waiting}
                raise Deadlock(f"no stage can progress; waiting at {stuck}")
        unreceived = {k: v for k, v in [*self.arrived.items(), *self.unclaimed.items()] if v}
        if unreceived:
            raise Deadlock(f"messages sent but never received: {sorted(unreceived)}")
        return self.timeline

    def _earliest(self, s: int) -> tuple[float, bool]:  # at one time, receives before sends
        return self.clock[s], self.schedules[s][self.pc[s]].op not in (RECV_F, RECV_B)

    def _advance(self, s: int) -> bool:
        """Take list ``s``'s next action if it can; whether anything changed."""
        a = self.schedules[s][self.pc[s]]
        if a.op in (RECV_F, RECV_B):
            return self._receive(s, a)
        if a.op in (SEND_F, SEND_B):
            return self._send(s, a)
        return self._compute(s, a)

    def _done(self, s: int, a: Action, start: float, end: float) -> bool:
        event = Event(s, a, start, end)
        self.timeline.events.append(event)
        self.runs[s].append(event)
        self.clock[s] = end
        self.pc[s] += 1
        return True

    def _compute(self, s: int, a: Action) -> bool:
        start = self.clock[s]
        end = start + self.cost(s, a)
        if a.op in COMPUTE and self.wake is not None:
            end += self.wake(self.idle[s]) if self.idle[s] > 0 else 0.0
            self.idle[s] = 0.0
        return self._done(s, a, start, end)

    def _receive(self, s: int, a: Action) -> bool:
        """Done once its message has arrived; until then posted, where a sender waits for that."""
        start = self.clock[s]
        key = ("F" if a.op == RECV_F else "B", a.micro, s if a.stage is None else a.stage)
        if not self.arrived.get(key) and self.unclaimed.get(key):
            self._claim(key, start)
        if not self.arrived.get(key):
            return self._post(key, start)
        arrival = max(start, self.arrived[key].pop(0))
        self.idle[s] += arrival - start
        return self._done(s, a, arrival, arrival)

    def _claim(self, key: _Message, start: float) -> None:
        """A receive reached after its receiver-driven send: the message moves from now on (later
        still where its sender computes now)."""
        sent_at, transfer, sender = self.unclaimed[key].pop(0)
        late = self.transport.busy_sender_s if sent_at < start and self._busy(sender, start) else 0.0
        self.arrived.setdefault(key, []).append(max(sent_at, start) + transfer + late)
        self.posted.pop(key, None)

    def _post(self, key: _Message, start: float) -> bool:
        """A receive reached before its message: where the send waits for it (rendezvous) or moves
        its message only from then on (receiver-driven), it is posted; whether that is news."""
        if (self.transport.rendezvous or self.transport.receiver_driven) and key not in self.posted:
            self.posted[key] = start  # the sender may now go on: look again
            return True
        return False  # blocked until the peer sends

    def _busy(self, s: int, t: float) -> bool:
        """List ``s`` is running an action (not waiting) at time ``t``."""
        for e in reversed(self.runs[s]):
            if e.end <= t:
                return False
            if e.start <= t:
                return True
        return False

    def _send(self, s: int, a: Action) -> bool:
        start = self.clock[s]
        here = s if a.stage is None else a.stage
        dst = here + 1 if a.op == SEND_F else here - 1
        if not 0 <= dst < self.stages:
            raise Deadlock(f"stage {here} sends {a} to a stage that does not exist")
        key = ("F" if a.op == SEND_F else "B", a.micro, dst)
        if self.transport.rendezvous:
            return self._meet(s, a, key, start)
        if self.transport.receiver_driven and self.posted.get(key, float("inf")) > start:
            # the receive is not waiting yet: the sender goes on at once, and the message moves
            # from the receive on
            self.unclaimed.setdefault(key, []).append((start, self.cost(s, a), s))
            return self._done(s, a, start, start)
        self.posted.pop(key, None)
        arrival = start + self.cost(s, a)
        self.arrived.setdefault(key, []).append(arrival)
        return self._done(s, a, start, arrival if self.transport.blocking_sends else start)

    def _meet(self, s: int, a: Action, key: _Message, start: float) -> bool:
        """A blocking send: it waits for its receive to be reached, then holds its sender while the
        message moves."""
        if key not in self.posted:
            return False  # blocked until the receiver reaches its receive
        met = max(start, self.posted.pop(key))
        self.idle[s] += met - start
        arrival = met + self.cost(s, a)
        self.arrived.setdefault(key, []).append(arrival)
        return self._done(s, a, start, arrival)


def render(timeline: Timeline, unit: float = 1.0) -> str:
    """Text timeline, one row per stage, one cell per ``unit`` of time ('.' = idle)."""
    width = int(round(timeline.makespan / unit))
    rows = []
    for s in sorted({e.stage for e in timeline.events}):
        cells = ["."] * width
        for e in timeline.stage_events(s):
            if e.action.op in (FWD, BWD) and e.end > e.start:
                for t in range(int(round(e.start / unit)), int(round(e.end / unit))):
                    cells[t] = f"{e.action.op}{e.action.micro}"
        rows.append(f"stage {s}: " + " ".join(c.ljust(3) for c in cells).rstrip())
    return "\n".join(rows)
