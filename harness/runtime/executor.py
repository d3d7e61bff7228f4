"""Runs one rank's action list: each action on its stage (a rank holds one, or several in an
interleaved or V-shaped schedule).

Each action kind maps to one method through one explicit table
(:attr:`StageExecutor.ACTIONS`); a schedule with an action kind the table lacks is
refused before any process starts (:meth:`StageExecutor.unsupported`). Tensors move only
through :class:`harness.core.comm.Comm`, with the pieces and shapes fixed by the
topology and the per-sample activation shapes computed once at build time.
Per action the executor marks its start and end on the device timer
(:mod:`harness.core.timing`: CUDA events on a GPU, read once when the call ends), so
every rank can report compute, communication and idle time and a timeline can
be drawn. Nothing inside a call waits on the host for the device: the loss is
summed on the device, and on NCCL a wait only orders the streams.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.nn.utils.stateless import _reparametrize_module

from harness.core.comm import Comm, Pending
from harness.core.timing import DeviceTimer
from harness.core.training import eval_counts, predict_weights_, summed_loss
from harness.runtime import actions as sch
from harness.runtime.gradients import Clip, GradSync
from harness.runtime.stage import LocalStage
from harness.runtime.topology import owned_range, transfers


def _split_backward():
    """torch pipelining's split of a backward into its input- and weight-gradient parts, imported
    when a schedule first runs one: the library takes about 1.5 s to import, which every command
    and worker would otherwise pay (harness.planning.profiling imports it the same way)."""
    from torch.distributed.pipelining import _backward

    return _backward


def _weights(module: nn.Module, version: dict[str, torch.Tensor]):
    """Run ``module`` with ``version``'s tensors in place of its parameters (as
    torch.func.functional_call does), around both forward and backward, so that
    recomputation in backward sees the same weights as the forward did."""
    return _reparametrize_module(module, version)


def _grad_accumulator(p: torch.Tensor):
    """The autograd node that accumulates leaf ``p``'s gradient (how torch's split backward names
    the parameters of each weight-gradient part)."""
    return p.view_as(p).grad_fn.next_functions[0][0]


def _same_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


# where an action's time goes in the split (sends and STEP: their parts are marked inside)
_KIND = {
    sch.FWD: "compute_s",
    sch.BWD: "compute_s",
    sch.BWD_I: "compute_s",
    sch.BWD_W: "compute_s",
    sch.RECV_F: "idle_s",
    sch.RECV_B: "idle_s",
}


@dataclass
class StageRun:
    """What one iteration on this rank produced, plus where its time went."""

    loss: float | torch.Tensor = 0.0  # this rank's share of the global mean loss (on the device while training)
    correct: int = 0
    count: int = 0
    loss_sum: float = 0.0  # unscaled cross-entropy sum (evaluation)
    events: list[tuple[str, float, float]] = field(default_factory=list)
    # forward, backward and optimizer work
    compute_s: float = 0.0
    # blocked in a receive: waiting for the adjacent stage (the bubble) plus the transfer itself
    idle_s: float = 0.0
    # exposed communication: the gradient all-reduce left after backward, and finishing sends
    comm_s: float = 0.0
    # the replica all-reduce's buckets, those started under backward, and for how long (GradSync.overlap)
    allreduce: dict | None = None

    def step_stats(self) -> dict:
        """Where a training iteration's time went, as a strategy's ``step_stats`` entry holds it."""
        return {
            "compute_s": self.compute_s,
            "comm_s": self.comm_s,
            "idle_s": self.idle_s,
            "events": self.events,
            "allreduce": self.allreduce,
        }


@dataclass
class InFlight:
    """A stage's micro-batches between their forward and the end of their backward."""

    inputs: dict[int, torch.Tensor] = field(default_factory=dict)
    outputs: dict[int, torch.Tensor] = field(default_factory=dict)
    losses: dict[int, torch.Tensor] = field(default_factory=dict)
    grads: dict[int, torch.Tensor] = field(default_factory=dict)  # output gradients, received or handed over
    handed: set[int] = field(default_factory=set)  # those handed over by the next stage on this rank (no pool buffer)
    weight_parts: dict[int, list[dict]] = field(default_factory=dict)  # what a W pass starts from
    # received tensors a W pass still reads (the gradient, the stage's input, which autograd saved),
    # back to the pool after that pass, however late the schedule runs it
    read_by_w: dict[int, list[torch.Tensor]] = field(default_factory=dict)


