"""Closed option sets and numeric ranges, declared beside each config key, checked in one place.

A key with a fixed set of meanings (a mode, a method, a name) is declared with
:func:`choice`, a number with a valid range (a size, a count, a rate, a timeout, a
seed) with :func:`bounded`; both are plain dataclass fields carrying their rule in
the field's metadata. :func:`check_node` walks a config node (and the dataclasses
inside it) and refuses the first value outside its rule in one line that names the
key and what is allowed, so a misspelt value never falls through to a library's
default behaviour. The run spec calls it for the whole config and for the
strategy's own keys before any process starts (:mod:`harness.config.spec`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from harness.core.errors import ConfigError


def choice(default: Any, *allowed: str) -> Any:
    """A field whose value must be one of ``allowed`` (unset, None, passes)."""
    return dataclasses.field(default=default, metadata={"choices": allowed})


def bounded(default: Any, low: float | None = None, high: float | None = None, *, above: bool = False) -> Any:
    """A numeric field: at least ``low`` (strictly more with ``above``), at most ``high``."""
    return dataclasses.field(default=default, metadata={"range": (low, high, above)})


def check_value(key: str, value: Any, rule: dict) -> None:
    """Refuse ``value`` of ``key`` if it breaks the field's rule (``metadata`` of choice/bounded)."""
    if value is None:
        return
    if "choices" in rule and value not in rule["choices"]:
        raise ConfigError(f"{key}={value} is not one of {', '.join(map(str, rule['choices']))}")
    if "range" in rule:
        low, high, above = rule["range"]
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{key}={value} must be a number")
        if low is not None and (value <= low if above else value < low):
            raise ConfigError(f"{key}={value} must be {'more than' if above else 'at least'} {low}")
        if high is not None and value > high:
            raise ConfigError(f"{key}={value} must be at most {high}")


def check_node(node: Any, prefix: str = "") -> None:
    """Every declared rule of the dataclass ``node`` and of the dataclasses it holds."""
    for f in dataclasses.fields(node):
        value = getattr(node, f.name)
        if dataclasses.is_dataclass(value):
            check_node(value, f"{prefix}{f.name}.")
        else:
            check_value(f"{prefix}{f.name}", value, f.metadata)
