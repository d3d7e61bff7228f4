"""One timer for every measured span: the executor's actions, the worker's steps, the profiler's layers.

On a GPU, host clocks around an operation measure its kernel launches, not its
work: the launch returns long before the kernels finish. So on CUDA a mark is a
CUDA event recorded on the current stream, and spans are read once, when the
caller asks for them (at the end of a step): one wait for the last event, none
per action. On CPU a mark is ``time.perf_counter()``.

Marks are turned into seconds on the host's monotonic clock, which every process
of a machine shares, so the ranks' spans line up on one timeline. On CUDA the
first mark of a step (:meth:`DeviceTimer.anchor`) is paired with the host clock;
the pairing holds when the device has nothing queued at that moment, which is the
case at the start of a step (the worker waits for the previous one to finish).
"""

from __future__ import annotations

import time
from typing import Union

import torch

Mark = Union[float, "torch.cuda.Event"]


class DeviceTimer:
    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self._anchor: tuple[torch.cuda.Event, float] | None = None

    def mark(self) -> Mark:
        """A point in the device's work: recorded now, resolved later."""
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def anchor(self) -> Mark:
        """A mark paired with the host clock; later marks are read relative to it."""
        mark = self.mark()
        if self.cuda:
            self._anchor = (mark, time.perf_counter())
        return mark

    def elapsed(self, start: Mark, end: Mark) -> float:
        """Seconds of device work from ``start`` to ``end`` (waits for ``end`` on CUDA)."""
        if not self.cuda:
            return end - start
        end.synchronize()
        return start.elapsed_time(end) / 1e3

    def seconds(self, marks: list[Mark]) -> list[float]:
        """Host-clock seconds of ``marks`` (on CUDA, since the last :meth:`anchor`; one wait)."""
        if not self.cuda:
            return list(marks)
        if not marks:
            return []
        if self._anchor is None:
            raise RuntimeError("DeviceTimer.seconds needs an anchor() mark first")
        event, host = self._anchor
        for m in marks:  # one real wait: once the latest is done, the others are too
            m.synchronize()
        return [host + event.elapsed_time(m) / 1e3 for m in marks]
