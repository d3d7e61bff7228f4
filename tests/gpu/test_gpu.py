"""What only a GPU can show: device timing, released layers, CUDA memory figures, bf16 runs.

Skipped cleanly where no CUDA device is visible (CI). ``pipebench gpucheck`` runs
the same paths, and more, as one command with one line per check.
"""

import json
import os

import pytest
import torch

from harness.core.timing import DeviceTimer
from harness.studies import gpucheck
from tests.helpers.cli import ROOT, run_cli

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device visible")


@pytest.fixture
def ctx(tmp_path):
    return gpucheck.Context(str(tmp_path), str(tmp_path / "profiles"), steps=8)


def test_cuda_events_time_the_kernels_not_their_launches(ctx):
    gpucheck.check_event_timing(ctx)  # raises beyond 10% of the profiler's kernel time
    assert abs(ctx.results["event_timing"]["error"]) <= 0.10


def test_device_timer_spans_are_device_work():
    device = torch.device("cuda", 0)
    timer = DeviceTimer(device)
    a = torch.randn(8192, 8192, device=device)
    torch.cuda.synchronize()
    start = timer.anchor()
    for _ in range(20):
        a @ a
    end = timer.mark()
    # 20 products of 8192^3 take milliseconds on any GPU; their launches take microseconds
    assert timer.elapsed(start, end) > 1e-3
    s0, s1 = timer.seconds([start, end])
    assert s1 - s0 == pytest.approx(timer.elapsed(start, end), rel=1e-3)


def test_measuring_layers_on_the_gpu_leaves_none_there(ctx):
    gpucheck.check_no_stray_copies(ctx)
    assert ctx.results["stray_copies"]["parameters_on_gpu"] == 0


def test_a_bf16_run_on_the_gpu_has_cuda_memory_flops_and_mfu(workdir):
    proc = run_cli(
        [
            "strategy=dp",
            "world_size=1",
            "launch.device=cuda",
            "train.precision=bf16",
            "train.steps=8",
            "train.eval_samples=256",
            "logger.mode=disabled",
            f"hydra.run.dir={workdir}",
        ],
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    with open(os.path.join(workdir, "metrics.json")) as f:
        record = json.load(f)
    assert record["memory_method"] == "cuda_max_allocated_step" and record["precision"] == "bf16"
    assert record["mfu"] > 0 and record["hfu"] >= record["mfu"] and "datasheet" in record["peak_source"]
