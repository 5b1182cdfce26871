"""Normalisation: tritonad's fused kernels against PyTorch on the same GPU in the same run.

    python benchmarks/bench_norms.py --out bench-results [--quick] [--case ln|rms|bn|bn-gelu]
        [--variant default|default,row_tile=8192/half_depth=1]

Cases (each forward, and forward + backward of the input, weight and bias gradients):
- ln:      F.layer_norm at [16384, 384] and [8192, 4096], fp32 and bf16, against torch's
           F.layer_norm;
- rms:     F.rms_norm, same shapes, against torch's F.rms_norm and against the composite that
           models write (LlamaRMSNorm: x * rsqrt(mean(x^2) + eps) * w, in float32 for bf16);
- bn:      nn.BatchNorm2d training at [512, 128, 14, 14] and [512, 256, 7, 7], fp32 NCHW and
           bf16 channels-last (float32 parameters), against torch's (cuDNN);
- bn-gelu: the same with GELU fused (ours: one node), against torch's BatchNorm2d then GELU.
Kernel time: the call captured once in a CUDA graph and replayed under
triton.testing.do_bench (median, L2 flushed between replays): the GPU time of all its kernels,
no host time, the same for both sides (where a capture fails, the eager call is timed instead and
the row says so). Eager: microseconds per call of the same call in a loop, host time included.
GB/s at the minimum traffic: forward reads x and writes y (2 x numel x itemsize), forward +
backward also reads x and dy and writes dx (5 x). Ratio = torch time / tritonad time.
Targets (H200): ln, rms >= 1.5x torch (>= 2x its composite); bn >= 1.2x cuDNN; bn-gelu >= 1.5x.
--variant default,row_tile=8192 times tritonad's kernels under each settings variant
(kernels/norm_common.py's NormSettings: "default", or fields changed with slashes between them,
row_programs_per_sm=2/bn_tile=8192) in the same run, one row each. Every tritonad row's ratios
are against the torch rows of its case (rms: "vs composite" against the composite).
"""
from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

import tritonad as td  # noqa: E402
import tritonad.nn.functional as F  # noqa: E402
from tritonad import nn  # noqa: E402
from tritonad.kernels import norm_common  # noqa: E402

ROW_SHAPES = [(16384, 384), (8192, 4096)]
BN_SHAPES = [(512, 128, 14, 14), (512, 256, 7, 7)]
QUICK_ROW_SHAPES = [(16384, 384)]
QUICK_BN_SHAPES = [(512, 256, 7, 7)]
CASES = ("ln", "rms", "bn", "bn-gelu")
TF = torch.nn.functional
DEVICE = "cuda"


def graph_time(fn):
    """(ms, method): fn captured in a CUDA graph, the replay timed by common.bench; the eager
    call timed where capture fails."""
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                fn()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        torch.cuda.synchronize()
        return common.bench(graph.replay), "graph"
    except Exception as error:  # (a capture the allocator or a kernel refuses)
        torch.cuda.synchronize()
        print(f"  (capture failed: {type(error).__name__}: {str(error)[:100]}; eager timing)")
        return common.bench(fn), "eager"


def _steps(forward, leaves, dy):
    """(forward only, forward + backward) callables over `leaves` (their grads reset)."""
    def fwd():
        return forward()

    def fwd_bwd():
        for t in leaves:
            t.grad = None
        forward().backward(dy)
    return fwd, fwd_bwd


