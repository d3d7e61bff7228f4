"""Measurements for the planner and the simulator: layer profiles, whole steps, the network.

Per-layer forward and backward time (and the backward's input- and weight-gradient
parts run apart, as zero-bubble schedules run them), output bytes, bytes saved for
backward and parameter bytes (identical blocks measured once), at the samples one worker
computes per forward, with the threads one worker would have; the whole
forward, loss and backward of the model (the step factor that scales isolated
layer times to a real pass; a shortened model where a whole pass would take
long), each pipeline stage's steady-state pass where the cut is known (the
stage factors) and the optimizer update, interleaved with the layer times; on
a CPU, as many processes measuring side by side as a run has workers, and what
a forward or backward costs more right after its process slept (the wake-up).
Plus point-to-point and all-reduce bandwidth and latency between workers.
Everything here takes plain values (:class:`Workload`), never a run
config: the commands (``pipebench profile``, ``pipebench plan``) and the
AshPipe strategy build them.
"""

from __future__ import annotations

import collections
import json
import math
import os
import platform
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass, replace

import torch
from torch import nn

from harness.core import comm as comm_mod
from harness.core.host import start_workers, worker_context
from harness.core.models import build_layers
from harness.core.timing import DeviceTimer
from harness.core.training import Autocast, make_optimizer, summed_loss, with_precision
from harness.metrics.flops import layer_flops
from harness.metrics.meter import track_cpu_allocations
from harness.planning.planner import LayerProfile, Network, Profile


@dataclass
class Workload:
    """What to profile: a model as harness.core.models builds it, at the batch one worker computes."""

    model: object  # a model config (harness.core.models.build_layers reads it)
    seed: int
    image_size: int
    samples: int  # per forward of one worker
    workers: int  # workers of the run (they share a CPU host)
    threads: int  # torch threads of one worker
    train: object  # optimizer settings (harness.core.training.make_optimizer reads them)
    num_classes: int
    precision: str = "fp32"  # as the run trains (harness.core.training.with_precision)
    # a pipeline of one stage per worker: each stage's layer range [first, last); measuring process r
    # also times stage r's steady-state pass while the others time theirs (the stage factors)
    stages: list[tuple[int, int]] | None = None


@dataclass
class _Measurement:
    """What one measuring process found (medians over its rounds)."""

    layers: list[LayerProfile]
    pass_s: float  # forward, loss and backward of the calibrated model
    update_s: float  # its optimizer update
    lockstep: list[float]  # passes started together with the other processes
    stage_s: float | None  # its stage's steady-state pass (None: no stage)
    wake_s: list[float] | None  # per WAKE_IDLE_S, the extra per forward or backward (None: not a CPU)
    pass_rounds: list[list[float]]  # every timed whole pass, round by round (the spread)


def _saved_bytes(fn) -> tuple[object, int]:
    """Run ``fn`` and return (its result, bytes of distinct non-parameter storages autograd saved)."""
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor):
        if not isinstance(t, nn.Parameter):
            st = t.untyped_storage()
            saved[st.data_ptr()] = st.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return out, sum(saved.values())


