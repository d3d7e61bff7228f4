"""Stages, replicas and ranks, and which samples each rank owns.

Stage s has ``replicas[s]`` ranks, numbered contiguously: stage 0 takes ranks
0..n_0-1, stage 1 the next n_1, and so on. Replicas may differ per stage
(AshPipe) or be uniform (Hippie). Where a rank holds several stages (interleaved
and V-shaped schedules), ``place[s]`` is the rank position of stage s: position p
takes the p-th block of ranks, and every stage placed there runs on all of them.

Every stage processes the whole global batch B. Micro-batch k is a contiguous
slice of B; within it, replica r of a stage with n replicas owns the
contiguous share ``(len + r) // n`` (AshPipe's rule). Activations and
gradients between adjacent stages therefore move between any two replicas
whose sample ranges overlap (one-to-one when replica counts match,
many-to-many otherwise), and all shapes follow from B, m and the replica
counts: nothing about shapes needs to be sent at run time.
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.core.training import replica_slice


@dataclass(frozen=True)
class Transfer:
    """Rows ``[lo, hi)`` of micro-batch ``micro`` (global sample indices) between two ranks."""

    src: int
    dst: int
    lo: int
    hi: int


@dataclass(frozen=True)
class Topology:
    replicas: tuple[int, ...]  # ranks per stage
    place: tuple[int, ...] | None = None  # rank position of each stage (None: stage s at position s)

    def __post_init__(self):
        if self.place is not None:
            if len(self.place) != len(self.replicas) or sorted(set(self.place)) != list(range(max(self.place) + 1)):
                raise ValueError(f"placement {self.place} must put {len(self.replicas)} stages on positions 0, 1, ...")
            if any(self.replicas[s] != self.replicas[self.stages_at(self.place[s])[0]] for s in range(len(self.place))):
                raise ValueError(f"stages on one rank position need the same replicas: {self.replicas}, {self.place}")

    @property
    def num_stages(self) -> int:
        return len(self.replicas)

    @property
    def positions(self) -> int:
        """Rank positions along a pipeline (the stages, where each rank holds one)."""
        return self.num_stages if self.place is None else max(self.place) + 1

    def position_of_stage(self, stage: int) -> int:
        return stage if self.place is None else self.place[stage]

    def stages_at(self, position: int) -> list[int]:
        """The stages a rank at ``position`` holds, ascending."""
        return [position] if self.place is None else [s for s, p in enumerate(self.place) if p == position]

    def replicas_at(self, position: int) -> int:
        """Ranks at ``position`` (each holds all of its stages)."""
        return self.replicas[self.stages_at(position)[0]]

    @property
    def world_size(self) -> int:
        return sum(self.replicas_at(p) for p in range(self.positions))

    def ranks_at(self, position: int) -> list[int]:
        first = sum(self.replicas_at(p) for p in range(position))
        return list(range(first, first + self.replicas_at(position)))

    def ranks_of(self, stage: int) -> list[int]:
        return self.ranks_at(self.position_of_stage(stage))

    def position_of(self, rank: int) -> int:
        """The rank position ``rank`` is at (its stage, where each rank holds one)."""
        for p in range(self.positions):
            if rank in self.ranks_at(p):
                return p
        raise ValueError(f"rank {rank} is outside a world of {self.world_size}")

    def stage_of(self, rank: int) -> int:
        """The stage ``rank`` holds (its first, where it holds several)."""
        return self.stages_at(self.position_of(rank))[0]

    def replica_of(self, rank: int) -> int:
        return rank - self.ranks_of(self.stage_of(rank))[0]


def micro_ranges(batch: int, micro_batches: int) -> list[tuple[int, int]]:
    """Global sample range of each micro-batch."""
    out = []
    for k in range(micro_batches):
        s = replica_slice(batch, micro_batches, k)
        out.append((s.start, s.stop))
    return out


def owned_range(
    topo: Topology, batch: int, micro_batches: int, micro: int, stage: int, replica: int
) -> tuple[int, int]:
    """Global sample range that ``replica`` of ``stage`` computes for ``micro``."""
    lo, hi = micro_ranges(batch, micro_batches)[micro]
    share = replica_slice(hi - lo, topo.replicas[stage], replica)
    return lo + share.start, lo + share.stop


def transfers(topo: Topology, batch: int, micro_batches: int, micro: int, stage: int) -> list[Transfer]:
    """Every piece of micro-batch ``micro`` moving between ``stage`` and ``stage + 1``.

    Listed in a fixed order (by source, then destination) so sender and
    receiver agree on it without talking.
    """
    out = []
    for r, src in enumerate(topo.ranks_of(stage)):
        a_lo, a_hi = owned_range(topo, batch, micro_batches, micro, stage, r)
        for r2, dst in enumerate(topo.ranks_of(stage + 1)):
            b_lo, b_hi = owned_range(topo, batch, micro_batches, micro, stage + 1, r2)
            lo, hi = max(a_lo, b_lo), min(a_hi, b_hi)
            if lo < hi:
                out.append(Transfer(src, dst, lo, hi))
    return out
