"""Sustained matmul under the GPU's power cap: tritonad against torch.matmul, each run back to
back for a few seconds while nvidia-smi samples the SM clock and the board power.

    python benchmarks/probe_power.py [--size 4096] [--precision tf32] [--seconds 3] [--rounds 2]

A large TF32 product draws the board to its cap (H200: ~690 of 700 W) within tens of
milliseconds; from then on the clock, not the kernel's cycle count alone, sets its speed, and
a kernel that moves more bytes through L2 runs at a lower clock. Per contender and round:
microseconds per call in the last third of the window (steady state) and the mean clock and
power over the last two thirds. notes/PERF.md (Matmul, 2026-11-25: H200, torch 2.11.0+cu130,
Triton 3.6.0) has the numbers and their reading.
"""
from __future__ import annotations

import argparse
import subprocess
import threading
import time

import torch

import tritonad as td
from tritonad.kernels import matmul as mm

PRECISIONS = {"tf32": (torch.float32, "high"), "bf16": (torch.bfloat16, "highest"),
              "fp16": (torch.float16, "highest")}


def sample(samples, stop):
    """Append (clock MHz, power W) from nvidia-smi about every 50 ms until `stop` is set."""
    query = ["nvidia-smi", "--query-gpu=clocks.sm,power.draw", "--format=csv,noheader,nounits"]
    while not stop.is_set():
        out = subprocess.run(query, capture_output=True, text=True).stdout.split("\n")[0]
        try:
            samples.append(tuple(float(v) for v in out.split(",")))
        except ValueError:  # a malformed or empty line: skip it
            pass
        time.sleep(0.05)


def sustain(fn, seconds):
    """Run fn in batches of 10 for `seconds`; returns (us per call at the start, in the last
    third, clock MHz, power W over the last two thirds)."""
    samples, stop = [], threading.Event()
    thread = threading.Thread(target=sample, args=(samples, stop))
    thread.start()
    per_call, start = [], time.perf_counter()
    while time.perf_counter() - start < seconds:
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        for _ in range(10):
            fn()
        end.record()
        end.synchronize()
        per_call.append(begin.elapsed_time(end) * 100.0)
    stop.set()
    thread.join()
    late = sorted(per_call[2 * len(per_call) // 3:])
    steady = samples[len(samples) // 3:] or [(float("nan"), float("nan"))]
    return (per_call[0], late[len(late) // 2], sum(s[0] for s in steady) / len(steady),
            sum(s[1] for s in steady) / len(steady))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=4096)
    parser.add_argument("--precision", choices=sorted(PRECISIONS), default="tf32")
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("probe_power: needs a CUDA GPU")
    dtype, precision = PRECISIONS[args.precision]
    td.set_matmul_precision(precision)
    torch.backends.cuda.matmul.allow_tf32 = precision == "high"
    n = args.size
    a = torch.randn(n, n, device="cuda", dtype=dtype)
    b = torch.randn(n, n, device="cuda", dtype=dtype)
    contenders = {"torch": lambda: torch.matmul(a, b), "tritonad": lambda: mm.matmul(a, b)}
    for fn in contenders.values():
        fn()
    torch.cuda.synchronize()
    plan = mm.describe(mm.tuner.last[1]) if mm.tuner.last else "?"  # the plan tritonad ran
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, {args.precision} "
          f"{n}^3, {args.seconds:g} s a contender; plan: {plan}")
    print(f"{'round':>5} {'who':>9} {'first us':>9} {'steady us':>10} {'clock MHz':>10} "
          f"{'power W':>8}")
    for i in range(args.rounds):
        for who in (contenders if i % 2 == 0 else reversed(list(contenders))):
            time.sleep(1.0)  # let the clock recover between contenders
            first, steady, clock, power = sustain(contenders[who], args.seconds)
            print(f"{i:>5} {who:>9} {first:9.1f} {steady:10.1f} {clock:10.0f} {power:8.0f}",
                  flush=True)


if __name__ == "__main__":
    main()
