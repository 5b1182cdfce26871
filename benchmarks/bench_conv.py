"""Convolution: tritonad (im2col + matmul, implicit GEMM) against torch (cuDNN), same run.

    python benchmarks/bench_conv.py --out DIR [--quick] [--layers mnist-conv2,56x56-k3]
                                    [--precisions fp32,tf32,bf16,fp16]

For each layer and precision (fp32 = float32 accuracy: ours 3xTF32, cuDNN IEEE float32 with
TF32 off; tf32 = TF32 on both sides; bf16 / fp16 = half inputs, float32 accumulation) it
times each direction on its own (fwd; dx = the input gradient; dw = the weight and bias
gradients), the whole backward and forward + backward, for each of our two paths and for
torch, and prints ms and ratios (torch time / ours: above 1 means tritonad is faster). Times
are kernel time (CUDA events around back-to-back calls, L2 flushed between: host time hides
behind the GPU's at these sizes).

    TFLOP/s = 2 * N * Co * Ho * Wo * (C / groups) * kh * kw * directions / t
    (directions: forward 1; backward 1 per gradient among dx, dw; the bias sum is not counted)

The im2col path's column buffer, N * (C*kh*kw + 1) * Ho*Wo elements, is reported in MB; the peak
memory allocated during a forward+backward is measured for every path.
"""
from __future__ import annotations

import dataclasses
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
    ("56x56-k3", (256, 64, 56, 56), 64, 3, 1, True),    # ResNet-style 3x3 layers
    ("28x28-k3", (256, 128, 28, 28), 128, 3, 1, True),
    ("14x14-k3", (256, 256, 14, 14), 256, 3, 1, True),
    ("56x56-k5", (256, 64, 56, 56), 64, 5, 2, True),
]
QUICK = ("mnist-conv1", "mnist-conv2")
PRECISIONS = ("fp32", "tf32", "bf16", "fp16")
DEFAULT_PRECISIONS = ("fp32", "tf32", "bf16")  # (fp16 on request: it runs as bf16 does)
QUICK_PRECISIONS = ("fp32", "tf32")
PATHS = ("implicit", "im2col")
DIRECTIONS = ("fwd", "dx", "dw", "bwd", "both")


def _set_precision(name):
    import tritonad as td

    tf32 = name == "tf32"
    torch.backends.cudnn.allow_tf32 = tf32
    torch.backends.cuda.matmul.allow_tf32 = tf32
    td.set_conv_precision("highest" if name == "fp32" else "high")


def _problem(shape, co, k, pad, precision, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision, torch.float32)
    x = torch.rand(shape, device="cuda", generator=gen) * 2 - 1
    w = (torch.rand((co, shape[1], k, k), device="cuda", generator=gen) * 2 - 1) / (
        shape[1] * k * k) ** 0.5
    b = torch.rand(co, device="cuda", generator=gen)
    ho = shape[2] + 2 * pad - k + 1
    wo = shape[3] + 2 * pad - k + 1
    dy = torch.rand((shape[0], co, ho, wo), device="cuda", generator=gen) * 2 - 1
    return tuple(t.to(dtype) for t in (x, w, b, dy))


def _ours(x, w, b, dy, pad, need_dx):
    from tritonad.kernels import conv

    args = ((1, 1), (pad, pad), (1, 1))
    return {
        "fwd": lambda: conv.conv2d(x, w, b, *args),
        "dx": lambda: conv.conv2d_backward(dy, x, w, *args, input_grad=True, weight_grad=False,
                                           bias_grad=False),
        "dw": lambda: conv.conv2d_backward(dy, x, w, *args, input_grad=False),
        "bwd": lambda: conv.conv2d_backward(dy, x, w, *args, input_grad=need_dx),
    }


def _torch(x, w, b, dy, pad, need_dx):
    # the raw ATen ops (no autograd bookkeeping), as our launchers are called
    def backward(mask):
        return lambda: torch.ops.aten.convolution_backward(
            dy, x, w, [w.shape[0]], [1, 1], [pad, pad], [1, 1], False, [0, 0], 1, mask)

    return {"fwd": lambda: torch.nn.functional.conv2d(x, w, b, 1, pad),
            "dx": backward([True, False, False]), "dw": backward([False, True, True]),
            "bwd": backward([need_dx, True, True])}


def _time(fns, need_dx):
    def both():
        fns["fwd"]()
        fns["bwd"]()
    ms = {d: common.bench(fns[d]) for d in ("fwd", "dw", "bwd")}
    ms["dx"] = common.bench(fns["dx"]) if need_dx else float("nan")
    ms["both"] = common.bench(both)
    return ms, common.peak_memory(both)


