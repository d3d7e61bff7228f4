"""The one interface every training strategy implements, ours and the baselines.

A strategy is the harness's only plug-in point. Everything the rest of the
harness needs to know about one is asked of its class, never decided by
comparing its name:

- ``name`` and ``Config``: the strategy's name (``strategy=<name>``, the file
  ``conf/strategy/<name>.yaml`` whose ``_target_`` names the class) and the
  dataclass of the ``strategy.*`` keys it reads, with their defaults;
- ``complete(spec)`` and ``check(spec)``: fill in defaults that depend on the rest of
  the spec, then refuse before launch what it cannot run;
- ``processes``, ``takes_micro_batches``, ``samples_per_forward``: how many
  workers it starts, whether micro-batches apply, the batch one worker
  computes per forward (what a profile is measured at);
- ``variant``: the label that tells two runs of it apart in a table;
- ``simulated``: its layout for the scale-out simulator.

On every rank an instance is built from the model's layer list and the run
spec, then driven by :mod:`harness.run.worker` one global batch at a time. It
owns how the batch is split, where layers live, how gradients are combined and
when the optimizer steps; the worker owns timing, memory measurement, data
order and evaluation bookkeeping, so those are identical for all strategies.

Every method receives ``spec``, the validated run spec
(:class:`harness.config.spec.RunSpec`, built a layer above): ``spec.strategy`` is
an instance of the class's own ``Config``.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar, Iterable, Optional, Sequence

import torch
from torch import nn

from harness.core.comm import Comm, DistContext
from harness.core.errors import ConfigError
from harness.core.options import bounded
from harness.core.vocabulary import WHOLE_MINIBATCH_STRATEGIES
from harness.planning.planner import Profile
from harness.planning.simulator import Cluster, SimLayout
from harness.runtime import actions as sch
from harness.runtime import schedules


@dataclass
class StrategyConfig:
    """The keys every strategy has. Subclasses add the ``strategy.*`` keys a strategy reads."""

    name: str = ""


@dataclass
class PipelineKeys(StrategyConfig):
    """Keys shared by the pipeline strategies. A sweep over strategies may set them for all
    (``-m strategy=dp,hippie strategy.recompute=none``): a strategy without the concept
    records that it ignored them, instead of refusing the run; a strategy that has the concept
    but not the value asked for (DeepSpeed's schedule=gpipe) refuses it in one line."""

    # pipeline stages (ranks per pipeline); unset: 2, or 1 on a single worker
    stages: Optional[int] = bounded(None, 1)
    # index of the first layer of stages 1..S-1; unset: balanced on measured cost
    boundaries: Optional[list[int]] = None
    schedule: str = "1f1b"  # a name of the schedule registry this strategy runs (docs/reference/schedules.md)
    # activation recomputation: none | auto | all | a list of layer indices
    recompute: Any = "none"


@dataclass
class MultiStageKeys(PipelineKeys):
    """The keys of a pipeline strategy whose ranks may hold several stages (interleaved and V
    schedules, in the placement the schedule registry gives them)."""

    # stages each rank holds (v): 1 for the one-stage schedules; unset: the schedule's default (2)
    stages_per_rank: Optional[int] = bounded(None, 1)


def multi_stage_variant(st: MultiStageKeys, *, recompute_first: bool) -> str:
    """A multi-stage pipeline strategy's ``variant``: its schedule where not 1F1B, its stages per
    rank where more than one, its recomputation where any. ``recompute_first``: the recomputation
    leads (Hippie's records hold it first, torch pipelining's last; kept, so that each one's new
    runs pair with its recorded ones)."""
    recompute = [f"recompute={st.recompute}"] if st.recompute not in ("none", None) else []
    schedule = [st.schedule] if st.schedule != "1f1b" else []
    per_rank = [f"v={st.stages_per_rank}"] if st.stages_per_rank > 1 else []
    return ", ".join(recompute + schedule + per_rank if recompute_first else schedule + per_rank + recompute)


PIPELINE_KEYS = frozenset(("stages", "boundaries", "schedule", "recompute"))


@dataclass
class EvalResult:
    correct: int
    count: int
    loss_sum: float


class Strategy(ABC):
    """Base class. Subclasses implement the abstract methods; see each docstring."""

    name: ClassVar[str] = ""
    Config: ClassVar[type] = StrategyConfig
    # False: the strategy moves whole minibatches; a sweep's train.micro_batches is recorded as 1.
    # Set from the vocabulary (WHOLE_MINIBATCH_STRATEGIES), which the tables read too.
    takes_micro_batches: ClassVar[bool] = True
    # True: a checkpoint changes the training that follows it (quiesce drains an asynchronous
    # pipeline), so a preempted run stops only where every run checkpoints (harness.run.worker)
    checkpoint_changes_training: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        cls.takes_micro_batches = cls.name not in WHOLE_MINIBATCH_STRATEGIES

    def __init__(self, spec, layers: list[nn.Module], ctx: DistContext, comm: Comm):
        self.spec, self.ctx, self.comm = spec, ctx, comm
        self.layers = layers
        # per train_step: where this rank's time went ({compute_s, comm_s, idle_s, events});
        # strategies that cannot split their time leave it empty
        self.step_stats: list[dict] = []
        # where a pipeline cut the layer list (harness.strategies.layout.Partition); None: no cut
        self.partition = None

    # -- what the harness asks of the class, before any process starts -------------
    @classmethod
    def complete(cls, spec) -> None:
        """Fill in the strategy's keys whose defaults depend on the rest of the spec (runs before
        ``check``, so the record shows the value a run used). A pipeline's ``strategy.stages``
        unset is 2, or 1 on a single worker (a sweep over world sizes then runs every point)."""
        st = spec.strategy
        if isinstance(st, PipelineKeys) and st.stages is None:
            st.stages = min(2, spec.world_size)
        if isinstance(st, MultiStageKeys) and st.stages_per_rank is None and st.schedule in schedules.SCHEDULES:
            st.stages_per_rank = schedules.SCHEDULES[st.schedule].default_stages_per_rank

    @classmethod
    def default_micro_batches(cls, spec) -> int:
        """``train.micro_batches`` when unset (after :meth:`complete`): 1 without pipeline stages;
        for a synchronous pipeline of S stages in all (stages per rank included), the largest count
        from 2S down to S that splits each pipeline's share of the batch evenly, 2S if none does
        (:meth:`check` then says why). Two per stage keep 1F1B's bubble at (p-1)/(3p-1) and meet
        every schedule's rule (at least one per stage; DualPipeV's two per rank's stage pair)."""
        stages = getattr(spec.strategy, "stages", None) or 1
        found = cls.schedule(spec)
        if not cls.takes_micro_batches or stages <= 1 or (found and found[0].asynchronous):
            return 1
        total = stages * (found[1] if found else 1)
        share = spec.train.global_batch // max(1, spec.world_size // stages)  # one pipeline's samples
        return next((m for m in range(2 * total, total - 1, -1) if share % m == 0), 2 * total)

    @classmethod
    def check(cls, spec) -> None:
        """Refuse a spec this strategy cannot run (raise ConfigError); runs before launch."""

    @classmethod
    def processes(cls, spec) -> int:
        """Worker processes to start: one per device, unless one process drives several (GPipe)."""
        return spec.world_size

    @classmethod
    def gpus(cls, spec) -> int:
        """GPUs a run needs on one host when the harness starts all its workers (one per worker)."""
        return spec.world_size

    @classmethod
    def samples_per_forward(cls, spec) -> int:
        """Samples one worker puts through a forward at a time (a profile is measured at this size)."""
        return max(1, spec.train.global_batch // spec.world_size)

    @classmethod
    def variant(cls, spec) -> str:
        """The options that tell two runs of this strategy apart in a table ('' for none)."""
        return ""

    @classmethod
    def reference_layout(cls, spec) -> tuple[list[int], int]:
        """(stage boundaries, synchronous steps first) with which AshPipe's single-process reference
        (harness.strategies.ashpipe.reference, ``pipebench stability``) computes this run's
        updates; raises ConfigError where it cannot. A synchronous strategy computes plain
        single-process training's updates (its equivalence tests): one stage."""
        return [], 0

    @classmethod
    def schedule(cls, spec) -> tuple[schedules.Schedule, int] | None:
        """The registry's entry of the pipeline schedule this run follows, with its stages per
        rank; None for a strategy without one (data parallelism)."""
        name = getattr(spec.strategy, "schedule", None)
        if name not in schedules.SCHEDULES:
            return None
        schedule = schedules.SCHEDULES[name]
        return schedule, getattr(spec.strategy, "stages_per_rank", None) or schedule.default_stages_per_rank

    @classmethod
    def analytic_bubble(cls, spec, stages: int) -> float:
        """The idle fraction a balanced pipeline of this kind has on paper, over ``stages`` ranks
        per pipeline (the schedule's own, :meth:`harness.runtime.schedules.Schedule.analytic_bubble`);
        (p - 1) / (m + p - 1) for a synchronous pipeline without a registered schedule, 0 without
        stages to wait for."""
        found = cls.schedule(spec)
        if found is None:
            return (stages - 1) / (spec.train.micro_batches + stages - 1)
        schedule, v = found
        return schedule.analytic_bubble(stages, v, spec.train.micro_batches)

    @classmethod
    def replayed_schedule(cls, spec, stages: int) -> tuple[list[list[sch.Action]], list[int] | None] | None:
        """The action lists a run of this strategy follows, one per rank position of a pipeline, to
        replay its measured costs (``bubble_replayed``), with the rank position of each stage where
        a rank holds several (else None): a pipeline's schedule over ``train.micro_batches``; None
        where there is no synchronous pipeline schedule to replay."""
        found = cls.schedule(spec)
        if stages < 2 or found is None or found[0].asynchronous:
            return None
        schedule, v = found
        return schedule.lists(stages, v, spec.train.micro_batches), schedule.placement_of(stages, v)

    @classmethod
    def simulated(cls, spec, profile: Profile, cluster: Cluster) -> SimLayout:
        """This strategy's layout for :func:`harness.planning.simulator.predict`."""
        raise ConfigError(f"strategy={cls.name} has no model in the simulator")

    # -- what a rank does ---------------------------------------------------------
    @abstractmethod
    def train_step(self, x: torch.Tensor, y: torch.Tensor) -> float:
        """One optimizer step on the global batch ``(x, y)`` (every rank gets all of it).

        Returns this rank's share of the global mean loss: the shares of all ranks
        sum to it (ranks that compute no loss return 0). Summing happens once at
        the end of the run, so no step pays for an extra collective.
        Gradients must be released (``set_to_none``) before returning, so that
        only resident state is live between steps.
        """

    @abstractmethod
    def evaluate(self, x: torch.Tensor, y: torch.Tensor) -> EvalResult:
        """Forward-only pass on a global batch; the totals must be valid on rank 0."""

    @abstractmethod
    def memory_parts(self) -> dict[str, Iterable[torch.Tensor]]:
        """This rank's ``parameters``, ``optimizer_state`` and (if any) ``stashed_weights``.

        Only for the breakdown of the measured peak and to find gradients
        (harness.metrics.meter): the peak itself is what the allocator holds, whatever is named here.
        """

    def start_step(self) -> int:
        """The step to start from (non-zero when resuming from a checkpoint)."""
        return 0

    def finish_training(self) -> None:
        """Called once after the last step, before evaluation (an asynchronous pipeline drains here)."""

    def quiesce(self) -> None:
        """Bring this rank to a state a checkpoint can hold, before :meth:`checkpoint_state`: an
        asynchronous pipeline finishes the minibatches in flight (and refills from the next step);
        a synchronous strategy is always there between steps. Collective."""

    def memory_step_context(self):
        """Context for the one step whose memory is measured (see harness.metrics.meter)."""
        return contextlib.nullcontext()

    def extra_metrics(self) -> dict:
        """Strategy-specific per-rank figures for the record (e.g. time split, events)."""
        return {}

    def layout(self) -> dict:
        """What this rank runs (stage, replica, layers), for the record."""
        return {}

    def recomputed_layers(self) -> dict[int, float]:
        """Layers whose forward this rank runs again in backward (activation checkpointing), each
        with the share of the global batch it recomputes (for the hardware FLOPs, HFU)."""
        return {}

    def owned_layers(self) -> Sequence[int]:
        """Indices of the layers whose parameters this rank holds, ascending (all, unless a pipeline
        stage; not always contiguous where a rank holds several stages)."""
        return range(len(self.layers))

    def state_dict_for_check(self) -> dict[str, torch.Tensor]:
        """Copies of this rank's parameters keyed by their name in the full layer list."""
        return {k: v.detach().cpu().clone() for k, v in named_parameters(self.layers, self.owned_layers()).items()}

    def checkpoint_state(self) -> dict:
        """What this rank needs to continue training exactly: its parameters and optimizer state."""
        return {
            "layers": list(self.owned_layers()),
            "params": self.state_dict_for_check(),
            "optimizer": self.optimizer.state_dict(),
        }

    def load_checkpoint_state(self, state: dict) -> None:
        if state["layers"] != list(self.owned_layers()):
            raise ConfigError(
                f"the checkpoint holds layers {state['layers']} but this rank owns "
                f"{list(self.owned_layers())}; resume with the same strategy, world size and stage "
                "boundaries"
            )
        params = named_parameters(self.layers, self.owned_layers())
        with torch.no_grad():
            for k, v in state["params"].items():
                params[k].copy_(v)
        self.optimizer.load_state_dict(state["optimizer"])


def summed_eval(comm: Comm, counts: tuple[float, float, float]) -> EvalResult:
    """Sum every rank's evaluation counts (ranks that saw no samples pass zeros)."""
    stats = torch.tensor(counts, dtype=torch.float64, device=comm.ctx.device)
    comm.all_reduce(stats)
    return EvalResult(int(stats[0]), int(stats[1]), float(stats[2]))


def named_parameters(layers: list[nn.Module], indices: Iterable[int]) -> dict[str, nn.Parameter]:
    """Parameters of the given layers keyed ``"<layer index>.<name>"`` (stable across layouts)."""
    return {f"{i}.{n}": p for i in indices for n, p in layers[i].named_parameters()}
