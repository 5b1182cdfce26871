"""Probe: where the host microseconds of one eager op go, layer by layer, next to PyTorch's
whole op and its parts (allocation, a launch). Each row is the best of several rounds of N
back-to-back calls (host time per call; the GPU work is ~1 us and runs behind). Not part of
`tritonad bench`; `bench host` gives the user-facing ratios.

    python benchmarks/probe_host.py [--calls N] [--rounds R]
"""
from __future__ import annotations

import argparse
import time

import torch
import triton
import triton.language as tl


@triton.jit
def _args_kernel(out_ptr, x_ptr, a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13,
                 a14, a15, a16, a17, a18, a19, a20, a21, a22, a23, N_ARGS: tl.constexpr,
                 GDC: tl.constexpr):
    if GDC:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    total = a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7 + a8 + a9 + a10 + a11 + a12 + a13 + a14 + \
        a15 + a16 + a17 + a18 + a19 + a20 + a21 + a22 + a23
    tl.store(out_ptr, tl.load(x_ptr) + total)


@triton.jit
def _few_args_kernel(out_ptr, x_ptr, n, GDC: tl.constexpr):
    if GDC:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    tl.store(out_ptr, tl.load(x_ptr) + n)


def per_call_us(fn, calls, rounds, sync=False):
    """Best over rounds of the mean host time per call (synchronised between rounds); sync: a
    round ends when the GPU is done (the larger of host and GPU time)."""
    for _ in range(50):
        fn()
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


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    import tritonad as td
    from tritonad.autodiff import ops
    from tritonad.kernels import elementwise, launch, plans

    td.set_backend("triton")
    be = td.get_backend()
    a, b = torch.randn(128, 256, device="cuda"), torch.randn(256, device="cuda")
    ta, tb = td.from_torch(a), td.from_torch(b)
    ta + tb  # makes the plan
    add_form = elementwise.form(td.elementwise.OPS["add"])
    plan = next(p for k, p in elementwise._PLANS.items() if k[0] is add_form)
    kl = plan.single
    out = torch.empty_like(a)
    po, pa, pb = out.data_ptr(), a.data_ptr(), b.data_ptr()
    stream = torch.cuda.current_stream()

    def nothing():
        pass

    rows = [
        ("python: an empty function call", nothing),
        ("torch: a + b (the whole op)", lambda: a + b),
        ("torch: a.relu()", lambda: a.relu()),
        ("torch: a.sum()", lambda: a.sum()),
        ("torch: torch.add(a, b, out=out)", lambda: torch.add(a, b, out=out)),
        ("torch: torch.empty_like(a)", lambda: torch.empty_like(a)),
        ("torch: torch.empty((128, 256), device=cuda)",
         lambda: torch.empty((128, 256), device="cuda")),
        ("torch: a.data_ptr()", lambda: a.data_ptr()),
        ("torch: a.shape, a.stride(), a.dtype, a.device",
         lambda: (a.shape, a.stride(), a.dtype, a.device)),
        ("torch: current raw stream", lambda: torch._C._cuda_getCurrentRawStream(0)),
        ("torch: stream.cuda_stream", lambda: stream.cuda_stream),
        ("tritonad: elementwise plan key (2 operands)",
         lambda: (add_form, elementwise._key(a), elementwise._key(b), None)),
        ("tritonad: KernelLaunch alone (add, ints)", lambda: kl(po, pa, pb, po, po, 0, 0, 0, 0)),
        ("tritonad: plan(out=None) (alloc + launch)",
         lambda: plan(None, a, b, None, 0, 0, 0)),
        ("tritonad: kernels.elementwise.add(a, b)", lambda: elementwise.add(a, b)),
        ("tritonad: backend.add(a, b)", lambda: be.add(a, b)),
        ("tritonad: Add.apply(ta, tb)", lambda: td.elementwise.OPS["add"].function.apply(ta, tb)),
        ("tritonad: ta + tb (the whole op)", lambda: ta + tb),
        ("tritonad: Tensor._wrap(a)", lambda: td.Tensor._wrap(a)),
        ("tritonad: backend.relu(a)", lambda: be.relu(a)),
        ("tritonad: ta.relu()", lambda: ta.relu()),
        ("tritonad: backend.sum(a, None, False, None)", lambda: be.sum(a, None, False, None)),
        ("tritonad: ta.sum()", lambda: ta.sum()),
    ]
    # the pieces of a @planned primitive's replay (reduce.sum)
    from tritonad.kernels import reduce

    be.sum(a, None, False, None)
    sum_plan = next(v for v in reduce.sum.plans.values() if v is not plans._UNPLANNABLE)
    sum_args = (a, None, False, None)
    rows += [
        ("planned: _signature(sum's 4 arguments)", lambda: plans._signature(sum_args, [])),
        ("planned: the sum plan's replay (alloc + launch + result)",
         lambda: sum_plan([a], sum_args)),
        ("torch: torch.empty((), dtype=float32, device=dev)",
         lambda: torch.empty((), dtype=torch.float32, device=a.device)),
        ("torch: torch.empty_strided((), (), dtype=float32, device=dev)",
         lambda: torch.empty_strided((), (), dtype=torch.float32, device=a.device)),
        ("autodiff: normalize_dims('sum', None, 2)", lambda: ops.normalize_dims("sum", None, 2)),
    ]
    # the launcher's cost by argument count and launch attribute (PDL or not)
    y = torch.zeros(4, device="cuda")
    py = y.data_ptr()
    ints = [1000 + i for i in range(24)]
    for gdc in (False, True):
        few = launch.KernelLaunch(_few_args_kernel, (1,), [y, y, 1000],
                                  dict(GDC=gdc, launch_pdl=gdc), dynamic=(0, 1))
        many = launch.KernelLaunch(_args_kernel, (1,), [y, y] + ints,
                                   dict(N_ARGS=24, GDC=gdc, launch_pdl=gdc), dynamic=(0, 1))
        for bound, count in ((few, 3), (many, 26)):
            triton_only = bound.rebind(bound.dynamic)
            triton_only._fast = None
            rows.append((f"launch: {count} runtime args, pdl={gdc}, lean launcher "
                         f"({'on' if bound._fast is not None else 'unavailable'})",
                         lambda f=bound: f(py, py)))
            rows.append((f"launch: {count} runtime args, pdl={gdc}, Triton's launcher",
                         lambda f=triton_only: f(py, py)))
    dev = a.device
    rows += [
        ("torch: torch.empty(shape, dtype=, device=torch.device)",
         lambda: torch.empty((128, 256), dtype=torch.float32, device=dev)),
        ("torch: a.new_empty(shape)", lambda: a.new_empty((128, 256))),
        ("torch: a.new_empty((), dtype=int64)", lambda: a.new_empty((), dtype=torch.int64)),
        ("tritonad: ops.sum(ta) (autodiff layer)", lambda: ops.sum(ta)),
        ("tritonad: Sum.apply(ta, None, False, None)",
         lambda: ops.Sum.apply(ta, None, False, None)),
    ]
    print(f"host us per call, best of {args.rounds} rounds of {args.calls} "
          f"({torch.cuda.get_device_name()}, torch {torch.__version__}, "
          f"Triton {launch.triton.__version__}, style {kl._style})")
    for name, fn in rows:
        print(f"{per_call_us(fn, args.calls, args.rounds):8.2f}  {name}", flush=True)
    print("kernels left on Triton's launcher:", launch.FAST_SKIPPED or "none")

    # the lean launcher on and off in one process: each op's plans remade under each setting
    import tritonad.nn.functional as F

    logits = td.from_torch(torch.randn(128, 10, device="cuda"))
    target = td.from_torch(torch.randint(0, 10, (128,), device="cuda"))
    images = td.from_torch(torch.randn(100, 32, 28, 28, device="cuda"))
    ab = [("ta + tb", lambda: ta + tb), ("ta.relu()", lambda: ta.relu()),
          ("ta.sum()", lambda: ta.sum()), ("logits.softmax(1)", lambda: logits.softmax(1)),
          ("F.cross_entropy", lambda: F.cross_entropy(logits, target)),
          ("F.max_pool2d(images, 2)", lambda: F.max_pool2d(images, 2))]
    print("lean launcher on / off (plans remade for each), best of rounds:")
    for name, fn in ab:
        times = {}
        for _ in range(2):
            for on in (True, False):
                launch.FAST_LAUNCH = on
                plans.clear_plans()
                fn()
                t = per_call_us(fn, args.calls // 2, args.rounds)
                times[on] = min(times.get(on, t), t)
        print(f"{times[True]:8.2f} {times[False]:8.2f}  {name}", flush=True)
    launch.FAST_LAUNCH = True

    # the backward line of bench host, piece by piece, then where its host time goes
    x, w = torch.randn(128, 256, device="cuda"), torch.randn(100, 256, device="cuda")
    xg, wg = x.clone().requires_grad_(), w.clone().requires_grad_()
    txg, twg = td.from_torch(x).requires_grad_(), td.from_torch(w).requires_grad_()
    ty = (txg @ twg.T).relu().sum()
    pieces = [
        ("line: (x @ w.T).relu().sum().backward()",
         lambda: (txg @ twg.T).relu().sum().backward(),
         lambda: (xg @ wg.T).relu().sum().backward()),
        ("line: forward (x @ w.T).relu().sum()", lambda: (txg @ twg.T).relu().sum(),
         lambda: (xg @ wg.T).relu().sum()),
        ("line: w.T (recorded)", lambda: twg.T, lambda: wg.T),
        ("line: x @ w.T (recorded)", lambda: txg @ twg.T, lambda: xg @ wg.T),
        ("line: backward seed (ones of a 0-d)", lambda: td.ones((), device="cuda"),
         lambda: torch.ones((), device="cuda")),
    ]
    print("tritonad / torch host us per call:")
    for name, ours, theirs in pieces:
        print(f"{per_call_us(ours, args.calls // 2, args.rounds):8.2f} "
              f"{per_call_us(theirs, args.calls // 2, args.rounds):8.2f}  {name}", flush=True)
    del ty
    import cProfile
    import pstats

    profile = cProfile.Profile()
    profile.enable()
    for _ in range(500):
        (txg @ twg.T).relu().sum().backward()
    profile.disable()
    torch.cuda.synchronize()
    print("cProfile of 500 backward lines, by own time:")
    pstats.Stats(profile).sort_stats("tottime").print_stats(30)


if __name__ == "__main__":
    main()
