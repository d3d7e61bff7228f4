"""Composing configs and running the commands as a user would."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from unittest import mock

from hydra import compose, initialize_config_dir
from hydra._internal.config_loader_impl import ConfigLoaderImpl
from hydra._internal.config_repository import ConfigRepository
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.plugins.config_source import ConfigResult
from omegaconf import DictConfig, OmegaConf

from harness.config.registry import CONFIG_DIR
from harness.config.schema import register_configs
from harness.config.spec import RunSpec, build_spec

ROOT = os.path.dirname(CONFIG_DIR)

# small enough for 2 cores: a few steps of vit_micro on a small synthetic split
TINY = [
    "train.steps=5",
    "train.warmup_steps=1",
    "train.global_batch=16",
    "data.train_size=256",
    "data.test_size=128",
    "logger.mode=disabled",
]


_LOADED: dict[str, ConfigResult | None] = {}
_LOAD = ConfigRepository.load_config


def _load_once(repository: ConfigRepository, config_path: str) -> ConfigResult | None:
    """A config file as Hydra's repository loads it, read and parsed once in the session (a copy
    each time: Hydra edits what it loads). About a quarter of a compose is parsing the same files."""
    if _LOADED.get(config_path) is None:  # one not found may be registered later
        _LOADED[config_path] = _LOAD(repository, config_path)
    return copy.deepcopy(_LOADED[config_path])


def hydra_compose(overrides: list[str], return_hydra_config: bool = False, parse_once: bool = True):
    """Hydra's own compose, as the commands compose (the files it reads parsed once, unless told)."""
    register_configs()
    with (
        initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"),
        mock.patch.object(ConfigRepository, "load_config", _load_once if parse_once else _LOAD),
    ):
        return compose(config_name="config", overrides=overrides, return_hydra_config=return_hydra_config)


_PARSER = OverridesParser.create()
_COMPOSED: dict[tuple[str, ...], DictConfig] = {}


def _selects_a_group(override: str) -> bool:
    key = override.split("=", 1)[0].lstrip("+~")
    return key.startswith("hydra") or os.path.isdir(os.path.join(CONFIG_DIR, key))


def compose_config(overrides: list[str], return_hydra_config: bool = False):
    """What :func:`hydra_compose` gives, composing once per distinct set of config group choices
    (``strategy=``, ``+case=``, ...) in the session and applying the value overrides to a copy, as
    Hydra's compose applies them after the defaults (the same function): the tests compose
    hundreds of configs differing mostly in values, and a compose costs about 0.1 s.
    ``test_config`` checks the two agree."""
    if return_hydra_config:
        return hydra_compose(overrides, return_hydra_config=True)
    groups = tuple(o for o in overrides if _selects_a_group(o))
    if groups not in _COMPOSED:
        _COMPOSED[groups] = hydra_compose(list(groups))
    cfg = OmegaConf.create(_COMPOSED[groups])  # a copy, with the schema's types and flags
    OmegaConf.set_struct(cfg, True)
    values = [o for o in overrides if not _selects_a_group(o)]
    ConfigLoaderImpl._apply_overrides_to_config(_PARSER.parse_overrides(values), cfg)
    return cfg


def make_spec(*overrides: str) -> RunSpec:
    return build_spec(compose_config(list(overrides)))


def run_cli(args: list[str], cwd: str, timeout: float = 240, verb: str | None = None, env: dict | None = None):
    """``pipebench <verb> args`` (``python -m harness``: ``run`` without a verb) as a user would run it,
    in ``cwd``."""
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", "WANDB_SILENT": "true", **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "harness", *([verb] if verb else []), *args],
        cwd=cwd,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def pipebench(capfd, verb: str, *args: str) -> subprocess.CompletedProcess:
    """``pipebench <verb> args`` run in this process: the command's own code path (its checks, its
    Hydra app, its workers, its records) without starting a new interpreter, which costs several
    seconds a command on 2 cores. Its exit status and what it printed, its workers' output included
    (``capfd`` captures the file descriptors they write to). Tests that need the process boundary
    (signals, exit through the shell, processes left behind, an installed copy) use :func:`run_cli`."""
    from harness import commands

    capfd.readouterr()  # only this command's output
    try:
        code = commands.main([verb, *args])
    except SystemExit as e:  # argparse, Hydra and the refusals exit
        code = e.code if isinstance(e.code, int) else int(e.code is not None)
    out, err = capfd.readouterr()
    return subprocess.CompletedProcess([verb, *args], code, out, err)
