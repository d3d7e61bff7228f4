"""Where a run's checkpoints live: ``<run dir>/checkpoints/step<N>/rank<r>.pt``, and ``latest``.

The worker writes them (every rank its own file, atomically; rank 0 then points
``latest`` at the folder), the run spec checks a ``train.resume`` path before launch
(:func:`check_checkpoint`: every rank's file readable and holding this model's parameters,
written by this strategy), and a strategy that must rebuild what it trained before loading
(AshPipe's layout) reads its own rank's file.
"""

from __future__ import annotations

import os

import torch

from harness.core.errors import ConfigError

_WHAT_TO_DO = (
    "resume from an earlier checkpoint (train.resume=<run dir>/checkpoints/step<N>) or start over without train.resume"
)


def checkpoint_folder(path: str) -> str:
    """The ``checkpoints/step<N>`` folder that ``train.resume=path`` means."""
    latest = os.path.join(path, "checkpoints", "latest")
    if os.path.isfile(latest):
        with open(latest) as f:
            return os.path.join(path, "checkpoints", f.read().strip())
    if os.path.isfile(os.path.join(path, "rank0.pt")):
        return path
    raise ConfigError(
        f"train.resume={path} holds no checkpoint (no checkpoints/latest, no rank0.pt); "
        "point it at a run directory written with train.checkpoint_every>0"
    )


def check_checkpoint(path: str, ranks: int, strategy: str, shapes: dict[str, tuple[int, ...]]) -> str:
    """The folder ``train.resume=path`` means, after checking each of the ``ranks`` files without
    reading their tensors (the archive's index and metadata only): it opens, was written by
    ``strategy``, and every parameter it holds has this model's shape (``shapes``: "<layer>.<name>"
    -> shape). Anything else is refused in one line naming the file and what to do."""
    folder = checkpoint_folder(path)
    for rank in range(ranks):
        file = os.path.join(folder, f"rank{rank}.pt")
        if not os.path.isfile(file):
            raise ConfigError(f"checkpoint {file} is missing (this run has {ranks} rank(s)); {_WHAT_TO_DO}")
        try:
            state = torch.load(file, map_location="cpu", mmap=True)
        except Exception as e:  # truncated, zeroed, not a torch archive, ...
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise ConfigError(f"checkpoint {file} cannot be read ({first}); {_WHAT_TO_DO}") from None
        if not isinstance(state, dict) or not isinstance(state.get("params"), dict):
            raise ConfigError(f"checkpoint {file} is not a checkpoint of this harness; {_WHAT_TO_DO}")
        written_by = state.get("strategy")
        if written_by not in (None, strategy):
            raise ConfigError(
                f"checkpoint {file} was written by strategy={written_by}, not {strategy}: resume with "
                f"strategy={written_by}, or start over without train.resume"
            )
        for key, tensor in state["params"].items():
            if key not in shapes or tuple(tensor.shape) != shapes[key]:
                held = tuple(tensor.shape) if hasattr(tensor, "shape") else type(tensor).__name__
                expected = shapes.get(key, "no such parameter")
                raise ConfigError(
                    f"checkpoint {file} holds {key} of shape {held} where this model has {expected}: "
                    f"it belongs to another model or layout; {_WHAT_TO_DO}"
                )
    return folder
