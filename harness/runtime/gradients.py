"""A stage's gradients: persistent flat buckets (:class:`GradBuckets`), their asynchronous
all-reduce over the stage's replicas, started as backward finalises each bucket
(:class:`GradSync`), and the clipping a step applies before the optimizer (:class:`Clip`).

Nothing here knows a schedule: the executor arms a stage's sync on the backward that finalises
its gradients, waits for it at the step, and clips then.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from harness.core.comm import Comm, Pending
from harness.core.timing import DeviceTimer
from harness.core.training import clip_gradients


@dataclass(frozen=True)
class Clip:
    """Gradient clipping at a STEP: to ``max_norm``, over the whole model (an all-reduce of every
    rank's squared norm times ``weight``, 1 / its stage's replicas) or over this stage alone."""

    max_norm: float
    whole_model: bool
    weight: float = 1.0

    def apply(self, params: list[nn.Parameter], comm: Comm) -> None:
        """Clip ``params``' gradients, in place (the whole model's norm through ``comm``)."""
        clip_gradients(params, self.max_norm, comm.all_reduce if self.whole_model else None, self.weight)


class GradBuckets:
    """A stage's gradients in persistent flat buffers, one per bucket.

    Buckets hold parameters in reverse order (the order backward finalises them), up to
    ``bucket_bytes`` each. Each parameter's ``.grad`` is a view into its bucket's buffer,
    set once: backward accumulates into it in place, the replica all-reduce reduces the
    buffer in place (no concatenation, no copy back), and :meth:`zero` clears a bucket
    with one operation instead of freeing and reallocating every gradient each step.
    """

    def __init__(self, params: list[nn.Parameter], bucket_bytes: int):
        self.buckets: list[list[nn.Parameter]] = []
        current, size = [], 0
        for p in reversed(params):
            if current and (size >= bucket_bytes or p.dtype != current[0].dtype):
                self.buckets.append(current)
                current, size = [], 0
            current.append(p)
            size += p.numel() * p.element_size()
        if current:
            self.buckets.append(current)
        self.flats: list[torch.Tensor] = []
        for bucket in self.buckets:
            flat = torch.zeros(sum(p.numel() for p in bucket), dtype=bucket[0].dtype, device=bucket[0].device)
            offset = 0
            for p in bucket:
                p.grad = flat[offset : offset + p.numel()].view_as(p)
                offset += p.numel()
            self.flats.append(flat)

    def zero(self) -> None:
        for flat in self.flats:
            flat.zero_()


class GradSync:
    """Bucketed, asynchronous gradient all-reduce over a stage's replica group.

    While armed (the last backward of an iteration), a hook on each parameter
    counts it ready once its gradient has been accumulated; when a bucket is
    complete the all-reduce of its buffer starts at once, in place, and runs while
    backward continues. :meth:`wait` is called only before the optimizer step.

    What was hidden is measured, not assumed: each launch is marked on the device
    timer, and :meth:`backward_done` marks the end of the armed backward; ``overlap()``
    then says how many buckets started before it and for how long all-reduces ran under it.
    """

    def __init__(self, grads: GradBuckets, comm: Comm, group):
        self.grads, self.comm, self.group = grads, comm, group
        self.timer = DeviceTimer(comm.ctx.device)
        self.buckets = grads.buckets
        self._bucket_of = {id(p): b for b, bucket in enumerate(self.buckets) for p in bucket}
        self._ready = [0] * len(self.buckets)
        self._pending: dict[int, Pending] = {}
        self._launched_at: list = []  # (device-timer mark, launched under the armed backward)
        self.backward_end = None  # the armed backward's end mark
        self.armed = False
        self._hooks = [p.register_post_accumulate_grad_hook(self.ready) for bucket in self.buckets for p in bucket]

    def close(self) -> None:
        """Remove the hooks (the parameters outlive this object: Switch Parallelism re-plans them)."""
        for hook in self._hooks:
            hook.remove()
        self._hooks = []

    def arm(self) -> None:
        self.armed = True
        self._ready = [0] * len(self.buckets)
        self._launched_at, self.backward_end = [], None

    def backward_done(self) -> None:
        self.backward_end = self.timer.mark()

    def overlap(self, end=None) -> dict:
        """Of this iteration's buckets, those whose all-reduce started before the armed backward
        ended, and the time from the first such start to that end (the all-reduce hidden under
        backward), or to ``end`` (a mark of the same timer's clock: where the rank's work went on
        after this stage's backward). Call once the step is over: on CUDA it waits for the marks."""
        end = end if end is not None and self.backward_end is not None else self.backward_end
        # launched before the backward ended, in the host's order (device marks may tie)
        early = [t for t, in_backward in self._launched_at if in_backward and end is not None]
        hidden = max((self.timer.elapsed(t, end) for t in early), default=0.0)
        return {"buckets": len(self.buckets), "buckets_in_backward": len(early), "hidden_allreduce_s": max(hidden, 0.0)}

    def follow(self, masters: list[nn.Parameter], copies: list[torch.Tensor]) -> None:
        """Count ``copies`` (a stashed weight version) for their ``masters``: with weight
        stashing the backward accumulates into the copies, whose ``.grad`` is the master's
        (see the executor's stash), so the masters' own hooks never fire; the copies' do."""
        for p, t in zip(masters, copies):
            t.register_post_accumulate_grad_hook(lambda _t, p=p: self.ready(p))

    def ready(self, p: torch.Tensor) -> None:
        """``p``'s gradient is final: its accumulation hook says so after a whole backward, a split
        backward's W pass after its part."""
        if not self.armed:
            return
        b = self._bucket_of[id(p)]
        self._ready[b] += 1
        if self._ready[b] == len(self.buckets[b]):
            self._launch(b)

    def _launch(self, b: int) -> None:
        self._launched_at.append((self.timer.mark(), self.armed and self.backward_end is None))
        self._pending[b] = self.comm.all_reduce_async(self.grads.flats[b], self.group)

    def wait(self) -> None:
        """Finish every bucket's all-reduce (the sums are already in the gradients' buffers)."""
        self.armed = False
        for b in range(len(self.buckets)):
            if b not in self._pending:  # a parameter never became ready: reduce it now
                self._launch(b)
        for work in self._pending.values():
            work.wait()
        self._pending.clear()
