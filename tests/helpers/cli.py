"""Composing configs and running the commands as a user would."""

from __future__ import annotations

import os
import subprocess
import sys

from hydra import compose, initialize_config_dir

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


def compose_config(overrides: list[str], return_hydra_config: bool = False):
    register_configs()
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        return compose(config_name="config", overrides=overrides, return_hydra_config=return_hydra_config)


def compose_jobs(base: list[str], jobs: list[list[str]]) -> list:
    """``compose_config([*base, *job])`` for every job, composing once per distinct set of config
    group choices (``strategy=``, ``+case=``, ...) and applying each job's value overrides to a copy,
    as Hydra's compose applies them after the defaults: a sweep's jobs differ mostly in values, and
    a compose costs about 0.1 s."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf

    parser = OverridesParser.create()

    def is_group(override: str) -> bool:
        key = override.split("=", 1)[0].lstrip("+~")
        return key.startswith("hydra") or os.path.isdir(os.path.join(CONFIG_DIR, key))

    composed, out = {}, []
    for job in jobs:
        groups = tuple(o for o in [*base, *job] if is_group(o))
        if groups not in composed:
            composed[groups] = compose_config(list(groups))
        cfg = OmegaConf.create(composed[groups])  # a copy with the same flags
        OmegaConf.set_struct(cfg, True)
        values = [o for o in [*base, *job] if not is_group(o)]
        ConfigLoaderImpl._apply_overrides_to_config(parser.parse_overrides(values), cfg)
        out.append(cfg)
    return out


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
