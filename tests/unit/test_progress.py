"""How often progress is logged and printed."""

from harness.run.progress import intervals


def test_rows_are_rare_enough_and_lines_are_rows():
    assert intervals(0, 0, 100) == (10, 10)  # the main job: a row and a line every 10 steps
    assert intervals(0, 0, 12) == (10, 10)
    assert intervals(0, 0, 10000) == (100, 1000)
    assert intervals(1, 0, 5) == (1, 1)
    assert intervals(0, 27, 1000) == (10, 30)  # a line is a row's: the nearest multiple
    assert intervals(4, 6, 100) == (4, 8)


def test_a_line_comes_at_least_every_30_seconds_and_at_each_evaluation(monkeypatch, capsys, tmp_path):
    """Ten-step rows and a line every 500 steps, but a step takes 4 s on a clock the test holds: a
    line of rank 0's own progress comes once 30 s have passed, and at the evaluation."""
    from types import SimpleNamespace

    import torch

    from harness.run import progress

    clock = [0.0]
    monkeypatch.setattr(progress.time, "perf_counter", lambda: clock[0])
    spec = SimpleNamespace(
        steps=1000,
        world_size=1,
        output_dir=str(tmp_path),
        train=SimpleNamespace(global_batch=64),
        logger=SimpleNamespace(log_every=10, print_every=500),
        strategy=SimpleNamespace(name="dp"),
    )
    ctx = SimpleNamespace(world_size=1, rank=0, is_main=True, device=torch.device("cpu"), timeout=None)
    log = progress.StepLog(spec, ctx, 0, lambda k: 0.1, bar=False)
    for step in range(20):
        clock[0] += 4.0
        log.step(step, 1.0, 4.0)
    lines = capsys.readouterr().out.splitlines()
    # after steps 8 (32 s) and 16 (64 s): 16 samples/s, and the time left at that rate
    assert lines == [
        "dp w=1 step 8/1000 | 16 samples/s | 32 s in, about 3968 s left",
        "dp w=1 step 16/1000 | 16 samples/s | 64 s in, about 3936 s left",
    ]
    log.evaluated({"step": 20, "accuracy": 0.125, "loss": 2.5})
    assert capsys.readouterr().out.splitlines()[-1] == "dp w=1 step 20/1000 | test top-1 12.50% | test loss 2.5000"
    log.close()
