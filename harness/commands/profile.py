"""Measure a model on this machine's device and save the profile the simulator and planner read.

What is measured (harness.planning.profiling): per-layer times and sizes at the samples
one worker computes per forward under the given strategy (its class says how many), the
whole-step factor, the optimizer update, the network between two local workers, and (with
``sim.runtime_overhead``, the default) the strategy's own runtime overhead on this host,
from null-model runs of the strategy itself. Saved as versioned JSON with the device and
software it came from (``sim.out``, default ``profiles/<model>-<device>[-<precision>].json``).

Example:
  pipebench profile model=vit_h14 strategy=hippie world_size=16 train.global_batch=256 train.micro_batches=8
"""

from __future__ import annotations

import dataclasses
import os

import torch
from omegaconf import DictConfig

from harness.cli.hydra_app import NO_OUTPUT_DIR, spec_or_exit
from harness.planning.forecast import device_of, shipped_name, workload_of
from harness.planning.profiling import measure_profile
from harness.run.calibrate import measure_runtime_overhead

OVERRIDES = True
EXTRA_OVERRIDES = NO_OUTPUT_DIR  # it prints and writes the profile: no run directory


def task(cfg: DictConfig) -> None:
    spec = spec_or_exit(cfg, launching=False)  # a profile stands for workers on other hosts
    print(f"profiling {spec.model.name} on {spec.device} (network between 2 local workers first) ...", flush=True)
    runtime = spec.sim.runtime_overhead
    if runtime and spec.device == "cuda" and spec.strategy_cls.gpus(spec) > torch.cuda.device_count():
        print(f"note: the runtime overhead is measured by running {spec.strategy.name} itself, which needs "
              f"{spec.strategy_cls.gpus(spec)} GPUs here; not measured (predictions for this host leave it out)",
              flush=True)
        runtime = False
    profile = measure_profile(workload_of(spec), device_of(spec))
    if runtime:
        print(f"measuring {spec.strategy.name}'s runtime overhead on a null model ...", flush=True)
        profile.runtime = dataclasses.asdict(measure_runtime_overhead(spec, profile))
    out = spec.sim.out or os.path.join("profiles", shipped_name(spec))
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w") as f:
        f.write(profile.to_json())
    total = sum(l.forward_s + l.backward_s for l in profile.layers) * profile.batch
    overhead = (f", runtime {profile.runtime['per_action_s'] * 1e3:.2f} ms per action and "
                f"{profile.runtime['per_step_s'] * 1e3:.2f} ms per step" if profile.runtime else "")
    print(f"wrote {out}: {len(profile.layers)} layers, {total * 1e3:.1f} ms forward+backward for "
          f"{profile.batch} samples, p2p {profile.network.p2p_bytes_per_s / 1e9:.2f} GB/s, "
          f"all-reduce {profile.network.allreduce_bytes_per_s / 1e9:.2f} GB/s{overhead}")
