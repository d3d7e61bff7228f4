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
SLURM = [
    "-m",
    "hydra/launcher=slurm",
    "hydra.launcher.gpus_per_node=null",
    "hydra.launcher.tasks_per_node=2",
    "hydra.launcher.cpus_per_task=1",
    "hydra.launcher.timeout_min=10",
    "launch.device=cpu",
]


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
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "harness",
            *SLURM,
            *TINY,
            "world_size=2",
            "train.steps=100",
            "train.checkpoint_every=10",
            "hydra.launcher.max_num_timeout=0",
            "launch.fault=none,exit,slow",
            "launch.fault_rank=1",
            "launch.fault_step=3",
            f"hydra.sweep.dir={sweep}",
        ],
        cwd=workdir,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
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
            reason = subprocess.run(
                ["squeue", "-h", "-j", job, "-o", "%r"], capture_output=True, text=True, timeout=30
            ).stdout.strip()
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


# the two runtimes that resume from checkpoints, each on two stages cut where told (a cut measured
# under the jobs' shared load may differ from the reference's, and moves which layers AshPipe
# trains a step late), each interrupted one way: Hippie requeued by `scontrol requeue` (no warning:
# it resumes from its periodic checkpoint), AshPipe at its time limit (warned: it stops with a
# checkpoint, which drains its pipeline, and submitit requeues it)
RESUMABLE = {
    "hippie": ["train.micro_batches=2", "strategy.boundaries=[3]"],
    "ashpipe": ["strategy.replicas=[1,1]", "strategy.boundaries=[3]"],
}
# how each job is launched beyond the preset: AshPipe's with its time limit and a straggler (below)
LAUNCH = {
    "hippie": [],
    "ashpipe": [
        "hydra.launcher.timeout_min=1",
        "hydra.launcher.signal_delay_s=10",
        "hydra.launcher.max_num_timeout=3",
        "launch.fault=slow",
        "launch.fault_rank=0",
        "launch.fault_step=0",
        "launch.fault_sleep_s=0.7",
        "launch.fault_starts=1",
    ],
}


def test_jobs_requeued_by_scontrol_and_by_their_time_limit_resume_to_the_same_loss(workdir):
    """Two Slurm jobs side by side. Hippie's is requeued by ``scontrol requeue`` once its step-10
    checkpoint exists: no warning, so its next start resumes from that periodic checkpoint
    (SLURM_RESTART_COUNT). AshPipe's has a one-minute time limit and Slurm's warning 10 s before
    it: Slurm checks time limits every 30 s and warns at the first check that finds the job
    within the delay plus 30 s of its limit, here between 20 and 50 s after the start, with at
    least 10 s left to stop. The warning stops the run at the end of a step with a checkpoint,
    submitit requeues the job, and the next start ends where an uninterrupted run ends. The time
    limit is wall clock: rank 0 is a straggler in the first start (``launch.fault=slow``, 0.7 s a
    step, which changes no number), so that start outlasts its warning whatever the machine's
    speed, and the next one runs at full speed (a start that meets its limit again stops again).
    The uninterrupted references, without the straggler, run once Hippie's job is requeued."""
    settings = [*TINY, "world_size=2", "launch.device=cpu", "train.steps=100", "train.checkpoint_every=10"]
    sweeps = {s: os.path.join(workdir, s) for s in RESUMABLE}

    def start(strategy: str, *args: str) -> subprocess.Popen:
        return subprocess.Popen(
            [sys.executable, "-m", "harness", *args, *settings, f"strategy={strategy}", *RESUMABLE[strategy]],
            cwd=workdir,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )

    procs = {s: start(s, *SLURM, *LAUNCH[s], f"hydra.sweep.dir={sweeps[s]}") for s in RESUMABLE}
    references: dict[str, subprocess.Popen] = {}
    try:
        requeued, deadline = False, time.time() + 240
        while any(p.poll() is None for p in procs.values()):
            if not requeued and os.path.exists(
                os.path.join(sweeps["hippie"], "0_hippie_w2", "checkpoints", "step10", "rank1.pt")
            ):
                (job,) = _job_ids(sweeps["hippie"])
                _scontrol("requeue", job)
                requeued = True
                references = {
                    f"straight_{s}": start(s, "run", f"hydra.run.dir={workdir}/straight_{s}") for s in RESUMABLE
                }
            _release_requeued()
            assert time.time() < deadline, _queue()
            time.sleep(0.3)
        outputs = {key: p.communicate(timeout=120) for key, p in [*procs.items(), *references.items()]}
    finally:
        for p in [*procs.values(), *references.values()]:
            if p.poll() is None:
                p.kill()
    failed = {
        key: (p.returncode, outputs[key][0][-1500:], outputs[key][1][-1500:], _job_logs(sweeps.get(key)))
        for key, p in [*procs.items(), *references.items()]
        if p.returncode != 0
    }
    assert not failed, failed
    assert requeued and references
    recs = {s: next(iter(_records(sweeps[s]).values())) for s in RESUMABLE}
    # Hippie: one requeue, no warning, resumed from a periodic checkpoint
    assert recs["hippie"]["status"] == "ok" and recs["hippie"]["resumed"] == 1, recs["hippie"]
    assert recs["hippie"]["resumed_from_step"] % 10 == 0 and recs["hippie"]["resumed_from_step"] > 0
    assert not os.path.exists(os.path.join(sweeps["hippie"], "0_hippie_w2", "preempted.json"))
    # AshPipe: stopped by its time limit's warning, once per start that met it
    warned = json.load(open(os.path.join(sweeps["ashpipe"], "0_ashpipe_w2", "preempted.json")))
    assert warned["signal"] == "SIGUSR2" and 0 < warned["step"] < 100, warned
    logs = "".join(open(p).read() for p in glob.glob(os.path.join(sweeps["ashpipe"], ".submitit", "*", "*_0_log.err")))
    assert "this job is timed-out" in logs  # submitit's handler judged it a time limit, not a preemption
    assert recs["ashpipe"]["status"] == "ok" and recs["ashpipe"]["resumed"] == warned["stops"], recs["ashpipe"]
    assert recs["ashpipe"]["resumed_from_step"] == warned["step"]
    for s, rec in recs.items():
        assert [step for step, _ in rec["loss_curve"]] == list(range(100))  # every start's steps, in one record
        assert not glob.glob(os.path.join(sweeps[s], f"0_{s}_w2", ".stop"))
        reference = read(os.path.join(workdir, f"straight_{s}", "metrics.json"))
        assert rec["final_loss"] == pytest.approx(reference["final_loss"], abs=1e-6), s


