"""Where a rank's step goes: computing, or which kind of waiting (the idle breakdown).

From the profiled step of every device of a job on one machine (a rank, or each stage of a
process that drives several; their clocks are shared), each instant of the job's step, from
the first device's start to the last one's end, is given to exactly one part for each device,
in this order of precedence:

- ``compute``: the device runs one of its own operators (forward, backward, optimizer);
- ``collective``: it is inside a collective operator (all-reduce, broadcast, barrier, gather);
- ``exposed_comm``: it is inside a point-to-point operator (a send, or posting a receive)
  that no compute hides;
- ``peer_wait``: it runs nothing while another device of the job computes: waiting for a peer's
  activation or gradient, including a pipeline's fill and drain;
- ``host``: nothing runs anywhere and the device is in no communication operator: the host's
  own overhead (the framework's dispatch, Python, waits the profiler does not see).

So the five parts add up to the step for every device, and ``compute`` is 1 - the measured
bubble. Libraries post receives and wait for them in ways the profiler records differently
(torch's ``c10d::recv_`` is the posting; the wait is not an operator), which is why waiting is
read off the other devices' compute and not off communication operators alone.
"""

from __future__ import annotations

import bisect

from harness.core.vocabulary import IDLE_PARTS as PARTS  # the breakdown's keys, in order


def _merged(intervals: list[tuple[float, float]]) -> tuple[list[float], list[float]]:
    """Sorted, disjoint (starts, ends) of the union of ``intervals``."""
    starts, ends = [], []
    for a, b in sorted(intervals):
        if b <= a:
            continue
        if ends and a <= ends[-1]:
            ends[-1] = max(ends[-1], b)
        else:
            starts.append(a)
            ends.append(b)
    return starts, ends


def _covers(union: tuple[list[float], list[float]], t: float) -> bool:
    starts, ends = union
    i = bisect.bisect_right(starts, t) - 1
    return i >= 0 and t < ends[i]


def classify(units: list[dict]) -> tuple[list[list[tuple[str, float, float]]], float] | None:
    """Each device's step as consecutive (part, start, end) intervals over the job's span, in
    seconds from the returned origin (the first device's start, epoch seconds).

    ``units[i]`` holds ``start`` and ``end`` of its profiled step (epoch seconds), ``compute``
    (the exact union of its operators) and ``comm`` (its communication operators, as
    (``collective`` | ``p2p``, start, end)), both in seconds from its ``start``; None without
    compute."""
    if not units or not all(u.get("compute") for u in units):
        return None
    # one origin for all: a device's intervals shift by its start's rounding, their lengths stay exact
    origin = min(u["start"] for u in units)
    shift = [u["start"] - origin for u in units]
    compute = [_merged([(d + s, d + e) for s, e in u["compute"]]) for u, d in zip(units, shift)]
    collective = [
        _merged([(d + s, d + e) for k, s, e in u.get("comm") or () if k == "collective"]) for u, d in zip(units, shift)
    ]
    p2p = [
        _merged([(d + s, d + e) for k, s, e in u.get("comm") or () if k != "collective"]) for u, d in zip(units, shift)
    ]
    # the job's step: from the first device's first operator to the last one's last (communication
    # operators included), as the measured bubble counts it
    begin, end = 0.0, max(u["end"] - origin for u in units)
    cuts = {begin, end}
    for union in (*compute, *collective, *p2p):
        cuts.update(t for t in (*union[0], *union[1]) if begin <= t <= end)
    edges = sorted(cuts)
    out: list[list[tuple[str, float, float]]] = [[] for _ in units]
    for a, b in zip(edges, edges[1:]):
        mid = (a + b) / 2
        busy = [_covers(c, mid) for c in compute]
        for i in range(len(units)):
            if busy[i]:
                part = "compute"
            elif _covers(collective[i], mid):
                part = "collective"
            elif _covers(p2p[i], mid):
                part = "exposed_comm"
            elif any(busy):
                part = "peer_wait"
            else:
                part = "host"
            lane = out[i]
            if lane and lane[-1][0] == part and lane[-1][2] == a:
                lane[-1] = (part, lane[-1][1], b)
            else:
                lane.append((part, a, b))
    return out, origin


def breakdown(intervals: list[list[tuple[str, float, float]]]) -> tuple[dict[str, float], list[dict[str, float]]]:
    """(the mean over devices of each part's fraction of the step, each device's seconds per part)."""
    seconds = [{p: sum(e - s for q, s, e in lane if q == p) for p in PARTS} for lane in intervals]
    span = sum(seconds[0].values())
    mean = {p: sum(d[p] for d in seconds) / len(seconds) / span for p in PARTS} if span > 0 else {}
    return mean, seconds


def waits(lane: list[tuple[str, float, float]], origin: float, shortest: float) -> list[tuple[str, float, float]]:
    """A device's non-compute intervals of at least ``shortest`` seconds, in epoch seconds (for a
    trace: the gaps between one operator and the next are many and tiny; their time is in the
    totals)."""
    return [(part, origin + s, origin + e) for part, s, e in lane if part != "compute" and e - s >= shortest]
