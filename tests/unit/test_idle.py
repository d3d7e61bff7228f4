"""The idle breakdown: every instant of the job's step given to one part per device."""

import pytest

from harness.metrics.idle import PARTS, breakdown, classify, waits


def test_each_instant_goes_to_one_part_by_precedence():
    # device 0 computes [0, 1] then waits on a collective [2.1, 2.2]; device 1 receives its input
    # (posting [0.5, 0.6]) and computes [1, 2]; nothing runs in [2, 2.5]
    a = {"start": 100.0, "end": 102.5, "compute": [(0.0, 1.0)], "comm": [("collective", 2.1, 2.2)]}
    b = {"start": 100.0, "end": 102.0, "compute": [(1.0, 2.0)], "comm": [("p2p", 0.5, 0.6)]}
    lanes, origin = classify([a, b])
    assert origin == 100.0
    assert lanes[0] == [
        ("compute", 0.0, 1.0),
        ("peer_wait", 1.0, 2.0),
        ("host", 2.0, 2.1),
        ("collective", 2.1, pytest.approx(2.2)),
        ("host", pytest.approx(2.2), 2.5),
    ]
    assert lanes[1] == [
        ("peer_wait", 0.0, 0.5),
        ("exposed_comm", 0.5, 0.6),
        ("peer_wait", 0.6, 1.0),
        ("compute", 1.0, 2.0),
        ("host", 2.0, 2.5),
    ]
    mean, seconds = breakdown(lanes)
    assert all(sum(d[p] for p in PARTS) == pytest.approx(2.5) for d in seconds)  # the job's step, each
    assert mean["compute"] == pytest.approx(0.4) and sum(mean.values()) == pytest.approx(1.0)
    assert waits(lanes[1], origin, 0.2) == [
        ("peer_wait", 100.0, 100.5),
        ("peer_wait", 100.6, 101.0),
        ("host", 102.0, 102.5),
    ]


def test_devices_are_aligned_on_their_own_starts():
    # the same work, the second device's profile starting later: its intervals are shifted
    lanes, _ = classify(
        [{"start": 10.0, "end": 11.0, "compute": [(0.0, 1.0)]}, {"start": 11.0, "end": 12.0, "compute": [(0.0, 1.0)]}]
    )
    assert lanes[1][0] == ("peer_wait", 0.0, 1.0) and lanes[1][1] == ("compute", 1.0, 2.0)


def test_no_compute_no_breakdown():
    assert classify([{"start": 0.0, "end": 1.0, "compute": []}]) is None
