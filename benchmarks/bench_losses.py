"""The losses, similarity and distance of autodiff/losses.py (composites of our kernels) against
PyTorch's on the same GPU in the same run: forward, forward + backward, and the eager per-call
time of forward + backward at a small size (where the host's work per call is what counts).

    python benchmarks/bench_losses.py --out bench-results [--quick] [--dtype float32|bfloat16]
        [--only bce_with_logits,cross_entropy_weighted]

Both sides run through their autodiff: the input that takes a gradient is a leaf, the forward
records the graph, backward() writes its .grad (set to None before each call). Timings are
triton.testing.do_bench medians (L2 flushed); ratio = PyTorch ms / tritonad ms (above 1:
tritonad is faster). GB/s = (bytes of every input read once + the gradient written once) /
fwd+bwd time: the least traffic any implementation needs, so a fused kernel approaches the
copy bandwidth and a composite of many passes shows how far it is from it.
"""
from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

import tritonad as td  # noqa: E402
import tritonad.nn.functional as F  # noqa: E402

TF = torch.nn.functional
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def _probs(shape, dim, gen, dtype):
    return torch.randn(shape, device="cuda", generator=gen).softmax(dim).to(dtype)


def _targets(shape, classes, gen):
    return torch.randint(0, classes, shape, device="cuda", generator=gen)


# name -> (big shape, quick shape, small shape (per-call), make(shape, dtype, gen) -> inputs
# (the first takes the gradient), ours(*inputs), theirs(*inputs))
CASES = {
    "bce_with_logits": (
        (65536, 80), (8192, 80), (64, 10),
        lambda s, dt, g: [torch.randn(s, device="cuda", generator=g).mul(4).to(dt),
                          (torch.rand(s, device="cuda", generator=g) < 0.3).to(dt),
                          torch.rand(s[-1:], device="cuda", generator=g).mul(3).to(dt)],
        lambda x, t, p: F.binary_cross_entropy_with_logits(x, t, pos_weight=p),
        lambda x, t, p: TF.binary_cross_entropy_with_logits(x, t, pos_weight=p)),
    "bce": (
        (65536, 80), (8192, 80), (64, 10),
        lambda s, dt, g: [torch.rand(s, device="cuda", generator=g).to(dt),
                          torch.rand(s, device="cuda", generator=g).to(dt)],
        F.binary_cross_entropy, TF.binary_cross_entropy),
    "l1": (
        (1 << 24,), (1 << 20,), (640,),
        lambda s, dt, g: [torch.randn(s, device="cuda", generator=g).to(dt),
                          torch.randn(s, device="cuda", generator=g).to(dt)],
        F.l1_loss, TF.l1_loss),
    "smooth_l1": (
        (1 << 24,), (1 << 20,), (640,),
        lambda s, dt, g: [torch.randn(s, device="cuda", generator=g).to(dt),
                          torch.randn(s, device="cuda", generator=g).to(dt)],
        lambda x, y: F.smooth_l1_loss(x, y, beta=0.5),
        lambda x, y: TF.smooth_l1_loss(x, y, beta=0.5)),
    "huber": (
        (1 << 24,), (1 << 20,), (640,),
        lambda s, dt, g: [torch.randn(s, device="cuda", generator=g).to(dt),
                          torch.randn(s, device="cuda", generator=g).to(dt)],
        lambda x, y: F.huber_loss(x, y, delta=0.7), lambda x, y: TF.huber_loss(x, y, delta=0.7)),
    "kl_div_batchmean": (
        (4096, 32000), (1024, 4096), (64, 10),
        lambda s, dt, g: [torch.randn(s, device="cuda", generator=g).log_softmax(1).to(dt),
                          _probs(s, 1, g, dt)],
        lambda x, t: F.kl_div(x, t, reduction="batchmean"),
        lambda x, t: TF.kl_div(x, t, reduction="batchmean")),
    "cross_entropy_weighted": (
        (8192, 1000), (2048, 1000), (64, 10),
        lambda s, dt, g: [torch.randn(s, device="cuda", generator=g).mul(3).to(dt),
                          _targets(s[:1], s[1], g),
                          torch.rand(s[1:], device="cuda", generator=g).add(0.5).to(dt)],
        lambda x, t, w: F.cross_entropy(x, t, w, label_smoothing=0.1),
        lambda x, t, w: TF.cross_entropy(x, t, w, label_smoothing=0.1)),
    "cross_entropy_kdim": (
        (8, 21, 256, 256), (2, 21, 128, 128), (2, 5, 4, 4),
        lambda s, dt, g: [torch.randn(s, device="cuda", generator=g).mul(3).to(dt),
                          _targets(s[:1] + s[2:], s[1], g)],
        F.cross_entropy, TF.cross_entropy),
    "cross_entropy_probs": (
        (8192, 1000), (2048, 1000), (64, 10),
        lambda s, dt, g: [torch.randn(s, device="cuda", generator=g).mul(3).to(dt),
                          _probs(s, 1, g, dt)],
        lambda x, q: F.cross_entropy(x, q, label_smoothing=0.1),
        lambda x, q: TF.cross_entropy(x, q, label_smoothing=0.1)),
    "cosine_similarity": (
        (16384, 768), (4096, 768), (64, 32),
        lambda s, dt, g: [torch.randn(s, device="cuda", generator=g).to(dt),
                          torch.randn(s, device="cuda", generator=g).to(dt)],
        lambda a, b: F.cosine_similarity(a, b).sum(),
        lambda a, b: TF.cosine_similarity(a, b).sum()),
    "pairwise_distance": (
        (16384, 768), (4096, 768), (64, 32),
        lambda s, dt, g: [torch.randn(s, device="cuda", generator=g).to(dt),
                          torch.randn(s, device="cuda", generator=g).to(dt)],
        lambda a, b: F.pairwise_distance(a, b).sum(),
        lambda a, b: TF.pairwise_distance(a, b).sum()),
}


