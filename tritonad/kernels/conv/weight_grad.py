"""The weight gradient of one group by the implicit family (routing.weight_grad_algorithm
names which): what its algorithms share, around the one kernel launch that differs.

    dW[o, (c,i,j)] = sum_{(n,p,q)} dY[o, (n,p,q)] * X_col[(c,i,j), (n,p,q)]
    db[o]          = sum_{(n,p,q)} dY[o, (n,p,q)]

The long K = N*Ho*Wo is split over programs: each split writes float32 partial tiles to a
workspace [S, Co, C, kh, kw], and one launch of fixed-order sums (sums.sum_splits) then writes
dw, with db's partials beside it. With one split the kernel writes dw itself. db's partials
come from sums.channel_sums over splits of their own, or from the batch-inner copy of dy, or
from programs of the window form's own launch.
"""
from __future__ import annotations

import torch

from ..launch import cdiv
from ..plans import empty
from . import batch_inner, flat_shift, implicit_gemm, window, winograd
from .common import block, sm_count
from .settings import dot_precision
from .sums import bias_grad, channel_sums, sum_splits


def splits_for(tiles, pixels, device, s, reserved=0):
    """Split-K count for the weight gradient: at most two programs per SM in all (less
    `reserved` programs of other work in the same launch), each with at least a few hundred
    pixels (s.dw_split overrides). NOTE: at most, not about: the programs are equal, so a few
    over a whole number of rounds cost one more round (28x28 TF32: 9 tiles x 30 splits = 270 >
    264)."""
    if s.dw_split is not None:
        return max(1, min(int(s.dw_split), pixels))
    return max(1, min((2 * sm_count(device) - reserved) // tiles, pixels // 256))


def tiling(algo, g, c, co, s):
    """(BLOCK_M, BLOCK_N, tiles, by_tap) of the weight gradient's [Co, (c, i, j)] output:
    columns of one tap and a block of channels (by_tap), or of the flat (c, i, j) axis."""
    k_total = c * g.kh * g.kw
    if algo == "flat_shift":
        # columns of one tap where C fills a tile's worth (tiles spanning taps, with a shift
        # and a wrap test per row, measured 1.2-1.3x slower at 32 and 64 channels, H100); of
        # several where C is small (MNIST conv1: 2.2x faster than the implicit kernel, all 25
        # taps in one tile)
        by_tap = c >= s.shift_taps_below
    else:
        by_tap = c >= s.channel_inner_min or algo == "batch_inner"  # (always where window)
    block_m = block(co)
    block_n = block(c) if by_tap else block(k_total)
    tiles = cdiv(co, block_m) * (g.kh * g.kw * cdiv(c, block_n) if by_tap
                                 else cdiv(k_total, block_n))
    return block_m, block_n, tiles, by_tap


def run_weight_grad(algo, dy, x, dw, db, g, precision, s, dy_pad=None):
    """dw [Co, C, kh, kw] (and db [Co] unless None) of one group by `algo` (not im2col); dw and
    db contiguous. dy_pad: the input gradient's window copy of dy (window.gemm's keep), which
    the window form reads instead of copying dy again."""
    if algo == "winograd":
        winograd.weight_grad_in_chunks(dy, x, dw, db, g, sm_count(x.device), s)
        return
    co, c = dy.shape[1], x.shape[1]
    dot = dot_precision(x.dtype, precision)
    presplit = dot == "tf32x3" and s.dw_presplit
    tiles = tiling(algo, g, c, co, s)
    pixels = g.n * g.oh * g.ow
    # NOTE: db by its own programs, not summed in the GEMM's loop: that read each dy tile from
    # shared memory into registers beside wgmma and cost 6-98 us at the ResNet-style layers
    # (28x28 TF32: 549 -> 451 us; 14x14 bf16: 241 -> 195; H200, 2026-11-24, notes/PERF.md)
    # The batch-inner form's copy of dy sums it too: db is the fixed-order sum of those
    # partials, not a pass of its own (TF32 dw + db at 28x28: 535 -> 488 us, 14x14: 442 ->
    # 419, H100). The window form's launch has programs of its own that sum its copy of dy,
    # on the SMs its GEMM leaves free (a pass of its own cost 10-34 us at 14x14-56x56 bf16;
    # summed as the copy is written, more: its tiles are one image's; H200, 2026-11-25,
    # notes/PERF.md)
    db_in_copy = db is not None and algo == "batch_inner"
    db_programs = 0
    if algo == "window" and db is not None:
        db_programs = window.db_programs(g, co, dy, s)
    splits = splits_for(tiles[2], pixels, dy.device, s, db_programs)
    db_part = None  # db's partials [rows, Co], summed beside dw's
    if db_programs:
        db_part = empty((db_programs, co), torch.float32, dw.device)
    if splits == 1:
        part = dw.unsqueeze(0)
        if db is not None and not db_in_copy and not db_programs:
            bias_grad(dy, db, s)
    else:
        part = empty((splits, *dw.shape), torch.float32, dw.device)
        if db is not None and not db_in_copy and not db_programs:  # (splits of their own)
            db_part = channel_sums(dy, s)
    if algo == "batch_inner":
        sums = batch_inner.weight_grad(dy, x, part, g, tiles, splits, dot, presplit, db_in_copy)
        db_part = sums if db_in_copy else db_part
    elif algo == "window":
        window.weight_grad(dy, x, part, db_part, g, tiles, splits, db_programs, dy_pad)
    elif algo == "flat_shift":
        flat_shift.weight_grad(dy, x, part, g, tiles, splits, dot, presplit, s)
    else:
        implicit_gemm.weight_grad(dy, x, part, g, tiles, splits, dot, presplit)
    # dw's and db's partials: one launch of fixed-order sums
    db_sum = (db_part[:, None], db.view(1, co)) if db_part is not None else (None, None)
    if splits > 1:
        sum_splits(part.view(splits, 1, -1), dw.view(1, -1), *db_sum)
    elif db_part is not None:
        sum_splits(*db_sum)