def run_layer(name, shape, co, k, pad, need_dx, precision):
    from tritonad.kernels import conv
    from tritonad.kernels.conv import routing

    _set_precision(precision)
    x, w, b, dy = _problem(shape, co, k, pad, precision)
    n, c = shape[:2]
    ho, wo = dy.shape[2:]
    flop = 2 * n * co * ho * wo * c * k * k
    directions = {"fwd": 1, "dx": 1, "dw": 1, "bwd": 1 + int(need_dx), "both": 2 + int(need_dx)}
    torch_ms, torch_peak = _time(_torch(x, w, b, dy, pad, need_dx), need_dx)
    g = conv.Geometry("bench", shape, tuple(w.shape), 1, pad, 1, 1)
    rows = []
    try:
        # what "auto" runs for forward / input / weight
        auto = dataclasses.replace(conv.current_settings(), algo="auto")
        picks = [routing.layer_algorithm(d, g, auto) if d != "input" or need_dx else None
                 for d in ("forward", "input", "weight")]
        mixed = len(set(picks) - {None}) > 1  # else "auto" is one of the paths timed anyway
        for path in PATHS + (("auto",) if mixed else ()):
            with conv.using(algo=path):
                ours_ms, ours_peak = _time(_ours(x, w, b, dy, pad, need_dx), need_dx)
            row = {"layer": name, "precision": precision, "path": path, "input_grad": need_dx,
                   "gflop_fwd": flop / 1e9, "peak_mb": ours_peak / 1e6,
                   "torch_peak_mb": torch_peak / 1e6,
                   "col_mb": n * (c * k * k + 1) * ho * wo * x.element_size() / 1e6
                   if path == "im2col" else 0.0}
            for d in DIRECTIONS:
                row[f"ms_{d}"] = ours_ms[d]
                row[f"torch_ms_{d}"] = torch_ms[d]
                row[f"tflops_{d}"] = flop * directions[d] / ours_ms[d] / 1e9
                row[f"torch_tflops_{d}"] = flop * directions[d] / torch_ms[d] / 1e9
                row[f"ratio_{d}"] = torch_ms[d] / ours_ms[d]
            rows.append(row)
        for row in rows:
            row["auto_picks"] = "/".join(p[:3] if p else "-" for p in picks)
    finally:
        _set_precision("fp32")
    return rows


COLUMNS = [("layer", "layer", "{}"), ("precision", "prec", "{}"), ("path", "path", "{}")] + [
    column for d in ("fwd", "dx", "dw", "bwd", "both")
    for column in ((f"ms_{d}", f"{d} ms", "{:.3f}"), (f"torch_ms_{d}", "torch", "{:.3f}"),
                   (f"ratio_{d}", "x", "{:.2f}"))] + [
    ("tflops_both", "TFLOP/s", "{:.1f}"), ("torch_tflops_both", "torch", "{:.1f}"),
    ("col_mb", "cols MB", "{:.0f}"), ("peak_mb", "peak MB", "{:.0f}"),
    ("torch_peak_mb", "torch", "{:.0f}"), ("auto_picks", "auto f/i/w", "{}")]


def main(argv=None):
    def extra(parser):
        parser.add_argument("--layers", default=None,
                            help="comma-separated layer names (default: all, or the MNIST "
                                 f"ones with --quick); known: {', '.join(l[0] for l in LAYERS)}")
        parser.add_argument("--precisions", default=None,
                            help=f"comma-separated, of {','.join(PRECISIONS)} (default: "
                                 f"{','.join(DEFAULT_PRECISIONS)}, or "
                                 f"{','.join(QUICK_PRECISIONS)} with --quick)")
    args = common.parse_args(__doc__.splitlines()[0], argv, extra)
    common.require_gpu("bench_conv")
    wanted = args.layers.split(",") if args.layers else (QUICK if args.quick else
                                                         [l[0] for l in LAYERS])
    precisions = args.precisions.split(",") if args.precisions else \
        (QUICK_PRECISIONS if args.quick else DEFAULT_PRECISIONS)
    unknown = set(wanted) - {l[0] for l in LAYERS}
    unknown |= set(precisions) - set(PRECISIONS)
    if unknown:
        raise SystemExit(f"bench_conv: unknown layers or precisions {sorted(unknown)}")
    rows = []
    for name, shape, co, k, pad, need_dx in LAYERS:
        if name not in wanted:
            continue
        for precision in precisions:
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
