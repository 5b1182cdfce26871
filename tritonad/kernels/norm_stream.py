"""Streaming normalisation passes: the row-norm backward and the batch-norm forward and backward,
each a pass over the data at full bandwidth (settings: kernels/norm_common.py). kernels/norm.py's
launchers call these; the forward row kernel is norm.py's.

Why the first kernels (since removed) were slow (bench norms, H200, 2026-12-02): each program
loaded a tile of 4096 elements, reduced it across warps, then loaded the next: one tile in
flight per program and one program per SM (88-120 registers a thread at 16 warps), so a bf16
tile put half the bytes in flight of an fp32 one and the bf16 passes gained nothing from
moving half the bytes (LayerNorm forward + backward 1.45x torch in fp32, 0.57x in bf16 at
16384x384; batch norm forward 0.69x at 512x256x7x7 fp32 NCHW, 0.32x bf16 channels-last).
Here:

- loops over tiles keep the next tile's loads in flight while the current one is reduced
  (issued at the top of an iteration, used in the next), and for 2-byte dtypes the next two
  tiles' (settings half_depth): a raw bf16 tile costs half the registers of a float32 one, so
  bf16 keeps as many bytes in flight as float32 at 8 elements a thread;
- the batch-norm sums stay per lane in registers ([BLOCK_S, BLOCK_C]) and are reduced across
  lanes once at the end of a program, not once per tile (the row backward reduces its dw, db
  rows each step: per-lane sums there cost the registers of the second step in flight);
- a batch-norm statistics program sums x - p and (x - p)^2 per lane, p = the mean of its
  first tile (so p lies near the mean and float32 keeps the digits of
  M2 = sum (x-p)^2 - (sum (x-p))^2 / n); the programs' (mean, M2, count) combine by Chan's
  formula;
- the elementwise passes (normalise, dx) take one tile a program over a 1-D grid and let the
  hardware schedule many programs a multiprocessor; they visit the tiles that the reduction
  before them read last first (settings bn_l2_order), so that more of their second read of x
  (and dy) comes from L2: 25.6 MB of x and dy at 512x256x7x7 bf16 against H200's 50 MB L2.
"""
from __future__ import annotations

import triton
import triton.language as tl

from .launch import INTERPRET, cdiv, next_power_of_2
from .norm_common import (acc_type, activate, activation_grad, col_offsets, program_count,
                          stat_dtype, tile_offsets)
from .plans import empty, run

MAX_WARPS = 32
# the interpreter runs a tile in about the time of an element: few large tiles there (tests set
# 0 to walk many small tiles)
INTERPRET_MIN_TILE = 1 << 14 if INTERPRET else 0


# ------------------------------------------------------------------------ row-norm backward
#
# As kernels/norm.py: per row, g = w dy, xhat = (x - mu) rstd (mu = 0 for rms_norm),
#   dx = rstd (g - (xhat sum(g xhat) + sum(g)) / n)    (rms_norm: no sum(g) term),
#   dw = sum over rows of dy xhat,  db = sum over rows of dy.
# Memory traffic: reads x and dy, writes dx (3 x itemsize a element), 8 bytes a row of mean and
# rstd, and one float32 row of partial dw (and db) a program, written then read once by the sum:
# at one program an SM (132) and 16384 x 384 bf16, 0.4 MB of partials against 37.7 MB of x,
# dy, dx (floor 7.9 us at 4.8 TB/s); 8192 x 4096 bf16: 4.3 MB against 201 MB (42 us).


@triton.jit
def _rows_load(x_ptr, dy_ptr, mean_ptr, rstd_ptr, rows, row_end, x_cols, d_cols, col_ok,
               stride_xm, stride_dm, RMS: tl.constexpr):
    # the raw tile of rows `rows` (x, dy in their dtype; mean, rstd): loads issued, not waited on
    row_ok = rows < row_end
    mask = row_ok[:, None] & col_ok[None, :]
    rows64 = rows.to(tl.int64)
    x = tl.load((x_ptr + rows64 * stride_xm)[:, None] + x_cols[None, :], mask=mask, other=0.0)
    dy = tl.load((dy_ptr + rows64 * stride_dm)[:, None] + d_cols[None, :], mask=mask, other=0.0)
    rstd = tl.load(rstd_ptr + rows, mask=row_ok, other=0.0)
    if RMS:
        mean = rstd
    else:
        mean = tl.load(mean_ptr + rows, mask=row_ok, other=0.0)
    return x, dy, mean, rstd


