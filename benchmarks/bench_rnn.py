"""Recurrent layers: tritonad's nn.LSTM / nn.GRU against torch.nn.LSTM / GRU (cuDNN) on the same
GPU in the same run: inference forward, and training forward + backward.

    python benchmarks/bench_rnn.py --out bench-results [--quick] [--precision high|highest]
        [--dtypes float32,bfloat16] [--tiles 16x16x64x4,32x16x64x4]

Rows: LSTM with 2 layers, input and hidden 512, batch 64, sequence 128 (the issue's figure),
in float32 and bfloat16, and the same GRU. float32 runs at TF32 on both sides by default, as
cuDNN does under torch's default (torch.backends.cudnn.allow_tf32 = True) and tritonad under
td.set_matmul_precision("high"); --precision highest runs both at float32 accuracy
(tritonad 3xTF32, cuDNN with allow_tf32 False).

Timings: kernel time as triton.testing.do_bench medians, the two sides alternated
(common.bench_pair); "eager us" is the wall time per training step (forward + backward) of an
eager loop, host included. Metric: TFLOP/s = the GEMM work of forward + backward,
3 x 2 x T x B x G H (I + H) x layers (forward, input gradient, weight gradient), over t.
Ratio = torch ms / tritonad ms (above 1: tritonad faster). --tiles replaces the step kernels'
tile rule (kernels/rnn.py `_tiles`: BLOCK_M x BLOCK_N x BLOCK_K x num_warps, BLOCK_K of the
forward; the backward's is 128) by each listed tile in turn, one row each, to try others.
"""
from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

import tritonad as td  # noqa: E402
from tritonad import nn  # noqa: E402
from tritonad.kernels import plans  # noqa: E402
from tritonad.kernels import rnn as kernels  # noqa: E402

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}  # (bf16: cuDNN's half type)
# (kind, layers, input, hidden, batch, steps)
CASES = [("LSTM", 2, 512, 512, 64, 128), ("GRU", 2, 512, 512, 64, 128)]
QUICK_CASES = [("LSTM", 2, 512, 512, 64, 128)]
GATES = {"LSTM": 4, "GRU": 3}


def _models(kind, layers, inputs, hidden, dtype):
    """(torch module on the GPU, ours with its weights), both in `dtype`."""
    torch.manual_seed(0)
    theirs = getattr(torch.nn, kind)(inputs, hidden, layers).cuda().to(dtype)
    ours = getattr(nn, kind)(inputs, hidden, layers, device="cuda", dtype=td.float32)
    ours.load_state_dict({n: td.from_torch(p.detach().float().contiguous())
                          for n, p in theirs.named_parameters()})
    if dtype != torch.float32:
        ours.to(td.bfloat16)
    return theirs, ours


def measure(case, dtype):
    kind, layers, inputs, hidden, batch, steps = case
    theirs, ours = _models(kind, layers, inputs, hidden, dtype)
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(steps, batch, inputs, device="cuda", generator=gen).to(dtype)
    dy = torch.randn(steps, batch, hidden, device="cuda", generator=gen).to(dtype)
    xs = x.detach().requires_grad_()
    xt, dyt = td.from_torch(x).requires_grad_(), td.from_torch(dy)
    params = list(ours.parameters())

    def td_fwd():
        with td.no_grad():
            return ours(xt)[0]

    def torch_fwd():
        with torch.no_grad():
            return theirs(xs)[0]

    def td_fb():
        for p in params:
            p.grad = None
        xt.grad = None
        ours(xt)[0].backward(dyt)

    def torch_fb():
        theirs.zero_grad(set_to_none=True)
        xs.grad = None
        theirs(xs)[0].backward(dy)

    row = {"case": f"{kind} {layers}x{hidden} B{batch} T{steps}", "dtype": str(dtype)[6:]}
    y_ours = td_fwd()
    td_fb()
    try:  # (a cuDNN build without this dtype's RNNs: tritonad's times alone)
        y_torch = torch_fwd()
        torch_fb()
    except RuntimeError as err:
        print(f"  torch {kind} {row['dtype']}: {str(err).splitlines()[0]}")
        y_torch = None
    torch.cuda.synchronize()
    flops = 3 * 2 * steps * batch * GATES[kind] * hidden * (inputs + hidden) * layers
    if y_torch is None:
        row["td_fwd_ms"] = common.bench(td_fwd)
        row["td_fb_ms"] = common.bench(td_fb)
        row["td_eager_us"] = common.per_call_us(td_fb, 20)
        row["td_fb_tflops"] = flops / row["td_fb_ms"] / 1e9
        return row
    # the outputs agree before anything is timed
    row["max_abs_diff"] = (y_ours._data.float() - y_torch.float()).abs().max().item()
    row["td_fwd_ms"], row["torch_fwd_ms"] = common.bench_pair(td_fwd, torch_fwd)
    row["td_fb_ms"], row["torch_fb_ms"] = common.bench_pair(td_fb, torch_fb)
    row["td_eager_us"] = common.per_call_us(td_fb, 20)
    row["torch_eager_us"] = common.per_call_us(torch_fb, 20)
    for part in ("fwd", "fb"):
        row[f"{part}_ratio"] = row[f"torch_{part}_ms"] / row[f"td_{part}_ms"]
    row["td_fb_tflops"] = flops / row["td_fb_ms"] / 1e9
    row["torch_fb_tflops"] = flops / row["torch_fb_ms"] / 1e9
    row["eager_ratio"] = row["torch_eager_us"] / row["td_eager_us"]
    torch.cuda.empty_cache()
    return row


