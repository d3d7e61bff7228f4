"""The simulator on configurations it has not profiled, against runs of them on this machine.

A researcher profiles a model once and asks the simulator about what they have not run.
Here each model is profiled once per repeat, at one micro-batch size, under one
configuration (its *profiled* configuration: Hippie's 1F1B at 4 micro-batches on a given
cut), and every other strategy's runtime overhead is added to that profile (null-model
runs of each runtime, no model measured again: ``pipebench profile sim.profile=...``).
Then every configuration of the matrix runs for real and is predicted from that one
profile: the profiled configuration itself (the *replay* table) and configurations that
change one thing or several (the *changed* table): the cut, the micro-batch count with
the global batch (the micro-batch size is the profile's), the schedule, the runtime
(torch pipelining, DeepSpeed, DDP, AshPipe), replicas and recomputation. Every run is
on 2 workers, the worker count this 2-core machine runs comparably.

Each prediction is made twice: from the profile's medians (the error the tables give)
and as a distribution over drawn runs (``sim.draws``), whose 10-90% interval either holds
the run's throughput or not (the coverage the tables give). Repeats are interleaved: every
configuration once per repeat, each repeat with its own profile.
"""

from __future__ import annotations

import itertools
import json
import os
import re
from dataclasses import dataclass
from typing import Callable

import pandas as pd

from harness.studies.driver import measured_on, read_record, run_or_raise

# per model: the micro-batch size of its profile, its cut into 2 stages, other cuts, 4 stages
# on 2 ranks (the multi-stage schedules)
_MODELS = {"vit_micro": (16, "[3]", ("[2]", "[4]"), "[2,3,4]"), "vit_tiny": (8, "[7]", ("[5]",), "[4,7,10]")}
COMMON = ["train.warmup_steps=5", "logger.mode=disabled"]
DRAWS = 200
TARGET_MAE, TARGET_EACH, TARGET_SIGNED, RANK_GAP = 0.07, 0.15, 0.03, 0.10
COVERAGE = (0.70, 0.90)
MORE_WORKERS = "more workers than cores"  # the table of runs whose records say they are not comparable


@dataclass(frozen=True)
class Config:
    model: str
    name: str  # what it changes, for the table
    overrides: tuple[str, ...]
    profiled: bool = False  # the configuration its model's profile was measured under
    workers: int = 2  # more than this machine's 2 cores: its runs' records say they are not comparable

    @property
    def args(self) -> list[str]:
        return [*self.overrides, f"world_size={self.workers}"]

    @property
    def label(self) -> str:
        return f"{self.model} {self.name}"

    @property
    def folder(self) -> str:
        return re.sub(r"[^A-Za-z0-9_-]", "", self.label.replace(" ", "_").replace(",", "-"))


