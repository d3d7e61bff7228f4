"""The Hydra callback that ends every multirun of ``python -m harness`` with its comparison table."""

from __future__ import annotations

import json
import os
import secrets
import sys
import time

from hydra.experimental.callback import Callback

from harness.report.wandb_run import log_comparison

# failed runs of the last sweep this process ran (read by harness/__main__ for the exit code)
SWEEP_FAILURES: list[int] = []
_SWEEP_FILE = "sweep.json"


def sweep_group(sweep_dir: str) -> str:
    """The wandb group of every run of the sweep in ``sweep_dir``: written once when the sweep starts
    (its folder's name, the start time and a random suffix, so sweeps on different days or with
    the same folder never share a group)."""
    path = os.path.join(sweep_dir, _SWEEP_FILE)
    if os.path.isfile(path):
        with open(path) as f:
            return json.load(f)["group"]
    return os.path.basename(os.path.normpath(sweep_dir))  # a sweep started without the callback


class SweepTableCallback(Callback):
    """Names a multirun when it starts; after it, prints its comparison table and writes tables and
    figures beside the runs."""

    def on_multirun_start(self, config, **kwargs) -> None:
        sweep_dir = config.hydra.sweep.dir
        os.makedirs(sweep_dir, exist_ok=True)
        group = (
            f"{os.path.basename(os.path.normpath(sweep_dir))}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"
        )
        with open(os.path.join(sweep_dir, _SWEEP_FILE), "w") as f:
            json.dump({"group": group, "started": time.time()}, f)

    def on_multirun_end(self, config, **kwargs) -> None:
        # pandas, scipy and matplotlib only now: a run's start-up does not wait for them
        from harness.report.tables import build, frame_for_programs, load_records, write_outputs

        sweep_dir = config.hydra.sweep.dir
        df = load_records([sweep_dir])
        if df.empty:
            print(f"no records under {sweep_dir}", file=sys.stderr)
            return
        table, written, broken = write_outputs([sweep_dir], sweep_dir, machine=True)
        for line in broken:
            print(f"not drawn: {line}", file=sys.stderr)
        figures = [p for p in written if os.sep + "figures" + os.sep in p]
        logger = config.get("logger", {})
        outputs = [
            os.path.join(sweep_dir, name)
            for name in ("results.md", "results.csv", "results.tex", "machine.json", "figures")
        ]
        log_comparison(
            frame_for_programs(build(df, "all")),
            sweep_dir,
            [p for p in outputs if os.path.exists(p)],
            logger.get("mode"),
            logger.get("project"),
            logger.get("entity"),
            logger.get("group") or sweep_group(sweep_dir),
        )
        failed = int((df["status"] != "ok").sum())
        SWEEP_FAILURES.append(failed)
        print(f"\nResults of {len(df)} run(s) in {sweep_dir}:\n")
        print(table)
        print(f"\ntables: {sweep_dir}/results.{{md,csv,tex}}; {len(figures)} figure file(s) in {sweep_dir}/figures")
        if failed:
            print(
                f"\n{failed} run(s) failed; see the notes under the table and each run's metrics.json", file=sys.stderr
            )
