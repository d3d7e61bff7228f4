"""Run a function on a small real gloo world (worker processes, started as the launcher starts them) from a test."""

from __future__ import annotations

import os

import torch

from harness.core import comm
from harness.core.host import start_workers
from harness.core.models import build_layers
from harness.core.training import clip_gradients, make_optimizer, summed_loss, with_precision
from harness.metrics.meter import track_cpu_allocations


def _entry(rank: int, world_size: int, fn, args) -> None:
    track_cpu_allocations()
    torch.set_num_threads(1)
    ctx = comm.init_process_group(rank, world_size, rank, "cpu", "gloo", timeout_s=60)
    try:
        fn(ctx, *args)
        # rank 0 hosts the store: leaving first would break a peer still creating a group through it
        comm.Comm(ctx).barrier()
    finally:
        comm.destroy()


def spawn(world_size: int, fn, *args) -> None:
    """Call ``fn(ctx, *args)`` on every rank of a fresh ``world_size``-process gloo group."""
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(comm.free_port())
    start_workers(_entry, args=(world_size, fn, args), nprocs=world_size)


def reference_step(spec, x: torch.Tensor, y: torch.Tensor, steps: int = 1) -> dict[str, torch.Tensor]:
    """Single-process training on the same global batch: the ground truth for synchronous strategies."""
    return reference_steps(spec, [(x, y)] * steps)


def reference_steps(spec, batches: list[tuple[torch.Tensor, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Single-process training, one optimizer step per global batch, in order."""
    layers = build_layers(spec.model, spec.seed)
    model = torch.nn.Sequential(*with_precision(layers, spec.train.precision))
    opt = make_optimizer(model.parameters(), spec.train, spec.steps)
    for x, y in batches:
        summed_loss(model(x), y, x.shape[0], spec.train.label_smoothing).backward()
        clip_gradients(model.parameters(), spec.train.grad_clip_norm)
        opt.step()
        opt.zero_grad(set_to_none=True)
    return {f"{i}.{n}": p.detach().clone() for i, layer in enumerate(layers) for n, p in layer.named_parameters()}


def merged_rank_states(out_dir: str, world_size: int) -> dict[str, list[torch.Tensor]]:
    """Every rank's copy of each parameter, keyed by its name in the full layer list."""
    merged: dict[str, list[torch.Tensor]] = {}
    for r in range(world_size):
        for k, v in torch.load(os.path.join(out_dir, f"rank{r}.pt")).items():
            merged.setdefault(k, []).append(v)
    return merged


def assert_matches_reference(merged: dict, reference: dict, atol: float = 2e-5, rtol: float = 1e-4) -> None:
    assert set(merged) == set(reference), set(reference) ^ set(merged)
    for key, copies in merged.items():
        for copy in copies:
            torch.testing.assert_close(copy, reference[key], atol=atol, rtol=rtol, msg=lambda m: f"{key}: {m}")