@triton.jit
def _rows_bwd_kernel(dx_ptr, dw_part_ptr, db_part_ptr, dy_ptr, x_ptr, w_ptr, mean_ptr, rstd_ptr,
                     n_rows, n_cols, rows_per_program, stride_xm, stride_xn, stride_dm,
                     stride_dn,
                     RMS: tl.constexpr, HAS_W: tl.constexpr, COMPUTE_DX: tl.constexpr,
                     COMPUTE_DW: tl.constexpr, COMPUTE_DB: tl.constexpr,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, ACC: tl.constexpr,
                     COL64: tl.constexpr, DEPTH: tl.constexpr):
    # one program: a stripe of rows_per_program rows, BLOCK_M at a time, the next DEPTH steps'
    # loads (1 or 2) in flight while these are reduced; dx of the stripe and one row of the
    # dweight / dbias partial sums
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    col_ok = cols < n_cols
    x_cols = col_offsets(cols, stride_xn, COL64)
    d_cols = col_offsets(cols, stride_dn, COL64)
    if HAS_W:
        w = tl.load(w_ptr + cols, mask=col_ok, other=0.0).to(ACC)
    dw_acc = tl.zeros([BLOCK_N], ACC)
    db_acc = tl.zeros([BLOCK_N], ACC)
    row_start = pid * rows_per_program
    row_end = tl.minimum(row_start + rows_per_program, n_rows)
    x_raw, dy_raw, mean, rstd = _rows_load(
        x_ptr, dy_ptr, mean_ptr, rstd_ptr, row_start + tl.arange(0, BLOCK_M), row_end, x_cols,
        d_cols, col_ok, stride_xm, stride_dm, RMS)
    if DEPTH == 2:
        x_raw2, dy_raw2, mean2, rstd2 = _rows_load(
            x_ptr, dy_ptr, mean_ptr, rstd_ptr, row_start + BLOCK_M + tl.arange(0, BLOCK_M),
            row_end, x_cols, d_cols, col_ok, stride_xm, stride_dm, RMS)
    for start in range(row_start, row_end, BLOCK_M):
        x = x_raw.to(ACC)
        dy = dy_raw.to(ACC)
        rstd_t = rstd
        mean_t = mean
        rows = start + tl.arange(0, BLOCK_M)
        mask = (rows < row_end)[:, None] & col_ok[None, :]
        if DEPTH == 2:
            x_raw, dy_raw, mean, rstd = x_raw2, dy_raw2, mean2, rstd2
            x_raw2, dy_raw2, mean2, rstd2 = _rows_load(
                x_ptr, dy_ptr, mean_ptr, rstd_ptr, rows + 2 * BLOCK_M, row_end, x_cols, d_cols,
                col_ok, stride_xm, stride_dm, RMS)
        else:
            x_raw, dy_raw, mean, rstd = _rows_load(
                x_ptr, dy_ptr, mean_ptr, rstd_ptr, rows + BLOCK_M, row_end, x_cols, d_cols,
                col_ok, stride_xm, stride_dm, RMS)
        if RMS:
            xhat = x * rstd_t[:, None]
        else:
            xhat = tl.where(mask, (x - mean_t[:, None]) * rstd_t[:, None], 0.0)
        if HAS_W:
            g = dy * w[None, :]
        else:
            g = dy
        if COMPUTE_DX:
            c1 = tl.sum(xhat * g, 1) / n_cols
            if RMS:
                dx = (g - xhat * c1[:, None]) * rstd_t[:, None]
            else:
                c2 = tl.sum(g, 1) / n_cols
                dx = (g - (xhat * c1[:, None] + c2[:, None])) * rstd_t[:, None]
            tl.store((dx_ptr + rows.to(tl.int64) * n_cols)[:, None] + cols[None, :],
                     dx.to(dx_ptr.dtype.element_ty), mask=mask)
        if COMPUTE_DW:
            dw_acc += tl.sum(dy * xhat, 0)
        if COMPUTE_DB:
            db_acc += tl.sum(dy, 0)
    part = pid.to(tl.int64) * n_cols
    if COMPUTE_DW:
        tl.store(dw_part_ptr + part + cols, dw_acc, mask=col_ok)
    if COMPUTE_DB:
        tl.store(db_part_ptr + part + cols, db_acc, mask=col_ok)


def depth(itemsize, s):
    """Steps of loads in flight ahead: s.half_depth for 2-byte dtypes, s.depth for wider."""
    return s.half_depth if itemsize <= 2 else s.depth


