"""``python -m harness.profile [overrides]``: measure a model on this device and save the profile.

Per-layer forward and backward time, output bytes, bytes saved for backward and
parameter bytes (identical blocks measured once), at the sample count one
worker computes per micro-batch (``global_batch / micro_batches / replicas``),
with the threads one worker would have; plus point-to-point and all-reduce
bandwidth and latency between two local workers. Saved as versioned JSON with
the device and software it came from (``sim.out``, default
``profiles/<model>-<device>.json``). The planner and the simulator read the
same files.
"""

from __future__ import annotations

import os
import platform
import sys

import torch

from harness.errors import ConfigError


def measure_profile(spec, device: torch.device, network=None):
    from harness.models import build_layers
    from harness.plan import _measure_local_network
    from harness.planner import Profile, profile_layers
    from harness.worker import threads_per_process

    network = network or _measure_local_network()
    workers = spec.world_size
    per_worker = samples_per_compute(spec)
    if device.type == "cpu":
        torch.set_num_threads(threads_per_process(spec, workers))
    layers = [layer.to(device) for layer in build_layers(spec.model, spec.seed)]
    size = spec.data.image_size
    sample = torch.randn(per_worker, 3, size, size, device=device)
    profiled = profile_layers(layers, sample, repeats=9)
    # a whole step of a shortened model (embedding, two blocks, head: every layer kind) against the
    # same layers' isolated times; identical blocks make the ratio hold for the full depth
    short = layers[:3] + layers[-1:] if len(layers) > 4 else layers
    short_profiled = profiled[:3] + profiled[-1:] if len(layers) > 4 else profiled
    if device.type == "cpu" and workers > 1:
        whole = _whole_step_in_parallel(spec, per_worker, min(workers, os.cpu_count() or 1))
    else:
        whole = _whole_step_s(spec, short, sample)
    step_factor = whole / (sum(l.forward_s + l.backward_s for l in short_profiled) * per_worker)
    meta = {"model": spec.model.name, "threads": torch.get_num_threads(), "torch": torch.__version__,
            "python": platform.python_version(), "host": platform.node(), "cpus": os.cpu_count(),
            "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None}
    meta["step_factor_note"] = "whole step (forward, loss, backward, AdamW) / sum of isolated layer times"
    return Profile(profiled, network, str(device), per_worker, meta=meta, step_factor=step_factor)


def _whole_step_in_parallel(spec, per_worker: int, processes: int) -> float:
    """The whole-step time with ``processes`` workers running it at once, as they share the
    machine's cores and memory bandwidth in a real run (the median over the workers)."""
    import tempfile

    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as d:
        mp.start_processes(_whole_step_worker, args=(spec, per_worker, processes, d), nprocs=processes,
                           start_method="spawn")
        times = sorted(float(open(os.path.join(d, f"{r}.txt")).read()) for r in range(processes))
    return times[len(times) // 2]


def _whole_step_worker(rank: int, spec, per_worker: int, processes: int, out_dir: str) -> None:
    from harness.models import build_layers
    from harness.worker import threads_per_process

    torch.set_num_threads(threads_per_process(spec, processes))
    layers = build_layers(spec.model, spec.seed)
    short = layers[:3] + layers[-1:] if len(layers) > 4 else layers
    size = spec.data.image_size
    t = _whole_step_s(spec, short, torch.randn(per_worker, 3, size, size))
    with open(os.path.join(out_dir, f"{rank}.txt"), "w") as f:
        f.write(str(t))


def _whole_step_s(spec, layers, sample: torch.Tensor, repeats: int = 7, budget_s: float = 10.0) -> float:
    """Median time of a real training step of the whole model on ``sample`` (one worker)."""
    import time

    from harness.strategy import make_optimizer, summed_loss

    model = torch.nn.Sequential(*layers)
    optimizer = make_optimizer(model.parameters(), spec)
    target = torch.randint(0, spec.model.num_classes, (sample.shape[0],), device=sample.device)
    times = []
    for r in range(repeats + 2):
        if r > 4 and sum(times) > budget_s:
            break
        t0 = time.perf_counter()
        summed_loss(model(sample), target, sample.shape[0]).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if sample.device.type == "cuda":
            torch.cuda.synchronize(sample.device)
        times.append(time.perf_counter() - t0)
    return sorted(times[2:])[len(times[2:]) // 2]


def samples_per_compute(spec) -> int:
    """Samples one worker puts through a forward at a time under the spec's strategy
    (per-sample cost depends on it, so a profile is measured at that size)."""
    st, t, w = spec.strategy, spec.train, spec.world_size
    if st.name == "dp":
        n = t.global_batch // w
    elif st.name == "ashpipe":
        n = t.global_batch // min(st.replicas) if st.replicas is not None else t.global_batch // w
    elif st.name == "gpipe":
        n = t.global_batch // t.micro_batches
    else:
        n = t.global_batch // t.micro_batches // max(1, w // max(1, st.stages))
    return max(1, n)


def default_path(spec, device: torch.device) -> str:
    return os.path.join("profiles", f"{spec.model.name}-{device.type}.json")


def main() -> None:
    import hydra
    from omegaconf import DictConfig

    from harness.app import CONFIG_DIR
    from harness.config import register_configs
    from harness.spec import build_spec

    register_configs()

    @hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="config")
    def _profile(cfg: DictConfig) -> None:
        try:
            spec = build_spec(cfg)
        except ConfigError as e:
            print(f"error: {e}", file=sys.stderr)
            raise SystemExit(2)
        device = torch.device("cuda" if spec.device == "cuda" else "cpu")
        print(f"profiling {spec.model.name} on {device} (network between 2 local workers first) ...", flush=True)
        profile = measure_profile(spec, device)
        out = cfg.sim.out or default_path(spec, device)
        os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
        with open(out, "w") as f:
            f.write(profile.to_json())
        total = sum(l.forward_s + l.backward_s for l in profile.layers) * profile.batch
        print(f"wrote {out}: {len(profile.layers)} layers, {total * 1e3:.1f} ms forward+backward for "
              f"{profile.batch} samples, p2p {profile.network.p2p_bytes_per_s / 1e9:.2f} GB/s, "
              f"all-reduce {profile.network.allreduce_bytes_per_s / 1e9:.2f} GB/s")

    _profile()


if __name__ == "__main__":
    sys.argv += ["hydra.output_subdir=null", "hydra.run.dir=.", "hydra/job_logging=none", "hydra/hydra_logging=none"]
    main()
