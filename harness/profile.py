"""``python -m harness.profile [overrides]``: measure a model on this device and save the profile.

Per-layer forward and backward time, output bytes, bytes saved for backward and
parameter bytes (identical blocks measured once), at the sample count one
worker computes per forward under the given strategy, with the threads one
worker would have; the whole forward, loss and backward of a shortened model
(the step factor that scales isolated layer times to a real pass) and the
optimizer update, interleaved with the layer times; on a CPU, as many
processes measuring side by side as a run has workers. Plus point-to-point and
all-reduce bandwidth and latency between two local workers. Saved as versioned
JSON with the device and software it came from (``sim.out``, default
``profiles/<model>-<device>.json``). The planner and the simulator read the
same files."""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import tempfile
from dataclasses import asdict, replace

import torch
import torch.multiprocessing as mp

from harness.errors import ConfigError


def measure_profile(spec, device: torch.device, network=None):
    from harness.plan import _measure_local_network
    from harness.planner import Profile

    network = network or _measure_local_network()
    per_worker = samples_per_compute(spec)
    if device.type == "cpu" and spec.world_size > 1:
        # the workers of a run share the machine's cores and memory bandwidth: measure with as
        # many processes at once, each with a worker's threads, and keep the slowest one's figures
        # (the slowest rank sets a run's step time)
        from harness.launch import cpu_worker_environment

        processes = min(spec.world_size, os.cpu_count() or 1)
        cpu_worker_environment()
        side_by_side = mp.get_context("spawn").Barrier(processes)
        with tempfile.TemporaryDirectory() as d:
            mp.start_processes(_measure_worker, args=(spec, device, per_worker, processes, side_by_side, d),
                               nprocs=processes, start_method="spawn")
            measured = [_load_measurement(os.path.join(d, f"{r}.json")) for r in range(processes)]
        layers, pass_s, update_s = max(measured, key=lambda m: m[1])
    else:
        layers, pass_s, update_s = _measure(spec, device, per_worker, spec.world_size)
    short = _short(layers)
    meta = {"model": spec.model.name, "threads": _threads(spec, device, spec.world_size), "torch": torch.__version__,
            "python": platform.python_version(), "host": platform.node(), "cpus": os.cpu_count(),
            "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
            "step_factor_note": "forward, loss and backward of a shortened model / the sum of its layers' "
                                "isolated times, measured by the same process; optimizer update timed on its own"}
    return Profile(layers, network, str(device), per_worker, meta=meta,
                   step_factor=pass_s / (sum(l.forward_s + l.backward_s for l in short) * per_worker),
                   optimizer_s_per_byte=update_s / sum(l.param_bytes for l in short))


def _short(layers: list) -> list:
    """Embedding, two blocks and the head: every layer kind of a ViT. Its whole step against the
    same layers' isolated times gives the step factor; identical blocks make it hold for the
    full depth."""
    return layers[:3] + layers[-1:] if len(layers) > 4 else layers


def _threads(spec, device: torch.device, workers: int) -> int:
    from harness.worker import threads_per_process

    return threads_per_process(spec, workers) if device.type == "cpu" else torch.get_num_threads()


def _measure(spec, device: torch.device, per_worker: int, workers: int, side_by_side=None, rounds: int = 3):
    """Per-layer times and whole-pass times of the shortened model, in this process.

    The two are interleaved in rounds and each is the median over the rounds: a
    shared machine's speed drifts over seconds, and measuring them together puts
    the same drift in both, which keeps their ratio (the step factor) steady.
    Workers measuring side by side start each round together."""
    from harness.models import build_layers
    from harness.planner import profile_layers

    if device.type == "cpu":
        torch.set_num_threads(_threads(spec, device, workers))
    layers = [layer.to(device) for layer in build_layers(spec.model, spec.seed)]
    size = spec.data.image_size
    sample = torch.randn(per_worker, 3, size, size, device=device)
    layer_rounds, passes, updates = [], [], []
    for _ in range(rounds):
        if side_by_side is not None:
            side_by_side.wait(timeout=600)
        layer_rounds.append(profile_layers(layers, sample, repeats=3))
        pass_s, update_s = _whole_step_s(spec, _short(layers), sample, repeats=6, budget_s=2.0)
        passes.append(pass_s)
        updates.append(update_s)
    profiled = [replace(first, forward_s=statistics.median(r[i].forward_s for r in layer_rounds),
                        backward_s=statistics.median(r[i].backward_s for r in layer_rounds))
                for i, first in enumerate(layer_rounds[0])]
    return profiled, statistics.median(passes), statistics.median(updates)


def _measure_worker(rank: int, spec, device, per_worker: int, processes: int, side_by_side, out_dir: str) -> None:
    layers, pass_s, update_s = _measure(spec, device, per_worker, processes, side_by_side)
    with open(os.path.join(out_dir, f"{rank}.json"), "w") as f:
        json.dump({"layers": [asdict(l) for l in layers], "pass_s": pass_s, "update_s": update_s}, f)


def _load_measurement(path: str):
    from harness.planner import LayerProfile

    with open(path) as f:
        d = json.load(f)
    return [LayerProfile(**l) for l in d["layers"]], d["pass_s"], d["update_s"]


def _whole_step_s(spec, layers, sample: torch.Tensor, repeats: int, budget_s: float) -> tuple[float, float]:
    """Median times of a real training step of ``layers`` on ``sample`` (one worker):
    (forward, loss and backward; the optimizer update). Large models stop at the time budget."""
    import time

    from harness.strategy import make_optimizer, summed_loss

    def sync():
        if sample.device.type == "cuda":
            torch.cuda.synchronize(sample.device)

    model = torch.nn.Sequential(*layers)
    optimizer = make_optimizer(model.parameters(), spec)
    target = torch.randint(0, spec.model.num_classes, (sample.shape[0],), device=sample.device)
    passes, updates = [], []
    started = time.perf_counter()
    for r in range(repeats + 2):
        if r > 4 and time.perf_counter() - started > budget_s:
            break
        t0 = time.perf_counter()
        summed_loss(model(sample), target, sample.shape[0]).backward()
        sync()
        t1 = time.perf_counter()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        sync()
        if r >= 2:  # the first two warm up
            passes.append(t1 - t0)
            updates.append(time.perf_counter() - t1)
    return statistics.median(passes), statistics.median(updates)


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
    from harness.config import refuse_unknown_choices, register_configs
    from harness.spec import build_spec

    register_configs()
    refuse_unknown_choices(sys.argv[1:], CONFIG_DIR)

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
