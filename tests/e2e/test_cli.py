"""The command line as a user runs it: single runs, multiruns, refusals, the results command."""

import glob
import json
import os

import pytest

from tests.helpers.cli import TINY, pipebench, run_cli


def _record(run_dir):
    with open(os.path.join(run_dir, "metrics.json")) as f:
        return json.load(f)


REQUIRED = [
    "status",
    "error",
    "strategy",
    "model",
    "data",
    "world_size",
    "global_batch",
    "micro_batches",
    "throughput",
    "step_time_s",
    "peak_memory_bytes",
    "peak_memory_per_rank",
    "accuracy",
    "final_loss",
    "device",
]


def test_two_worker_run_writes_a_complete_record_and_an_offline_wandb_run(workdir):
    run_dir = os.path.join(workdir, "run")
    proc = run_cli(
        ["world_size=2", *TINY, "logger.mode=offline", "logger.log_every=1", f"hydra.run.dir={run_dir}"], cwd=workdir
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rec = _record(run_dir)
    assert all(k in rec for k in REQUIRED)
    assert rec["status"] == "ok" and rec["error"] is None and rec["world_size"] == 2 and rec["device"] == "cpu"
    assert rec["throughput"] > 0 and rec["step_time_s"] > 0
    assert len(rec["peak_memory_per_rank"]) == 2 and all(m > 0 for m in rec["peak_memory_per_rank"])
    assert 0 <= rec["accuracy"] <= 1 and rec["final_loss"] > 0
    assert rec["timed_steps"] == 5 - 1 - 1  # warm-up and memory steps are not timed
    assert "ok dp w=2" in proc.stdout and "samples/s" in proc.stdout
    assert glob.glob(os.path.join(run_dir, "wandb", "offline-run-*", "run-*.wandb"))
    # progress as it goes: a row per step (5 steps: every step) and a plain line each, no bar off a terminal
    rows = [json.loads(line) for line in open(os.path.join(run_dir, "steps.jsonl"))]
    losses = [row["train/loss"] for row in rows if "train/loss" in row]
    assert losses == pytest.approx([loss for _, loss in rec["loss_curve"]])  # every rank's share, summed
    assert rows[-1]["step"] == 5 and rows[-1]["test/accuracy"] == rec["accuracy"]
    lines = [line for line in proc.stdout.splitlines() if line.startswith("dp w=2 step ")]
    assert len(lines) == 6 and all(" | loss " in line and " | lr " in line and " MiB" in line for line in lines[:5])
    assert lines[5].startswith("dp w=2 step 5/5 | test top-1 ")  # and one at the evaluation
    assert "\r" not in proc.stderr and "it/s" not in proc.stderr


def test_a_pipeline_run_writes_a_trace_and_breaks_its_idle_time_down(workdir, capfd):
    run_dir = os.path.join(workdir, "run")
    out = pipebench(
        capfd, "run", "strategy=hippie", "world_size=2", "train.micro_batches=4", *TINY, f"hydra.run.dir={run_dir}"
    )
    assert out.returncode == 0, out.stderr[-3000:]
    rec = _record(run_dir)
    parts = rec["idle_breakdown"]
    assert set(parts) == {"compute", "peer_wait", "collective", "exposed_comm", "host"}
    assert sum(parts.values()) == pytest.approx(1.0)
    assert parts["compute"] == pytest.approx(1 - rec["bubble_measured"], abs=1e-5)  # the same step, the same span
    assert parts["peer_wait"] > 0  # a 2-stage pipeline's fill and drain
    for device in rec["idle_per_device"]:  # each device's parts add up to the job's step
        assert sum(device[p] for p in parts) == pytest.approx(sum(rec["idle_per_device"][0][p] for p in parts))
    (path,) = glob.glob(os.path.join(run_dir, "trace_*.json"))
    trace = json.load(open(path))
    names = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "process_name"}
    assert names[0] == "rank 0 (stage 0)" and names[1] == "rank 1 (stage 1)"
    assert any(name.startswith("simulator replay") for name in names.values())
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert {e["pid"] for e in spans} >= {0, 1} and all(e["dur"] >= 0 for e in spans)
    assert any(e["name"] == "forward s1 mb3" for e in spans)  # the runtime's actions, as in the schedule
    assert any(e["cat"] == "idle" and e["name"] == "peer wait" for e in spans)


