"""AshPipe (Hosoki et al., HPC Asia 2024) on our runtime, with Switch Parallelism in one job.

- Asynchronous PipeDream-style 1F1B: one minibatch at a time, no flush; each
  stage steps its optimizer after every backward
  (:func:`harness.runtime.actions.async_step`).
- Weight stashing: a forward runs on a copy of the stage's weights, kept until
  that minibatch's backward, so the backward uses exactly the weights its
  forward used (the executor's ``stash_weights``); stage s keeps at most
  ``S - s`` (warm-up + 1) copies besides its master weights.
- Non-uniform replicas: ``strategy.replicas=[n_0, ...]``; every stage processes
  the whole global batch, replica r of n taking ``(B + r) // n`` samples;
  activations and gradients move many-to-many between overlapping slices;
  each stage all-reduces (SUM) its gradients over its replicas after every
  backward (the loss is summed and divided by B). Parameters are broadcast
  from each stage's first rank at start.
- Planner (``strategy.replicas`` unset): :mod:`harness.planning.planner`, on
  layer costs measured on rank 0 and bandwidth measured between the workers.
- Switch Parallelism: plain data parallelism first, then the hybrid plan inside
  the same job. The switch comes after ``strategy.switch_step`` steps,
  ``strategy.switch_epoch`` epochs or ``strategy.switch_fraction`` of the run,
  or when DP's loss stops improving (``strategy.switch_plateau``, see
  :mod:`harness.strategies.ashpipe.switch`); the record says when and why (``switch_step``,
  ``switch_reason`` in each rank's layout). At the switch every rank already holds all weights and
  optimizer state (DP replicas are identical), so each keeps its stage's
  parameters and their optimizer state and drops the rest; nothing is sent.
  A checkpoint of each rank's stage is written at the switch
  (``<run dir>/switch_checkpoint/rank<r>.pt``) and ``strategy.resume_from``
  starts a later job from it in hybrid mode.
- Staleness mitigations, off by default (plain AshPipe is the paper's method): a stage whose
  gradients arrive d updates after its forward can run that forward on weights predicted d
  updates ahead (``strategy.weight_prediction``: SpecTrain for momentum SGD, XPipe for AdamW;
  :func:`harness.core.training.predict_weights_`), stashed for its backward, and can divide its
  learning rate by its delay, annealed away over ``strategy.lr_correction_steps`` (PipeMare,
  ``strategy.lr_correction``; :func:`harness.core.training.delay_lr_scale`).
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass
from typing import Any, Optional

import torch

from harness.core.errors import ConfigError
from harness.core.models import build_layers
from harness.core.options import bounded, choice
from harness.core.training import delay_lr_scale
from harness.metrics.meter import optimizer_state_tensors
from harness.planning.in_job import plan_in_job
from harness.planning.planner import plan
from harness.planning.simulator import SimLayout, scaled_profile
from harness.runtime import actions as sch
from harness.runtime import schedules
from harness.runtime.executor import StageExecutor
from harness.runtime.schedules import ASYNC
from harness.strategies.ashpipe.checkpoints import checkpointed_layout, load_switch, save_switch, switch_folder
from harness.strategies.ashpipe.data_parallel_phase import DataParallelPhase
from harness.strategies.ashpipe.switch import SWITCH_KEYS, fixed_reason, plateau, switch_step, switch_window
from harness.strategies.base import Strategy, StrategyConfig, summed_eval
from harness.strategies.layout import Partition, check_layout, refuse_unrunnable, simulated_pipeline
from harness.strategies.pipeline import build_pipeline


@dataclass
class AshPipeConfig(StrategyConfig):
    # replicas per stage, e.g. [2, 1] (non-uniform; sums to world_size); unset: the planner chooses
    replicas: Optional[list[int]] = None
    # first layer of stages 1..S-1 with strategy.replicas; unset: balanced on measured cost
    boundaries: Optional[list[int]] = None
    schedule: str = ASYNC  # the only schedule AshPipe has: asynchronous 1F1B, no flush
    # activation recomputation with strategy.replicas (the planner decides its own)
    recompute: Any = "none"
    # how to choose replicas and boundaries when strategy.replicas is unset (auto: the planner)
    plan: str = choice("auto", "auto")
    # planner: memory per worker in GiB (None: the GPU's memory; unlimited on CPU)
    memory_limit: Optional[float] = bounded(None, 0, above=True)
    # planner: assumed point-to-point and all-reduce bandwidth in GB/s (None: measured between workers)
    bandwidth_gbps: Optional[float] = bounded(None, 0, above=True)
    # Switch Parallelism: plain DP for this many steps (or epochs, or this fraction of the run), then the
    # hybrid plan
    switch_step: Optional[int] = bounded(None, 0)
    switch_epoch: Optional[int] = bounded(None, 0)  # Switch Parallelism: DP for this many epochs, then hybrid
    switch_fraction: Optional[float] = bounded(None, 0, 1)  # ... or for this fraction of the run's steps
    # ... or once DP's mean loss over the last switch_window steps (unset: an epoch's) improved by less
    # than this fraction on the window before it
    switch_plateau: Optional[float] = bounded(None, 0, above=True)
    switch_window: Optional[int] = bounded(None, 1)  # the plateau rule's window in steps (unset: an epoch)
    # start in hybrid mode from a switch checkpoint directory
    resume_from: Optional[str] = None
    # replica gradient all-reduce bucket size (MiB)
    bucket_mb: float = bounded(4.0, 0, above=True)
    # staleness mitigations: forward on weights predicted over the stage's delay (SpecTrain / XPipe) ...
    weight_prediction: bool = False
    # ... and a stale stage's learning rate divided by its delay, annealed to the full rate over
    # lr_correction_steps of the hybrid pipeline (unset: an epoch's) (PipeMare)
    lr_correction: bool = False
    lr_correction_steps: Optional[int] = bounded(None, 1)  # the correction's annealing (unset: an epoch)


def lr_correction_steps(spec) -> int:
    return spec.strategy.lr_correction_steps or spec.steps_per_epoch


class AshPipeStrategy(Strategy):
    name = "ashpipe"
    Config = AshPipeConfig
    checkpoint_changes_training = True  # quiesce drains the pipeline

    @classmethod
    def check(cls, spec) -> None:
        st = spec.strategy
        if st.schedule != ASYNC:
            raise ConfigError(f"strategy.schedule={st.schedule}: strategy=ashpipe runs {ASYNC} only")
        if st.replicas is not None:
            check_layout(spec, list(st.replicas))
        elif spec.world_size > spec.train.global_batch:
            raise ConfigError(f"world_size={spec.world_size} exceeds train.global_batch={spec.train.global_batch}")
        # a minibatch per stage and one more: every action kind of the schedule, for the executor's check
        stages = len(st.replicas) if st.replicas is not None else min(2, spec.world_size)
        refuse_unrunnable(schedules.get(ASYNC), stages, 1, stages + 1)
        given = [f"strategy.{key}={getattr(st, key)}" for key in SWITCH_KEYS if getattr(st, key) is not None]
        if len(given) > 1:
            raise ConfigError(f"{' and '.join(given)} both say when to switch; give one")
        if st.switch_window is not None and st.switch_plateau is None:
            raise ConfigError(f"strategy.switch_window={st.switch_window} applies with strategy.switch_plateau only")
        k = switch_step(spec)
        # (a run that checkpoints may be one segment of a longer one, continued with train.resume)
        if k is not None and (k > spec.steps and not spec.train.checkpoint_every):
            raise ConfigError(f"the switch to the hybrid plan (step {k}) must lie within the run's {spec.steps} steps")
        if st.resume_from and not os.path.isdir(st.resume_from):
            raise ConfigError(f"strategy.resume_from={st.resume_from} is not a directory with a switch checkpoint")
        if st.resume_from and spec.train.resume:
            raise ConfigError(
                "strategy.resume_from (a switch checkpoint) and train.resume (a run's checkpoint) both "
                "say where to start; give one"
            )
        if spec.train.resume:
            checkpointed_layout(spec, 0)  # an AshPipe checkpoint, or one line saying it is not
        if st.memory_limit is not None and st.replicas is None:
            check_memory_limit_is_reachable(spec)
        if st.weight_prediction and spec.train.optimizer == "sgd" and spec.train.momentum == 0:
            raise ConfigError(
                "strategy.weight_prediction extrapolates along SGD's momentum, and train.momentum=0 "
                "has none: set train.momentum (e.g. 0.9) or use train.optimizer=adamw"
            )
        if st.lr_correction_steps is not None and not st.lr_correction:
            raise ConfigError(
                f"strategy.lr_correction_steps={st.lr_correction_steps} applies with strategy.lr_correction=true only"
            )

    @classmethod
    def reference_layout(cls, spec) -> tuple[list[int], int]:
        if switch_step(spec) is None:
            raise ConfigError(
                "strategy.switch_plateau decides the switch during the run; the reference needs a fixed "
                "one (strategy.switch_step, switch_epoch or switch_fraction)"
            )
        if spec.strategy.boundaries is None:
            raise ConfigError(
                "strategy=ashpipe without strategy.boundaries: the planner cuts the model from timings "
                "taken at the start of the run; give the cut (strategy.boundaries=[...]) to compare"
            )
        return list(spec.strategy.boundaries), switch_step(spec)

    @classmethod
    def samples_per_forward(cls, spec) -> int:
        st = spec.strategy
        return max(1, spec.train.global_batch // (min(st.replicas) if st.replicas is not None else spec.world_size))

    @classmethod
    def variant(cls, spec) -> str:
        st = spec.strategy
        parts = [f"replicas={list(st.replicas)}" if st.replicas is not None else "planned"]
        if st.switch_plateau is not None:
            parts.append(f"SP@plateau<{st.switch_plateau:g}/{switch_window(spec)} steps")
        elif st.switch_fraction:
            parts.append(f"SP@{100 * st.switch_fraction:.3g}%")
        elif st.switch_step or st.switch_epoch:
            parts.append(f"SP@{'epoch ' + str(st.switch_epoch) if st.switch_epoch else st.switch_step}")
        if st.weight_prediction:
            parts.append("weight prediction")
        if st.lr_correction:
            parts.append(f"lr/delay over {lr_correction_steps(spec)} steps")
        return ", ".join(parts)

    @classmethod
    def simulated(cls, spec, profile, cluster):
        st = spec.strategy
        if st.replicas is not None:
            return simulated_pipeline(
                spec,
                profile,
                list(st.replicas),
                ASYNC,
                hides_allreduce=False,
                recompute_rule=st.recompute,
                stashes_weights=True,
                micro_batches=1,
            )
        # the planner sees the cluster's devices and network, as it would in a job there
        chosen = plan(
            scaled_profile(profile, cluster, cluster.network()),
            spec.world_size,
            spec.train.global_batch,
            cluster.memory_gib * 2**30,
        )
        return SimLayout(
            st.name,
            chosen.replicas,
            chosen.boundaries,
            1,
            ASYNC,
            set(chosen.recompute_layers),
            hides_allreduce=False,
            stashes_weights=True,
        )

    def __init__(self, spec, layers, ctx, comm):
        super().__init__(spec, layers, ctx, comm)
        self.calls = 0
        self.entered = 0  # minibatches that entered the hybrid pipeline since it last filled
        self.drains, self.drain_s = 0, 0.0  # checkpoints' drains of the pipeline, and their time
        self.switch_at = switch_step(spec)  # None: the plateau rule decides; then the step it did
        self.switch_reason: str | None = None
        self.hybrid_start = 0  # the step at which the hybrid pipeline began (its stages' delays with it)
        self.plan_report: str | None = None
        self._dp: DataParallelPhase | None = None
        self.executor: StageExecutor | None = None
        # a run resuming from its checkpoint (train.resume) rebuilds the layout it was written with
        self._restored = checkpointed_layout(spec, ctx.rank)
        if spec.strategy.resume_from:
            self._build_hybrid(optimizer_state=None)
            self._load_switch_checkpoint(spec.strategy.resume_from)
        elif self._restored is not None:
            if self._restored["mode"] == "dp":
                self._dp = DataParallelPhase(spec, layers, ctx, comm, global_losses=self.switch_at is None)
            else:
                self._build_hybrid(optimizer_state=None)
        elif self.switch_at is None or self.switch_at > 0:
            self._dp = DataParallelPhase(spec, layers, ctx, comm, global_losses=self.switch_at is None)
        else:
            self._build_hybrid(optimizer_state=None)

    # -- layouts --------------------------------------------------------------
    def _layout(self) -> tuple[list[int], Partition | None, set[int] | None]:
        """Replicas, partition and recomputed layers: from the config (the partition then follows
        the shared rule), or from the planner."""
        if self._restored is not None and self._restored["mode"] == "hybrid":
            restored = self._restored
            return restored["replicas"], Partition(restored["boundaries"], "resumed"), set(restored["recompute"])
        if self.spec.strategy.replicas is not None:
            return list(self.spec.strategy.replicas), None, None
        chosen, report = plan_in_job(self.spec, self.layers, self.ctx, self.comm)
        self.plan_report = report
        return chosen.replicas, Partition(chosen.boundaries, "planned"), set(chosen.recompute_layers)

    def _build_hybrid(self, optimizer_state: torch.optim.Optimizer | None) -> None:
        replicas, partition, recompute = self._layout()
        spec = self.spec
        self.hybrid_start = self.calls

        def corrected(delay: int):  # PipeMare: a stage's rate divided by its delay, annealed away
            return delay_lr_scale(delay, lambda: self.hybrid_start, lr_correction_steps(spec))

        pipe = build_pipeline(
            spec,
            self.layers,
            self.ctx,
            self.comm,
            replicas,
            partition=partition,
            recompute=recompute,
            asynchronous=True,
            lr_scale=corrected if spec.strategy.lr_correction else None,
            steps_done=self.calls,
            optimizer_state=optimizer_state,
        )
        self.partition, self.build, self.plan = pipe.partition, pipe.build, pipe.plan
        self.params, self.optimizer, self.executor = pipe.params, pipe.optimizer, pipe.executor
        self.eval_actions = schedules.get(ASYNC).forward_only(self.plan.topo.num_stages, 1, 1)[self.plan.stage]

    def _switch(self) -> None:
        dp_optimizer = self._dp.optimizer
        self._dp.close()
        self._dp = None
        self._build_hybrid(optimizer_state=dp_optimizer)
        del dp_optimizer  # its state of the layers this rank no longer trains goes with it
        # the data-parallel phase put every layer on this device: keep only this stage's there
        owned = set(self.owned_layers())
        for i, layer in enumerate(self.layers):
            if i not in owned:
                layer.to("cpu")
        if self.ctx.device.type == "cuda":
            torch.cuda.empty_cache()
        self._save_switch_checkpoint()

    # -- checkpoints ------------------------------------------------------------
    def _save_switch_checkpoint(self) -> None:
        folder = switch_folder(self.spec.output_dir)
        if folder is None:
            return
        save_switch(
            folder,
            self.ctx.rank,
            {
                **self.checkpoint_state(),
                "step": self.calls,
                "replicas": list(self.plan.topo.replicas),
                "boundaries": self.partition.boundaries,
                "model": self.spec.model.name,
            },
        )

    def _load_switch_checkpoint(self, folder: str) -> None:
        state = load_switch(folder, self.ctx.rank, self.ctx.device, self.plan.topo.replicas)
        self.load_checkpoint_state(state)
        self.calls = self.hybrid_start = state["step"]

    def start_step(self) -> int:
        return self.calls

    def quiesce(self) -> None:
        """Drain the pipeline for a checkpoint: every minibatch in flight finishes its backward and
        step, every send completes; the next minibatch fills the pipeline again from empty (its
        warm-up repeated), so a run that checkpoints differs from one that never does, and a
        resumed run equals the uninterrupted run with the same checkpoints."""
        if self.executor is None or self.entered == 0:
            return
        started = time.perf_counter()
        drain = sch.async_drain(self.plan.topo.num_stages, self.plan.stage, self.entered)
        self.executor.run(drain, None, None, training=True, flush=False)
        self.executor.drain_sends()
        self.entered = 0
        self.drains += 1
        self.drain_s += time.perf_counter() - started

    def checkpoint_state(self) -> dict:
        """This rank's weights and optimizer state (the whole model's in the data-parallel phase of
        Switch Parallelism), its step, and the layout it trains, which a resumed run rebuilds
        instead of planning again. The pipeline is drained (:meth:`quiesce`)."""
        state = {
            "step": self.calls,
            "drains": self.drains,
            "switch_at": self.switch_at,
            "switch_reason": self.switch_reason,
            "hybrid_start": self.hybrid_start,
        }
        if self._dp is not None:
            params = {
                f"{i}.{n}": p.detach().cpu().clone()
                for i, layer in enumerate(self.layers)
                for n, p in layer.named_parameters()
            }
            return {
                **state,
                "mode": "dp",
                "layers": list(range(len(self.layers))),
                "params": params,
                "optimizer": self._dp.optimizer.state_dict(),
                "dp_losses": list(self._dp.global_losses()),
            }
        return {
            **super().checkpoint_state(),
            **state,
            "mode": "hybrid",
            "replicas": list(self.plan.topo.replicas),
            "boundaries": list(self.partition.boundaries),
            "recompute": sorted(self.build.recompute),
        }

    def load_checkpoint_state(self, state: dict) -> None:
        if state.get("mode") == "dp":
            with torch.no_grad():
                for i, layer in enumerate(self.layers):
                    for n, p in layer.named_parameters():
                        p.copy_(state["params"][f"{i}.{n}"])
            self._dp.optimizer.load_state_dict(state["optimizer"])
            self._dp.losses = list(state.get("dp_losses", []))
        else:
            super().load_checkpoint_state(state)
        self.calls, self.drains, self.entered = state["step"], state.get("drains", 0), 0
        self.switch_at = state.get("switch_at", self.switch_at)
        self.switch_reason = state.get("switch_reason", self.switch_reason)
        self.hybrid_start = state.get("hybrid_start", self.hybrid_start)

    def memory_step_context(self):
        """The measured step starts and ends with no transfer in flight.

        Asynchronous steps leave sends in flight across calls; a transfer that
        starts before the profiler and ends inside it (or the reverse) crashed
        the process under load. Waiting for them here cannot deadlock: every
        send of a call is received by the neighbours within their next call,
        before they need anything more from this rank."""
        return contextlib.nullcontext() if self.executor is None else self.executor.settled()

    # -- training -------------------------------------------------------------
    def _switch_now(self) -> bool:
        if self.switch_at is not None:
            if self.calls != self.switch_at:
                return False
            self.switch_reason = fixed_reason(self.spec, self.switch_at)
            return True
        why = plateau(self._dp.global_losses(), switch_window(self.spec), self.spec.strategy.switch_plateau)
        if why is not None:
            self.switch_at, self.switch_reason = self.calls, why
        return why is not None

    def train_step(self, x, y):
        if self._dp is not None and self._switch_now():
            self._switch()
        self.calls += 1
        if self._dp is not None:
            return self._dp.train_step(x, y)
        actions = sch.async_step(self.plan.topo.num_stages, self.plan.stage, self.entered)
        self.entered += 1
        self.build.module.train()
        run = self.executor.run(actions, x, y, training=True, flush=False)
        self.step_stats.append(run.step_stats())
        return run.loss

    def finish_training(self) -> None:
        """Drain the minibatches still in flight (their backwards and steps), then settle sends."""
        if self._dp is not None and self.switch_at is None:
            self.switch_reason = f"no switch: the plateau rule did not fire in {self.calls} steps"
        if self.executor is None:
            return
        drain = sch.async_drain(self.plan.topo.num_stages, self.plan.stage, self.entered)
        self.executor.run(drain, None, None, training=True, flush=False)
        self.executor.drain_sends()

    @torch.no_grad()
    def evaluate(self, x, y):
        if self._dp is not None:
            return self._dp.evaluate(x, y)
        self.build.module.eval()
        run = self.executor.run(self.eval_actions, x, y, training=False)
        return summed_eval(self.comm, (run.correct, run.count, run.loss_sum))

    def memory_parts(self):
        if self._dp is not None:
            return self._dp.memory_parts()
        return {
            "parameters": self.params,
            "optimizer_state": optimizer_state_tensors(self.optimizer),
            "stashed_weights": self.executor.stashed_tensors(),
        }

    def layout(self):
        if self.executor is None:
            return {
                "stage": "dp",
                "layers": [0, len(self.layers)],
                "switch_step": None,
                "switch_reason": self.switch_reason,
            }
        return {
            "stage": self.plan.stage,
            "replica": self.plan.replica,
            "layers": list(self.build.layer_range),
            "boundaries": self.partition.boundaries,
            "replicas": list(self.plan.topo.replicas),
            "recompute": sorted(self.build.recompute),
            "switch_step": self.switch_at,
            "switch_reason": self.switch_reason,
        }

    def extra_metrics(self):
        figures = {"drains": self.drains, "drain_s": self.drain_s}
        return {**figures, "plan": self.plan_report} if self.plan_report and self.ctx.rank == 0 else figures

    def recomputed_layers(self):
        if self.executor is None:
            return {}
        return {i: 1 / self.plan.topo.replicas[self.plan.stage] for i in self.build.recompute}

    def owned_layers(self):
        return range(len(self.layers)) if self._dp is not None else range(*self.build.layer_range)


def check_memory_limit_is_reachable(spec) -> None:
    """Refuse before launch a limit no plan can meet, from parameter counts alone.

    Whatever the plan, the stage holding a layer keeps its weights, its gradient,
    the optimizer's state and at least one stashed version, so no worker needs
    less than that for the largest layer (counted on the meta device, no memory)."""
    with torch.device("meta"):
        layers = build_layers(spec.model, spec.seed)
    largest = max(sum(p.numel() * p.element_size() for p in layer.parameters()) for layer in layers)
    floor = largest * (1 + 1 + 2 + 1)  # weights, gradient, AdamW's two moments, one stashed version
    if floor > spec.strategy.memory_limit * 2**30:
        raise ConfigError(
            f"no AshPipe plan fits strategy.memory_limit={spec.strategy.memory_limit} GiB: the largest layer of "
            f"{spec.model.name} alone needs {floor / 2**30:.3g} GiB with its gradient, optimizer state and one "
            "stashed version; raise the limit"
        )
