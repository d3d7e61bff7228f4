"""Records researchers can reproduce and share, as a sweep leaves them: the environment in every
record, the schema, repeats interleaved in time with intervals, and wandb by its conventions
(read back from the offline runs' own files)."""

import glob
import json
import os
import subprocess

import torch

from harness.report.record import read
from tests.helpers.cli import ROOT, TINY, pipebench, run_cli
from tests.helpers.wandb_offline import offline_run


def test_a_repeated_sweep_records_its_environment_interleaves_repeats_and_logs_wandb_by_convention(workdir, capfd):
    sweep = os.path.join(workdir, "sweep")
    proc = run_cli(
        [
            "-m",
            "world_size=1,2",
            "repeat=0,1",
            *TINY,
            "logger.mode=offline",
            "logger.log_every=1",
            "tag=t1",
            f"hydra.sweep.dir={sweep}",
        ],
        cwd=workdir,
        timeout=400,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    jobs = sorted(glob.glob(os.path.join(sweep, "[0-9]*")), key=lambda d: int(os.path.basename(d).split("_")[0]))
    recs = [read(os.path.join(d, "metrics.json")) for d in jobs]  # read() validates against the schema
    # repeat is the outermost axis although it was given last: the repeats are interleaved in time
    assert [(r["repeat"], r["world_size"]) for r in recs] == [(0, 1), (0, 2), (1, 1), (1, 2)]

    env = recs[0]["environment"]
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    assert env["git_commit"] == head and isinstance(env["git_dirty"], bool)
    assert env["packages"]["torch"] == torch.__version__.split("+")[0] or env["packages"]["torch"] == torch.__version__
    assert all(env["packages"][p] for p in ("timm", "hydra-core", "wandb", "deepspeed", "torchgpipe"))
    assert env["cpu_cores"] == os.cpu_count() and env["host"] and env["gpu_count"] == 0

    # the sweep's table, printed and written by its end, with intervals over the two repeats of
    # each configuration; the results command rebuilds it from the records, in each format
    assert "2/2 ok" in proc.stdout and "±" in proc.stdout and "| dp " in proc.stdout and "speedup" in proc.stdout
    assert os.path.isfile(os.path.join(sweep, "results.md"))
    table = pipebench(capfd, "results", sweep)
    assert table.returncode == 0 and table.stdout.count("| dp ") == 2 and "2/2 ok" in table.stdout
    for fmt, marker in (("csv", "strategy,workers,layout"), ("latex", "\\begin{tabular}")):
        out = pipebench(capfd, "results", sweep, "--format", fmt)
        assert out.returncode == 0 and marker in out.stdout

    group = json.load(open(os.path.join(sweep, "sweep.json")))["group"]
    assert group.startswith("sweep-")
    for job, rec in zip(jobs, recs):
        (folder,) = glob.glob(os.path.join(job, "wandb", "offline-run-*"))
        run = offline_run(folder)
        assert run["state"] == "finished" and run["exit_code"] == 0
        assert run["job_type"] == "train" and run["group"] == group
        assert set(run["tags"]) == {"dp", "vit_micro", f"w{rec['world_size']}", "t1"}
        for key in ("world_size", "seed", "repeat", "tag", "variant"):
            assert run["config"][key] == rec[key], key
        assert run["config"]["strategy"]["name"] == "dp" and run["config"]["train"]["global_batch"] == 16
        assert run["config"]["environment"]["git_commit"] == head  # the machine, logged at the start
        # step metrics as training went, each at its step, and the evaluation
        steps = [row for row in run["history"] if "train/loss" in row]
        assert [row["_step"] for row in steps] == [1, 2, 3, 4, 5]
        assert all(
            k in steps[1] for k in ("train/lr", "train/samples_per_s", "train/step_time_s", "train/peak_rss_mib")
        )
        assert any("test/accuracy" in row for row in run["history"])
        # the summary holds what was measured, not what was run
        assert run["summary"]["throughput"] == rec["throughput"] and "model" not in run["summary"]
        assert "files/metrics.json" in run["files"]
    (folder,) = glob.glob(os.path.join(sweep, "wandb", "offline-run-*"))
    comparison = offline_run(folder)
    assert comparison["job_type"] == "comparison" and comparison["group"] == group
    (results,) = [a for a in comparison["artifacts"] if a["type"] == "results"]
    logged = {entry["path"] for entry in results["manifest"]["contents"]}
    assert {"results.md", "results.csv", "results.tex", "machine.json"} <= logged
    assert any(p.endswith(".png") for p in logged)  # the figures folder
    (table_file,) = glob.glob(os.path.join(folder, "files", "media", "table", "comparison_*.table.json"))
    table = json.load(open(table_file))
    speed = table["columns"].index("throughput_samples_per_s")
    assert all(isinstance(row[speed], float) for row in table["data"])  # a numeric column, not strings
