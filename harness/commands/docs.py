"""Regenerate the generated pages of the documentation from the code.

``docs/reference/configuration.md`` is written from the configuration's dataclasses
(every key, default, rule and comment: harness.config.reference) and
``docs/reference/commands.md`` from this command line (every verb's help) and
``docs/reference/schedules.md`` from the schedule registry, ``docs/reference/columns.md``
from the table columns, their sets and the figures (harness.report), and
``docs/reference/models.md`` from ``conf/model/`` (parameters and FLOPs per sample), and
``docs/studies/provenance.md`` from the records under ``results/`` (each study's commit,
dates and machine). The test
suite checks that the committed pages equal what this writes (``--check``), so the
reference never drifts from what runs.

Example:
  pipebench docs            # after changing a key, a default or a command
"""

from __future__ import annotations

import argparse
import math
import os
import sys

# the checkout's docs/ (the pages are the project's, not the installed package's)
DOCS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "docs")
WIDTH = "100"  # argparse wraps help to the terminal: one width, so the page does not depend on it


def commands_page() -> str:
    from harness.commands import VERBS, verb_parser

    os.environ["COLUMNS"] = WIDTH
    lines = [
        "# Commands reference",
        "",
        "Generated from the command line by `pipebench docs` (a test checks that this page equals what it "
        "writes). `pipebench <command> --help` prints the same. `python -m harness <command>` is the same as "
        "`pipebench <command>`, and `python -m harness` alone runs the main job.",
        "",
        "| command | what it does |",
        "| --- | --- |",
    ]
    lines += [f"| [`{verb}`](#pipebench-{verb}) | {line} |" for verb, line in VERBS.items()]
    for verb in VERBS:
        lines += ["", f"## pipebench {verb}", "", "```text", verb_parser(verb).format_help().rstrip(), "```"]
    return "\n".join(lines) + "\n"


