"""Scaled dot-product attention: tritonad's flash attention (kernels/attention.py) against
torch.nn.functional.scaled_dot_product_attention on its flash backend, same GPU, same run.

    python benchmarks/bench_attention.py --out bench-results [--quick] [--dtype bfloat16]
        [--tokens 16384] [--heads 16]

Shapes: q, k, v [B, H, T, D] contiguous, T in {256, 1024, 4096}, D in {64, 128}, causal and
not; B = tokens / T (16 x 16 heads at T = 1024 by default), so every row fills the GPU alike.
Each row times, through autodiff on both sides (td: F.scaled_dot_product_attention on
td.from_torch tensors; torch: autograd):
- fwd: the forward alone, under no_grad on both sides;
- bwd: backward of a kept graph (retain_graph), gradients of q, k and v;
- fwd+bwd: both, what a training step pays;
as triton.testing.do_bench medians (kernel time), the eager per-call time of fwd+bwd (host
included, synchronised once per 20 calls) and the peak memory of fwd+bwd above the inputs
(torch.cuda.max_memory_allocated). TFLOP/s = the attention's matmul flops / t: forward
4 B H T^2 D (halved when causal), backward 2.5x that (five products, the forward's QK^T
recomputed), fwd+bwd 3.5x. Ratio = torch time / tritonad time: above 1, tritonad is faster.
By default every row is --dtype (bfloat16) and one more row runs float16 at T = 1024.

--sweep times the kernels' tile choices instead (kernels/attention.py GPU_BLOCKS): forward
candidates, then dK/dV and dQ candidates (each with the other at its default), at T = 1024
and 4096, head dims 64 and 128, causal and not, and prints each candidate's milliseconds.
"""
from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

import tritonad as td  # noqa: E402
import tritonad.nn.functional as F  # noqa: E402

LENGTHS = (256, 1024, 4096)
QUICK_LENGTHS = (1024,)
HEAD_DIMS = (64, 128)
DEVICE = "cuda"
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def _torch_flash(dtype):
    """A context manager that restricts torch's SDPA to its flash backend (float32, which that
    backend does not take, runs whatever torch picks)."""
    import contextlib

    from torch.nn.attention import SDPBackend, sdpa_kernel

    if dtype == torch.float32:
        return contextlib.nullcontext()
    return sdpa_kernel([SDPBackend.FLASH_ATTENTION])


