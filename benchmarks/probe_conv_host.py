"""Probe: the eager cost of one convolution, by path (implicit GEMM, window GEMM through Triton's
launcher, window GEMM through the lean launcher), next to PyTorch: host microseconds per call
(calls back to back, the GPU behind), wall microseconds per call (the same loop, synchronised
at its end: the larger of host and GPU time), the plan's launches and which launcher each one
takes, and a cProfile of the slowest tritonad path. Not part of `tritonad bench`.

    python benchmarks/probe_conv_host.py [--calls N] [--rounds R]
"""
from __future__ import annotations

import argparse
import cProfile
import dataclasses
import io
import pstats

import torch

from probe_host import per_call_us


def gpu_us(fn, calls=20):
    """GPU microseconds per call of fn, kernel by kernel (torch.profiler's CUDA activity)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    kernels = {}
    for event in prof.key_averages():
        us = getattr(event, "device_time_total", 0) or getattr(event, "cuda_time_total", 0)
        if us:
            kernels[event.key[:40]] = us / calls
    return kernels


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    import tritonad as td
    import tritonad.nn.functional as F
    from tritonad.kernels import conv, launch, plans

    td.set_backend("triton")
    g = torch.Generator(device="cuda").manual_seed(0)
    layers = {  # name: (x shape, w shape, padding)
        "conv2 [100,32,14,14]*[64,32,5,5] p2": ((100, 32, 14, 14), (64, 32, 5, 5), 2),
        "3x3 [32,64,28,28]*[64,64,3,3] p1": ((32, 64, 28, 28), (64, 64, 3, 3), 1),
    }
    print(f"us per call, best of {args.rounds} rounds of {args.calls} "
          f"({torch.cuda.get_device_name()}, torch {torch.__version__}, "
          f"Triton {launch.triton.__version__})")
    paths = {"implicit GEMM": (False, True), "window, Triton's launcher": (True, False),
             "window, lean launcher": (True, True)}

    def use(path):
        window, launch.FAST_SCRATCH = paths[path]
        conv.set_settings(dataclasses.replace(conv.current_settings(), window_gemm=window))
        plans.clear_plans()

    def interleaved(fns, sync):
        """{path: best us per call}, the paths taking turns round by round (this host's speed
        drifts by tens of percent between minutes)."""
        best = {}
        for _ in range(args.rounds):
            for path, fn in fns.items():
                if path in paths:
                    use(path)
                t = per_call_us(fn, args.calls, 1, sync)
                best[path] = min(best.get(path, t), t)
        return best

    for name, (xs, ws, pad) in layers.items():
        x = torch.randn(*xs, device="cuda", generator=g)
        w = torch.randn(*ws, device="cuda", generator=g) * 0.1
        b = torch.randn(ws[0], device="cuda", generator=g)
        tx, tw, tb = td.from_torch(x), td.from_torch(w), td.from_torch(b)
        txg = td.from_torch(x.clone()).requires_grad_()
        twg, tbg = td.from_torch(w.clone()).requires_grad_(), td.from_torch(b.clone()).requires_grad_()
        xg, wg, bg = (t.clone().requires_grad_() for t in (x, w, b))
        gy = torch.randn_like(torch.nn.functional.conv2d(x, w, b, padding=pad))
        tgy = td.from_torch(gy)
        ops = {
            "forward": (lambda: F.conv2d(tx, tw, tb, padding=pad),
                        lambda: torch.nn.functional.conv2d(x, w, b, padding=pad)),
            "forward + backward": (  # (a random contiguous cotangent, as a loss gives)
                lambda: F.conv2d(txg, twg, tbg, padding=pad).backward(tgy),
                lambda: torch.nn.functional.conv2d(xg, wg, bg, padding=pad).backward(gy)),
        }
        print(f"\n{name}")
        print(f"  {'op':20s} {'path':28s} {'host':>8s} {'wall':>8s}  launches (lean/all)")
        for op, (ours, theirs) in ops.items():
            fns = {**{path: ours for path in paths}, "PyTorch": theirs}
            host, wall = interleaved(fns, False), interleaved(fns, True)
            for path in fns:
                line = f"  {op:20s} {path:28s} {host[path]:8.1f} {wall[path]:8.1f}"
                if path in paths:
                    use(path)
                    ours()
                    steps = [s for p in conv.conv2d.plans.values() if hasattr(p, "steps")
                             for s, _ in p.steps]
                    kernels = ",".join(s.kernel.fn.__name__.strip("_").replace("_kernel", "")
                                       for s in steps)
                    line += (f"  {sum(s._fast is not None for s in steps)}/{len(steps)} "
                             f"(forward: {kernels})")
                print(line, flush=True)
                print_gpu(gpu_us(fns[path]))
    print("kernels left on Triton's launcher:", launch.FAST_SKIPPED or "none")

    # what a user's own loop meets: eager cnn training steps (forward, loss, backward, SGD)
    from tritonad import models, optim, train

    batch = 100
    train_set, _ = train.datasets("mnist")
    loader = td.data.DataLoader(train_set, batch, shuffle=True, device="cuda", limit=60 * batch)
    td.manual_seed(0)
    model = models.build("cnn").to("cuda")
    trainer = train.Trainer(model, optim.SGD(model.parameters(), lr=0.01, momentum=0.9), loader)
    order = loader.permutation()

    batches = [order[i * batch:(i + 1) * batch] for i in range(60)]
    turn = iter(range(10 ** 9))

    def step():
        trainer.eager_step(batches[next(turn) % 60])

    args.calls = 60
    best = interleaved({path: step for path in paths}, True)
    print(f"\neager cnn training step, us (best of {args.rounds} rounds of 60 steps): " +
          ", ".join(f"{path} {us:.1f}" for path, us in best.items()))

    conv.set_settings(dataclasses.replace(conv.current_settings(), window_gemm=True))
    launch.FAST_SCRATCH = True
    plans.clear_plans()
    xs, ws, pad = layers["conv2 [100,32,14,14]*[64,32,5,5] p2"]
    tx = td.from_torch(torch.randn(*xs, device="cuda", generator=g)).requires_grad_()
    tw = td.from_torch(torch.randn(*ws, device="cuda", generator=g)).requires_grad_()
    tgy = td.from_torch(torch.randn(xs[0], ws[0], xs[2], xs[3], device="cuda", generator=g))
    for _ in range(20):
        F.conv2d(tx, tw, padding=pad).backward(tgy)
    torch.cuda.synchronize()
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(200):
        F.conv2d(tx, tw, padding=pad).backward(tgy)
    profile.disable()
    torch.cuda.synchronize()
    out = io.StringIO()
    pstats.Stats(profile, stream=out).sort_stats("tottime").print_stats(30)
    print("\ncProfile, 200 conv2 forward + backward on the window path, by own time:")
    print(out.getvalue())


def print_gpu(kernels):
    total = sum(kernels.values())
    parts = ", ".join(f"{k} {v:.1f}" for k, v in sorted(kernels.items(), key=lambda kv: -kv[1]))
    print(f"      GPU {total:.1f} us: {parts}", flush=True)


if __name__ == "__main__":
    main()
