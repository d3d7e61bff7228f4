"""The GPU check (``pipebench gpucheck``): every path one GPU can run, each a check that returns
what it measured or raises what it found wrong.

The checks (:data:`CHECKS`, in the order they run): the device and its peak, CUDA-event timing
against the profiler's kernel times, layers measured on the GPU leaving no copy there, real runs
through the harness (DDP in fp32 and bf16, our executor, torchgpipe), and CUDA profiles with
AshPipe's planner on one. :func:`run` runs the chosen ones, one verdict per check, and writes
``gpucheck.json``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Callable

import torch
import yaml

from harness.config.registry import CONFIG_DIR
from harness.config.schema import ModelConfig
from harness.core.models import build_layers, visiting
from harness.core.timing import DeviceTimer
from harness.metrics.flops import device_peak
from harness.report.environment import environment
from harness.runtime.partition import measure_layer_costs

_TOLERANCE = 0.10  # CUDA events against the profiler's kernel time


@dataclass
class Context:
    out: str
    profiles: str
    steps: int
    device: str = "cuda"  # of the runs (cpu: to try the checks' logic on a machine without a GPU)
    results: dict = field(default_factory=dict)


def model_config(name: str, **overrides) -> ModelConfig:
    with open(os.path.join(CONFIG_DIR, "model", f"{name}.yaml")) as f:
        values = {k: v for k, v in yaml.safe_load(f).items() if k != "defaults"}
    return ModelConfig(**{**values, **overrides})


# -- checks on this process's GPU --------------------------------------------------------


def check_device(ctx: Context) -> str:
    device = torch.device("cuda", 0)
    peak, source = device_peak(device, "bf16", 0)
    nccl = environment()["nccl"]
    ctx.results["device"] = {
        "name": torch.cuda.get_device_name(device),
        "count": torch.cuda.device_count(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "nccl": nccl,
        "bf16_peak_flops": peak,
        "peak_source": source,
    }
    peak_text = f"{peak / 1e12:.0f} TFLOP/s" if peak else "unknown"
    return (
        f"{torch.cuda.get_device_name(device)} x{torch.cuda.device_count()}, torch {torch.__version__}, "
        f"CUDA {torch.version.cuda}, NCCL {nccl}; bf16 dense peak {peak_text} ({source})"
    )


def _kernel_seconds(prof) -> float:
    """Union of the device's activity (kernels, copies) in a profile, in seconds."""
    spans = sorted(
        (e.start_ns(), e.start_ns() + e.duration_ns())
        for e in prof.profiler.kineto_results.events()
        if e.device_type() == torch.autograd.DeviceType.CUDA
    )
    busy, covered = 0, None
    for start, end in spans:
        covered = start if covered is None else max(covered, start)
        busy += max(0, end - covered)
        covered = max(covered, end)
    return busy / 1e9


def check_event_timing(ctx: Context) -> str:
    """The device timer against the profiler: ten forward+backward passes of a ViT-H/14 block in bf16."""
    device = torch.device("cuda", 0)
    block = build_layers(model_config("vit_h14", depth=1), seed=0)[1].to(device)
    x = torch.randn(128, 257, 1280, device=device, requires_grad=True)
    timer = DeviceTimer(device)

    def passes(n: int) -> None:
        for _ in range(n):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                y = block(x)
            y.float().sum().backward()

    passes(3)
    torch.cuda.synchronize()
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as prof:
        start, host = timer.mark(), time.perf_counter()
        passes(10)
        end, host = timer.mark(), time.perf_counter() - host
        events_s = timer.elapsed(start, end)
    kernels_s = _kernel_seconds(prof)
    error = events_s / kernels_s - 1
    ctx.results["event_timing"] = {"events_s": events_s, "kernels_s": kernels_s, "host_clock_s": host, "error": error}
    line = (
        f"CUDA events {events_s * 1e3:.1f} ms, profiler's kernels {kernels_s * 1e3:.1f} ms ({error:+.1%}); "
        f"the host clock around the same launches read {host * 1e3:.1f} ms"
    )
    if abs(error) > _TOLERANCE:
        raise AssertionError(line + f": beyond {_TOLERANCE:.0%}")
    return line


