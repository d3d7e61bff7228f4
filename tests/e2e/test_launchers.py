"""Outgrowing one machine: submitit multiruns, Slurm's variables, torchrun."""

import glob
import json
import os
import subprocess
import sys

from harness.comm import free_port
from tests.helpers.cli import TINY, run_cli


def test_two_job_multirun_through_submitit_local(workdir):
    sweep = os.path.join(workdir, "sweep")
    proc = run_cli(["-m", "hydra/launcher=submitit_local", "strategy=dp,hippie", "world_size=2", *TINY,
                    "train.micro_batches=2", f"hydra.sweep.dir={sweep}"], cwd=workdir, timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    recs = [json.load(open(p)) for p in glob.glob(os.path.join(sweep, "*", "metrics.json"))]
    assert sorted(r["strategy"] for r in recs) == ["dp", "hippie"] and all(r["status"] == "ok" for r in recs)
    assert "| hippie" in proc.stdout  # the table is printed by the submitting process


def _start_ranks(env_for_rank, args, cwd):
    procs = []
    for rank in range(2):
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **env_for_rank(rank)}
        procs.append(subprocess.Popen([sys.executable, "-m", "harness", *args], cwd=cwd, env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outs = [p.communicate(timeout=240) for p in procs]
    return procs, outs


def test_two_slurm_tasks_form_one_process_group(workdir):
    run_dir = os.path.join(workdir, "run")
    port = str(free_port())
    slurm = lambda r: {"SLURM_JOB_ID": "4242", "SLURM_PROCID": str(r), "SLURM_LOCALID": str(r),  # noqa: E731
                       "SLURM_NTASKS": "2", "SLURM_NODEID": "0", "SLURM_JOB_NUM_NODES": "1",
                       "SLURM_JOB_NODELIST": "localhost", "SLURM_STEP_NODELIST": "localhost",
                       "SLURM_TASKS_PER_NODE": "2", "MASTER_PORT": port}
    procs, outs = _start_ranks(slurm, ["world_size=2", *TINY, f"hydra.run.dir={run_dir}"], workdir)
    assert [p.returncode for p in procs] == [0, 0], outs[0][1][-2000:] + outs[1][1][-2000:]
    rec = json.load(open(os.path.join(run_dir, "metrics.json")))
    assert rec["status"] == "ok" and rec["world_size"] == 2 and len(rec["peak_memory_per_rank"]) == 2
    assert "ok dp w=2" in outs[0][0] and "ok dp" not in outs[1][0]  # rank 0 alone reports


def test_torchrun_joins_its_process_group(workdir):
    run_dir = os.path.join(workdir, "run")
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    proc = subprocess.run([torchrun, "--nproc-per-node", "2", "--master-port", str(free_port()), "-m", "harness",
                           "strategy=hippie", "world_size=2", "train.micro_batches=2", *TINY,
                           f"hydra.run.dir={run_dir}"], cwd=workdir, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rec = json.load(open(os.path.join(run_dir, "metrics.json")))
    assert rec["status"] == "ok" and rec["strategy"] == "hippie"
    assert sorted(r["layout"]["stage"] for r in rec["per_rank"]) == [0, 1]


def test_a_job_started_with_the_wrong_number_of_tasks_is_refused(workdir):
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    proc = subprocess.run([torchrun, "--nproc-per-node", "2", "--master-port", str(free_port()), "-m", "harness",
                           "world_size=4", *TINY, f"hydra.run.dir={workdir}/run"], cwd=workdir, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode != 0 and "start 4 task(s)" in proc.stderr