def schedules_page() -> str:
    from harness.runtime.schedules import SCHEDULES

    placement = {
        "one": "one stage per rank",
        "loop": "loop: stage i on rank i mod P",
        "v": "V: rank r holds stages r and 2P-1-r",
    }
    lines = [
        "# Schedules reference",
        "",
        "Generated from the schedule registry (`harness/runtime/schedules.py`) by `pipebench docs`. "
        "[Schedules](../methods/schedules.md) explains them; `strategy.schedule=<name>` picks one.",
        "",
        "| schedule | what it is | stages per rank | placement | backward | flush | our runtime (hippie, "
        "ashpipe) | torch pipelining |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for s in SCHEDULES.values():
        per_rank = str(s.stages_per_rank) if s.stages_per_rank else f">= 2 (default {s.default_stages_per_rank})"
        lines.append(
            f"| `{s.name}` | {s.summary} | {per_rank} | {placement[s.placement]} | "
            f"{'input (I) and weight (W) parts' if s.splits_backward else 'whole'} | "
            f"{'none (asynchronous)' if s.asynchronous else 'every step'} | {'yes' if s.ours else '-'} | "
            f"{f'`{s.library}`' if s.library else '-'} |"
        )
    return "\n".join(lines) + "\n"


def columns_page() -> str:
    from harness.report.columns import COLUMNS, DEFAULT_SET, select, set_names
    from harness.report.figures import FIGURES

    lines = [
        "# Columns and figures reference",
        "",
        "Generated from `harness/report/columns.py` and `harness/report/figures.py` by `pipebench docs`. "
        f"`pipebench results <sweep> --columns <set or keys>` picks the columns (`{DEFAULT_SET}` by default); "
        "[metrics](../concepts/metrics.md) defines each figure.",
        "",
        "| set | columns |",
        "| --- | --- |",
    ]
    for name in set_names():
        shown = [c.key for c in select(name)]
        lines.append(f"| `{name}` | {', '.join(f'`{k}`' for k in shown)} |")
    lines += [
        "",
        "| key | label | CSV header | unit | better | measured (mean ± 95% interval) | sets |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for c in COLUMNS:
        lines.append(
            f"| `{c.key}` | {c.label} | `{c.csv_header}` | {c.unit or '-'} | {c.better or '-'} | "
            f"{'yes' if c.figure else '-'} | {', '.join(c.sets) or '-'} |"
        )
    lines += ["", "| figure | what it shows |", "| --- | --- |"]
    lines += [f"| `{f.name}` | {f.shows} |" for f in FIGURES]
    return "\n".join(lines) + "\n"


def models_page() -> str:
    """Each model of ``conf/model/`` in parameters and training FLOPs per sample (counted on the meta
    device, as MFU counts them: :mod:`harness.metrics.flops`)."""
    import glob

    from omegaconf import OmegaConf

    from harness.config.schema import ModelConfig
    from harness.core.models import parameter_shapes
    from harness.metrics.flops import layer_flops

    conf = os.path.join(os.path.dirname(DOCS), "conf", "model")
    lines = [
        "# Models reference",
        "",
        "Generated from `conf/model/` by `pipebench docs`: the Vision Transformers a run can pick with "
        "`model=<name>`, each with a 100-class head. Parameters are counted on the model as built; training "
        "FLOPs per sample are one forward and one backward of every layer at the model's image size, counted "
        "as [MFU](../concepts/metrics.md) counts them (matrix products and attention only).",
        "",
        "| model | image | patch | tokens | width | blocks | heads | parameters | training GFLOP/sample |",
        "| --- | --: | --: | --: | --: | --: | --: | --: | --: |",
    ]
    rows = []
    for path in glob.glob(os.path.join(conf, "*.yaml")):
        raw = {k: v for k, v in OmegaConf.to_container(OmegaConf.load(path)).items() if k != "defaults"}
        m = ModelConfig(**raw)
        params = sum(map(math.prod, parameter_shapes(m).values()))
        gflops = sum(f + b for f, b in layer_flops(m, 1, m.img_size)) / 1e9
        tokens = (m.img_size // m.patch_size) ** 2 + 1
        shown = f"{gflops:.0f}" if gflops >= 100 else f"{gflops:.3g}"
        rows.append(
            (
                params,
                f"| `{m.name}` | {m.img_size} | {m.patch_size} | {tokens} | {m.embed_dim} | {m.depth} | "
                f"{m.num_heads} | {_count(params)} | {shown} |",
            )
        )
    lines += [line for _, line in sorted(rows)]
    return "\n".join(lines) + "\n"


def _count(n: int) -> str:
    """``632M``, ``5.5M``, ``110k``: three significant digits."""
    for unit, scale in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g}{unit}"
    return str(n)


def provenance_page() -> str:
    """Where every committed study's runs came from, read from their records."""
    from harness.report.checks import environments, provenance, studies

    root = os.path.join(os.path.dirname(DOCS), "results")
    lines = [
        "# Where each study came from",
        "",
        "Generated from the records under `results/` by `pipebench results`' provenance check, through "
        "`pipebench docs` (a test checks that this page equals what it writes). A study is run from a clean "
        "tree at one commit; a row that says otherwise is named in the last column and fails the suite until "
        "the study is rerun. The machine is the runs' CPU and core count; dates are the runs' start (UTC).",
        "",
        "| study | runs | commit | dates | machine | torch | check |",
        "| --- | --: | --- | --- | --- | --- | --- |",
    ]
    for study in studies(root):
        found = environments(os.path.join(root, study))
        if not found:
            continue
        envs = [e for e, _ in found]
        commits = sorted({str(e.get("git_commit"))[:7] for e in envs if e.get("git_commit")})
        days = sorted({t[:10] for _, t in found if t})
        machines = sorted({f"{e.get('cpu')}, {e.get('cpu_cores')} cores" for e in envs if e.get("cpu")})
        torch = sorted({str((e.get("packages") or {}).get("torch")) for e in envs if e.get("packages")})
        problems = provenance([{"environment": e} for e in envs])
        lines.append(
            f"| `{study}` | {len(found)} | {', '.join(f'`{c}`' for c in commits) or '-'} | "
            f"{' to '.join(dict.fromkeys([days[0], days[-1]])) if days else '-'} | {'; '.join(machines) or '-'} | "
            f"{', '.join(torch) or '-'} | {'; '.join(problems) or 'one commit, clean tree'} |"
        )
    return "\n".join(lines) + "\n"


def pages() -> dict[str, str]:
    from harness.config.reference import markdown

    return {
        os.path.join(DOCS, "reference", "configuration.md"): markdown(),
        os.path.join(DOCS, "reference", "commands.md"): commands_page(),
        os.path.join(DOCS, "reference", "schedules.md"): schedules_page(),
        os.path.join(DOCS, "reference", "columns.md"): columns_page(),
        os.path.join(DOCS, "reference", "models.md"): models_page(),
        os.path.join(DOCS, "studies", "provenance.md"): provenance_page(),
    }


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--check",
        action="store_true",
        help="write nothing; exit 1 if a committed page differs from what the code generates",
    )


def main(args: argparse.Namespace) -> int:
    stale = []
    for path, text in pages().items():
        current = open(path).read() if os.path.isfile(path) else None
        if current == text:
            continue
        stale.append(os.path.relpath(path))
        if not args.check:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as f:
                f.write(text)
    if args.check and stale:
        print(f"error: {', '.join(stale)} differ from the code; run pipebench docs and commit them", file=sys.stderr)
        return 1
    print(f"{'checked' if args.check else 'wrote'}: {', '.join(stale) or 'nothing changed'}")
    return 0