def test_a_sweep_is_one_job_array_per_placement_with_ranks_from_srun(workdir):
    """The headline experiment's launch, scaled to this CPU cluster of two nodes with two tasks
    each: a sweep of DP and Hippie at two ranks and DP at four is one job array per placement
    (submitted with sbatch), each job on as many nodes and with as many tasks as its ranks need,
    its ranks from srun (Slurm's own accounting says where each ran): the two jobs of two ranks
    on one node each, the job of four across both. Every record ok, the sweep's table written by
    its end."""
    sweep = os.path.join(workdir, "sweep")
    proc = run_cli(
        [
            *SLURM,
            *TINY,
            "+case=dp_w2,hippie_w2,ci/replicated_dp_w4",
            "train.micro_batches=2",
            f"hydra.sweep.dir={sweep}",
        ],
        cwd=workdir,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    records = _records(sweep)
    assert sorted((r["strategy"], r["world_size"]) for r in records.values()) == [("dp", 2), ("dp", 4), ("hippie", 2)]
    assert all(r["status"] == "ok" for r in records.values())
    for rec in records.values():  # rank 0 of a job of a task per rank wrote it, with every rank's figures
        assert len(rec["peak_memory_per_rank"]) == rec["world_size"]
    assert os.path.isfile(os.path.join(sweep, "results.md"))
    # submitit's folder per job, <array id>_<index>, with a log per task: an array of two, one of one
    jobs = {os.path.basename(os.path.dirname(p)) for p in glob.glob(os.path.join(sweep, ".submitit", "*", "*_log.out"))}
    arrays: dict[str, list[str]] = {}
    for job in jobs:
        arrays.setdefault(job.split("_")[0], []).append(job)
    assert sorted(len(members) for members in arrays.values()) == [1, 2], jobs
    placed = {}
    for job in jobs:
        out = subprocess.run(
            ["sacct", "-X", "-n", "-P", "-j", job, "-o", "NNodes,NodeList,State"],
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout.split()
        assert len(out) == 1 and out[0].endswith("|COMPLETED"), (job, out)
        logs = glob.glob(os.path.join(sweep, ".submitit", job, "*_log.out"))
        tasks = sorted(int(os.path.basename(p).split("_")[-2]) for p in logs)
        assert tasks == list(range(len(logs))), (job, tasks)
        placed.setdefault(len(logs), set()).add(out[0].rsplit("|", 1)[0])
        if len(logs) == 4:  # submitit's log of each task names its node: two tasks on each
            text = [open(p).read() for p in logs]
            assert sorted(sum(f"node={n}(2)" in t for t in text) for n in (0, 1)) == [2, 2], text[0][:2000]
    assert all(nodes.startswith("1|") for nodes in placed[2]), placed
    assert placed[4] == {f"2|{_nodes()}"}, placed
