"""The simulator's predictions against measured runs on this machine, repeats interleaved.

Three tables from one command. The changed-configuration study
(harness.studies.changed_config) profiles each model once per repeat and predicts, from
that one profile, its profiled configuration (the replay table) and configurations it did
not profile (the changed table: other cuts, micro-batch counts and global batches,
schedules, runtimes, replicas, recomputation), each run for real beside it, each
prediction with a 10-90% interval from runs drawn with the profile's measured spread.
The published-table comparison predicts the Zero Bubble paper's A100 table with the
roofline model (harness.planning.published). With ``--budget full``, the matrix of
configurations each profiled with its own settings runs too: each configuration run,
profiled, run again and predicted from that profile, through the commands a user runs
(``pipebench run``, ``pipebench profile``, ``pipebench simulate``); a shared machine's
speed drifts over tens of seconds, so one run can differ from the next of the same
configuration by more than the simulator's own error, and repeating the round spreads
that drift over every configuration.

Example (about 90 minutes on 2 cores):
  pipebench validate --out results/simulator_validation
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import os
import sys
import time

import pandas as pd

from harness.planning import published
from harness.studies import changed_config
from harness.studies.driver import measured_on, read_record, run_command

# every configuration runs on 2 CPU workers; pipelines on a given cut (the runs and the
# predictions must cut alike): vit_micro's 6 layers at [3] (2 stages) or [2, 3, 4] (two per
# rank), vit_tiny's 14 at [7] or [4, 7, 10]
_CUT = {"vit_micro": ("[3]", "[2,3,4]"), "vit_tiny": ("[7]", "[4,7,10]")}


def _configs() -> dict[str, list[str]]:
    out = {}

    def add(model: str, batch: int, name: str, overrides: list[str], m: int | None = None, two_per_rank=False):
        cut = _CUT[model][1 if two_per_rank else 0]
        pipeline = [f"strategy.boundaries={cut}"] if not name.startswith("dp") else []
        micro = [f"train.micro_batches={m}"] if m else []
        label = f"{model} B={batch} {name}" + (f" m={m}" if m else "")
        out[label] = [f"model={model}", f"train.global_batch={batch}", *overrides, *pipeline, *micro]

    for model, batch, ms in (("vit_micro", 64, (2, 4, 8)), ("vit_micro", 32, (4,)), ("vit_tiny", 32, (2, 8))):
        add(model, batch, "dp", ["strategy=dp"])
        add(model, batch, "ashpipe", ["strategy=ashpipe", "strategy.replicas=[1,1]"])
        for m in ms:
            add(model, batch, "hippie", ["strategy=hippie", "strategy.recompute=none"], m)
        for m in ms if model == "vit_micro" and batch == 64 else (4,):
            add(model, batch, "pipelining", ["strategy=pipelining"], m)
            add(model, batch, "deepspeed", ["strategy=deepspeed"], m)
    add(
        "vit_micro",
        64,
        "pipelining interleaved_1f1b",
        ["strategy=pipelining", "strategy.schedule=interleaved_1f1b"],
        4,
        two_per_rank=True,
    )
    add("vit_micro", 64, "pipelining zbv", ["strategy=pipelining", "strategy.schedule=zbv"], 4, two_per_rank=True)
    add("vit_tiny", 32, "pipelining zbv", ["strategy=pipelining", "strategy.schedule=zbv"], 4, two_per_rank=True)
    return out


CONFIGS = _configs()
COMMON = ["world_size=2", "train.warmup_steps=5", "logger.mode=disabled"]
TARGET, MEAN_TARGET, RANK_GAP = 0.10, 0.05, 0.10
PUBLISHED_TARGET, PUBLISHED_RATIO_TARGET = 0.25, 0.10  # a published table: each figure, each ratio of two schedules


def _cli(args: list[str], cwd: str, run_dir: str | None = None) -> None:
    """``pipebench <args>``; a failure ends the validation with the command's reason."""
    outcome = run_command(args, run_dir, deadline_s=900, cwd=cwd)
    if outcome.status != "ok":
        raise RuntimeError(f"pipebench {' '.join(args)} {outcome.status}: {outcome.error}")


def _throughput(run_dir: str) -> float:
    record, error = read_record(run_dir)
    if record is None:
        raise RuntimeError(error)
    return record["throughput"]


