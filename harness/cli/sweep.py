"""The Hydra callback that ends every multirun of ``python -m harness`` with its comparison table."""

from __future__ import annotations

import sys

from hydra.experimental.callback import Callback

from harness.report.tables import load_records, log_wandb_table, write_outputs

# failed runs of the last sweep this process ran (read by harness/__main__ for the exit code)
SWEEP_FAILURES: list[int] = []


class SweepTableCallback(Callback):
    """After a multirun, print its comparison table and write tables and figures beside the runs."""

    def on_multirun_end(self, config, **kwargs) -> None:
        sweep_dir = config.hydra.sweep.dir
        df = load_records([sweep_dir])
        if df.empty:
            print(f"no records under {sweep_dir}", file=sys.stderr)
            return
        table, figures = write_outputs([sweep_dir], sweep_dir)
        logger = config.get("logger", {})
        log_wandb_table(df, sweep_dir, logger.get("mode", "disabled"), logger.get("project", "pipebench"),
                        logger.get("entity"))
        failed = int((df["status"] != "ok").sum())
        SWEEP_FAILURES.append(failed)
        print(f"\nResults of {len(df)} run(s) in {sweep_dir} (speedup and ME against DP with the same workers):\n")
        print(table)
        print(f"\ntables: {sweep_dir}/results.{{md,csv,tex}}; {len(figures)} figure file(s) in {sweep_dir}/figures")
        if failed:
            print(f"\n{failed} run(s) failed; see the note column and each run's metrics.json", file=sys.stderr)