def check_no_stray_copies(ctx: Context) -> str:
    """Measuring layers on the GPU (boundaries, the planner) leaves nothing of them there."""
    device = torch.device("cuda", 0)
    layers = build_layers(model_config("vit_base"), seed=0)
    sample = torch.randn(8, 3, 32, 32, device=device)
    before = torch.cuda.memory_allocated(device)
    with visiting(layers, device):
        measure_layer_costs(layers, sample)
        during = torch.cuda.memory_allocated(device)
    after = torch.cuda.memory_allocated(device)
    on_gpu = sum(p.is_cuda for layer in layers for p in layer.parameters())
    ctx.results["stray_copies"] = {"before": before, "during": during, "after": after, "parameters_on_gpu": on_gpu}
    line = (
        f"ViT-B measured on the GPU: {during / 2**20:.0f} MiB allocated during, {(after - before) / 2**20:+.1f} "
        f"MiB left after, {on_gpu} parameter tensors left on the GPU"
    )
    if on_gpu or after - before > 2**20:
        raise AssertionError(line)
    return line


# -- real runs through the harness ------------------------------------------------------------


def _harness(ctx: Context, name: str, verb: str, *overrides: str) -> subprocess.CompletedProcess:
    """``pipebench <verb> <overrides>`` as a user runs it, its output kept in ``<out>/<name>.log``."""
    cmd = [sys.executable, "-m", "harness", verb, *overrides]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    with open(os.path.join(ctx.out, f"{name}.log"), "w") as f:
        f.write(" ".join(cmd) + "\n" + proc.stdout + proc.stderr)
    if proc.returncode:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        raise AssertionError(f"exit {proc.returncode}: {tail[0]}")
    return proc


def _run(ctx: Context, name: str, *overrides: str) -> dict:
    folder = os.path.join(ctx.out, name)
    _harness(
        ctx,
        name,
        "run",
        *overrides,
        f"launch.device={ctx.device}",
        "logger.mode=disabled",
        f"train.steps={ctx.steps}",
        "train.warmup_steps=4",
        "train.eval_samples=1024",
        "data.train_size=4096",
        "data.test_size=1024",
        f"hydra.run.dir={folder}",
    )
    with open(os.path.join(folder, "metrics.json")) as f:
        record = json.load(f)
    if record["status"] != "ok":
        raise AssertionError(f"record marked {record['status']}: {record.get('error')}")
    ctx.results[name] = {
        k: record.get(k)
        for k in (
            "throughput",
            "step_time_s",
            "peak_memory_bytes",
            "memory_method",
            "mfu",
            "hfu",
            "tflops_per_device",
            "precision",
        )
    }
    problems = []
    if record["memory_method"] != f"{ctx.device}_max_allocated_step" and ctx.device == "cuda":
        problems.append(f"memory measured by {record['memory_method']}")
    breakdown = record["per_rank"][0]["memory_breakdown"]
    if record["peak_memory_bytes"] < breakdown["parameters"] + breakdown["optimizer_state"]:
        problems.append("peak below parameters + optimizer state")
    if not record.get("mfu"):
        problems.append("no MFU")
    if problems:
        raise AssertionError(f"{name}: " + "; ".join(problems))
    return record


def _summary(record: dict) -> str:
    return (
        f"{record['throughput']:.0f} samples/s, {record['tflops_per_device']:.1f} TFLOP/s per GPU, "
        f"MFU {record['mfu']:.1%}, HFU {record['hfu']:.1%}, peak {record['peak_memory_bytes'] / 2**30:.2f} GiB"
    )


_VIT_B = ("model=vit_base", "train.global_batch=256")


def check_ddp_fp32(ctx: Context) -> str:
    return "DDP w=1 ViT-B fp32: " + _summary(_run(ctx, "dp_fp32", "strategy=dp", "world_size=1", *_VIT_B))


def check_ddp_bf16(ctx: Context) -> str:
    record = _run(ctx, "dp_bf16", "strategy=dp", "world_size=1", "train.precision=bf16", *_VIT_B)
    fp32 = ctx.results.get("dp_fp32", {}).get("throughput")
    return "DDP w=1 ViT-B bf16: " + _summary(record) + (f" ({record['throughput'] / fp32:.2f}x fp32)" if fp32 else "")


