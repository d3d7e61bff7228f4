"""``python -m harness.plan [overrides]``: print AshPipe's plan without training.

Profiles the model's layers on this machine's device (identical blocks are
measured once, so ViT-H/14 takes seconds) and plans for ``world_size``
workers. The network is measured between two local gloo workers unless
``strategy.bandwidth_gbps`` gives the target cluster's bandwidth; a GPU
cluster's memory per worker comes from ``strategy.memory_limit`` (GiB).

Inside a job (``strategy=ashpipe`` without ``strategy.replicas``) the same
planner runs on rank 0 with the network measured between the job's workers.
"""

from __future__ import annotations

import os
import sys

import torch

from harness.errors import ConfigError
from harness.models import build_layers
from harness.planner import Network, Profile, data_parallel_cost, measure_network, plan, profile_layers


def _memory_limit_bytes(spec, device: torch.device) -> float | None:
    if spec.strategy.memory_limit is not None:
        return spec.strategy.memory_limit * 2**30
    if device.type == "cuda":
        return float(torch.cuda.get_device_properties(device).total_memory)
    return None  # CPU: no device memory to respect


def _sample(spec, device: torch.device, workers: int) -> torch.Tensor:
    per_worker = max(1, min(8, spec.train.global_batch // max(1, workers)))
    size = spec.data.image_size
    return torch.randn(per_worker, 3, size, size, device=device)


def _assumed_network(spec) -> Network | None:
    if spec.strategy.bandwidth_gbps is None:
        return None
    bw = spec.strategy.bandwidth_gbps * 1e9
    return Network(p2p_bytes_per_s=bw, allreduce_bytes_per_s=bw, latency_s=1e-5)


def plan_in_job(spec, layers, ctx, comm):
    """Plan inside a running job: profile on rank 0, measure the network with all ranks, broadcast."""
    network = _assumed_network(spec) or measure_network(comm)
    result = None
    if ctx.rank == 0:
        moved = [layer.to(ctx.device) for layer in layers]
        profile = Profile(profile_layers(moved, _sample(spec, ctx.device, ctx.world_size)), network,
                          str(ctx.device), spec.train.global_batch)
        try:
            chosen = plan(profile, ctx.world_size, spec.train.global_batch, _memory_limit_bytes(spec, ctx.device))
            dp = data_parallel_cost(profile, ctx.world_size, spec.train.global_batch)
            result = (chosen, chosen.describe([type(l).__name__ for l in layers], dp))
        except ConfigError as e:
            result = e
    result = comm.broadcast_object(result)
    if isinstance(result, ConfigError):
        raise result
    return result


def _measure_local_network() -> Network:
    """Bandwidth between two gloo workers on this machine."""
    import tempfile

    import torch.multiprocessing as mp

    from harness import comm as comm_mod

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(comm_mod.free_port())
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "net.pt")
        mp.start_processes(_network_worker, args=(out,), nprocs=2, start_method="spawn")
        return Network(**torch.load(out))


def _network_worker(rank: int, out: str) -> None:
    from dataclasses import asdict

    from harness import comm as comm_mod

    ctx = comm_mod.init_process_group(rank, 2, rank, "cpu", "gloo", 60)
    try:
        net = measure_network(comm_mod.Comm(ctx))
        if rank == 0:
            torch.save(asdict(net), out)
    finally:
        comm_mod.destroy()


def main() -> None:
    import hydra
    from omegaconf import DictConfig

    from harness.app import CONFIG_DIR
    from harness.config import refuse_unknown_choices, register_configs
    from harness.spec import build_spec

    register_configs()
    refuse_unknown_choices(sys.argv[1:], CONFIG_DIR)

    @hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="config")
    def _plan(cfg: DictConfig) -> None:
        try:
            spec = build_spec(cfg)
            device = torch.device("cuda" if spec.device == "cuda" else "cpu")
            network = _assumed_network(spec)
            if network is None:
                print("measuring point-to-point and all-reduce bandwidth between 2 local workers ...", flush=True)
                network = _measure_local_network()
            print(f"profiling {spec.model.name} on {device} ...", flush=True)
            layers = [l.to(device) for l in build_layers(spec.model, spec.seed)]
            profile = Profile(profile_layers(layers, _sample(spec, device, spec.world_size)), network, str(device),
                              spec.train.global_batch)
            chosen = plan(profile, spec.world_size, spec.train.global_batch, _memory_limit_bytes(spec, device))
        except ConfigError as e:
            print(f"error: {e}", file=sys.stderr)
            raise SystemExit(2)
        print(f"network: p2p {network.p2p_bytes_per_s / 1e9:.2f} GB/s, all-reduce {network.allreduce_bytes_per_s / 1e9:.2f} "
              f"GB/s, latency {network.latency_s * 1e6:.0f} us")
        dp = data_parallel_cost(profile, spec.world_size, spec.train.global_batch)
        print(chosen.describe([type(l).__name__ for l in layers], dp))

    _plan()


if __name__ == "__main__":
    if not any(a.startswith("strategy=") for a in sys.argv[1:]):
        sys.argv.append("strategy=ashpipe")
    # a plan is printed, not recorded: no run directory, no log file
    sys.argv += ["hydra.output_subdir=null", "hydra.run.dir=.", "hydra/job_logging=none", "hydra/hydra_logging=none"]
    main()