def _row_cases(case, shape, dtype):
    """{label: (fwd, fwd_bwd)} for tritonad and the torch sides of a row-norm case."""
    rows, cols = shape
    gen = torch.Generator(device=DEVICE).manual_seed(0)
    x = torch.randn(shape, device=DEVICE, generator=gen).to(dtype)
    w = (1 + 0.1 * torch.randn(cols, device=DEVICE, generator=gen)).to(dtype)
    b = (0.1 * torch.randn(cols, device=DEVICE, generator=gen)).to(dtype)
    dy = torch.randn(shape, device=DEVICE, generator=gen).to(dtype)
    xt, wt, bt = (td.from_torch(a.clone()).requires_grad_() for a in (x, w, b))
    dyt = td.from_torch(dy)
    xs, ws, bs = (a.clone().requires_grad_() for a in (x, w, b))
    eps = 1e-6
    if case == "ln":
        ours = lambda: F.layer_norm(xt, (cols,), wt, bt, eps)  # noqa: E731
        theirs = {"torch": lambda: TF.layer_norm(xs, (cols,), ws, bs, eps)}
        leaves_td, leaves_pt = (xt, wt, bt), (xs, ws, bs)
    else:
        def llama(x=xs, w=ws):
            h = x.float()
            h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
            return w * h.to(x.dtype)
        ours = lambda: F.rms_norm(xt, (cols,), wt, eps)  # noqa: E731
        theirs = {"torch": lambda: TF.rms_norm(xs, (cols,), ws, eps), "torch composite": llama}
        leaves_td, leaves_pt = (xt, wt), (xs, ws)
    sides = {"tritonad": _steps(ours, leaves_td, dyt)}
    for label, fn in theirs.items():
        sides[label] = _steps(fn, leaves_pt, dy)
    return sides, x.numel() * x.element_size()


def _bn_cases(case, shape, dtype, channels_last):
    gen = torch.Generator(device=DEVICE).manual_seed(0)
    x = torch.randn(shape, device=DEVICE, generator=gen).to(dtype)
    dy = torch.randn(shape, device=DEVICE, generator=gen).to(dtype)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
        dy = dy.contiguous(memory_format=torch.channels_last)
    channels = shape[1]
    ours = nn.BatchNorm2d(channels).to(DEVICE)
    theirs = torch.nn.BatchNorm2d(channels).to(DEVICE)
    xt, dyt = td.from_torch(x.clone()).requires_grad_(), td.from_torch(dy)
    xs = x.clone().requires_grad_()
    gelu = case == "bn-gelu"
    forward_td = (lambda: ours(xt, activation="gelu")) if gelu else (lambda: ours(xt))
    forward_pt = (lambda: TF.gelu(theirs(xs))) if gelu else (lambda: theirs(xs))
    sides = {"tritonad": _steps(forward_td, (xt, ours.weight, ours.bias), dyt),
             "torch": _steps(forward_pt, (xs, theirs.weight, theirs.bias), dy)}
    return sides, x.numel() * x.element_size()


def _time(fwd, fwd_bwd, nbytes, row):
    with td.no_grad(), torch.no_grad():
        row["fwd_ms"], method_f = graph_time(fwd)
    row["fb_ms"], method_fb = graph_time(fwd_bwd)
    row["timing"] = method_f if method_f == method_fb else f"{method_f}/{method_fb}"
    row["fb_eager_us"] = common.per_call_us(fwd_bwd, 50)
    row["fwd_gbps"] = 2 * nbytes / row["fwd_ms"] / 1e6
    row["fb_gbps"] = 5 * nbytes / row["fb_ms"] / 1e6
    return row


def _settings(variant):
    """NormSettings changes of a --variant item: "default", or key=value items between
    slashes."""
    if variant == "default":
        return {}
    items = variant.split("/")
    if not all("=" in item for item in items):
        raise SystemExit(f"bench_norms: a --variant item is 'default' or key=value items "
                         f"between slashes, got {variant!r}")
    changes = dict(item.split("=", 1) for item in items)
    norm_common.NormSettings.parse(",".join(f"{k}={v}" for k, v in changes.items()))
    return changes


