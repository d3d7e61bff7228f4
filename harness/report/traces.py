"""A run's step as a Chrome trace (JSON), which Perfetto (ui.perfetto.dev) and chrome://tracing open.

One process per rank of the measured run, and beside them one per rank position of the
simulator's replay of the same schedule with the run's measured costs, so that measured and
predicted line up track by track. A measured rank has up to three tracks:

- ``compute (profiled step)``: its operators in the profiled step, as forward, backward (or its
  input- and weight-gradient parts) and optimizer blocks; a process that drives several stages
  has one such track per stage;
- ``idle``: where its time went when it did not compute (peer wait, collective, exposed
  communication, host; :mod:`harness.metrics.idle`), over the same step;
- ``actions (last timed step)``: our runtime's own record of its schedule's actions, each named
  with its stage and micro-batch (another step, on another clock: it starts at 0 too).

Times are microseconds from the start of each kind of step (the profiled step is shared by the
ranks of one machine, so their tracks line up).
"""

from __future__ import annotations

import json
import os
import re

from harness.core.vocabulary import ACTION_LABEL, IDLE_NAMES
from harness.report.record import variant_text

_NAMES = {
    "F": "forward",
    "B": "backward",
    "I": "backward input-grad",
    "W": "backward weight-grad",
    "STEP": "optimizer step",
    "GPU": "GPU kernels",
    "RECV_F": "receive activation",
    "RECV_B": "receive gradient",
    "SEND_F": "send activation",
    "SEND_B": "send gradient",
}
_CATEGORY = {
    "F": "compute",
    "B": "compute",
    "I": "compute",
    "W": "compute",
    "STEP": "compute",
    "GPU": "compute",
    "RECV_F": "communication",
    "RECV_B": "communication",
    "SEND_F": "communication",
    "SEND_B": "communication",
}
REPLAY_PID = 1000  # the replay's processes come after the ranks'


def action_name(label: str, stage) -> tuple[str, dict]:
    """('forward s1 mb3', its args) for a schedule action's label (``F3``, ``1B0*``, ``SEND_F2``,
    ``STEP``), ``stage`` being the track's stage where the label does not name one."""
    found = ACTION_LABEL.match(label)
    if not found:
        return label, {}
    prefix, op, micro, reduce = found.groups()
    stage = int(prefix) if prefix else stage
    args = {"stage": stage} if stage is not None else {}
    name = _NAMES[op] + (f" s{stage}" if stage is not None else "")
    if micro:
        args["micro_batch"] = int(micro)
        name += f" mb{micro}"
    if reduce:
        args["all_reduce"] = "launched as gradients become final"
        name += " + all-reduce"
    return name, args


def _complete(pid: int, tid: int, name: str, start: float, end: float, category: str, args: dict | None = None) -> dict:
    return {
        "ph": "X",
        "pid": pid,
        "tid": tid,
        "name": name,
        "cat": category,
        "ts": round(start * 1e6, 3),
        "dur": round(max(end - start, 0.0) * 1e6, 3),
        "args": args or {},
    }


def _meta(pid: int, tid: int | None, kind: str, name: str, order: int) -> list[dict]:
    events = [
        {"ph": "M", "pid": pid, "name": f"{kind}_name", "args": {"name": name}},
        {"ph": "M", "pid": pid, "name": f"{kind}_sort_index", "args": {"sort_index": order}},
    ]
    if tid is not None:
        for e in events:
            e["tid"] = tid
    return events


