"""Every path a single GPU can run, one line per check, PASS or FAIL with what it measured.

In a few minutes on one GPU: the device and its peak; CUDA-event timing (the
device timer every measurement uses) against the profiler's kernel times, within
10%; measuring layers on the GPU leaves no copy of them there; real runs through
the harness (DDP at one worker in fp32 and bf16, our runtime's executor, torchgpipe
with two partitions on one device), each checked for a finished record with
CUDA memory figures, device-timed actions, FLOPs and MFU; and the profiler on
ViT-H/14 and ViT-B with AshPipe's planner on the ViT-H/14 profile. Each line
says PASS or FAIL and what was measured; the exit status is 1 if any check
failed. Without a GPU it says so in one line and exits 0.

``--out`` keeps the runs' records and the check summary (``gpucheck.json``);
``--profiles`` is where the CUDA profiles go (``profiles/`` to ship them).
"""

from __future__ import annotations

import argparse
import os

import torch

from harness.studies import gpucheck as study
from harness.studies.options import add_options, stamped


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_options(parser, out=(stamped("gpucheck"), "folder for the runs' records, logs and gpucheck.json"))
    parser.add_argument("--profiles", default=None, help="where the CUDA profiles go (default: OUT/profiles)")
    add_options(parser, steps=(20, "steps of each run (default 20)"))
    parser.add_argument(
        "--only", default=None, help=f"comma-separated check names to run, of {', '.join(n for n, _ in study.CHECKS)}"
    )


def main(args: argparse.Namespace) -> int:
    if not torch.cuda.is_available():
        print("gpucheck: no CUDA device visible, nothing to check (run it on a GPU node)")
        return 0
    os.makedirs(args.out, exist_ok=True)
    ctx = study.Context(args.out, args.profiles or os.path.join(args.out, "profiles"), args.steps)

    def report(name: str, ok: bool, line: str, seconds: float) -> None:
        print(f"{'PASS' if ok else 'FAIL'} {name:<16} {line} [{seconds:.0f} s]", flush=True)

    passed, ran = study.run(ctx, None if args.only is None else args.only.split(","), report)
    print(f"gpucheck: {passed} of {ran} checks passed ({args.out})")
    return 1 if passed < ran else 0
