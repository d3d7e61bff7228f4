"""Failures end the whole job promptly, leave a failed record, and never hang; runs resume exactly."""

import json
import os
import time

import pytest
import torch

from tests.helpers.cli import TINY, pipebench, run_cli


def _record(run_dir):
    with open(os.path.join(run_dir, "metrics.json")) as f:
        return json.load(f)


@pytest.mark.parametrize(
    "fault,expect", [("raise", "rank 1 raised RuntimeError: injected fault"), ("exit", "rank 1 exited with code 3")]
)
def test_a_failing_worker_fails_the_job_with_a_record(workdir, fault, expect, capfd):
    run_dir = os.path.join(workdir, "run")
    t0 = time.time()
    proc = pipebench(
        capfd,
        "run",
        "world_size=2",
        *TINY,
        "train.steps=8",
        f"launch.fault={fault}",
        "launch.fault_step=3",
        f"hydra.run.dir={run_dir}",
    )
    assert proc.returncode == 1, proc.stderr[-2000:]
    rec = _record(run_dir)
    assert rec["status"] == "failed" and rec["failed_rank"] == 1 and expect in rec["error"]
    assert "FAILED dp w=2" in proc.stderr
    assert time.time() - t0 < 60


def test_a_hung_peer_becomes_an_error_naming_the_rank_and_operation(workdir):
    run_dir = os.path.join(workdir, "run")
    # the hung rank is ended launch.failure_timeout after its peer's timeout names it
    proc = run_cli(
        [
            "strategy=hippie",
            "world_size=2",
            *TINY,
            "train.micro_batches=2",
            "train.steps=8",
            "launch.fault=hang",
            "launch.fault_step=3",
            "launch.collective_timeout=5",
            "launch.failure_timeout=3",
            f"hydra.run.dir={run_dir}",
        ],
        cwd=workdir,
        timeout=120,
    )
    assert proc.returncode == 1
    rec = _record(run_dir)
    assert rec["status"] == "failed" and rec["failed_rank"] == 0
    assert "rank 0:" in rec["error"] and "from rank 1" in rec["error"] and "timed out" in rec["error"]


def test_a_sweep_goes_on_after_a_failed_job_and_shows_it(workdir, capfd):
    sweep = os.path.join(workdir, "sweep")
    proc = pipebench(capfd, "run", "-m", "world_size=2", *TINY, "launch.fault=none,raise", f"hydra.sweep.dir={sweep}")
    assert proc.returncode == 1  # the sweep ran every job, and says one failed
    recs = sorted(
        (_record(os.path.join(sweep, d)) for d in os.listdir(sweep) if d[0].isdigit()), key=lambda r: r["status"]
    )
    assert [r["status"] for r in recs] == ["failed", "ok"]
    assert "| dp¹ " in proc.stdout and "¹ failed: rank 1 raised RuntimeError" in proc.stdout  # its row, with why
    assert "1 run(s) failed" in proc.stderr


@pytest.mark.parametrize(
    "strategy,extra",
    [
        ("dp", []),
        ("hippie", ["train.micro_batches=2"]),
        # the asynchronous pipeline drains at each checkpoint
        ("ashpipe", ["strategy.replicas=[1,1]"]),
    ],
)
def test_an_interrupted_run_resumes_to_the_same_parameters(workdir, strategy, extra, capfd):
    base = [
        f"strategy={strategy}",
        "world_size=2",
        *TINY,
        *extra,
        "train.steps=6",
        "train.checkpoint_every=3",
        "seed=0" if strategy == "dp" else "strategy.boundaries=[3]",
    ]
    straight, broken, resumed = (os.path.join(workdir, n) for n in ("straight", "broken", "resumed"))
    assert pipebench(capfd, "run", *base, f"hydra.run.dir={straight}").returncode == 0
    crash = pipebench(capfd, "run", *base, "launch.fault=raise", "launch.fault_step=4", f"hydra.run.dir={broken}")
    assert crash.returncode == 1 and os.path.isdir(os.path.join(broken, "checkpoints", "step3"))
    assert not os.path.isdir(os.path.join(broken, "checkpoints", "step6"))
    again = pipebench(capfd, "run", *base, f"train.resume={broken}", f"hydra.run.dir={resumed}")
    assert again.returncode == 0, again.stderr[-2000:]
    # it resumed (training from scratch would end on the same parameters too): it trained steps 3..5
    # and carries the checkpoint's record of steps 0..2, which are the uninterrupted run's
    record, whole = _record(resumed), _record(straight)
    # one warm-up step again after the restart, the last step is the memory step: one timed
    assert record["resumed_from_step"] == 3 and record["timed_steps"] == 1
    assert [step for step, _ in record["loss_curve"]] == list(range(6))
    assert record["loss_curve"][:3] == whole["loss_curve"][:3]
    assert not os.path.isdir(os.path.join(resumed, "checkpoints", "step3"))
    for rank in (0, 1):
        a = torch.load(os.path.join(straight, "checkpoints", "step6", f"rank{rank}.pt"))
        b = torch.load(os.path.join(resumed, "checkpoints", "step6", f"rank{rank}.pt"))
        assert a["params"].keys() == b["params"].keys()
        for k in a["params"]:
            torch.testing.assert_close(a["params"][k], b["params"][k], rtol=0, atol=1e-6)


def test_wandb_failure_keeps_the_local_record_and_no_secret_is_written(workdir):
    run_dir = os.path.join(workdir, "run")
    secret = "sk-test-4f1e9c-do-not-log"
    # online mode with an unusable key and no network: wandb fails, the record stays
    proc = run_cli(
        [*TINY, "logger.mode=online", f"hydra.run.dir={run_dir}"],
        cwd=workdir,
        timeout=180,
        env={"WANDB_API_KEY": secret, "WANDB_BASE_URL": "http://127.0.0.1:9", "WANDB_INIT_TIMEOUT": "10"},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert _record(run_dir)["status"] == "ok"
    assert "warning: starting the wandb run failed" in proc.stderr
    for root, _, files in os.walk(run_dir):
        for name in files:
            with open(os.path.join(root, name), "rb") as f:
                assert secret.encode() not in f.read(), os.path.join(root, name)
    assert secret not in proc.stdout + proc.stderr
