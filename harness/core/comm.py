"""All communication of the runtime goes through here.

Process-group set-up, point-to-point transfers and collectives, each with a
timeout, so a stuck peer becomes an error that names the rank and the
operation instead of a hang. Strategies and schedules never call
``torch.distributed`` directly for data movement.

How the timeout is enforced depends on the backend. With gloo, each wait passes
it (``work.wait(timeout)``) and a late peer raises :class:`CommTimeout` naming the
rank and the operation. With NCCL, an explicit timeout would turn the wait into
a host-blocking poll, so the host could not queue work ahead of the device; there
a wait only makes the current stream wait for the transfer, and the process
group's own timeout (set from the same value) and NCCL's watchdog end a stuck job.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from submitit.helpers import TorchDistributedEnvironment


class CommTimeout(RuntimeError):
    """A collective or point-to-point operation did not finish within its timeout."""


@dataclass
class DistContext:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    backend: str
    timeout: timedelta

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def free_port() -> int:
    """A TCP port nobody listens on now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_process_group(
    rank: int, world_size: int, local_rank: int, device: str, backend: str, timeout_s: float
) -> DistContext:
    """Join the job's process group from the usual environment variables.

    MASTER_ADDR/MASTER_PORT come from the launcher (ours, torchrun or Slurm).
    """
    if device == "cuda":
        torch.cuda.set_device(local_rank)
        dev = torch.device("cuda", local_rank)
    else:
        dev = torch.device("cpu")
    if backend == "auto":
        backend = "nccl" if dev.type == "cuda" else "gloo"
    timeout = timedelta(seconds=timeout_s)
    # libraries built for their own launchers (DeepSpeed) read these
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(local_rank))
    if not dist.is_initialized():
        kwargs = {"device_id": dev} if dev.type == "cuda" else {}
        dist.init_process_group(backend=backend, rank=rank, world_size=world_size, timeout=timeout, **kwargs)
    return DistContext(rank, world_size, local_rank, dev, backend, timeout)


def destroy() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def _wait(work: dist.Work, what: str, timeout: timedelta | None) -> None:
    """Wait for ``work``; ``timeout`` None: order the device's streams only (NCCL, see above)."""
    if timeout is None:
        work.wait()
        return
    try:
        ok = work.wait(timeout)
    except RuntimeError as e:
        raise CommTimeout(
            f"rank {dist.get_rank()}: {what} failed or timed out after {timeout.total_seconds():.0f}s: {e}"
        ) from e
    if ok is False:
        raise CommTimeout(f"rank {dist.get_rank()}: {what} timed out after {timeout.total_seconds():.0f}s")


def new_group(ranks: list[int], timeout: timedelta):
    """A sub-group; must be called by every rank of the job in the same order."""
    return dist.new_group(ranks=sorted(ranks), timeout=timeout)


class Comm:
    """Timed-out transfers for one rank. ``timeout`` applies to every operation."""

    def __init__(self, ctx: DistContext):
        self.ctx = ctx
        self.timeout = ctx.timeout
        # the timeout each wait passes: none on NCCL, where the process group enforces it
        self.wait_timeout = None if ctx.backend == "nccl" else ctx.timeout

    # point to point -------------------------------------------------------
    def isend(self, tensor: torch.Tensor, dst: int, tag: int = 0) -> "Pending":
        return Pending(
            dist.isend(tensor, dst=dst, tag=tag), f"send to rank {dst} (tag {tag})", self.wait_timeout, tensor
        )

    def irecv(self, tensor: torch.Tensor, src: int, tag: int = 0) -> "Pending":
        return Pending(
            dist.irecv(tensor, src=src, tag=tag), f"receive from rank {src} (tag {tag})", self.wait_timeout, tensor
        )

    # collectives --------------------------------------------------------
    def all_reduce_async(self, tensor: torch.Tensor, group=None) -> "Pending":
        work = dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=group, async_op=True)
        return Pending(work, "all-reduce", self.wait_timeout)

    def all_reduce(self, tensor: torch.Tensor, group=None) -> torch.Tensor:
        self.all_reduce_async(tensor, group).wait()
        return tensor

    def broadcast(self, tensor: torch.Tensor, src: int, group=None) -> torch.Tensor:
        work = dist.broadcast(tensor, src=src, group=group, async_op=True)
        _wait(work, f"broadcast from rank {src}", self.wait_timeout)
        return tensor

    def barrier(self) -> None:
        # monitored_barrier names the rank that did not arrive (gloo only)
        if self.ctx.backend == "gloo":
            dist.monitored_barrier(timeout=self.timeout)
        else:
            dist.barrier()

    def broadcast_object(self, obj, src: int = 0):
        """``obj`` from rank ``src`` on every rank (small metadata only)."""
        box = [obj]
        dist.broadcast_object_list(box, src=src)
        return box[0]

    def gather_objects(self, obj) -> list:
        """Every rank's ``obj``, on every rank (small metadata only)."""
        out: list = [None] * self.ctx.world_size
        dist.all_gather_object(out, obj)
        return out


class Pending:
    """An in-flight operation; :meth:`wait` enforces the timeout and names the peer.

    It holds the tensor being sent or received: the transport reads or writes
    that memory until the operation completes, so the caller dropping its own
    reference (an asynchronous pipeline frees a micro-batch's input right after
    sending its gradient) must not free it. Whoever starts a send keeps its Pending until
    the send completes: with gloo, a send whose work object is dropped unfinished is
    cancelled, and its receiver waits until the timeout.
    """

    def __init__(self, work: dist.Work, what: str, timeout: timedelta | None, tensor: torch.Tensor | None = None):
        self.work, self.what, self.timeout, self.tensor = work, what, timeout, tensor

    def wait(self) -> None:
        _wait(self.work, self.what, self.timeout)

    def done(self) -> bool:
        return self.work.is_completed()


def env_rank_info() -> tuple[int, int, int] | None:
    """(rank, world_size, local_rank) when a launcher started this process as one rank.

    - torchrun (or anything that sets RANK, WORLD_SIZE and MASTER_ADDR);
    - a Slurm job with several tasks (``srun``, or hydra-submitit-launcher with
      ``tasks_per_node`` > 1): submitit's TorchDistributedEnvironment derives
      RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR (the first node of the job) and
      MASTER_PORT (from the job id, unless set) from Slurm's variables and
      exports them. CUDA_VISIBLE_DEVICES is left alone: rank r uses cuda:LOCAL_RANK.
    None means this process is the whole job and spawns its own workers.
    """
    env = os.environ
    if "RANK" in env and "WORLD_SIZE" in env and "MASTER_ADDR" in env:
        return int(env["RANK"]), int(env["WORLD_SIZE"]), int(env.get("LOCAL_RANK", 0))
    if "SLURM_PROCID" in env and int(env.get("SLURM_NTASKS", "1")) > 1:
        # submitit's own sbatch script sets this; under a plain srun we read Slurm's variables the same way
        os.environ.setdefault("SUBMITIT_EXECUTOR", "slurm")
        dist_env = TorchDistributedEnvironment().export(set_cuda_visible_devices=False, overwrite=True)
        os.environ["LOCAL_WORLD_SIZE"] = str(dist_env.local_world_size)
        return dist_env.rank, dist_env.world_size, dist_env.local_rank
    return None
