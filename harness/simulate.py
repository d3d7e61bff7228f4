"""``python -m harness.simulate [overrides]``: predict a strategy on a cluster this machine cannot reach.

Reads a profile (``sim.profile``; measured now if unset), takes the cluster
from the ``cluster`` config group (``cluster=dgx_nvlink``, ``cluster=pcie_10gbe``,
or ``cluster.*`` keys), replays the executor's action lists with those costs
(:mod:`harness.simulator`), prints the prediction and writes it as a record
marked ``simulated`` into the run directory, so ``python -m harness.results``
puts it beside measured runs. A multirun (``-m strategy=dp,hippie
cluster=dgx_nvlink,pcie_10gbe``) gives a predicted table in one command.
"""

from __future__ import annotations

import os
import sys

import torch

from harness.errors import ConfigError


def _cluster(cfg):
    from dataclasses import fields

    from harness.simulator import Cluster

    # the config group mirrors the simulator's Cluster (plus use_profile_network, read by predict_spec)
    return Cluster(**{f.name: cfg.cluster[f.name] for f in fields(Cluster)})


def predict_spec(spec, cfg, profile):
    """The prediction for a run spec (same layout rules as the real strategies)."""
    from harness.models import num_layers
    from harness.runtime.build import resolve_recompute
    from harness.runtime.partition import balanced_boundaries, stage_ranges
    from harness.simulator import predict

    cluster = _cluster(cfg)
    if cfg.cluster.use_profile_network:
        cluster.intra_node_gbps = cluster.inter_node_gbps = profile.network.p2p_bytes_per_s / 1e9
        cluster.latency_us = cluster.inter_latency_us = profile.network.latency_s * 1e6
    st, n = spec.strategy, num_layers(spec.model)
    stages = spec.world_size if st.name == "gpipe" else st.stages
    replicas = list(st.replicas) if st.replicas is not None else None
    boundaries = list(st.boundaries) if st.boundaries is not None else None
    recompute: set[int] = set()
    if st.name == "hippie":
        S = len(replicas) if replicas else stages
        if boundaries is None and S > 1:
            boundaries = balanced_boundaries([l.forward_s + l.backward_s for l in profile.layers], S)
        ranges = stage_ranges(boundaries or [], n)
        for s, (lo, hi) in enumerate(ranges):
            recompute |= resolve_recompute(st.recompute, n, (lo, hi), last_stage=s == len(ranges) - 1)
    if st.name == "deepspeed" and st.recompute == "all":
        recompute = set(range(n))
    return predict(profile, cluster, st.name, spec.world_size, spec.train.global_batch, spec.train.micro_batches,
                   stages=stages, replicas=replicas, boundaries=boundaries, recompute=recompute,
                   schedule=st.schedule if st.schedule in ("1f1b", "gpipe") else "1f1b")


def load_or_measure_profile(cfg, spec):
    from harness.planner import Profile
    from harness.profile import measure_profile

    if cfg.sim.profile:
        if not os.path.isfile(cfg.sim.profile):
            raise ConfigError(f"sim.profile={cfg.sim.profile} does not exist; make one with python -m harness.profile")
        with open(cfg.sim.profile) as f:
            return Profile.from_json(f.read())
    device = torch.device("cuda" if spec.device == "cuda" else "cpu")
    print("no sim.profile given: profiling on this machine first ...", file=sys.stderr, flush=True)
    return measure_profile(spec, device)


def main() -> None:
    import hydra
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode
    from omegaconf import DictConfig

    from harness import record as record_mod
    from harness.app import CONFIG_DIR
    from harness.config import refuse_unknown_choices, register_configs
    from harness.profile import samples_per_compute
    from harness.spec import build_spec

    register_configs()
    refuse_unknown_choices(sys.argv[1:], CONFIG_DIR)

    @hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="config")
    def _simulate(cfg: DictConfig) -> None:
        try:
            spec = build_spec(cfg)
            profile = load_or_measure_profile(cfg, spec)
            pred = predict_spec(spec, cfg, profile)
        except ConfigError as e:
            print(f"error: {e}", file=sys.stderr)
            if HydraConfig.get().mode == RunMode.MULTIRUN:
                return  # the other points of the sweep go on
            raise SystemExit(2)
        rec = pred.record(spec.model.name, spec.data.name, cfg.cluster.name, cfg.cluster.memory_gib)
        rec["profile"], rec["profile_batch"] = cfg.sim.profile, profile.batch
        computes = samples_per_compute(spec)
        if computes != profile.batch:
            print(f"note: the profile was measured at {profile.batch} samples per forward, this "
                  f"{spec.strategy.name} run computes {computes} per worker at a time; per-sample cost depends "
                  "on it, so a profile taken with this strategy's settings predicts it more closely", file=sys.stderr)
        record_mod.write(HydraConfig.get().runtime.output_dir, rec)
        print(f"simulated {pred.strategy} w={pred.world_size} on {cfg.cluster.name}: {pred.throughput:.1f} samples/s "
              f"(iteration {pred.iteration_s * 1e3:.2f} ms), bubble {pred.bubble_fraction:.1%}, "
              f"exposed communication {pred.comm_s * 1e3:.2f} ms, replicas {pred.replicas}, "
              f"boundaries {pred.boundaries}, peak memory per stage "
              f"{[round(m / 2**20, 1) for m in pred.peak_memory_per_stage]} MiB")

    _simulate()


if __name__ == "__main__":
    main()