def profile_layers(
    layers: list[nn.Module], sample: torch.Tensor, repeats: int = 5, budget_s: float = 5.0
) -> list[LayerProfile]:
    """Measure each layer at ``sample``'s batch size on its device; per-sample figures.

    Layers with the same type, parameter shapes and input shape are measured once
    (ViT blocks are identical), which keeps profiling ViT-H/14 cheap.
    """
    # torch pipelining's own split of the backward (importing the library costs about 2 s, which the
    # commands that only check a configuration should not pay)
    from torch.distributed.pipelining._backward import stage_backward_input, stage_backward_weight

    batch = sample.shape[0]
    timer = DeviceTimer(sample.device)
    cache: dict[tuple, LayerProfile] = {}
    out_profiles = []
    x = sample
    for index, layer in enumerate(layers):
        # as in training: the model's input needs no gradient, every later layer's does
        needs_grad = index > 0 and x.is_floating_point()
        name = type(layer.layer if isinstance(layer, Autocast) else layer).__name__
        key = (name, tuple(tuple(p.shape) for p in layer.parameters()), tuple(x.shape))
        param_bytes = sum(p.numel() * p.element_size() for p in layer.parameters())
        if key in cache:
            prof = LayerProfile(**{**asdict(cache[key]), "name": name})
            with torch.no_grad():
                y = layer(x)
        else:
            fwd, bwd, bwd_input, bwd_weight = [], [], [], []
            spent = 0.0
            for r in range(repeats + 1):
                if r > 3 and spent > budget_s:  # large layers: enough samples for a stable median
                    break
                inp = x.detach().requires_grad_(needs_grad)
                t0 = timer.mark()
                y, saved = _saved_bytes(lambda: layer(inp))
                t1 = timer.mark()
                y.backward(torch.ones_like(y))
                t2 = timer.mark()
                # the same backward in the two parts the zero-bubble schedules run apart, by the
                # functions torch pipelining runs them with (the first layer has no input part:
                # its weight part is the whole backward, as the library runs its first stage)
                inp = x.detach().requires_grad_(needs_grad)
                y = layer(inp)
                t3 = timer.mark()
                if needs_grad:
                    _, groups = stage_backward_input([y], [torch.ones_like(y)], [inp], layer.parameters())
                    t4 = timer.mark()
                    stage_backward_weight(layer.parameters(), groups)
                else:
                    t4 = timer.mark()
                    y.backward(torch.ones_like(y))
                t5 = timer.mark()
                times = (timer.elapsed(t0, t1), timer.elapsed(t1, t2), timer.elapsed(t3, t4), timer.elapsed(t4, t5))
                spent += sum(times)
                if r:  # the first run warms up
                    for kept, t in zip((fwd, bwd, bwd_input, bwd_weight), times):
                        kept.append(t)
            layer.zero_grad(set_to_none=True)
            prof = LayerProfile(
                name,
                _median(fwd) / batch,
                _median(bwd) / batch,
                y[0].numel() * y.element_size(),
                saved // batch,
                x[0].numel() * x.element_size(),
                param_bytes,
                _median(bwd_input) / batch,
                _median(bwd_weight) / batch,
            )
            cache[key] = prof
        out_profiles.append(prof)
        x = y.detach()
    return out_profiles


