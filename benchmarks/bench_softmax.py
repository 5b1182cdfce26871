"""Softmax (or log-softmax) along the last dim: tritonad's kernels against torch on the same GPU
in the same run: forward, backward and both.

    python benchmarks/bench_softmax.py --out bench-results [--quick] [--dtype float32]
        [--op softmax|log_softmax] [--single-block-max N] [--loop-block N]

Metric: GB/s = bytes moved / t at the minimum traffic: the forward reads x and writes y
(2 * numel * itemsize), the backward reads dy and y and writes dx (3 * numel * itemsize),
forward + backward 5 * numel * itemsize. Two tritonad paths, each labelled in the table:
- "primitive": the launchers (tritonad.kernels.softmax) on raw torch tensors, against
  torch.softmax and torch._softmax_backward_data (no autograd on either side);
- "autodiff": td.from_torch(x).requires_grad_(); y = x.softmax(-1); y.backward(dy), against
  torch autograd doing the same.
Timings are triton.testing.do_bench medians (L2 flushed). Ratios are torch time / tritonad
time: above 1 means tritonad is faster. --single-block-max / --loop-block override the kernels'
block rule (to try another setting; the values used are saved with the results).
"""
from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

import tritonad as td  # noqa: E402
from tritonad.kernels import softmax as kernels  # noqa: E402

SHAPES = [(128, 10), (4096, 1024), (32768, 512), (1024, 8192), (4096, 32000), (8192, 8192),
          (1823, 781), (512, 65536), (256, 131072)]
QUICK_SHAPES = [(128, 10), (4096, 1024), (4096, 32000), (256, 131072)]
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _ops(op):
    """(our forward, our backward, torch forward, torch backward), all (…, dim)."""
    if op == "softmax":
        return (kernels.softmax, kernels.softmax_backward, torch.softmax,
                torch._softmax_backward_data)
    return (kernels.log_softmax, kernels.log_softmax_backward, torch.log_softmax,
            torch._log_softmax_backward_data)


