"""Scans and sorting: tritonad's kernels (tritonad.kernels.scan) against torch on the same GPU
in the same run: cumsum, sort and topk along the last dim.

    python benchmarks/bench_scan.py --out bench-results [--quick] [--dtype float32]
        [--ops cumsum,sort,topk] [--k 50] [--variant new,old]

Shapes: one row of 1M elements and [4096, 32000] rows (the issue's two), and a few between.
Per op and shape: the kernel time (triton.testing.do_bench median, L2 flushed) of the launcher
on raw torch tensors against torch's own function (torch.cumsum, torch.sort, torch.topk), and
the eager per-call time (host included) of the public op, td.cumsum(x, -1) on a tritonad
tensor, against the torch call. Ratios are torch time / tritonad time: above 1 means tritonad
is faster. GB/s = bytes moved / t at the minimum traffic: cumsum reads x and writes y
(2 x numel x itemsize); sort reads x and writes values and int64 indices ((2 x itemsize + 8)
x numel); topk reads x (numel x itemsize; the k outputs are small).

--variant picks the kernels (tritonad.kernels.scan.VARIANT, as TRITONAD_SCAN_KERNELS does):
"new" (the single-pass look-back cumsum, the radix sort, the halving topk where they apply),
"old" (the multi-pass scan, the bitonic merge sort, the full-tile topk); both by default, each
row measured under each, so that one run compares them on the same GPU.
"""
from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

import tritonad as td  # noqa: E402
from tritonad.kernels import plans  # noqa: E402
from tritonad.kernels import scan as kernels  # noqa: E402

SHAPES = [(1, 1 << 20), (1, 1 << 24), (64, 32000), (4096, 32000), (32768, 128), (1024, 4096)]
QUICK_SHAPES = [(1, 1 << 20), (4096, 32000)]
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
OPS = ("cumsum", "sort", "topk")
VARIANTS = ("new", "old")


def _pair(op, k):
    """(ours on raw tensors, torch, tritonad eager, bytes moved per element / itemsize terms)."""
    if op == "cumsum":
        return (lambda x: kernels.cumulative(x, x.dim() - 1, "sum"),
                lambda x: torch.cumsum(x, -1),
                lambda t: td.cumsum(t, -1),
                lambda n, size: 2 * n * size)
    if op == "sort":
        return (lambda x: kernels.sort(x, x.dim() - 1, False, False),
                lambda x: torch.sort(x, -1),
                lambda t: td.sort(t, -1),
                lambda n, size: n * (2 * size + 8))
    return (lambda x: kernels.topk(x, k, x.dim() - 1, True, True),
            lambda x: torch.topk(x, k, -1),
            lambda t: td.topk(t, k, -1),
            lambda n, size: n * size)


def measure(op, shape, dtype, k, variant="new"):
    kernels.VARIANT = variant
    plans.clear_plans()
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(shape, device="cuda", generator=gen).to(dtype)
    ours, theirs, eager, traffic = _pair(op, min(k, shape[-1]))
    # the two must agree before they are timed
    got, want = ours(x), theirs(x)
    if op == "cumsum":
        scale = shape[-1] ** 0.5
        assert torch.allclose(got.float(), want.float(), rtol=1e-2, atol=1e-3 * scale), op
    else:
        assert torch.equal(got[0], want[0]), f"{op}: values differ from torch"
    del got, want
    row = {"op": op, "variant": variant, "shape": "x".join(map(str, shape)),
           "numel": x.numel(), "dtype": str(dtype)[6:]}
    row["td_ms"], row["torch_ms"] = common.bench_pair(lambda: ours(x), lambda: theirs(x))
    row["ratio"] = row["torch_ms"] / row["td_ms"]
    nbytes = traffic(x.numel(), x.element_size())
    row["td_gbps"] = nbytes / row["td_ms"] / 1e6
    row["torch_gbps"] = nbytes / row["torch_ms"] / 1e6
    xt = td.from_torch(x)
    calls = 200 if x.numel() <= 1 << 20 else 20
    row["td_eager_us"] = common.per_call_us(lambda: eager(xt), calls)
    row["torch_eager_us"] = common.per_call_us(lambda: theirs(x), calls)
    row["eager_ratio"] = row["torch_eager_us"] / row["td_eager_us"]
    torch.cuda.empty_cache()
    return row


COLUMNS = [
    ("op", "op", "{}"), ("variant", "kernels", "{}"), ("shape", "shape", "{}"),
    ("td_ms", "kernel ms", "{:.4f}"), ("torch_ms", "torch", "{:.4f}"),
    ("ratio", "ratio", "{:.2f}x"), ("td_gbps", "GB/s", "{:.0f}"),
    ("torch_gbps", "torch GB/s", "{:.0f}"),
    ("td_eager_us", "eager us/call", "{:.1f}"), ("torch_eager_us", "torch", "{:.1f}"),
    ("eager_ratio", "ratio", "{:.2f}x"),
]


def _extra(parser):
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    parser.add_argument("--ops", default=",".join(OPS),
                        help="comma-separated subset of " + ",".join(OPS))
    parser.add_argument("--k", type=int, default=50, help="topk's k (default 50)")
    parser.add_argument("--variant", default=",".join(VARIANTS),
                        help="comma-separated kernels to measure: new (single-pass cumsum, radix "
                             "sort, halving topk), old (the paths before them); default both")


def main(argv=None):
    args = common.parse_args(__doc__.splitlines()[0], argv, extra=_extra)
    ops = [o for o in args.ops.split(",") if o]
    unknown = sorted(set(ops) - set(OPS))
    if unknown:
        raise SystemExit(f"bench_scan: unknown ops {unknown}; choose from {list(OPS)}")
    variants = [v for v in args.variant.split(",") if v]
    if not variants or set(variants) - set(VARIANTS):
        raise SystemExit(f"bench_scan: --variant takes {','.join(VARIANTS)} or one of them, "
                         f"got {args.variant!r}")
    common.require_gpu("bench_scan")
    td.set_backend("triton")
    dtype = DTYPES[args.dtype]
    rows = []
    for op in ops:
        for shape in QUICK_SHAPES if args.quick else SHAPES:
            for variant in variants:
                print(f"measuring {op} {shape} {args.dtype} ({variant}) ...", flush=True)
                rows.append(measure(op, shape, dtype, args.k, variant))
    kernels.VARIANT = "new"
    plans.clear_plans()
    name = f"scan_{args.dtype}"
    common.print_table(f"scans and sorting along the last dim, {args.dtype}, topk k={args.k} "
                       "(ratio = torch / tritonad; GB/s = bytes moved / t: cumsum 2 x numel x "
                       "itemsize, sort numel x (2 itemsize + 8), topk numel x itemsize)",
                       rows, COLUMNS)
    meta = {"dtype": args.dtype, "k": args.k, "variants": variants,
            "sort_tile": kernels.SORT_TILE, "scan_chunk": kernels.SCAN_CHUNK}
    path = common.save(args.out, name, rows, meta=meta)
    print(f"\nwrote {path}")
    return rows


if __name__ == "__main__":
    main()
