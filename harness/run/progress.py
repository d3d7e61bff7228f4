"""Progress output for long work: one tqdm bar per run (rank 0), with samples/s."""

from __future__ import annotations

import sys
import threading

from tqdm import tqdm

# tqdm's default lock is a multiprocessing semaphore, for bars shared by several processes; a run
# has one bar, on rank 0, and a semaphore left behind by a worker that was killed makes
# multiprocessing's resource tracker warn about it when the command ends
tqdm.set_lock(threading.RLock())


class StepProgress:
    def __init__(self, steps: int, global_batch: int, enabled: bool, label: str, initial: int = 0):
        self.global_batch = global_batch
        self.bar = tqdm(total=steps, initial=initial, desc=label, unit="step", file=sys.stderr, disable=not enabled,
                        dynamic_ncols=True, mininterval=0.5)

    def update(self, step_time: float | None) -> None:
        # the loss is known only once every rank's share is summed, at the end of the run
        if step_time:
            self.bar.set_postfix({"samples/s": f"{self.global_batch / step_time:.0f}"}, refresh=False)
        self.bar.update(1)

    def close(self) -> None:
        self.bar.close()
