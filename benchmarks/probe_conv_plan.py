"""Probe: where one eager conv2d's host time goes, for before/after comparisons of two checkouts
(runs against older tritonad trees too: PYTHONPATH=old). Prints us per call for forward and for
forward + backward next to PyTorch, the plan's launches and which launcher each takes, the
kernels left on Triton's launcher, and a cProfile of 300 forward calls by own time.

    python benchmarks/probe_conv_plan.py
"""
import cProfile
import io
import os
import pstats
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


def main():
    import tritonad as td
    import tritonad.nn.functional as F
    from tritonad.kernels import conv, launch

    td.set_backend("triton")
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(100, 32, 14, 14, device="cuda", generator=g)
    w = torch.randn(64, 32, 5, 5, device="cuda", generator=g) * 0.1
    tx, tw = td.from_torch(x), td.from_torch(w)
    txg, twg = tx.clone().requires_grad_(), tw.clone().requires_grad_()
    xg, wg = x.clone().requires_grad_(), w.clone().requires_grad_()
    gy = torch.randn(100, 64, 14, 14, device="cuda", generator=g)
    tgy = td.from_torch(gy)
    rows = {
        "forward": (lambda: F.conv2d(tx, tw, padding=2),
                    lambda: torch.nn.functional.conv2d(x, w, padding=2)),
        "forward+backward": (lambda: F.conv2d(txg, twg, padding=2).backward(tgy),
                             lambda: torch.nn.functional.conv2d(xg, wg, padding=2).backward(gy)),
    }
    for name, (ours, theirs) in rows.items():
        for _ in range(20):
            ours(), theirs()
        best = [min(common.per_call_us(f, 300) for _ in range(5)) for f in (ours, theirs)]
        print(f"{name:18s} tritonad {best[0]:7.1f} us  torch {best[1]:7.1f} us  "
              f"ratio {best[1] / best[0]:.2f}", flush=True)
    for fn in (conv.conv2d, conv.conv2d_backward):
        print(f"{fn.__name__}: {len(fn.plans)} plans")
        for key, plan in fn.plans.items():
            steps = getattr(plan, "steps", None) or []
            print(f"  {type(plan).__name__}: " + ", ".join(
                f"{s.kernel.fn.__name__}{'' if getattr(s, '_fast', None) is not None else '(TRITON)'}"
                for s, _ in steps))
    print("FAST_SKIPPED:", launch.FAST_SKIPPED or "none")
    for fn in (conv.conv2d,):
        for plan in fn.plans.values():
            for s, _ in getattr(plan, "steps", None) or []:
                print(f"  {s.kernel.fn.__name__} grid {s.grid} meta {s.meta}")
    print("tuner:", {k: v for k, v in conv.tuner.sources.items()})
    from torch.profiler import ProfilerActivity, profile
    for name, (ours, theirs) in rows.items():
        for who, fn in (("tritonad", ours), ("torch", theirs)):
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(20):
                    fn()
                torch.cuda.synchronize()
            parts = {}
            for event in prof.key_averages():
                us = getattr(event, "device_time_total", 0) or getattr(event, "cuda_time_total", 0)
                if us:
                    parts[event.key[:40]] = us / 20
            print(f"GPU {name} {who}: {sum(parts.values()):.1f} us: " + ", ".join(
                f"{k} {v:.1f}" for k, v in sorted(parts.items(), key=lambda kv: -kv[1])))
    t0 = time.perf_counter()
    for _ in range(300):
        F.conv2d(tx, tw, padding=2)
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    print(f"host-only forward: {(t1 - t0) / 300 * 1e6:.1f} us per call")
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(300):
        F.conv2d(tx, tw, padding=2)
    prof.disable()
    torch.cuda.synchronize()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(25)
    print(out.getvalue())


if __name__ == "__main__":
    main()
