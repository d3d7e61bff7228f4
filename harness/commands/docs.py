"""Regenerate the generated pages of the documentation from the code.

``docs/reference/configuration.md`` is written from the configuration's dataclasses
(every key, default, rule and comment: harness.config.reference) and
``docs/reference/commands.md`` from this command line (every verb's help) and
``docs/reference/schedules.md`` from the schedule registry and ``docs/reference/columns.md``
from the table columns, their sets and the figures (harness.report). The test
suite checks that the committed pages equal what this writes (``--check``), so the
reference never drifts from what runs.

Example:
  pipebench docs            # after changing a key, a default or a command
"""

from __future__ import annotations

import argparse
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


def pages() -> dict[str, str]:
    from harness.config.reference import markdown

    return {
        os.path.join(DOCS, "reference", "configuration.md"): markdown(),
        os.path.join(DOCS, "reference", "commands.md"): commands_page(),
        os.path.join(DOCS, "reference", "schedules.md"): schedules_page(),
        os.path.join(DOCS, "reference", "columns.md"): columns_page(),
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
