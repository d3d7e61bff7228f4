"""``python -m harness.preview [overrides]`` (``pipebench-preview``): every job a sweep would launch,
without starting any.

Takes the same overrides as ``python -m harness`` (with or without ``-m``; no
overrides means the main job, ``experiment=ci``), expands the sweep the way the
sweeper will (same jobs, same order), validates each job's spec and prints one
line per job: strategy and variant, world size and nodes, the layout (replicas
and boundaries; AshPipe's plan), the predicted step time and throughput where a
profile of the model on that device exists (``profiles/<model>-<device>.json``,
replayed by the simulator on the job's ``cluster``), and the refusal, with its
reason, of a job that would not start.
"""

from __future__ import annotations

import os
import sys

import pandas as pd
from hydra import compose, initialize_config_dir
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser

from harness.cli.profiles import cluster_of
from harness.config.choices import refuse_unknown_choices
from harness.config.registry import CONFIG_DIR
from harness.config.schema import register_configs
from harness.config.spec import RunSpec, build_spec
from harness.core.errors import ConfigError
from harness.planning.planner import Profile
from harness.planning.simulator import predict


def sweep_jobs(overrides: list[str]) -> list[list[str]]:
    """The override list of every job, in launch order: the config's swept keys (``repeat``
    first, then the experiment's), then the command line's, expanded by Hydra's basic sweeper
    as a multirun does."""
    fixed = [o for o in overrides if "," not in o.split("=", 1)[-1]]
    cfg = compose(config_name="config", overrides=fixed, return_hydra_config=True)
    params = [f"{k}={v}" for k, v in (cfg.hydra.sweeper.params or {}).items()]
    parsed = OverridesParser.create().parse_overrides(params + overrides)
    return BasicSweeper.split_arguments(parsed, None)[0]


def _profile(spec: RunSpec) -> tuple[Profile | None, str | None]:
    name = f"{spec.model.name}-{spec.device}.json"
    for folder in ("profiles", os.path.join(os.path.dirname(CONFIG_DIR), "profiles")):
        path = os.path.join(folder, name)
        if os.path.isfile(path):
            with open(path) as f:
                return Profile.from_json(f.read()), path
    return None, None


def describe(job: list[str], shown: list[str]) -> dict:
    """One job's line of the preview (its spec validated, nothing started); ``shown``: its overrides
    as the preview names the job."""
    launcher = compose(config_name="config", overrides=job, return_hydra_config=True).hydra.launcher
    cfg = compose(config_name="config", overrides=job)
    row = {"job": " ".join(shown), "strategy": cfg.strategy.name, "workers": cfg.world_size,
           "nodes": launcher.get("nodes", 1)}
    try:
        spec = build_spec(cfg)
    except ConfigError as e:
        return {**row, "status": f"refused: {e}"}
    row["strategy"] = spec.strategy.name + (f" ({spec.variant()})" if spec.variant() else "")
    profile, path = _profile(spec)
    if profile is None:
        return {**row, "layout": "boundaries measured at start", "status": "ok (no profile: no prediction)"}
    try:
        cluster = cluster_of(cfg, profile)
        layout = spec.strategy_cls.simulated(spec, profile, cluster)
        pred = predict(profile, cluster, layout, spec.world_size, spec.train.global_batch)
    except ConfigError as e:
        return {**row, "status": f"ok (no prediction: {e})"}
    return {**row, "layout": f"replicas {pred.replicas}, boundaries {pred.boundaries}",
            "predicted step ms": round(pred.iteration_s * 1e3, 2), "predicted samples/s": round(pred.throughput, 1),
            "status": f"ok (predicted on {cluster.name} from {path})"}


def main(argv: list[str] | None = None) -> int:
    args = [a for a in (sys.argv[1:] if argv is None else argv) if a not in ("-m", "--multirun")] or ["experiment=ci"]
    refuse_unknown_choices(args, CONFIG_DIR)
    register_configs()
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        jobs = sweep_jobs(args)
        repeats = any(o.startswith("repeat=") and o != "repeat=0" for job in jobs for o in job)
        rows = [describe(job, job if repeats else [o for o in job if o != "repeat=0"]) for job in jobs]
    table = pd.DataFrame(rows)
    print(table.astype(object).where(table.notna(), None).to_markdown(index=False, missingval="–"))
    refused = sum(str(r["status"]).startswith("refused") for r in rows)
    print(f"\n{len(rows)} job(s), {refused} refused; nothing was started", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
