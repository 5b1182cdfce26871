"""Softmax cross-entropy: tritonad's one-pass fused kernel against torch's
F.cross_entropy on the same GPU in the same run: forward, backward, both, and peak memory.

    python benchmarks/bench_cross_entropy.py --out bench-results [--quick] [--dtype float32]
        [--reduction mean] [--label-smoothing 0.0] [--single-block-max N] [--loop-block N]

Two tritonad paths, each labelled in the table:
- "autodiff": x = td.from_torch(logits).requires_grad_(); loss = F.cross_entropy(x, target);
  loss.backward(), against torch autograd doing the same. Our forward already writes the
  gradient, so our "backward" only hands it over (no kernel).
- "primitive": tritonad.kernels.softmax.cross_entropy on raw torch tensors: "fwd" is the loss
  alone (compute_grad=False; torch: F.cross_entropy under no_grad), "fwd+bwd" the loss and
  the gradient (torch: autograd forward + backward); there is no separate backward.
Metric: GB/s = bytes moved / t at the minimum traffic: the loss reads the logits once
(N * C * itemsize); loss + gradient also writes the gradient once (2 * N * C * itemsize).
Timings: triton.testing.do_bench medians (L2 flushed; GPU time between events). Small shapes
are launch-bound, so "wall" also gives host wall-clock ms per call of a loop of calls (the rate
a training loop sees). Peak memory: bytes allocated above the inputs during forward + backward
(the gradient included). Ratios are torch / tritonad: above 1, tritonad is faster (smaller).
"""
from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

import tritonad as td  # noqa: E402
import tritonad.nn.functional as F  # noqa: E402
from tritonad.kernels import softmax as kernels  # noqa: E402

torch_ce = torch.nn.functional.cross_entropy
SHAPES = [(128, 10), (1024, 10), (1024, 1000), (8192, 1000), (4096, 32000), (2048, 50257),
          (4096, 65536), (8192, 128256)]
QUICK_SHAPES = [(128, 10), (4096, 32000), (8192, 128256)]
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
WALL_BELOW = 1 << 22  # numel under which the wall-clock loop is also timed


def wall_ms(fn, iters=300):
    """Host wall-clock ms per call of fn() called back to back (after a warm-up)."""
    return common.per_call_us(fn, iters) / 1e3


def measure(shape, dtype, reduction, smoothing):
    """Two rows (autodiff, primitive) of timings and peak memory for one shape."""
    n, c = shape
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = (torch.randn(shape, device="cuda", generator=gen) * 4).to(dtype)
    t = torch.randint(0, c, (n,), device="cuda", generator=gen)
    nbytes = x.numel() * x.element_size()
    opts = {"reduction": reduction, "label_smoothing": smoothing}
    base = {"shape": f"{n}x{c}", "numel": x.numel(), "dtype": str(dtype)[6:]}
    small = x.numel() < WALL_BELOW

    # autodiff path: the figures that matter for training
    xt, tt = td.from_torch(x).requires_grad_(), td.from_torch(t)
    xs = x.detach().requires_grad_()

    def td_fb():
        xt.grad = None
        loss = F.cross_entropy(xt, tt, **opts)
        (loss if reduction != "none" else loss.sum()).backward()

    def torch_fb():
        xs.grad = None
        loss = torch_ce(xs, t, **opts)
        (loss if reduction != "none" else loss.sum()).backward()

    td_loss = F.cross_entropy(xt, tt, **opts)
    torch_loss = torch_ce(xs, t, **opts)
    td_seed = td.from_torch(torch.ones_like(td_loss._data))
    torch_seed = torch.ones_like(torch_loss)

    def td_bwd():
        xt.grad = None
        td_loss.backward(td_seed if reduction == "none" else None, retain_graph=True)

    def torch_bwd():
        xs.grad = None
        torch_loss.backward(torch_seed, retain_graph=True)

    auto = dict(base, path="autodiff")
    auto["td_fwd_ms"] = common.bench(lambda: F.cross_entropy(xt, tt, **opts))
    auto["td_bwd_ms"] = common.bench(td_bwd)
    auto["td_fb_ms"] = common.bench(td_fb)
    auto["torch_fwd_ms"] = common.bench(lambda: torch_ce(xs, t, **opts))
    auto["torch_bwd_ms"] = common.bench(torch_bwd)
    auto["torch_fb_ms"] = common.bench(torch_fb)
    if small:
        auto["td_fb_wall_ms"], auto["torch_fb_wall_ms"] = wall_ms(td_fb), wall_ms(torch_fb)
    del td_loss, torch_loss
    xt.grad = xs.grad = None
    auto["td_peak_mb"] = common.peak_memory(td_fb) / 2**20
    xt.grad = xs.grad = None
    auto["torch_peak_mb"] = common.peak_memory(torch_fb) / 2**20
    xt.grad = xs.grad = None

    # primitive path: the kernel alone on raw arrays
    prim = dict(base, path="primitive")
    with torch.no_grad():
        prim["td_fwd_ms"] = common.bench(
            lambda: kernels.cross_entropy(x, t, reduction, -100, smoothing, compute_grad=False))
        prim["torch_fwd_ms"] = common.bench(lambda: torch_ce(x, t, **opts))
    prim["td_fb_ms"] = common.bench(lambda: kernels.cross_entropy(x, t, reduction, -100,
                                                                  smoothing))
    prim["torch_fb_ms"] = auto["torch_fb_ms"]
    if small:
        prim["td_fb_wall_ms"] = wall_ms(lambda: kernels.cross_entropy(x, t, reduction, -100,
                                                                      smoothing))
        prim["torch_fb_wall_ms"] = auto["torch_fb_wall_ms"]
    prim["td_peak_mb"] = common.peak_memory(
        lambda: kernels.cross_entropy(x, t, reduction, -100, smoothing)) / 2**20
    prim["torch_peak_mb"] = auto["torch_peak_mb"]

    for row in (auto, prim):
        row["td_fwd_gbps"] = (nbytes if row is prim else 2 * nbytes) / row["td_fwd_ms"] / 1e6
        row["td_fb_gbps"] = 2 * nbytes / row["td_fb_ms"] / 1e6   # read logits + write gradient
        row["torch_fb_gbps"] = 2 * nbytes / row["torch_fb_ms"] / 1e6
        for part in ("fwd", "bwd", "fb", "fb_wall"):
            if row.get(f"td_{part}_ms") and row.get(f"torch_{part}_ms"):
                row[f"{part}_ratio"] = row[f"torch_{part}_ms"] / row[f"td_{part}_ms"]
        row["mem_ratio"] = row["td_peak_mb"] / row["torch_peak_mb"]
    torch.cuda.empty_cache()
    return [auto, prim]