def validate_once(out: str, steps: int = 30, configs: dict[str, list[str]] | None = None, cwd: str = ".") -> dict:
    """One repeat: each configuration measured, profiled (at the samples its workers compute at a
    time, as a profile is meant to be, with its runtime's overhead), measured again, then predicted
    from that profile. Returns {config: (mean measured samples/s, predicted samples/s)}."""
    common = [*COMMON, f"train.steps={steps}"]
    pairs = {}
    for name, overrides in (configs or CONFIGS).items():
        folder = _run_folder(name)
        profile = os.path.abspath(os.path.join(out, "profiles", f"{folder}.json"))
        measured_dir = os.path.abspath(os.path.join(out, "measured", folder))
        simulated_dir = os.path.abspath(os.path.join(out, "simulated", folder))
        # measured before and after its profile, so that a shared host's drift over the minute they take
        # falls on both sides of the prediction alike
        _cli(["run", *overrides, *common], cwd, f"{measured_dir}-before")
        _cli(["profile", *overrides, *common, f"sim.out={profile}"], cwd)
        _cli(["run", *overrides, *common], cwd, f"{measured_dir}-after")
        _cli(["simulate", *overrides, *common, f"sim.profile={profile}", "cluster=local_cpu"], cwd, simulated_dir)
        measured = (_throughput(f"{measured_dir}-before") + _throughput(f"{measured_dir}-after")) / 2
        pairs[name] = (measured, _throughput(simulated_dir))
        print(
            f"  {name}: {pairs[name][0]:.1f} samples/s measured, {pairs[name][1]:.1f} predicted "
            f"({pairs[name][1] / pairs[name][0] - 1:+.1%})",
            flush=True,
        )
    return pairs


def _run_folder(name: str) -> str:
    """The folder a configuration's runs go in, named after it."""
    return name.replace(" ", "_").replace("=", "")


def collect(out: str) -> list[dict]:
    """The repeats already under ``out`` (an interrupted run's too), each with the configurations it
    finished: measured before and after, and predicted."""
    repeats = []
    for r in itertools.count():
        folder = os.path.join(out, f"repeat{r}")
        if not os.path.isdir(folder):
            return repeats
        pairs = {}
        for name in CONFIGS:
            base = _run_folder(name)
            runs = [os.path.join(folder, "measured", f"{base}-{when}") for when in ("before", "after")]
            simulated = os.path.join(folder, "simulated", base)
            if all(os.path.exists(os.path.join(d, "metrics.json")) for d in (*runs, simulated)):
                pairs[name] = (sum(map(_throughput, runs)) / 2, _throughput(simulated))
        repeats.append(pairs)


def summarise(repeats: list[dict]) -> pd.DataFrame:
    """Per configuration: measured and predicted mean and spread, error of the means, worst repeat
    (over the repeats that finished it)."""
    rows = []
    for name in dict.fromkeys(n for r in repeats for n in r):
        done = [r[name] for r in repeats if name in r]
        measured = pd.Series([m for m, _ in done])
        predicted = pd.Series([p for _, p in done])
        errors = predicted / measured - 1
        rows.append(
            {
                "configuration": name,
                "repeats": len(done),
                "measured samples/s": measured.mean(),
                "measured min-max": f"{measured.min():.0f}-{measured.max():.0f}",
                "predicted samples/s": predicted.mean(),
                "predicted min-max": f"{predicted.min():.0f}-{predicted.max():.0f}",
                "error of means": predicted.mean() / measured.mean() - 1,
                "worst repeat error": errors.iloc[errors.abs().argmax()],
            }
        )
    return pd.DataFrame(rows)


def verdict(table: pd.DataFrame) -> dict:
    """The targets: every configuration's error of the means within 10%, their mean within 5%,
    and the order of any two configurations of one model and batch whose measured throughputs
    differ by more than 10% kept by the predictions."""
    errors = table["error of means"]
    swapped = []
    group = table["configuration"].str.extract(r"^(\S+ B=\d+)")[0]
    for (_, a), (_, b) in itertools.combinations(table.assign(group=group).iterrows(), 2):
        if a["group"] != b["group"]:
            continue
        fast, slow = (a, b) if a["measured samples/s"] > b["measured samples/s"] else (b, a)
        if (
            fast["measured samples/s"] > (1 + RANK_GAP) * slow["measured samples/s"]
            and fast["predicted samples/s"] <= slow["predicted samples/s"]
        ):
            swapped.append(f"{fast['configuration']} / {slow['configuration']}")
    return {
        "configurations": len(table),
        "within 10%": int((errors.abs() <= TARGET).sum()),
        "mean signed error": float(errors.mean()),
        "mean absolute error": float(errors.abs().mean()),
        "largest error": float(errors.iloc[errors.abs().argmax()]),
        "ranking swapped": swapped,
        "targets met": bool((errors.abs() <= TARGET).all() and abs(errors.mean()) <= MEAN_TARGET and not swapped),
    }


