"""AshPipe's checkpoints: the pipeline drains, and a resumed run ends where the uninterrupted run
with the same checkpoints (the same drains) ends, through the worker's own training loop."""

import dataclasses
import os

import pytest
import torch

from harness.run.worker import train
from tests.helpers.cli import make_spec
from tests.helpers.distributed import spawn

STEPS, EVERY = 6, 2
COMMON = [
    "strategy=ashpipe",
    "train.optimizer=sgd",
    "train.lr=0.2",
    "train.momentum=0.9",
    "data.train_size=96",
    "data.test_size=16",
    "train.eval_samples=16",
    "train.measure_memory=false",
    "train.warmup_steps=0",
    "logger.mode=disabled",
    f"train.steps={STEPS}",
    "train.global_batch=13",
]
# name -> (world size, overrides, the checkpoint step the interrupted run stops at)
CASES = {
    "2 stages": (2, ["strategy.replicas=[1,1]", "strategy.boundaries=[3]"], 4),
    "switch, resumed before it": (
        2,
        ["strategy.replicas=[1,1]", "strategy.boundaries=[3]", "strategy.switch_step=3"],
        2,
    ),
    "switch, resumed after it": (
        2,
        ["strategy.replicas=[1,1]", "strategy.boundaries=[3]", "strategy.switch_step=3"],
        4,
    ),
    "3 stages, non-uniform": (4, ["strategy.replicas=[2,1,1]", "strategy.boundaries=[2,4]"], 2),
    # the learning-rate correction anneals from the switch: the resumed run must know when that was
    "3 stages, switch, mitigations, resumed after it": (
        4,
        [
            "strategy.replicas=[2,1,1]",
            "strategy.boundaries=[2,4]",
            "strategy.switch_step=1",
            "strategy.lr_correction=true",
            "strategy.lr_correction_steps=8",
            "strategy.weight_prediction=true",
        ],
        4,
    ),
}


def _runs(ctx, specs: dict, out: str) -> None:
    """Each spec in turn on this rank, in its own run directory (a resumed run in its interrupted
    run's directory, as Slurm's requeue would)."""
    for _name, spec in specs.items():
        train(spec, ctx, progress=False)


def _final(out: str, name: str, world: int) -> dict:
    folder = os.path.join(out, name, "checkpoints", f"step{STEPS}")
    return {r: torch.load(os.path.join(folder, f"rank{r}.pt"))["params"] for r in range(world)}


@pytest.mark.parametrize("world", sorted({w for w, _, _ in CASES.values()}))
def test_a_resumed_ashpipe_run_ends_with_the_parameters_of_the_uninterrupted_one(world, tmp_path):
    specs = {}
    for case, (w, overrides, stop) in CASES.items():
        if w != world:
            continue
        key = case.replace(" ", "_").replace(",", "")

        def spec(name: str, *extra: str):
            made = make_spec(*COMMON, f"world_size={w}", *overrides, *extra)
            made.output_dir = str(tmp_path / name)
            return made

        specs[f"{key}-whole"] = spec(f"{key}-whole", f"train.checkpoint_every={EVERY}")
        specs[f"{key}-never"] = spec(f"{key}-never", f"train.checkpoint_every={STEPS}")  # drains only at the end
        specs[f"{key}-cut"] = spec(f"{key}-cut", f"train.checkpoint_every={EVERY}", f"train.steps={stop}")
        resumed = spec(f"{key}-cut", f"train.checkpoint_every={EVERY}")
        resumed.train = dataclasses.replace(resumed.train, resume=str(tmp_path / f"{key}-cut"))
        specs[f"{key}-resumed"] = resumed
    spawn(world, _runs, specs, str(tmp_path))
    for case, (w, _, _stop) in CASES.items():
        if w != world:
            continue
        key = case.replace(" ", "_").replace(",", "")
        whole, resumed = _final(tmp_path, f"{key}-whole", w), _final(tmp_path, f"{key}-cut", w)
        never = _final(tmp_path, f"{key}-never", w)
        for r in range(w):
            assert resumed[r].keys() == whole[r].keys(), case
            for name in whole[r]:
                torch.testing.assert_close(
                    resumed[r][name],
                    whole[r][name],
                    atol=1e-6,
                    rtol=1e-5,
                    msg=lambda m: f"{case}, rank {r}, {name}: {m}",
                )
        # the drains are part of the semantics: without them the run ends elsewhere
        assert any(not torch.allclose(never[r][n], whole[r][n], atol=1e-6) for r in range(w) for n in whole[r]), case
