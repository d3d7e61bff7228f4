"""The benchmark (``pipebench bench``): our runtime against its peers on the same schedule.

Its matrix (:func:`configurations`: DP at one and two workers, Hippie's schedules with and
without recomputation, torch pipelining's and DeepSpeed's, AshPipe, on each model's given cut),
one run of it (:func:`run_one`, a real ``pipebench run``), what it keeps of a run
(:func:`reduced`), its summary (:func:`summarise`: medians, spreads, the ratios, where the time
goes) and its Markdown (:func:`markdown`); :func:`run` runs the matrix, repeats interleaved, and
writes ``bench.md`` and ``bench.json``.
"""

from __future__ import annotations

import os
import shutil

from harness.studies.driver import Outcome, interleaved, median, run_command, write

# each model's 2-stage cut, and the same layers in four stages around it (each rank then holds the
# same blocks in loop and in V placement as on two stages)
MODELS = {
    "vit_micro": {"batch": 64, "boundaries": "[3]", "four_stages": "[2,3,4]"},
    "vit_tiny": {"batch": 32, "boundaries": "[7]", "four_stages": "[4,7,10]"},
}
MICRO_BATCHES, STAGES = 4, 2
# torch pipelining's schedules of two stages per rank, by the benchmark's name for them
TORCH_MULTI_STAGE = {
    "pipelining_zb1p": "zero_bubble",
    "pipelining_interleaved": "interleaved_1f1b",
    "pipelining_zbv": "zbv",
    "pipelining_dualpipev": "dualpipev",
}
# the same schedules in our runtime, by the benchmark's name for them
HIPPIE_MULTI_STAGE = {name.replace("pipelining", "hippie"): schedule for name, schedule in TORCH_MULTI_STAGE.items()}
HIPPIE = (
    "hippie",
    "hippie_zb_h1",
    "hippie_recompute",
    "hippie_zb_h1_recompute",  # our synchronous schedules
    *HIPPIE_MULTI_STAGE,
    *(f"{name}_recompute" for name in HIPPIE_MULTI_STAGE),
)
PEERS_1F1B = ("pipelining", "deepspeed")
TORCH = ("pipelining", *TORCH_MULTI_STAGE)
BUBBLES = ("bubble_measured", "bubble_analytic", "bubble_replayed")  # from each run's record


def configurations(model: str) -> dict[str, list[str]]:
    m = MODELS[model]
    pipeline, four_stages = (
        ["world_size=2", f"train.micro_batches={MICRO_BATCHES}", f"strategy.boundaries={m[cut]}"]
        for cut in ("boundaries", "four_stages")
    )
    return {
        "dp_w1": ["strategy=dp", "world_size=1"],
        "dp_w2": ["strategy=dp", "world_size=2"],
        "hippie": ["strategy=hippie", *pipeline, "strategy.recompute=none"],
        "hippie_zb_h1": ["strategy=hippie", *pipeline, "strategy.recompute=none", "strategy.schedule=zb_h1"],
        # every layer of both stages recomputed: the split backward's I recomputes the last stage
        "hippie_recompute": ["strategy=hippie", *pipeline, "strategy.recompute=all"],
        "hippie_zb_h1_recompute": ["strategy=hippie", *pipeline, "strategy.recompute=all", "strategy.schedule=zb_h1"],
        "pipelining": ["strategy=pipelining", *pipeline],
        "deepspeed": ["strategy=deepspeed", *pipeline],
        **{
            name: ["strategy=pipelining", *four_stages, f"strategy.schedule={schedule}"]
            for name, schedule in TORCH_MULTI_STAGE.items()
        },
        **{
            f"{name}{suffix}": [
                "strategy=hippie",
                *four_stages,
                f"strategy.schedule={schedule}",
                f"strategy.recompute={rule}",
            ]
            for name, schedule in HIPPIE_MULTI_STAGE.items()
            for suffix, rule in (("", "none"), ("_recompute", "all"))
        },
        "ashpipe": [
            "strategy=ashpipe",
            "world_size=2",
            "strategy.replicas=[1,1]",
            f"strategy.boundaries={m['boundaries']}",
        ],
    }


def run_one(model: str, overrides: list[str], steps: int, folder: str) -> Outcome:
    # a fresh run: an earlier benchmark's files in its folder would be read with it (a run appends
    # to its steps log, as a resumed one must)
    shutil.rmtree(folder, ignore_errors=True)
    return run_command(
        [
            f"model={model}",
            f"train.global_batch={MODELS[model]['batch']}",
            *overrides,
            f"train.steps={steps}",
            "train.warmup_steps=3",
            "launch.threads_per_worker=1",
            "train.eval_samples=64",
            "data.train_size=2048",
            "data.test_size=64",
            "logger.mode=disabled",
        ],
        folder,
        deadline_s=900,
    )


