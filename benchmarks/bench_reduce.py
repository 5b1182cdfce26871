"""Sum reductions: tritonad's launcher against torch on the same GPU in the same run.

    python benchmarks/bench_reduce.py --out bench-results [--quick] [--dtype float32]
        [--tile N] [--programs-per-sm N]

Cases over n elements, n = 2**16 .. 2**28 (--quick: 2**20, 2**24, 2**26):
    last        (n/1024, 1024) -> (n/1024)   sum over the last, contiguous axis
    first       (n/1024, 1024) -> (1024)     sum over the first axis: the bias gradient
    first_narrow (n/64, 64) -> (64)          the same with few outputs (the loop is split)
    nchw        (n/65536, 64, 32, 32) -> (64)  a conv bias gradient: dims (0, 2, 3)
    all         (n,) -> ()                   everything
Metric: GB/s = (n + outputs) x itemsize / t (bytes read + written), t the triton.testing
.do_bench median with L2 flushed. Ratio = torch ms / tritonad ms (above 1: tritonad faster);
"% copy" compares with the device-to-device copy bandwidth measured once at the start.
--tile / --programs-per-sm override the reduction's tile size and split target, to try settings.
"""
from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

import tritonad as td  # noqa: E402
from tritonad.kernels import reduce as kernels  # noqa: E402

SIZES = [2**k for k in range(16, 29, 2)]
QUICK_SIZES = [2**20, 2**24, 2**26]
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def case(name, n):
    """(shape, dims) of a case at n elements."""
    return {"last": ((n // 1024, 1024), (1,)), "first": ((n // 1024, 1024), (0,)),
            "first_narrow": ((n // 64, 64), (0,)),
            "nchw": ((max(n // 65536, 1), 64, 32, 32), (0, 2, 3)),
            "all": ((n,), (0,))}[name]


CASES = ["last", "first", "first_narrow", "nchw", "all"]


def measure(name, n, dtype):
    shape, dims = case(name, n)
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(shape, device="cuda", generator=gen).to(dtype)
    ours = lambda: kernels.sum(x, dims)  # noqa: E731
    theirs = lambda: x.sum(dims)  # noqa: E731
    outputs = theirs().numel()
    terms = x.numel() // max(outputs, 1)  # float32 sums of `terms` N(0, 1) values, any order
    torch.testing.assert_close(ours().float(), theirs().float(), rtol=1e-2,
                               atol=1e-2 * terms ** 0.5 + 1e-5 * terms)
    nbytes = (x.numel() + outputs) * x.element_size()
    row = {"case": name, "n": x.numel(), "shape": "x".join(map(str, shape)),
           "dtype": str(dtype)[6:]}
    row["td_ms"] = common.bench(ours)
    row["torch_ms"] = common.bench(theirs)
    row["td_gbps"] = nbytes / row["td_ms"] / 1e6
    row["torch_gbps"] = nbytes / row["torch_ms"] / 1e6
    row["ratio"] = row["torch_ms"] / row["td_ms"]
    return row


COLUMNS = [("case", "case", "{}"), ("shape", "shape", "{}"), ("td_ms", "tritonad ms", "{:.4f}"),
           ("torch_ms", "torch ms", "{:.4f}"), ("ratio", "ratio", "{:.2f}x"),
           ("td_gbps", "tritonad GB/s", "{:.0f}"), ("torch_gbps", "torch GB/s", "{:.0f}"),
           ("td_copy_pct", "% copy", "{:.0f}%")]


def _extra(parser):
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    parser.add_argument("--tile", type=int, default=None,
                        help="override kernels.TILE (accumulator tile elements)")
    parser.add_argument("--programs-per-sm", type=int, default=None,
                        help="override kernels.PROGRAMS_PER_SM (how far small outputs split)")


def main(argv=None):
    args = common.parse_args(__doc__.splitlines()[0], argv, extra=_extra)
    common.require_gpu("bench_reduce")
    td.set_backend("triton")
    if args.tile:
        kernels.TILE = args.tile
    if args.programs_per_sm:
        kernels.PROGRAMS_PER_SM = args.programs_per_sm
    dtype = DTYPES[args.dtype]
    peak = common.copy_bandwidth()
    print(f"device copy bandwidth: {peak:.0f} GB/s (bytes read + written)", flush=True)
    rows = []
    for name in CASES:
        for n in QUICK_SIZES if args.quick else SIZES:
            print(f"measuring sum {name} n={n} {args.dtype} ...", flush=True)
            row = measure(name, n, dtype)
            row["td_copy_pct"] = 100 * row["td_gbps"] / peak
            rows.append(row)
    name = f"reduce_sum_{args.dtype}"
    common.print_table(f"sum, {args.dtype} (GB/s = (n + outputs) x itemsize / t; copy "
                       f"bandwidth {peak:.0f} GB/s; ratio = torch ms / tritonad ms)", rows,
                       COLUMNS)
    meta = {"copy_bandwidth_gbps": peak, "dtype": args.dtype, "tile": kernels.TILE,
            "programs_per_sm": kernels.PROGRAMS_PER_SM,
            "bytes_moved": "(n + outputs) x itemsize"}
    path = common.save(args.out, name, rows, meta=meta)
    common.plot(args.out, name, rows, x="n", series=[("td_gbps", "tritonad"),
                                                      ("torch_gbps", "torch")],
                xlabel="elements", ylabel="GB/s (bytes read + written / t)", group="case",
                title=f"sum {args.dtype} (copy: {peak:.0f} GB/s)")
    print(f"\nwrote {path}")
    return rows


if __name__ == "__main__":
    main()
