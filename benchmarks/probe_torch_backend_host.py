"""Probe: the eager host cost per call of aten operators through tritonad.torch_backend, next
to PyTorch alone, at MNIST sizes (issue 46's figure: plugin <= 1.5x PyTorch's own; FlagGems
pays ~12x). Each row is the best of several rounds of N back-to-back calls (host time per
call: the GPU work is a few microseconds and runs behind), then the same with a sync at the
end of each round (the larger of host and GPU time). Not part of `tritonad bench`.

    python benchmarks/probe_torch_backend_host.py [--calls N] [--rounds R] [--out DIR]
"""
from __future__ import annotations

import argparse
import json
import os
import time

import torch


def per_call_us(fn, calls, rounds, sync=False):
    """Best over rounds of the mean time per call (see the module docstring)."""
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(rounds):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        if sync:
            torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - start) / calls * 1e6)
    torch.cuda.synchronize()
    return best


def cases():
    """(name, fn) at MNIST sizes: a batch of 128, 784 inputs, a hidden layer of 256."""
    x = torch.randn(128, 256, device="cuda")
    y = torch.randn(128, 256, device="cuda")
    a = torch.randn(128, 784, device="cuda")
    w = torch.randn(256, 784, device="cuda")
    b = torch.randn(256, device="cuda")
    logits = torch.randn(128, 10, device="cuda")
    return [
        ("add", lambda: x + y),
        ("mul", lambda: x * y),
        ("relu", lambda: torch.relu(x)),
        ("sum", lambda: x.sum()),
        ("sum(dim)", lambda: x.sum(1)),
        ("mm", lambda: torch.mm(a, w.t())),
        ("addmm (linear)", lambda: torch.nn.functional.linear(a, w, b)),
        ("softmax", lambda: torch.softmax(logits, 1)),
        ("add_ (in place)", lambda: x.add_(y, alpha=0.0)),
    ]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", default=None, help="folder for a JSON of the rows")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("probe_torch_backend_host: needs a CUDA GPU")
    import tritonad.torch_backend as tb

    rows = []
    print(f"{'op':18s} {'torch us':>9s} {'plugin us':>10s} {'ratio':>6s}   "
          f"{'torch+sync':>10s} {'plugin+sync':>11s}")
    for name, fn in cases():
        theirs = per_call_us(fn, args.calls, args.rounds)
        theirs_sync = per_call_us(fn, args.calls, args.rounds, sync=True)
        tb.reset_coverage()
        with tb.use(note=False):
            ours = per_call_us(fn, args.calls, args.rounds)
            ours_sync = per_call_us(fn, args.calls, args.rounds, sync=True)
        fell_back = {k: v["pytorch"] for k, v in tb.coverage().items() if v["pytorch"]}
        rows.append(dict(op=name, torch_us=theirs, plugin_us=ours, ratio=ours / theirs,
                         torch_sync_us=theirs_sync, plugin_sync_us=ours_sync,
                         fell_back=fell_back))
        print(f"{name:18s} {theirs:9.1f} {ours:10.1f} {ours / theirs:5.2f}x   "
              f"{theirs_sync:10.1f} {ours_sync:11.1f}" + (f"  fell back: {fell_back}"
                                                          if fell_back else ""))
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "probe_torch_backend_host.json"), "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                       "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
