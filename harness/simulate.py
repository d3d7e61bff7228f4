"""``python -m harness.simulate [overrides]`` (``pipebench-simulate``): predict a strategy on a
cluster this machine cannot reach.

Reads a profile (``sim.profile``; measured now if unset), takes the cluster
from the ``cluster`` config group (``cluster=dgx_nvlink``, ``cluster=pcie_10gbe``,
or ``cluster.*`` keys), asks the strategy's class for its layout, replays the
runtime's action lists with those costs (:mod:`harness.planning.simulator`),
prints the prediction and writes it as a record marked ``simulated`` into the
run directory, so ``python -m harness.results`` puts it beside measured runs. A
multirun (``-m strategy=dp,hippie cluster=dgx_nvlink,pcie_10gbe``) gives a
predicted table in one command.
"""

from __future__ import annotations

import os
import sys

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from harness.cli.common import hydra_command
from harness.cli.profiles import cluster_of, profile_spec, roofline_of
from harness.cli.sweep import sweep_group
from harness.config.spec import RunSpec, build_spec
from harness.core.errors import ConfigError
from harness.planning.planner import Profile
from harness.planning.simulator import Prediction, predict
from harness.report import record as record_mod
from harness.report import wandb_mirror


def predict_spec(spec: RunSpec, cfg: DictConfig, profile: Profile) -> Prediction:
    """The prediction for a run spec: the strategy's own layout, the same rules a real run uses."""
    cluster = cluster_of(cfg, profile)
    layout = spec.strategy_cls.simulated(spec, profile, cluster)
    return predict(profile, cluster, layout, spec.world_size, spec.train.global_batch)


def load_or_measure_profile(cfg: DictConfig, spec: RunSpec) -> Profile:
    if cfg.sim.compute == "roofline":
        return roofline_of(cfg, spec)
    if cfg.sim.profile:
        if not os.path.isfile(cfg.sim.profile):
            raise ConfigError(f"sim.profile={cfg.sim.profile} does not exist; make one with python -m harness.profile")
        with open(cfg.sim.profile) as f:
            return Profile.from_json(f.read())
    print("no sim.profile given: profiling on this machine first ...", file=sys.stderr, flush=True)
    return profile_spec(spec)


def _simulate(cfg: DictConfig) -> None:
    try:
        spec = build_spec(cfg, launching=False)
        profile = load_or_measure_profile(cfg, spec)
        pred = predict_spec(spec, cfg, profile)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        if HydraConfig.get().mode == RunMode.MULTIRUN:
            return  # the other points of the sweep go on
        raise SystemExit(2)
    rec = pred.record(spec.model.name, spec.data.name, cfg.cluster.name, cfg.cluster.memory_gib)
    rec["profile"], rec["profile_batch"] = cfg.sim.profile, profile.batch
    # what tells rows apart in a table: the schedule or plan (variant), precision, tag and seed
    rec.update({k: spec.summary()[k] for k in ("variant", "precision", "tag", "seed")})
    # where the compute costs came from: a measured profile, or the roofline (its GPU and fraction)
    rec["compute_model"] = profile.meta.get("compute_model") or {"kind": "profile", "device": profile.device}
    computes = spec.strategy_cls.samples_per_forward(spec)
    if computes != profile.batch:
        print(f"note: the profile was measured at {profile.batch} samples per forward, this "
              f"{spec.strategy.name} run computes {computes} per worker at a time; per-sample cost depends "
              "on it, so a profile taken with this strategy's settings predicts it more closely", file=sys.stderr)
    hc = HydraConfig.get()
    record_mod.write(hc.runtime.output_dir, rec)
    group = spec.logger.group or (sweep_group(hc.sweep.dir) if hc.mode == RunMode.MULTIRUN else None)
    wandb_mirror.mirror({**rec, "tag": spec.tag, "seed": spec.seed}, hc.runtime.output_dir, spec.logger.mode,
                        spec.logger.project, spec.logger.entity, group, job_type="simulate")
    print(f"simulated {pred.strategy} w={pred.world_size} on {cfg.cluster.name}: {pred.throughput:.1f} samples/s "
          f"(iteration {pred.iteration_s * 1e3:.2f} ms), bubble {pred.bubble_fraction:.1%}, "
          f"exposed communication {pred.comm_s * 1e3:.2f} ms, replicas {pred.replicas}, "
          f"boundaries {pred.boundaries}, peak memory per stage "
          f"{[round(m / 2**20, 1) for m in pred.peak_memory_per_stage]} MiB")


def main() -> None:
    hydra_command(_simulate)


if __name__ == "__main__":
    main()
