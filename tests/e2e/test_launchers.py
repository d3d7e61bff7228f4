"""Outgrowing one machine: submitit multiruns, Slurm's variables, torchrun."""

import glob
import json
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from harness.core.comm import free_port
from tests.helpers.cli import TINY, pipebench, run_cli
from tests.helpers.slurm import cluster_down


def test_two_job_multirun_through_submitit_local(workdir):
    sweep = os.path.join(workdir, "sweep")
    proc = run_cli(
        [
            "-m",
            "hydra/launcher=submitit_local",
            "strategy=dp,hippie",
            "world_size=2",
            *TINY,
            "train.micro_batches=2",
            f"hydra.sweep.dir={sweep}",
        ],
        cwd=workdir,
        timeout=400,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    recs = [json.load(open(p)) for p in glob.glob(os.path.join(sweep, "*", "metrics.json"))]
    assert sorted(r["strategy"] for r in recs) == ["dp", "hippie"] and all(r["status"] == "ok" for r in recs)
    assert "| hippie" in proc.stdout  # the table is printed by the submitting process


def _start_ranks(env_for_rank, args, cwd):
    procs = []
    for rank in range(2):
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **env_for_rank(rank)}
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "harness", *args],
                cwd=cwd,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    outs = [p.communicate(timeout=240) for p in procs]
    return procs, outs


@pytest.mark.skipif(
    cluster_down() is None, reason="a Slurm cluster is up: tests/slurm takes every job's ranks from srun for real"
)
def test_two_slurm_tasks_form_one_process_group(workdir):
    """Where no Slurm cluster runs the tests marked `slurm`: two commands with the variables srun
    gives each task form one process group, and rank 0 alone reports."""
    run_dir = os.path.join(workdir, "run")
    port = str(free_port())
    slurm = lambda r: {  # noqa: E731
        "SLURM_JOB_ID": "4242",
        "SLURM_PROCID": str(r),
        "SLURM_LOCALID": str(r),
        "SLURM_NTASKS": "2",
        "SLURM_NODEID": "0",
        "SLURM_JOB_NUM_NODES": "1",
        "SLURM_JOB_NODELIST": "localhost",
        "SLURM_STEP_NODELIST": "localhost",
        "SLURM_TASKS_PER_NODE": "2",
        "MASTER_PORT": port,
    }
    procs, outs = _start_ranks(slurm, ["world_size=2", *TINY, f"hydra.run.dir={run_dir}"], workdir)
    assert [p.returncode for p in procs] == [0, 0], outs[0][1][-2000:] + outs[1][1][-2000:]
    rec = json.load(open(os.path.join(run_dir, "metrics.json")))
    assert rec["status"] == "ok" and rec["world_size"] == 2 and len(rec["peak_memory_per_rank"]) == 2
    assert "ok dp w=2" in outs[0][0] and "ok dp" not in outs[1][0]  # rank 0 alone reports


def test_torchrun_joins_its_process_group(workdir):
    run_dir = os.path.join(workdir, "run")
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    proc = subprocess.run(
        [
            torchrun,
            "--nproc-per-node",
            "2",
            "--master-port",
            str(free_port()),
            "-m",
            "harness",
            "strategy=hippie",
            "world_size=2",
            "train.micro_batches=2",
            *TINY,
            f"hydra.run.dir={run_dir}",
        ],
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rec = json.load(open(os.path.join(run_dir, "metrics.json")))
    assert rec["status"] == "ok" and rec["strategy"] == "hippie"
    assert sorted(r["layout"]["stage"] for r in rec["per_rank"]) == [0, 1]


def test_a_job_started_with_the_wrong_number_of_tasks_is_refused(workdir):
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    proc = subprocess.run(
        [
            torchrun,
            "--nproc-per-node",
            "2",
            "--master-port",
            str(free_port()),
            "-m",
            "harness",
            "world_size=4",
            *TINY,
            f"hydra.run.dir={workdir}/run",
        ],
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode != 0 and "start 4 task(s)" in proc.stderr


def _task_of(sweep: str):
    """The submitit task process running a job of ``sweep`` (its command line names the sweep's folder)."""
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = " ".join(proc.info["cmdline"] or [])
        if "submitit.core._submit" in cmdline and sweep in cmdline:
            return proc
    return None


@pytest.mark.skipif(
    cluster_down() is None,
    reason="a Slurm cluster is up: tests/slurm preempts, requeues and resumes jobs for real, through the same code",
)
def test_a_preempted_submitit_job_checkpoints_is_requeued_and_resumes_by_itself(workdir, capfd):
    """Where no Slurm cluster runs the tests marked `slurm`: submitit_local on this machine, as
    Slurm would: the job's task gets the preemption signal mid-run (after its first checkpoint),
    stops at the end of a step with a checkpoint, submitit requeues it, and the requeued job
    resumes in the same run directory; one record, marked resumed, with the loss curve of the
    whole run. AshPipe's checkpoint drains its pipeline, which changes
    the training after it: the run goes on to its next periodic checkpoint and stops there, so it
    ends where the uninterrupted run ends."""
    sweep = os.path.join(workdir, "sweep")
    steps = 60
    settings = [
        "strategy=ashpipe",
        "strategy.replicas=[1,1]",
        "strategy.boundaries=[3]",
        "world_size=2",
        f"train.steps={steps}",
        "train.checkpoint_every=10",
        "train.measure_memory=false",
        "data.train_size=512",
        "data.test_size=64",
        "logger.mode=disabled",
    ]
    proc = subprocess.Popen(
        [sys.executable, "-m", "harness", "-m", "hydra/launcher=local", *settings, f"hydra.sweep.dir={sweep}"],
        cwd=workdir,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    run_dir = os.path.join(sweep, "0_ashpipe_w2")
    try:
        deadline = time.time() + 240
        while not os.path.exists(os.path.join(run_dir, "checkpoints", "latest")):
            assert proc.poll() is None and time.time() < deadline, "the job ended or never checkpointed"
            time.sleep(0.5)
        task = _task_of(sweep)
        assert task is not None
        task.send_signal(signal.SIGUSR2)
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err[-3000:]
    stop = json.load(open(os.path.join(run_dir, "preempted.json")))
    rec = json.load(open(os.path.join(run_dir, "metrics.json")))
    assert stop["stops"] == 1 and 0 < stop["step"] < steps and stop["step"] % 10 == 0
    assert os.path.isdir(os.path.join(run_dir, "checkpoints", f"step{stop['step']}"))
    assert rec["status"] == "ok" and rec["resumed"] == 1 and rec["resumed_from_step"] == stop["step"]
    assert [step for step, _ in rec["loss_curve"]] == list(range(steps))  # both segments, in one record
    straight = os.path.join(workdir, "straight")
    assert pipebench(capfd, "run", *settings, f"hydra.run.dir={straight}").returncode == 0
    assert rec["final_loss"] == json.load(open(os.path.join(straight, "metrics.json")))["final_loss"]
    assert not glob.glob(os.path.join(run_dir, ".stop"))
