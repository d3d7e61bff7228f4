"""The Hydra entry every config-driven command goes through."""

from __future__ import annotations

import sys
from typing import Callable

import hydra
from omegaconf import DictConfig

from harness.config.choices import refuse_unknown_choices
from harness.config.registry import CONFIG_DIR
from harness.config.schema import register_configs
from harness.config.spec import RunSpec, build_spec
from harness.core.errors import ConfigError

# a command that prints rather than records: no run directory, no log file
NO_OUTPUT_DIR = ["hydra.output_subdir=null", "hydra.run.dir=.", "hydra/job_logging=none", "hydra/hydra_logging=none"]


def hydra_command(task: Callable[[DictConfig], None], extra_overrides: list[str] = ()) -> None:
    """Run ``task`` as a Hydra app over ``conf/`` with this process's command line.

    Unknown config-group options are refused in one line first (exit 2), before Hydra
    composes anything; ``extra_overrides`` are appended to the command line."""
    register_configs()
    refuse_unknown_choices(sys.argv[1:], CONFIG_DIR)
    sys.argv += list(extra_overrides)
    hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="config")(task)()


def spec_or_exit(cfg: DictConfig, launching: bool = True) -> RunSpec:
    """The validated spec, or one ``error:`` line and exit 2 (``launching``: see build_spec)."""
    try:
        return build_spec(cfg, launching)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2)
