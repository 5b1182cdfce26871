"""Sweep matmul plans for the float32 products of the MNIST training steps, timed the way a
captured step runs them (a CUDA graph of repeated launches), to choose the tuner's menu for
small problems. Prints, per product, the fastest plans and the fastest of the tuner's current
candidates. Not part of `tritonad bench`.

    python benchmarks/sweep_matmul.py
"""
from __future__ import annotations

import itertools
import time

import torch

import common

# (name, M, N, K, layout of a [M, K], of b [K, N]) in the MNIST steps: "k" = K contiguous (a
# row-major activation, or w.t() as b), "mn" = the other axis (a transposed gradient, w as b)
PROBLEMS = [
    ("mlp fc1 fwd", 128, 256, 784, "k", "k"),
    ("mlp fc2 fwd", 128, 100, 256, "k", "k"),
    ("mlp fc3 fwd", 128, 10, 100, "k", "k"),
    ("mlp fc3 dx", 128, 100, 10, "k", "mn"),
    ("mlp fc3 dW", 10, 100, 128, "mn", "mn"),
    ("mlp fc2 dx", 128, 256, 100, "k", "mn"),
    ("mlp fc2 dW", 100, 256, 128, "mn", "mn"),
    ("mlp fc1 dW", 256, 784, 128, "mn", "mn"),
    ("cnn fc1 fwd", 100, 512, 3136, "k", "k"),
    ("cnn fc2 fwd", 100, 10, 512, "k", "k"),
    ("cnn fc2 dx", 100, 512, 10, "k", "mn"),
    ("cnn fc2 dW", 10, 512, 100, "mn", "mn"),
    ("cnn fc1 dx", 100, 3136, 512, "k", "mn"),
    ("cnn fc1 dW", 512, 3136, 100, "mn", "mn"),
    ("cnn fc1 dx gated", 100, 3136, 512, "k", "mn"),
    ("cnn fc1 dW gated", 512, 3136, 100, "mn", "mn"),
]
# the epilogues of the products as the step runs them: relu's gate applied to a as it is read
# (a linear layer's backward), the gated rows of a summed (its bias gradient)
EPILOGUES = {"cnn fc1 dx gated": ("gate",), "cnn fc1 dW gated": ("gate", "rows"),
             "cnn fc2 dW": ("rows",)}


def problem_operands(M, N, K, la, lb):
    """a [M, K] and b [K, N] in the layouts of the step."""
    a = torch.randn(M, K, device="cuda") if la == "k" else torch.randn(K, M, device="cuda").t()
    b = torch.randn(N, K, device="cuda").t() if lb == "k" else torch.randn(K, N, device="cuda")
    return a, b


