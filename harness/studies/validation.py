"""The simulator validation (``pipebench validate``): its budgets, its run of them, and the matrix of
configurations each profiled with its own settings.

:func:`run` runs the repeats: each the changed-configuration study (harness.studies.changed_config:
one profile per model, configurations it did not profile predicted from it) and, with ``--budget
full``, the profiled matrix (:data:`CONFIGS`: each configuration run, profiled, run again and
predicted from its own profile, :func:`validate_once`); then writes every table, with the
published-table comparison (harness.studies.published_table). The profiled matrix's tables:
:func:`collect` (the repeats under a folder), :func:`summarise`, :func:`verdict` (its targets)
and :func:`write_tables`; :func:`rebuild` writes the tables again from the runs already made.
"""

from __future__ import annotations

import itertools
import json
import os
import time
from typing import Callable

import pandas as pd

from harness.studies import changed_config
from harness.studies.driver import measured_on, read_record, run_or_raise
from harness.studies.published_table import write_published

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


BUDGETS = {  # models of the changed-configuration study, its repeats, and whether the profiled matrix runs too
    "quick": (("vit_micro",), 1, False),  # about 20 minutes on 2 cores
    "standard": (("vit_micro", "vit_tiny"), 2, False),  # about 90 minutes
    "full": (("vit_micro", "vit_tiny"), 3, True),  # about 3 hours 30
}


def _throughput(run_dir: str) -> float:
    record, error = read_record(run_dir)
    if record is None:
        raise RuntimeError(error)
    return record["throughput"]


def validate_once(
    out: str,
    steps: int = 30,
    configs: dict[str, list[str]] | None = None,
    cwd: str = ".",
    log: Callable[[str], None] = print,
) -> dict:
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
        run_or_raise(["run", *overrides, *common], cwd, f"{measured_dir}-before")
        run_or_raise(["profile", *overrides, *common, f"sim.out={profile}"], cwd)
        run_or_raise(["run", *overrides, *common], cwd, f"{measured_dir}-after")
        run_or_raise(
            ["simulate", *overrides, *common, f"sim.profile={profile}", "cluster=local_cpu"], cwd, simulated_dir
        )
        measured = (_throughput(f"{measured_dir}-before") + _throughput(f"{measured_dir}-after")) / 2
        pairs[name] = (measured, _throughput(simulated_dir))
        log(
            f"  {name}: {pairs[name][0]:.1f} samples/s measured, {pairs[name][1]:.1f} predicted "
            f"({pairs[name][1] / pairs[name][0] - 1:+.1%})"
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


def changed_matrix(models: tuple[str, ...], only: str = "") -> list[changed_config.Config]:
    """The changed-configuration study's configurations of ``models`` whose label contains ``only``,
    with the profiled one of each of their models (what they are predicted from)."""
    named = [c for c in changed_config.configs(models) if only in c.label]
    return [
        c for c in changed_config.configs(models) if c in named or c.profiled and c.model in {n.model for n in named}
    ]


def profiled_configs(only: str = "") -> dict[str, list[str]]:
    """The configurations of the profiled matrix whose name contains ``only``."""
    return {k: v for k, v in CONFIGS.items() if only in k}


def labels(models: tuple[str, ...]) -> list[str]:
    """The changed-configuration study's configurations of ``models``, by name."""
    return [c.label for c in changed_config.configs(models)]


def rebuild(out: str) -> list[str]:
    """The tables written again from the repeats already under ``out`` (an interrupted run's too):
    the profiled matrix's (``out/repeat*``) and the changed-configuration study's
    (``out/changed/repeat*``), where either finished a configuration; their Markdown (none: nothing
    to rebuild)."""
    texts = []
    profiled = collect(out)
    if any(profiled):
        texts.append(write_tables(out, profiled))
    changed_dir = os.path.join(out, "changed")
    if not changed_config.collect(changed_dir).empty:
        texts.append(changed_config.write(changed_dir))
    return texts


def run(
    out: str,
    matrix: list[changed_config.Config],
    configs: dict[str, list[str]],
    repeats: int,
    steps: int,
    log: Callable[[str], None] = print,
) -> None:
    """``repeats`` repeats into ``out``: each runs the changed-configuration study on ``matrix`` (into
    ``out/changed/repeat<r>``), then the profiled matrix on ``configs`` (into ``out/repeat<r>``, where
    any); then the tables of both and the published-table comparison are written. ``log`` gets the
    progress lines and each table's Markdown as it is written."""
    changed_dir = os.path.join(out, "changed")
    by_repeat = []
    for r in range(repeats):
        t0 = time.time()
        log(
            f"repeat {r + 1}/{repeats}: {len(matrix)} configurations predicted from one profile per model"
            + (f", then {len(configs)} each profiled with its own settings" if configs else "")
            + " ..."
        )
        changed_config.run_repeat(os.path.join(changed_dir, f"repeat{r}"), matrix, steps, log=log)
        if configs:
            by_repeat.append(validate_once(os.path.join(out, f"repeat{r}"), steps, configs, log=log))
        log(f"repeat {r + 1}/{repeats} took {time.time() - t0:.0f} s")
    log(changed_config.write(changed_dir))
    if by_repeat:
        log(write_tables(out, by_repeat))
    log(write_published(out, log=log))
