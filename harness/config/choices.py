"""Unknown config-group options refused in one line, before Hydra composes anything.

Hydra's own refusal of ``model=vit_nope`` spreads the options over a dozen
lines with its search path, and in a sweep it stops every job; this check runs
first, on the command line.
"""

from __future__ import annotations

import os

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import ChoiceSweep


def unknown_choice(overrides: list[str], config_dir: str) -> str | None:
    """The first override choosing a config-group option that has no file in ``conf/<group>/``,
    as one line listing the options (Hydra's own refusal spreads them over a dozen lines with its
    search path). Malformed overrides and interpolations are left to Hydra."""
    overrides = [a for a in overrides if "=" in a and not a.startswith("-")]  # not Hydra's flags (-m, -cn x)
    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except Exception:
        return None
    for override in parsed:
        group = override.key_or_group
        folder = os.path.join(config_dir, group)
        if group.startswith("hydra") or override.is_delete() or not os.path.isdir(folder):
            continue
        if override.is_sweep_override():
            values = list(override.sweep_string_iterator()) if isinstance(override.value(), ChoiceSweep) else []
        else:
            values = [override.value()] if isinstance(override.value(), str) else []
        options = _options(folder)
        for value in values:
            if value not in options and not value.startswith("${"):
                return f"unknown {group} '{value}': choose one of {', '.join(options)} (conf/{group}/)"
    return None


def _options(folder: str) -> list[str]:
    """Every option of a config group, those in its sub-folders as Hydra names them (``ci/speed_dp_w1``)."""
    return sorted(
        os.path.relpath(os.path.join(root, name), folder)[: -len(".yaml")].replace(os.sep, "/")
        for root, _, names in os.walk(folder)
        for name in names
        if name.endswith(".yaml")
    )