def sweep_plans(M, N, K, sms, mm, x3=False, la="k", lb="k", bks=(16, 32), x3_only=False,
                bms=(16, 32, 64), bns=(32, 64), mults=()):
    """Small tiles x warps x splits (split_k_heuristic's, its half, and its multiples `mults`:
    more programs than SMs, for latency-bound tiles); with x3, each also on tensor cores as
    3xTF32 (K-major staged too where an operand's K stride is not 1). x3_only: 3xTF32 plans
    alone, BLOCK_K up to K (one K step for short products)."""
    plans = []
    for bm, bn, bk in itertools.product(bms, bns, bks):
        if bk > max(16, mm.next_power_of_2(K)):
            continue
        if bm > max(16, 2 * M) or bn > max(32, 2 * N):
            continue
        for warps in ((1, 2) if bm * bn <= 1024 else (2, 4) if bm * bn <= 2048 else (4, 8)):
            base = mm._plan(bm, bn, bk, warps, 3)
            split = mm.split_k_heuristic(1, M, N, K, bm, bn, bk, sms)
            plans.append(base)
            for s in sorted({split, max(2, split // 2)} | {split * m for m in mults}):
                if s > 1 and mm.cdiv(K, bk) >= 2 * s:
                    plans.append({**base, "split": s})
    if x3_only:
        staged = {"stage_a": la != "k", "stage_b": lb != "k"}
        return [{**p, "x3": True} for p in plans] + \
            ([{**p, "x3": True, **staged} for p in plans] if la != "k" or lb != "k" else [])
    if x3:
        fp32 = list(plans)
        plans += [{**p, "x3": True} for p in fp32]
        if la != "k" or lb != "k":
            plans += [{**p, "x3": True, "stage_a": la != "k", "stage_b": lb != "k"} for p in fp32]
    return plans


def max_error(out, a, b):
    """Largest |out - a @ b| (float64) relative to (|a| @ |b|): the product's rounding error."""
    ref = a.double() @ b.double()
    scale = a.double().abs() @ b.double().abs()
    return ((out.double() - ref).abs() / scale.clamp_min(1e-30)).max().item()


def main(argv=None):
    args = common.parse_args(__doc__.splitlines()[0], argv, extra=lambda p: (
        p.add_argument("--only", default="", help="comma list of problem names to run"),
        p.add_argument("--top", type=int, default=6),
        p.add_argument("--x3", action="store_true", help="also try 3xTF32 tensor-core plans"),
        p.add_argument("--x3-only", action="store_true", help="3xTF32 plans only"),
        p.add_argument("--bk", default="16,32", help="BLOCK_K values to sweep"),
        p.add_argument("--bm", default="16,32,64", help="BLOCK_M values to sweep"),
        p.add_argument("--bn", default="32,64", help="BLOCK_N values to sweep"),
        p.add_argument("--split-mult", default="",
                       help="also split-K counts of these multiples of the heuristic's")))
    common.require_gpu("sweep_matmul")
    import tritonad as td
    from profile_step import graph_us
    from tritonad.kernels import matmul as mm
    from tritonad.kernels.tuning import shipped_plans

    td.set_backend("triton")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = []
    for name, M, N, K, la, lb in PROBLEMS:
        if args.only and name not in args.only.split(","):
            continue
        a, b = problem_operands(M, N, K, la, lb)
        out = torch.empty(M, N, device="cuda")
        groups = mm._batch_groups(a, b, out)
        epilogue = EPILOGUES.get(name, ())
        gate = torch.randn(a.shape[::-1], device="cuda").t() if la != "k" else \
            torch.randn(a.shape, device="cuda")
        gate = gate if "gate" in epilogue else None
        row_sums = torch.empty(M, device="cuda") if "rows" in epilogue else None
        if gate is not None:
            a = torch.where(gate > 0, a, 0.0)  # the reference product's a (same layout)
            a = a if la == "k" else a.t().contiguous().t()

        def run(plan):
            for B0, B1, a_g, b_g, out_g in groups:
                mm._launch(plan, B0, B1, a_g, b_g, out_g, None, False, "ieee", gate,
                           row_sums)

        start = time.perf_counter()
        timed = []
        menu = mm.candidate_plans(1, M, N, K, "ieee", la == "k", lb == "k", sms)
        key = f"1x{M}x{N}x{K}:float32:ieee:{la}{lb}" + "".join(f":{e}" for e in epilogue)
        table = shipped_plans("matmul").get(key)
        if table is not None and table not in menu:
            menu.append(table)
        bks = tuple(int(v) for v in args.bk.split(","))
        ints = [tuple(int(v) for v in arg.split(",") if v) for arg in
                (args.bm, args.bn, args.split_mult)]
        for plan in sweep_plans(M, N, K, sms, mm, args.x3, la, lb, bks, args.x3_only,
                                *ints) + menu:
            try:
                run(plan)
                torch.testing.assert_close(out, a @ b, rtol=1e-4, atol=1e-3)
                timed.append((graph_us(lambda: run(plan)), plan, max_error(out, a, b)))
            except Exception as err:  # noqa: BLE001
                print(f"  {mm.describe(plan)}: {type(err).__name__}: {str(err)[:80]}")
        timed.sort(key=lambda t: t[0])
        best_menu = min((t for t in timed if t[1] in menu), key=lambda t: t[0])
        flops = 2 * M * N * K
        print(f"\n{name} {M}x{N}x{K} ({la}{lb}): {len(timed)} plans in "
              f"{time.perf_counter() - start:.0f} s; {flops / 1e6:.1f} MFLOP")
        for us, plan, err in timed[:args.top]:
            print(f"  {us:7.2f} us  {mm.describe(plan)}  (error {err:.1e})")
        for tag, x3 in (("fp32 FMA", False), ("3xTF32", True)):
            kind = [t for t in timed if bool(t[1].get("x3")) == x3]
            if kind:
                print(f"  best {tag}: {kind[0][0]:.2f} us {mm.describe(kind[0][1])}, worst error "
                      f"of its kind {max(t[2] for t in kind):.1e}")
        print(f"  menu best {best_menu[0]:.2f} us  {mm.describe(best_menu[1])}", flush=True)
        for us, plan, _ in timed:
            if plan == table:
                print(f"  this GPU's table plan ({key}): {us:.2f} us  {mm.describe(plan)}")
        rows.append({"problem": name, "best_us": timed[0][0], "best": mm.describe(timed[0][1]),
                     "best_error": timed[0][2],
                     "menu_us": best_menu[0], "menu": mm.describe(best_menu[1])})
    common.save(args.out, "sweep_matmul", rows, {})


if __name__ == "__main__":
    main()
