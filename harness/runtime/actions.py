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


def replay(
    schedules: list[list[Action]],
    cost: Callable[[int, Action], float] = unit_cost,
    blocking_sends: bool = False,
    placement: list[int] | None = None,
    rendezvous: bool = False,
    wake: Callable[[float], float] | None = None,
    receiver_driven: bool = False,
    busy_sender_s: float = 0.0,
) -> Timeline:
    """Replay per-stage action lists; raise Deadlock if they cannot all finish.

    Each stage runs its list in order. A send's cost is its transfer time: the
    message arrives that long after the send starts, and the sender goes on at
    once (``blocking_sends=False``: a DMA engine or NCCL moves it) or only after
    the transfer (``blocking_sends=True``: gloo on a CPU, where the sending
    process copies the message itself). A receive waits for the matching send
    of the adjacent stage (same kind and micro-batch, FIFO) to arrive. Every
    send must be received and every receive sent, or it is an error.

    ``rendezvous=True`` replays blocking point-to-point calls (``dist.send`` /
    ``dist.recv``, as DeepSpeed's pipeline issues them): a send starts moving its
    message only once the receiver has reached the matching receive, and its
    sender goes on only when the message has arrived. Measured with gloo: a
    blocking send of 64 KiB returns only when its receive is posted, however late.

    ``receiver_driven=True`` replays gloo's non-blocking transfers: a message moves only once its
    receive is posted, so a receive reached after its send waits for the whole transfer from
    then on (arrival: the later of the send and the receive, plus the transfer), however early
    the send was issued. Measured with gloo (two processes, 30 transfers each): a receive posted
    after its send waited 0.39 ms for 400 kB and 2.9 ms for 4 MB (median), one posted before it
    0.03 ms after the data came. The sender's ``isend`` returns at once (0.05 ms) when the receive
    is not yet posted, and the copy its I/O thread makes later runs on the waiting receiver's idle
    core (a 4 MB transfer pulled while the sender computed slowed that compute by 0.2 ms, 5%): the
    sender is held (``blocking_sends``) only by a send whose receive is already waiting, which
    writes the message in the call (0.23 ms for 400 kB, 1.2 ms for 4 MB). ``busy_sender_s`` is
    what such a late receive waits more when its sender is computing then (busy, not waiting
    itself): the I/O thread that writes the message waits for the computing thread's core.

    ``wake(idle)`` is what a compute action adds when its list waited ``idle`` seconds (for a
    receive, or for a blocking send's receiver) since its last compute: on a CPU host a process
    that sleeps while it waits computes slower when it wakes (harness.planning.profiling).

    ``placement`` (stage -> list) is for lists of ranks that hold several stages: an action
    acts on its ``stage``, and a send goes to the next (or previous) stage wherever it lives.
    Adjacent stages on one rank pass tensors without a send, in list order.
    """
    n = len(schedules)
    stages = len(placement) if placement is not None else n
    pc = [0] * n
    clock = [0.0] * n
    arrived: dict[tuple[str, int, int], list[float]] = {}  # (kind, micro, dst stage) -> arrival times
    # rendezvous and receiver-driven: receives reached, not yet sent to -> when
    posted: dict[tuple[str, int, int], float] = {}
    # receiver-driven: sends whose receive is not yet reached -> (sent at, transfer, sending list)
    unclaimed: dict[tuple[str, int, int], list[tuple[float, float, int]]] = {}
    idle = [0.0] * n  # per list: time spent waiting since its last compute action
    timeline = Timeline()
    runs: list[list[Event]] = [[] for _ in range(n)]  # each list's events

    def earliest(s: int) -> tuple[float, bool]:  # at one time, receives before sends
        return clock[s], schedules[s][pc[s]].op not in (RECV_F, RECV_B)

    def busy(s: int, t: float) -> bool:  # list s is running an action (not waiting) at time t
        for e in reversed(runs[s]):
            if e.end <= t:
                return False
            if e.start <= t:
                return True
        return False

    while any(pc[s] < len(schedules[s]) for s in range(n)):
        progressed = False
        # one action at a time, from the list earliest in time: a receive is then reached before any
        # send issued after it, which is what a receiver-driven send needs to know
        for s in sorted((s for s in range(n) if pc[s] < len(schedules[s])), key=earliest):
            a = schedules[s][pc[s]]
            start = clock[s]
            here = s if a.stage is None else a.stage
            if a.op in (RECV_F, RECV_B):
                key = ("F" if a.op == RECV_F else "B", a.micro, here)
                if not arrived.get(key) and unclaimed.get(key):  # sent before: it moves from now on
                    sent_at, transfer, sender = unclaimed[key].pop(0)
                    late = busy_sender_s if sent_at < start and busy(sender, start) else 0.0
                    arrived.setdefault(key, []).append(max(sent_at, start) + transfer + late)
                    posted.pop(key, None)
                if not arrived.get(key):
                    if (rendezvous or receiver_driven) and key not in posted:
                        posted[key] = start  # the sender may now go on: look again
                        progressed = True
                        break
                    continue  # blocked until the peer sends
                start = max(start, arrived[key].pop(0))
                idle[s] += start - clock[s]
                end = start
            elif a.op in (SEND_F, SEND_B):
                dst = here + 1 if a.op == SEND_F else here - 1
                if not 0 <= dst < stages:
                    raise Deadlock(f"stage {here} sends {a} to a stage that does not exist")
                key = ("F" if a.op == SEND_F else "B", a.micro, dst)
                if rendezvous:
                    if key not in posted:
                        continue  # blocked until the receiver reaches its receive
                    met = max(start, posted.pop(key))
                    idle[s] += met - start
                    arrival = end = met + cost(s, a)
                elif receiver_driven and posted.get(key, float("inf")) > start:
                    # the receive is not waiting yet: the sender goes on at once, and the message
                    # moves from the receive on (its I/O thread writes it then, on the waiting
                    # receiver's idle core)
                    unclaimed.setdefault(key, []).append((start, cost(s, a), s))
                    arrival, end = None, start
                else:
                    posted.pop(key, None)
                    arrival = start + cost(s, a)
                    end = arrival if blocking_sends else start
                if arrival is not None:
                    arrived.setdefault(key, []).append(arrival)
            else:
                end = start + cost(s, a)
                if a.op in COMPUTE and wake is not None:
                    end += wake(idle[s]) if idle[s] > 0 else 0.0
                    idle[s] = 0.0
            timeline.events.append(Event(s, a, start, end))
            runs[s].append(timeline.events[-1])
            clock[s] = end
            pc[s] += 1
            progressed = True
            break
        if not progressed:
            stuck = {s: str(schedules[s][pc[s]]) for s in range(n) if pc[s] < len(schedules[s])}
            raise Deadlock(f"no stage can progress; waiting at {stuck}")
    unreceived = {k: v for k, v in [*arrived.items(), *unclaimed.items()] if v}
    if unreceived:
        raise Deadlock(f"messages sent but never received: {sorted(unreceived)}")
    return timeline


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
