"""Elementwise kernels: tritonad's launchers against torch on the same GPU in the same run.

    python benchmarks/bench_elementwise.py --out bench-results [--quick] [--dtype float32]
        [--block N] [--warps N]

Ops on contiguous arrays of n elements, n = 2**16 .. 2**28 (--quick: 2**20, 2**24, 2**26):
    add  c = a + b              torch: a + b                                 3 n itemsize
    mul  c = a * b              torch: a * b                                 3 n itemsize
    relu y = max(x, 0)          torch: torch.relu(x)                         2 n itemsize
    relu_backward dx = dy [x>0] torch: aten.threshold_backward(dy, x, 0)     3 n itemsize
    bias_add (n/1024, 1024) + (1024,) row, stride 0 (the row read in place)  2 n itemsize
    gelu y = x Phi(x)           torch: F.gelu(x)                             2 n itemsize
    gelu_backward (x, dy)       torch: aten.gelu_backward(dy, x)             3 n itemsize
    silu y = x sigmoid(x)       torch: F.silu(x)                             2 n itemsize
(gelu and silu are entries of tritonad/elementwise.py: their kernels are the table's formulas.)
Metric: GB/s = bytes read + written / t (the last column), t the triton.testing.do_bench median
with L2 flushed. Ratio = torch ms / tritonad ms (above 1: tritonad faster); "% copy" compares
with the device-to-device copy bandwidth measured once at the start (bytes read + written).
Both sides allocate their output per call (torch's caching allocator serves both).
--block / --warps override the contiguous fast path's BLOCK and num_warps, to try settings.
"""
from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

import tritonad as td  # noqa: E402
from tritonad.kernels import elementwise as kernels  # noqa: E402

SIZES = [2**k for k in range(16, 29, 2)]
QUICK_SIZES = [2**20, 2**24, 2**26]
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# op -> (tritonad call, torch call, bytes moved per element in units of itemsize)
OPS = {
    "add": (lambda a, b: kernels.add(a, b), lambda a, b: a + b, 3),
    "mul": (lambda a, b: kernels.mul(a, b), lambda a, b: a * b, 3),
    "relu": (lambda a, b: kernels.relu(a), lambda a, b: torch.relu(a), 2),
    "relu_backward": (lambda a, b: kernels.relu_backward(a, b),
                      lambda a, b: torch.ops.aten.threshold_backward(a, b, 0), 3),
    "bias_add": (lambda a, b: kernels.add(a, b), lambda a, b: a + b, 2),
    "gelu": (lambda a, b: kernels.gelu(a), lambda a, b: torch.nn.functional.gelu(a), 2),
    "gelu_backward": (lambda a, b: kernels.apply(td.elementwise.gelu.derivatives["x"], a, b),
                      lambda a, b: torch.ops.aten.gelu_backward(b, a), 3),
    "silu": (lambda a, b: kernels.silu(a), lambda a, b: torch.nn.functional.silu(a), 2),
}


def measure(op, n, dtype):
    gen = torch.Generator(device="cuda").manual_seed(0)
    ours, theirs, moved = OPS[op]
    a = torch.randn(n, device="cuda", generator=gen).to(dtype)
    b = torch.randn(n, device="cuda", generator=gen).to(dtype)
    if op == "bias_add":
        a, b = a.view(n // 1024, 1024), b[:1024]
    torch.testing.assert_close(ours(a, b), theirs(a, b))  # same answer before timing
    nbytes = moved * n * a.element_size()
    row = {"op": op, "n": n, "dtype": str(dtype)[6:]}
    row["td_ms"] = common.bench(lambda: ours(a, b))
    row["torch_ms"] = common.bench(lambda: theirs(a, b))
    row["td_gbps"] = nbytes / row["td_ms"] / 1e6
    row["torch_gbps"] = nbytes / row["torch_ms"] / 1e6
    row["ratio"] = row["torch_ms"] / row["td_ms"]
    return row


COLUMNS = [("op", "op", "{}"), ("n", "elements", "{}"), ("td_ms", "tritonad ms", "{:.4f}"),
           ("torch_ms", "torch ms", "{:.4f}"), ("ratio", "ratio", "{:.2f}x"),
           ("td_gbps", "tritonad GB/s", "{:.0f}"), ("torch_gbps", "torch GB/s", "{:.0f}"),
           ("td_copy_pct", "% copy", "{:.0f}%")]


def _extra(parser):
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    parser.add_argument("--block", type=int, default=None,
                        help="override kernels.CONTIGUOUS_BLOCK (elements per program)")
    parser.add_argument("--warps", type=int, default=None,
                        help="override kernels.CONTIGUOUS_WARPS")


def main(argv=None):
    args = common.parse_args(__doc__.splitlines()[0], argv, extra=_extra)
    common.require_gpu("bench_elementwise")
    td.set_backend("triton")
    if args.block:
        kernels.CONTIGUOUS_BLOCK = args.block
    if args.warps:
        kernels.CONTIGUOUS_WARPS = args.warps
    dtype = DTYPES[args.dtype]
    peak = common.copy_bandwidth()
    print(f"device copy bandwidth: {peak:.0f} GB/s (bytes read + written)", flush=True)
    rows = []
    for op in OPS:
        for n in QUICK_SIZES if args.quick else SIZES:
            print(f"measuring {op} n={n} {args.dtype} ...", flush=True)
            row = measure(op, n, dtype)
            row["td_copy_pct"] = 100 * row["td_gbps"] / peak
            row["torch_copy_pct"] = 100 * row["torch_gbps"] / peak
            rows.append(row)
    name = f"elementwise_{args.dtype}"
    common.print_table(f"elementwise, {args.dtype}, contiguous (GB/s = bytes read + written / "
                       f"t; copy bandwidth {peak:.0f} GB/s; ratio = torch ms / tritonad ms)",
                       rows, COLUMNS)
    meta = {"copy_bandwidth_gbps": peak, "dtype": args.dtype,
            "contiguous_block": kernels.CONTIGUOUS_BLOCK,
            "contiguous_warps": kernels.CONTIGUOUS_WARPS,
            "bytes_moved": {op: f"{moved} x n x itemsize" for op, (_, _, moved) in OPS.items()}}
    path = common.save(args.out, name, rows, meta=meta)
    common.plot(args.out, name, rows, x="n", series=[("td_gbps", "tritonad"),
                                                      ("torch_gbps", "torch")],
                xlabel="elements", ylabel="GB/s (bytes read + written / t)", group="op",
                title=f"elementwise {args.dtype} (copy: {peak:.0f} GB/s)")
    print(f"\nwrote {path}")
    return rows


if __name__ == "__main__":
    main()
