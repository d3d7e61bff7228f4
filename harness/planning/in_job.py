"""Where AshPipe's planner gets its inputs: inside a job (layers profiled on rank 0, the network
measured between the job's workers, the plan broadcast) or on this host for the plan command.

``spec`` is a validated run spec (read only: ``spec.strategy.memory_limit``,
``spec.strategy.bandwidth_gbps``, ``spec.train``, ``spec.data``); this module decides
nothing itself, :func:`harness.planning.planner.plan` does.
"""

from __future__ import annotations

import torch

from harness.core.errors import ConfigError
from harness.core.models import visiting
from harness.core.training import with_precision
from harness.planning.planner import Network, Plan, Profile, data_parallel_cost, plan
from harness.planning.profiling import measure_network, profile_layers


def memory_limit_bytes(spec, device: torch.device) -> float | None:
    """Memory per worker the plan must fit: ``strategy.memory_limit`` GiB, else the GPU's; none on a CPU."""
    if spec.strategy.memory_limit is not None:
        return spec.strategy.memory_limit * 2**30
    if device.type == "cuda":
        return float(torch.cuda.get_device_properties(device).total_memory)
    return None  # CPU: no device memory to respect


def profile_sample(spec, device: torch.device, workers: int) -> torch.Tensor:
    """A batch of the size the planner profiles layers at."""
    per_worker = max(1, min(8, spec.train.global_batch // max(1, workers)))
    size = spec.data.image_size
    return torch.randn(per_worker, 3, size, size, device=device)


def assumed_network(spec) -> Network | None:
    """The network ``strategy.bandwidth_gbps`` describes (None: measure it)."""
    if spec.strategy.bandwidth_gbps is None:
        return None
    bw = spec.strategy.bandwidth_gbps * 1e9
    return Network(p2p_bytes_per_s=bw, allreduce_bytes_per_s=bw, latency_s=1e-5)


def plan_here(spec, layers, device: torch.device, network: Network, workers: int) -> tuple[Plan, Profile]:
    """The plan for ``workers`` from ``layers`` profiled on ``device`` in the run's precision."""
    with visiting(layers, device):  # no copy of the layers stays on the device
        profile = Profile(
            profile_layers(with_precision(layers, spec.train.precision), profile_sample(spec, device, workers)),
            network,
            str(device),
            spec.train.global_batch,
        )
    return plan(profile, workers, spec.train.global_batch, memory_limit_bytes(spec, device)), profile


def plan_in_job(spec, layers, ctx, comm) -> tuple[Plan, str]:
    """Plan inside a running job: profile on rank 0, measure the network with all ranks, broadcast
    the plan and its description (or the refusal, raised on every rank)."""
    network = assumed_network(spec) or measure_network(comm)
    result = None
    if ctx.rank == 0:
        try:
            chosen, profile = plan_here(spec, layers, ctx.device, network, ctx.world_size)
            dp = data_parallel_cost(profile, ctx.world_size, spec.train.global_batch)
            result = (chosen, chosen.describe([type(l).__name__ for l in layers], dp))
        except ConfigError as e:
            result = e
    result = comm.broadcast_object(result)
    if isinstance(result, ConfigError):
        raise result
    return result
