"""Sweeps against a real Slurm cluster (``.ci/slurm-cluster up``): sbatch job arrays from the
project's launcher preset, ranks from srun, failures and requeues as Slurm makes them.

CPU settings throughout: ``launch.device=cpu``, gloo, one task per worker. Skipped with one line
where no cluster is up.
"""

from __future__ import annotations

import glob
import json
import os
import re
import subprocess
import sys
import time

import pytest

from harness.report.record import read
from tests.helpers.cli import TINY, run_cli
from tests.helpers.slurm import cluster_down

pytestmark = pytest.mark.slurm

# the preset as a CPU cluster runs it: no GPUs, two tasks per node (this machine's cores)
SLURM = ["-m", "hydra/launcher=slurm", "hydra.launcher.gpus_per_node=null", "hydra.launcher.tasks_per_node=2",
         "hydra.launcher.cpus_per_task=1", "hydra.launcher.timeout_min=10", "launch.device=cpu", "world_size=2"]


@pytest.fixture(scope="module", autouse=True)
def cluster():
    reason = cluster_down()
    if reason:
        pytest.skip(reason)
    yield
    # nothing of the tests is left queued or running
    deadline = time.time() + 60
    while time.time() < deadline and _queue():
        time.sleep(1)
    left = _queue()
    subprocess.run(["scancel", "--user", os.environ.get("USER", "root")], capture_output=True)
    assert not left, f"jobs left in the queue: {left}"
    # and no task of theirs is left running on the node
    tasks = subprocess.run(["pgrep", "-af", "submitit.core._submit"], capture_output=True, text=True).stdout
    assert not tasks.strip(), f"processes left: {tasks}"


def _nodes() -> str:
    """The cluster's node list, as Slurm writes it (``vm,vm-b`` for .ci/slurm-cluster)."""
    return subprocess.run(["sinfo", "-h", "-o", "%N"], capture_output=True, text=True, timeout=30).stdout.strip()


def _queue() -> list[str]:
    out = subprocess.run(["squeue", "-h", "-o", "%i %j %T"], capture_output=True, text=True, timeout=30).stdout
    return [line for line in out.splitlines() if line.strip()]


def _records(sweep: str) -> dict[str, dict]:
    return {os.path.basename(os.path.dirname(p)): read(p) for p in glob.glob(os.path.join(sweep, "*", "metrics.json"))}


def test_a_sweep_runs_as_a_slurm_job_array_with_ranks_from_srun(workdir):
    sweep = os.path.join(workdir, "sweep")
    proc = run_cli([*SLURM, *TINY, "strategy=dp,hippie", "train.micro_batches=2", f"hydra.sweep.dir={sweep}"],
                   cwd=workdir, timeout=240)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    records = _records(sweep)
    assert sorted(r["strategy"] for r in records.values()) == ["dp", "hippie"]
    assert all(r["status"] == "ok" and r["world_size"] == 2 for r in records.values())
    assert os.path.isfile(os.path.join(sweep, "results.md"))  # the sweep's table, by its end
    # one Slurm job per point (an array), each with two tasks: submitit logs each task apart
    logs = glob.glob(os.path.join(sweep, ".submitit", "*", "*_log.out"))
    jobs = {os.path.basename(os.path.dirname(p)) for p in logs}
    assert len(jobs) == 2 and all("_" in j for j in jobs), jobs  # <array id>_<index>
    for job in jobs:
        tasks = sorted(os.path.basename(p).split("_")[-2] for p in glob.glob(os.path.join(sweep, ".submitit", job, "*_log.out")))
        assert tasks == ["0", "1"], (job, tasks)
    for rec in records.values():  # rank 0 of a job of two tasks wrote it, with both ranks' figures
        assert len(rec["peak_memory_per_rank"]) == 2


