"""Convolution: tritonad (im2col + matmul, implicit GEMM) against torch (cuDNN), same run.

    python benchmarks/bench_conv.py --out DIR [--quick] [--layers mnist-conv2,56x56-k3]

For each layer and precision (fp32 = IEEE float32 with cuDNN's TF32 off; tf32 = TF32 on both
sides) it times the forward, the backward (dx where the layer needs it, dw, db) and both, for
each of our two paths and for torch, and prints TFLOP/s and ratios (torch time / ours: above 1
means tritonad is faster).

    TFLOP/s = 2 * N * Co * Ho * Wo * (C / groups) * kh * kw * directions / t
    (directions: forward 1; backward 1 per gradient among dx, dw; the bias sum is not counted)

The im2col path's column buffer, N * (C*kh*kw + 1) * Ho*Wo elements, is reported in MB; the peak
memory allocated during a forward+backward is measured for every path.
"""
from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

# name, input shape, C_out, kernel, padding, input gradient wanted
LAYERS = [
    ("mnist-conv1", (100, 1, 28, 28), 32, 5, 2, False),   # the image needs no gradient
    ("mnist-conv1+dx", (100, 1, 28, 28), 32, 5, 2, True),
    ("mnist-conv2", (100, 32, 14, 14), 64, 5, 2, True),
    ("56x56-k3", (256, 64, 56, 56), 64, 3, 1, True),
    ("56x56-k5", (256, 64, 56, 56), 64, 5, 2, True),
]
QUICK = ("mnist-conv1", "mnist-conv2")
PRECISIONS = (("fp32", "highest"), ("tf32", "high"))
PATHS = ("implicit", "im2col")


def _set_precision(name):
    import tritonad as td

    tf32 = name == "tf32"
    torch.backends.cudnn.allow_tf32 = tf32
    torch.backends.cuda.matmul.allow_tf32 = tf32
    td.set_conv_precision("high" if tf32 else "highest")