def measure(case, shape, dtype, layout="", variants=("default",)):
    """Rows of one case: the torch sides, then tritonad under each settings variant (its ratios
    against torch's rows)."""
    if case in ("ln", "rms"):
        sides, nbytes = _row_cases(case, shape, dtype)
    else:
        sides, nbytes = _bn_cases(case, shape, dtype, layout == "channels_last")
    base = {"case": case, "shape": "x".join(map(str, shape)), "dtype": str(dtype)[6:],
            "layout": layout}
    rows, theirs = [], {}
    for label, (fwd, fwd_bwd) in sides.items():
        if label != "tritonad":
            theirs[label] = _time(fwd, fwd_bwd, nbytes, dict(base, impl=label))
            rows.append(theirs[label])
    fwd, fwd_bwd = sides["tritonad"]
    for variant in variants:
        with norm_common.using(**_settings(variant)):
            row = _time(fwd, fwd_bwd, nbytes, dict(base, impl=f"tritonad ({variant})"))
        torch_row = theirs["torch"]
        row["fwd_ratio"] = torch_row["fwd_ms"] / row["fwd_ms"]
        row["fb_ratio"] = torch_row["fb_ms"] / row["fb_ms"]
        row["eager_ratio"] = torch_row["fb_eager_us"] / row["fb_eager_us"]
        if "torch composite" in theirs:
            row["fb_ratio_composite"] = theirs["torch composite"]["fb_ms"] / row["fb_ms"]
        rows.append(row)
    torch.cuda.empty_cache()
    return rows


COLUMNS = [
    ("case", "case", "{}"), ("shape", "shape", "{}"), ("dtype", "dtype", "{}"),
    ("layout", "layout", "{}"), ("impl", "implementation", "{}"),
    ("fwd_ms", "fwd ms", "{:.4f}"), ("fwd_gbps", "GB/s", "{:.0f}"),
    ("fwd_ratio", "ratio", "{:.2f}x"),
    ("fb_ms", "fwd+bwd ms", "{:.4f}"), ("fb_gbps", "GB/s", "{:.0f}"),
    ("fb_ratio", "ratio", "{:.2f}x"), ("fb_ratio_composite", "vs composite", "{:.2f}x"),
    ("fb_eager_us", "eager fwd+bwd us", "{:.1f}"), ("eager_ratio", "ratio", "{:.2f}x"),
    ("timing", "timing", "{}"),
]


def _extra(parser):
    parser.add_argument("--case", choices=CASES + ("all",), default="all")
    parser.add_argument("--variant", default="default",
                        help="tritonad settings variants to time, comma-separated: default, "
                             "key=value/key=value (NormSettings fields)")


def _plan(args):
    """[(case, shape, dtype, layout)] to measure."""
    cases = CASES if args.case == "all" else (args.case,)
    plan = []
    for case in cases:
        if case in ("ln", "rms"):
            for shape in QUICK_ROW_SHAPES if args.quick else ROW_SHAPES:
                for dtype in (torch.float32, torch.bfloat16):
                    plan.append((case, shape, dtype, ""))
        else:
            for shape in QUICK_BN_SHAPES if args.quick else BN_SHAPES:
                plan.append((case, shape, torch.float32, "nchw"))
                plan.append((case, shape, torch.bfloat16, "channels_last"))
    return plan


def main(argv=None):
    args = common.parse_args(__doc__.splitlines()[0], argv, extra=_extra)
    plan = _plan(args)
    variants = tuple(v.strip() for v in args.variant.split(",") if v.strip())
    for v in variants:
        _settings(v)  # (an unknown variant or setting stops here, before any timing)
    common.require_gpu("bench_norms")
    td.set_backend("triton")
    rows = []
    for case, shape, dtype, layout in plan:
        print(f"measuring {case} {shape} {str(dtype)[6:]} {layout} ...", flush=True)
        rows.extend(measure(case, shape, dtype, layout, variants))
    peak = common.copy_bandwidth()
    common.print_table(f"normalisation (kernel time: CUDA graph replay, L2 flushed; GB/s = "
                       f"bytes moved / t: fwd 2, fwd+bwd 5 x numel x itemsize; device copy "
                       f"bandwidth {peak:.0f} GB/s; ratio = torch / tritonad)", rows, COLUMNS)
    meta = {"copy_bandwidth_gbps": peak, "bytes_moved": "fwd 2, fwd+bwd 5 x numel x itemsize",
            "norm_settings": str(norm_common.settings()), "variants": list(variants),
            "timing": "CUDA graph replay under do_bench (median, L2 flushed); eager: per call"}
    path = common.save(args.out, "norms", rows, meta=meta)
    print(f"\nwrote {path}")
    return rows


if __name__ == "__main__":
    main()
