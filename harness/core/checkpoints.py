"""Where a run's checkpoints live: ``<run dir>/checkpoints/step<N>/rank<r>.pt``, and ``latest``.

The worker writes them (every rank its own file, atomically; rank 0 then points
``latest`` at the folder), the run spec checks a ``train.resume`` path before launch, and a
strategy that must rebuild what it trained before loading (AshPipe's layout) reads its own
rank's file.
"""

from __future__ import annotations

import os

from harness.core.errors import ConfigError


def checkpoint_folder(path: str) -> str:
    """The ``checkpoints/step<N>`` folder that ``train.resume=path`` means."""
    latest = os.path.join(path, "checkpoints", "latest")
    if os.path.isfile(latest):
        with open(latest) as f:
            return os.path.join(path, "checkpoints", f.read().strip())
    if os.path.isfile(os.path.join(path, "rank0.pt")):
        return path
    raise ConfigError(f"train.resume={path} holds no checkpoint (no checkpoints/latest, no rank0.pt); "
                      "point it at a run directory written with train.checkpoint_every>0")
