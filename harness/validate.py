"""``python -m harness.validate`` (``pipebench-validate``): the simulator against measured runs on this machine.

Each repeat takes every validation configuration in turn: profile it (with its
own settings), run it for real, predict it from that profile, all through the
commands a user runs (``python -m harness.profile``, ``python -m harness``,
``python -m harness.simulate``). A shared machine's speed drifts over tens of
seconds, so one run can differ from the next of the same configuration by more
than the simulator's own error; repeating the round spreads that drift over
every configuration. The table gives, per configuration, the measured and
predicted throughput (mean and spread over the repeats), the error of the means
and the worst single-repeat error.

    python -m harness.validate --repeats 3 --out results/simulator_validation
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import pandas as pd

# name -> overrides; all on 2 CPU workers with the same partition (layer 3 starts stage 1)
CONFIGS = {
    "dp": ["strategy=dp"],
    "hippie": ["strategy=hippie", "strategy.recompute=none"],
    "ashpipe": ["strategy=ashpipe", "strategy.replicas=[1,1]"],
    "pipelining": ["strategy=pipelining"],
}
COMMON = ["world_size=2", "train.micro_batches=4", "strategy.boundaries=[3]", "train.warmup_steps=5",
          "logger.mode=disabled"]


def _cli(module: str, args: list[str], cwd: str) -> None:
    proc = subprocess.run([sys.executable, "-m", module, *args], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, "WANDB_SILENT": "true"}, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"python -m {module} {' '.join(args)} failed:\n{proc.stderr[-3000:]}")


def _throughput(run_dir: str) -> float:
    with open(os.path.join(run_dir, "metrics.json")) as f:
        return json.load(f)["throughput"]


def validate_once(out: str, steps: int = 40, configs: dict[str, list[str]] = CONFIGS, cwd: str = ".") -> dict:
    """One repeat: each configuration profiled (at the samples its workers compute at a time,
    as a profile is meant to be), measured, then predicted from that profile.
    Returns {config: (measured samples/s, predicted samples/s)}."""
    common = [*COMMON, f"train.steps={steps}"]
    pairs = {}
    for name, overrides in configs.items():
        profile = os.path.abspath(os.path.join(out, "profiles", f"{name}.json"))
        measured_dir = os.path.abspath(os.path.join(out, "measured", name))
        simulated_dir = os.path.abspath(os.path.join(out, "simulated", name))
        _cli("harness.profile", [*overrides, *common, f"sim.out={profile}"], cwd)
        _cli("harness", [*overrides, *common, f"hydra.run.dir={measured_dir}"], cwd)
        _cli("harness.simulate", [*overrides, *common, f"sim.profile={profile}", "cluster=local_cpu",
                                  "cluster.use_profile_network=true", f"hydra.run.dir={simulated_dir}"], cwd)
        pairs[name] = (_throughput(measured_dir), _throughput(simulated_dir))
        print(f"  {name}: {pairs[name][0]:.1f} samples/s measured, {pairs[name][1]:.1f} predicted", flush=True)
    return pairs


def summarise(repeats: list[dict]):
    """Per configuration: measured and predicted mean and spread, error of the means, worst repeat."""

    rows = []
    for name in repeats[0]:
        measured = pd.Series([r[name][0] for r in repeats])
        predicted = pd.Series([r[name][1] for r in repeats])
        errors = predicted / measured - 1
        rows.append({"configuration": name, "repeats": len(repeats),
                     "measured samples/s": measured.mean(), "measured min-max": f"{measured.min():.0f}-{measured.max():.0f}",
                     "predicted samples/s": predicted.mean(), "predicted min-max": f"{predicted.min():.0f}-{predicted.max():.0f}",
                     "error of means": f"{predicted.mean() / measured.mean() - 1:+.1%}",
                     "worst repeat error": f"{errors.iloc[errors.abs().argmax()]:+.1%}"})
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m harness.validate", description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3, help="profile + runs + predictions, this many times")
    parser.add_argument("--steps", type=int, default=40, help="training steps per measured run")
    parser.add_argument("--out", default="results/simulator_validation", help="where runs and the table go")
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.steps <= 5:
        parser.error("--repeats must be at least 1 and --steps over 5 (the warm-up steps)")
    repeats = []
    for r in range(args.repeats):
        t0 = time.time()
        print(f"repeat {r + 1}/{args.repeats} ({len(CONFIGS)} configurations, about 40 s each) ...", flush=True)
        repeats.append(validate_once(os.path.join(args.out, f"repeat{r}"), args.steps))
        print(f"repeat {r + 1}/{args.repeats} took {time.time() - t0:.0f} s", flush=True)
    print(write_tables(args.out, repeats))


def write_tables(out: str, repeats: list[dict]) -> str:
    """validation.csv (the summary) and validation.md (the summary, then every repeat)."""

    table = summarise(repeats)
    table.to_csv(os.path.join(out, "validation.csv"), index=False)
    each = pd.DataFrame([{"repeat": r, "configuration": name, "measured samples/s": m, "predicted samples/s": p,
                          "error": f"{p / m - 1:+.1%}"}
                         for r, pairs in enumerate(repeats) for name, (m, p) in pairs.items()])
    text = (table.to_markdown(index=False, floatfmt=".1f") + "\n\nEach repeat (in the order they ran):\n\n"
            + each.to_markdown(index=False, floatfmt=".1f"))
    with open(os.path.join(out, "validation.md"), "w") as f:
        f.write(text + "\n")
    return text


if __name__ == "__main__":
    main()
