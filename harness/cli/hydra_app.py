"""The Hydra entry of every config-driven command, and the checks that refuse bad overrides first.

Hydra reports a malformed override, an unknown key or a value of the wrong type over
several lines with exit status 1, and accepts ``+any.unknown=1`` without a word (a typo
that changes nothing). Before Hydra runs anything, :func:`refuse_bad_overrides` checks
the command line the way Hydra will read it: unknown config-group options, overrides
that do not parse, keys the configuration does not have (the nearest known key named),
and every job of the sweep composed once, so a type error in any swept value is found.
Each refusal is one ``error:`` line and exit status 2, like the project's own
(:class:`harness.core.errors.ConfigError`).
"""

from __future__ import annotations

import contextlib
import difflib
import os
import sys
from typing import Callable, Iterator

import hydra
from hydra import compose, initialize_config_dir
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from hydra.types import RunMode
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from harness.cli.launcher import placement, places_jobs
from harness.config.choices import unknown_choice
from harness.config.registry import CONFIG_DIR
from harness.config.schema import register_configs
from harness.config.spec import RunSpec, build_spec
from harness.core.errors import ConfigError

# a command that prints rather than records: no run directory, no log file
NO_OUTPUT_DIR = ["hydra.output_subdir=null", "hydra.run.dir=.", "hydra/job_logging=none", "hydra/hydra_logging=none"]
SWEEP_FLAGS = ("-m", "--multirun")


def overrides_of(args: list[str]) -> list[str]:
    """The overrides among a command line's words (not Hydra's flags such as ``-m``)."""
    return [a for a in args if "=" in a and not a.startswith("-")]


@contextlib.contextmanager
def composing() -> Iterator[None]:
    """Hydra's compose API over ``conf/`` for the length of the block."""
    register_configs()
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        yield


def sweep_jobs(overrides: list[str]) -> list[list[str]]:
    """The override list of every job, in launch order: the config's swept keys (``repeat`` first,
    then the experiment's), then the command line's, expanded by Hydra's basic sweeper as a
    multirun does. Call inside :func:`composing`."""
    fixed = [o for o in overrides if "," not in o.split("=", 1)[-1]]
    cfg = compose(config_name="config", overrides=fixed, return_hydra_config=True)
    params = [f"{k}={v}" for k, v in (cfg.hydra.sweeper.params or {}).items()]
    parsed = OverridesParser.create().parse_overrides(params + overrides)
    return BasicSweeper.split_arguments(parsed, None)[0]


def _probes(overrides: list[str]) -> list[list[str]]:
    """Jobs that between them compose every swept value once: the sweep's first job, then that job
    with one key at each of its other values (not the sweep's whole product)."""
    fixed = [o for o in overrides if "," not in o.split("=", 1)[-1]]
    cfg = compose(config_name="config", overrides=fixed, return_hydra_config=True)
    params = [f"{k}={v}" for k, v in (cfg.hydra.sweeper.params or {}).items()]
    parsed = OverridesParser.create().parse_overrides(params + overrides)
    # each key's values, in the sweeper's order (a later override of a key replaces an earlier one)
    values: dict[str, list[str]] = {}
    for override in parsed:
        values[override.get_key_element()] = [job[0] for job in BasicSweeper.split_arguments([override], None)[0]]
    columns = list(values.values())
    first = [vals[0] for vals in columns]
    probes = [first]
    for i, vals in enumerate(columns):
        for other in vals[1:]:
            probes.append([*first[:i], other, *first[i + 1 :]])
    return probes


def _known_keys(node, prefix: str = "") -> set[str]:
    keys = set()
    for key in node.keys() if isinstance(node, DictConfig) else ():
        path = f"{prefix}{key}"
        keys.add(path)
        value = node._get_node(key)
        if isinstance(value, DictConfig):
            keys |= _known_keys(value, path + ".")
    return keys


def _groups() -> set[str]:
    return {d for d in os.listdir(CONFIG_DIR) if os.path.isdir(os.path.join(CONFIG_DIR, d))}


def _slurm_placement_error(composed: DictConfig) -> str | None:
    """Why the project's Slurm launcher cannot place this job, in one line (None if it can)."""
    if not places_jobs(composed):
        return None
    if OmegaConf.select(composed, "hydra.launcher.nodes", default=1) != 1:
        return (
            "hydra.launcher.nodes is not read with hydra/launcher=slurm: each job gets the nodes its "
            "world_size needs (world_size / hydra.launcher.tasks_per_node); leave it out"
        )
    try:
        placement(int(composed.world_size), int(OmegaConf.select(composed, "hydra.launcher.tasks_per_node") or 1))
    except ConfigError as e:
        return str(e)
    return None