def configs(models: tuple[str, ...] = tuple(_MODELS)) -> list[Config]:
    out = []
    for model in models:
        b, cut, other_cuts, four = _MODELS[model]

        def add(
            name: str, *overrides: str, m: int = 4, profiled: bool = False, batch: int | None = None, workers: int = 2
        ):
            micro = [f"train.micro_batches={m}"] if m else []
            out.append(
                Config(
                    model,
                    name,
                    (f"model={model}", f"train.global_batch={batch or b * (m or 1)}", *overrides, *micro),
                    profiled,
                    workers,
                )
            )

        hippie = ("strategy=hippie", "strategy.recompute=none")
        add("hippie 1f1b m=4 (profiled)", *hippie, f"strategy.boundaries={cut}", profiled=True)
        for other in other_cuts:
            add(f"hippie cut {other}", *hippie, f"strategy.boundaries={other}")
        for m in (2, 8):
            add(f"hippie m={m} B={b * m}", *hippie, f"strategy.boundaries={cut}", m=m)
        for schedule in ("gpipe", "zb_h1"):
            add(f"hippie {schedule}", *hippie, f"strategy.boundaries={cut}", f"strategy.schedule={schedule}")
        add("hippie recompute=auto", "strategy=hippie", "strategy.recompute=auto", f"strategy.boundaries={cut}")
        add("pipelining 1f1b", "strategy=pipelining", f"strategy.boundaries={cut}")
        for schedule in ("interleaved_1f1b", "zbv"):
            add(
                f"pipelining {schedule}",
                "strategy=pipelining",
                f"strategy.schedule={schedule}",
                f"strategy.boundaries={four}",
            )
        add("deepspeed 1f1b", "strategy=deepspeed", f"strategy.boundaries={cut}")
        # the strategies without micro-batches compute the profile's size at a time: DP's 2 workers
        # each half the batch, AshPipe's stages the whole minibatch (one replica each) or half of
        # it (one stage of two replicas)
        add(f"dp B={2 * b}", "strategy=dp", m=0, batch=2 * b)
        add(
            f"ashpipe replicas=[1,1] B={b}",
            "strategy=ashpipe",
            "strategy.replicas=[1,1]",
            f"strategy.boundaries={cut}",
            m=0,
            batch=b,
        )
        add(f"ashpipe replicas=[2] B={2 * b}", "strategy=ashpipe", "strategy.replicas=[2]", m=0, batch=2 * b)
        # 4 workers on 2 cores, at the profile's size per worker: more replicas, more stages
        add(f"w=4 dp B={4 * b}", "strategy=dp", m=0, batch=4 * b, workers=4)
        add(
            f"w=4 hippie 2 stages x 2 replicas B={8 * b}", *hippie, f"strategy.boundaries={cut}", batch=8 * b, workers=4
        )
        add("w=4 hippie 4 stages", *hippie, "strategy.stages=4", f"strategy.boundaries={four}", workers=4)
        add(
            f"w=4 ashpipe replicas=[2,2] B={2 * b}",
            "strategy=ashpipe",
            "strategy.replicas=[2,2]",
            f"strategy.boundaries={cut}",
            m=0,
            batch=2 * b,
            workers=4,
        )
    return out


def runtimes(matrix: list[Config], model: str) -> list[tuple[str, ...]]:
    """The overrides of each runtime (strategy and schedule) whose overhead a model's profile needs
    beyond the profiled one's, one configuration each."""
    seen, out = set(), []
    for c in matrix:
        if c.model != model or c.profiled:
            continue
        key = tuple(o for o in c.overrides if o.startswith(("strategy=", "strategy.schedule=")))
        if key not in seen and key != ("strategy=hippie",):
            seen.add(key)
            out.append(c.args)
    return out


def _changed(matrix: list[Config], model: str) -> list[Config]:
    return [c for c in matrix if c.model == model and not c.profiled]


def _order(out: str, matrix: list[Config] | None = None) -> dict[str, list[Config]]:
    """Per model, the changed configurations of a repeat in the order they run, a profiled run
    before the first and after each: written by the repeat's start (from ``matrix``), read back
    by whatever reads the repeat (and by a repeat that goes on after an interruption)."""
    path = os.path.join(out, "order.json")
    if not os.path.exists(path):
        os.makedirs(out, exist_ok=True)
        with open(path, "w") as f:
            json.dump({m: [c.label for c in _changed(matrix, m)] for m in dict.fromkeys(c.model for c in matrix)}, f)
    with open(path) as f:
        by_label = {c.label: c for c in configs()}
        return {model: [by_label[label] for label in labels] for model, labels in json.load(f).items()}


def _profiled(matrix: list[Config], model: str) -> Config:
    return next(c for c in matrix if c.model == model and c.profiled)


def _anchor(out: str, model: str, i: int) -> str:
    return os.path.abspath(os.path.join(out, "measured", f"{model}_profiled_{i}"))