def write_tables(out: str, repeats: list[dict]) -> str:
    """validation.csv (the summary), validation.json (the verdict) and validation.md (the date, the
    verdict, the summary, then every repeat)."""
    table = summarise(repeats)
    result = verdict(table)
    day = measured_on(*(os.path.join(out, f"repeat{r}") for r in range(len(repeats))))
    table.to_csv(os.path.join(out, "validation.csv"), index=False)
    with open(os.path.join(out, "validation.json"), "w") as f:
        json.dump({"date": day, **result}, f, indent=1)
    shown = table.assign(**{k: table[k].map("{:+.1%}".format) for k in ("error of means", "worst repeat error")})
    each = pd.DataFrame(
        [
            {
                "repeat": r,
                "configuration": name,
                "measured samples/s": m,
                "predicted samples/s": p,
                "error": f"{p / m - 1:+.1%}",
            }
            for r, pairs in enumerate(repeats)
            for name, (m, p) in pairs.items()
        ]
    )
    head = (
        f"Measured {day} on this machine, {len(repeats)} repeat(s) interleaved: "
        f"{result['within 10%']} of {result['configurations']} configurations within 10% on the means, "
        f"mean signed error {result['mean signed error']:+.1%} (mean absolute {result['mean absolute error']:.1%}), "
        f"largest {result['largest error']:+.1%}, ranking swapped: {', '.join(result['ranking swapped']) or 'none'}; "
        f"targets {'met' if result['targets met'] else 'not met'}."
    )
    text = (
        head
        + "\n\n"
        + shown.to_markdown(index=False, floatfmt=".1f")
        + "\n\nEach repeat (in the order they ran):\n\n"
        + each.to_markdown(index=False, floatfmt=".1f")
    )
    with open(os.path.join(out, "validation.md"), "w") as f:
        f.write(text + "\n")
    return text


def published_verdict(rows: pd.DataFrame) -> dict:
    """The targets of a published table: every prediction within 25% of its published figure, and
    the ratio between any two schedules of one configuration within 10% of the published ratio."""
    pairs = []
    for _, group in rows.groupby(["model", "micro_batches"], sort=False):
        for (_, a), (_, b) in itertools.combinations(group.iterrows(), 2):
            error = (a["predicted"] / b["predicted"]) / (a["published"] / b["published"]) - 1
            pairs.append(
                {
                    "model": a["model"],
                    "micro_batches": a["micro_batches"],
                    "pair": f"{a['schedule']} / {b['schedule']}",
                    "ratio error": error,
                }
            )
    pairs = pd.DataFrame(pairs)
    within = lambda values, bound: int((values.abs() <= bound).sum())  # noqa: E731
    return {
        "predictions": len(rows),
        "within 25%": within(rows["error"], PUBLISHED_TARGET),
        "mean signed error": float(rows["error"].mean()),
        "ratios": len(pairs),
        "ratios within 10%": within(pairs["ratio error"], PUBLISHED_RATIO_TARGET),
        "largest ratio error": pairs.loc[pairs["ratio error"].abs().idxmax()].to_dict(),
        "targets met": bool(
            (rows["error"].abs() <= PUBLISHED_TARGET).all()
            and (pairs["ratio error"].abs() <= PUBLISHED_RATIO_TARGET).all()
        ),
    }


def write_published(out: str) -> str:
    """published.{csv,json,md}: the Zero Bubble paper's A100 table against the simulator's prediction
    of it (harness.planning.published), with its verdict."""
    rows, fraction = published.comparison(progress=lambda what: print(f"  predicting {what}", flush=True))
    result = published_verdict(rows)
    os.makedirs(out, exist_ok=True)
    rows.to_csv(os.path.join(out, "published.csv"), index=False)
    with open(os.path.join(out, "published.json"), "w") as f:
        json.dump(
            {
                "date": datetime.date.today().isoformat(),
                "source": published.SOURCE,
                "fitted_fraction": fraction,
                "fitted_on": list(published.FIT_ON),
                **result,
            },
            f,
            indent=1,
            default=str,
        )
    worst = result["largest ratio error"]
    head = (
        f"{published.SOURCE}, predicted {datetime.date.today().isoformat()} by the roofline model of an "
        f"{published.GPU_NAME} at {fraction:.1%} of its bf16 datasheet, the fraction fitted on "
        f"{' '.join(map(str, published.FIT_ON))} alone: {result['within 25%']} of {result['predictions']} "
        f"predictions within 25% (mean signed error {result['mean signed error']:+.1%}), "
        f"{result['ratios within 10%']} of {result['ratios']} ratios between two schedules of one configuration "
        f"within 10% (largest: {worst['pair']} at {worst['model']} m={worst['micro_batches']}, "
        f"{worst['ratio error']:+.1%}); targets {'met' if result['targets met'] else 'not met'}."
    )
    shown = rows.assign(
        error=rows["error"].map("{:+.1%}".format),
        ratio_error=rows["ratio_error"].map("{:+.1%}".format),
        fitted=rows["fitted"].map({True: "fitted", False: ""}),
    )
    shown.columns = [
        "model",
        "GPUs",
        "m",
        "schedule",
        "published samples/GPU/s",
        "predicted",
        "error",
        "published / 1F1B",
        "predicted / 1F1B",
        "ratio error",
        "",
    ]
    text = head + "\n\n" + shown.to_markdown(index=False, floatfmt=".3g")
    with open(os.path.join(out, "published.md"), "w") as f:
        f.write(text + "\n")
    return text