def row_blocks(n_rows, n_cols, s):
    """(BLOCK_M, BLOCK_N, num_warps) of the row backward: whole rows, about s.row_tile
    elements a step, 8 a thread (16 warps for 4096: about 110 registers a thread, no spills,
    sm_90 cubins of Triton 3.9 by cuobjdump --dump-resource-usage, 2026-12-02)."""
    block_n = next_power_of_2(max(n_cols, 1))
    elements = max(s.row_tile, INTERPRET_MIN_TILE)
    block_m = max(1, min(next_power_of_2(max(n_rows, 1)), elements // block_n))
    return block_m, block_n, max(4, min(MAX_WARPS, block_m * block_n // 256))


def rows_backward(dy, x, weight, mean, rstd, rms, need_dx, need_dw, need_db, s, col64):
    """dx (or None) and the [need_dw + need_db, programs, cols] float32 partial sums of dweight
    and dbias (or None) of layer_norm / rms_norm; kernels/norm.py sums the partials."""
    n_rows, n_cols = x.shape
    block_m, block_n, warps = row_blocks(n_rows, n_cols, s)
    blocks = cdiv(n_rows, block_m)
    programs = max(1, min(blocks, program_count(x.device, s.row_programs_per_sm)))
    rows_per = cdiv(blocks, programs) * block_m
    programs = max(1, cdiv(n_rows, rows_per))
    dx = empty(x.shape, x.dtype, x.device) if need_dx else None
    parts = empty((int(need_dw) + int(need_db), programs, n_cols), stat_dtype(x.dtype),
                  x.device) if need_dw or need_db else None
    dw_part = parts[0] if need_dw else rstd
    db_part = parts[int(need_dw)] if need_db else rstd
    if n_rows and (need_dx or need_dw or need_db):
        run(_rows_bwd_kernel, (programs,), dx if need_dx else x, dw_part, db_part, dy, x,
            weight if weight is not None else x, mean, rstd, n_rows, n_cols, rows_per,
            x.stride(0), x.stride(1), dy.stride(0), dy.stride(1),
            RMS=bool(rms), HAS_W=weight is not None, COMPUTE_DX=bool(need_dx),
            COMPUTE_DW=need_dw, COMPUTE_DB=need_db, BLOCK_M=block_m, BLOCK_N=block_n,
            ACC=acc_type(x.dtype), COL64=col64,
            # (rows past 4096 columns spill registers at one step ahead already)
            DEPTH=depth(x.element_size(), s) if block_n <= 4096 else 1, num_warps=warps)
    return dx, parts


# ---------------------------------------------------------------------------------- batch_norm
#
# As kernels/norm.py: per channel c over its m = N * S values:
#   training: each program, over its n_i values, p_i = the mean of its first tile,
#             s1 = sum(x - p_i), s2 = sum((x - p_i)^2) (per lane, then across lanes),
#             mean_i = p_i + s1 / n_i, M2_i = s2 - s1^2 / n_i; then over the programs in a
#             fixed order mu = sum n_i mean_i / m, M2 = sum M2_i + n_i (mean_i - mu)^2,
#             var = M2 / m, rstd = 1 / sqrt(var + eps); running statistics as torch's
#             (unbiased var M2 / (m - 1), momentum or the cumulative average)
#   y = act(xhat w + b),  xhat = (x - mu) rstd
# Backward, g = dy act'(xhat w + b):  db = sum(g), dw = sum(g xhat),
#   training: dx = w rstd (g - (db + xhat dw) / m)      eval: dx = w rstd g
# Memory traffic: forward reads x twice and writes y (3 x itemsize a element; the second read
# often from L2: 12.8 MB at 512x256x7x7 bf16); backward reads x and dy twice and writes dx (5 x);
# the [3, splits, C] float32 partials are 3 x splits x C x 4 bytes (0.8 MB at C = 256 and 264
# splits).


@triton.jit
def _tile_load(ptr, k, k1, n_sblocks, S, cols, c_ok, s_n, s_s, s_c, BLOCK_S: tl.constexpr,
               OFF64: tl.constexpr):
    # (the raw [BLOCK_S, BLOCK_C] tile k of an [N, S, C] array, its mask): issued, not waited
    # on; a tile k >= k1 (past the program's last) is all masked, no memory touched
    base, offs, s_ok = tile_offsets(k, n_sblocks, tl.where(k < k1, S, 0), cols, s_n, s_s, s_c,
                                    BLOCK_S, OFF64)
    mask = s_ok[:, None] & c_ok[None, :]
    return tl.load(ptr + base + offs, mask=mask, other=0.0), mask


@triton.jit
def _bn_stats_kernel(part_ptr, x_ptr, S, C, s_n, s_s, s_c, n_sblocks, n_chunks,
                     chunks_per_program, n_splits,
                     BLOCK_S: tl.constexpr, BLOCK_C: tl.constexpr, ACC: tl.constexpr,
                     OFF64: tl.constexpr, DEPTH: tl.constexpr):
    # one program: BLOCK_C channels over chunks_per_program tiles, the next DEPTH tiles' loads
    # in flight; sums of x - p and (x - p)^2 per lane, p = the mean of the program's first
    # tile; writes its (mean, M2, count) as row `split` of part[3, splits, C]
    cols = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    split = tl.program_id(1)
    c_ok = cols < C
    k0 = split * chunks_per_program
    k1 = tl.minimum(k0 + chunks_per_program, n_chunks)
    x_next, mask_next = _tile_load(x_ptr, k0, k1, n_sblocks, S, cols, c_ok, s_n, s_s, s_c,
                                   BLOCK_S, OFF64)
    if DEPTH == 2:
        x_next2, mask_next2 = _tile_load(x_ptr, k0 + 1, k1, n_sblocks, S, cols, c_ok, s_n, s_s,
                                         s_c, BLOCK_S, OFF64)
    pivot = tl.sum(x_next.to(ACC), 0) / tl.maximum(tl.sum(mask_next.to(ACC), 0), 1.0)
    s1 = tl.zeros([BLOCK_S, BLOCK_C], ACC)
    s2 = tl.zeros([BLOCK_S, BLOCK_C], ACC)
    count = tl.zeros([], ACC)
    for k in range(k0, k1):
        x = x_next.to(ACC)
        mask = mask_next
        if DEPTH == 2:
            x_next, mask_next = x_next2, mask_next2
            x_next2, mask_next2 = _tile_load(x_ptr, k + 2, k1, n_sblocks, S, cols, c_ok, s_n,
                                             s_s, s_c, BLOCK_S, OFF64)
        else:
            x_next, mask_next = _tile_load(x_ptr, k + 1, k1, n_sblocks, S, cols, c_ok, s_n,
                                           s_s, s_c, BLOCK_S, OFF64)
        d = tl.where(mask, x - pivot[None, :], 0.0)
        s1 += d
        s2 += d * d
        count += tl.minimum(S - (k % n_sblocks) * BLOCK_S, BLOCK_S).to(ACC)
    t1 = tl.sum(s1, 0)
    row = split.to(tl.int64) * C + cols
    tl.store(part_ptr + row, pivot + t1 / count, mask=c_ok)
    tl.store(part_ptr + n_splits * C + row, tl.sum(s2, 0) - t1 * t1 / count, mask=c_ok)
    tl.store(part_ptr + 2 * n_splits * C + row, tl.zeros([BLOCK_C], ACC) + count, mask=c_ok)


@triton.jit
def _bn_finish_kernel(mean_ptr, rstd_ptr, part_ptr, rm_ptr, rv_ptr, nbt_ptr, C, n_splits,
                      momentum, eps,
                      TRAINING: tl.constexpr, UPDATE: tl.constexpr, CUMULATIVE: tl.constexpr,
                      BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr, ACC: tl.constexpr):
    # one program: BLOCK_C channels' mean and rstd, and their running statistics' update.
    # The splits' (n_i, mean_i, M2_i) combine as n = sum n_i, mean = sum n_i mean_i / n,
    # M2 = sum M2_i + sum n_i (mean_i - mean)^2 (Chan et al.; exact), in a fixed order, in one
    # pass of [BLOCK_P, BLOCK_C] loads (one load each for up to BLOCK_P splits: the finish
    # costs one memory round trip). num_batches_tracked is read here (momentum=None:
    # f = 1 / (its value + 1)) and incremented by the apply kernel, which runs after this one.
    cols = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    c_ok = cols < C
    if TRAINING:
        # per lane (a row of the [BLOCK_P, BLOCK_C] tile), the splits it meets combine as they
        # come; then the lanes combine: one pass over the partials
        count = tl.zeros([BLOCK_P, BLOCK_C], ACC)
        mean_l = tl.zeros([BLOCK_P, BLOCK_C], ACC)
        m2 = tl.zeros([BLOCK_P, BLOCK_C], ACC)
        for p0 in range(0, n_splits, BLOCK_P):
            rows = p0 + tl.arange(0, BLOCK_P)
            mask = (rows < n_splits)[:, None] & c_ok[None, :]
            at = rows[:, None] * C + cols[None, :]
            p_mean = tl.load(part_ptr + at, mask=mask, other=0.0)
            p_m2 = tl.load(part_ptr + n_splits * C + at, mask=mask, other=0.0)
            p_count = tl.load(part_ptr + 2 * n_splits * C + at, mask=mask, other=0.0)
            total = count + p_count
            share = p_count / tl.maximum(total, 1.0)
            delta = p_mean - mean_l
            mean_l += delta * share
            m2 += p_m2 + delta * delta * count * share
            count = total
        n = tl.sum(count, 0)
        mean = tl.sum(count * mean_l, 0) / n
        delta = mean_l - mean[None, :]
        m2 = m2 + count * delta * delta
        m2_total = tl.maximum(tl.sum(m2, 0), 0.0)
        var = m2_total / n
        if UPDATE:
            factor = momentum
            if CUMULATIVE:
                factor = 1.0 / (tl.load(nbt_ptr) + 1).to(ACC)
            rm = tl.load(rm_ptr + cols, mask=c_ok, other=0.0).to(ACC)
            rv = tl.load(rv_ptr + cols, mask=c_ok, other=0.0).to(ACC)
            rm = rm * (1.0 - factor) + mean * factor
            rv = rv * (1.0 - factor) + (m2_total / (n - 1.0)) * factor
            tl.store(rm_ptr + cols, rm.to(rm_ptr.dtype.element_ty), mask=c_ok)
            tl.store(rv_ptr + cols, rv.to(rv_ptr.dtype.element_ty), mask=c_ok)
    else:
        mean = tl.load(rm_ptr + cols, mask=c_ok, other=0.0).to(ACC)
        var = tl.load(rv_ptr + cols, mask=c_ok, other=1.0).to(ACC)
    tl.store(mean_ptr + cols, mean, mask=c_ok)
    tl.store(rstd_ptr + cols, 1.0 / tl.sqrt(var + eps), mask=c_ok)


@triton.jit
def _elementwise_tile(pid, n_cblocks, n_splits, per, n_chunks, L2_ORDER: tl.constexpr):
    # (tile k, channel block) of program pid of an elementwise pass. L2_ORDER: the reduction
    # before it walked stripes i of `per` tiles from first to last, all stripes at once, so its
    # last tiles are the freshest in L2: take step j from the end of every stripe before step
    # j + 1 (pid = (j * n_splits + i) * n_cblocks + block); k = n_chunks past the end.
    t = pid // n_cblocks
    if L2_ORDER:
        k = (t % n_splits) * per + (per - 1 - t // n_splits)
    else:
        k = t
    return tl.minimum(k, n_chunks), pid % n_cblocks


@triton.jit
def _bn_apply_kernel(y_ptr, x_ptr, mean_ptr, rstd_ptr, w_ptr, b_ptr, nbt_ptr, S, C,
                     sx_n, sx_s, sx_c, sy_n, sy_s, sy_c, n_sblocks, n_cblocks, n_splits, per,
                     n_chunks,
                     ACT: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr,
                     HAS_NBT: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_C: tl.constexpr,
                     ACC: tl.constexpr, OFF64: tl.constexpr, L2_ORDER: tl.constexpr):
    # one program: one [BLOCK_S, BLOCK_C] tile (_elementwise_tile); y = act((x - mu) a + b).
    # The first program also counts the batch in num_batches_tracked (after the finish
    # kernel, which read it).
    pid = tl.program_id(0)
    if HAS_NBT:
        if pid == 0:
            tl.store(nbt_ptr, tl.load(nbt_ptr) + 1)
    k, block = _elementwise_tile(pid, n_cblocks, n_splits, per, n_chunks, L2_ORDER)
    S_tile = tl.where(k < n_chunks, S, 0)  # (no positions in a tile past the end)
    cols = block * BLOCK_C + tl.arange(0, BLOCK_C)
    c_ok = cols < C
    x_base, x_offs, s_ok = tile_offsets(k, n_sblocks, S_tile, cols, sx_n, sx_s, sx_c, BLOCK_S,
                                        OFF64)
    mask = s_ok[:, None] & c_ok[None, :]
    x = tl.load(x_ptr + x_base + x_offs, mask=mask, other=0.0).to(ACC)
    mean = tl.load(mean_ptr + cols, mask=c_ok, other=0.0)
    scale = tl.load(rstd_ptr + cols, mask=c_ok, other=0.0)
    if HAS_W:
        scale = scale * tl.load(w_ptr + cols, mask=c_ok, other=0.0).to(ACC)
    shift = tl.zeros([BLOCK_C], ACC)
    if HAS_B:
        shift = tl.load(b_ptr + cols, mask=c_ok, other=0.0).to(ACC)
    y = activate((x - mean[None, :]) * scale[None, :] + shift[None, :], ACT)
    y_base, y_offs, s_ok = tile_offsets(k, n_sblocks, S_tile, cols, sy_n, sy_s, sy_c, BLOCK_S,
                                        OFF64)
    tl.store(y_ptr + y_base + y_offs, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _bn_grad_sums_kernel(part_ptr, dy_ptr, x_ptr, mean_ptr, rstd_ptr, w_ptr, b_ptr, S, C,
                         sx_n, sx_s, sx_c, sd_n, sd_s, sd_c, n_sblocks, n_chunks,
                         chunks_per_program, n_splits,
                         ACT: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr,
                         BLOCK_S: tl.constexpr, BLOCK_C: tl.constexpr, ACC: tl.constexpr,
                         OFF64: tl.constexpr, DEPTH: tl.constexpr):
    # one program: BLOCK_C channels over chunks_per_program tiles, the next DEPTH tiles' x and
    # dy in flight; its sum(g), sum(g xhat) as row `split` of part[2, splits, C]
    cols = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    split = tl.program_id(1)
    c_ok = cols < C
    mean = tl.load(mean_ptr + cols, mask=c_ok, other=0.0)
    rstd = tl.load(rstd_ptr + cols, mask=c_ok, other=0.0)
    w = tl.zeros([BLOCK_C], ACC) + 1.0
    if HAS_W:
        w = tl.load(w_ptr + cols, mask=c_ok, other=0.0).to(ACC)
    b = tl.zeros([BLOCK_C], ACC)
    if HAS_B:
        b = tl.load(b_ptr + cols, mask=c_ok, other=0.0).to(ACC)
    sum_g = tl.zeros([BLOCK_S, BLOCK_C], ACC)
    sum_gx = tl.zeros([BLOCK_S, BLOCK_C], ACC)
    k0 = split * chunks_per_program
    k1 = tl.minimum(k0 + chunks_per_program, n_chunks)
    x_next, mask_next = _tile_load(x_ptr, k0, k1, n_sblocks, S, cols, c_ok, sx_n, sx_s, sx_c,
                                   BLOCK_S, OFF64)
    g_next, mask_next = _tile_load(dy_ptr, k0, k1, n_sblocks, S, cols, c_ok, sd_n, sd_s, sd_c,
                                   BLOCK_S, OFF64)
    if DEPTH == 2:
        x_next2, mask_next2 = _tile_load(x_ptr, k0 + 1, k1, n_sblocks, S, cols, c_ok, sx_n,
                                         sx_s, sx_c, BLOCK_S, OFF64)
        g_next2, mask_next2 = _tile_load(dy_ptr, k0 + 1, k1, n_sblocks, S, cols, c_ok, sd_n,
                                         sd_s, sd_c, BLOCK_S, OFF64)
    for k in range(k0, k1):
        x = x_next.to(ACC)
        g = g_next.to(ACC)
        mask = mask_next
        if DEPTH == 2:
            x_next, g_next, mask_next = x_next2, g_next2, mask_next2
            x_next2, mask_next2 = _tile_load(x_ptr, k + 2, k1, n_sblocks, S, cols, c_ok, sx_n,
                                             sx_s, sx_c, BLOCK_S, OFF64)
            g_next2, mask_next2 = _tile_load(dy_ptr, k + 2, k1, n_sblocks, S, cols, c_ok, sd_n,
                                             sd_s, sd_c, BLOCK_S, OFF64)
        else:
            x_next, mask_next = _tile_load(x_ptr, k + 1, k1, n_sblocks, S, cols, c_ok, sx_n,
                                           sx_s, sx_c, BLOCK_S, OFF64)
            g_next, mask_next = _tile_load(dy_ptr, k + 1, k1, n_sblocks, S, cols, c_ok, sd_n,
                                           sd_s, sd_c, BLOCK_S, OFF64)
        xhat = (x - mean[None, :]) * rstd[None, :]
        if ACT != 0:
            g = activation_grad(g, xhat * w[None, :] + b[None, :], ACT)
        g = tl.where(mask, g, 0.0)
        sum_g += g
        sum_gx += g * xhat
    row = split.to(tl.int64) * C + cols
    tl.store(part_ptr + row, tl.sum(sum_g, 0), mask=c_ok)
    tl.store(part_ptr + n_splits * C + row, tl.sum(sum_gx, 0), mask=c_ok)


@triton.jit
def _bn_grad_finish_kernel(sums_ptr, dw_ptr, db_ptr, part_ptr, C, n_splits,
                           WRITE_DW: tl.constexpr, WRITE_DB: tl.constexpr,
                           BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr, ACC: tl.constexpr):
    # one program: BLOCK_C channels; db = sum(g), dw = sum(g xhat) over the splits, in a fixed
    # order, [BLOCK_P, BLOCK_C] at a time
    cols = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    c_ok = cols < C
    sum_g = tl.zeros([BLOCK_P, BLOCK_C], ACC)
    sum_gx = tl.zeros([BLOCK_P, BLOCK_C], ACC)
    for p0 in range(0, n_splits, BLOCK_P):
        rows = p0 + tl.arange(0, BLOCK_P)
        mask = (rows < n_splits)[:, None] & c_ok[None, :]
        at = rows[:, None] * C + cols[None, :]
        sum_g += tl.load(part_ptr + at, mask=mask, other=0.0)
        sum_gx += tl.load(part_ptr + n_splits * C + at, mask=mask, other=0.0)
    total_g = tl.sum(sum_g, 0)
    total_gx = tl.sum(sum_gx, 0)
    tl.store(sums_ptr + cols, total_g, mask=c_ok)
    tl.store(sums_ptr + C + cols, total_gx, mask=c_ok)
    if WRITE_DW:
        tl.store(dw_ptr + cols, total_gx.to(dw_ptr.dtype.element_ty), mask=c_ok)
    if WRITE_DB:
        tl.store(db_ptr + cols, total_g.to(db_ptr.dtype.element_ty), mask=c_ok)


@triton.jit
def _bn_dx_kernel(dx_ptr, dy_ptr, x_ptr, mean_ptr, rstd_ptr, w_ptr, b_ptr, sums_ptr, S, C,
                  sx_n, sx_s, sx_c, sd_n, sd_s, sd_c, so_n, so_s, so_c, n_sblocks, n_cblocks,
                  n_splits, per, n_chunks, inv_count,
                  TRAINING: tl.constexpr, ACT: tl.constexpr, HAS_W: tl.constexpr,
                  HAS_B: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_C: tl.constexpr,
                  ACC: tl.constexpr, OFF64: tl.constexpr, L2_ORDER: tl.constexpr):
    # one program: one [BLOCK_S, BLOCK_C] tile of dx (_elementwise_tile)
    k, block = _elementwise_tile(tl.program_id(0), n_cblocks, n_splits, per, n_chunks,
                                 L2_ORDER)
    S_tile = tl.where(k < n_chunks, S, 0)  # (no positions in a tile past the end)
    cols = block * BLOCK_C + tl.arange(0, BLOCK_C)
    c_ok = cols < C
    x_base, x_offs, s_ok = tile_offsets(k, n_sblocks, S_tile, cols, sx_n, sx_s, sx_c, BLOCK_S,
                                        OFF64)
    d_base, d_offs, s_ok = tile_offsets(k, n_sblocks, S_tile, cols, sd_n, sd_s, sd_c, BLOCK_S,
                                        OFF64)
    mask = s_ok[:, None] & c_ok[None, :]
    x = tl.load(x_ptr + x_base + x_offs, mask=mask, other=0.0).to(ACC)
    g = tl.load(dy_ptr + d_base + d_offs, mask=mask, other=0.0).to(ACC)
    mean = tl.load(mean_ptr + cols, mask=c_ok, other=0.0)
    rstd = tl.load(rstd_ptr + cols, mask=c_ok, other=0.0)
    w = tl.zeros([BLOCK_C], ACC) + 1.0
    if HAS_W:
        w = tl.load(w_ptr + cols, mask=c_ok, other=0.0).to(ACC)
    b = tl.zeros([BLOCK_C], ACC)
    if HAS_B:
        b = tl.load(b_ptr + cols, mask=c_ok, other=0.0).to(ACC)
    xhat = (x - mean[None, :]) * rstd[None, :]
    if ACT != 0:
        g = activation_grad(g, xhat * w[None, :] + b[None, :], ACT)
    if TRAINING:
        mean_g = tl.load(sums_ptr + cols, mask=c_ok, other=0.0) * inv_count
        mean_gx = tl.load(sums_ptr + C + cols, mask=c_ok, other=0.0) * inv_count
        g = g - (mean_g[None, :] + xhat * mean_gx[None, :])
    dx = g * (w * rstd)[None, :]
    o_base, o_offs, s_ok = tile_offsets(k, n_sblocks, S_tile, cols, so_n, so_s, so_c, BLOCK_S,
                                        OFF64)
    tl.store(dx_ptr + o_base + o_offs, dx.to(dx_ptr.dtype.element_ty), mask=mask)


def bn_tiles(N, S, C, channels_inner, elements, programs, *strides):
    """Tiling of an [N, S, C] pass: (n_sblocks, n_cblocks, n_chunks, per, splits, meta). Tiles
    of about `elements` along the contiguous axis, 8 a thread; a reduction spreads over about
    `programs` programs (splits of `per` tiles each a channel block); int32 offsets in a sample
    unless some array's reach passes 2**31."""
    elements = max(elements, INTERPRET_MIN_TILE)
    if channels_inner:
        block_c = min(next_power_of_2(C), 256)
        block_s = max(1, min(next_power_of_2(S), elements // block_c))
    else:
        block_s = min(next_power_of_2(S), 1024)
        block_c = max(1, min(next_power_of_2(C), elements // block_s))
    n_sblocks = cdiv(S, block_s)
    n_cblocks = cdiv(C, block_c)
    n_chunks = N * n_sblocks
    splits = max(1, min(n_chunks, cdiv(programs, n_cblocks)))
    per = cdiv(n_chunks, splits)
    splits = cdiv(n_chunks, per)
    reach = max(abs(s_s) * (S + block_s) + abs(s_c) * (C + block_c) for _, s_s, s_c in strides)
    meta = {"BLOCK_S": block_s, "BLOCK_C": block_c, "OFF64": reach >= 2 ** 31,
            "num_warps": max(1, min(16, block_s * block_c // 256))}
    return n_sblocks, n_cblocks, n_chunks, per, splits, meta


def _bn_passes(N, S, C, channels_inner, device, s, per_sm, *strides):
    """(the reduction's tiling, the elementwise pass's tiling, its grid and L2_ORDER):
    bn_tiles of s.bn_reduce_tile elements over per_sm programs an SM; with s.bn_l2_order the
    elementwise pass takes the same tiles, freshest first (_elementwise_tile), else tiles of
    s.bn_tile elements in order."""
    programs = program_count(device, per_sm)
    reduce = bn_tiles(N, S, C, channels_inner, s.bn_reduce_tile, programs, *strides)
    if s.bn_l2_order:
        n_sblocks, n_cblocks, n_chunks, per, splits, _ = reduce
        return reduce, reduce, n_cblocks * splits * per, True
    apply = bn_tiles(N, S, C, channels_inner, s.bn_tile, programs, *strides)
    return reduce, apply, apply[1] * apply[2], False


def _split_tile(splits, C):
    """(BLOCK_P, BLOCK_C) of the kernels that add up the [splits, C] partials: all splits in
    one tile up to 512 (one load each), channels filling about 2048 elements (8 a thread at
    8 warps: the finish's three running sums fit without spills in float64 too)."""
    block_p = min(next_power_of_2(max(splits, 1)), 512)
    return block_p, max(1, min(next_power_of_2(C), 2048 // block_p))


def bn_forward(y, x, weight, bias, running_mean, running_var, num_batches_tracked, training,
               momentum, eps, activation, N, S, C, x_strides, y_strides, channels_inner, s):
    """kernels/norm.py's batch_norm on the [N, S, C] views: fills y, returns (mean, rstd)."""
    acc = acc_type(x.dtype)
    mean = empty((C,), stat_dtype(x.dtype), x.device)
    rstd = empty((C,), stat_dtype(x.dtype), x.device)
    reduce, apply, grid, l2_order = _bn_passes(N, S, C, channels_inner, x.device, s,
                                               s.bn_programs_per_sm, x_strides, y_strides)
    n_sblocks, n_cblocks, n_chunks, per, splits, meta = reduce
    update = bool(training and running_mean is not None)
    if training:
        part = empty((3, splits, C), stat_dtype(x.dtype), x.device)
        run(_bn_stats_kernel, (n_cblocks, splits), part, x, S, C, *x_strides, n_sblocks,
            n_chunks, per, splits, ACC=acc, DEPTH=depth(x.element_size(), s), **meta)
    else:
        part = mean
    has_nbt = update and num_batches_tracked is not None
    block_p, block_c = _split_tile(splits if training else 1, C)
    run(_bn_finish_kernel, (cdiv(C, block_c),), mean, rstd, part,
        running_mean if running_mean is not None else mean,
        running_var if running_var is not None else rstd,
        num_batches_tracked if has_nbt else mean, C, splits,
        0.0 if momentum is None else float(momentum), float(eps),
        TRAINING=bool(training), UPDATE=update, CUMULATIVE=momentum is None and has_nbt,
        BLOCK_P=block_p, BLOCK_C=block_c, ACC=acc, num_warps=8)
    n_sblocks, n_cblocks, n_chunks, per, splits, meta = apply
    run(_bn_apply_kernel, (grid,), y, x, mean, rstd,
        weight if weight is not None else x, bias if bias is not None else x,
        num_batches_tracked if has_nbt else mean, S, C, *x_strides, *y_strides, n_sblocks,
        n_cblocks, splits, per, n_chunks, ACT=activation, HAS_W=weight is not None,
        HAS_B=bias is not None, HAS_NBT=has_nbt, ACC=acc, L2_ORDER=l2_order, **meta)
    return mean, rstd


def bn_backward(dx, dw, db, dy, x, weight, bias, mean, rstd, training, activation, N, S, C,
                x_strides, d_strides, o_strides, channels_inner, s):
    """kernels/norm.py's batch_norm_backward on the [N, S, C] views: fills dx, dw, db (those
    not None)."""
    acc = acc_type(x.dtype)
    reduce, apply, grid, l2_order = _bn_passes(N, S, C, channels_inner, x.device, s,
                                               s.bn_grad_programs_per_sm, x_strides, d_strides,
                                               o_strides)
    n_sblocks, n_cblocks, n_chunks, per, splits, meta = reduce
    flags = dict(ACT=activation, HAS_W=weight is not None, HAS_B=bias is not None, ACC=acc)
    w_arg = weight if weight is not None else x
    b_arg = bias if bias is not None else x
    sums = mean
    if training and dx is not None or dw is not None or db is not None:
        part = empty((2, splits, C), stat_dtype(x.dtype), x.device)
        run(_bn_grad_sums_kernel, (n_cblocks, splits), part, dy, x, mean, rstd, w_arg, b_arg,
            S, C, *x_strides, *d_strides, n_sblocks, n_chunks, per, splits,
            DEPTH=depth(x.element_size(), s), **flags, **meta)
        sums = empty((2, C), stat_dtype(x.dtype), x.device)
        block_p, block_c = _split_tile(splits, C)
        run(_bn_grad_finish_kernel, (cdiv(C, block_c),), sums,
            dw if dw is not None else sums, db if db is not None else sums, part, C, splits,
            WRITE_DW=dw is not None, WRITE_DB=db is not None, BLOCK_P=block_p,
            BLOCK_C=block_c, ACC=acc, num_warps=8)
    if dx is not None:
        n_sblocks, n_cblocks, n_chunks, per, splits, meta = apply
        run(_bn_dx_kernel, (grid,), dx, dy, x, mean, rstd, w_arg, b_arg, sums,
            S, C, *x_strides, *d_strides, *o_strides, n_sblocks, n_cblocks, splits, per,
            n_chunks, 1.0 / max(N * S, 1), TRAINING=bool(training), L2_ORDER=l2_order,
            **flags, **meta)
