"""Where a sweep's jobs run on Slurm: each job's nodes and tasks from its world size.

hydra-submitit-launcher builds one executor, with one ``nodes`` and ``tasks_per_node``, for a
whole sweep, so a sweep over ``world_size=4,8,16`` on 8-GPU nodes cannot give each job what it
needs. The project's Slurm launcher (``conf/hydra/launcher/slurm.yaml``; the class lives in
``harness/cli/hydra_plugin``, installed as ``hydra_plugins.pipebench``, where Hydra requires a
launcher to be) takes ``tasks_per_node`` as the nodes' capacity (a task per GPU:
``gpus_per_node``) and gives each job :func:`placement` of its ``world_size``: one node with
``world_size`` tasks where they fit, else ``world_size / tasks_per_node`` full nodes. The
preview uses the same rule.
"""

from __future__ import annotations

from omegaconf import OmegaConf

from harness.core.errors import ConfigError


def placement(world_size: int, per_node: int) -> tuple[int, int]:
    """(nodes, tasks per node) for a job of ``world_size`` ranks on nodes of ``per_node`` tasks;
    ConfigError where the ranks do not fill whole nodes."""
    if world_size <= per_node:
        return 1, world_size
    if world_size % per_node:
        raise ConfigError(
            f"world_size={world_size} does not fill whole nodes of {per_node} tasks "
            f"(hydra.launcher.tasks_per_node); use a multiple of {per_node}"
        )
    return world_size // per_node, per_node


def _launcher(config) -> str:
    return str(OmegaConf.select(config, "hydra.launcher._target_", default="") or "")


def slurm_launcher(config) -> bool:
    """Whether a composed config's launcher submits to Slurm (the jobs run on compute nodes)."""
    return "Slurm" in _launcher(config)


def places_jobs(config) -> bool:
    """Whether a composed config's launcher is the project's, which gives each job :func:`placement`."""
    return _launcher(config).endswith("WorldSizeSlurmLauncher")