def check_executor(ctx: Context) -> str:
    """Our runtime's executor on the GPU: its device-timed actions must cover the step, not
    the launches (host clocks would read a fraction of it)."""
    record = _run(
        ctx,
        "hippie_bf16",
        "strategy=hippie",
        "world_size=1",
        "strategy.stages=1",
        "strategy.recompute=all",
        "train.micro_batches=4",
        "train.precision=bf16",
        *_VIT_B,
    )
    split = record["per_rank"][0]["time_split"]
    covered = (split["compute_s"] + split["comm_s"] + split["idle_s"]) / record["step_time_s"]
    line = (
        "Hippie executor, 1 stage x 4 micro-batches, recompute all, bf16: "
        + _summary(record)
        + f"; device-timed actions cover {covered:.0%} of the step"
    )
    if not 0.9 <= covered <= 1.05:
        raise AssertionError(line)
    return line


def check_torchgpipe(ctx: Context) -> str:
    record = _run(
        ctx,
        "gpipe_bf16",
        "strategy=gpipe",
        "world_size=2",
        "strategy.devices=1",
        "train.micro_batches=4",
        "train.precision=bf16",
        *_VIT_B,
    )
    return "torchgpipe, 2 partitions on cuda:0, 4 micro-batches, bf16: " + _summary(record)


def check_profiles(ctx: Context) -> str:
    """CUDA profiles of ViT-H/14 and ViT-B in bf16 (the papers' regime settings), then AshPipe's
    planner on the ViT-H/14 one."""
    os.makedirs(ctx.profiles, exist_ok=True)
    lines = []
    for model in ("vit_h14", "vit_base"):
        path = os.path.join(ctx.profiles, f"{model}-cuda-bf16.json")
        started = time.perf_counter()
        _harness(
            ctx,
            f"profile_{model}",
            "profile",
            f"model={model}",
            "strategy=hippie",
            "world_size=16",
            "train.global_batch=256",
            "train.micro_batches=8",
            "launch.device=cuda",
            "train.precision=bf16",
            f"sim.out={path}",
        )
        with open(path) as f:
            profile = json.load(f)
        per_sample = sum(l["forward_s"] + l["backward_s"] for l in profile["layers"])
        lines.append(f"{model} {per_sample * 1e3:.2f} ms/sample fwd+bwd ({time.perf_counter() - started:.0f} s)")
    plan = _harness(
        ctx,
        "plan_vit_h14",
        "plan",
        "model=vit_h14",
        "world_size=8",
        "train.global_batch=256",
        "launch.device=cuda",
        "train.precision=bf16",
        "strategy.bandwidth_gbps=150",
        "strategy.memory_limit=80",
    )
    chosen = next(
        (l.split(": ", 1)[-1] for l in plan.stdout.splitlines() if l.startswith("AshPipe plan")), "no plan line"
    )
    return "profiles: " + "; ".join(lines) + f"; planner for 8 GPUs: {chosen}"


CHECKS = [
    ("device", check_device),
    ("event-timing", check_event_timing),
    ("no-stray-copies", check_no_stray_copies),
    ("ddp-fp32", check_ddp_fp32),
    ("ddp-bf16", check_ddp_bf16),
    ("executor", check_executor),
    ("torchgpipe", check_torchgpipe),
    ("profiles", check_profiles),
]


def run(ctx: Context, names: list[str] | None, report: Callable[[str, bool, str, float], None]) -> tuple[int, int]:
    """The checks ``names`` names (None: all), in :data:`CHECKS`' order, each PASS (the line it
    returned) or FAIL (what it raised, in one line); ``report(name, passed, line, seconds)`` after
    each. Writes ``gpucheck.json`` (every figure measured, every line) into ``ctx.out``; returns how
    many passed and how many ran."""
    chosen = [(n, f) for n, f in CHECKS if names is None or n in names]
    failed = 0
    for name, check in chosen:
        started = time.perf_counter()
        try:
            line, ok = check(ctx), True
        except Exception as e:  # one line per check, whatever went wrong
            line, ok = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}", False
        failed += not ok
        ctx.results.setdefault("lines", []).append(f"{'PASS' if ok else 'FAIL'} {name}: {line}")
        report(name, ok, line, time.perf_counter() - started)
    with open(os.path.join(ctx.out, "gpucheck.json"), "w") as f:
        json.dump(ctx.results, f, indent=1)
    return len(chosen) - failed, len(chosen)
