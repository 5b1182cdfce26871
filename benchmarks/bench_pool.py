"""Pooling: tritonad max / average pooling against torch, forward, backward and both, same run.

    python benchmarks/bench_pool.py --out DIR [--quick]

GB/s counts the bytes each direction must move at least (s = element size, indices int64):
    max forward   x.numel()*s + y.numel()*(s + 8)      (read x, write y and the indices)
    max backward  y.numel()*(s + 8) + x.numel()*s      (read dy and the indices, write dx)
    avg forward   x.numel()*s + y.numel()*s;  avg backward  y.numel()*s + x.numel()*s
Ratios are torch time / tritonad time (above 1: tritonad is faster).
"""
from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

# name, input shape, kernel, stride, padding
SHAPES = [
    ("mnist-pool1", (100, 32, 28, 28), 2, 2, 0),
    ("mnist-pool2", (100, 64, 14, 14), 2, 2, 0),
    ("resnet-stem", (256, 64, 112, 112), 3, 2, 1),
]
QUICK = ("mnist-pool1", "mnist-pool2")


def _cases(x, k, s, p):
    """{op: (ours fwd, ours bwd, torch fwd, torch bwd, bytes fwd, bytes bwd)}."""
    from tritonad.kernels import pool

    kk, ss, pp = (k, k), (s, s), (p, p)
    y, idx = pool.max_pool2d(x, kk, ss, pp)
    _, tidx = torch.nn.functional.max_pool2d(x, k, s, p, return_indices=True)
    dy = torch.randn_like(y)
    size, big, small = x.element_size(), x.numel(), y.numel()
    avg_args = (kk, ss, pp, False, True, None)
    return {
        "max": (lambda: pool.max_pool2d(x, kk, ss, pp),
                lambda: pool.max_pool2d_backward(dy, idx, x.shape, kk, ss, pp),
                lambda: torch.nn.functional.max_pool2d(x, k, s, p, return_indices=True),
                lambda: torch.ops.aten.max_pool2d_with_indices_backward(
                    dy, x, kk, ss, pp, (1, 1), False, tidx),
                big * size + small * (size + 8), small * (size + 8) + big * size),
        "avg": (lambda: pool.avg_pool2d(x, *avg_args),
                lambda: pool.avg_pool2d_backward(dy, x.shape, *avg_args),
                lambda: torch.nn.functional.avg_pool2d(x, k, s, p),
                lambda: torch.ops.aten.avg_pool2d_backward(dy, x, kk, ss, pp, False, True, None),
                (big + small) * size, (big + small) * size),
    }


def run_shape(name, shape, k, s, p, dtype):
    x = torch.randn(shape, device="cuda", dtype=dtype)
    rows = []
    for op, (fwd, bwd, tfwd, tbwd, bytes_fwd, bytes_bwd) in _cases(x, k, s, p).items():
        def both(f=fwd, b=bwd):
            f()
            b()

        def tboth(f=tfwd, b=tbwd):
            f()
            b()
        row = {"shape": name, "op": op, "dtype": str(dtype).replace("torch.", ""),
               "elements": x.numel()}
        nbytes = {"fwd": bytes_fwd, "bwd": bytes_bwd, "both": bytes_fwd + bytes_bwd}
        for d, ours, theirs in (("fwd", fwd, tfwd), ("bwd", bwd, tbwd), ("both", both, tboth)):
            row[f"ms_{d}"] = common.bench(ours)
            row[f"torch_ms_{d}"] = common.bench(theirs)
            row[f"gbs_{d}"] = nbytes[d] / row[f"ms_{d}"] / 1e6
            row[f"torch_gbs_{d}"] = nbytes[d] / row[f"torch_ms_{d}"] / 1e6
            row[f"ratio_{d}"] = row[f"torch_ms_{d}"] / row[f"ms_{d}"]
        rows.append(row)
    return rows


COLUMNS = [("shape", "shape", "{}"), ("op", "op", "{}"), ("dtype", "dtype", "{}"),
           ("ms_fwd", "fwd ms", "{:.4f}"), ("torch_ms_fwd", "torch", "{:.4f}"),
           ("ratio_fwd", "x", "{:.2f}"), ("gbs_fwd", "GB/s", "{:.0f}"),
           ("ms_bwd", "bwd ms", "{:.4f}"), ("torch_ms_bwd", "torch", "{:.4f}"),
           ("ratio_bwd", "x", "{:.2f}"), ("gbs_bwd", "GB/s", "{:.0f}"),
           ("ms_both", "both ms", "{:.4f}"), ("torch_ms_both", "torch", "{:.4f}"),
           ("ratio_both", "x", "{:.2f}"), ("torch_gbs_both", "torch GB/s", "{:.0f}")]


def main(argv=None):
    args = common.parse_args(__doc__.splitlines()[0], argv)
    common.require_gpu("bench_pool")
    dtypes = (torch.float32,) if args.quick else (torch.float32, torch.bfloat16)
    rows = []
    for name, shape, k, s, p in SHAPES:
        if args.quick and name not in QUICK:
            continue
        for dtype in dtypes:
            rows.extend(run_shape(name, shape, k, s, p, dtype))
    copy = common.copy_bandwidth()
    common.print_table(f"pooling: tritonad vs torch (device copy bandwidth {copy:.0f} GB/s); "
                       "x = torch ms / tritonad ms", rows, COLUMNS)
    path = common.save(args.out, "bench_pool", rows, meta={"copy_gbs": copy, "formula": __doc__})
    for row in rows:
        row["variant"] = f"{row['op']}-{row['dtype']}"
    common.plot(args.out, "bench_pool", rows, "elements", [("gbs_both", "tritonad"),
                                                           ("torch_gbs_both", "torch")],
                "input elements", "GB/s (forward + backward)", group="variant",
                title="pooling forward+backward: tritonad vs torch")
    print(f"\nwrote {path}")
    print(common.markdown_table(rows, COLUMNS))
    return rows


if __name__ == "__main__":
    main()
