"""Predict a configuration on a cluster this machine cannot reach.

The compute costs come from a profile (``sim.profile``; else one measured now) or from the roofline model of a
GPU (``sim.compute=roofline sim.gpu=H100``); the cluster from the ``cluster`` group
(``cluster=dgx_nvlink``, ``cluster=pcie_10gbe``, or ``cluster.*`` keys). The strategy's
class gives its layout, and the runtime's action lists are replayed with those costs
(harness.planning.simulator). The prediction is printed and written as a record marked
``simulated`` into the run directory, so ``pipebench results`` puts it beside measured
runs; a sweep (-m) gives a predicted table in one command.

Examples:
  pipebench simulate model=vit_h14 strategy=ashpipe world_size=16 train.global_batch=256 cluster=dgx_nvlink \\
      sim.compute=roofline sim.gpu=A100
  pipebench simulate -m strategy=dp,hippie cluster=dgx_nvlink,pcie_10gbe sim.profile=profiles/vit_micro-cpu.json
"""

from __future__ import annotations

import sys

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from harness.cli.sweep import sweep_group
from harness.config.spec import build_spec
from harness.core.errors import ConfigError
from harness.planning.forecast import forecast
from harness.report import record as record_mod
from harness.report.wandb_run import LiveRun

OVERRIDES = True


def task(cfg: DictConfig) -> None:
    hc = HydraConfig.get()
    try:
        spec = build_spec(cfg, launching=False)
        if not (spec.sim.profile or spec.sim.compute == "roofline"):
            print("no sim.profile given: profiling on this machine first ...", file=sys.stderr, flush=True)
        made = forecast(spec)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        if hc.mode == RunMode.MULTIRUN:
            return  # the other points of the sweep go on
        raise SystemExit(2) from None
    pred, profile = made.prediction, made.profile
    rec = pred.record(spec.model.name, spec.data.name, spec.cluster.name, spec.cluster.memory_gib)
    rec["profile"], rec["profile_batch"], rec["profile_source"] = spec.sim.profile, profile.batch, made.source
    # what tells rows apart in a table: the schedule or plan (variant), precision, tag and seed
    rec.update({k: spec.summary()[k] for k in ("variant", "precision", "tag", "seed")})
    # where the compute costs came from: a measured profile, or the roofline (its GPU and fraction)
    rec["compute_model"] = profile.meta.get("compute_model") or {"kind": "profile", "device": profile.device}
    if made.spread:
        rec.update(made.spread.record())
    computes = spec.strategy_cls.samples_per_forward(spec)
    if computes != profile.batch:
        print(
            f"note: the profile was measured at {profile.batch} samples per forward, this "
            f"{spec.strategy.name} run computes {computes} per worker at a time; per-sample cost depends "
            "on it, so a profile taken with this strategy's settings predicts it more closely",
            file=sys.stderr,
        )
    record_mod.write(hc.runtime.output_dir, rec)
    group = spec.logger.group or (sweep_group(hc.sweep.dir) if hc.mode == RunMode.MULTIRUN else None)
    LiveRun(
        hc.runtime.output_dir,
        spec.logger.mode,
        spec.logger.project,
        spec.logger.entity,
        group,
        "simulate",
        OmegaConf.to_container(cfg, resolve=True),
        {**spec.summary(), "tag": spec.tag},
    ).finish(rec, 0)
    print(
        f"simulated {pred.strategy} w={pred.world_size} on {spec.cluster.name}: {pred.throughput:.1f} samples/s "
        f"(iteration {pred.iteration_s * 1e3:.2f} ms), bubble {pred.bubble_fraction:.1%}, "
        f"exposed communication {pred.comm_s * 1e3:.2f} ms, replicas {pred.replicas}, "
        f"boundaries {pred.boundaries}, peak memory per stage "
        f"{[round(m / 2**20, 1) for m in pred.peak_memory_per_stage]} MiB"
        + (
            f"; over {made.spread.draws} drawn runs: median {made.spread.p50:.1f} samples/s, 80% within "
            f"{made.spread.p10:.1f}-{made.spread.p90:.1f}"
            if made.spread
            else ""
        )
    )
