"""The configuration reference, generated from the code that defines it.

Every key is a field of a dataclass (the schema's groups, each strategy's ``Config``),
declared with its default, its rule (:mod:`harness.core.options`: a closed set or a
range) and the comment above it, which is its documentation. :func:`markdown` writes
them as the reference page (``docs/reference/configuration.md``, by ``pipebench docs``),
so the page cannot drift from what runs.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import textwrap
import typing

from harness.config import schema
from harness.config.registry import strategy_classes

# the schema's groups, in the page's order: (key prefix, dataclass, what the group is)
GROUPS = [
    ("", None, "Top-level keys"),
    ("model.", schema.ModelConfig, "A timm Vision Transformer (`model=` picks a preset of conf/model/)"),
    ("data.", schema.DataConfig, "The data set (`data=synthetic`, `cifar100` or `digits`)"),
    ("train.", schema.TrainConfig, "Training: batch, length, optimizer, schedule, precision, evaluation, checkpoints"),
    ("launch.", schema.LaunchConfig, "How the workers start and fail"),
    ("logger.", schema.LoggerConfig, "wandb (a mirror of the local record)"),
    ("cluster.", schema.ClusterConfig, "The cluster the simulator predicts on (`cluster=` picks a preset)"),
    ("sim.", schema.SimConfig, "Where the simulator's compute costs come from"),
]
_TOP = ("world_size", "seed", "repeat", "tag", "block")


def _comments(cls: type) -> dict[str, str]:
    """Each field's comment: the ``#`` lines right above its declaration and one after it on its line."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):  # a subclass's comment wins over its base's
        if not dataclasses.is_dataclass(klass) or klass.__module__ == "types":
            continue
        try:
            lines, _ = inspect.getsourcelines(klass)
        except (OSError, TypeError):
            continue
        tree = ast.parse(textwrap.dedent("".join(lines)))
        for node in tree.body[0].body:
            if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
                continue
            above, i = [], node.lineno - 2
            while i >= 0 and lines[i].strip().startswith("#"):
                above.insert(0, lines[i].strip().lstrip("#").strip())
                i -= 1
            inline = lines[node.lineno - 1].split("#", 1)[1].strip() if "#" in lines[node.lineno - 1] else ""
            text = " ".join([*above, inline]).strip()
            if text:
                docs[node.target.id] = text
    return docs


def _type_name(hint) -> str:
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if typing.get_origin(hint) is typing.Union and len(args) == 1:
        return _type_name(args[0])
    if typing.get_origin(hint) is list:
        return f"list[{_type_name(typing.get_args(hint)[0])}]"
    return getattr(hint, "__name__", str(hint)).replace("typing.", "")


def _rule(field: dataclasses.Field) -> str:
    meta = field.metadata
    if "choices" in meta:
        return " \\| ".join(f"`{c}`" for c in meta["choices"])
    if "range" in meta:
        low, high, above = meta["range"]
        parts = [
            f"{'>' if above else '>='} {low:g}" if low is not None else "",
            f"<= {high:g}" if high is not None else "",
        ]
        return ", ".join(p for p in parts if p)
    return ""


def _default(field: dataclasses.Field) -> str:
    if field.default is not dataclasses.MISSING:
        value = field.default
    elif field.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        return "(a group)"
    else:
        return "(required)"
    return "unset" if value is None else f"`{value}`"


def keys(cls: type, prefix: str, only: tuple[str, ...] | None = None) -> list[dict]:
    """One row per key of ``cls``: key, type, default, allowed values, meaning."""
    hints = typing.get_type_hints(cls)
    docs = _comments(cls)
    rows = []
    for field in dataclasses.fields(cls):
        if field.name in ("name", "_target_") or (only and field.name not in only):
            continue
        rows.append(
            {
                "key": prefix + field.name,
                "type": _type_name(hints[field.name]),
                "default": _default(field),
                "allowed": _rule(field),
                "meaning": docs.get(field.name, ""),
            }
        )
    return rows


def _table(rows: list[dict]) -> list[str]:
    out = ["| key | type | default | allowed | meaning |", "| --- | --- | --- | --- | --- |"]
    for r in rows:
        meaning = r["meaning"].replace("|", "\\|")
        out.append(f"| `{r['key']}` | {r['type']} | {r['default']} | {r['allowed']} | {meaning} |")
    return out


def markdown() -> str:
    lines = [
        "# Configuration reference",
        "",
        "Generated from the code by `pipebench docs` (a test checks that this page equals what it writes): "
        "every key, its type, default, allowed values and the comment that declares it. Set a key on the "
        "command line as `key=value` (a sweep: `key=a,b` with `-m`); `pipebench run --show [overrides]` "
        "prints the values a run will use, every default and derived value filled in.",
        "",
    ]
    for prefix, cls, title in GROUPS:
        lines += [f"## {title}", ""]
        rows = keys(schema.RunConfig, "", _TOP) if cls is None else keys(cls, prefix)
        lines += [*_table(rows), ""]
    lines += [
        "## Strategies",
        "",
        "`strategy=<name>` picks a strategy (conf/strategy/<name>.yaml names its class). Each reads only its "
        "own `strategy.*` keys, below with their defaults; a key of another strategy is refused in one line, "
        "and a pipeline key (`stages`, `boundaries`, `schedule`, `recompute`) that a strategy has no concept "
        "of is recorded as ignored, so a sweep over strategies can share it.",
        "",
    ]
    for name, cls in strategy_classes().items():
        doc = (inspect.getdoc(inspect.getmodule(cls)) or "").split("\n\n")[0].replace("\n", " ")
        lines += [f"### `strategy={name}`", "", doc, "", *_table(keys(cls.Config, "strategy.")), ""]
    return "\n".join(lines).rstrip() + "\n"