def _runners(name, shape, dtype):
    """(ours_fwd, ours_fb, torch_fwd, torch_fb, bytes moved) for one case at one shape."""
    _, _, _, make, ours, theirs = CASES[name]
    gen = torch.Generator(device="cuda").manual_seed(0)
    inputs = make(shape, dtype, gen)
    mine = [td.from_torch(t.clone()) for t in inputs]
    mine[0].requires_grad_()
    spec = [t.clone() for t in inputs]
    spec[0].requires_grad_()
    moved = sum(t.numel() * t.element_size() for t in inputs) + \
        inputs[0].numel() * inputs[0].element_size()

    def ours_fb():
        mine[0].grad = None
        ours(*mine).backward()

    def torch_fb():
        spec[0].grad = None
        theirs(*spec).backward()

    return (lambda: ours(*mine)), ours_fb, (lambda: theirs(*spec)), torch_fb, moved


def measure(name, dtype, quick):
    big, quick_shape, small = CASES[name][:3]
    shape = quick_shape if quick else big
    ours_f, ours_fb, torch_f, torch_fb, moved = _runners(name, shape, dtype)
    row = {"loss": name, "shape": "x".join(map(str, shape)), "dtype": str(dtype)[6:]}
    row["td_fwd_ms"], row["torch_fwd_ms"] = common.bench_pair(ours_f, torch_f)
    row["td_fb_ms"], row["torch_fb_ms"] = common.bench_pair(ours_fb, torch_fb)
    for part in ("fwd", "fb"):
        row[f"{part}_ratio"] = row[f"torch_{part}_ms"] / row[f"td_{part}_ms"]
    row["td_fb_gbps"] = moved / row["td_fb_ms"] / 1e6
    row["torch_fb_gbps"] = moved / row["torch_fb_ms"] / 1e6
    _, ours_small, _, torch_small, _ = _runners(name, small, dtype)
    row["small_shape"] = "x".join(map(str, small))
    row["td_call_us"] = common.per_call_us(ours_small, 200)
    row["torch_call_us"] = common.per_call_us(torch_small, 200)
    row["call_ratio"] = row["torch_call_us"] / row["td_call_us"]
    torch.cuda.empty_cache()
    return row


COLUMNS = [
    ("loss", "loss", "{}"), ("shape", "shape", "{}"),
    ("td_fwd_ms", "fwd ms", "{:.4f}"), ("torch_fwd_ms", "torch", "{:.4f}"),
    ("fwd_ratio", "ratio", "{:.2f}x"),
    ("td_fb_ms", "fwd+bwd ms", "{:.4f}"), ("torch_fb_ms", "torch", "{:.4f}"),
    ("fb_ratio", "ratio", "{:.2f}x"), ("td_fb_gbps", "GB/s", "{:.0f}"),
    ("torch_fb_gbps", "torch GB/s", "{:.0f}"),
    ("small_shape", "eager at", "{}"), ("td_call_us", "us/call", "{:.1f}"),
    ("torch_call_us", "torch", "{:.1f}"), ("call_ratio", "ratio", "{:.2f}x"),
]


def _extra(parser):
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    parser.add_argument("--only", default=None,
                        help=f"comma-separated subset of: {', '.join(CASES)}")


def main(argv=None):
    args = common.parse_args(__doc__.splitlines()[0], argv, extra=_extra)
    names = list(CASES) if not args.only else [n.strip() for n in args.only.split(",")]
    unknown = [n for n in names if n not in CASES]
    if unknown:
        raise SystemExit(f"bench_losses: unknown case(s) {', '.join(unknown)}; the cases are "
                         f"{', '.join(CASES)}")
    common.require_gpu("bench_losses")
    td.set_backend("triton")
    dtype = DTYPES[args.dtype]
    rows = []
    for name in names:
        print(f"measuring {name} {args.dtype} ...", flush=True)
        rows.append(measure(name, dtype, args.quick))
    peak = common.copy_bandwidth()
    title = (f"losses, {args.dtype}: forward and forward+backward through autodiff (ratio = "
             f"torch ms / tritonad ms; GB/s = (inputs read once + gradient written once) / t; "
             f"device copy bandwidth {peak:.0f} GB/s); eager us per fwd+bwd call at a small "
             f"size")
    common.print_table(title, rows, COLUMNS)
    meta = {"copy_bandwidth_gbps": peak, "dtype": args.dtype,
            "bytes_moved": "every input read once + the gradient of the first written once"}
    path = common.save(args.out, f"losses_{args.dtype}", rows, meta=meta)
    print(f"\nwrote {path}")
    return rows


if __name__ == "__main__":
    main()