def run_repeat(
    out: str,
    matrix: list[Config],
    steps: int,
    cwd: str = ".",
    log=print,
    cli: Callable[[list[str], str, str | None], None] = run_or_raise,
) -> None:
    """One repeat into ``out``: each model profiled once (its runtimes' overheads added), then its
    profiled configuration run before the first and after every changed configuration, each run
    predicted from that one profile. A run or prediction already under ``out`` is kept (an
    interrupted repeat goes on where it stopped). ``cli(args, cwd, run_dir)`` runs one command,
    raising RuntimeError where it fails (default: ``python -m harness``, watched for a hang)."""
    common = [*COMMON, f"train.steps={steps}"]
    order = _order(out, matrix)

    def attempt(args: list[str], run_dir: str) -> None:
        """A command the tables can do without: its failure is said and the repeat goes on."""
        if not _done(run_dir):
            try:
                cli(args, cwd, run_dir)
            except RuntimeError as e:
                log(f"  failed, left out of the tables: {e}")

    for model, changed in order.items():
        base = _profiled(configs(), model)
        profile = os.path.abspath(os.path.join(out, "profiles", f"{model}.json"))
        if not os.path.exists(profile):
            log(f"  profiling {model} under {base.name} ...")
            cli(["profile", *base.args, *common, f"sim.out={profile}.part"], cwd)
            for overrides in runtimes([base, *changed], model):
                log(
                    f"  adding the runtime overhead of {' '.join(o for o in overrides if o.startswith('strategy'))} ..."
                )
                cli(["profile", *overrides, *common, f"sim.profile={profile}.part"], cwd)
            os.replace(f"{profile}.part", profile)
        for c in (base, *changed):
            attempt(
                ["simulate", *c.args, *common, f"sim.profile={profile}", "cluster=local_cpu", f"sim.draws={DRAWS}"],
                os.path.abspath(os.path.join(out, "simulated", c.folder)),
            )
        attempt(["run", *base.args, *common], _anchor(out, model, 0))
        for i, c in enumerate(changed, 1):
            attempt(["run", *c.args, *common], os.path.abspath(os.path.join(out, "measured", c.folder)))
            attempt(["run", *base.args, *common], _anchor(out, model, i))
        for row in _rows(out, model, changed):
            log(
                f"  {row['configuration']}: {row['measured']:.1f} samples/s measured, {row['predicted']:.1f} predicted "
                f"({row['error']:+.1%}"
                + (f", beside the profiled runs {row['relative error']:+.1%}" if row["table"] != "replay" else "")
                + f"), 80% interval {row['p10']:.1f}-{row['p90']:.1f}"
            )


def _done(run_dir: str) -> bool:
    """Whether the run or prediction finished there (a failed or interrupted one is run again)."""
    if not os.path.exists(os.path.join(run_dir, "metrics.json")):
        return False
    record, _ = read_record(run_dir)
    return record is not None and record.get("status") == "ok"


def _record(run_dir: str) -> dict:
    record, error = read_record(run_dir)
    if record is None:
        raise RuntimeError(error)
    return record


def _rows(out: str, model: str, changed: list[Config]) -> list[dict]:
    """A repeat's finished runs of one model: each run of its profiled configuration (the replay
    table) and of each changed one, against the prediction of it; a changed run's error beside the
    profiled runs before and after it too (its predicted ratio to the profiled configuration over
    the measured ratio: the host's drift since the profile cancels)."""
    base = _profiled(configs(), model)
    base_sim = os.path.join(out, "simulated", base.folder)
    if not _done(base_sim):
        return []
    anchors = {
        i: _record(_anchor(out, model, i))["throughput"]
        for i in range(len(changed) + 1)
        if _done(_anchor(out, model, i))
    }
    base_pred = _record(base_sim)

    def row(c: Config, measured: float, sim: dict) -> dict:
        p = sim["throughput"]
        return {
            "configuration": c.label,
            "model": c.model,
            "table": "changed" if c is not base else "replay",
            "measured": measured,
            "predicted": p,
            "error": p / measured - 1,
            "p10": sim["predicted_p10"],
            "median": sim["predicted_median"],
            "p90": sim["predicted_p90"],
            "inside": bool(sim["predicted_p10"] <= measured <= sim["predicted_p90"]),
        }

    rows = [row(base, m, base_pred) for m in anchors.values()]
    for i, c in enumerate(changed, 1):
        run_dir, sim_dir = (os.path.join(out, kind, c.folder) for kind in ("measured", "simulated"))
        beside = [anchors[j] for j in (i - 1, i) if j in anchors]
        if not (_done(run_dir) and _done(sim_dir) and beside):
            continue
        run = _record(run_dir)
        r = row(c, run["throughput"], _record(sim_dir))
        r["table"] = "changed" if run.get("speed_comparable", True) else MORE_WORKERS
        r["measured ratio"] = r["measured"] / (sum(beside) / len(beside))  # to the profiled runs beside it
        r["predicted ratio"] = r["predicted"] / base_pred["throughput"]
        r["relative error"] = r["predicted ratio"] / r["measured ratio"] - 1
        rows.append(r)
    return rows


