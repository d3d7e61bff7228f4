"""Whatever ends a job, it ends promptly, with a record and one line, and no process of it is left.

Each case runs `python -m harness` as a user does, with a mark in its environment that every
process of the job inherits (the command, the server that forks the workers, the workers,
multiprocessing's resource tracker), signals it once its workers train, and then looks for any
process still carrying the mark (harness.studies.driver: the soak of interruptions uses the same).
"""

import os
import signal

import pytest

from harness.studies.driver import Interruption, run_command
from tests.helpers.cli import TINY

# long enough that every signal arrives while the job trains
LONG = ["world_size=2", *TINY, "train.steps=100000"]


def _run(workdir, how: Interruption, *extra):
    return run_command([*LONG, *extra], os.path.join(workdir, "run"), deadline_s=120, cwd=workdir, interruption=how)


@pytest.mark.parametrize(
    "how,status,line",
    [
        # the command's own stop, by Ctrl-C (to the command, or to its foreground group as a terminal
        # sends it) or by SIGTERM (to the group, or to the command alone as timeout or a supervisor does)
        (Interruption(signal.SIGINT, "command", 1.0), 130, "stopped: interrupted by SIGINT: the run stopped"),
        (Interruption(signal.SIGINT, "group", 1.0), 130, "stopped: interrupted by SIGINT: the run stopped"),
        (Interruption(signal.SIGTERM, "group", 1.0), 143, "stopped: interrupted by SIGTERM: the run stopped"),
        (Interruption(signal.SIGTERM, "command", 1.0), 143, "stopped: interrupted by SIGTERM: the run stopped"),
        # a process of the job dies: the job fails, and ends the others
        (Interruption(signal.SIGKILL, "worker", 1.0), 1, "FAILED dp w=2"),
        (Interruption(signal.SIGKILL, "server", 1.0), 1, "FAILED dp w=2"),
    ],
    ids=lambda v: str(v) if isinstance(v, Interruption) else None,
)
def test_an_interrupted_or_broken_job_ends_with_a_record_one_line_and_no_process_left(workdir, how, status, line):
    # one case also logs to wandb: a run stopped on purpose finishes there with the job's exit code
    with_wandb = how == Interruption(signal.SIGTERM, "command", 1.0)
    outcome = _run(workdir, how, *(["logger.mode=offline"] if with_wandb else []))
    assert outcome.status == "failed" and outcome.returncode == status, (outcome.returncode, outcome.stderr[-5:])
    assert outcome.left_over == 0
    assert outcome.seconds < 60
    record = outcome.record
    assert record is not None and record["status"] == "failed", (
        outcome.error,
        outcome.stderr[-8:],
        sorted(os.listdir(os.path.join(workdir, "run"))),
    )
    if status != 1:
        assert record["interrupted"] == signal.Signals(how.signum).name
        assert f"interrupted by {signal.Signals(how.signum).name}" in record["error"]
    else:
        assert "killed by SIGKILL" in record["error"] or "exited with code" in record["error"]
    messages = [ln for ln in outcome.stderr if "Traceback" in ln or ln.startswith(("stopped:", "FAILED", "error:"))]
    assert len(messages) == 1 and messages[0].startswith(line), outcome.stderr[-8:]
    if with_wandb:
        import glob

        from tests.helpers.wandb_offline import offline_run

        (folder,) = glob.glob(os.path.join(workdir, "run", "wandb", "offline-run-*"))
        run = offline_run(folder)
        assert run["state"] == "failed" and run["exit_code"] == 143
        assert run["summary"]["status"] == "failed" and run["summary"]["interrupted"] == "SIGTERM"


def test_ctrl_c_stops_a_sweep_after_recording_the_job_it_interrupted(workdir):
    sweep = os.path.join(workdir, "sweep")
    outcome = run_command(
        ["-m", *LONG, "seed=0,1", f"hydra.sweep.dir={sweep}"],
        deadline_s=120,
        cwd=workdir,
        interruption=Interruption(signal.SIGINT, "group", 1.0),
    )
    assert outcome.returncode == 130 and outcome.left_over == 0
    jobs = sorted(d for d in os.listdir(sweep) if d[0].isdigit())
    assert jobs == ["0_dp_w2"]  # the second job never started
    from harness.report.record import read

    assert read(os.path.join(sweep, jobs[0], "metrics.json"))["interrupted"] == "SIGINT"


def test_a_command_killed_outright_takes_its_workers_with_it_and_is_in_wandb_as_crashed(workdir):
    """SIGKILL: nothing can be written, but the server sees the command go and ends, and each
    worker, whose parent-death signal is SIGKILL, ends with it. The wandb run never finishes
    (wandb shows it crashed), and what it logged is there: the transaction log is flushed every
    2 s. (A run stopped on purpose finishes with the job's exit code: the SIGTERM case above
    checks it.)"""
    import glob

    from tests.helpers.wandb_offline import offline_run

    outcome = _run(workdir, Interruption(signal.SIGKILL, "command", 3.0), "logger.mode=offline", "logger.log_every=1")
    assert outcome.returncode == -signal.SIGKILL and outcome.left_over == 0
    (folder,) = glob.glob(os.path.join(workdir, "run", "wandb", "offline-run-*"))
    run = offline_run(folder)
    assert run["state"] == "running" and run["exit_code"] is None
    logged = [row["_step"] for row in run["history"] if "train/loss" in row]
    assert len(logged) >= 3 and logged == sorted(logged)
    assert run["stats"], "no system metrics"
