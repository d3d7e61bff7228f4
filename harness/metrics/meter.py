"""Per-rank measurements: step times, live training memory, idle time, process RSS.

Memory is measured one way for every strategy, nothing declared by hand: the
peak of the bytes the device's allocator holds live during one steady-state
step (the last of the run, after warm-up, excluded from timing; the same window
on CPU and CUDA).
- On CUDA, the caching allocator's peak, reset when the step starts
  (``torch.cuda.max_memory_allocated``).
- On CPU, torch's allocator is told to account every block from the worker's
  start (:func:`track_cpu_allocations`), and the step runs under the profiler
  with memory recording; each allocation or free it records carries the
  allocator's running total of live bytes, so blocks allocated before the step
  (parameters, optimizer state, stashed weights, DDP's buckets, a library's
  receive buffers) are in the total and their frees are honoured.
  Host tensors that on a GPU would not be on the device are subtracted,
  measured: the dataset and the host copies of the layers this rank does not
  train (every rank builds the whole model on the host first, as on a GPU node).
The breakdown per rank gives the measured bytes of the parameters, of the
gradients the step produced, of the optimizer state and of stashed weight
versions; ``other`` is the rest of the peak (activations saved for backward,
recomputation, communication and library buffers, temporaries). Gradients are
counted at their full size; where the peak comes before the last of them is
allocated, ``other`` is that much smaller. Process peak RSS is reported beside it.

Idle time (the bubble) is measured one way for every strategy too, from the same
profiled step on CPU: the rank's compute is the union of the spans of the
operators it ran (forward, backward, optimizer), leaving out communication
operators and the time between operators (a blocking receive, a wait for an
all-reduce); idle fraction = 1 - compute / the step's span (per rank: its own span;
for the job: the span of all its ranks on one machine). Annotations a library
emits around its actions (torch pipelining's ``Forward i``) are looked into, not
counted whole, since they enclose receives. The spans are kept, merged into
forward, backward and optimizer blocks, for the timeline figure. A process that
drives several stages (torchgpipe) opens a span per stage around each stage's
forward during this step (:func:`stage_annotation`); each stage's compute and
idle are then measured apart, as if it were a rank. The profiler's
memory recording slows operators a little, so this step's idle fraction is, if
anything, lower than an unprofiled step's. On CUDA the same step is profiled with
the device's activity: compute is the union of the kernels, copies and sets it ran
(NCCL's kernels are communication, left out), in ``GPU`` blocks on the timeline.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import resource
import statistics
import sys
from typing import Callable, Iterable, Iterator

import torch
from torch._C._profiler import RecordScope, _EventType
from torch.optim.optimizer import register_optimizer_step_pre_hook
from torch.profiler import ProfilerActivity, profile

from harness.core.vocabulary import MEASURED_MEMORY_PARTS, OTHER_MEMORY


def tensor_bytes(tensors: Iterable[torch.Tensor], skip: set[int] = frozenset()) -> int:
    """Bytes of the distinct storages behind ``tensors`` (views counted once), leaving out the
    storages whose data pointers are in ``skip``."""
    return sum(storage_sizes(tensors, skip).values())


def storage_sizes(tensors: Iterable[torch.Tensor], skip: set[int] = frozenset()) -> dict[int, int]:
    seen: dict[int, int] = {}
    for t in tensors:
        if t is None or not isinstance(t, torch.Tensor) or t.device.type == "meta":
            continue
        storage = t.untyped_storage()
        if storage.data_ptr() not in skip:
            seen[storage.data_ptr()] = storage.nbytes()
    return seen


def optimizer_state_tensors(optimizer: torch.optim.Optimizer) -> Iterator[torch.Tensor]:
    for state in optimizer.state.values():
        for v in state.values():
            if isinstance(v, torch.Tensor):
                yield v


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def track_cpu_allocations() -> None:
    """Make torch's CPU allocator keep the size of every block it hands out from now on.

    By default it records sizes only while a profiler runs, so the profiler cannot see
    the free of a block allocated before it started, nor count such blocks in its
    running total. The switch is c10's ``caffe2_report_cpu_memory_usage`` flag (it also
    logs each allocation at INFO, below c10's default level); call this first in a worker.
    c10 warns at the first free of a block it has no size for (then every 1000th): that
    first one is a block made here, freed with stderr silenced.
    """
    lib = ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib", "libc10.so"))
    flag = ctypes.c_bool.in_dll(lib, "FLAGS_caffe2_report_cpu_memory_usage")
    if flag.value:
        return
    unknown = torch.empty(1)
    flag.value = True
    with _native_stderr_silenced():
        del unknown


class StepMeter:
    """Peak live bytes and idle time of one rank over one step; see the module docstring."""

    def __init__(self, device: torch.device):
        self.device = device
        self.peak_bytes: int | None = None
        self.breakdown: dict[str, int] | None = None
        self.idle: dict | None = None  # idle_fraction, compute_s, step_s (CPU)
        self.spans: list[tuple[str, float, float]] = []  # merged compute blocks, epoch seconds
        # a process that drives several stages (torchgpipe): each stage's own idle and spans,
        # {stage: {"idle": ..., "profiled_spans": ...}}; empty for a rank of one stage
        self.stages: dict[int, dict] = {}

    @contextlib.contextmanager
    def measure_step(
        self,
        parts: Callable[[], dict[str, Iterable[torch.Tensor]]],
        host_tensors: Callable[[], Iterable[torch.Tensor]] = lambda: (),
    ) -> Iterator[None]:
        """Wrap exactly one training step. ``parts()`` names this rank's parameters, optimizer
        state and stashed weights (read when the step ends, for the breakdown; gradients are read
        as each optimizer steps); on CPU, ``host_tensors()`` are the host-only tensors to leave
        out of the peak."""
        grads: dict[int, int] = {}

        def record_grads(optimizer, args, kwargs) -> None:  # every optimizer, before it steps
            grads.update(storage_sizes(p.grad for group in optimizer.param_groups for p in group["params"]))

        hook = register_optimizer_step_pre_hook(record_grads)
        try:
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
                torch.cuda.reset_peak_memory_stats(self.device)
                start = int(torch.cuda.memory_allocated(self.device))
                with (
                    _native_stderr_silenced(),
                    profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof,
                ):
                    yield
                    torch.cuda.synchronize(self.device)  # inside the profile: its kernels are in it
                peak = int(torch.cuda.max_memory_allocated(self.device))
                self.spans, self.idle, lanes = device_spans(prof)
            else:
                # Memory events are recorded for the profiling thread only (profile_all_threads
                # drops them in torch 2.14): strategies that compute in other threads run them
                # inline for this step (Strategy.memory_step_context). The running total still
                # counts every thread's blocks.
                with _native_stderr_silenced(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
                    yield
                start, peak = _start_and_peak_total(prof, "cpu")
                self.spans, self.idle, lanes = compute_spans(prof)
        finally:
            hook.remove()
        self.stages = {j: {"idle": idle, "profiled_spans": spans} for j, (spans, idle) in lanes.items()}
        # gradients are gone by now (their addresses may be reused), so they are not deduplicated
        # against what is live at the end of the step
        named = parts()
        sizes, taken = {"gradients": sum(grads.values())}, set()
        for key in (k for k in MEASURED_MEMORY_PARTS if k != "gradients"):  # the tensors the strategy names
            found = storage_sizes(named.get(key, ()), skip=taken)
            sizes[key] = sum(found.values())
            taken |= set(found)
        if self.device.type == "cpu":
            counted = (t for t in host_tensors() if _allocated_by_torch(t))
            sizes["host_excluded"] = tensor_bytes(counted, skip=taken)
            peak, start = peak - sizes["host_excluded"], start - sizes["host_excluded"]
        self.peak_bytes = peak
        sizes["at_step_start"] = start
        sizes[OTHER_MEMORY] = peak - sum(sizes[k] for k in MEASURED_MEMORY_PARTS)
        self.breakdown = sizes


def _allocated_by_torch(tensor: torch.Tensor) -> bool:
    """Whether the CPU allocator's running total (the profile's) counts the tensor's storage: not
    one in shared memory (a data set the command hands its workers) or on memory torch did not
    allocate (numpy's): leaving those out of the total they were never in made the start of a
    step negative."""
    storage = tensor.untyped_storage()
    return storage.resizable() and not storage.is_shared()


def _start_and_peak_total(prof, device_type: str) -> tuple[int, int]:
    """The allocator's live bytes when the profile began, and the largest running total it
    reported during the profile."""
    peak, first = 0, None
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        node = stack.pop()
        stack.extend(node.children)
        if node.tag == _EventType.Allocation and node.extra_fields.device.type == device_type:
            total, size = node.extra_fields.total_allocated, node.extra_fields.alloc_size
            peak = max(peak, total, total - size)  # after it, and before it (a free's size is negative)
            if first is None or node.start_time_ns < first[0]:
                first = (node.start_time_ns, total - size)
    return (first[1] if first else peak), peak


# operators that move data between ranks or wait for it: idle time, not compute; kept apart as
# collectives or point-to-point for the idle breakdown (harness.metrics.idle)
_COMMUNICATION = (
    "c10d",
    "gloo",
    "nccl",
    "record_param_comms",
    "send",
    "recv",
    "all_reduce",
    "allreduce",
    "broadcast",
    "barrier",
    "gather",
    "scatter",
    "wait",
)
_COLLECTIVE = ("all_reduce", "allreduce", "broadcast", "barrier", "gather", "scatter", "reduce")


def comm_kind(name: str) -> str:
    """``collective`` or ``p2p`` (a send, a receive, a wait on one) for a communication operator
    or NCCL kernel."""
    lowered = name.lower()
    return "collective" if any(word in lowered for word in _COLLECTIVE) else "p2p"


def _comm_blocks(ops: list[tuple[int, int, str]], first: int) -> list[tuple[str, float, float]]:
    """Communication operators (start ns, end ns, kind) as (kind, start, end), seconds from ``first``."""
    return [(kind, (start - first) / 1e9, (end - first) / 1e9) for start, end, kind in sorted(ops)]


_MERGE_GAP_NS = 100_000  # adjacent operators of one kind closer than this form one block
# torch pipelining's multi-stage runtime names each action's span "PP:<stage><kind><micro-batch>"
# (our executor names its I and W actions the same way): the backward operators under I and W
# actions are the two parts of a split backward
_LIBRARY_ACTION = re.compile(r"PP:\d+(F|B|I|W)\d+")


def stage_annotation(stage: int) -> str:
    """The span name a process that drives several stages opens around each stage's forward, so
    that each stage's work is measured apart (:func:`compute_spans`)."""
    return f"pipebench.stage{stage}"


_STAGE = re.compile(r"pipebench\.stage(\d+)")


def compute_spans(prof) -> tuple[list[tuple[str, float, float]], dict | None, dict[int, tuple]]:
    """The profiled thread's compute blocks (``F``, ``B``, ``STEP``, and ``I`` and ``W`` for the
    parts of a split backward; epoch seconds) and its idle fraction over the profile (see the
    module docstring); and where the process drives several stages (forwards inside
    :func:`stage_annotation` spans), each stage's own blocks and idle fraction, its backward
    found by autograd's sequence numbers, which tie a backward node to the forward operator that
    made it."""
    ops: list[tuple[int, int, str, int | None]] = []
    comm: list[tuple[int, int, str]] = []
    first, last = None, None
    stage_of_sequence: dict[int, int] = {}

    def made_in(node, stage: int) -> None:  # the forward operators (and those inside) of a stage
        if node.tag == _EventType.TorchOp and node.extra_fields.sequence_number >= 0:
            stage_of_sequence[node.extra_fields.sequence_number] = stage
        for child in node.children:
            made_in(child, stage)

    def _stage_inside(node, default: int | None) -> int | None:
        """An operator outside any stage's span that holds one (a checkpoint running a stage's
        forward, or the backward of such an operator) belongs to that stage: the first stage span
        or operator of a known stage inside it."""
        for child in sorted(node.children, key=lambda n: n.start_time_ns):
            if child.tag != _EventType.TorchOp:
                continue
            annotated = _STAGE.fullmatch(child.name)
            if annotated and child.extra_fields.scope == RecordScope.USER_SCOPE:
                made_in(child, int(annotated.group(1)))
                return int(annotated.group(1))
            if stage_of_sequence.get(child.extra_fields.sequence_number) is not None:
                return stage_of_sequence[child.extra_fields.sequence_number]
            inner = _stage_inside(child, None)
            if inner is not None:
                return inner
        return default

    def visit(node, kind: str, part: str | None, stage: int | None) -> None:
        nonlocal first, last
        if node.tag != _EventType.TorchOp:
            return
        first = node.start_time_ns if first is None else min(first, node.start_time_ns)
        last = node.end_time_ns if last is None else max(last, node.end_time_ns)
        name = node.name
        if name.startswith("Optimizer.step"):
            kind = "STEP"
        if node.extra_fields.scope == RecordScope.USER_SCOPE:  # an annotation: look inside
            action, annotated = _LIBRARY_ACTION.fullmatch(name), _STAGE.fullmatch(name)
            for child in node.children:
                visit(child, kind, action.group(1) if action else part, int(annotated.group(1)) if annotated else stage)
            return
        if any(word in name.lower() for word in _COMMUNICATION):
            comm.append((node.start_time_ns, node.end_time_ns, comm_kind(name)))
            return
        if kind == "F" and name.startswith("autograd::engine::evaluate_function"):
            kind = part if part in ("I", "W") else "B"
            found = stage_of_sequence.get(node.extra_fields.sequence_number)
            stage = found if found is not None else _stage_inside(node, stage)
        else:
            if stage is None:  # an operator that runs a stage's forward inside it (a checkpoint)
                stage = _stage_inside(node, None)
            if stage is not None:
                made_in(node, stage)
        ops.append((node.start_time_ns, node.end_time_ns, kind, stage))

    for root in sorted(prof.profiler.kineto_results.experimental_event_tree(), key=lambda n: n.start_time_ns):
        visit(root, "F", None, None)
    spans, idle = busy_blocks([op[:3] for op in ops], first, last)
    if idle:
        idle["comm"] = _comm_blocks(comm, first)
    lanes = {
        j: busy_blocks([op[:3] for op in ops if op[3] == j], first, last)
        for j in sorted({op[3] for op in ops if op[3] is not None})
    }
    return spans, idle, lanes


def device_spans(prof) -> tuple[list[tuple[str, float, float]], dict | None, dict[int, tuple]]:
    """On CUDA, the device's work in the profile (kernels, copies and sets, NCCL's kernels left
    out as communication) as ``GPU`` blocks, and its idle fraction, as :func:`compute_spans`;
    where the process drives several GPUs (torchgpipe), each GPU's own (keyed by its index).
    The device's timestamps are on the host's clock (CUPTI converts them), so ranks line up."""
    kernels = [e for e in prof.profiler.kineto_results.events() if e.device_type() == torch.autograd.DeviceType.CUDA]
    ops = [
        (e.start_ns(), e.start_ns() + e.duration_ns(), "GPU", e.device_index())
        for e in kernels
        if not e.name().lower().startswith("nccl")
    ]
    comm = [
        (e.start_ns(), e.start_ns() + e.duration_ns(), comm_kind(e.name()))
        for e in kernels
        if e.name().lower().startswith("nccl")
    ]
    if not ops:
        return [], None, {}
    first, last = min(o[0] for o in ops), max(o[1] for o in ops)
    devices = sorted({o[3] for o in ops})
    lanes = (
        {d: busy_blocks([o[:3] for o in ops if o[3] == d], first, last) for d in devices} if len(devices) > 1 else {}
    )
    spans, idle = busy_blocks([o[:3] for o in ops], first, last)
    if idle:
        idle["comm"] = _comm_blocks(comm, first)
    return spans, idle, lanes


def busy_blocks(
    ops: list[tuple[int, int, str]], first: int | None, last: int | None
) -> tuple[list[tuple[str, float, float]], dict | None]:
    """Work intervals (start ns, end ns, kind) within [first, last]: their union's blocks, merged
    per kind across gaps under ``_MERGE_GAP_NS``, in epoch seconds, and the idle fraction."""
    if first is None or last <= first:
        return [], None
    ops = sorted(ops)
    blocks: list[list] = []
    union: list[list[int]] = []  # exact, unmerged: what the idle breakdown reads (then drops)
    busy, covered_to = 0, first
    by_kind: dict[str, int] = {}
    for start, end, kind in ops:
        added = max(0, end - max(start, covered_to))  # the union: overlapping spans count once
        busy += added
        by_kind[kind] = by_kind.get(kind, 0) + added
        if union and start <= union[-1][1]:
            union[-1][1] = max(union[-1][1], end)
        elif end > start:
            union.append([start, end])
        covered_to = max(covered_to, end)
        if blocks and blocks[-1][0] == kind and start - blocks[-1][2] < _MERGE_GAP_NS:
            blocks[-1][2] = max(blocks[-1][2], end)
        else:
            blocks.append([kind, start, end])
    span = last - first
    return (
        [(kind, start / 1e9, end / 1e9) for kind, start, end in blocks],
        {
            "idle_fraction": 1 - busy / span,
            "compute_s": busy / 1e9,
            "step_s": span / 1e9,
            "start_s": first / 1e9,
            "end_s": last / 1e9,
            "busy_s": {k: v / 1e9 for k, v in by_kind.items()},
            # seconds from ``start_s``: epoch seconds as floats would lose a microsecond per interval
            "union": [((start - first) / 1e9, (end - first) / 1e9) for start, end in union],
        },
    )


def job_idle_fractions(idles: list[dict]) -> list[float]:
    """Each rank's idle fraction of the job's step, from the first rank's start to the last
    rank's end (the profiler's clock is shared by the ranks of one machine): a rank's own span
    leaves out the wait of a stage that is done before the others, as the last stage of a 1F1B
    pipeline is, which the analytic (p-1)/(m+p-1) counts."""
    span = max(i["end_s"] for i in idles) - min(i["start_s"] for i in idles)
    return [1 - i["compute_s"] / span for i in idles]


@contextlib.contextmanager
def _native_stderr_silenced() -> Iterator[None]:
    """Kineto prints start/stop and GPU-probe lines from C++ on every profile,
    whatever its log level; silence file descriptor 2 for the profiled step only.
    Python exceptions raised inside are still reported after it is restored."""
    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def step_time_summary(per_rank_step_times: list[list[float]]) -> dict:
    """Job step time = slowest rank at each timed step; median and spread over steps."""
    if not per_rank_step_times or not per_rank_step_times[0]:
        return {"step_time_s": None, "step_time_p10_s": None, "step_time_p90_s": None, "timed_steps": 0}
    job = [max(ts) for ts in zip(*per_rank_step_times)]
    qs = statistics.quantiles(job, n=10) if len(job) >= 2 else [job[0]] * 9
    return {
        "step_time_s": statistics.median(job),
        "step_time_p10_s": qs[0],
        "step_time_p90_s": qs[-1],
        "timed_steps": len(job),
    }
