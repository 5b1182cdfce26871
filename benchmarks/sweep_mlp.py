"""Sweep the tile settings of the fused MLP kernels (tritonad/kernels/mlp.py) on the MNIST MLP
(batch 128, 784-256-100-10), timed as a captured step runs them: a CUDA graph of repeated calls,
each gathering its batch at the device cursor. One kernel's settings vary at a time, the others
held at the best found so far. Checks the result against the numpy reference first. Not part of
`tritonad bench`.

    python benchmarks/sweep_mlp.py
"""
from __future__ import annotations

import sys

import torch

import tritonad as td
from profile_step import graph_us  # benchmarks/ is on the path when run as a script
from tritonad.kernels import mlp

# one group per kernel: (name, keys, candidate values), the first candidate the current default
GROUPS = [
    ("first layer", ("M1", "N1", "K1", "SPLIT_K", "warps1", "xt"),
     [(16, 32, 128, 128, 4, True), (16, 32, 128, 128, 4, False), (16, 32, 32, 1024, 4, False),
      (32, 32, 32, 1024, 4, False), (16, 32, 64, 1024, 4, False), (16, 64, 32, 1024, 4, False),
      (16, 32, 256, 256, 4, False), (32, 64, 32, 1024, 4, False), (16, 32, 32, 256, 4, False),
      (16, 32, 64, 256, 4, False), (16, 32, 64, 128, 4, False), (16, 16, 32, 1024, 2, False)]),
    ("tail", ("M2", "H2", "warps2"),
     [(16, 64, 8), (16, 32, 8), (16, 64, 4), (16, 128, 8), (16, 32, 4)]),
    ("weight grads", ("O3", "I3", "B3", "warps3"),
     [(64, 32, 32, 4), (32, 32, 32, 4), (64, 64, 32, 4), (64, 32, 64, 4), (32, 64, 32, 4),
      (64, 32, 32, 8), (128, 32, 32, 8), (32, 32, 64, 4)]),
]


def operands(n=60000, batch=128, dims=(784, 256, 100, 10), device="cuda"):
    g = torch.Generator(device="cpu").manual_seed(0)
    x = torch.randn(n, dims[0], generator=g).to(device)
    t = torch.randint(0, dims[-1], (n,), generator=g).to(device)
    ws = [(torch.randn(o, i, generator=g) / i ** 0.5).to(device)
          for i, o in zip(dims[:-1], dims[1:])]
    bs = [(0.1 * torch.randn(o, generator=g)).to(device) for o in dims[1:]]
    table = torch.randperm(n, generator=g)[:n // batch * batch].view(-1, batch).to(device)
    return x, t, ws, bs, table


def kernel_times(fn, calls=20):
    """Each kernel's GPU time per call, from the profiler, over graph replays of fn."""
    from torch.profiler import ProfilerActivity, profile

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    graph.replay()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            graph.replay()
        torch.cuda.synchronize()
    events = sorted((ev for ev in prof.events()
                     if ev.device_type == torch.autograd.DeviceType.CUDA),
                    key=lambda ev: ev.time_range.start)
    per_call = len(events) // calls
    one = events[-per_call:]
    print(f"one call, {per_call} kernels (start offset, duration):")
    for ev in one:
        print(f"  +{ev.time_range.start - one[0].time_range.start:7.1f} us "
              f"{ev.device_time:6.1f} us  {ev.name[:60]}")
    graph.reset()


def resources():
    """Registers, spills and shared memory of every compiled variant of the three kernels."""
    for fn in (mlp._first_layer_kernel, mlp._tail_kernel, mlp._weight_grads_kernel):
        for cache in getattr(fn, "device_caches", {}).values():
            for kernel in cache[0].values():
                print(f"  {fn.fn.__name__:22s} regs {kernel.n_regs:4d} spills {kernel.n_spills:4d}"
                      f" shared {kernel.metadata.shared:7d} warps {kernel.metadata.num_warps}")


def main():
    x, t, ws, bs, table = operands()
    gw = [torch.empty_like(w) for w in ws]
    gb = [torch.empty_like(b) for b in bs]
    cursor = torch.zeros(1, dtype=torch.int64, device="cuda")
    metrics = (torch.zeros((), device="cuda"), torch.zeros((), dtype=torch.int64, device="cuda"))

    def run():
        mlp.mlp_cross_entropy_grads_(x, t, ws, bs, gw, gb, metrics, rows=table, cursor=cursor,
                                     advance=True)

    # correctness at cursor 0 against the numpy reference (float64-free, float32 both)
    loss = mlp.mlp_cross_entropy_grads_(x, t, ws, bs, gw, gb, metrics, rows=table,
                                        cursor=cursor)
    with td.use_backend("numpy") as numpy_backend:
        rgw = [torch.empty_like(w, device="cpu") for w in ws]
        rgb = [torch.empty_like(b, device="cpu") for b in bs]
        rm = (torch.zeros(()), torch.zeros((), dtype=torch.int64))
        ref = numpy_backend.mlp_cross_entropy_grads_(
            x.cpu(), t.cpu(), [w.cpu() for w in ws], [b.cpu() for b in bs], rgw, rgb, rm,
            rows=table.cpu(), cursor=cursor.cpu())
    errors = [float((a.cpu() - b).abs().max() / b.abs().max()) for a, b in
              zip(gw + gb, rgw + rgb)]
    print(f"loss {loss.item():.6f} (numpy {ref.item():.6f}); max relative gradient error "
          f"{max(errors):.2e}")

    kernel_times(run)
    resources()
    if "--profile-only" in sys.argv:
        return
    best = dict(mlp.CONFIG)
    print(f"{'kernel':14s} {'settings':34s} {'us/call':>8s}")
    for name, keys, values in GROUPS:
        timed = []
        for v in values:
            mlp.CONFIG.update(best)
            mlp.CONFIG.update(dict(zip(keys, v)))
            try:
                us = graph_us(run, launches=20, reps=7)
            except Exception as err:  # a setting Triton cannot compile: report and go on
                print(f"{name:14s} {str(v):34s} failed: {type(err).__name__}: {err}"[:200])
                continue
            timed.append((us, v))
            print(f"{name:14s} {str(v):34s} {us:8.2f}")
        us, v = min(timed)
        best.update(dict(zip(keys, v)))
        print(f"{name:14s} best {v} {us:.2f} us")
    mlp.CONFIG.update(best)
    print("best CONFIG:", best)
    kernel_times(run)
    print(f"cursor after the sweep: {cursor.item()} (advanced once per call)")


if __name__ == "__main__":
    main()