COLUMNS = [
    ("case", "case", "{}"), ("dtype", "dtype", "{}"), ("tiles", "tiles", "{}"),
    ("td_fwd_ms", "fwd ms", "{:.3f}"), ("torch_fwd_ms", "cuDNN", "{:.3f}"),
    ("fwd_ratio", "ratio", "{:.2f}x"),
    ("td_fb_ms", "fwd+bwd ms", "{:.3f}"), ("torch_fb_ms", "cuDNN", "{:.3f}"),
    ("fb_ratio", "ratio", "{:.2f}x"), ("td_fb_tflops", "TFLOP/s", "{:.1f}"),
    ("td_eager_us", "eager us", "{:.0f}"), ("torch_eager_us", "torch", "{:.0f}"),
    ("eager_ratio", "ratio", "{:.2f}x"), ("max_abs_diff", "max |diff|", "{:.1e}"),
]


def _extra(parser):
    parser.add_argument("--precision", choices=["high", "highest"], default="high",
                        help="float32 matmul precision on both sides (high: TF32, as cuDNN's "
                             "default)")
    parser.add_argument("--dtypes", default="float32,bfloat16",
                        help="comma-separated, of " + ", ".join(DTYPES))
    parser.add_argument("--tiles", default=None,
                        help="comma-separated BMxBNxBKxWARPS step tiles to try instead of the "
                             "kernels' rule (e.g. 16x16x64x4,32x16x64x4)")


def _tile_settings(spec):
    """[(label, tiles or None)]: None keeps the kernels' own rule."""
    if not spec:
        return [("rule", None)]
    found = []
    for item in spec.split(","):
        try:
            bm, bn, bk, warps = (int(v) for v in item.lower().split("x"))
        except ValueError:
            raise SystemExit(f"bench_rnn: --tiles wants BMxBNxBKxWARPS items, got {item!r}")
        if min(bm, bn, bk) < 16 or any(v & (v - 1) for v in (bm, bn, bk, warps)):
            raise SystemExit(f"bench_rnn: tile sizes are powers of two from 16, got {item!r}")
        found.append((item, (bm, bn, bk, warps)))
    return found


def main(argv=None):
    args = common.parse_args(__doc__.splitlines()[0], argv, extra=_extra)
    dtypes = [d for d in args.dtypes.split(",") if d]
    unknown = [d for d in dtypes if d not in DTYPES]
    if unknown:
        raise SystemExit(f"bench_rnn: unknown dtypes {unknown}; choose from {sorted(DTYPES)}")
    tile_settings = _tile_settings(args.tiles)
    common.require_gpu("bench_rnn")
    td.set_backend("triton")
    td.set_matmul_precision(args.precision)
    saved_tf32 = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = args.precision == "high"
    rule = kernels._tiles
    rows = []
    try:
        for label, tiles in tile_settings:
            kernels._tiles = rule if tiles is None else (lambda batch, hidden, t=tiles: t)
            plans.clear_plans()  # (recorded plans hold the tiles they were made with)
            for case in QUICK_CASES if args.quick else CASES:
                for name in dtypes:
                    print(f"measuring {case[0]} {name} tiles {label} ...", flush=True)
                    rows.append(dict(measure(case, DTYPES[name]), tiles=label))
    finally:
        kernels._tiles = rule
        plans.clear_plans()
        torch.backends.cudnn.allow_tf32 = saved_tf32
        td.set_matmul_precision("highest")
    common.print_table(f"recurrent layers, training step forward + backward and inference "
                       f"forward (float32 precision {args.precision}; ratio = cuDNN ms / "
                       f"tritonad ms)", rows, COLUMNS)
    meta = {"precision": args.precision, "tiles": args.tiles or "the kernels' rule",
            "flops": "3 x 2 x T x B x G H (I + H) x layers for forward + backward"}
    path = common.save(args.out, "rnn", rows, meta=meta)
    print(f"\nwrote {path}")
    return rows


if __name__ == "__main__":
    main()
