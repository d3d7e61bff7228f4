"""Where the Hydra config files are, and which strategy class each ``conf/strategy/<name>.yaml`` names.

A strategy's yaml names its class in ``_target_`` (Hydra's key for "the object
this node describes"), so adding a strategy is one Python file and one yaml:
nothing else lists the strategies.
"""

from __future__ import annotations

import functools
import importlib
import os

import yaml

from harness.core.errors import ConfigError


def _config_dir() -> str:
    """``conf/``: shipped inside the package by a regular install (``harness/conf``), beside the
    packages in a checkout or an editable install (the project's fixed layout)."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # harness/
    installed = os.path.join(here, "conf")
    return installed if os.path.isdir(installed) else os.path.join(os.path.dirname(here), "conf")


CONFIG_DIR = _config_dir()


def strategy_targets(config_dir: str = CONFIG_DIR) -> dict[str, str]:
    """Every strategy of ``config_dir/strategy/`` by name, with the class its yaml's ``_target_``
    names (read without importing anything: the workers' server preloads these modules)."""
    folder = os.path.join(config_dir, "strategy")
    targets = {}
    for file in sorted(f for f in os.listdir(folder) if f.endswith(".yaml")):
        with open(os.path.join(folder, file)) as f:
            target = (yaml.safe_load(f) or {}).get("_target_")
        if not isinstance(target, str) or "." not in target:
            raise RuntimeError(
                f"{os.path.join(folder, file)} must name its strategy class in _target_ "
                "(for example harness.strategies.hippie.HippieStrategy)"
            )
        targets[file[: -len(".yaml")]] = target
    return targets


def strategy_modules(config_dir: str = CONFIG_DIR) -> list[str]:
    """The modules that define the strategies (what every worker imports)."""
    return [target.rpartition(".")[0] for target in strategy_targets(config_dir).values()]


@functools.cache
def strategy_classes(config_dir: str = CONFIG_DIR) -> dict:
    """Every strategy of ``config_dir/strategy/``, by name, imported from its yaml's ``_target_``."""
    from harness.strategies.base import Strategy  # imports torch: only what builds the schema pays for it

    classes = {}
    for name, target in strategy_targets(config_dir).items():
        module, _, attr = target.rpartition(".")
        cls = getattr(importlib.import_module(module), attr)
        with open(os.path.join(config_dir, "strategy", f"{name}.yaml")) as f:
            declared = (yaml.safe_load(f) or {}).get("name")
        if not (isinstance(cls, type) and issubclass(cls, Strategy)) or cls.name != name or declared != name:
            raise RuntimeError(
                f"{target} (from {name}.yaml) must be a Strategy whose name is '{name}', as the file's "
                "name and its 'name' key are"
            )
        classes[name] = cls
    return classes


def strategy_class(name: str) -> type:
    classes = strategy_classes()
    if name not in classes:
        raise ConfigError(f"unknown strategy '{name}'; choose one of: {', '.join(sorted(classes))}")
    return classes[name]