def test_failed_jobs_end_with_a_record_and_the_rest_of_their_array_goes_on(workdir):
    """Three jobs of one array: one completes; in one a worker dies (rank 1 exits at step 3), and
    the job fails in seconds; one is sent Slurm's time-limit warning (SIGUSR2, here by hand, as
    Slurm sends it to a job's tasks) with no requeue allowed (``max_num_timeout=0``): its run stops
    with a checkpoint, submitit refuses to requeue it (Hydra's job returns an error, not a record)
    and the job ends failed, its record saying why. The sweep writes its table, exits 1, and shows
    no traceback."""
    sweep = os.path.join(workdir, "sweep")
    started = time.time()
    # the straggler (rank 1 from step 3, 0.1 s a step) outlasts the warning; the others are not slowed
    proc = subprocess.Popen([sys.executable, "-m", "harness", *SLURM, *TINY, "train.steps=100",
                             "train.checkpoint_every=10", "hydra.launcher.max_num_timeout=0",
                             "launch.fault=none,exit,slow", "launch.fault_rank=1", "launch.fault_step=3",
                             f"hydra.sweep.dir={sweep}"], cwd=workdir, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        deadline = time.time() + 120
        while not glob.glob(os.path.join(sweep, "2_*", "checkpoints", "step10", "rank1.pt")):
            assert proc.poll() is None and time.time() < deadline, _queue()
            time.sleep(0.3)
        (job,) = [j for j in os.listdir(os.path.join(sweep, ".submitit")) if j.endswith("_2")]
        subprocess.run(["scancel", "--signal=USR2", job], check=True, capture_output=True, timeout=30)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, err[-3000:]  # the failed jobs are in the sweep's exit status
    ok, died, warned = (rec for _, rec in sorted(_records(sweep).items()))  # jobs 0, 1, 2
    assert ok["status"] == "ok"
    assert died["status"] == "failed" and died["wall_time_s"] < 60
    assert died["error"].startswith("another rank's process ended during the run"), died["error"]
    logs = glob.glob(os.path.join(sweep, ".submitit", "*_1", "*_log.err"))
    assert any("task 1: Exited with exit code 3" in open(p).read() for p in logs)  # Slurm names the task
    assert warned["status"] == "failed" and warned["error"].startswith("stopped by SIGUSR2"), warned["error"]
    assert "timed-out too many times" in warned["error"]  # the record says why no requeue came
    assert "timed-out too many times" in out and time.time() - started < 200
    # the sweep's launcher took rank 0's result and went on to the table: no traceback
    assert os.path.isfile(os.path.join(sweep, "results.md")) and "Traceback" not in err, err[-3000:]


def _release_requeued() -> None:
    """Slurm holds a requeued job back a while before it may start again (its begin time, about two
    minutes): let each start as soon as the node has room, as a user waiting would see it later."""
    for line in _queue():
        job, _, state = line.split(" ", 2)
        if state.startswith("PENDING"):
            reason = subprocess.run(["squeue", "-h", "-j", job, "-o", "%r"], capture_output=True, text=True,
                                    timeout=30).stdout.strip()
            if reason == "BeginTime":
                subprocess.run(["scontrol", "update", f"JobId={job}", "StartTime=now"], capture_output=True, timeout=30)


def _scontrol(*args: str) -> None:
    subprocess.run(["scontrol", *args], check=True, capture_output=True, timeout=30)


def _job_ids(sweep: str) -> list[str]:
    """The Slurm jobs of a sweep so far, from submitit's folder of each (``<array>_<index>``)."""
    folder = os.path.join(sweep, ".submitit")
    names = os.listdir(folder) if os.path.isdir(folder) else []
    return sorted(n for n in names if re.fullmatch(r"\d+(_\d+)?", n) and os.path.isdir(os.path.join(folder, n)))


def _job_logs(sweep: str | None) -> str:
    """The last lines of every task's log of a sweep's jobs, for a failure's message."""
    logs = sorted(glob.glob(os.path.join(sweep, ".submitit", "*", "*_log.*"))) if sweep else []
    return "\n".join(f"== {p}\n" + "".join(open(p).readlines()[-15:]) for p in logs)


# the two runtimes that resume from checkpoints, each on two stages cut where told: a cut measured
# under the jobs' shared load may differ from the reference's, and moves which layers AshPipe
# trains a step late
RESUMABLE = {"hippie": ["train.micro_batches=2", "strategy.boundaries=[3]"],
             "ashpipe": ["strategy.replicas=[1,1]", "strategy.boundaries=[3]"]}


def test_jobs_requeued_by_scontrol_and_by_their_time_limit_resume_to_the_same_loss(workdir):
    """Hippie and AshPipe, each one Slurm job with a one-minute time limit and Slurm's warning 10 s
    before it. Slurm checks time limits every 30 s and warns at the first check that finds the
    job within the delay plus 30 s of its limit: here between 20 and 50 s after each start, with at
    least 10 s left to stop. The first start is given ten minutes (``scontrol update`` as soon as
    the job exists), so that no warning meets the requeue however slowly it starts (a warning that
    meets a requeue can reach the next start before it handles signals, and kill it); each job is
    requeued by ``scontrol requeue`` once its step-10 checkpoint exists and given back its minute:
    no warning, so the next start resumes from that periodic checkpoint (SLURM_RESTART_COUNT).
    That start then runs into its time limit: the
    warning stops the run at the end of a step with a checkpoint, submitit requeues the job, and the
    third start ends where an uninterrupted run ends. The time limit is wall clock: rank 0 of each
    job is a straggler in its first two starts (``launch.fault=slow``, 0.4 s a step, which changes
    no number), so the second outlasts its warning whatever the machine's speed and the third
    finishes at full speed, before a warning of its own. The two jobs sleep side by side (the
    partition lets two jobs share a CPU), and the uninterrupted references, without the straggler,
    run while the second starts sleep."""
    settings = [*TINY, "world_size=2", "launch.device=cpu", "train.steps=200", "train.checkpoint_every=10"]
    limited = [*SLURM, "hydra.launcher.timeout_min=1", "hydra.launcher.signal_delay_s=10",
               "hydra.launcher.max_num_timeout=3", "launch.fault=slow", "launch.fault_rank=0", "launch.fault_step=0",
               "launch.fault_sleep_s=0.4", "launch.fault_starts=2"]
    sweeps = {s: os.path.join(workdir, s) for s in RESUMABLE}

    def start(strategy: str, *args: str) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "harness", *args, *settings, f"strategy={strategy}",
                                 *RESUMABLE[strategy]], cwd=workdir, text=True, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env={**os.environ, "PYTHONUNBUFFERED": "1"})

    procs = {s: start(s, *limited, f"hydra.sweep.dir={sweeps[s]}") for s in RESUMABLE}
    references: dict[str, subprocess.Popen] = {}
    try:
        lengthened, requeued, deadline = set(), set(), time.time() + 300
        while any(p.poll() is None for p in procs.values()):
            for s, sweep in sweeps.items():
                jobs = _job_ids(sweep)
                if s not in lengthened and jobs:
                    _scontrol("update", f"JobId={jobs[0]}", "TimeLimit=10")
                    lengthened.add(s)
                if s not in requeued and os.path.exists(os.path.join(sweep, f"0_{s}_w2", "checkpoints", "step10",
                                                                     "rank1.pt")):
                    (job,) = jobs
                    _scontrol("requeue", job)
                    _scontrol("update", f"JobId={job}", "TimeLimit=1")  # the next starts meet their limit
                    requeued.add(s)
            if not references and requeued == set(RESUMABLE):
                references = {f"straight_{s}": start(s, "run", f"hydra.run.dir={workdir}/straight_{s}")
                              for s in RESUMABLE}
            _release_requeued()
            assert time.time() < deadline, _queue()
            time.sleep(0.3)
        outputs = {key: p.communicate(timeout=120) for key, p in [*procs.items(), *references.items()]}
    finally:
        for p in [*procs.values(), *references.values()]:
            if p.poll() is None:
                p.kill()
    failed = {key: (p.returncode, outputs[key][0][-1500:], outputs[key][1][-1500:], _job_logs(sweeps.get(key)))
              for key, p in [*procs.items(), *references.items()] if p.returncode != 0}
    assert not failed, failed
    assert requeued == set(RESUMABLE) and references
    for s in RESUMABLE:
        (rec,) = _records(sweeps[s]).values()
        warned = json.load(open(os.path.join(sweeps[s], f"0_{s}_w2", "preempted.json")))  # by the time limit
        assert warned["signal"] == "SIGUSR2" and 10 < warned["step"] < 200, warned
        logs = "".join(open(p).read() for p in glob.glob(os.path.join(sweeps[s], ".submitit", "*", "*_0_log.err")))
        assert "this job is timed-out" in logs  # submitit's handler judged it a time limit, not a preemption
        # one requeue by scontrol, one per warning (a start that reaches its limit again stops again)
        assert rec["status"] == "ok" and rec["resumed"] == 1 + warned["stops"], rec
        assert rec["resumed_from_step"] == warned["step"]
        assert [step for step, _ in rec["loss_curve"]] == list(range(200))  # every start's steps, in one record
        assert not glob.glob(os.path.join(sweeps[s], f"0_{s}_w2", ".stop"))
        reference = read(os.path.join(workdir, f"straight_{s}", "metrics.json"))
        assert rec["final_loss"] == pytest.approx(reference["final_loss"], abs=1e-6)


