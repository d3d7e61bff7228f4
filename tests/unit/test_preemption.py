"""The hand-over of a scheduler's warning to submitit's handler, which requeues the job."""

import signal
import subprocess

import pytest

from harness.run.preemption import Watch, preemption_signal


def _handing_over_to(handler, run_dir: str):
    """Hand the warning over, with ``handler`` as the handler that was there before the run's."""
    before = signal.signal(preemption_signal(), handler)
    try:
        with Watch(run_dir) as watch:
            watch.hand_over()
    finally:
        signal.signal(preemption_signal(), before)


def test_a_requeue_whose_scontrol_slurm_ends_is_a_requeue_and_a_refused_one_an_error(tmp_path):
    """Slurm's requeue ends the job's processes at once, the `scontrol requeue` that asked for it
    included (seen in CI): submitit's handler then fails with the signal's status, and the task
    must end as a requeued one does (no result written), not with the error. A requeue that
    scontrol refuses stays an error."""

    def killed_by_the_requeue(signum, frame):
        raise subprocess.CalledProcessError(-signal.SIGTERM, ["scontrol", "requeue", "42"])

    with pytest.raises(SystemExit) as ended:
        _handing_over_to(killed_by_the_requeue, str(tmp_path))
    assert ended.value.code == -1

    def refused(signum, frame):
        raise subprocess.CalledProcessError(1, ["scontrol", "requeue", "42"])

    with pytest.raises(subprocess.CalledProcessError):
        _handing_over_to(refused, str(tmp_path))
