"""Embeddings and indexing: tritonad's kernels against torch on the same GPU in the same run:
embedding backward (deterministic: sorted keys and segment sums) and forward, gather /
scatter_add along a dim, index_select of rows; kernel times and eager per-call times.

    python benchmarks/bench_embedding.py --out bench-results [--quick] [--dtype float32]
        [--sort-block 4096] [--merge-group 8]

Metric: GB/s = bytes moved / t at the minimum traffic, per row of the table:
- embedding backward: read dy (n x D) and the indices, write the weight gradient (R x D, its
  zero rows included): (n + R) * D * itemsize + 8 n;
- embedding forward / index_select: read and write the n looked-up rows: 2 n D itemsize + 8 n;
- gather: read index and values, write out: numel(index) * (8 + 2 itemsize);
- scatter_add: read x, index and src, write out: 2 numel(x) itemsize + numel(index) *
  (8 + itemsize).
"kernel" rows time the backend primitives on raw torch tensors against torch's own ops
(torch.ops.aten.embedding_dense_backward, F.embedding, torch.index_select); "api" rows time
td.gather / td.scatter_add against torch's; "autodiff" embedding forward + backward, both with
autograd; all by triton.testing.do_bench medians (L2 flushed). "eager" rows time the tritonad Tensor API
against torch's (autograd on both sides), per call, host included (common.per_call_us).
Ratios are torch time / tritonad time: above 1 means tritonad is faster. The embedding
backward is also run twice and its bits compared (`deterministic` in the JSON).
"""
from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

import tritonad as td  # noqa: E402
import tritonad.nn.functional as F  # noqa: E402
from tritonad.kernels import scatter as scatter_kernels  # noqa: E402

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# (rows R, width D, indices n): the figure first (50k x 768, 32k indices with repeats)
EMBEDDINGS = [(50_000, 768, 32_768), (32_000, 4096, 8192), (1_000, 128, 65_536),
              (250_000, 256, 131_072)]
QUICK_EMBEDDINGS = [(50_000, 768, 32_768)]
GATHERS = [(4096, 1024, 256), (16384, 4096, 64)]  # x [M, N], index [M, K] along dim 1
QUICK_GATHERS = [(4096, 1024, 256)]


