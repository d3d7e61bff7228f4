"""DeepSpeed's pipeline engine, as its users run it (without DeepSpeed's launcher).

``deepspeed.pipe.PipelineModule`` over the same layer list, cut at the same
stage boundaries as our runtime (``strategy.partition_method=harness``), or
DeepSpeed's own ``parameters`` / ``uniform`` / ``type:<regex>`` partitioning
when asked. ``engine.train_batch`` runs DeepSpeed's synchronous 1F1B with a
flush over ``train.micro_batches`` micro-batches (gradient accumulation
steps), with data-parallel width ``world_size / stages``: uniform across
stages, so AshPipe's non-uniform replicas cannot be expressed.

On CPU it runs with ``DS_ACCELERATOR=cpu`` over our gloo process group.
DeepSpeed JIT-builds a small shared-memory communication op the first time;
it is built before training starts (never inside a timed step) and cached in
the project's ``.cache/torch_extensions``.
"""

from __future__ import annotations

import functools
import logging
import os
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F

from harness.core.errors import ConfigError
from harness.core.training import make_optimizer, mean_loss
from harness.metrics.meter import optimizer_state_tensors
from harness.runtime import actions as sch
from harness.strategies.base import PipelineKeys, Strategy, summed_eval
from harness.strategies.layout import (
    Partition,
    check_layout,
    micro_batch_samples,
    resolve_boundaries,
    simulated_pipeline,
    uniform_replicas,
)

_CHECKOUT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def prepare_environment(device: str) -> None:
    """Set before ``import deepspeed``: the accelerator and where its JIT ops are cached (the
    checkout's ``.cache/``; an installed package leaves torch's default, ``~/.cache``)."""
    if device == "cpu":
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    if os.path.isfile(os.path.join(_CHECKOUT, "pyproject.toml")):
        os.environ.setdefault("TORCH_EXTENSIONS_DIR", os.path.join(_CHECKOUT, ".cache", "torch_extensions"))


@functools.lru_cache(maxsize=64)
def train_schedule(stages: int, micro_batches: int) -> tuple[tuple[sch.Action, ...], ...]:
    """Per stage, the actions DeepSpeed's pipeline engine issues in one ``train_batch``: its own
    ``TrainSchedule``'s instructions, translated one for one. Its order is not our 1F1B's: a
    stage sends a forward's output only at its next backward step, after receiving that
    backward's gradient, and each transfer is a blocking send met by a blocking receive, so
    neighbours exchange in lockstep (replayed with ``rendezvous``). Instructions name buffers,
    not micro-batches; every kind runs its micro-batches in order, so the k-th of a kind is
    micro-batch k. The gradient reduction and the step become the final STEP."""
    prepare_environment("cuda" if torch.cuda.is_available() else "cpu")
    from deepspeed.runtime.pipe import schedule as ds

    kinds = {
        ds.ForwardPass: sch.FWD,
        ds.BackwardPass: sch.BWD,
        ds.SendActivation: sch.SEND_F,
        ds.RecvActivation: sch.RECV_F,
        ds.SendGrad: sch.SEND_B,
        ds.RecvGrad: sch.RECV_B,
    }
    out = []
    for stage in range(stages):
        seen = dict.fromkeys(kinds.values(), 0)
        acts = []
        for instruction in (i for cmds in ds.TrainSchedule(micro_batches, stages, stage).steps() for i in cmds):
            op = kinds.get(type(instruction))
            if op is not None:
                acts.append(sch.Action(op, seen[op]))
                seen[op] += 1
        out.append(tuple(acts) + (sch.Action(sch.STEP),))
    return tuple(out)


@dataclass
class DeepSpeedConfig(PipelineKeys):
    # harness (our boundaries) | parameters | uniform | type:<regex> (DeepSpeed's own partitioning)
    partition_method: str = "harness"


