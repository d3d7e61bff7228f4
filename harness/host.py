"""How worker processes use this host: torch threads per worker, the CPU allocator's settings.

Shared by the launcher (training workers) and the profiler (measuring workers), so
both run under the same conditions.
"""

from __future__ import annotations

import os


def threads_per_process(requested: int, local_world: int) -> int:
    """``requested`` intra-op threads, or (0) the host's cores shared among ``local_world`` workers."""
    if requested > 0:
        return requested
    return max(1, (os.cpu_count() or 1) // max(1, local_world))


# glibc returns freed blocks over 128 KiB to the system at once, so every training step faults
# its activation memory in again (about 2,000 page faults per vit_micro step here), at a cost
# that swings with the host's load; keeping freed memory in the process makes CPU steps
# faster and their times steadier (the knobs PyTorch's CPU performance guide points to)
_CPU_ALLOCATOR_ENV = {"MALLOC_MMAP_THRESHOLD_": str(2**30), "MALLOC_TRIM_THRESHOLD_": str(2**36),
                      "MALLOC_TOP_PAD_": str(2**28)}


def cpu_worker_environment() -> None:
    """Allocator settings for CPU worker processes started from here (values already set win)."""
    for key, value in _CPU_ALLOCATOR_ENV.items():
        os.environ.setdefault(key, value)
