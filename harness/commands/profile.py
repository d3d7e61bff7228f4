"""Measure a model on this machine's device and save the profile the simulator and planner read.

What is measured (harness.planning.profiling): per-layer times and sizes at the samples
one worker computes per forward under the given strategy (its class says how many), the
whole-step factor, the optimizer update, the network between two local workers, and (with
``sim.runtime_overhead``, the default) the strategy's own runtime overhead on this host,
from null-model runs of the strategy itself. Saved as versioned JSON with the device and
software it came from (``sim.out``, default ``profiles/<model>-<device>[-<precision>].json``).

With ``sim.profile=FILE`` nothing of the model is measured again: only the given
strategy's runtime overhead, added to that profile (written to ``sim.out``, default the
same file), so that one profile of a model predicts every strategy and schedule on this
host (``pipebench simulate ... cluster=local_cpu``).

Examples:
  pipebench profile model=vit_h14 strategy=hippie world_size=16 train.global_batch=256 train.micro_batches=8
  pipebench profile model=vit_micro strategy=deepspeed sim.profile=profiles/vit_micro-cpu.json
"""

from __future__ import annotations

import dataclasses
import os
import sys

import torch
from omegaconf import DictConfig

from harness.cli.hydra_app import NO_OUTPUT_DIR, spec_or_exit
from harness.core.errors import ConfigError
from harness.planning.forecast import device_of, read_profile, shipped_name, workload_of
from harness.planning.planner import Profile
from harness.planning.profiling import measure_profile
from harness.run.calibrate import measure_runtime_overhead

OVERRIDES = True
EXTRA_OVERRIDES = NO_OUTPUT_DIR  # it prints and writes the profile: no run directory


def task(cfg: DictConfig) -> None:
    spec = spec_or_exit(cfg, launching=False)  # a profile stands for workers on other hosts
    runtime = spec.sim.runtime_overhead
    if runtime and spec.device == "cuda" and spec.strategy_cls.gpus(spec) > torch.cuda.device_count():
        print(
            f"note: the runtime overhead is measured by running {spec.strategy.name} itself, which needs "
            f"{spec.strategy_cls.gpus(spec)} GPUs here; not measured (predictions for this host leave it out)",
            flush=True,
        )
        runtime = False
    if spec.sim.profile:
        out = spec.sim.out or spec.sim.profile
        profile = _add_to(spec, _read_or_exit(spec.sim.profile), runtime)
    else:
        print(f"profiling {spec.model.name} on {spec.device} (network between 2 local workers first) ...", flush=True)
        out = spec.sim.out or os.path.join("profiles", shipped_name(spec))
        profile = measure_profile(workload_of(spec), device_of(spec))
        if runtime:
            _measure_runtime(spec, profile)
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w") as f:
        f.write(profile.to_json())
    total = sum(l.forward_s + l.backward_s for l in profile.layers) * profile.batch
    overheads = "; ".join(
        f"{rt['strategy']} {rt['schedule']} {rt['per_action_s'] * 1e3:.2f} ms per action and "
        f"{rt['per_step_s'] * 1e3:.2f} ms per step"
        for rt in profile.runtime or []
    )
    print(
        f"wrote {out}: {len(profile.layers)} layers, {total * 1e3:.1f} ms forward+backward for "
        f"{profile.batch} samples, p2p {profile.network.p2p_bytes_per_s / 1e9:.2f} GB/s, "
        f"all-reduce {profile.network.allreduce_bytes_per_s / 1e9:.2f} GB/s"
        + (f"; runtime overheads: {overheads}" if overheads else "")
    )


def _read_or_exit(path: str) -> Profile:
    try:
        return read_profile(path)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None


def _add_to(spec, profile: Profile, runtime: bool) -> Profile:
    """``profile`` with ``spec``'s strategy's runtime overhead measured and added (replacing an
    earlier one of the same strategy and schedule); exit 2 where it profiled another model."""
    if profile.meta.get("model") != spec.model.name:
        print(
            f"error: sim.profile={spec.sim.profile} profiled model {profile.meta.get('model')}, not "
            f"{spec.model.name}: give model={profile.meta.get('model')}, or profile {spec.model.name} without "
            "sim.profile",
            file=sys.stderr,
        )
        raise SystemExit(2)
    if not runtime:
        print(
            "error: sim.profile with pipebench profile adds a runtime overhead, which sim.runtime_overhead=false "
            "(or a host without the GPUs it needs) leaves out: nothing to do",
            file=sys.stderr,
        )
        raise SystemExit(2)
    _measure_runtime(spec, profile)
    return profile


def _measure_runtime(spec, profile: Profile) -> None:
    print(f"measuring {spec.strategy.name}'s runtime overhead on a null model ...", flush=True)
    measured = dataclasses.asdict(measure_runtime_overhead(spec, profile))
    key = (measured["strategy"], measured["schedule"])
    profile.runtime = [rt for rt in profile.runtime or [] if (rt["strategy"], rt["schedule"]) != key] + [measured]