class DeepSpeedPipeStrategy(Strategy):
    name = "deepspeed"
    Config = DeepSpeedConfig

    @classmethod
    def check(cls, spec) -> None:
        replicas = uniform_replicas(spec)
        check_layout(spec, replicas)
        dp, m, B = replicas[0], spec.train.micro_batches, spec.train.global_batch
        if B % (dp * m):
            raise ConfigError(
                f"DeepSpeed needs train_batch_size = micro-batch x micro-batches x data-parallel width: "
                f"train.global_batch={B} is not divisible by {m} x {dp}; use a multiple of {dp * m}"
            )
        if spec.strategy.recompute not in ("none", "all"):
            raise ConfigError(
                "strategy=deepspeed supports strategy.recompute=none or all "
                "(DeepSpeed's activation_checkpoint_interval 0 or 1)"
            )
        if spec.strategy.schedule != "1f1b":
            raise ConfigError(f"strategy.schedule={spec.strategy.schedule}: DeepSpeed's pipeline engine runs 1f1b only")
        method = spec.strategy.partition_method
        if method not in ("harness", "parameters", "uniform") and not method.startswith("type:"):
            raise ConfigError(
                f"strategy.partition_method={method} is not one of harness, parameters, uniform, type:<regex>"
            )

    @classmethod
    def samples_per_forward(cls, spec) -> int:
        return micro_batch_samples(spec)

    @classmethod
    def variant(cls, spec) -> str:
        return f"recompute={spec.strategy.recompute}" if spec.strategy.recompute != "none" else ""

    @classmethod
    def simulated(cls, spec, profile, cluster):
        # the engine all-reduces after the last backward, not during it
        layout = simulated_pipeline(
            spec, profile, uniform_replicas(spec), "1f1b", hides_allreduce=False, recompute_rule=spec.strategy.recompute
        )
        own = cls.replayed_schedule(spec, len(layout.replicas))
        return replace(layout, lists=own[0], rendezvous=True) if own else layout

    @classmethod
    def replayed_schedule(cls, spec, stages):
        """DeepSpeed's own lists (:func:`train_schedule`), for the bubble's replay and the simulator."""
        if stages < 2:
            return None
        return [list(a) for a in train_schedule(stages, spec.train.micro_batches)], None

    def __init__(self, spec, layers, ctx, comm):
        super().__init__(spec, layers, ctx, comm)
        prepare_environment(ctx.device.type)
        # lazy: DeepSpeed picks its accelerator when imported, so the environment must be set first
        import deepspeed
        from deepspeed.pipe import PipelineModule

        logging.getLogger("DeepSpeed").setLevel(logging.WARNING)
        deepspeed.utils.logger.setLevel(logging.WARNING)
        if ctx.device.type == "cpu":
            # on CPU, DeepSpeed's start compiles its shared-memory all-reduce (a C++ extension:
            # one to two minutes on 2 cores, on every fresh machine) for inference_all_reduce,
            # which pipeline training never calls: marked unavailable, it falls back to gloo's
            deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
        deepspeed.init_distributed(dist_backend=ctx.backend, auto_mpi_discovery=False, timeout=ctx.timeout)

        replicas = uniform_replicas(spec)
        S, dp = len(replicas), replicas[0]
        self.layers, self.dp = layers, dp
        method = spec.strategy.partition_method
        shared = resolve_boundaries(spec, layers, ctx, comm, replicas) if method == "harness" else None
        boundaries = shared.boundaries if shared else None

        class HarnessPartitionedModule(PipelineModule):
            """PipelineModule cut at the harness's boundaries instead of DeepSpeed's own rule."""

            def _partition_layers(self, method="uniform"):
                if boundaries is None:
                    return super()._partition_layers(method)
                self.parts = [0, *boundaries, len(self._layer_specs)]
                stage = self._topo.get_coord(self.global_rank).pipe
                self._set_bounds(start=self.parts[stage], stop=self.parts[stage + 1])

        self._evaluating = False
        module = HarnessPartitionedModule(
            layers=list(layers),
            num_stages=S,
            loss_fn=self._loss,
            partition_method="parameters" if method == "harness" else method,
            activation_checkpoint_interval=1 if spec.strategy.recompute == "all" else 0,
        )
        self.module = module
        self.layer_range = (module._local_start, module._local_stop)
        self.partition = shared or Partition(list(module.parts[1:-1]), f"deepspeed's {method}")
        # DeepSpeed's gradient clipping sums squared norms over the pipeline's ranks but counts a
        # parameter on a stage other than the first only if it is marked model-parallel (it takes
        # unmarked ones for copies of the first stage's, as Megatron's replicated layers are), so
        # unmarked it would clip by the first stage's norm alone; a stage's layers are its own
        for p in module.parameters():
            p.model_parallel = True
        optimizer = make_optimizer(module.parameters(), spec.train, spec.steps)
        B, m = spec.train.global_batch, spec.train.micro_batches
        config = {
            "train_batch_size": B,
            "train_micro_batch_size_per_gpu": B // (dp * m),
            "gradient_accumulation_steps": m,
            "steps_per_print": 10**9,
            "wall_clock_breakdown": False,
            # DeepSpeed clips gradients to norm 1.0 by default; here it clips as every strategy does,
            # to train.grad_clip_norm over the whole model (0: off, the default)
            "gradient_clipping": spec.train.grad_clip_norm,
            # DeepSpeed's own mixed precision: bf16 weights and activations, fp32 master weights in its optimizer
            "bf16": {"enabled": spec.train.precision == "bf16"},
        }
        self.engine, _, _, _ = deepspeed.initialize(
            model=module, optimizer=optimizer, config=config, dist_init_required=False
        )
        self.optimizer = self.engine.optimizer
        self.stage = self.engine.stage_id
        self.replica = self.engine.grid.get_data_parallel_rank()
        self.micro = B // (dp * m)
        self.last = self.engine.is_last_stage()

    def _loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        if self._evaluating:  # per micro-batch [CE sum, correct, count], summed after eval_batch
            output = output.float()
            return torch.stack(
                [
                    F.cross_entropy(output, target, reduction="sum"),
                    (output.argmax(-1) == target).sum().to(output.dtype),
                    torch.tensor(float(target.numel()), dtype=output.dtype, device=output.device),
                ]
            )
        return mean_loss(output, target, self.spec.train.label_smoothing)

    def _micro_batches(self, x, y):
        """This data-parallel replica's micro-batches, in order (DeepSpeed pulls one per micro step)."""
        share = x.shape[0] // self.dp
        lo = self.replica * share
        if self.spec.train.precision == "bf16":  # DeepSpeed's bf16 engine takes inputs in the weights' type
            x = x.to(torch.bfloat16)
        return iter(
            [(x[lo + k : lo + k + self.micro], y[lo + k : lo + k + self.micro]) for k in range(0, share, self.micro)]
        )

    def train_step(self, x, y):
        loss = self.engine.train_batch(self._micro_batches(x, y))
        self.engine.optimizer.zero_grad(set_to_none=True)
        # train_batch returns the mean over micro-batches and data-parallel replicas on every rank
        return loss / self.ctx.world_size

    @torch.no_grad()
    def evaluate(self, x, y):
        self._evaluating = True
        # the engine accumulates losses into total_loss, which may hold a scalar left by training
        self.engine.total_loss = None
        try:
            outputs = self.engine.eval_batch(
                self._micro_batches(x, y), compute_loss=True, reduce_output=None, bcast_loss=False
            )
        finally:
            self._evaluating = False
            self.engine.total_loss = None
        counts = (0.0, 0.0, 0.0)
        if self.last:  # per micro-batch [CE sum, correct, count]
            ce, correct, count = torch.stack(list(outputs)).sum(0).tolist()
            counts = (correct, count, ce)
        return summed_eval(self.comm, counts)

    def memory_parts(self):
        return {
            "parameters": list(self.module.parameters()),
            "optimizer_state": optimizer_state_tensors(self.engine.optimizer),
        }

    def layout(self):
        return {"stage": self.stage, "replica": self.replica, "layers": list(self.layer_range)}

    def recomputed_layers(self):
        # activation_checkpoint_interval=1 checkpoints every layer of the stage
        return {i: 1 / self.dp for i in range(*self.layer_range)} if self.spec.strategy.recompute == "all" else {}

    def owned_layers(self):
        return range(*self.layer_range)
