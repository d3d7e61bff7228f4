"""``python -m harness.profile [overrides]`` (``pipebench-profile``): measure a model on this device
and save the profile.

What is measured is described in :mod:`harness.planning.profiling`: per-layer
times and sizes at the samples one worker computes per forward under the given
strategy (its class says how many), the whole-step factor, the optimizer
update and the network between two local workers. Saved as versioned JSON with
the device and software it came from (``sim.out``, default
``profiles/<model>-<device>.json``). The planner and the simulator read the
same files.
"""

from __future__ import annotations

import os

import torch
from omegaconf import DictConfig

from harness.cli.common import NO_OUTPUT_DIR, hydra_command, spec_or_exit
from harness.cli.profiles import default_path, profile_spec


def _profile(cfg: DictConfig) -> None:
    spec = spec_or_exit(cfg, launching=False)  # a profile stands for workers on other hosts
    print(f"profiling {spec.model.name} on {spec.device} (network between 2 local workers first) ...", flush=True)
    runtime = cfg.sim.runtime_overhead
    if runtime and spec.device == "cuda" and spec.strategy_cls.gpus(spec) > torch.cuda.device_count():
        print(f"note: the runtime overhead is measured by running {spec.strategy.name} itself, which needs "
              f"{spec.strategy_cls.gpus(spec)} GPUs here; not measured (predictions for this host leave it out)",
              flush=True)
        runtime = False
    profile = profile_spec(spec, runtime=runtime)
    out = cfg.sim.out or default_path(spec)
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w") as f:
        f.write(profile.to_json())
    total = sum(l.forward_s + l.backward_s for l in profile.layers) * profile.batch
    overhead = (f", runtime {profile.runtime['per_action_s'] * 1e3:.2f} ms per action and "
                f"{profile.runtime['per_step_s'] * 1e3:.2f} ms per step" if profile.runtime else "")
    print(f"wrote {out}: {len(profile.layers)} layers, {total * 1e3:.1f} ms forward+backward for "
          f"{profile.batch} samples, p2p {profile.network.p2p_bytes_per_s / 1e9:.2f} GB/s, "
          f"all-reduce {profile.network.allreduce_bytes_per_s / 1e9:.2f} GB/s{overhead}")


def main() -> None:
    hydra_command(_profile, NO_OUTPUT_DIR)


if __name__ == "__main__":
    main()
