"""The plan command, and a later AshPipe job resuming from a switch checkpoint, as a user runs them."""

import json
import os

from tests.helpers.cli import TINY, pipebench


def test_plan_command_prints_a_plan_without_training(tmp_path, capfd, monkeypatch):
    monkeypatch.chdir(tmp_path)
    proc = pipebench(
        capfd, "plan", "model=vit_tiny", "world_size=4", "train.global_batch=32", "strategy.bandwidth_gbps=10"
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout
    assert "AshPipe plan for 4 workers" in out and "predicted time per minibatch" in out
    assert "bottleneck" in out and "versus data parallelism on all 4 workers" in out
    assert not (tmp_path / "outputs").exists()  # a plan is printed, not recorded


def test_a_later_job_resumes_in_hybrid_mode_from_the_switch_checkpoint(tmp_path, capfd):
    base = [
        "strategy=ashpipe",
        "world_size=2",
        "strategy.replicas=[1,1]",
        "strategy.boundaries=[3]",
        "train.micro_batches=1",
        *TINY,
        "train.steps=8",
        "train.warmup_steps=1",
    ]
    first, second = str(tmp_path / "first"), str(tmp_path / "second")
    run = pipebench(capfd, "run", *base, "strategy.switch_step=3", f"hydra.run.dir={first}")
    assert run.returncode == 0, run.stderr[-2000:]
    checkpoint = os.path.join(first, "switch_checkpoint")
    assert sorted(os.listdir(checkpoint)) == ["rank0.pt", "rank1.pt"]
    again = pipebench(capfd, "run", *base, f"strategy.resume_from={checkpoint}", f"hydra.run.dir={second}")
    assert again.returncode == 0, again.stderr[-2000:]
    a = json.load(open(os.path.join(first, "metrics.json")))["loss_curve"]
    b = json.load(open(os.path.join(second, "metrics.json")))["loss_curve"]
    assert [s for s, _ in b] == list(range(3, 8))  # the resumed job starts at the switch
    for (sa, la), (sb, lb) in zip(a[3:], b):
        assert sa == sb and abs(la - lb) < 1e-5  # and continues exactly where the first one was


def test_the_preview_lists_every_job_of_a_sweep_without_starting_one(tmp_path, capfd, monkeypatch):
    six = "strategy=dp,hippie,ashpipe,pipelining,deepspeed,gpipe"
    monkeypatch.chdir(tmp_path)
    proc = pipebench(capfd, "preview", "-m", six, "world_size=2,3", "train.micro_batches=4")
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [line for line in proc.stdout.splitlines() if line.startswith("| strategy=")]
    assert len(rows) == 12  # six strategies at two world sizes, in launch order
    assert [r.split("|")[1].split()[0] for r in rows[:2]] == ["strategy=dp", "strategy=dp"]
    by_job = {r.split("|")[1].replace(" train.micro_batches=4", "").strip(): r for r in rows}
    assert "refused: world_size=3 is not divisible by strategy.stages=2" in by_job["strategy=hippie world_size=3"]
    assert "ok (predicted on local_cpu" in by_job["strategy=hippie world_size=2"]
    assert "ashpipe (planned)" in by_job["strategy=ashpipe world_size=3"]
    assert "replicas [1, 1, 1], boundaries [2, 4]" in by_job["strategy=gpipe world_size=3"]
    assert "12 job(s)" in proc.stderr and "nothing was started" in proc.stderr
    assert os.listdir(tmp_path) == []  # no run or sweep directory, no record


def test_the_plan_command_refuses_a_strategy_without_a_planner_in_one_line(tmp_path, capfd):
    proc = pipebench(capfd, "plan", "strategy=hippie", "world_size=2")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: pipebench plan plans AshPipe"), lines


def test_gpucheck_without_a_gpu_says_so_in_one_line_and_exits_0(tmp_path, capfd):
    proc = pipebench(capfd, "gpucheck", "--out", str(tmp_path / "out"))  # this machine has no GPU
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.splitlines() == ["gpucheck: no CUDA device visible, nothing to check (run it on a GPU node)"]
    assert not (tmp_path / "out").exists()


def test_the_benchmark_refuses_an_unknown_model_in_one_line(tmp_path, capfd):
    proc = pipebench(capfd, "bench", "--models", "vit_nope")
    assert proc.returncode == 2 and proc.stderr.startswith("error: --models from vit_micro, vit_tiny")
    assert len(proc.stderr.splitlines()) == 1


def test_the_preview_is_the_slurm_preflight_on_a_node_without_a_gpu(tmp_path, capfd, monkeypatch):
    """The headline GPU experiment, previewed where users queue it: a login node (this machine has no
    GPU). Each job gets the nodes its world size needs, a predicted step, run time and memory per
    GPU; a world size that does not fill whole nodes, and torchgpipe's one process for all GPUs,
    are refused in one line each."""
    monkeypatch.chdir(tmp_path)
    proc = pipebench(
        capfd,
        "preview",
        "experiment=speedup",
        "hydra/launcher=slurm",
        "model=vit_base",
        "strategy=dp,hippie,gpipe",
        "world_size=4,16,12",
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = {
        r.split("|")[1].replace(" experiment=speedup hydra/launcher=slurm", "").strip(): [
            c.strip() for c in r.split("|")
        ]
        for r in proc.stdout.splitlines()
        if r.startswith("| model=")
    }
    assert len(rows) == 9
    header = [c.strip() for c in proc.stdout.splitlines()[0].split("|")]
    at = {
        name: header.index(name)
        for name in (
            "nodes",
            "tasks/node",
            "predicted step ms",
            "predicted run min",
            "peak GiB/device (of 80)",
            "status",
        )
    }
    dp16 = rows["model=vit_base world_size=16 strategy=dp"]
    assert (dp16[at["nodes"]], dp16[at["tasks/node"]]) == ("2", "8") and float(dp16[at["predicted step ms"]]) > 0
    assert float(dp16[at["predicted run min"]]) > 0 and float(dp16[at["peak GiB/device (of 80)"]]) > 0
    hippie4 = rows["model=vit_base world_size=4 strategy=hippie"]
    assert (hippie4[at["nodes"]], hippie4[at["tasks/node"]]) == ("1", "4") and hippie4[at["status"]].startswith("ok")
    assert rows["model=vit_base world_size=12 strategy=dp"][at["status"]].startswith(
        "refused: world_size=12 does not fill whole nodes of 8 tasks"
    )
    assert rows["model=vit_base world_size=4 strategy=gpipe"][at["status"]].startswith("refused: strategy=gpipe runs 1")
    assert "9 job(s), 5 refused; nothing was started" in proc.stderr  # w=12 twice, gpipe three times


def test_adding_a_runtime_to_a_profile_of_another_model_or_to_none_is_refused_in_one_line(tmp_path, capfd):
    """``pipebench profile sim.profile=FILE`` adds a strategy's runtime overhead to that profile:
    refused, before anything is measured, where the file is missing or profiled another model."""
    from harness.planning.planner import LayerProfile, Network, Profile

    path = tmp_path / "tiny.json"
    path.write_text(
        Profile(
            [LayerProfile("L", 1e-3, 2e-3, 1, 1, 1, 1)], Network(1e9, 1e9), "cpu", 8, meta={"model": "vit_tiny"}
        ).to_json()
    )
    for profile, says in (
        (path, "profiled model vit_tiny, not vit_micro: give model=vit_tiny"),
        (tmp_path / "none.json", "does not exist"),
    ):
        proc = pipebench(
            capfd, "profile", "model=vit_micro", "strategy=deepspeed", "world_size=2", f"sim.profile={profile}"
        )
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1 and says in lines[0], proc.stderr
    assert json.loads(path.read_text())["runtime"] is None  # left as it was