def measure(shape, dtype, op):
    """Two rows (primitive, autodiff) of forward / backward / both timings for one shape."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = (torch.randn(shape, device="cuda", generator=gen) * 3).to(dtype)
    dy = torch.randn(shape, device="cuda", generator=gen).to(dtype)
    dim = x.dim() - 1
    ours_f, ours_b, torch_f, torch_b = _ops(op)
    nbytes = x.numel() * x.element_size()
    base = {"shape": f"{shape[0]}x{shape[1]}", "numel": x.numel(), "dtype": str(dtype)[6:]}

    y_ours, y_torch = ours_f(x, dim), torch_f(x, dim)
    prim = dict(base, path="primitive")
    prim["td_fwd_ms"] = common.bench(lambda: ours_f(x, dim))
    prim["td_bwd_ms"] = common.bench(lambda: ours_b(dy, y_ours, dim))
    prim["td_fb_ms"] = common.bench(lambda: ours_b(dy, ours_f(x, dim), dim))
    prim["torch_fwd_ms"] = common.bench(lambda: torch_f(x, dim))
    prim["torch_bwd_ms"] = common.bench(lambda: torch_b(dy, y_torch, dim, dtype))
    prim["torch_fb_ms"] = common.bench(lambda: torch_b(dy, torch_f(x, dim), dim, dtype))
    del y_ours, y_torch

    xt, dyt = td.from_torch(x).requires_grad_(), td.from_torch(dy)
    xs = x.detach().requires_grad_()
    td_fwd = getattr(td.Tensor, op)
    yt, ys = td_fwd(xt, -1), torch_f(xs, -1)

    def td_bwd():
        xt.grad = None
        yt.backward(dyt, retain_graph=True)

    def td_fb():
        xt.grad = None
        td_fwd(xt, -1).backward(dyt)

    def torch_bwd():
        xs.grad = None
        ys.backward(dy, retain_graph=True)

    def torch_fb():
        xs.grad = None
        torch_f(xs, -1).backward(dy)

    auto = dict(base, path="autodiff")
    auto["td_fwd_ms"] = common.bench(lambda: td_fwd(xt, -1))
    auto["td_bwd_ms"] = common.bench(td_bwd)
    auto["td_fb_ms"] = common.bench(td_fb)
    auto["torch_fwd_ms"] = common.bench(lambda: torch_f(xs, -1))
    auto["torch_bwd_ms"] = common.bench(torch_bwd)
    auto["torch_fb_ms"] = common.bench(torch_fb)
    del yt, ys

    for row in (prim, auto):
        for part, times in (("fwd", 2), ("bwd", 3), ("fb", 5)):  # bytes moved = times * nbytes
            for who in ("td", "torch"):
                row[f"{who}_{part}_gbps"] = times * nbytes / row[f"{who}_{part}_ms"] / 1e6
            row[f"{part}_ratio"] = row[f"torch_{part}_ms"] / row[f"td_{part}_ms"]
    torch.cuda.empty_cache()
    return [prim, auto]


COLUMNS = [
    ("shape", "shape", "{}"), ("path", "tritonad path", "{}"),
    ("td_fwd_ms", "fwd ms", "{:.4f}"), ("torch_fwd_ms", "torch", "{:.4f}"),
    ("fwd_ratio", "ratio", "{:.2f}x"), ("td_fwd_gbps", "GB/s", "{:.0f}"),
    ("torch_fwd_gbps", "torch GB/s", "{:.0f}"),
    ("td_bwd_ms", "bwd ms", "{:.4f}"), ("torch_bwd_ms", "torch", "{:.4f}"),
    ("bwd_ratio", "ratio", "{:.2f}x"), ("td_bwd_gbps", "GB/s", "{:.0f}"),
    ("td_fb_ms", "fwd+bwd ms", "{:.4f}"), ("torch_fb_ms", "torch", "{:.4f}"),
    ("fb_ratio", "ratio", "{:.2f}x"), ("td_fb_gbps", "GB/s", "{:.0f}"),
]


def _extra(parser):
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    parser.add_argument("--op", choices=["softmax", "log_softmax"], default="softmax")
    parser.add_argument("--single-block-max", type=int, default=None,
                        help="override kernels.SINGLE_BLOCK_MAX (widest row held whole)")
    parser.add_argument("--loop-block", type=int, default=None,
                        help="override kernels.LOOP_BLOCK (columns per streamed step)")


def main(argv=None):
    args = common.parse_args(__doc__.splitlines()[0], argv, extra=_extra)
    common.require_gpu("bench_softmax")
    td.set_backend("triton")
    if args.single_block_max:
        kernels.SINGLE_BLOCK_MAX = args.single_block_max
    if args.loop_block:
        kernels.LOOP_BLOCK = args.loop_block
    dtype = DTYPES[args.dtype]
    rows = []
    for shape in QUICK_SHAPES if args.quick else SHAPES:
        print(f"measuring {args.op} {shape} {args.dtype} ...", flush=True)
        rows.extend(measure(shape, dtype, args.op))
    peak = common.copy_bandwidth()
    name = f"{args.op}_{args.dtype}"
    common.print_table(f"{args.op} along the last dim, {args.dtype} (GB/s = bytes moved / t: "
                       f"fwd 2, bwd 3, both 5 x numel x itemsize; device copy bandwidth "
                       f"{peak:.0f} GB/s; ratio = torch ms / tritonad ms)", rows, COLUMNS)
    meta = {"copy_bandwidth_gbps": peak, "op": args.op, "dtype": args.dtype,
            "single_block_max": kernels.SINGLE_BLOCK_MAX, "loop_block": kernels.LOOP_BLOCK,
            "bytes_moved": "fwd 2, bwd 3, fwd+bwd 5 x numel x itemsize"}
    path = common.save(args.out, name, rows, meta=meta)
    common.plot(args.out, name, [r for r in rows if r["path"] == "primitive"], x="numel",
                series=[("td_fwd_gbps", "tritonad fwd"), ("torch_fwd_gbps", "torch fwd"),
                        ("td_bwd_gbps", "tritonad bwd"), ("torch_bwd_gbps", "torch bwd")],
                xlabel="elements", ylabel="GB/s (bytes moved / t)",
                title=f"{args.op} {args.dtype}, primitive path (copy: {peak:.0f} GB/s)")
    print(f"\nwrote {path}")
    return rows


if __name__ == "__main__":
    main()