def _problem(shape, co, k, pad, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.rand(shape, device="cuda", generator=gen) * 2 - 1
    w = (torch.rand((co, shape[1], k, k), device="cuda", generator=gen) * 2 - 1) / (
        shape[1] * k * k) ** 0.5
    b = torch.rand(co, device="cuda", generator=gen)
    ho = shape[2] + 2 * pad - k + 1
    wo = shape[3] + 2 * pad - k + 1
    dy = torch.rand((shape[0], co, ho, wo), device="cuda", generator=gen) * 2 - 1
    return x, w, b, dy


def _ours(x, w, b, dy, pad, need_dx):
    from tritonad.kernels import conv

    args = ((1, 1), (pad, pad), (1, 1))
    fwd = lambda: conv.conv2d(x, w, b, *args)  # noqa: E731
    bwd = lambda: conv.conv2d_backward(dy, x, w, *args, input_grad=need_dx)  # noqa: E731
    return fwd, bwd


def _torch(x, w, b, dy, pad, need_dx):
    # the raw ATen ops (no autograd bookkeeping), as our launchers are called
    fwd = lambda: torch.nn.functional.conv2d(x, w, b, 1, pad)  # noqa: E731
    bwd = lambda: torch.ops.aten.convolution_backward(  # noqa: E731
        dy, x, w, [w.shape[0]], [1, 1], [pad, pad], [1, 1], False, [0, 0], 1,
        [need_dx, True, True])
    return fwd, bwd


def _time(fwd, bwd):
    def both():
        fwd()
        bwd()
    return {"fwd": common.bench(fwd), "bwd": common.bench(bwd), "both": common.bench(both)}, \
        common.peak_memory(both)


def run_layer(name, shape, co, k, pad, need_dx, precision):
    from tritonad.kernels import conv

    _set_precision(precision)
    x, w, b, dy = _problem(shape, co, k, pad)
    n, c = shape[:2]
    ho, wo = dy.shape[2:]
    flop = 2 * n * co * ho * wo * c * k * k
    directions = {"fwd": 1, "bwd": 1 + int(need_dx), "both": 2 + int(need_dx)}
    torch_ms, torch_peak = _time(*_torch(x, w, b, dy, pad, need_dx))
    g = conv._Geometry("bench", shape, tuple(w.shape), 1, pad, 1, 1)
    rows = []
    saved = conv.CONV_ALGO
    try:
        conv.CONV_ALGO = "auto"  # what it runs for forward / input / weight
        picks = [conv._algorithm(d, g) if d != "input" or need_dx else None
                 for d in ("forward", "input", "weight")]
        mixed = len(set(picks) - {None}) > 1  # else "auto" is one of the paths timed anyway
        for path in PATHS + (("auto",) if mixed else ()):
            conv.CONV_ALGO = path
            ours_ms, ours_peak = _time(*_ours(x, w, b, dy, pad, need_dx))
            row = {"layer": name, "precision": precision, "path": path, "input_grad": need_dx,
                   "gflop_fwd": flop / 1e9, "peak_mb": ours_peak / 1e6,
                   "torch_peak_mb": torch_peak / 1e6,
                   "col_mb": n * (c * k * k + 1) * ho * wo * x.element_size() / 1e6
                   if path == "im2col" else 0.0}
            for d in ("fwd", "bwd", "both"):
                row[f"ms_{d}"] = ours_ms[d]
                row[f"torch_ms_{d}"] = torch_ms[d]
                row[f"tflops_{d}"] = flop * directions[d] / ours_ms[d] / 1e9
                row[f"torch_tflops_{d}"] = flop * directions[d] / torch_ms[d] / 1e9
                row[f"ratio_{d}"] = torch_ms[d] / ours_ms[d]
            rows.append(row)
        for row in rows:
            row["auto_picks"] = "/".join(p[:3] if p else "-" for p in picks)
    finally:
        conv.CONV_ALGO = saved
        _set_precision("fp32")
    return rows


COLUMNS = [("layer", "layer", "{}"), ("precision", "prec", "{}"), ("path", "path", "{}"),
           ("ms_fwd", "fwd ms", "{:.3f}"), ("torch_ms_fwd", "torch", "{:.3f}"),
           ("ratio_fwd", "x", "{:.2f}"),
           ("ms_bwd", "bwd ms", "{:.3f}"), ("torch_ms_bwd", "torch", "{:.3f}"),
           ("ratio_bwd", "x", "{:.2f}"),
           ("ms_both", "both ms", "{:.3f}"), ("torch_ms_both", "torch", "{:.3f}"),
           ("ratio_both", "x", "{:.2f}"),
           ("tflops_both", "TFLOP/s", "{:.1f}"), ("torch_tflops_both", "torch", "{:.1f}"),
           ("col_mb", "cols MB", "{:.0f}"), ("peak_mb", "peak MB", "{:.0f}"),
           ("torch_peak_mb", "torch", "{:.0f}"), ("auto_picks", "auto f/i/w", "{}")]


def main(argv=None):
    def extra(parser):
        parser.add_argument("--layers", default=None,
                            help="comma-separated layer names (default: all, or the MNIST "
                                 f"ones with --quick); known: {', '.join(l[0] for l in LAYERS)}")
    args = common.parse_args(__doc__.splitlines()[0], argv, extra)
    common.require_gpu("bench_conv")
    wanted = args.layers.split(",") if args.layers else (QUICK if args.quick else
                                                         [l[0] for l in LAYERS])
    unknown = set(wanted) - {l[0] for l in LAYERS}
    if unknown:
        raise SystemExit(f"bench_conv: unknown layers {sorted(unknown)}")
    rows = []
    for name, shape, co, k, pad, need_dx in LAYERS:
        if name not in wanted:
            continue
        for precision, _ in PRECISIONS:
            rows.extend(run_layer(name, shape, co, k, pad, need_dx, precision))
            print(f"  done {name} {precision}", flush=True)
    common.print_table("conv2d: tritonad vs torch (cuDNN); x = torch ms / tritonad ms", rows,
                       COLUMNS)
    path = common.save(args.out, "bench_conv", rows, meta={"formula": "TFLOP/s = 2*N*Co*Ho*Wo*"
                                                           "C*kh*kw*directions / t"})
    for row in rows:
        row["variant"] = f"{row['path']}-{row['precision']}"
    common.plot(args.out, "bench_conv", rows, "gflop_fwd", [("tflops_both", "tritonad"),
                                                            ("torch_tflops_both", "torch")],
                "GFLOP per direction", "TFLOP/s (forward + backward)", group="variant",
                title="conv2d forward+backward: tritonad vs torch (cuDNN)")
    print(f"\nwrote {path}")
    print(common.markdown_table(rows, COLUMNS))
    return rows


if __name__ == "__main__":
    main()