def measure(T, D, causal, dtype, tokens, heads):
    B = max(1, tokens // T)
    H = heads
    gen = torch.Generator(device=DEVICE).manual_seed(0)
    q, k, v, dout = (torch.randn(B, H, T, D, device=DEVICE, generator=gen).to(dtype)
                     for _ in range(4))
    row = {"shape": f"{B}x{H}x{T}x{D}", "T": T, "D": D, "causal": causal,
           "dtype": str(dtype)[6:],
           "curve": f"D={D}{' causal' if causal else ''}"}
    flops = 4 * B * H * T * T * D * (0.5 if causal else 1.0)

    # tritonad
    tq, tk, tv = (td.from_torch(t.clone()).requires_grad_() for t in (q, k, v))
    tdo = td.from_torch(dout)

    def td_fwd():
        with td.no_grad():
            return F.scaled_dot_product_attention(tq, tk, tv, is_causal=causal)

    kept = F.scaled_dot_product_attention(tq, tk, tv, is_causal=causal)

    def td_bwd():
        tq.grad = tk.grad = tv.grad = None
        kept.backward(tdo, retain_graph=True)

    def td_fb():
        tq.grad = tk.grad = tv.grad = None
        F.scaled_dot_product_attention(tq, tk, tv, is_causal=causal).backward(tdo)

    # torch (flash backend)
    sq, sk, sv = (t.clone().requires_grad_() for t in (q, k, v))
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def torch_fwd():
        with torch.no_grad(), _torch_flash(dtype):
            return sdpa(sq, sk, sv, is_causal=causal)

    with _torch_flash(dtype):
        skept = sdpa(sq, sk, sv, is_causal=causal)

    def torch_bwd():
        sq.grad = sk.grad = sv.grad = None
        skept.backward(dout, retain_graph=True)

    def torch_fb():
        sq.grad = sk.grad = sv.grad = None
        with _torch_flash(dtype):
            sdpa(sq, sk, sv, is_causal=causal).backward(dout)

    # correctness beside speed: the two outputs agree to the dtype's precision
    with torch.no_grad():
        ours, theirs = td_fwd()._data.float(), torch_fwd().float()
        row["max_abs_diff"] = float((ours - theirs).abs().max())

    for part, ours_fn, torch_fn, scale in (("fwd", td_fwd, torch_fwd, 1.0),
                                           ("bwd", td_bwd, torch_bwd, 2.5),
                                           ("fb", td_fb, torch_fb, 3.5)):
        ms_ours, ms_torch = common.bench_pair(ours_fn, torch_fn)
        row[f"td_{part}_ms"], row[f"torch_{part}_ms"] = ms_ours, ms_torch
        row[f"{part}_ratio"] = ms_torch / ms_ours
        row[f"td_{part}_tflops"] = scale * flops / ms_ours / 1e9
        row[f"torch_{part}_tflops"] = scale * flops / ms_torch / 1e9
    calls = 20
    row["td_fb_call_us"] = common.per_call_us(td_fb, calls)
    row["torch_fb_call_us"] = common.per_call_us(torch_fb, calls)
    kept = skept = None  # (their graphs freed before the memory is measured)
    tq.grad = tk.grad = tv.grad = sq.grad = sk.grad = sv.grad = None
    row["td_peak_mib"] = common.peak_memory(td_fb) / 2**20
    tq.grad = tk.grad = tv.grad = None
    row["torch_peak_mib"] = common.peak_memory(torch_fb) / 2**20
    torch.cuda.empty_cache()
    return row


COLUMNS = [
    ("shape", "B x H x T x D", "{}"), ("dtype", "dtype", "{}"), ("causal", "causal", "{}"),
    ("td_fwd_ms", "fwd ms", "{:.3f}"), ("torch_fwd_ms", "torch", "{:.3f}"),
    ("fwd_ratio", "ratio", "{:.2f}x"), ("td_fwd_tflops", "TFLOP/s", "{:.0f}"),
    ("td_bwd_ms", "bwd ms", "{:.3f}"), ("torch_bwd_ms", "torch", "{:.3f}"),
    ("bwd_ratio", "ratio", "{:.2f}x"),
    ("td_fb_ms", "fwd+bwd ms", "{:.3f}"), ("torch_fb_ms", "torch", "{:.3f}"),
    ("fb_ratio", "ratio", "{:.2f}x"), ("td_fb_tflops", "TFLOP/s", "{:.0f}"),
    ("torch_fb_tflops", "torch", "{:.0f}"),
    ("td_fb_call_us", "eager us", "{:.0f}"), ("torch_fb_call_us", "torch", "{:.0f}"),
    ("td_peak_mib", "peak MiB", "{:.0f}"), ("torch_peak_mib", "torch", "{:.0f}"),
    ("max_abs_diff", "max |diff|", "{:.1e}"),
]


SWEEP_LENGTHS = (1024, 4096)
# (BLOCK_M, BLOCK_N, num_warps, num_stages) candidates of each kernel
SWEEP = {
    "fwd": [(128, 64, 4, 3), (128, 64, 8, 3), (128, 128, 8, 3), (128, 64, 4, 4),
            (128, 32, 4, 4), (64, 64, 4, 3), (128, 128, 8, 2), (64, 128, 4, 3)],
    "dkdv": [(32, 128, 8, 2), (16, 128, 8, 2), (32, 128, 4, 3), (32, 64, 8, 3),
             (32, 64, 4, 3), (64, 128, 8, 2), (16, 128, 4, 3), (32, 64, 4, 2), (64, 128, 8, 3),
             (32, 128, 8, 3)],
    "dq": [(128, 32, 4, 3), (128, 32, 8, 2), (128, 64, 8, 2), (64, 32, 4, 3), (64, 64, 4, 3),
           (128, 64, 8, 3)],
}


def _max_diff(got, want):
    """The largest |got - want| over the arrays of two results (O, lse or dQ, dK, dV)."""
    return max(float((g.float() - w.float()).abs().max()) for g, w in zip(got, want))


def sweep(dtype, tokens, heads):
    """Milliseconds of every candidate tile of each kernel (the launchers on raw arrays), and
    the largest difference of its result from the default tiles' (a wrong tile shows)."""
    from tritonad.kernels import attention as kernels
    from tritonad.kernels.plans import clear_plans

    rows = []
    for T in SWEEP_LENGTHS:
        for D in HEAD_DIMS:
            for causal in (False, True):
                B = max(1, tokens // T)
                gen = torch.Generator(device=DEVICE).manual_seed(0)
                q, k, v, do = (torch.randn(B, heads, T, D, device=DEVICE, generator=gen)
                               .to(dtype) for _ in range(4))
                scale = D ** -0.5
                kernels.GPU_BLOCKS = None
                clear_plans()
                default = kernels._blocks(D, dtype)
                o, lse = kernels.flash_attention(q, k, v, None, scale, causal)
                grads = kernels.flash_attention_backward(do, q, k, v, o, lse, None, scale,
                                                         causal)
                for kernel, candidates in SWEEP.items():
                    for cand in candidates:
                        blocks = list(default)
                        blocks[("fwd", "dkdv", "dq").index(kernel)] = cand
                        kernels.GPU_BLOCKS = tuple(blocks)
                        clear_plans()
                        if kernel == "fwd":
                            fn = lambda: kernels.flash_attention(q, k, v, None, scale, causal)
                            want = (o, lse)
                        else:
                            fn = lambda: kernels.flash_attention_backward(do, q, k, v, o, lse,
                                                                         None, scale, causal)
                            want = grads
                        try:
                            diff = _max_diff(fn(), want)
                            ms = common.bench(fn)
                        except Exception as error:  # out of shared memory or registers
                            ms, diff, note = None, None, str(error).splitlines()[0][:60]
                        else:
                            note = ""
                        rows.append({"T": T, "D": D, "causal": causal, "kernel": kernel,
                                     "blocks": "x".join(map(str, cand)),
                                     "default": cand == default[("fwd", "dkdv", "dq")
                                                                .index(kernel)],
                                     "ms": ms, "max_diff": diff, "note": note})
                        print(rows[-1], flush=True)
                kernels.GPU_BLOCKS = None
                clear_plans()
    return rows


SWEEP_COLUMNS = [("T", "T", "{}"), ("D", "D", "{}"), ("causal", "causal", "{}"),
                 ("kernel", "kernel", "{}"), ("blocks", "BM x BN x warps x stages", "{}"),
                 ("default", "default", "{}"), ("ms", "ms", "{:.3f}"),
                 ("max_diff", "max |diff| from default", "{:.1e}"), ("note", "note", "{}")]


def _extra(parser):
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bfloat16")
    parser.add_argument("--tokens", type=int, default=16384,
                        help="batch x length of every row (B = tokens / T)")
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--sweep", action="store_true",
                        help="time the kernels' tile candidates instead (see the docstring)")


def main(argv=None):
    args = common.parse_args(__doc__.splitlines()[0], argv, extra=_extra)
    common.require_gpu("bench_attention")
    td.set_backend("triton")
    dtype = DTYPES[args.dtype]
    if args.sweep:
        rows = sweep(dtype, args.tokens, args.heads)
        common.print_table(f"attention tile sweep, {args.dtype} (bwd rows: delta + dK/dV + dQ)",
                           rows, SWEEP_COLUMNS)
        path = common.save(args.out, f"attention_sweep_{args.dtype}", rows)
        print(f"\nwrote {path}")
        return rows
    plan = [(T, D, causal, dtype) for T in (QUICK_LENGTHS if args.quick else LENGTHS)
            for D in HEAD_DIMS for causal in (False, True)]
    if args.dtype == "bfloat16":
        plan.append((1024, 64, True, torch.float16))
    rows = []
    for T, D, causal, dt in plan:
        print(f"measuring attention T={T} D={D} causal={causal} {str(dt)[6:]} ...", flush=True)
        rows.append(measure(T, D, causal, dt, args.tokens, args.heads))
    common.print_table("scaled_dot_product_attention, forward and backward (ratio = torch flash "
                       "ms / tritonad ms; TFLOP/s: fwd 4 B H T^2 D, halved when causal; bwd "
                       "2.5x, fwd+bwd 3.5x; peak: fwd+bwd above the inputs)", rows, COLUMNS)
    meta = {"tokens": args.tokens, "heads": args.heads, "dtype": args.dtype,
            "flops": "fwd 4 B H T^2 D (x0.5 causal), bwd 2.5x, fwd+bwd 3.5x",
            "torch_backend": "flash (torch.nn.attention.sdpa_kernel)"}
    name = f"attention_{args.dtype}"
    path = common.save(args.out, name, rows, meta=meta)
    common.plot(args.out, name, [r for r in rows if r["dtype"] == args.dtype], x="T",
                series=[("td_fb_tflops", "tritonad fwd+bwd"),
                        ("torch_fb_tflops", "torch fwd+bwd")],
                xlabel="sequence length T", ylabel="TFLOP/s", group="curve",
                title=f"attention fwd+bwd {args.dtype}")
    print(f"\nwrote {path}")
    return rows


if __name__ == "__main__":
    main()
