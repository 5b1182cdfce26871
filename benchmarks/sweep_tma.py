"""Sweep TMA matmul plans (tritonad/kernels/matmul.py: _matmul_tma_kernel) for large squares
against torch.matmul (cuBLAS) and the classic kernel's plans, same run, to choose the TMA menu
(matmul._TMA_TILES, tma_first). Not part of `tritonad bench`.

    python benchmarks/sweep_tma.py [--sizes 4096,8192] [--precisions tf32,bf16,fp16]
                                   [--layouts nn,nt] [--ws] [--out DIR]

Each problem is a [n, n] @ b [n, n] in a layout: nn = both row-major (torch.matmul(a, b), as
`bench matmul` squares), nt = b K-major (x @ w.t(), a linear layer's forward). Kernel time:
triton.testing.do_bench medians (CUDA events around one call, L2 flushed between calls);
TFLOP/s = 2 * n^3 / t; ratio = t_torch / t_plan (above 1: faster than cuBLAS). Every plan's
output is compared with torch's (error = max |ours - torch| / max |torch|). All kernels are
compiled first, many at once (plans.compile_ahead), so that the sweep fits a short GPU call.
"""
from __future__ import annotations

import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

PRECISIONS = {"tf32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
# (BM, BN, BK, warps, stages) tried for TMA plans, each persistent and not. On an H100 with
# Triton 3.6 these did not fit in shared memory: half 128x256x64 s4; TF32 128x256x32 s3,
# 256x128x32 s3, 128x128x64 s3 (the fp32 epilogue tile needs its own buffer).
TMA_TILES = {
    "half": [(128, 256, 64, 8, 3), (256, 128, 64, 8, 3), (128, 128, 64, 8, 4),
             (128, 128, 64, 4, 4), (128, 128, 128, 8, 3), (64, 256, 64, 4, 4)],
    "tf32": [(128, 128, 32, 8, 4), (128, 128, 32, 4, 4), (64, 256, 32, 4, 4),
             (128, 256, 32, 8, 2), (128, 128, 64, 8, 2)],
}


def plans_for(mm, kind, layout, sms, n, ws):
    """(label, plan) pairs: the classic menu's first plans (what the tuner picked before TMA),
    then TMA tiles x persistent, TF32 N-major b also staged K-major, warp-specialized ones."""
    b_kmajor = layout == "nt"
    classic = mm.candidate_plans(1, n, n, n, kind, True, b_kmajor, sms)
    out = [("classic", p) for p in classic[:2]]
    if kind == "tf32" and not b_kmajor:
        out += [("classic", p) for p in classic if p["stage_b"]][:2]
    for tile in TMA_TILES[kind]:
        for persistent in (True, False):
            out.append(("tma", mm._tma_plan(*tile, persistent)))
    if kind == "tf32" and not b_kmajor:
        out += [("tma", mm._tma_plan(*t, p, stage_b=True)) for t in TMA_TILES[kind][:3]
                for p in (True, False)]
    if ws:  # automatic warp specialization of the tile loop (Triton 3.6 does it on Hopper)
        out += [("tma", mm._tma_plan(*t, True, stage_b=kind == "tf32" and not b_kmajor,
                                     ws=True)) for t in TMA_TILES[kind][:3]]
    return out


def operands(n, dtype, layout):
    a = torch.randn(n, n, device="cuda", dtype=dtype)
    b = torch.randn(n, n, device="cuda", dtype=dtype)
    return a, (b.t() if layout == "nt" else b)


def main(argv=None):
    args = common.parse_args(__doc__.splitlines()[0], argv, extra=lambda p: (
        p.add_argument("--sizes", default="4096,8192"),
        p.add_argument("--precisions", default="tf32,bf16,fp16"),
        p.add_argument("--layouts", default="nn,nt:4096",
                       help="comma list of layout[:size] (nt:4096 = only at 4096)"),
        p.add_argument("--ws", action="store_true", help="also try warp_specialize=True"),
        p.add_argument("--top", type=int, default=8)))
    common.require_gpu("sweep_tma")
    import tritonad as td
    from tritonad.kernels import launch, plans
    from tritonad.kernels import matmul as mm

    td.set_backend("triton")
    td.set_matmul_precision("high")
    torch.backends.cuda.matmul.allow_tf32 = True  # torch's TF32 for the tf32 rows
    mm.matmul(torch.ones(8, 8, device="cuda"), torch.ones(8, 8, device="cuda"))  # allocator set
    env = common.environment()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(f"TMA matmul sweep: {env.get('gpu')} ({sms} SMs), torch {env['torch']}, "
          f"triton {env['triton']}", flush=True)
    sizes = [int(v) for v in args.sizes.split(",")]
    problems = []  # (precision, layout, n)
    for precision in args.precisions.split(","):
        for item in args.layouts.split(","):
            layout, _, only = item.partition(":")
            for n in sizes:
                if not only or int(only) == n:
                    problems.append((precision, layout, n))
    problems.sort(key=lambda p: p[1] != "nn")  # bench matmul's layout first

    def runner(plan, a, b, out, kind):
        groups = mm._batch_groups(a, b, out)

        def go():
            for B0, B1, a_g, b_g, out_g in groups:
                mm._launch(plan, B0, B1, a_g, b_g, out_g, None, False, kind)
        return go

    # compile every plan first, on a thread pool (the shapes' specializations do not depend
    # on n: every size here is a multiple of 16)
    start = time.perf_counter()
    with plans.compile_ahead() as ahead:
        for precision, layout, n in {(p, la, sizes[0]) for p, la, _ in problems}:
            kind = mm._kind(PRECISIONS[precision], "high")
            a, b = operands(256, PRECISIONS[precision], layout)
            out = torch.empty(256, 256, device="cuda", dtype=a.dtype)
            for _, plan in plans_for(mm, kind, layout, sms, n, args.ws):
                runner(plan, a, b, out, kind)()
    print(f"compiled {ahead.kernels} kernels in {time.perf_counter() - start:.0f} s", flush=True)

    rows, summary = [], []
    for precision, layout, n in problems:
        dtype = PRECISIONS[precision]
        kind = mm._kind(dtype, "high")
        a, b = operands(n, dtype, layout)
        out = torch.empty(n, n, device="cuda", dtype=dtype)
        ref = torch.matmul(a, b)
        flop = 2.0 * n ** 3
        ms_torch = common.bench(lambda: torch.matmul(a, b), warmup=10, rep=40)
        timed = []
        for label, plan in plans_for(mm, kind, layout, sms, n, args.ws):
            go = runner(plan, a, b, out, kind)
            try:
                go()
                torch.cuda.synchronize()
                error = ((out.float() - ref.float()).abs().max() / ref.float().abs().max()).item()
                ms = common.bench(go, warmup=10, rep=40)
            except Exception as err:  # noqa: BLE001  (out of shared memory, unsupported, ...)
                print(f"  {precision} {layout} {n}: {mm.describe(plan)}: {type(err).__name__}: "
                      f"{str(err).splitlines()[0][:100] if str(err) else ''}", flush=True)
                continue
            timed.append((ms, label, plan, error))
            rows.append(dict(precision=precision, layout=layout, n=n, kind=label,
                             plan=mm.describe(plan), ms=ms, tflops=flop / ms / 1e9,
                             ratio=ms_torch / ms, error=error, plan_dict=plan))
        timed.sort(key=lambda t: t[0])
        print(f"\n{precision} {layout} {n}^3: torch {ms_torch:.3f} ms "
              f"({flop / ms_torch / 1e9:.0f} TFLOP/s)")
        for ms, label, plan, error in timed[:args.top]:
            print(f"  {ms:8.3f} ms {flop / ms / 1e9:6.0f} TFLOP/s  {ms_torch / ms:5.3f}x  "
                  f"{label:7} {mm.describe(plan)}  (error {error:.1e})")
        best = {label: min((t for t in timed if t[1] == label), key=lambda t: t[0], default=None)
                for label in ("classic", "tma")}
        menu = mm.candidate_plans(1, n, n, n, kind, True, layout == "nt", sms, tma=True)[0]
        first = [t for t in timed if t[2] == menu]
        summary.append(dict(
            problem=f"{precision} {layout} {n}^3", torch_ms=ms_torch,
            classic=ms_torch / best["classic"][0] if best["classic"] else None,
            classic_plan=mm.describe(best["classic"][2]) if best["classic"] else "",
            tma=ms_torch / best["tma"][0] if best["tma"] else None,
            tma_plan=mm.describe(best["tma"][2]) if best["tma"] else "",
            menu=ms_torch / first[0][0] if first else None, menu_plan=mm.describe(menu)))
        del a, b, out, ref
    common.print_table("best of each kind: ratio = t_torch / t_plan (kernel time, same run)",
                       summary,
                       [("problem", "problem", "{}"), ("torch_ms", "torch ms", "{:.3f}"),
                        ("classic", "classic", "{:.3f}"), ("classic_plan", "its plan", "{}"),
                        ("tma", "tma", "{:.3f}"), ("tma_plan", "its plan", "{}"),
                        ("menu", "menu first", "{:.3f}"), ("menu_plan", "menu's first", "{}")])
    common.save(args.out, "sweep_tma", rows, dict(summary=summary, sms=sms))


if __name__ == "__main__":
    main()