def reduced(model: str, outcome: Outcome) -> dict:
    """What the benchmark reports of one run: its throughput, start-up, and from its profiled step
    (measured one way for every strategy: operator spans) the compute per sample summed over the
    ranks and the job's idle share."""
    record = outcome.record or {}
    compute = [r["idle"]["compute_s"] for r in record.get("per_rank") or [] if (r.get("idle") or {}).get("compute_s")]
    started = record.get("training_started_at")
    return {
        "status": outcome.status,
        "error": outcome.error,
        "throughput": record.get("throughput"),
        "startup_s": started - outcome.started_at if started else None,
        "compute_per_sample_s": sum(compute) / MODELS[model]["batch"] if compute else None,
        "peak_memory_bytes": record.get("peak_memory_bytes"),
        **{key: record.get(key) for key in BUBBLES},
    }


def summarise(runs: dict[str, dict[str, list[dict]]]) -> dict:
    """Per model: each configuration's samples/s (median, spread), the ratios, start-up and where the
    time goes; ``runs``: per model and configuration, each run as :func:`reduced` gives it."""
    out = {}
    for model, configs in runs.items():
        tp = {name: [r["throughput"] for r in rs if r.get("throughput")] for name, rs in configs.items()}
        med = {name: median(v) for name, v in tp.items()}
        t1 = med["dp_w1"]
        peers = [med[p] for p in PEERS_1F1B if med.get(p)]
        bubble_bound = 2 * t1 * MICRO_BATCHES / (MICRO_BATCHES + STAGES - 1) if t1 else None

        def ratio(a, b):
            return a / b if a and b else None

        startups = [r["startup_s"] for name, rs in configs.items() if name != "dp_w1" for r in rs if r.get("startup_s")]
        profile = {
            name: {
                key: median([r[key] for r in rs if r.get(key) is not None])
                for key in ("compute_per_sample_s", "peak_memory_bytes", *BUBBLES)
            }
            for name, rs in configs.items()
        }
        best_hippie = _best(med, HIPPIE)
        # torch pipelining's schedules that hold no more memory per rank than Hippie's best one
        within = [
            t
            for t in TORCH
            if best_hippie
            and (profile.get(t) or {}).get("peak_memory_bytes")
            and profile[t]["peak_memory_bytes"] <= profile[best_hippie]["peak_memory_bytes"]
        ]
        best_torch, best_torch_within = _best(med, TORCH), _best(med, within)
        c1 = profile["dp_w1"]["compute_per_sample_s"]
        for name, p in profile.items():
            # a configuration's ratio to its bound, workers T1 (1 - analytic bubble), is the product of
            # what a sample's compute costs here against one worker alone (inverted) and the share of
            # the schedule's time the workers spend computing at that cost (transfers, waits and
            # per-action overhead take the rest)
            workers = 1 if name == "dp_w1" else STAGES
            p["compute_inflation"] = ratio(p["compute_per_sample_s"], c1)
            if med[name] and p["compute_per_sample_s"]:
                p["of_schedule"] = (
                    med[name] * p["compute_per_sample_s"] / (workers * (1 - (p["bubble_analytic"] or 0.0)))
                )
        out[model] = {
            "samples_per_s": {
                name: {
                    "median": med[name],
                    "min": min(v) if v else None,
                    "max": max(v) if v else None,
                    "runs": len(v),
                    "failed": sum(r["status"] != "ok" for r in configs[name]),
                }
                for name, v in tp.items()
            },
            "ratios": {
                "hippie / best peer 1F1B": ratio(med["hippie"], max(peers) if peers else None),
                "best hippie schedule / best peer 1F1B": ratio(med.get(best_hippie), max(peers) if peers else None),
                "hippie_zb_h1 / hippie": ratio(med["hippie_zb_h1"], med["hippie"]),
                "hippie_zb_h1 / best peer 1F1B": ratio(med["hippie_zb_h1"], max(peers) if peers else None),
                "hippie_zb_h1 / pipelining_zb1p": ratio(med["hippie_zb_h1"], med.get("pipelining_zb1p")),
                **{
                    f"{name} / {torch}": ratio(med.get(name), med.get(torch))
                    for name, torch in zip(HIPPIE_MULTI_STAGE, TORCH_MULTI_STAGE)
                },
                "best hippie schedule / best torch schedule": ratio(med.get(best_hippie), med.get(best_torch)),
                "best hippie schedule / best torch schedule at no more memory per rank": ratio(
                    med.get(best_hippie), med.get(best_torch_within)
                ),
                "hippie / bubble bound": ratio(med["hippie"], bubble_bound),
                "ashpipe / dp_w2": ratio(med["ashpipe"], med["dp_w2"]),
                "ashpipe / no-bubble bound": ratio(med["ashpipe"], 2 * t1 if t1 else None),
            },
            "best": {"hippie": best_hippie, "torch": best_torch, "torch at no more memory": best_torch_within},
            "startup_s_median_2_workers": median(startups),
            "profile": profile,
        }
    return out