BUDGETS = {  # models of the changed-configuration study, its repeats, and whether the profiled matrix runs too
    "quick": (("vit_micro",), 1, False),  # about 20 minutes on 2 cores
    "standard": (("vit_micro", "vit_tiny"), 2, False),  # about 90 minutes
    "full": (("vit_micro", "vit_tiny"), 3, True),  # about 3 hours 30
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--budget",
        choices=list(BUDGETS),
        default="standard",
        help="quick: vit_micro, one repeat (about 20 min); standard: both models, two repeats "
        "(about 90 min); full: three repeats and the matrix of configurations each profiled "
        "with its own settings too (about 3 h 30)",
    )
    parser.add_argument("--repeats", type=int, default=None, help="repeats (default: the budget's)")
    parser.add_argument("--steps", type=int, default=30, help="training steps per measured run")
    parser.add_argument("--out", default="results/simulator_validation", help="where runs and the tables go")
    parser.add_argument(
        "--only",
        default="",
        help="run only the configurations whose name contains this text "
        "(with the profiled configuration of their model)",
    )
    parser.add_argument(
        "--summarise", action="store_true", help="run nothing: rebuild the tables from the repeats already under --out"
    )
    parser.add_argument(
        "--published",
        action="store_true",
        help="run nothing: only predict the published GPU table (published.md under --out, a minute)",
    )


def main(args: argparse.Namespace) -> int:
    models, repeats, profiled_matrix = BUDGETS[args.budget]
    repeats = args.repeats or repeats
    changed_dir = os.path.join(args.out, "changed")
    # the configurations --only names, and the profiled one of each of their models (what they are predicted from)
    named = [c for c in changed_config.configs(models) if args.only in c.label]
    matrix = [
        c for c in changed_config.configs(models) if c in named or c.profiled and c.model in {n.model for n in named}
    ]
    if args.published:
        print(write_published(args.out))
        return 0
    if args.summarise:
        found = False
        profiled = collect(args.out)
        if any(profiled):
            print(write_tables(args.out, profiled))
            found = True
        if not changed_config.collect(changed_dir).empty:
            print(changed_config.write(changed_dir))
            found = True
        if not found:
            print(
                f"error: --summarise: no finished configuration under {args.out}/repeat* or {changed_dir}/repeat*",
                file=sys.stderr,
            )
            return 2
        return 0
    if repeats < 1 or args.steps <= 5:
        print("error: --repeats must be at least 1 and --steps over 5 (the warm-up steps)", file=sys.stderr)
        return 2
    configs = {k: v for k, v in CONFIGS.items() if args.only in k} if profiled_matrix else {}
    if not matrix and not configs:
        print(
            f"error: --only {args.only!r} matches no configuration; they are: "
            f"{'; '.join(c.label for c in changed_config.configs(models))}",
            file=sys.stderr,
        )
        return 2
    by_repeat = []
    for r in range(repeats):
        t0 = time.time()
        print(
            f"repeat {r + 1}/{repeats}: {len(matrix)} configurations predicted from one profile per model"
            + (f", then {len(configs)} each profiled with its own settings" if configs else "")
            + " ...",
            flush=True,
        )
        changed_config.run_repeat(
            os.path.join(changed_dir, f"repeat{r}"), matrix, args.steps, log=lambda line: print(line, flush=True)
        )
        if configs:
            by_repeat.append(validate_once(os.path.join(args.out, f"repeat{r}"), args.steps, configs))
        print(f"repeat {r + 1}/{repeats} took {time.time() - t0:.0f} s", flush=True)
    print(changed_config.write(changed_dir))
    if by_repeat:
        print(write_tables(args.out, by_repeat))
    print(write_published(args.out))
    return 0