def test_each_job_of_a_sweep_gets_the_nodes_and_tasks_its_world_size_needs(workdir):
    """The headline experiment's launch, scaled to this CPU cluster of two nodes with two tasks
    each: a sweep over world sizes is one job array per placement, each job on as many nodes and
    with as many tasks as its ranks need (Slurm's own accounting says so): the job of two ranks on
    one node, the job of four across both."""
    sweep = os.path.join(workdir, "sweep")
    proc = run_cli([*SLURM, *TINY, "strategy=dp", "world_size=2,4", f"hydra.sweep.dir={sweep}"], cwd=workdir,
                   timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = sorted(_records(sweep).values(), key=lambda r: r["world_size"])
    assert [r["world_size"] for r in records] == [2, 4] and all(r["status"] == "ok" for r in records)
    assert len(records[1]["peak_memory_per_rank"]) == 4  # rank 0 gathered every rank's figures
    # one submission per placement (an array of one job here), each job with a task per rank
    jobs = {os.path.basename(os.path.dirname(p)) for p in glob.glob(os.path.join(sweep, ".submitit", "*", "*_log.out"))}
    placed = {}
    for job in jobs:
        out = subprocess.run(["sacct", "-X", "-n", "-P", "-j", job.split("_")[0], "-o", "NNodes,NodeList,State"],
                             capture_output=True, text=True, timeout=30).stdout.split()
        assert len(out) == 1 and out[0].endswith("|COMPLETED"), (job, out)
        tasks = len(glob.glob(os.path.join(sweep, ".submitit", job, "*_log.out")))
        placed[tasks] = out[0].rsplit("|", 1)[0]
        if tasks == 4:  # submitit's log of each task names its node: two tasks on each
            logs = [open(p).read() for p in glob.glob(os.path.join(sweep, ".submitit", job, "*_log.out"))]
            assert sorted(sum(f"node={n}(2)" in log for log in logs) for n in (0, 1)) == [2, 2], logs[0][:2000]
    assert placed[2].startswith("1|"), placed
    assert placed[4] == f"2|{_nodes()}", placed