@pytest.mark.parametrize(
    "overrides,message",
    [
        (["strategy=hippie", "train.global_batch=2", "train.micro_batches=4"], "cannot be split"),
        (["train.steps=1"], "no timed step"),
        (["data=cifar100", "data.root=/nonexistent/cifar"], "/nonexistent/cifar"),
        (["launch.device=cuda"], "no GPU"),
    ],
)
def test_invalid_config_is_refused_in_one_line_before_any_worker(workdir, overrides, message, capfd):
    run_dir = os.path.join(workdir, "run")
    proc = pipebench(capfd, "run", *overrides, "logger.mode=disabled", f"hydra.run.dir={run_dir}")
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and message in errors[0], proc.stderr
    rec = _record(run_dir)
    assert rec["status"] == "failed" and message in rec["error"]
    assert "samples/s" not in proc.stdout + proc.stderr  # no training happened


def test_a_sweep_over_strategies_shares_pipeline_keys_and_records_what_was_ignored(workdir, capfd):
    sweep = os.path.join(workdir, "sweep")
    proc = pipebench(
        capfd,
        "run",
        "-m",
        "strategy=dp,hippie",
        "world_size=2",
        *TINY,
        "strategy.recompute=none",
        f"hydra.sweep.dir={sweep}",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    recs = {r["strategy"]: r for r in (_record(os.path.dirname(p)) for p in glob.glob(f"{sweep}/*/metrics.json"))}
    assert recs["dp"]["status"] == recs["hippie"]["status"] == "ok"
    assert recs["dp"]["ignored_strategy_keys"] == {"recompute": "none"}  # DP has no recomputation
    assert recs["hippie"]["ignored_strategy_keys"] == {} and recs["hippie"]["config"]["strategy"]["recompute"] == "none"
    # the sweep's partition: measured once by its first pipeline, recorded with the run; DP has no cut
    assert recs["hippie"]["partition_source"] == "measured" and len(recs["hippie"]["boundaries"]) == 1
    assert recs["dp"]["boundaries"] is None
    (shared,) = glob.glob(f"{sweep}/partitions/*.json")
    assert json.load(open(shared))["boundaries"] == recs["hippie"]["boundaries"]


def test_every_strategy_trains_in_bf16_on_cpu_with_flops_and_mfu_in_its_record(workdir, capfd):
    sweep = os.path.join(workdir, "sweep")
    strategies = ["dp", "hippie", "ashpipe", "pipelining", "deepspeed", "gpipe"]
    proc = pipebench(
        capfd,
        "run",
        "-m",
        f"strategy={','.join(strategies)}",
        "world_size=2",
        *TINY,
        "train.micro_batches=2",
        "train.precision=bf16",
        f"hydra.sweep.dir={sweep}",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    recs = {r["strategy"]: r for r in (_record(os.path.dirname(p)) for p in glob.glob(f"{sweep}/*/metrics.json"))}
    assert sorted(recs) == sorted(strategies)
    for name, rec in recs.items():
        assert rec["status"] == "ok" and rec["precision"] == "bf16", (name, rec.get("error"))
        assert rec["flops_per_step"] > 0 and 0 < rec["mfu"] <= rec["hfu"] < 1, name
        assert "measured bf16 matmul" in rec["peak_source"]
    # the same model and batch: the same model FLOPs whatever the strategy; recomputation adds to HFU only
    assert len({rec["flops_per_step"] for rec in recs.values()}) == 1
    assert recs["hippie"]["hardware_flops_per_step"] > recs["hippie"]["flops_per_step"]  # recompute=auto
    assert recs["dp"]["hardware_flops_per_step"] == recs["dp"]["flops_per_step"]
    assert "precision bf16" in proc.stdout  # every row's: in the caption line
    assert "MFU %" in pipebench(capfd, "results", sweep, "--columns", "speed").stdout


def test_results_command_without_records_says_so(workdir, capfd):
    proc = pipebench(capfd, "results", workdir)
    assert proc.returncode == 2 and "no readable metrics.json" in proc.stderr


@pytest.mark.parametrize(
    "overrides,message",
    [
        (["strategy=hippie", "strategy.stages=9", "world_size=9"], "exceeds the 6 layers"),
        (["strategy=ashpipe", "strategy.replicas=[2,2]", "world_size=3", "train.micro_batches=1"], "sums to 4"),
        (["strategy=hippie", "world_size=3"], "not divisible by strategy.stages=2"),
        (["strategy=pipelining", "world_size=2", "train.global_batch=10", "train.micro_batches=4"], "divisible"),
        (
            ["strategy=hippie", "world_size=4", "train.global_batch=6", "train.micro_batches=6"],
            "fewer than the 2 replicas",
        ),
        (["train.micro_batches=0"], "must be at least 1"),
        (["train.nesterov=true", "train.momentum=0"], "train.nesterov=true needs train.optimizer=sgd"),
        (["strategy=gpipe", "world_size=2", "strategy.stages=3"], "must equal world_size"),
        (["train.resume=/nonexistent/run"], "holds no checkpoint"),
        (["launch.fault=maybe"], "launch.fault"),
        (["train.precision=fp16"], "train.precision=fp16 is not one of fp32, bf16"),
        (["strategy=gpipe", "world_size=2", "strategy.devices=3"], "strategy.devices=3 must be between 1 and the 2"),
        (["strategy=hippie", "world_size=2", "strategy.switch_step=3"], "does not apply to strategy=hippie"),
        (["strategy=dp", "strategy.partition_method=uniform"], "does not apply to strategy=dp"),
    ],
)
def test_layouts_that_cannot_run_are_refused_before_any_worker(workdir, overrides, message, capfd):
    run_dir = os.path.join(workdir, "run")
    proc = pipebench(capfd, "run", *overrides, "logger.mode=disabled", f"hydra.run.dir={run_dir}")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and message in errors[0], proc.stderr


@pytest.mark.parametrize(
    "overrides,option",
    [
        (["model=vit_nope"], "vit_micro"),
        (["strategy=nope"], "hippie"),
        (["data=imagenet"], "cifar100"),
        (["-m", "strategy=dp,nope"], "hippie"),
    ],
)
def test_unknown_model_strategy_or_data_is_refused_in_one_line(workdir, overrides, option, capfd):
    proc = pipebench(capfd, "run", *overrides, f"hydra.run.dir={workdir}/run", f"hydra.sweep.dir={workdir}/sweep")
    unknown = overrides[-1].split("=")[1].split(",")[-1]
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert len(proc.stderr.splitlines()) == 1, proc.stderr
    assert proc.stderr.startswith("error: unknown ") and f"'{unknown}'" in proc.stderr and option in proc.stderr
    assert not os.path.exists(os.path.join(workdir, "run")) and not os.path.exists(os.path.join(workdir, "sweep"))


def test_a_memory_limit_no_plan_meets_is_refused_before_launch(workdir, capfd):
    run_dir = os.path.join(workdir, "run")
    proc = pipebench(
        capfd,
        "run",
        "strategy=ashpipe",
        "world_size=2",
        *TINY,
        "strategy.memory_limit=0.0001",
        f"hydra.run.dir={run_dir}",
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "no AshPipe plan fits strategy.memory_limit" in proc.stderr and "samples/s" not in proc.stderr


def test_a_memory_limit_only_the_planner_finds_unmeetable_fails_the_job_with_one_line(workdir, capfd):
    # above the parameter floor, but no split fits the activations: found by the planner in the job
    run_dir = os.path.join(workdir, "run")
    proc = pipebench(
        capfd,
        "run",
        "strategy=ashpipe",
        "world_size=2",
        *TINY,
        "strategy.memory_limit=0.0012",
        f"hydra.run.dir={run_dir}",
    )
    rec = _record(run_dir)
    assert proc.returncode == 1 and rec["status"] == "failed"
    assert "no AshPipe plan fits strategy.memory_limit" in rec["error"]


def test_a_typo_is_one_line_exit_2_and_nothing_started(workdir):
    """python -m harness with a misspelt key, as a user runs it: one line naming the nearest key,
    exit 2, no run directory (Hydra alone would have accepted `+trian.steps=10` and ignored it)."""
    proc = run_cli(["+trian.steps=10", f"hydra.run.dir={workdir}/r"], cwd=workdir, timeout=120)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        "error: unknown key trian.steps; did you mean train.steps? (docs/reference/configuration.md lists every key; "
        "'+' does not add one: nothing would read it)"
    ]
    assert not os.path.exists(os.path.join(workdir, "r"))


def test_resuming_from_a_corrupt_checkpoint_is_refused_in_one_line_before_any_worker(workdir, capfd):
    """A run that checkpoints, its latest checkpoint truncated, then resumed: one line naming the
    file and what to do, exit 2, nothing started (it used to end in a 20-line traceback)."""
    first = os.path.join(workdir, "first")
    assert (
        pipebench(capfd, "run", "world_size=2", *TINY, "train.checkpoint_every=3", f"hydra.run.dir={first}").returncode
        == 0
    )
    rank1 = os.path.join(first, "checkpoints", "step5", "rank1.pt")
    with open(rank1, "r+b") as f:
        f.truncate(1000)
    proc = pipebench(capfd, "run", "world_size=2", *TINY, f"train.resume={first}", f"hydra.run.dir={workdir}/again")
    errors = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(errors) == 1, errors
    assert errors[0].startswith(f"error: checkpoint {rank1} cannot be read") and "resume from an earlier" in errors[0]
    assert "samples/s" not in proc.stdout + proc.stderr
