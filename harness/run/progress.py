"""Training progress as it goes, from rank 0: rows in ``steps.jsonl``, a log line now and then,
and a tqdm bar only on a terminal.

Every ``logger.log_every`` steps (default: about a hundredth of the run, at least 10) each rank adds its
share of the loss over those steps, and its memory, to one small all-reduce on a gloo group of
its own, started without waiting and collected by rank 0 once it has completed (polled after
each step): no step waits for it, and the job's transfers and collectives never queue behind
it. Rank 0 then appends a row to ``<run dir>/steps.jsonl``: the step, the mean loss over the
window, the learning rate, rank 0's samples/s and step time over the window, and the largest
memory over the ranks (peak allocated on a GPU; on a CPU the process's peak RSS, which holds the
data set and libraries too); an evaluation adds its own row. Every ``logger.print_every`` steps
(default: about a tenth of the run) the row is also printed as one plain line, which is what a
Slurm log keeps; so is every evaluation, and, where no line came for :data:`CONSOLE_EVERY_S`
seconds, rank 0's own progress after the step that ends them (its steps, speed and the time left:
no collective is added for it), so that a long run is never silent for long.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time

import torch
import torch.distributed as dist
from tqdm import tqdm

from harness.core.comm import Pending
from harness.metrics.meter import peak_rss_bytes
from harness.report.wandb_run import STEPS_FILE

# tqdm's default lock is a multiprocessing semaphore, for bars shared by several processes; a run
# has one bar, on rank 0, and a semaphore left behind by a worker that was killed makes
# multiprocessing's resource tracker warn about it when the command ends
tqdm.set_lock(threading.RLock())

CONSOLE_EVERY_S = 30.0  # the longest a training run goes without a line on the console


def intervals(log_every: int, print_every: int, steps: int) -> tuple[int, int]:
    """(steps between rows, steps between printed lines): the settings, or for 0 about a hundredth
    of the run but at least 10 steps (a row costs a small all-reduce in the background: rarely
    enough that the steps it overlaps are not slowed), and about a tenth of the run; a printed
    line is a row's, so its interval is a multiple of the rows'."""
    rows = log_every if log_every > 0 else max(10, round(steps / 100))
    lines = print_every if print_every > 0 else round(steps / 10)
    return rows, rows * max(1, round(lines / rows))


class StepLog:
    """See the module docstring; every rank makes one and calls :meth:`step` after each step."""

    def __init__(self, spec, ctx, first_step: int, lr_at, bar: bool):
        steps = spec.steps
        self.ctx, self.steps, self.global_batch, self.lr_at = ctx, steps, spec.train.global_batch, lr_at
        self.log_every, self.print_every = intervals(spec.logger.log_every, spec.logger.print_every, steps)
        self.label = f"{spec.strategy.name} w={spec.world_size}"
        # a group of its own (every rank creates it, in the same order): its all-reduces never
        # queue behind the strategy's transfers on the default group
        self.group = dist.new_group(backend="gloo", timeout=ctx.timeout) if ctx.world_size > 1 else None
        self.path = os.path.join(spec.output_dir, STEPS_FILE) if ctx.is_main and spec.output_dir else None
        self.loss, self.times, self.window_start = 0.0, [], first_step
        self.pending: list[tuple[Pending | None, torch.Tensor, dict]] = []
        self.started = time.perf_counter()
        self.printed = (self.started, first_step)  # (when, after which step) the last line came
        self.bar = tqdm(
            total=steps,
            initial=first_step,
            desc=self.label,
            unit="step",
            file=sys.stderr,
            dynamic_ncols=True,
            mininterval=0.5,
            disable=not (bar and ctx.is_main and sys.stderr.isatty()),
        )

    @property
    def memory_key(self) -> str:
        return "train/peak_allocated_mib" if self.ctx.device.type == "cuda" else "train/peak_rss_mib"

    def _memory(self) -> float:
        if self.ctx.device.type == "cuda":
            return float(torch.cuda.max_memory_allocated(self.ctx.device))
        return float(peak_rss_bytes())

    def step(self, step: int, loss_share: float, step_time: float | None) -> None:
        """After optimizer step ``step`` (0-based) with this rank's loss share and, where the step
        was timed, its time."""
        self.loss += loss_share
        if step_time:
            self.times.append(step_time)
        done = step + 1
        self.bar.update(1)
        if done % self.log_every == 0 or done == self.steps:
            self._reduce(done)
        self._collect(wait=False)
        if self.ctx.is_main and time.perf_counter() - self.printed[0] >= CONSOLE_EVERY_S and done < self.steps:
            self._heartbeat(done)

    def _heartbeat(self, done: int) -> None:
        """Rank 0's progress since the last line, from its own clock (the loss waits for a row)."""
        now = time.perf_counter()
        when, after = self.printed
        rate = (done - after) / max(now - when, 1e-9)  # steps per second since the last line
        left = (self.steps - done) / rate if rate > 0 else float("nan")
        self._line(
            f"{self.label} step {done}/{self.steps} | {rate * self.global_batch:.0f} samples/s | "
            f"{now - self.started:.0f} s in, about {left:.0f} s left",
            done,
        )

    def _reduce(self, done: int) -> None:
        window = done - self.window_start
        values = torch.zeros(2 + self.ctx.world_size, dtype=torch.float64)
        # every rank's loss share and memory; the window's length once (rank 0's)
        values[0], values[2 + self.ctx.rank] = self.loss, self._memory()
        values[1] = window if self.ctx.is_main else 0.0
        work = dist.all_reduce(values, group=self.group, async_op=True) if self.group is not None else None
        times = self.times
        row = {"step": done, "train/lr": self.lr_at(done - 1), "time_s": round(time.perf_counter() - self.started, 3)}
        if times:
            mean = sum(times) / len(times)
            row.update({"train/step_time_s": mean, "train/samples_per_s": self.global_batch / mean})
        self.pending.append((Pending(work, "progress all-reduce", None) if work else None, values, row))
        self.loss, self.times, self.window_start = 0.0, [], done

    def _collect(self, wait: bool) -> None:
        while self.pending:
            work, values, row = self.pending[0]
            if work is not None and not (wait or work.done()):
                return
            if work is not None:
                work.wait()
            self.pending.pop(0)
            if not self.ctx.is_main:
                continue
            row.update(
                {"train/loss": float(values[0] / max(values[1], 1)), self.memory_key: float(values[2:].max()) / 2**20}
            )
            self._write(row)
            if row["step"] % self.print_every == 0 or row["step"] == self.steps:
                self._print(row)

    def _write(self, row: dict) -> None:
        if self.path is None:
            return
        try:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            with open(self.path, "a") as f:
                f.write(json.dumps(row) + "\n")
        except OSError as e:  # progress is not worth a run: say so once and go on without it
            print(f"warning: cannot write {self.path} ({e.strerror}); step metrics are not logged", file=sys.stderr)
            self.path = None

    def _print(self, row: dict) -> None:
        speed = (
            f" | {row['train/samples_per_s']:.0f} samples/s | {row['train/step_time_s'] * 1e3:.1f} ms/step"
            if "train/samples_per_s" in row
            else ""
        )
        memory = "peak allocated" if self.memory_key == "train/peak_allocated_mib" else "peak RSS"
        line = (
            f"{self.label} step {row['step']}/{self.steps} | loss {row['train/loss']:.4f} | "
            f"lr {row['train/lr']:.3g}{speed} | {memory} {row[self.memory_key]:.0f} MiB"
        )
        self._line(line, row["step"])

    def _line(self, line: str, step: int) -> None:
        self.printed = (time.perf_counter(), step)
        if self.bar.disable:
            print(line, flush=True)
        else:  # above the bar
            self.bar.write(line, file=sys.stderr)

    def evaluated(self, point: dict) -> None:
        """An evaluation's row (rank 0), after the rows of the steps before it."""
        self._collect(wait=True)
        self._write(
            {
                "step": point["step"],
                "test/accuracy": point["accuracy"],
                "test/loss": point["loss"],
                "time_s": round(time.perf_counter() - self.started, 3),
            }
        )
        if self.ctx.is_main:
            self._line(
                f"{self.label} step {point['step']}/{self.steps} | test top-1 {point['accuracy'] * 100:.2f}% | "
                f"test loss {point['loss']:.4f}",
                point["step"],
            )

    def close(self) -> None:
        self._collect(wait=True)
        self.bar.close()
