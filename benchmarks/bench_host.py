"""Eager per-call cost, tritonad against PyTorch in one run on one GPU: what a user's own
training loop pays for each op when the GPU work is tiny (MNIST sizes, ~1 us of GPU per op).

    python -m tritonad bench host [--out DIR] [--quick] [--calls N]

Each row runs one call (an op, a backward, an optimizer step, a whole training step) N times
back to back and synchronises once at the end: wall time / N per call, which is host time
where the host is the bottleneck, as here. Each figure is the best of 5 such rounds, tritonad
and PyTorch taking turns (host timings drift by tens of percent within a run). Both frameworks allocate their outputs per call
(PyTorch's caching allocator serves both) and start from the same values. Ratio = PyTorch
time / tritonad time: above 1, tritonad is faster. The first calls (compilation, plans) are
warm-up and not timed; a second table gives the first call of a matmul and a convolution at a
new shape (first_calls). The steps are the MNIST recipes' (benchmarks/bench_mnist.py): cnn batch
100, mlp batch 128, SGD with momentum, per-op kernels (no fused MLP step, no CUDA graph).
Written to run against older tritonad checkouts too (PYTHONPATH=old), for before/after tables.
"""
from __future__ import annotations

import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


per_call_us = common.per_call_us


def paired_us(ours, theirs, calls, rounds):
    """(tritonad, torch) microseconds per call: the best of `rounds` rounds of `calls` calls,
    the two frameworks taking turns, so that a slow stretch of the host (another process, the
    clock) does not land on one of them only."""
    best = [float("inf"), float("inf")]
    for _ in range(rounds):
        for i, fn in enumerate((ours, theirs)):
            best[i] = min(best[i], per_call_us(fn, calls))
    return best


def _step_pair(name):
    """(tritonad step, torch step) of one recipe's eager training step on a fixed batch."""
    import tritonad as td
    import tritonad.nn.functional as F
    from tritonad import models, optim

    from bench_mnist import torch_model

    torch.manual_seed(0)
    theirs = torch_model(name).cuda()
    ours = models.build(name).to("cuda")
    ours.load_state_dict({k: td.from_torch(v.detach().clone())
                          for k, v in theirs.state_dict().items()})
    batch = 100 if name == "cnn" else 128
    x = torch.randn(batch, 1, 28, 28, device="cuda")
    y = torch.randint(0, 10, (batch,), device="cuda")
    tx, ty = td.from_torch(x), td.from_torch(y)
    opt = optim.SGD(ours.parameters(), lr=0.01, momentum=0.9)
    topt = torch.optim.SGD(theirs.parameters(), lr=0.01, momentum=0.9)

    def ours_step():
        loss = F.cross_entropy(ours(tx), ty)
        opt.zero_grad()
        loss.backward()
        opt.step()

    def theirs_step():
        loss = torch.nn.functional.cross_entropy(theirs(x), y)
        topt.zero_grad()
        loss.backward()
        topt.step()

    return ours_step, theirs_step


def _profile(name, fn, calls):
    import cProfile
    import io
    import pstats

    profile = cProfile.Profile()
    profile.enable()
    for _ in range(calls):
        fn()
    profile.disable()
    torch.cuda.synchronize()
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(12)
    print(f"---- cProfile of {calls} calls: {name}\n" + "\n".join(
        line for line in text.getvalue().splitlines()[4:] if line.strip()), flush=True)


def cases():
    """(name, tritonad call, torch call) at MNIST sizes."""
    import tritonad as td
    import tritonad.nn.functional as F
    from tritonad import models, optim

    from bench_mnist import torch_model

    g = torch.Generator(device="cuda").manual_seed(0)

    def rand(*shape):
        return torch.randn(*shape, device="cuda", generator=g)

    x, b, w = rand(128, 256), rand(256), rand(100, 256)
    tx, tb, tw = td.from_torch(x), td.from_torch(b), td.from_torch(w)
    logits, target = rand(128, 10), torch.randint(0, 10, (128,), device="cuda", generator=g)
    tlogits, ttarget = td.from_torch(logits), td.from_torch(target)
    img, cw = rand(100, 32, 14, 14), rand(64, 32, 5, 5)
    timg, tcw = td.from_torch(img), td.from_torch(cw)
    pool_in = rand(100, 32, 28, 28)
    tpool_in = td.from_torch(pool_in)
    xg, wg = x.clone().requires_grad_(), w.clone().requires_grad_()
    txg, twg = td.from_torch(x.clone()).requires_grad_(), td.from_torch(w.clone()).requires_grad_()

    # an optimizer step over the cnn's 1.66M parameters, gradients in place
    cnn_t = torch_model("cnn").cuda()
    cnn = models.build("cnn").to("cuda")
    for p, tp in zip(cnn.parameters(), cnn_t.parameters()):
        tp.grad = torch.randn_like(tp)
        p.grad = td.from_torch(tp.grad.clone())
    opt = optim.SGD(cnn.parameters(), lr=0.01, momentum=0.9)
    topt = torch.optim.SGD(cnn_t.parameters(), lr=0.01, momentum=0.9)

    rows = [
        ("x + b  [128, 256] + [256]", lambda: tx + tb, lambda: x + b),
        ("x.relu()  [128, 256]", lambda: tx.relu(), lambda: x.relu()),
        ("x.sum()  [128, 256]", lambda: tx.sum(), lambda: x.sum()),
        ("x @ w.T  [128, 256] x [256, 100]", lambda: tx @ tw.T, lambda: x @ w.T),
        ("softmax(dim=1)  [128, 10]", lambda: tlogits.softmax(1), lambda: logits.softmax(1)),
        ("cross_entropy  [128, 10]", lambda: F.cross_entropy(tlogits, ttarget),
         lambda: torch.nn.functional.cross_entropy(logits, target)),
        ("conv2d  [100, 32, 14, 14] * [64, 32, 5, 5], pad 2",
         lambda: F.conv2d(timg, tcw, padding=2),
         lambda: torch.nn.functional.conv2d(img, cw, padding=2)),
        ("max_pool2d(2)  [100, 32, 28, 28]", lambda: F.max_pool2d(tpool_in, 2),
         lambda: torch.nn.functional.max_pool2d(pool_in, 2)),
        ("SGD momentum step, cnn parameters (1.66M)", opt.step, topt.step),
        ("(x @ w.T).relu().sum().backward()",
         lambda: (txg @ twg.T).relu().sum().backward(),
         lambda: (xg @ wg.T).relu().sum().backward()),
    ]
    for name in ("mlp", "cnn"):
        ours_step, theirs_step = _step_pair(name)
        rows.append((f"{name} training step (forward, cross-entropy, backward, SGD)",
                     ours_step, theirs_step))
    return rows