class StageExecutor:
    """Runs one rank's action lists: each action on the stage it names (its only one, where a
    rank holds one). What runs on the hot path is prepared once: gradients live in persistent
    buckets (:class:`harness.runtime.gradients.GradBuckets`), each micro-batch's sample range and
    transfers are computed once per batch size, received tensors come from a pool of buffers, and
    stashed weight versions are reused once their backward is done. Adjacent stages on one rank
    hand their tensors over in place of a send (the V schedules' turn)."""

    def __init__(
        self,
        stages: list[LocalStage],
        comm: Comm,
        optimizer: torch.optim.Optimizer,
        dtype: torch.dtype = torch.float32,
        stash_weights: bool = False,
        predict_weights: bool = False,
        label_smoothing: float = 0.0,
        clip: Clip | None = None,
    ):
        """``stages``: this rank's stages, ascending (``optimizer`` steps all of their parameters);
        ``dtype``: the activations' and gradients' type between stages (bf16 in a bf16 run);
        ``clip``: how a STEP clips the gradients' norm (None: it does not)."""
        if (stash_weights or predict_weights) and len(stages) != 1:
            raise ValueError("weight stashing runs one stage per rank")
        self.stages, self.comm, self.optimizer, self.dtype = stages, comm, optimizer, dtype
        self._by_stage = {st.plan.stage: st for st in stages}
        self.label_smoothing, self.clip = label_smoothing, clip
        self.device = comm.ctx.device
        self.timer = DeviceTimer(self.device)
        # weight stashing (asynchronous schedules): a forward runs on a copy of the
        # weights it saw, kept until its backward, while STEPs update the master weights
        self.stash_weights = stash_weights
        # ... predicted over the minibatches in flight (their updates land before this one's)
        self.predict_weights = predict_weights
        self._stash: dict[int, list[torch.Tensor]] = {}
        self._free_versions: list[list[torch.Tensor]] = []
        self._received: dict[tuple, list[torch.Tensor]] = {}  # free receive buffers, by shape
        self._ranges: dict[tuple[int, int, int], tuple[int, int]] = {}
        self._transfers: dict[tuple[int, int, int, bool], list] = {}
        self._evaluating = False
        self._calls = 0  # training calls so far (an asynchronous schedule waits for a send two calls on)
        self._sends_started = 0
        self._settle = False
        self._spans: list[tuple] = []
        self._reduced = False  # a STEP reduced gradients in this call
        self._reset_state()

    def _on(self, a: sch.Action) -> tuple[LocalStage, InFlight]:
        """The stage ``a`` acts on and its micro-batches in flight."""
        st = self.stages[0] if a.stage is None else self._by_stage[a.stage]
        return st, self._held[st.plan.stage]

    def _local(self, stage: int) -> LocalStage | None:
        """Stage ``stage`` where this rank holds it too (an adjacent stage handed over in place)."""
        return self._by_stage.get(stage)

    def _reset_state(self) -> None:
        self._held = {stage: InFlight() for stage in self._by_stage}
        self._sends: list[tuple[int, Pending]] = []  # (the training call that started it, the send)
        self._posted: dict[sch.Action, tuple[torch.Tensor, list[Pending]]] = {}  # receives posted, not yet taken

    def send_counts(self) -> tuple[int, int]:
        """(sends started so far, sends not yet waited for): an asynchronous schedule keeps those of
        its last two calls."""
        return self._sends_started, len(self._sends)

    def stashed_tensors(self) -> list[torch.Tensor]:
        """Weight copies held for minibatches in flight, and those kept for reuse (for the memory breakdown)."""
        return [t for version in [*self._stash.values(), *self._free_versions] for t in version]

    # -- one call ------------------------------------------------------------
    def run(
        self,
        actions: list[sch.Action],
        x: torch.Tensor | None,
        y: torch.Tensor | None,
        training: bool = True,
        flush: bool = True,
        posting: list[sch.Action] | None = None,
    ) -> StageRun:
        """Run ``actions`` with global batch ``(x, y)``.

        ``flush=True`` (synchronous schedules) ends the call with every send
        complete and nothing in flight. ``flush=False`` (asynchronous schedules)
        keeps minibatches in flight, and their sends, for the next call.
        ``posting``: the order to post the call's receives in where it is not the list's own
        (:func:`harness.runtime.actions.receive_order`).
        """
        self._posting, self._next_post = posting or [], 0
        if not training:
            return self._evaluate(actions, x, y)
        if x is not None:
            self._x, self._y, self._batch = x, y, x.shape[0]
        self._training = training
        if flush:
            self._reset_state()
        self._calls += 1
        self._run = StageRun()
        # a split backward on a stage with recomputed layers recomputes its forward once, at I
        split = {self._on(a)[0].plan.stage for a in actions if a.op == sch.BWD_I}
        for st in self.stages:
            st.recompute_at_i = bool(st.module.recompute) and not st.plan.is_first and st.plan.stage in split
        self._last_reduced: GradSync | None = None  # the stage whose reducing backward ended last
        # (label or None, where the span's time goes or None, start mark, end mark)
        self._spans: list[tuple] = []
        self.timer.anchor()
        with torch.set_grad_enabled(training):
            for action in actions:
                t0 = self.timer.mark()
                if action.op in (sch.BWD_I, sch.BWD_W):
                    # named as torch pipelining names its actions, so the profiled step tells a
                    # split backward's two parts apart (harness.metrics.meter.compute_spans)
                    stage = self._on(action)[0].plan.stage
                    with torch.profiler.record_function(f"PP:{stage}{action.op}{action.micro}"):
                        self.ACTIONS[action.op](self, action)
                else:
                    self.ACTIONS[action.op](self, action)
                kind = _KIND.get(action.op)
                self._spans.append((str(action), kind, t0, self.timer.mark()))
        t0 = self.timer.mark()
        if flush or self._settle:
            self._wait_sends()
        else:
            # gloo marks a send completed only once it is waited for: without the wait, every call's
            # sends (and the activations they hold) would be kept for the whole run. A send of the
            # call before the last was received within the neighbour's last call, so it is done
            # and its wait returns at once; later ones that report done are dropped too
            old = [p for call, p in self._sends if call <= self._calls - 2]
            for p in old:
                p.wait()
            self._sends = [(call, p) for call, p in self._sends if call > self._calls - 2 and not p.done()]
        self._spans.append((None, "comm_s", t0, self.timer.mark()))
        if flush:  # a synchronous step holds no reference to its batch once it is done
            self._x = self._y = None
        self._read_spans()
        return self._run

    def _read_spans(self) -> None:
        """The call's marks in seconds (one wait on CUDA, at the end): its events and time split."""
        seconds = iter(self.timer.seconds([m for *_, t0, t1 in self._spans for m in (t0, t1)]))
        for label, kind, _, _ in self._spans:
            t0, t1 = next(seconds), next(seconds)
            if label is not None:  # CLOCK_MONOTONIC is shared by all processes of a machine: ranks line up
                self._run.events.append((label, t0, t1))
            if kind is not None:
                setattr(self._run, kind, getattr(self._run, kind) + t1 - t0)
        syncs = [st.grad_sync for st in self.stages if st.grad_sync is not None]
        if syncs and self._reduced:
            # several stages: each one's buckets, hidden under the rank's work up to the end of the
            # last reducing backward (a stage reduced early hides under the other stages' work)
            end = self._last_reduced.backward_end if self._last_reduced is not None else None
            parts = [sync.overlap(end) for sync in syncs]
            self._run.allreduce = {
                "buckets": sum(p["buckets"] for p in parts),
                "buckets_in_backward": sum(p["buckets_in_backward"] for p in parts),
                "hidden_allreduce_s": max(p["hidden_allreduce_s"] for p in parts),
            }
        self._spans, self._reduced = [], False

    def drain_sends(self) -> None:
        self._wait_sends()

    @contextlib.contextmanager
    def settled(self):
        """Within this context every call starts and ends with all its sends complete."""
        self._wait_sends()
        self._settle = True
        try:
            yield
        finally:
            self._settle = False

    def _evaluate(self, actions: list[sch.Action], x: torch.Tensor, y: torch.Tensor) -> StageRun:
        """A forward-only pass that leaves an asynchronous pipeline's in-flight state alone.

        Evaluating in the middle of an AshPipe run uses each stage's current
        weights; training minibatches in flight, and their messages (which use
        other tags), are untouched and resume afterwards.
        """
        training_state = (
            self._held,
            self._sends,
            self._posted,
            getattr(self, "_x", None),
            getattr(self, "_y", None),
            getattr(self, "_batch", None),
        )
        self._reset_state()
        self._x, self._y, self._batch, self._training, self._evaluating = x, y, x.shape[0], False, True
        self._run = StageRun()
        try:
            with torch.no_grad():
                for action in actions:
                    self.ACTIONS[action.op](self, action)
            self._wait_sends()
            return self._run
        finally:
            self._held, self._sends, self._posted, self._x, self._y, self._batch = training_state
            self._training, self._evaluating = True, False

    # -- helpers -------------------------------------------------------------
    def _range(self, st: LocalStage, micro: int) -> tuple[int, int]:
        # asynchronous schedules number minibatches across calls; within a batch the
        # slice is the index modulo the micro-batch count
        p = st.plan
        key = (p.stage, self._batch, micro % p.micro_batches)
        if key not in self._ranges:
            self._ranges[key] = owned_range(p.topo, self._batch, p.micro_batches, key[2], p.stage, p.replica)
        return self._ranges[key]

    def _pieces(self, st: LocalStage, micro: int, towards_next: bool):
        """Transfers of ``micro`` that touch this rank on ``st``'s boundary with the next (or previous) stage."""
        p = st.plan
        key = (p.stage, self._batch, micro % p.micro_batches, towards_next)
        if key not in self._transfers:
            boundary = p.stage if towards_next else p.stage - 1
            me = "src" if towards_next else "dst"
            pieces = transfers(p.topo, self._batch, p.micro_batches, key[2], boundary)
            self._transfers[key] = [t for t in pieces if getattr(t, me) == p.rank]
        return self._transfers[key]

    def _tag(self, micro: int, grad: bool, boundary: int) -> int:
        """Message tag: unique per boundary (two stages of one rank may talk to the same peer),
        per micro-batch (bounded for long asynchronous runs), direction, and training or
        evaluation (whose messages never meet a training one in flight)."""
        return ((boundary * 2 + self._evaluating) * (1 << 20) + micro % (1 << 20)) * 2 + int(grad)

    def _post(self, a: sch.Action) -> None:
        """Post receive ``a`` (its pieces into a buffer of the pool); :meth:`_received_tensor` waits."""
        st, _ = self._on(a)
        forward = a.op == sch.RECV_F
        shape = st.plan.boundary_shapes[st.plan.stage if forward else st.plan.stage + 1]
        tag = self._tag(a.micro, grad=not forward, boundary=st.plan.stage - 1 if forward else st.plan.stage)
        lo, hi = self._range(st, a.micro)
        free = self._received.get((hi - lo, *shape))
        buf = free.pop() if free else torch.empty((hi - lo, *shape), dtype=self.dtype, device=self.device)
        waits = [
            self.comm.irecv(buf[t.lo - lo : t.hi - lo], t.src if forward else t.dst, tag)
            for t in self._pieces(st, a.micro, towards_next=not forward)
        ]
        self._posted[a] = (buf, waits)

    def _received_tensor(self, a: sch.Action) -> torch.Tensor:
        """The tensor of receive ``a``, once it has arrived. It is posted here, after the receives
        the call's posting order puts before it (each peer's messages in the order the peer sends
        them, :func:`harness.runtime.actions.receive_order`: NCCL pairs messages by order),
        unless an earlier receive posted it already."""
        while a not in self._posted:
            if self._next_post < len(self._posting):
                self._next_post += 1
                self._post(self._posting[self._next_post - 1])
            else:  # no order given: the list's own
                self._post(a)
        buf, waits = self._posted.pop(a)
        for w in waits:
            w.wait()
        return buf

    def _release(self, buf: torch.Tensor) -> None:
        """``buf`` (a received tensor) is no longer read by anything: keep it for a later receive."""
        buf.grad = None
        self._received.setdefault(tuple(buf.shape), []).append(buf.detach())

    def _new_version(self) -> list[torch.Tensor]:
        """A copy of the master weights for one minibatch in flight: a kept one when there is one
        (one copy kernel for all of them), otherwise new leaves whose gradients are the masters'
        buffers, so a backward on the copy accumulates straight into the stage's buckets."""
        st = self.stages[0]  # (weight stashing runs one stage per rank)
        if self._free_versions:
            version = self._free_versions.pop()
            with torch.no_grad():
                torch._foreach_copy_(version, st.masters)
            return version
        version = [p.detach().clone().requires_grad_(True) for p in st.masters]
        for t, p in zip(version, st.masters):
            t.grad = p.grad
        if st.grad_sync is not None:  # the replica all-reduce starts under this version's backward
            st.grad_sync.follow(st.masters, version)
        return version

    def _send(self, st: LocalStage, tensor: torch.Tensor, micro: int, pieces, peer_attr: str, tag: int) -> None:
        lo, _ = self._range(st, micro)
        self._sends_started += len(pieces)
        for t in pieces:
            self._sends.append(
                (self._calls, self.comm.isend(tensor[t.lo - lo : t.hi - lo].contiguous(), getattr(t, peer_attr), tag))
            )

    def _wait_sends(self) -> None:
        for _, pending in self._sends:
            pending.wait()
        self._sends.clear()

    def _hand_back(self, st: LocalStage, held: InFlight, micro: int) -> None:
        """After ``st``'s backward of ``micro``: where the previous stage lives on this rank too,
        the input's gradient is its output's (no SEND_B in the list), handed over in place."""
        before = self._local(st.plan.stage - 1)
        if before is None:
            return
        inp = held.inputs.pop(micro)
        below = self._held[before.plan.stage]
        below.grads[micro] = inp.grad
        below.handed.add(micro)

    # -- actions -------------------------------------------------------------
    def _RECV_F(self, a: sch.Action) -> None:
        held = self._on(a)[1]
        held.inputs[a.micro] = self._received_tensor(a).requires_grad_(self._training)

    def _F(self, a: sch.Action) -> None:
        st, held = self._on(a)
        before = None if st.plan.is_first else self._local(st.plan.stage - 1)
        if before is not None:
            # the previous stage runs here: its output is this stage's input, cast as a transfer
            # would cast it, and cut from its graph (each stage's backward is its own action)
            below = self._held[before.plan.stage]
            out = below.outputs[a.micro] if self._training else below.outputs.pop(a.micro)
            held.inputs[a.micro] = out.detach().to(self.dtype).requires_grad_(self._training)
        if st.plan.is_first:
            lo, hi = self._range(st, a.micro)
            inp = self._x[lo:hi]
        else:
            # activations travel in the run's precision; the stage computes from fp32, as the
            # layers would in one process (a bf16 input would keep the residual stream in bf16)
            inp = held.inputs[a.micro].float()
        if self.stash_weights and self._training:
            delay = len(self._stash)  # minibatches whose updates this stage applies before this one's
            version = self._stash[a.micro] = self._new_version()
            if self.predict_weights:
                predict_weights_(version, st.masters, self.optimizer, delay)
            with _weights(st.module, dict(zip(st.names, version))):
                out = st.module(inp)
        else:
            out = st.module(inp)
        if not st.plan.is_last:
            held.outputs[a.micro] = out
            if not self._training and before is not None:
                held.inputs.pop(a.micro)
            return
        lo, hi = self._range(st, a.micro)
        target = self._y[lo:hi]
        if self._training:
            loss = summed_loss(out, target, self._batch, self.label_smoothing)
            held.losses[a.micro] = loss
            self._run.loss = self._run.loss + loss.detach()  # read once, after the step
        else:
            correct, count, loss_sum = eval_counts(out, target)
            self._run.correct += int(correct)
            self._run.count += int(count)
            self._run.loss_sum += loss_sum
            held.inputs.pop(a.micro, None)

    def _SEND_F(self, a: sch.Action) -> None:
        st, held = self._on(a)
        out = held.outputs[a.micro]
        self._send(
            st,
            out.detach().to(self.dtype),
            a.micro,
            self._pieces(st, a.micro, towards_next=True),
            "dst",
            tag=self._tag(a.micro, grad=False, boundary=st.plan.stage),
        )
        if not self._training:
            held.outputs.pop(a.micro)
            held.inputs.pop(a.micro, None)

    def _RECV_B(self, a: sch.Action) -> None:
        self._on(a)[1].grads[a.micro] = self._received_tensor(a)

    def _B(self, a: sch.Action) -> None:
        st, held = self._on(a)
        sync = st.grad_sync if a.reduce else None
        if sync is not None:
            sync.arm()
        version = self._stash.pop(a.micro, None)
        # recomputed layers run their forward again here: give them the same weights (whose
        # gradients are the master weights' buffers: see _new_version)
        with _weights(st.module, dict(zip(st.names, version))) if version is not None else contextlib.nullcontext():
            if st.plan.is_last:
                held.losses.pop(a.micro).backward()
            else:
                out = held.outputs.pop(a.micro)
                grad = held.grads.pop(a.micro)
                torch.autograd.backward(out, grad.to(out.dtype))
                inp = held.inputs.get(a.micro)
                # autograd may hand the received gradient itself on as the input's gradient (a
                # residual stream passes it through): then it is still to be sent
                pooled = a.micro not in held.handed
                held.handed.discard(a.micro)
                if pooled and (inp is None or inp.grad is None or not _same_storage(inp.grad, grad)):
                    self._release(grad)
        if sync is not None:
            sync.backward_done()
            self._last_reduced = sync
        if version is not None:
            self._free_versions.append(version)
        if not st.plan.is_first:
            self._hand_back(st, held, a.micro)

    def _I(self, a: sch.Action) -> None:
        """The input-gradient part of micro-batch ``a.micro``'s backward: the gradient the previous
        stage waits for, and nothing else. The gradients reaching the parameters' own operations
        are kept for the W pass (torch.distributed.pipelining's split of the autograd graph), so
        the two parts together compute one backward once. The first stage's input needs no
        gradient: its I does nothing and its W runs the whole backward."""
        st, held = self._on(a)
        if st.plan.is_first:
            return
        inp = held.inputs[a.micro]
        pooled = a.micro not in held.handed
        held.handed.discard(a.micro)
        if st.plan.is_last:
            outputs, grads = [held.losses.pop(a.micro)], None
        else:
            out, grad = held.outputs.pop(a.micro), held.grads.pop(a.micro)
            outputs, grads = [out], [grad.to(out.dtype)]
        if st.recompute_at_i:
            # Through checkpointed layers, the W pass's autograd calls would each run their
            # forward again (a ViT block: once in I, six times in W; torchtitan issue 773): run
            # the stage's forward once more here, from its input, keeping what both parts need,
            # and split that graph's backward instead. (The layers here draw no random numbers in
            # forward; one with dropout would need the forward's random state replayed, as
            # torch.utils.checkpoint does.)
            out = st.module(inp.float(), checkpointed=False)
            if st.plan.is_last:
                lo, hi = self._range(st, a.micro)
                outputs = [summed_loss(out, self._y[lo:hi], self._batch, self.label_smoothing)]
            else:
                outputs = [out]
        _, held.weight_parts[a.micro] = _split_backward().stage_backward_input(outputs, grads, [inp], st.masters)
        # as in _B: a received gradient handed on as the input's own is still to be sent
        if pooled and grads is not None and (inp.grad is None or not _same_storage(inp.grad, grads[0])):
            held.read_by_w.setdefault(a.micro, []).append(grads[0])
        self._hand_back(st, held, a.micro)

    def _W(self, a: sch.Action) -> None:
        """The weight-gradient part: accumulates into the stage's gradient buckets. Under ``reduce``
        (the stage's last W of the step) each parameter's gradient is final once its part is done:
        its bucket's replica all-reduce starts then, while the pass goes on with the other
        parameters, and runs under the rank's remaining F, I and W work."""
        st, held = self._on(a)
        if st.plan.is_first:
            return self._B(sch.Action(sch.BWD, a.micro, reduce=a.reduce, stage=a.stage))
        sync = st.grad_sync if a.reduce else None
        if sync is not None:
            sync.arm()
        param_of = {_grad_accumulator(p): p for p in st.masters}
        for part in held.weight_parts.pop(a.micro):
            params = [param_of[acc] for acc in part["params"]]
            _split_backward().stage_backward_weight(st.masters, [part])
            if sync is not None:
                for p in params:
                    sync.ready(p)
        if sync is not None:
            sync.backward_done()
            self._last_reduced = sync
        for buf in held.read_by_w.pop(a.micro, []):
            self._release(buf)

    def _SEND_B(self, a: sch.Action) -> None:
        st, held = self._on(a)
        inp = held.inputs.pop(a.micro)
        self._send(
            st,
            inp.grad,
            a.micro,
            self._pieces(st, a.micro, towards_next=False),
            "src",
            tag=self._tag(a.micro, grad=True, boundary=st.plan.stage - 1),
        )
        if a.micro in held.weight_parts:  # its W pass is still to come and reads the input
            held.read_by_w.setdefault(a.micro, []).append(inp)
        else:
            self._release(inp)  # the send holds the gradient it reads

    def _STEP(self, a: sch.Action) -> None:
        syncs = [st.grad_sync for st in self.stages if st.grad_sync is not None]
        if syncs:
            t0 = self.timer.mark()
            for sync in syncs:
                sync.wait()
            self._spans.append((None, "comm_s", t0, self.timer.mark()))
            self._reduced = True
        t0 = self.timer.mark()
        if self.clip is not None:
            self.clip.apply([p for st in self.stages for p in st.module.parameters()], self.comm)
        self.optimizer.step()
        for st in self.stages:
            st.grads.zero()
        self._spans.append((None, "compute_s", t0, self.timer.mark()))

    # every action kind this executor runs, and the method that runs it (DeepSpeed's engine keeps
    # the same kind of table); a schedule with another kind is refused before launch
    ACTIONS = {
        sch.RECV_F: _RECV_F,
        sch.FWD: _F,
        sch.SEND_F: _SEND_F,
        sch.RECV_B: _RECV_B,
        sch.BWD: _B,
        sch.BWD_I: _I,
        sch.BWD_W: _W,
        sch.SEND_B: _SEND_B,
        sch.STEP: _STEP,
    }

    @classmethod
    def unsupported(cls, lists: list[list[sch.Action]]) -> list[str]:
        """The action kinds of ``lists`` this executor has no method for (empty: it runs them all)."""
        return sorted({a.op for acts in lists for a in acts} - set(cls.ACTIONS))
