"""The project's Slurm launcher for Hydra (``hydra/launcher=slurm``): hydra-submitit-launcher's,
with each job's nodes and tasks per node (and GPUs per node, where the preset asks for GPUs)
from its own ``world_size`` (:func:`harness.cli.launcher.placement`). Jobs of one placement are
one job array; the sweep's job numbers, folders and order are Hydra's, whatever the grouping.

Hydra only loads launchers from its ``hydra_plugins`` namespace: this folder is installed as
``hydra_plugins.pipebench`` (pyproject.toml's package-dir) and is imported only under that name.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Sequence

from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, filter_overrides
from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf
from hydra_plugins.hydra_submitit_launcher.submitit_launcher import SlurmLauncher
from omegaconf import OmegaConf, open_dict

from harness.cli.job import known_fields
from harness.cli.launcher import placement
from harness.report import record

log = logging.getLogger(__name__)

_FREE_PORT = "import socket; s = socket.socket(); s.bind(('', 0)); print(s.getsockname()[1])"


def _queued(job_id: str) -> bool:
    """Whether Slurm still lists the job (pending or running again after a requeue)."""
    try:
        done = subprocess.run(
            ["squeue", "-h", "-j", str(job_id), "-o", "%T"], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0 and bool(done.stdout.strip())


class WorldSizeSlurmLauncher(SlurmLauncher):
    """See the module docstring."""

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        import submitit

        assert self.config is not None and self.hydra_context is not None
        per_node = int(self.params.get("tasks_per_node") or 1)
        groups: dict[tuple[int, int], list[int]] = {}
        for i, overrides in enumerate(job_overrides):
            job = self.hydra_context.config_loader.load_sweep_config(self.config, list(overrides))
            groups.setdefault(placement(int(job.world_size), per_node), []).append(i)

        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        log.info(f"Submitit 'slurm' sweep output dir : {sweep_dir}")
        results: list[JobReturn | None] = [None] * len(job_overrides)
        pending = []
        for (nodes, tasks), members in groups.items():
            executor = submitit.AutoExecutor(
                cluster="slurm",
                folder=self.params["submitit_folder"],
                slurm_max_num_timeout=self.params.get("max_num_timeout", 0),
            )
            executor.update_parameters(**self._queue_parameters(nodes, tasks))
            calls = []
            for i in members:
                idx = initial_job_idx + i
                log.info(
                    f"\t#{idx} : {' '.join(filter_overrides(job_overrides[i]))} ({nodes} node(s) x {tasks} task(s))"
                )
                calls.append(
                    (list(job_overrides[i]), "hydra.sweep.dir", idx, f"job_id_for_{idx}", Singleton.get_state())
                )
            pending.append((members, executor.map_array(self, *zip(*calls))))
        for members, jobs in pending:  # every array is queued before any is waited for
            for i, job in zip(members, jobs):
                results[i] = self._rank0_result(job, job_overrides[i], initial_job_idx + i)
        return results  # type: ignore[return-value]

    def _rank0_result(self, job, overrides: Sequence[str], idx: int) -> JobReturn:
        """What the job's first task (rank 0) returned: its process writes the job's record, ok or
        failed (a job whose other rank died has a failed one), and its result is there as soon as
        it ends. Where rank 0 returned no result (killed, its node lost) or Hydra's failed one (an
        error outside the run, such as submitit refusing another requeue once the job has reached
        its time limit ``max_num_timeout`` times), the job's failed record is written in its folder
        here if the job left none, so that the sweep's table and exit status show the job, and the
        sweep goes on to its table instead of ending in a traceback."""
        from submitit.core.utils import FailedJobError, UncompletedJobError

        while True:
            try:
                result = job.task(0).result()
                if result.status != JobStatus.FAILED:
                    return result
                if _queued(job.job_id):
                    # an attempt's failure while Slurm holds the job again (requeued as it ended):
                    # the next attempt's result replaces it, and the job leaves the queue after that
                    time.sleep(5)
                    continue
                why = str(result._return_value).strip().rstrip(".")
            except UncompletedJobError:
                if _queued(job.job_id):
                    # requeued: submitit's watcher saw the attempt that ended, not the job (seen here
                    # when a time-limit requeue met its poll), so wait for the next attempt's result
                    time.sleep(5)
                    continue
                why = f"ended ({job.task(0).state}) without rank 0's result"
            except FailedJobError as e:
                why = f"ended ({job.task(0).state}) without rank 0's result"
                if str(e).strip():
                    why += f" ({str(e).strip().splitlines()[-1]})"
            break
        cfg = self.hydra_context.config_loader.load_sweep_config(self.config, list(overrides))
        with open_dict(cfg):
            cfg.hydra.job.num = idx  # the job's folder name uses it, as Hydra sets it in the job
        run_dir = os.path.join(str(cfg.hydra.sweep.dir), str(cfg.hydra.sweep.subdir))
        error = f"Slurm job {job.job_id}: {why}; its logs: {job.paths.folder}"
        log.error(f"{' '.join(filter_overrides(overrides))}: {error}")
        try:
            rec = record.read(os.path.join(run_dir, record.RECORD_FILE))
        except (OSError, ValueError):  # none, or one cut short when its process was killed
            rec = None
        if rec is None or rec.get("status") == "running":
            record.write(run_dir, record.failed_record(known_fields(cfg), error))
        elif rec.get("status") == "failed" and error not in rec.get("error", ""):
            # such as a run stopped for a requeue that submitit then refused: say so
            record.write(run_dir, {**rec, "error": f"{rec.get('error')}; then {error}"})
        # Hydra's status is whether the launcher has a return; the record says the job failed
        return JobReturn(overrides=list(overrides), cfg=cfg, working_dir=run_dir, status=JobStatus.COMPLETED)

    def _queue_parameters(self, nodes: int, tasks: int) -> dict[str, Any]:
        """The executor's parameters: the preset's, with this placement's nodes and tasks (and as
        many GPUs per node as tasks, where the preset asks for GPUs)."""
        base = set(OmegaConf.structured(BaseQueueConf).keys())
        params = {k: v for k, v in self.params.items() if k not in ("submitit_folder", "max_num_timeout")}
        params.update(nodes=nodes, tasks_per_node=tasks)
        if params.get("gpus_per_node"):
            params["gpus_per_node"] = tasks
        # the ranks meet at a port free on the job's first node when the job starts, where the batch
        # script runs: submitit would derive one from the job id, which another process on a shared
        # node may hold (seen here: two jobs of an array side by side, EADDRINUSE)
        params["setup"] = [f"export MASTER_PORT=$({sys.executable} -c {_FREE_PORT!r})", *(params.get("setup") or [])]
        return {k if k in base else f"slurm_{k}": v for k, v in params.items()}
