"""Per-rank measurements: step times, live training memory, process RSS.

Memory is measured, never estimated:
- on CUDA, the caching allocator's peak (``torch.cuda.max_memory_allocated``);
- on CPU there is no allocator peak to read, so one training step (the last,
  which is excluded from timing) runs under the PyTorch profiler with memory
  recording on. Every allocation and free of the CPU allocator during the step
  is replayed in time order; the peak of that running sum plus the bytes held
  live when the step began (parameters, optimizer state, stashed weights,
  persistent buffers, counted once per storage) is the peak of what training
  holds live. Gradients, activations saved for backward, recomputation,
  communication buffers and optimizer temporaries all show up as allocations.
Process peak RSS is reported beside it.
"""

from __future__ import annotations

import contextlib
import os
import resource
import statistics
import sys
from typing import Iterable, Iterator

import torch
from torch.profiler import ProfilerActivity, profile


def tensor_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of the distinct storages behind ``tensors`` (views counted once)."""
    seen: dict[int, int] = {}
    for t in tensors:
        if t is None or not isinstance(t, torch.Tensor) or t.device.type == "meta":
            continue
        storage = t.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def optimizer_state_tensors(optimizer: torch.optim.Optimizer) -> Iterator[torch.Tensor]:
    for state in optimizer.state.values():
        for v in state.values():
            if isinstance(v, torch.Tensor):
                yield v


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


class MemoryMeter:
    """Peak live training bytes of one rank; see the module docstring for the method."""

    def __init__(self, device: torch.device):
        self.device = device
        self.peak_bytes: int | None = None
        self.resident_bytes: int | None = None
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)

    @contextlib.contextmanager
    def measure_step(self, resident: Iterable[torch.Tensor], extra_resident_bytes: int = 0) -> Iterator[None]:
        """Wrap exactly one training step; ``resident`` (and ``extra_resident_bytes``) is what is
        live at its start."""
        self.resident_bytes = tensor_bytes(resident) + extra_resident_bytes
        if self.device.type == "cuda":
            yield
            self.peak_bytes = int(torch.cuda.max_memory_allocated(self.device))
            return
        # Memory is recorded for the profiling thread only (profile_all_threads
        # drops memory events in torch 2.14): strategies that compute in other
        # threads run them inline for this step (Strategy.memory_step_context).
        with _native_stderr_silenced(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            yield
        deltas = sorted(
            (e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"
        )
        live = peak = 0
        for _, nbytes in deltas:
            live += nbytes
            peak = max(peak, live)
        self.peak_bytes = self.resident_bytes + peak


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