COLUMNS = [
    ("shape", "N x C", "{}"), ("path", "tritonad path", "{}"),
    ("td_fwd_ms", "fwd ms", "{:.4f}"), ("torch_fwd_ms", "torch", "{:.4f}"),
    ("fwd_ratio", "ratio", "{:.2f}x"),
    ("td_bwd_ms", "bwd ms", "{:.4f}"), ("torch_bwd_ms", "torch", "{:.4f}"),
    ("bwd_ratio", "ratio", "{:.2f}x"),
    ("td_fb_ms", "fwd+bwd ms", "{:.4f}"), ("torch_fb_ms", "torch", "{:.4f}"),
    ("fb_ratio", "ratio", "{:.2f}x"), ("td_fb_gbps", "GB/s", "{:.0f}"),
    ("torch_fb_gbps", "torch GB/s", "{:.0f}"),
    ("td_fb_wall_ms", "wall ms", "{:.4f}"), ("torch_fb_wall_ms", "torch", "{:.4f}"),
    ("fb_wall_ratio", "ratio", "{:.2f}x"),
    ("td_peak_mb", "peak MB", "{:.1f}"), ("torch_peak_mb", "torch", "{:.1f}"),
    ("mem_ratio", "td/torch", "{:.2f}"),
]


def _extra(parser):
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    parser.add_argument("--reduction", choices=["mean", "sum", "none"], default="mean")
    parser.add_argument("--label-smoothing", type=float, default=0.0)
    parser.add_argument("--single-block-max", type=int, default=None,
                        help="override kernels.SINGLE_BLOCK_MAX (widest row held whole)")
    parser.add_argument("--loop-block", type=int, default=None,
                        help="override kernels.LOOP_BLOCK (columns per streamed step)")


def main(argv=None):
    args = common.parse_args(__doc__.splitlines()[0], argv, extra=_extra)
    common.require_gpu("bench_cross_entropy")
    td.set_backend("triton")
    if args.single_block_max:
        kernels.SINGLE_BLOCK_MAX = args.single_block_max
    if args.loop_block:
        kernels.LOOP_BLOCK = args.loop_block
    dtype = DTYPES[args.dtype]
    rows = []
    for shape in QUICK_SHAPES if args.quick else SHAPES:
        print(f"measuring cross-entropy {shape} {args.dtype} ...", flush=True)
        rows.extend(measure(shape, dtype, args.reduction, args.label_smoothing))
    peak = common.copy_bandwidth()
    name = f"cross_entropy_{args.dtype}"
    common.print_table(
        f"cross-entropy, {args.dtype}, reduction={args.reduction}, label_smoothing="
        f"{args.label_smoothing} (GB/s = 2 x N x C x itemsize / t: one read of the logits, one "
        f"write of the gradient; device copy bandwidth {peak:.0f} GB/s; ratio = torch / "
        f"tritonad; primitive fwd = loss only)", rows, COLUMNS)
    meta = {"copy_bandwidth_gbps": peak, "dtype": args.dtype, "reduction": args.reduction,
            "label_smoothing": args.label_smoothing,
            "single_block_max": kernels.SINGLE_BLOCK_MAX, "loop_block": kernels.LOOP_BLOCK,
            "bytes_moved": "fwd+bwd: 2 x N x C x itemsize (read logits, write gradient)"}
    path = common.save(args.out, name, rows, meta=meta)
    common.plot(args.out, name, [r for r in rows if r["path"] == "autodiff"], x="numel",
                series=[("td_fb_gbps", "tritonad fwd+bwd"), ("torch_fb_gbps", "torch fwd+bwd")],
                xlabel="N x C", ylabel="GB/s (2 x N x C x itemsize / t)",
                title=f"cross-entropy {args.dtype}, autodiff path (copy: {peak:.0f} GB/s)")
    print(f"\nwrote {path}")
    return rows


if __name__ == "__main__":
    main()
