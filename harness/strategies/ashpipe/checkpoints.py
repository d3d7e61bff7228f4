"""AshPipe's checkpoint files: the switch checkpoint a later job starts its hybrid pipeline from,
and what a run's own checkpoint (``train.resume``) says it trained, to rebuild that layout.

The switch checkpoint is each rank's stage at the switch, written atomically to
``<run dir>/switch_checkpoint/rank<r>.pt`` with the step, the replicas and the cut;
``strategy.resume_from=<that folder>`` starts a later job from it in hybrid mode.
"""

from __future__ import annotations

import os

import torch

from harness.core.checkpoints import checkpoint_folder
from harness.core.errors import ConfigError

SWITCH_FOLDER = "switch_checkpoint"


def switch_folder(output_dir: str) -> str | None:
    return os.path.join(output_dir, SWITCH_FOLDER) if output_dir else None


def save_switch(folder: str, rank: int, state: dict) -> None:
    os.makedirs(folder, exist_ok=True)
    tmp = os.path.join(folder, f".rank{rank}.pt.tmp")
    torch.save(state, tmp)
    os.replace(tmp, os.path.join(folder, f"rank{rank}.pt"))


def load_switch(folder: str, rank: int, device: torch.device, replicas: list[int]) -> dict:
    """This rank's switch checkpoint, refused in one line where it is missing or was written with
    other replicas."""
    path = os.path.join(folder, f"rank{rank}.pt")
    if not os.path.isfile(path):
        raise ConfigError(f"no switch checkpoint for rank {rank} at {path}")
    state = torch.load(path, map_location=device)
    if state["replicas"] != list(replicas):
        raise ConfigError(
            f"{path} was written with replicas {state['replicas']}; this job has "
            f"{list(replicas)}: pass strategy.replicas={state['replicas']}"
        )
    return state


def checkpointed_layout(spec, rank: int) -> dict | None:
    """What this rank's checkpoint (``train.resume``) says it trained: the data-parallel phase, or the
    hybrid layout (replicas, boundaries, recomputed layers); None when not resuming."""
    if not spec.train.resume:
        return None
    path = os.path.join(checkpoint_folder(spec.train.resume), f"rank{rank}.pt")
    state = torch.load(path, map_location="cpu")
    if state.get("mode") not in ("dp", "hybrid"):
        raise ConfigError(f"{path} is not an AshPipe checkpoint; resume with the strategy that wrote it")
    return {k: state.get(k) for k in ("mode", "replicas", "boundaries", "recompute")}