def collect(out: str) -> pd.DataFrame:
    """Every finished run under ``out``/repeat*: measured, predicted, interval."""
    rows = []
    for r in itertools.count():
        folder = os.path.join(out, f"repeat{r}")
        if not os.path.exists(os.path.join(folder, "order.json")):
            break
        for model, changed in _order(folder).items():
            rows += [{"repeat": r, **row} for row in _rows(folder, model, changed)]
    return pd.DataFrame(rows)


def summarise(each: pd.DataFrame) -> pd.DataFrame:
    """Per configuration over its runs: measured and predicted means, the error of the means, the
    mean error beside the profiled runs, the median of the drawn runs and how many runs fell
    inside their prediction's 80% interval."""
    each = each.assign(
        **{
            k: each.get(k, 1.0 if "ratio" in k else float("nan"))
            for k in ("relative error", "measured ratio", "predicted ratio")
        }
    )
    table = (
        each.groupby("configuration", sort=False)
        .agg(
            table=("table", "first"),
            model=("model", "first"),
            runs=("measured", "size"),
            measured=("measured", "mean"),
            measured_min=("measured", "min"),
            measured_max=("measured", "max"),
            predicted=("predicted", "mean"),
            relative=("relative error", "mean"),
            measured_ratio=("measured ratio", "mean"),
            predicted_ratio=("predicted ratio", "mean"),
            drawn_median=("median", "mean"),
            inside=("inside", "sum"),
        )
        .reset_index()
    )
    table["error"] = table["predicted"] / table["measured"] - 1
    return table


def verdict(table: pd.DataFrame, each: pd.DataFrame) -> dict:
    """The changed table's targets: mean absolute error at most 7%, every configuration within 15%,
    mean signed error within 3%, and the order of any two configurations of one model whose
    measured throughputs differ by more than 10% kept by the predictions; the same figures beside
    the profiled runs; the coverage of the 80% intervals over every run (target 70-90%); the
    replay table's errors. Runs of more workers than cores (their records: not comparable) are
    given apart and judged by none of the targets."""

    def figures(errors: pd.Series) -> dict:
        return {
            "configurations": len(errors),
            "mean absolute error": float(errors.abs().mean()),
            "mean signed error": float(errors.mean()),
            "within 15%": int((errors.abs() <= TARGET_EACH).sum()),
            "largest": float(errors.iloc[errors.abs().argmax()]),
        }

    def met(r: dict) -> bool:
        return (
            r["mean absolute error"] <= TARGET_MAE
            and r["within 15%"] == r["configurations"]
            and abs(r["mean signed error"]) <= TARGET_SIGNED
        )

    changed = table[table["table"] == "changed"]
    out = {
        "replay": figures(table[table["table"] == "replay"]["error"]),
        "changed": figures(changed["error"]),
        "changed beside the profiled runs": figures(changed["relative"]),
    }
    crowded = table[table["table"] == MORE_WORKERS]
    if len(crowded):
        out[MORE_WORKERS] = figures(crowded["error"])
        out[f"{MORE_WORKERS} beside the profiled runs"] = figures(crowded["relative"])
    comparable = table[table["table"] != MORE_WORKERS]

    def swapped(measured: str, predicted: str) -> list[str]:
        out = []
        for (_, a), (_, b) in itertools.combinations(comparable.iterrows(), 2):
            if a["model"] != b["model"]:
                continue
            fast, slow = (a, b) if a[measured] > b[measured] else (b, a)
            if fast[measured] > (1 + RANK_GAP) * slow[measured] and fast[predicted] <= slow[predicted]:
                out.append(f"{fast['configuration']} / {slow['configuration']}")
        return out

    coverage = float(each[each["table"] != MORE_WORKERS]["inside"].mean())
    # the ranking on the means, and on each configuration's throughput over the profiled runs beside it
    ranking, ranking_beside = swapped("measured", "predicted"), swapped("measured_ratio", "predicted_ratio")
    out.update(
        {
            "ranking swapped": ranking,
            "ranking swapped beside the profiled runs": ranking_beside,
            "runs": len(each),
            "coverage of 80% intervals": coverage,
            "changed targets met": met(out["changed"]) and not ranking,
            "changed targets met beside the profiled runs": met(out["changed beside the profiled runs"])
            and not ranking_beside,
            "coverage target met": COVERAGE[0] <= coverage <= COVERAGE[1],
        }
    )
    return out