def _best(med: dict, names) -> str | None:
    """The fastest of ``names`` by median samples/s (None where none ran)."""
    ran = [n for n in names if med.get(n)]
    return max(ran, key=med.get) if ran else None


def markdown(summary: dict, repeats: int, steps: int) -> str:
    lines = [
        f"Benchmark: {repeats} repeat(s) interleaved, {steps} steps per run, 1 thread per worker, "
        f"{MICRO_BATCHES} micro-batches, {STAGES} stages on a given partition (torch's schedules of two "
        "stages per rank: the same layers in four), no recomputation but in the *_recompute rows.",
        "",
    ]

    def fmt(x, scale=1.0):
        return f"{x * scale:.1f}" if x is not None else "–"

    for model, s in summary.items():
        lines += [
            f"### {model} (global batch {MODELS[model]['batch']})",
            "",
            "| configuration | median samples/s | min | max | peak MiB/rank | runs ok |",
            "| --- | ---: | ---: | ---: | ---: | ---: |",
        ]
        for name, v in s["samples_per_s"].items():
            lines.append(
                f"| {name} | {fmt(v['median'])} | {fmt(v['min'])} | {fmt(v['max'])} | "
                f"{fmt(s['profile'][name].get('peak_memory_bytes'), 2**-20)} | {v['runs']}/{v['runs'] + v['failed']} |"
            )
        lines += ["", "| ratio | value |", "| --- | ---: |"]
        lines += [f"| {k} | {v:.3f} |" if v else f"| {k} | – |" for k, v in s["ratios"].items()]
        best = s["best"]
        lines += [
            "",
            f"Best: Hippie's {best['hippie'] or '–'}, torch pipelining's {best['torch'] or '–'}, and at no "
            f"more peak memory per rank than Hippie's best, {best['torch at no more memory'] or 'none'}.",
        ]
        lines += [
            "",
            "Where the time goes (the profiled step, measured one way for every strategy; medians):",
            "",
            "| configuration | compute per sample ms (all ranks) | vs dp_w1 | bubble measured % "
            "| analytic % | replayed % | of its schedule at that compute |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
        ]
        for name, p in s["profile"].items():
            cells = [
                f"{1e3 * p['compute_per_sample_s']:.3f}" if p["compute_per_sample_s"] else "–",
                f"{p['compute_inflation']:.3f}" if p.get("compute_inflation") else "–",
                *(fmt(p[key], 100) for key in BUBBLES),
                f"{p['of_schedule']:.3f}" if p.get("of_schedule") else "–",
            ]
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
        lines += [
            "",
            "A configuration's throughput over its bound, workers x T1 x (1 - analytic bubble), is "
            "(of its schedule at that compute) / (vs dp_w1): what a sample's compute costs with two "
            "workers on the machine against one alone, and the share of the schedule the workers "
            "spend computing at that cost (transfers, waits and per-action overhead take the rest).",
        ]
        startup = s["startup_s_median_2_workers"]
        lines += [
            "",
            f"Start-up (command to first training step, 2-worker runs, median): {startup:.1f} s"
            if startup
            else "Start-up: –",
            "",
        ]
    return "\n".join(lines)


def run(models: list[str], repeats: int, steps: int, out: str) -> str:
    """Every configuration of ``models``, ``repeats`` rounds interleaved, ``steps`` steps per run, each
    run in ``<out>/<model>/<configuration>_r<repeat>``; writes ``bench.md`` and ``bench.json`` into
    ``out`` and returns the Markdown."""
    configs = {f"{model} {name}": overrides for model in models for name, overrides in configurations(model).items()}

    def one(label: str, overrides: list[str], r: int) -> Outcome:
        model, name = label.split()
        return run_one(model, overrides, steps, os.path.join(out, model, f"{name}_r{r}"))

    outcomes = interleaved(configs, repeats, one, shown=lambda o: f"{o.record['throughput']:.1f} samples/s")
    runs: dict[str, dict[str, list[dict]]] = {model: {} for model in models}
    for label, results in outcomes.items():
        model, name = label.split()
        runs[model][name] = [reduced(model, o) for o in results]
    summary = summarise(runs)
    text = markdown(summary, repeats, steps)
    write(out, "bench", text, {"summary": summary, "runs": runs, "repeats": repeats, "steps": steps})
    return text