def chrome_trace(record: dict) -> dict | None:
    """The trace of ``record``'s step (see the module docstring), or None where it has no spans."""
    ranks = record.get("per_rank") or []
    profiled = [
        (
            r,
            [(j, st.get("profiled_spans") or []) for j, st in sorted((r.get("stages") or {}).items())]
            or [(r.get("layout", {}).get("stage"), r.get("profiled_spans") or [])],
        )
        for r in ranks
    ]
    starts = [s for _, lanes in profiled for _, spans in lanes for _, s, _ in spans]
    actions = [s for r in ranks for _, s, _ in r.get("events") or []]
    replay = record.get("replay_timeline") or []
    if not (starts or actions or any(replay)):
        return None
    origin = min(starts) if starts else 0.0
    action_origin = min(actions) if actions else 0.0
    waits = {d["device"]: d.get("waits") or [] for d in record.get("idle_per_device") or []}
    events: list[dict] = []
    for pid, (r, lanes) in enumerate(profiled):
        layout = r.get("layout", {})
        stage, held = layout.get("stage"), layout.get("stages") or []
        where = (
            f" (stages {', '.join(map(str, held))})"
            if len(held) > 1
            else f" (stage {stage})"
            if isinstance(stage, int)
            else ""
        )
        events += _meta(pid, None, "process", f"rank {r.get('rank', pid)}{where}", pid)
        tid = 0
        for lane_stage, spans in lanes:
            if not spans:
                continue
            events += _meta(
                pid, tid, "thread", "compute (profiled step)" + (f", stage {lane_stage}" if len(lanes) > 1 else ""), tid
            )
            for kind, s, e in spans:
                # a rank holding several stages runs all of them on one thread: no stage to name
                known = isinstance(lane_stage, int) and (len(lanes) > 1 or len(held) <= 1)
                name, args = action_name(kind, lane_stage if known else None)
                events.append(_complete(pid, tid, name, s - origin, e - origin, "compute", args))
            device = f"rank {r.get('rank')}" + (f" stage {lane_stage}" if len(lanes) > 1 else "")
            if waits.get(device):
                tid += 1
                events += _meta(pid, tid, "thread", "idle" + (f", stage {lane_stage}" if len(lanes) > 1 else ""), tid)
                events += [
                    _complete(pid, tid, IDLE_NAMES.get(part, part), s - origin, e - origin, "idle")
                    for part, s, e in waits[device]
                ]
            tid += 1
        if r.get("events"):
            events += _meta(pid, tid, "thread", "actions (last timed step)", tid)
            for label, s, e in r["events"]:
                name, args = action_name(label, stage if isinstance(stage, int) else None)
                op = ACTION_LABEL.match(label)
                events.append(
                    _complete(
                        pid,
                        tid,
                        name,
                        s - action_origin,
                        e - action_origin,
                        _CATEGORY.get(op.group(2), "other") if op else "other",
                        args,
                    )
                )
    for lane, acts in enumerate(replay):
        pid = REPLAY_PID + lane
        events += _meta(pid, None, "process", f"simulator replay: position {lane}", pid)
        events += _meta(pid, 0, "thread", "replayed actions (measured costs, transfers free)", 0)
        for label, s, e in acts:
            if e <= s:
                continue  # a transfer is free in the replay
            name, args = action_name(label, lane)
            events.append(_complete(pid, 0, name, s, e, "replay", args))
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {
            "strategy": record.get("strategy"),
            "variant": record.get("variant") or "",
            "world_size": record.get("world_size"),
            "model": record.get("model"),
            "micro_batches": record.get("micro_batches"),
            "bubble_measured": record.get("bubble_measured"),
            "bubble_replayed": record.get("bubble_replayed"),
            "idle_breakdown": record.get("idle_breakdown"),
        },
    }


def run_name(record: dict) -> str:
    """A file-name stem for one configuration: 'hippie_recompute-auto_w2', 'dp_lr-0-3_w2'."""
    variant = re.sub(r"[^A-Za-z0-9]+", "-", variant_text(record)).strip("-")
    return f"{record.get('strategy')}{'_' + variant if variant else ''}_w{record.get('world_size')}"


def write_trace(record: dict, out_dir: str) -> str | None:
    """``trace_<run>.json`` in ``out_dir`` for a successful run with spans; its path, or None."""
    trace = chrome_trace(record) if record.get("status") == "ok" else None
    if not trace:
        return None
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, f"trace_{run_name(record)}.json")
    with open(path, "w") as f:
        json.dump(trace, f, separators=(",", ":"))
    return path