def check_overrides(overrides: list[str], placed: bool = True) -> str | None:
    """Why Hydra would refuse ``overrides`` (or silently ignore one), in one line; None if it will
    take them. Call inside :func:`composing`."""
    message = unknown_choice(overrides, CONFIG_DIR)
    if message:
        return message
    parser = OverridesParser.create()
    for line in overrides:
        try:
            parser.parse_override(line)
        except HydraException as e:
            return (
                f"cannot read the override '{line}' ({_first_line(e)}); write key=value, a sweep as "
                "key=a,b, a list as key=[a,b] (quote it for the shell)"
            )
    known = _known_keys(compose(config_name="config", overrides=[]))
    groups = _groups()
    for override in parser.parse_overrides(overrides):
        key = override.key_or_group
        if (
            key.split("/")[0].split(".")[0] == "hydra"
            or override.is_delete()
            or key.split(".")[0] in groups
            and "." not in key
        ):
            continue
        if key not in known:
            near = difflib.get_close_matches(key, sorted(known), n=1, cutoff=0.6)
            hint = f"; did you mean {near[0]}?" if near else ""
            return (
                f"unknown key {key}{hint} (docs/reference/configuration.md lists every key; "
                "'+' does not add one: nothing would read it)"
            )
    job = overrides
    try:
        for job in _probes(overrides):
            composed = compose(config_name="config", overrides=job, return_hydra_config=True)
            message = _slurm_placement_error(composed) if placed else None
            if message:
                return message
    except (HydraException, OmegaConfBaseException, ValueError) as e:
        return _composition_error(e, job)
    return None


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def _composition_error(e: BaseException, job: list[str]) -> str:
    cause = e.__cause__ or e.__context__
    text = _first_line(e)
    if text.startswith("Could not append to config. An item is already at"):
        key = text.split("'")[1]
        return f"+{key}: {key} exists already; drop the '+' to set it"
    if text.startswith("Error merging override") and cause is not None:
        return f"{text.split()[-1]}: {_first_line(cause)}"
    if text.startswith("Could not override '") and cause is not None:
        return f"unknown key {text.split(chr(39))[1]} ({_first_line(cause)})"
    return f"{text}{': ' + _first_line(cause) if cause is not None else ''} (in the job {' '.join(job)})"


def refuse_bad_overrides(args: list[str], placed: bool = True) -> None:
    """Exit 2 with one ``error:`` line, before anything runs, if Hydra would refuse the overrides in
    ``args`` or a key among them is unknown (``placed``: or the Slurm launcher could not place a
    job; the preview lists such a job as refused instead)."""
    with composing():
        message = check_overrides(overrides_of(args), placed)
    if message:
        print(f"error: {message}", file=sys.stderr)
        raise SystemExit(2)


def register_launcher() -> None:
    """The project's Slurm launcher (hydra_plugins.pipebench), registered with Hydra by hand: an
    editable install's import hook makes it importable but invisible to Hydra's plugin scan."""
    from hydra.core.plugins import Plugins
    from hydra_plugins.pipebench import WorldSizeSlurmLauncher

    Plugins.instance().register(WorldSizeSlurmLauncher)


def hydra_command(task: Callable[[DictConfig], None], args: list[str], extra_overrides: list[str] = ()) -> None:
    """Run ``task`` as a Hydra app over ``conf/`` with this command line (``args``: overrides and
    Hydra's flags), after :func:`refuse_bad_overrides`; ``extra_overrides`` are appended."""
    refuse_bad_overrides(args)
    register_configs()
    register_launcher()
    argv, sys.argv = sys.argv, [sys.argv[0], *args, *extra_overrides]  # Hydra reads its command line there
    try:
        hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="config")(task)()
    finally:
        sys.argv = argv


def spec_or_exit(cfg: DictConfig, launching: bool = True) -> RunSpec:
    """The validated spec, or one ``error:`` line and exit 2 (``launching``: see build_spec)."""
    try:
        return build_spec(cfg, launching)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None


def show(args: list[str]) -> int:
    """Print every job's validated spec, the values that will run (strategy defaults and derived
    values filled in), as YAML; a refused job says why. Exit status 2 if any job is refused."""
    refuse_bad_overrides(args)
    overrides = overrides_of(args)
    refused = 0
    with composing():
        jobs = (
            sweep_jobs(overrides) if any(a in SWEEP_FLAGS for a in args) or _config_sweeps(overrides) else [overrides]
        )
        for job in jobs:
            print(f"# {' '.join(job) or '(no overrides)'}")
            try:
                spec = build_spec(compose(config_name="config", overrides=job), launching=False)
            except ConfigError as e:
                refused += 1
                print(f"# refused: {e}\n")
                continue
            print(OmegaConf.to_yaml(spec_values(spec)))
    return 2 if refused else 0


def _config_sweeps(overrides: list[str]) -> bool:
    cfg = compose(config_name="config", overrides=[o for o in overrides if "," not in o], return_hydra_config=True)
    return cfg.hydra.mode == RunMode.MULTIRUN


def spec_values(spec: RunSpec) -> dict:
    """The values a run of ``spec`` uses, by config key."""

    def plain(node) -> dict:
        return {k: (list(v) if isinstance(v, (tuple, ListConfig)) else v) for k, v in vars(node).items()}

    return {
        "strategy": plain(spec.strategy),
        "model": plain(spec.model),
        "data": plain(spec.data),
        "train": {**plain(spec.train), "steps": spec.steps},
        "launch": {**plain(spec.launch), "device": spec.device},
        "logger": plain(spec.logger),
        "world_size": spec.world_size,
        "seed": spec.seed,
        "repeat": spec.repeat,
        "tag": spec.tag,
        "block": spec.block,
        "ignored_strategy_keys": spec.ignored,
    }