def _median(v: list[float]) -> float:
    return sorted(v)[len(v) // 2]


def _busy(seconds: float) -> None:
    """Keep this process's core busy (as computing) for ``seconds``."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def _round_trip(comm, message: torch.Tensor, reply: torch.Tensor) -> None:
    """Rank 0 sends ``message`` to rank 1, which answers with ``reply``."""
    if comm.ctx.rank == 0:
        comm.isend(message, 1).wait()
        comm.irecv(reply, 1).wait()
    else:
        comm.irecv(message, 0).wait()
        comm.isend(reply, 0).wait()


def _late_receive(comm, message: torch.Tensor, sender_busy: bool) -> float | None:
    """Rank 0 sends ``message``, then computes (or sleeps) for 3 ms; rank 1 posts its receive 1 ms
    later: the seconds that receive waits, on rank 1 (gloo moves a message once its receive is
    posted, by the sender's I/O thread). Rank 0 returns None."""
    _round_trip(comm, message[:1], message[:1])  # start together
    if comm.ctx.rank == 0:
        sending = comm.isend(message, 1)
        _busy(0.003) if sender_busy else time.sleep(0.003)
        sending.wait()
        return None
    time.sleep(0.001)
    t0 = time.perf_counter()
    comm.irecv(message, 0).wait()
    return time.perf_counter() - t0


def measure_network(comm, size_bytes: int = 8 * 2**20, repeats: int = 5, pings: int = 20) -> Network:
    """Point-to-point (rank 0 -> 1) and all-reduce bandwidth over the job's workers. Collective."""
    ctx = comm.ctx
    timer = DeviceTimer(ctx.device)  # on NCCL a wait only orders streams: time on the device
    n = size_bytes // 4
    buf = torch.ones(n, device=ctx.device)
    tiny = torch.ones(1, device=ctx.device)
    p2p, lat, ar = [], [], []
    late = {True: [], False: []}  # a late receive's waits, on rank 1, by whether the sender computed
    medium = torch.ones(2**14, device=ctx.device)  # 64 kB: its transfer alone takes a few tens of µs
    for _ in range(repeats):
        comm.barrier()
        if ctx.world_size > 1 and ctx.rank in (0, 1):
            t0 = timer.mark()
            _round_trip(comm, buf, tiny)
            p2p.append(timer.elapsed(t0, timer.mark()))
            # latency: the median of many round trips of a tiny message, each sent as a pipeline
            # sends, after work while its receiver waits asleep (back to back they come out about
            # half as long); from 5 round trips, slow wake-ups, which come in bursts, set it in 7
            # of 50 profiles here (0.6-1.5 ms where runs' sends took about 0.1)
            for _ in range(pings):
                if ctx.rank == 0:
                    _busy(0.002)
                t1 = timer.mark()
                _round_trip(comm, tiny, tiny)
                lat.append(timer.elapsed(t1, timer.mark()) / 2)
            if ctx.device.type == "cpu":  # gloo on the computing cores (the replay's busy_sender_s)
                for i in range(4 * pings):
                    sender_busy = i % 2 == 0
                    wait = _late_receive(comm, medium, sender_busy)
                    if wait is not None:
                        late[sender_busy].append(wait)
        comm.barrier()
        t0 = timer.mark()
        comm.all_reduce(buf)
        ar.append(timer.elapsed(t0, timer.mark()))
    w = ctx.world_size
    stats = torch.tensor([_median(p2p) if p2p else 0.0, _median(lat) if lat else 0.0, _median(ar)], dtype=torch.float64)
    stats = comm.broadcast_object(stats.tolist(), src=0)
    p2p_t, lat_t, ar_t = stats
    # each round trip over their median: how a transfer's time varies (the replay's draws)
    spread = comm.broadcast_object([t / lat_t for t in lat] if lat and lat_t else None, src=0)
    # the mean, not the median: a busy sender's I/O thread mostly runs at once, now and then only
    # after a scheduler's slice (about 3 ms), and a run pays the mean (measured on rank 1 only)
    extra = statistics.mean(late[True]) - statistics.mean(late[False]) if late[True] else 0.0
    late_t = comm.broadcast_object(max(extra, 0.0), src=1) if w > 1 else 0.0
    return Network(
        p2p_bytes_per_s=size_bytes / max(p2p_t - lat_t, 1e-9) if p2p_t else float("inf"),
        allreduce_bytes_per_s=(2 * (w - 1) / w * size_bytes / ar_t) if w > 1 else float("inf"),
        latency_s=lat_t,
        late_receive_s=late_t,
        spread=spread,
    )


def measure_local_network() -> Network:
    """Bandwidth between two gloo workers on this machine."""
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(comm_mod.free_port())
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "net.pt")
        start_workers(_network_worker, args=(out,), nprocs=2)
        return Network(**torch.load(out))


def _network_worker(rank: int, out: str) -> None:
    ctx = comm_mod.init_process_group(rank, 2, rank, "cpu", "gloo", 60)
    try:
        net = measure_network(comm_mod.Comm(ctx))
        if rank == 0:
            torch.save(asdict(net), out)
    finally:
        comm_mod.destroy()


def measure_profile(work: Workload, device: torch.device, network: Network | None = None) -> Profile:
    """The versioned profile of ``work`` on ``device`` (the network between two local workers unless given)."""
    network = network or measure_local_network()
    whole = whole_pass(work, device)
    if device.type == "cpu":
        # measured in worker processes set up as a run's are (harness.metrics.meter.track_cpu_allocations);
        # the workers of a run share the machine's cores and memory bandwidth: measure with as
        # many processes at once, each with a worker's threads, and keep the slowest one's figures
        # (the slowest rank sets a run's step time)
        processes = min(work.workers, os.cpu_count() or 1)
        stages_note = None
        if work.stages and len(work.stages) != processes:  # stage factors need a process per stage
            stages_note = f"not measured: {len(work.stages)} stages, {processes} measuring processes (cores)"
            work = replace(work, stages=None)
        side_by_side = worker_context().Barrier(processes) if processes > 1 else None
        with tempfile.TemporaryDirectory() as d:
            start_workers(_measure_worker, args=(work, device, side_by_side, d, whole), nprocs=processes)
            measured = [_load_measurement(os.path.join(d, f"{r}.json")) for r in range(processes)]
        slowest = max(measured, key=lambda m: m.pass_s)
        meeting = meeting_factor([m.lockstep for m in measured])
        stage_factors = _stage_factors(work, slowest.layers, [m.stage_s for m in measured])
        # each process's own stage (or the whole model): a step's wake-ups fall on every stage
        wake = [[idle, max(0.0, statistics.mean(m.wake_s[i] for m in measured))] for i, idle in enumerate(WAKE_IDLE_S)]
    else:  # a GPU's kernels queue behind the host's dispatch: no wake-up cost
        measured = [_measure(work, device, whole=whole)]
        slowest = measured[0]
        meeting, stage_factors, stages_note, wake = 1.0, None, None, None
    layers, pass_s, update_s = slowest.layers, slowest.pass_s, slowest.update_s
    calibrated = _calibrated(layers, whole)
    threads = work.threads if device.type == "cpu" else torch.get_num_threads()
    meta = {
        "model": getattr(work.model, "name", None),
        "threads": threads,
        "precision": work.precision,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        "step_factor_note": f"forward, loss and backward of {'the whole' if whole else 'a shortened'} model / "
        "the sum of its layers' isolated times, measured by the same process; optimizer "
        "update timed on its own",
    }
    if wake:
        meta["wake_note"] = (
            "[seconds asleep, what a forward or backward then adds over one straight after work]: "
            "each measuring process's stage, else the whole model; their mean"
        )
    if stage_factors:
        stages_note = (
            "each stage's steady-state pass (its forwards ahead as 1F1B runs them) / its kept layers' "
            "isolated times; stages timed side by side"
        )
    if stages_note:
        meta["stage_factors_note"] = stages_note
    return Profile(
        layers,
        network,
        str(device),
        work.samples,
        meta=meta,
        step_factor=pass_s / _isolated_s(calibrated, work.samples),
        optimizer_s_per_byte=update_s / sum(l.param_bytes for l in calibrated),
        meeting_factor=meeting,
        stage_factors=stage_factors,
        wake=wake,
        spread=compute_spread([m.pass_rounds for m in measured]),
    )


def compute_spread(pass_rounds: list[list[list[float]]]) -> dict:
    """How a compute's time varies, from the whole passes of each measuring process, round by round:
    ``level``, each round's median over the median of the process's rounds (the host's speed
    drifting over seconds, which a run's steps share); ``jitter``, each pass over its round's
    median (from one action to the next). The replay's draws (harness.planning.simulator)."""
    level, jitter = [], []
    for rounds in pass_rounds:
        medians = [statistics.median(r) for r in rounds if r]
        middle = statistics.median(medians)
        level += [m / middle for m in medians]
        jitter += [t / m for r, m in zip((r for r in rounds if r), medians) for t in r]
    return {"level": level, "jitter": jitter}


def _isolated_s(layers: list[LayerProfile], samples: int) -> float:
    """The forward and backward of ``layers`` at ``samples`` samples, as their isolated times add up."""
    return sum(l.forward_s + l.backward_s for l in layers) * samples


def _stage_factors(work: Workload, layers: list[LayerProfile], stage_s: list[float | None]) -> dict | None:
    """Each stage's measured pass (by the process that timed it) over the kept layers' isolated
    times of that stage, so that a replay of the kept layers gives each stage the time its pass
    took; None unless every stage had a process of its own."""
    if not work.stages or len(work.stages) != len(stage_s) or None in stage_s:
        return None
    factors = [t / _isolated_s(layers[lo:hi], work.samples) for (lo, hi), t in zip(work.stages, stage_s)]
    return {"boundaries": [lo for lo, _ in work.stages[1:]], "factors": factors}


# On a CPU, a whole pass of the model calibrates the layers' isolated times where it costs at
# most this many FLOPs (about a second of one core here; vit_tiny at 32 samples is 7e10); beyond
# it, a shortened model does (ViT-H/14 would otherwise spend minutes on it). A GPU always runs it.
WHOLE_PASS_FLOPS = 2e11


def whole_pass(work: Workload, device: torch.device) -> bool:
    """Whether the step factor and the optimizer's cost come from the whole model (else a
    shortened one): decided from FLOPs, not from a timing, so that it does not flip between
    profiles of the same workload."""
    if device.type != "cpu":
        return True
    return sum(f + b for f, b in layer_flops(work.model, work.samples, work.image_size)) <= WHOLE_PASS_FLOPS


def _calibrated(layers: list, whole: bool) -> list:
    """The layers whose whole pass the step factor and the optimizer's cost are measured on:
    all of them, or (``whole`` false) the embedding, two blocks and the head, every layer kind
    of a ViT. The whole model is the one to measure: blocks cost more in a deep pass than
    in a short one (vit_micro's 6 layers took 8% longer than a 4-layer pass predicted, two
    processes side by side here), since the backward reads activations saved longer ago."""
    return layers if whole or len(layers) <= 4 else layers[:3] + layers[-1:]


# A profile measures in rounds (each the layers, whole passes and stage passes): at least 3, more
# for a light workload, up to about this many FLOPs of whole passes (12 at most). vit_micro's pass
# at 8 samples (5e8 FLOPs) takes about 10 ms here: 3 rounds measured about half a second, and the
# whole pass of four such profiles, a run between each, spread by 18% (11% from 8 rounds).
ROUNDS_FLOPS, MAX_ROUNDS = 1e10, 12


def measuring_rounds(work: Workload) -> int:
    """Rounds of :func:`_measure` for ``work``, from its FLOPs (every measuring process must agree)."""
    flops = sum(f + b for f, b in layer_flops(work.model, work.samples, work.image_size))
    return int(min(MAX_ROUNDS, max(3, math.ceil(ROUNDS_FLOPS / max(flops, 1.0)))))


def _measure(
    work: Workload,
    device: torch.device,
    side_by_side=None,
    rounds: int | None = None,
    *,
    whole: bool,
    stage: int | None = None,
) -> _Measurement:
    """Per-layer times and whole-pass times of the model (:func:`_calibrated`), in this process,
    and with ``stage``, the steady-state pass of stage ``work.stages[stage]``.

    They are interleaved in rounds and each is the median over the rounds: a
    shared machine's speed drifts over seconds, and measuring them together puts
    the same drift in all, which keeps their ratios (the step and stage factors) steady.
    Workers measuring side by side start each round, and each round's stage passes, together."""
    if device.type == "cpu":
        torch.set_num_threads(work.threads)
    layers = with_precision([layer.to(device) for layer in build_layers(work.model, work.seed)], work.precision)
    sample = torch.randn(work.samples, 3, work.image_size, work.image_size, device=device)
    layer_rounds, passes, updates, stage_passes, wakes = [], [], [], [], []
    rounds = rounds or measuring_rounds(work)
    # the wake-up cost: of this process's stage where it has one, else of the model's whole pass
    woken = (torch.nn.Sequential(*_calibrated(layers, whole)), sample, False, True)
    if stage is not None:  # what the stage receives: the earlier layers' output
        lo, hi = work.stages[stage]
        with torch.no_grad():
            stage_input = sample
            for layer in layers[:lo]:
                stage_input = layer(stage_input)
        woken = (torch.nn.Sequential(*layers[lo:hi]), stage_input, lo > 0, hi == len(layers))
    for _ in range(rounds):
        if side_by_side is not None:
            side_by_side.wait(timeout=600)
        layer_rounds.append(profile_layers(layers, sample, repeats=3))
        update_s, times = _whole_step_s(work, _calibrated(layers, whole), sample, repeats=6, budget_s=2.0)
        passes.append(times)
        updates.append(update_s)
        if stage is not None:
            if side_by_side is not None:
                side_by_side.wait(timeout=600)
            stage_passes.append(_stage_pass_s(work, layers, stage, stage_input, repeats=6, budget_s=2.0))
        if device.type == "cpu":
            wakes.append(_wake_s(work, *woken))
    profiled = [
        replace(
            first,
            **{
                k: statistics.median(getattr(r[i], k) for r in layer_rounds)
                for k in ("forward_s", "backward_s", "backward_input_s", "backward_weight_s")
            },
        )
        for i, first in enumerate(layer_rounds[0])
    ]
    lockstep = (
        _lockstep_passes(work, _calibrated(layers, whole), sample, side_by_side) if side_by_side is not None else []
    )
    return _Measurement(
        profiled,
        statistics.median(statistics.median(r) for r in passes),
        statistics.median(updates),
        lockstep,
        statistics.median(stage_passes) if stage_passes else None,
        [statistics.median(w[i] for w in wakes) for i in range(len(WAKE_IDLE_S))] if wakes else None,
        passes,
    )


def _stage_pass_s(work: Workload, layers, stage: int, x: torch.Tensor, repeats: int, budget_s: float) -> float:
    """Median time of one forward and one backward of stage ``stage`` (of ``work.stages``) as the
    steady state of 1F1B (and of AshPipe) runs it: stage s keeps S-1-s forwards ahead of its
    backwards, so each backward reads activations saved that many forwards ago (pushed out of the
    cache since), and the last stage, whose backward follows its own forward, has transfers and
    its optimizer's update between one micro-batch and the next: it is timed one forward ahead
    too (timed back to back, vit_micro's last stage at 64 samples came out 10% below its run's
    time, one forward ahead 2% below). ``x`` is the stage's input, needing its gradient past the
    first stage; the last stage ends in the loss, the others take a gradient from the next."""
    lo, hi = work.stages[stage]
    ahead = max(1, len(work.stages) - 1 - stage)
    model = torch.nn.Sequential(*layers[lo:hi])
    timer = DeviceTimer(x.device)
    forward, backward = _pass(work, model, x, needs_input_grad=lo > 0, last=hi == len(layers))
    in_flight = collections.deque(forward() for _ in range(ahead))
    times, spent = [], 0.0
    for r in range(repeats + 2):
        if r > 4 and spent > budget_s:
            break
        t0 = timer.mark()
        in_flight.append(forward())
        backward(in_flight.popleft())
        elapsed = timer.elapsed(t0, timer.mark())
        spent += elapsed
        if r >= 2:  # the first two warm up
            times.append(elapsed)
    for out in in_flight:
        backward(out)
    model.zero_grad(set_to_none=True)
    return statistics.median(times)


def _pass(work: Workload, model, x: torch.Tensor, needs_input_grad: bool, last: bool):
    """(forward, backward) of ``model`` on ``x`` as a stage runs them: the last stage ends in the
    loss, the others take a gradient from the next."""
    target = torch.randint(0, work.num_classes, (x.shape[0],), device=x.device)

    def forward():
        out = model(x.detach().requires_grad_(needs_input_grad))
        return summed_loss(out, target, x.shape[0]) if last else out

    def backward(out):
        out.backward() if last else out.backward(torch.ones_like(out))

    return forward, backward


# A process that waits asleep (for a receive) computes slower for a while once it wakes: caches and
# the core were given to others. Side by side here, sleeping 2 ms before each forward and each backward
# of a vit_micro stage made them 0.1-0.4 ms longer each (up to 10% at 8 samples, more while the host
# was busy), 5 ms about twice as much, 0.2 ms little. Measured after these sleeps:
WAKE_IDLE_S = (0.001, 0.004)


def _wake_s(work: Workload, model, x: torch.Tensor, needs_input_grad: bool, last: bool, pairs: int = 4) -> list[float]:
    """What a forward or a backward of ``model`` takes more right after its process slept each of
    ``WAKE_IDLE_S``, than straight after other work: ``pairs`` of a forward and a backward back to
    back, then as many with a sleep before each, for each sleep in turn (a process that sleeps
    again and again, as a pipeline stage does, measured 2-3x the slowdown of a single sleep);
    half the difference of their medians, per sleep."""
    forward, backward = _pass(work, model, x, needs_input_grad, last)
    timer = DeviceTimer(x.device)
    times: dict[float, list[float]] = {idle: [] for idle in (0.0, *WAKE_IDLE_S)}
    backward(forward())  # warm
    for idle, spent in times.items():
        for _ in range(pairs):
            if idle:
                time.sleep(idle)
            t0 = timer.mark()
            out = forward()
            t1 = timer.mark()
            if idle:
                time.sleep(idle)
            t2 = timer.mark()
            backward(out)
            spent.append(timer.elapsed(t0, t1) + timer.elapsed(t2, timer.mark()))
    model.zero_grad(set_to_none=True)
    direct = statistics.median(times[0.0])
    return [(statistics.median(times[idle]) - direct) / 2 for idle in WAKE_IDLE_S]


def _lockstep_passes(work: Workload, layers, sample: torch.Tensor, side_by_side, passes: int = 10) -> list[float]:
    """Forward, loss and backward of ``layers``, ``passes`` times, every measuring process starting
    each one together (as data-parallel workers start each step after meeting at the last)."""
    model = torch.nn.Sequential(*layers)
    target = torch.randint(0, work.num_classes, (sample.shape[0],), device=sample.device)
    timer = DeviceTimer(sample.device)
    times = []
    for _ in range(passes):
        side_by_side.wait(timeout=600)
        t0 = timer.mark()
        summed_loss(model(sample), target, sample.shape[0]).backward()
        times.append(timer.elapsed(t0, timer.mark()))
    model.zero_grad(set_to_none=True)
    return times


def meeting_factor(lockstep: list[list[float]]) -> float:
    """How much longer the slowest of several workers takes than one does, pass by pass: the median
    over passes of the slowest process's time, over the median time of all (1 for one process)."""
    if len(lockstep) < 2 or not lockstep[0]:
        return 1.0
    slowest = [max(times) for times in zip(*lockstep)]
    return statistics.median(slowest) / statistics.median([t for times in lockstep for t in times])


def _measure_worker(rank: int, work: Workload, device, side_by_side, out_dir: str, whole: bool) -> None:
    # as a run's workers compute: with the allocator keeping each block's size (for the memory
    # figures), which costs every allocation a little
    track_cpu_allocations()
    # measure_profile gives every measuring process a stage or none (the stage passes start together)
    stage = rank if work.stages else None
    measured = _measure(work, device, side_by_side, whole=whole, stage=stage)
    with open(os.path.join(out_dir, f"{rank}.json"), "w") as f:
        json.dump(asdict(measured), f)


def _load_measurement(path: str) -> _Measurement:
    with open(path) as f:
        d = json.load(f)
    return _Measurement(**{**d, "layers": [LayerProfile(**l) for l in d["layers"]]})


def _whole_step_s(
    work: Workload, layers, sample: torch.Tensor, repeats: int, budget_s: float
) -> tuple[float, list[float]]:
    """Times of a real training step of ``layers`` on ``sample`` (one worker): (the optimizer
    update's median; every forward, loss and backward timed). Large models stop at the time budget."""
    model = torch.nn.Sequential(*layers)
    optimizer = make_optimizer(model.parameters(), work.train)
    target = torch.randint(0, work.num_classes, (sample.shape[0],), device=sample.device)
    timer = DeviceTimer(sample.device)
    passes, updates = [], []
    spent = 0.0
    for r in range(repeats + 2):
        if r > 4 and spent > budget_s:
            break
        t0 = timer.mark()
        summed_loss(model(sample), target, sample.shape[0]).backward()
        t1 = timer.mark()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        t2 = timer.mark()
        spent += timer.elapsed(t0, t2)
        if r >= 2:  # the first two warm up
            passes.append(timer.elapsed(t0, t1))
            updates.append(timer.elapsed(t1, t2))
    return statistics.median(updates), passes