def write(out: str) -> str:
    """changed.csv (every run), changed.json (the verdict) and changed.md (the verdict, the two
    tables, every run) under ``out``, from the repeats there."""
    each = collect(out)
    if each.empty:
        raise RuntimeError(f"no finished configuration under {out}/repeat*")
    table = summarise(each)
    result = verdict(table, each)
    each.to_csv(os.path.join(out, "changed.csv"), index=False)
    today = measured_on(out)
    repeats = int(each["repeat"].max()) + 1
    with open(os.path.join(out, "changed.json"), "w") as f:
        json.dump({"date": today, "repeats": repeats, **result}, f, indent=1)

    def line(name: str) -> str:
        r = result[name]
        return (
            f"{name}: {r['configurations']} configurations, mean absolute error {r['mean absolute error']:.1%}, "
            f"mean signed {r['mean signed error']:+.1%}, {r['within 15%']} within 15%, largest {r['largest']:+.1%}"
        )

    def met(flag: bool) -> str:
        return "met" if flag else "not met"

    def pairs(swapped: list[str]) -> str:
        return (
            f"{len(swapped)} ({'; '.join(swapped)})"
            if 0 < len(swapped) <= 4
            else f"{len(swapped)}{' (changed.json lists them)' if swapped else ''}"
        )

    head = (
        f"Measured {today} on this machine: {result['runs']} runs in {repeats} repeat(s), each model profiled "
        f"once per repeat, its profiled configuration run before the first and after every other one.\n\n"
        f"- {line('replay')}\n- {line('changed')} (targets: mean absolute 7%, each 15%, signed ±3%, ranking; "
        f"{met(result['changed targets met'])})\n- {line('changed beside the profiled runs')} "
        f"({met(result['changed targets met beside the profiled runs'])})\n- pairs of one model ranked the "
        f"other way round (measured more than 10% apart): {pairs(result['ranking swapped'])} on the means; "
        f"{pairs(result['ranking swapped beside the profiled runs'])} beside the profiled runs\n- runs inside their "
        f"prediction's 80% interval: {result['coverage of 80% intervals']:.0%} (target 70-90%; "
        f"{met(result['coverage target met'])})"
    )
    if MORE_WORKERS in result:
        head += (
            f"\n- {line(MORE_WORKERS)}; beside the profiled runs "
            f"{result[MORE_WORKERS + ' beside the profiled runs']['mean signed error']:+.1%} mean signed "
            "(4 workers on 2 cores: their records say not comparable; no target)"
        )
    shown = table.assign(
        **{
            "measured min-max": [f"{a:.0f}-{b:.0f}" for a, b in zip(table.measured_min, table.measured_max)],
            "error of means": table["error"].map("{:+.1%}".format),
            "beside the profiled runs": table["relative"].map(lambda e: "" if pd.isna(e) else f"{e:+.1%}"),
            "inside 80%": [f"{i}/{n}" for i, n in zip(table.inside, table.runs)],
        }
    )
    columns = {
        "configuration": "configuration",
        "runs": "runs",
        "measured": "measured samples/s",
        "measured min-max": "measured min-max",
        "predicted": "predicted (medians)",
        "error of means": "error of means",
        "beside the profiled runs": "beside the profiled runs",
        "drawn_median": "drawn median",
        "inside 80%": "inside 80%",
    }
    parts = [head]
    for name, title in (
        ("replay", "Replay (the profiled configurations, every run of them)"),
        ("changed", "Changed (configurations not profiled)"),
        (MORE_WORKERS, "More workers than cores (not profiled; records say not comparable)"),
    ):
        keep = [k for k in columns if name != "replay" or k != "beside the profiled runs"]
        part = shown[shown["table"] == name][keep].rename(columns=columns)
        if part.empty:
            continue
        parts.append(f"{title}:\n\n{part.to_markdown(index=False, floatfmt='.1f')}")
    runs = each.assign(
        error=each["error"].map("{:+.1%}".format), interval=[f"{a:.1f}-{b:.1f}" for a, b in zip(each.p10, each.p90)]
    )
    parts.append(
        "Each run:\n\n"
        + runs[["repeat", "configuration", "measured", "predicted", "error", "interval", "inside"]].to_markdown(
            index=False, floatfmt=".1f"
        )
    )
    text = "\n\n".join(parts)
    with open(os.path.join(out, "changed.md"), "w") as f:
        f.write(text + "\n")
    return text