def _seconds(fn):
    torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - start


def first_calls():
    """The first call of a matmul and a convolution at shapes never seen in this process, after
    the op ran at another shape: `first` as a user meets it (kernels compiled if the new shape
    needs other ones, the plan chosen and recorded), then the same call once more with the
    plans and the tuner's memory forgotten but Triton's compiled kernels kept (`replan`: all of
    the first call but compiling), and the steady-state call. PyTorch's first call beside it."""
    import tritonad as td
    import tritonad.nn.functional as F
    from tritonad.kernels import conv, launch, matmul
    try:
        from tritonad.kernels.plans import clear_plans
    except ImportError:  # a checkout from before plans.py (before/after runs)
        clear_plans = launch.clear_plans

    g = torch.Generator(device="cuda").manual_seed(1)

    def rand(*shape):
        return torch.randn(*shape, device="cuda", generator=g)

    seen_mm, new_mm = (rand(128, 256), rand(100, 256)), (rand(200, 300), rand(77, 300))
    seen_cv = (rand(100, 32, 14, 14), rand(64, 32, 5, 5))
    new_cv = (rand(50, 16, 20, 20), rand(24, 16, 3, 3))
    cases = [("matmul x @ w.T [200, 300] x [300, 77] (after [128, 256] x [256, 100])",
              lambda a, b: a @ b.T, lambda a, b: a @ b.T, seen_mm, new_mm),
             ("conv2d [50, 16, 20, 20] * [24, 16, 3, 3], pad 1 (after the cnn's conv2)",
              lambda a, b: F.conv2d(a, b, padding=1),
              lambda a, b: torch.nn.functional.conv2d(a, b, padding=1), seen_cv, new_cv)]
    rows = []
    for name, ours, theirs, seen, new in cases:
        ours_seen = [td.from_torch(t) for t in seen]
        ours_new = [td.from_torch(t) for t in new]
        _seconds(lambda: ours(*ours_seen))
        _seconds(lambda: theirs(*seen))
        row = {"case": name, "first_s": _seconds(lambda: ours(*ours_new)),
               "torch_first_s": _seconds(lambda: theirs(*new))}
        clear_plans()
        for tuner in (matmul.tuner, conv.tuner):
            tuner.memory.clear()
        row["replan_s"] = _seconds(lambda: ours(*ours_new))
        row["steady_s"] = common.per_call_us(lambda: ours(*ours_new), 100) / 1e6
        row["beyond_compiling_s"] = row["replan_s"] - row["steady_s"]
        rows.append(row)
        print(row, flush=True)
    return rows


def main(argv=None):
    args = common.parse_args(__doc__.splitlines()[0], argv, extra=lambda p: (
        p.add_argument("--calls", type=int, default=2000, help="calls per timing (default 2000)"),
        p.add_argument("--profile", action="store_true",
                       help="also print a cProfile of tritonad's calls (where the host time goes)")))
    common.require_gpu("bench_host")
    import tritonad as td

    td.set_backend("triton")
    # both at their defaults for float32: IEEE matmul, TF32 convolution (tritonad's too)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = True
    calls = 300 if args.quick else args.calls
    rounds = 2 if args.quick else 5
    rows = []
    for name, ours, theirs in cases():
        steps = "training step" in name or "backward" in name
        n = max(50, calls // 10) if steps else calls
        row = {"case": name, "calls": n, "rounds": rounds}
        row["tritonad_us"], row["torch_us"] = paired_us(ours, theirs, n, rounds)
        row["ratio"] = row["torch_us"] / row["tritonad_us"]
        rows.append(row)
        print(row, flush=True)
        if args.profile:
            _profile(name, ours, n)
    columns = [("case", "eager, per call", "{}"), ("tritonad_us", "tritonad us", "{:.1f}"),
               ("torch_us", "PyTorch us", "{:.1f}"), ("ratio", "ratio", "{:.2f}")]
    env = common.environment()
    common.print_table(f"Eager cost per call ({env.get('gpu')}, torch {env['torch']}, "
                       f"Triton {env['triton']})", rows, columns)
    print(common.markdown_table(rows, columns))
    firsts = first_calls()
    common.print_table("First call at a new shape (seconds)", firsts, [
        ("case", "case", "{}"), ("first_s", "tritonad first", "{:.3f}"),
        ("replan_s", "without compiling", "{:.4f}"), ("steady_s", "steady", "{:.6f}"),
        ("torch_first_s", "PyTorch first", "{:.4f}")])
    common.save(args.out, "bench_host", rows, {"calls": calls, "first_calls": firsts})
    return rows


if __name__ == "__main__":
    main()
