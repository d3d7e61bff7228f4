"""The shared names (idle parts, memory parts, their column keys, the reference strategy) are
declared once, in harness/core/vocabulary.py: a second list of them anywhere in harness/ or
baselines/ fails here, as does the reference strategy's name spelled out in the report or metrics."""

from __future__ import annotations

import ast
import os

import pytest

from harness.config.registry import strategy_targets
from harness.core.vocabulary import (
    IDLE_PARTS,
    MEMORY_PARTS,
    REFERENCE_STRATEGY,
    idle_field,
    memory_field,
)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HOME = os.path.join("harness", "core", "vocabulary.py")
# where the reference's name may not appear at all: what compares runs with it
NO_REFERENCE_NAME = (os.path.join("harness", "report"), os.path.join("harness", "metrics"))
VOCABULARIES = {
    "idle parts": set(IDLE_PARTS),
    "memory parts": set(MEMORY_PARTS),
    "idle columns": {idle_field(p) for p in IDLE_PARTS},
    "memory columns": {memory_field(p) for p in MEMORY_PARTS},
}
COLUMN_KEYS = ("idle columns", "memory columns")


def _strings(nodes) -> set[str]:
    return {n.value for n in nodes if isinstance(n, ast.Constant) and isinstance(n.value, str)}


def _names_strategy(node: ast.AST) -> bool:
    """Whether an expression reads a strategy: ``strategy``, ``r["strategy"]``, ``spec.strategy.name``."""
    return any(
        (isinstance(n, ast.Name) and "strategy" in n.id.lower())
        or (isinstance(n, ast.Attribute) and "strategy" in n.attr.lower())
        or (isinstance(n, ast.Constant) and n.value == "strategy")
        for n in ast.walk(node)
    )


def second_lists(source: str, path: str) -> list[str]:
    """What in one module repeats the vocabulary: a tuple, list, set or dict's keys naming all the
    parts of one vocabulary but at most one; every column key of a vocabulary named in one module;
    the reference's name compared with a strategy or as a default, or anywhere at all in the
    report and the metrics."""
    tree = ast.parse(source, path)
    found = []
    everywhere = _strings(ast.walk(tree))
    for what in COLUMN_KEYS:
        if VOCABULARIES[what] <= everywhere:
            found.append(f"{path}: every one of the {what} named")
    strict = path.startswith(NO_REFERENCE_NAME)
    for node in ast.walk(tree):
        here = f"{path}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            items = _strings(node.elts)
        elif isinstance(node, ast.Dict):
            items = _strings(k for k in node.keys if k is not None)
        else:
            items = set()
        for what, parts in VOCABULARIES.items():
            if len(items & parts) >= max(2, len(parts) - 1):
                found.append(f"{here}: a second list of the {what}")
        if isinstance(node, ast.Constant) and node.value == REFERENCE_STRATEGY and strict:
            found.append(f"{here}: {REFERENCE_STRATEGY!r} spelled out (the reference strategy: the vocabulary's)")
        elif isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if REFERENCE_STRATEGY in _strings(sides) and any(_names_strategy(s) for s in sides):
                found.append(f"{here}: a strategy compared with {REFERENCE_STRATEGY!r} (the vocabulary's)")
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            defaults = [*node.args.defaults, *(d for d in node.args.kw_defaults if d is not None)]
            if REFERENCE_STRATEGY in _strings(defaults):
                found.append(f"{here}: {REFERENCE_STRATEGY!r} as a default (the vocabulary's)")
    return found


def _modules():
    for folder in ("harness", "baselines"):
        for dirpath, _, files in os.walk(os.path.join(ROOT, folder)):
            for file in sorted(files):
                if file.endswith(".py"):
                    path = os.path.relpath(os.path.join(dirpath, file), ROOT)
                    if path != HOME:
                        yield path


def test_every_vocabulary_is_declared_once():
    found = []
    for path in _modules():
        with open(os.path.join(ROOT, path)) as f:
            found += second_lists(f.read(), path)
    assert not found, "declare these in harness/core/vocabulary.py and read them from there:\n" + "\n".join(found)


@pytest.mark.parametrize(
    "path,source",
    [
        ("harness/report/x.py", 'PARTS = ("compute", "peer_wait", "collective", "exposed_comm", "host")'),
        ("harness/report/x.py", 'NAMES = {"peer_wait": "a", "collective": "b", "exposed_comm": "c", "host": "d"}'),
        ("harness/metrics/x.py", 'MEMORY = ("parameters", "gradients", "optimizer_state", "stashed_weights")'),
        ("harness/report/x.py", 'def f(x: Literal["compute", "peer_wait", "collective", "exposed_comm", "host"]): ...'),
        ("harness/report/x.py", "\n".join(f'C{i} = "{idle_field(p)}"' for i, p in enumerate(IDLE_PARTS))),
        ("harness/report/x.py", "\n".join(f'C{i} = "{memory_field(p)}"' for i, p in enumerate(MEMORY_PARTS))),
        ("harness/report/x.py", 'REFERENCE = "dp"'),
        ("harness/metrics/x.py", 'COLORS = {"dp": "#000000"}'),
        ("harness/x.py", 'def f(records, reference="dp"): ...'),
        ("harness/x.py", 'def f(records, *, reference="dp"): ...'),
        ("harness/x.py", 'ok = r["strategy"] == "dp"'),
        ("baselines/x.py", 'ok = "dp" != spec.strategy.name'),
    ],
)
def test_a_second_list_fails(path, source):
    assert second_lists(source, path)


@pytest.mark.parametrize(
    "path,source",
    [
        ("harness/metrics/x.py", 'part = "compute" if busy else "host"'),
        ("harness/strategies/x.py", 'parts = {"parameters": p, "optimizer_state": o, "stashed_weights": s}'),
        ("harness/strategies/x.py", 'if state["mode"] == "dp": ...'),
        ("baselines/x.py", 'name = "dp"'),
    ],
)
def test_what_is_not_a_second_list_passes(path, source):
    assert not second_lists(source, path)


def test_the_reference_is_a_strategy():
    assert REFERENCE_STRATEGY in strategy_targets()