def _indices(rows, n, gen):
    """n indices into rows with repeats: half uniform, half from the 1% most used rows."""
    uniform = torch.randint(0, rows, (n - n // 2,), device="cuda", generator=gen)
    popular = torch.randint(0, max(1, rows // 100), (n // 2,), device="cuda", generator=gen)
    both = torch.cat([uniform, popular])
    return both[torch.randperm(n, device="cuda", generator=gen)]


def _row(kind, shape, dtype, ours_ms, torch_ms, nbytes):
    return {"op": kind, "shape": shape, "dtype": str(dtype)[6:], "td_ms": ours_ms,
            "torch_ms": torch_ms, "ratio": torch_ms / ours_ms,
            "td_gbps": nbytes / ours_ms / 1e6, "torch_gbps": nbytes / torch_ms / 1e6}


def measure_embedding(rows, width, n, dtype, gen):
    be = td.backend.backend_for(torch.device("cuda"))
    weight = torch.randn(rows, width, device="cuda", generator=gen).to(dtype)
    index = _indices(rows, n, gen)
    dy = torch.randn(n, width, device="cuda", generator=gen).to(dtype)
    size = weight.element_size()
    shape = f"{rows}x{width}, n={n}"
    out = []

    def ours_bwd():
        return be.scatter_reduce_rows(dy, index, None, rows, "sum", False, -1, "embedding")

    def torch_bwd():
        return torch.ops.aten.embedding_dense_backward(dy, index, rows, -1, False)

    first, again = ours_bwd(), ours_bwd()
    deterministic = bool(torch.equal(first, again))
    error = (first.float() - torch_bwd().float()).abs().max().item()
    ms = common.bench_pair(ours_bwd, torch_bwd)
    row = _row("embedding backward", shape, dtype, ms[0], ms[1], (n + rows) * width * size + 8 * n)
    row.update(path="kernel", deterministic=deterministic, max_abs_diff=error)
    out.append(row)

    def ours_fwd():
        return be.gather_rows(weight, be.index_check(index, rows, "embedding", False))

    ms = common.bench_pair(ours_fwd, lambda: torch.nn.functional.embedding(index, weight))
    out.append(dict(_row("embedding forward", shape, dtype, ms[0], ms[1],
                         2 * n * width * size + 8 * n), path="kernel"))

    ms = common.bench_pair(lambda: be.gather_rows(weight, index),
                           lambda: torch.index_select(weight, 0, index))
    out.append(dict(_row("index_select rows", shape, dtype, ms[0], ms[1],
                         2 * n * width * size + 8 * n), path="kernel"))

    # eager: the Tensor API forward + backward, autograd on both sides
    w_ours = td.from_torch(weight.clone()).requires_grad_()
    i_ours, dy_ours = td.from_torch(index), td.from_torch(dy)
    w_torch = weight.clone().requires_grad_()

    def ours_step():
        w_ours.grad = None
        F.embedding(i_ours, w_ours).backward(dy_ours)

    def torch_step():
        w_torch.grad = None
        torch.nn.functional.embedding(index, w_torch).backward(dy)

    ms = common.bench_pair(ours_step, torch_step)
    out.append(dict(_row("embedding fwd+bwd", shape, dtype, ms[0], ms[1],
                         (3 * n + rows) * width * size + 16 * n), path="autodiff"))
    torch.cuda.empty_cache()
    return out


def measure_gather(m, width, k, dtype, gen):
    be = td.backend.backend_for(torch.device("cuda"))
    x = torch.randn(m, width, device="cuda", generator=gen).to(dtype)
    index = torch.randint(0, width, (m, k), device="cuda", generator=gen)
    src = torch.randn(m, k, device="cuda", generator=gen).to(dtype)
    size = x.element_size()
    shape = f"{m}x{width}, index {m}x{k}"
    xt, it, st = td.from_torch(x), td.from_torch(index), td.from_torch(src)
    out = []
    ms = common.bench_pair(lambda: td.gather(xt, 1, it), lambda: torch.gather(x, 1, index))
    out.append(dict(_row("gather dim 1", shape, dtype, ms[0], ms[1], index.numel() *
                         (8 + 2 * size)), path="api"))
    ms = common.bench_pair(lambda: td.scatter_add(xt, 1, it, st),
                           lambda: torch.scatter_add(x, 1, index, src))
    out.append(dict(_row("scatter_add dim 1", shape, dtype, ms[0], ms[1],
                         2 * x.numel() * size + index.numel() * (8 + size)), path="api"))
    del be
    return out


def measure_eager(dtype, gen):
    """Per-call microseconds at a small, host-bound size (64 x 128), forward + backward."""
    out = []
    weight = torch.randn(1000, 128, device="cuda", generator=gen).to(dtype)
    index = torch.randint(0, 1000, (64,), device="cuda", generator=gen)
    dy = torch.randn(64, 128, device="cuda", generator=gen).to(dtype)
    w_ours, i_ours, dy_ours = td.from_torch(weight.clone()).requires_grad_(), \
        td.from_torch(index), td.from_torch(dy)
    w_torch = weight.clone().requires_grad_()

    def ours():
        w_ours.grad = None
        F.embedding(i_ours, w_ours).backward(dy_ours)

    def theirs():
        w_torch.grad = None
        torch.nn.functional.embedding(index, w_torch).backward(dy)

    us = common.per_call_us(ours, 200), common.per_call_us(theirs, 200)
    out.append({"op": "embedding fwd+bwd", "shape": "1000x128, n=64", "dtype": str(dtype)[6:],
                "path": "eager", "td_us": us[0], "torch_us": us[1], "ratio": us[1] / us[0]})
    x = torch.randn(64, 128, device="cuda", generator=gen).to(dtype)
    idx = torch.randint(0, 128, (64, 16), device="cuda", generator=gen)
    xt, it = td.from_torch(x), td.from_torch(idx)
    us = common.per_call_us(lambda: td.gather(xt, 1, it), 200), \
        common.per_call_us(lambda: torch.gather(x, 1, idx), 200)
    out.append({"op": "gather dim 1", "shape": "64x128, index 64x16", "dtype": str(dtype)[6:],
                "path": "eager", "td_us": us[0], "torch_us": us[1], "ratio": us[1] / us[0]})
    return out


COLUMNS = [("op", "op", "{}"), ("shape", "shape", "{}"), ("path", "path", "{}"),
           ("td_ms", "tritonad ms", "{:.4f}"), ("torch_ms", "torch ms", "{:.4f}"),
           ("ratio", "ratio", "{:.2f}x"), ("td_gbps", "GB/s", "{:.0f}"),
           ("torch_gbps", "torch GB/s", "{:.0f}")]
EAGER_COLUMNS = [("op", "op", "{}"), ("shape", "shape", "{}"), ("td_us", "tritonad us/call",
                 "{:.1f}"), ("torch_us", "torch us/call", "{:.1f}"), ("ratio", "ratio",
                                                                      "{:.2f}x")]


def _extra(parser):
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    parser.add_argument("--sort-block", type=int, default=None,
                        help="override kernels.scatter.SORT_BLOCK (keys tl.sort sorts a program)")
    parser.add_argument("--merge-group", type=int, default=None,
                        help="override kernels.scatter.MERGE_GROUP (runs merged a pass)")


def main(argv=None):
    args = common.parse_args(__doc__.splitlines()[0], argv, extra=_extra)
    common.require_gpu("bench_embedding")
    td.set_backend("triton")
    if args.sort_block:
        scatter_kernels.SORT_BLOCK = args.sort_block
    if args.merge_group:
        scatter_kernels.MERGE_GROUP = args.merge_group
    dtype = DTYPES[args.dtype]
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    for rows_, width, n in QUICK_EMBEDDINGS if args.quick else EMBEDDINGS:
        print(f"measuring embedding {rows_}x{width} n={n} {args.dtype} ...", flush=True)
        rows.extend(measure_embedding(rows_, width, n, dtype, gen))
    for m, width, k in QUICK_GATHERS if args.quick else GATHERS:
        print(f"measuring gather / scatter_add {m}x{width} k={k} {args.dtype} ...", flush=True)
        rows.extend(measure_gather(m, width, k, dtype, gen))
    eager = measure_eager(dtype, gen)
    common.print_table(f"embeddings and indexing, {args.dtype} (kernel: do_bench medians; "
                       "GB/s = bytes moved / t, see the module docstring; ratio = torch ms / "
                       "tritonad ms)", rows, COLUMNS)
    common.print_table("eager per call, forward + backward where there is one (host "
                       "included; ratio = torch us / tritonad us)", eager, EAGER_COLUMNS)
    determinism = [r["deterministic"] for r in rows if "deterministic" in r]
    print(f"\nembedding backward bit-identical across runs: {all(determinism)}")
    path = common.save(args.out, f"embedding_{args.dtype}", rows + eager,
                       meta={"dtype": args.dtype, "deterministic": all(determinism),
                             "sort_block": scatter_kernels.SORT_BLOCK,
                             "merge_group": scatter_kernels.MERGE_GROUP})
    print(f"wrote {path}")
    return rows + eager


if __name__ == "__main__":
    main()
