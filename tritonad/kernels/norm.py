"""Normalisation kernels: layer_norm / rms_norm over rows, batch_norm over channels (with relu or
gelu fused), forward and backward. These are the fused forms of the composites in
autodiff/norm_ops.py (their oracle); the numpy backend runs the composites.

The launchers here run one of two variants (kernels/norm_common.py settings, TRITONAD_NORM):
"new" (the default) hands the row-norm backward and the batch-norm passes to
kernels/norm_stream.py; "old" runs the first kernels below, kept so that one GPU run can time
both (bench norms --variant old,new). The row-norm forward below serves both. What follows
describes the old kernels; norm_stream.py's docstring says what the new ones change.

Row norms (layer_norm, rms_norm; group_norm reuses them on rows of one group): x is [rows, cols]
with any strides; a program holds BLOCK_M whole rows in registers (BLOCK_N = next power of two of
cols, at most MAX_COLS), several rows a program for narrow rows so that a program moves about
TILE elements. Backward: a fixed number of programs, each over a contiguous stripe of rows,
writes dx and its partial sums of dweight and dbias as one row of a [programs, cols] float32
buffer; a second kernel sums those rows in order (deterministic, no float atomics).

Batch norm: x is [N, C, *spatial] viewed as [N, S, C] with strides (any of NCHW, channels-last,
[N, C]); a program owns BLOCK_C channels and a run of (n, spatial block) tiles of BLOCK_S
positions: tiles lie along the contiguous axis (spatial for NCHW, channels for channels-last),
so loads are coalesced either way. Statistics combine per-tile means and squared deviations by
Chan's parallel formula in float32 (float64 for float64 inputs), so a large mean loses no
digits; the one-program finish kernel also updates the running statistics and
num_batches_tracked on the device (no host read: a CUDA graph can capture a training step).
"""
from __future__ import annotations

import math

import triton
import triton.language as tl

from .elementwise import contiguous
from .launch import INTERPRET, cdiv, dtype_of, next_power_of_2
from . import norm_stream
from .norm_common import (acc_type, activate, activation_grad, col_offsets, program_count,
                          settings, stat_dtype, tile_offsets)
from .plans import empty, planned, run

PRIMITIVES = ("layer_norm", "layer_norm_backward", "batch_norm", "batch_norm_backward")

MAX_COLS = 16384                          # widest row held in registers (norm_ops composes above)
TILE = 1 << 14 if INTERPRET else 4096     # elements a program holds at once
PROGRAMS_PER_SM = 4                       # old variant: row-norm backward and batch-norm passes
_ACTIVATIONS = {None: 0, "relu": 1, "gelu": 2}
_acc, _stat_dtype = acc_type, stat_dtype


def _programs(device):
    """How many programs an old-variant pass over the whole tensor spreads over."""
    return program_count(device, PROGRAMS_PER_SM)


# ------------------------------------------------------------------------- layer_norm / rms_norm
#
# Per row of n = cols elements, with w = weight (1 if none), b = bias (0 if none):
#   layer_norm:  mu = sum(x) / n,  rstd = 1 / sqrt(sum((x - mu)^2) / n + eps),
#                xhat = (x - mu) rstd,  y = xhat w + b
#   rms_norm:    rstd = 1 / sqrt(sum(x^2) / n + eps),  xhat = x rstd,  y = xhat w
# Backward, with g = w dy:
#   layer_norm:  dx = rstd (g - (xhat sum(g xhat) + sum(g)) / n)
#   rms_norm:    dx = rstd (g - xhat sum(g xhat) / n)
#   dw = sum over rows of dy xhat,  db = sum over rows of dy
# Memory traffic per element: forward reads x and writes y (plus 8 bytes a row for mu, rstd);
# backward reads x and dy and writes dx; the [programs, cols] partials add 2 * programs / rows
# of a row's bytes. torch's composite rms_norm (pow, mean, add, rsqrt, mul, mul) moves about
# six times as much each way.


@triton.jit
def _norm_fwd_kernel(y_ptr, mean_ptr, rstd_ptr, x_ptr, w_ptr, b_ptr, n_rows, n_cols,
                     stride_xm, stride_xn, eps,
                     RMS: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, ACC: tl.constexpr,
                     COL64: tl.constexpr):
    # one program: BLOCK_M whole rows; y contiguous [rows, cols]; mu (layer_norm) and rstd saved
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    row_ok = rows < n_rows
    col_ok = cols < n_cols
    mask = row_ok[:, None] & col_ok[None, :]
    rows64 = rows.to(tl.int64)
    x_cols = col_offsets(cols, stride_xn, COL64)
    x = tl.load((x_ptr + rows64 * stride_xm)[:, None] + x_cols[None, :], mask=mask,
                other=0.0).to(ACC)
    if RMS:
        xc = x
    else:
        mean = tl.sum(x, 1) / n_cols
        xc = tl.where(mask, x - mean[:, None], 0.0)
        tl.store(mean_ptr + rows, mean, mask=row_ok)
    rstd = 1.0 / tl.sqrt(tl.sum(xc * xc, 1) / n_cols + eps)
    tl.store(rstd_ptr + rows, rstd, mask=row_ok)
    y = xc * rstd[:, None]
    if HAS_W:
        y = y * tl.load(w_ptr + cols, mask=col_ok, other=0.0).to(ACC)[None, :]
    if HAS_B:
        y = y + tl.load(b_ptr + cols, mask=col_ok, other=0.0).to(ACC)[None, :]
    tl.store((y_ptr + rows64 * n_cols)[:, None] + cols[None, :], y.to(y_ptr.dtype.element_ty),
             mask=mask)


@triton.jit
def _norm_bwd_kernel(dx_ptr, dw_part_ptr, db_part_ptr, dy_ptr, x_ptr, w_ptr, mean_ptr, rstd_ptr,
                     n_rows, n_cols, rows_per_program, stride_xm, stride_xn, stride_dm,
                     stride_dn,
                     RMS: tl.constexpr, HAS_W: tl.constexpr, COMPUTE_DX: tl.constexpr,
                     COMPUTE_DW: tl.constexpr, COMPUTE_DB: tl.constexpr,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, ACC: tl.constexpr,
                     COL64: tl.constexpr):
    # one program: a stripe of rows_per_program rows, BLOCK_M at a time; dx of those rows and
    # one row of the dweight / dbias partial sums
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
    for start in range(row_start, row_end, BLOCK_M):
        rows = start + tl.arange(0, BLOCK_M)
        row_ok = rows < row_end
        mask = row_ok[:, None] & col_ok[None, :]
        rows64 = rows.to(tl.int64)
        x = tl.load((x_ptr + rows64 * stride_xm)[:, None] + x_cols[None, :], mask=mask,
                    other=0.0).to(ACC)
        dy = tl.load((dy_ptr + rows64 * stride_dm)[:, None] + d_cols[None, :], mask=mask,
                     other=0.0).to(ACC)
        rstd = tl.load(rstd_ptr + rows, mask=row_ok, other=0.0)
        if RMS:
            xhat = x * rstd[:, None]
        else:
            mean = tl.load(mean_ptr + rows, mask=row_ok, other=0.0)
            xhat = tl.where(mask, (x - mean[:, None]) * rstd[:, None], 0.0)
        if HAS_W:
            g = dy * w[None, :]
        else:
            g = dy
        if COMPUTE_DX:
            c1 = tl.sum(xhat * g, 1) / n_cols
            if RMS:
                dx = (g - xhat * c1[:, None]) * rstd[:, None]
            else:
                c2 = tl.sum(g, 1) / n_cols
                dx = (g - (xhat * c1[:, None] + c2[:, None])) * rstd[:, None]
            tl.store((dx_ptr + rows64 * n_cols)[:, None] + cols[None, :],
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


@triton.jit
def _sum_parts_kernel(out0_ptr, out1_ptr, part_ptr, n_parts, n_cols, BLOCK_P: tl.constexpr,
                      BLOCK_C: tl.constexpr, ACC: tl.constexpr):
    # out_k[c] = sum over p of part[k, p, c], in a fixed order (k = program_id(1): dweight and
    # dbias in one launch); one program: BLOCK_C columns of one of them.
    # Traffic: reads the [k, parts, cols] partials once.
    which = tl.program_id(1)
    part_ptr += which.to(tl.int64) * n_parts * n_cols
    cols = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    col_ok = cols < n_cols
    acc = tl.zeros([BLOCK_P, BLOCK_C], ACC)
    for p0 in range(0, n_parts, BLOCK_P):
        parts = p0 + tl.arange(0, BLOCK_P)
        mask = (parts < n_parts)[:, None] & col_ok[None, :]
        acc += tl.load(part_ptr + parts.to(tl.int64)[:, None] * n_cols + cols[None, :], mask=mask,
                       other=0.0)
    total = tl.sum(acc, 0)
    if which == 0:
        tl.store(out0_ptr + cols, total.to(out0_ptr.dtype.element_ty), mask=col_ok)
    else:
        tl.store(out1_ptr + cols, total.to(out1_ptr.dtype.element_ty), mask=col_ok)


def _row_blocks(n_rows, n_cols, op):
    """(BLOCK_M, BLOCK_N, num_warps): whole rows, packed to about TILE elements a program."""
    block_n = next_power_of_2(max(n_cols, 1))
    if block_n > MAX_COLS:
        raise ValueError(f"{op}: rows of {n_cols} elements are wider than the fused kernel's "
                         f"{MAX_COLS}")
    block_m = max(1, min(next_power_of_2(max(n_rows, 1)), TILE // block_n))
    # 16 elements a thread forward, 8 backward (it holds x, dy, xhat and the dw, db sums): no
    # register spills up to 4096 columns; the backward spills some above (cuobjdump
    # --dump-resource-usage of the sm_90 cubins, Triton 3.9, 2026-12-02)
    per_thread = 16 if op == "layer_norm" else 8
    warps = max(4, min(32, block_m * block_n // (32 * per_thread)))
    return block_m, block_n, warps


def _col64(n_cols, *strides):
    return max(n_cols - 1, 0) * max(abs(s) for s in strides) >= 2 ** 31


def _check_rows(op, x, *params):
    if x.dim() != 2 or not x.dtype.is_floating_point:
        raise ValueError(f"{op}: expected a floating point [rows, cols] array, got shape "
                         f"{tuple(x.shape)} {dtype_of(x).name}")
    for p in params:
        if p is not None and tuple(p.shape) != (x.shape[1],):
            raise ValueError(f"{op}: weight / bias of shape {tuple(p.shape)} do not match rows "
                             f"of {x.shape[1]}")


def _sum_parts(parts, outs):
    """Each outs[k] = parts[k].sum(0) (parts: [len(outs), programs, cols]), one launch."""
    n_out, n_parts, n_cols = parts.shape
    # narrow column blocks, all partials in one or two loads: enough programs to read them at
    # once rather than a few programs walking them
    block_c = min(next_power_of_2(n_cols), 16)
    block_p = max(1, min(next_power_of_2(n_parts), 256))
    run(_sum_parts_kernel, (cdiv(n_cols, block_c), n_out), outs[0], outs[-1], parts, n_parts,
        n_cols, BLOCK_P=block_p, BLOCK_C=block_c, ACC=_acc(parts.dtype), num_warps=4)


def _rows_backward_old(dy, x, weight, mean, rstd, rms, need_dx, need_dw, need_db, col64):
    """dx (or None) and the [need_dw + need_db, programs, cols] partial sums of dweight and
    dbias (or None): variant old."""
    n_rows, n_cols = x.shape
    block_m, block_n, warps = _row_blocks(n_rows, n_cols, "layer_norm_backward")
    blocks = cdiv(n_rows, block_m)
    programs = max(1, min(blocks, _programs(x.device)))
    rows_per = cdiv(blocks, programs) * block_m
    programs = max(1, cdiv(n_rows, rows_per))
    acc_dtype = _stat_dtype(x.dtype)
    dx = empty(x.shape, x.dtype, x.device) if need_dx else None
    parts = empty((int(need_dw) + int(need_db), programs, n_cols), acc_dtype, x.device) \
        if need_dw or need_db else None
    dw_part = parts[0] if need_dw else None
    db_part = parts[int(need_dw)] if need_db else None
    if n_rows and (need_dx or need_dw or need_db):
        run(_norm_bwd_kernel, (programs,), dx if need_dx else x,
            dw_part if need_dw else rstd, db_part if need_db else rstd, dy, x,
            weight if weight is not None else x, mean, rstd, n_rows, n_cols, rows_per,
            x.stride(0), x.stride(1), dy.stride(0), dy.stride(1),
            RMS=bool(rms), HAS_W=weight is not None, COMPUTE_DX=bool(need_dx),
            COMPUTE_DW=need_dw, COMPUTE_DB=need_db, BLOCK_M=block_m, BLOCK_N=block_n,
            ACC=_acc(x.dtype), COL64=col64,
            num_warps=warps)
    return dx, parts


@planned(arrays=3)
def layer_norm(x, weight, bias, eps, rms):
    """Row normalisation: (y, mean, rstd). x: [rows, cols] any strides; weight, bias: [cols] or
    None; rms: rms_norm (no mean, no bias) instead of layer_norm. y: [rows, cols] contiguous in
    x's dtype; mean, rstd: [rows] float32 (float64 for float64 x; mean unset for rms)."""
    _check_rows("layer_norm", x, weight, bias)
    n_rows, n_cols = x.shape
    y = empty((n_rows, n_cols), x.dtype, x.device)
    mean = empty((n_rows,), _stat_dtype(x.dtype), x.device)
    rstd = empty((n_rows,), _stat_dtype(x.dtype), x.device)
    block_m, block_n, warps = _row_blocks(n_rows, n_cols, "layer_norm")
    if n_rows:
        run(_norm_fwd_kernel, (cdiv(n_rows, block_m),), y, mean, rstd, x,
            weight if weight is not None else x, bias if bias is not None else x,
            n_rows, n_cols, x.stride(0), x.stride(1), float(eps),
            RMS=bool(rms), HAS_W=weight is not None, HAS_B=bias is not None and not rms,
            BLOCK_M=block_m, BLOCK_N=block_n, ACC=_acc(x.dtype),
            COL64=_col64(n_cols, x.stride(1), 1), num_warps=warps)
    return y, mean, rstd


@planned(settings=settings, arrays=6)
def layer_norm_backward(dy, x, weight, bias, mean, rstd, rms, need_dx, need_dw, need_db):
    """(dx, dweight, dbias) of layer_norm (rms_norm if rms), each None unless asked for.
    dy, x: [rows, cols] any strides; weight, bias: [cols] or None (their dtypes are the
    gradients'); mean, rstd: layer_norm's. dx contiguous."""
    _check_rows("layer_norm_backward", x, weight, bias)
    if tuple(dy.shape) != tuple(x.shape):
        raise ValueError(f"layer_norm_backward: dy of shape {tuple(dy.shape)} does not match x "
                         f"of shape {tuple(x.shape)}")
    n_rows, n_cols = x.shape
    need_dw = bool(need_dw and weight is not None)
    need_db = bool(need_db and bias is not None)
    col64 = _col64(n_cols, x.stride(1), dy.stride(1))
    s = settings()
    if s.variant == "new":
        dx, parts = norm_stream.rows_backward(dy, x, weight, mean, rstd, rms, bool(need_dx),
                                              need_dw, need_db, s, col64)
    else:
        dx, parts = _rows_backward_old(dy, x, weight, mean, rstd, rms, bool(need_dx), need_dw,
                                       need_db, col64)
    dw = empty((n_cols,), weight.dtype, x.device) if need_dw else None
    db = empty((n_cols,), bias.dtype, x.device) if need_db else None
    if parts is not None:
        _sum_parts(parts, [o for o in (dw, db) if o is not None])
    return dx, dw, db


# ---------------------------------------------------------------------------------- batch_norm
#
# Per channel c over its m = N * S values, with w = weight (1), b = bias (0), act = identity,
# relu or gelu:
#   training: mu, var = mean and biased variance of x (Chan's combination of per-tile
#             (count, mean, M2)), rstd = 1 / sqrt(var + eps);
#             running_mean = (1 - f) running_mean + f mu,
#             running_var  = (1 - f) running_var + f var m / (m - 1),
#             f = momentum, or 1 / num_batches_tracked (momentum None), after its increment
#   eval:     mu, rstd from running_mean, running_var
#   y = act(z),  z = xhat w + b,  xhat = (x - mu) rstd
# Backward, g = dy act'(z) (recomputed from x; nothing else is saved):
#   db = sum(g),  dw = sum(g xhat)
#   training: dx = w rstd (g - (db + xhat dw) / m)      eval: dx = w rstd g
# Memory traffic: forward reads x twice (statistics, then y) and writes y; backward reads x
# and dy twice and writes dx; the [splits, C] partials are small. An activation costs nothing
# extra (PyTorch's batch_norm then gelu writes and reads z once more each way).


@triton.jit
def _bn_stats_kernel(part_ptr, x_ptr, S, C, s_n, s_s, s_c, n_sblocks, n_chunks,
                     chunks_per_program, n_splits,
                     BLOCK_S: tl.constexpr, BLOCK_C: tl.constexpr, ACC: tl.constexpr,
                     OFF64: tl.constexpr):
    # one program: BLOCK_C channels over chunks_per_program tiles; writes its (mean, M2, count)
    # as row `split` of part[3, splits, C]
    cols = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    split = tl.program_id(1)
    c_ok = cols < C
    k0 = split * chunks_per_program
    k1 = tl.minimum(k0 + chunks_per_program, n_chunks)
    mean = tl.zeros([BLOCK_C], ACC)
    m2 = tl.zeros([BLOCK_C], ACC)
    count = tl.zeros([], ACC)
    for k in range(k0, k1):
        base, offs, s_ok = tile_offsets(
            k, n_sblocks, S, cols, s_n, s_s, s_c, BLOCK_S, OFF64)
        mask = s_ok[:, None] & c_ok[None, :]
        x = tl.load(x_ptr + base + offs, mask=mask, other=0.0).to(ACC)
        t_count = tl.sum(s_ok.to(ACC), 0)
        t_mean = tl.sum(x, 0) / t_count
        d = tl.where(mask, x - t_mean[None, :], 0.0)
        total = count + t_count
        delta = t_mean - mean
        mean += delta * (t_count / total)
        m2 += tl.sum(d * d, 0) + delta * delta * (count * t_count / total)
        count = total
    row = split.to(tl.int64) * C + cols
    tl.store(part_ptr + row, mean, mask=c_ok)
    tl.store(part_ptr + n_splits * C + row, m2, mask=c_ok)
    tl.store(part_ptr + 2 * n_splits * C + row, tl.zeros([BLOCK_C], ACC) + count, mask=c_ok)


@triton.jit
def _bn_finish_kernel(mean_ptr, rstd_ptr, part_ptr, rm_ptr, rv_ptr, nbt_ptr, C, n_splits,
                      momentum, eps,
                      TRAINING: tl.constexpr, UPDATE: tl.constexpr, CUMULATIVE: tl.constexpr,
                      BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr, ACC: tl.constexpr):
    # one program: BLOCK_C channels' mean and rstd, and their running statistics' update.
    # The splits' (n_i, mean_i, M2_i) combine as n = sum n_i, mean = sum n_i mean_i / n,
    # M2 = sum M2_i + sum n_i (mean_i - mean)^2 (exact; deviations from the final mean), over
    # [BLOCK_P, BLOCK_C] tiles of the splits: a few loads, not one per split.
    # num_batches_tracked is read here (momentum=None: f = 1 / (its value + 1)) and
    # incremented by the apply kernel, which runs after every program of this one.
    cols = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    c_ok = cols < C
    if TRAINING:
        count = tl.zeros([BLOCK_C], ACC)
        total = tl.zeros([BLOCK_C], ACC)
        for p0 in range(0, n_splits, BLOCK_P):
            rows = p0 + tl.arange(0, BLOCK_P)
            mask = (rows < n_splits)[:, None] & c_ok[None, :]
            at = rows[:, None] * C + cols[None, :]
            p_mean = tl.load(part_ptr + at, mask=mask, other=0.0)
            p_count = tl.load(part_ptr + 2 * n_splits * C + at, mask=mask, other=0.0)
            count += tl.sum(p_count, 0)
            total += tl.sum(p_count * p_mean, 0)
        mean = total / count
        m2 = tl.zeros([BLOCK_C], ACC)
        for p0 in range(0, n_splits, BLOCK_P):
            rows = p0 + tl.arange(0, BLOCK_P)
            mask = (rows < n_splits)[:, None] & c_ok[None, :]
            at = rows[:, None] * C + cols[None, :]
            p_mean = tl.load(part_ptr + at, mask=mask, other=0.0)
            p_m2 = tl.load(part_ptr + n_splits * C + at, mask=mask, other=0.0)
            p_count = tl.load(part_ptr + 2 * n_splits * C + at, mask=mask, other=0.0)
            delta = p_mean - mean[None, :]
            m2 += tl.sum(p_m2 + p_count * delta * delta, 0)
        var = m2 / count
        if UPDATE:
            factor = momentum
            if CUMULATIVE:
                factor = 1.0 / (tl.load(nbt_ptr) + 1).to(ACC)
            rm = tl.load(rm_ptr + cols, mask=c_ok, other=0.0).to(ACC)
            rv = tl.load(rv_ptr + cols, mask=c_ok, other=0.0).to(ACC)
            rm = rm * (1.0 - factor) + mean * factor
            rv = rv * (1.0 - factor) + (m2 / (count - 1.0)) * factor
            tl.store(rm_ptr + cols, rm.to(rm_ptr.dtype.element_ty), mask=c_ok)
            tl.store(rv_ptr + cols, rv.to(rv_ptr.dtype.element_ty), mask=c_ok)
    else:
        mean = tl.load(rm_ptr + cols, mask=c_ok, other=0.0).to(ACC)
        var = tl.load(rv_ptr + cols, mask=c_ok, other=1.0).to(ACC)
    tl.store(mean_ptr + cols, mean, mask=c_ok)
    tl.store(rstd_ptr + cols, 1.0 / tl.sqrt(var + eps), mask=c_ok)


@triton.jit
def _bn_apply_kernel(y_ptr, x_ptr, mean_ptr, rstd_ptr, w_ptr, b_ptr, nbt_ptr, S, C,
                     sx_n, sx_s, sx_c, sy_n, sy_s, sy_c, n_sblocks, n_chunks, chunks_per_program,
                     ACT: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr,
                     HAS_NBT: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_C: tl.constexpr,
                     ACC: tl.constexpr, OFF64: tl.constexpr):
    # one program: BLOCK_C channels over chunks_per_program tiles; y = act((x - mu) a + b).
    # The first program also counts the batch in num_batches_tracked (after the finish
    # kernel, which read it).
    if HAS_NBT:
        if (tl.program_id(0) == 0) & (tl.program_id(1) == 0):
            tl.store(nbt_ptr, tl.load(nbt_ptr) + 1)
    cols = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    c_ok = cols < C
    mean = tl.load(mean_ptr + cols, mask=c_ok, other=0.0)
    scale = tl.load(rstd_ptr + cols, mask=c_ok, other=0.0)
    if HAS_W:
        scale = scale * tl.load(w_ptr + cols, mask=c_ok, other=0.0).to(ACC)
    shift = tl.zeros([BLOCK_C], ACC)
    if HAS_B:
        shift = tl.load(b_ptr + cols, mask=c_ok, other=0.0).to(ACC)
    k0 = tl.program_id(1) * chunks_per_program
    k1 = tl.minimum(k0 + chunks_per_program, n_chunks)
    for k in range(k0, k1):
        x_base, x_offs, s_ok = tile_offsets(
            k, n_sblocks, S, cols, sx_n, sx_s, sx_c, BLOCK_S, OFF64)
        y_base, y_offs, s_ok = tile_offsets(
            k, n_sblocks, S, cols, sy_n, sy_s, sy_c, BLOCK_S, OFF64)
        mask = s_ok[:, None] & c_ok[None, :]
        x = tl.load(x_ptr + x_base + x_offs, mask=mask, other=0.0).to(ACC)
        y = activate((x - mean[None, :]) * scale[None, :] + shift[None, :], ACT)
        tl.store(y_ptr + y_base + y_offs, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _bn_bwd_sums_kernel(part_ptr, dy_ptr, x_ptr, mean_ptr, rstd_ptr, w_ptr, b_ptr, S, C,
                        sx_n, sx_s, sx_c, sd_n, sd_s, sd_c, n_sblocks, n_chunks,
                        chunks_per_program, n_splits,
                        ACT: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr,
                        BLOCK_S: tl.constexpr, BLOCK_C: tl.constexpr, ACC: tl.constexpr,
                     OFF64: tl.constexpr):
    # one program: BLOCK_C channels over chunks_per_program tiles; its sum(g), sum(g xhat) as
    # row `split` of part[2, splits, C]
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
    for k in range(k0, k1):
        x_base, x_offs, s_ok = tile_offsets(
            k, n_sblocks, S, cols, sx_n, sx_s, sx_c, BLOCK_S, OFF64)
        d_base, d_offs, s_ok = tile_offsets(
            k, n_sblocks, S, cols, sd_n, sd_s, sd_c, BLOCK_S, OFF64)
        mask = s_ok[:, None] & c_ok[None, :]
        x = tl.load(x_ptr + x_base + x_offs, mask=mask, other=0.0).to(ACC)
        g = tl.load(dy_ptr + d_base + d_offs, mask=mask, other=0.0).to(ACC)
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
def _bn_bwd_finish_kernel(sums_ptr, dw_ptr, db_ptr, part_ptr, C, n_splits,
                          WRITE_DW: tl.constexpr, WRITE_DB: tl.constexpr,
                          BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr, ACC: tl.constexpr):
    # one program: BLOCK_C channels; db = sum(g), dw = sum(g xhat) over the splits, summed in a
    # fixed order in [BLOCK_P, BLOCK_C] tiles
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
def _bn_bwd_dx_kernel(dx_ptr, dy_ptr, x_ptr, mean_ptr, rstd_ptr, w_ptr, b_ptr, sums_ptr, S, C,
                      sx_n, sx_s, sx_c, sd_n, sd_s, sd_c, so_n, so_s, so_c, n_sblocks, n_chunks,
                      chunks_per_program, inv_count,
                      TRAINING: tl.constexpr, ACT: tl.constexpr, HAS_W: tl.constexpr,
                      HAS_B: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_C: tl.constexpr,
                      ACC: tl.constexpr, OFF64: tl.constexpr):
    # one program: BLOCK_C channels over chunks_per_program tiles of dx
    cols = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    c_ok = cols < C
    mean = tl.load(mean_ptr + cols, mask=c_ok, other=0.0)
    rstd = tl.load(rstd_ptr + cols, mask=c_ok, other=0.0)
    w = tl.zeros([BLOCK_C], ACC) + 1.0
    if HAS_W:
        w = tl.load(w_ptr + cols, mask=c_ok, other=0.0).to(ACC)
    b = tl.zeros([BLOCK_C], ACC)
    if HAS_B:
        b = tl.load(b_ptr + cols, mask=c_ok, other=0.0).to(ACC)
    if TRAINING:
        mean_g = tl.load(sums_ptr + cols, mask=c_ok, other=0.0) * inv_count
        mean_gx = tl.load(sums_ptr + C + cols, mask=c_ok, other=0.0) * inv_count
    k0 = tl.program_id(1) * chunks_per_program
    k1 = tl.minimum(k0 + chunks_per_program, n_chunks)
    for k in range(k0, k1):
        x_base, x_offs, s_ok = tile_offsets(
            k, n_sblocks, S, cols, sx_n, sx_s, sx_c, BLOCK_S, OFF64)
        d_base, d_offs, s_ok = tile_offsets(
            k, n_sblocks, S, cols, sd_n, sd_s, sd_c, BLOCK_S, OFF64)
        o_base, o_offs, s_ok = tile_offsets(
            k, n_sblocks, S, cols, so_n, so_s, so_c, BLOCK_S, OFF64)
        mask = s_ok[:, None] & c_ok[None, :]
        x = tl.load(x_ptr + x_base + x_offs, mask=mask, other=0.0).to(ACC)
        g = tl.load(dy_ptr + d_base + d_offs, mask=mask, other=0.0).to(ACC)
        xhat = (x - mean[None, :]) * rstd[None, :]
        if ACT != 0:
            g = activation_grad(g, xhat * w[None, :] + b[None, :], ACT)
        if TRAINING:
            g = g - (mean_g[None, :] + xhat * mean_gx[None, :])
        dx = g * (w * rstd)[None, :]
        tl.store(dx_ptr + o_base + o_offs, dx.to(dx_ptr.dtype.element_ty), mask=mask)


def _nsc(a):
    """a: [N, C, *spatial] as (N, S, C, (stride_n, stride_s, stride_c)), or None when the
    spatial dims cannot be walked as one (then a contiguous copy is taken)."""
    if a.dim() == 2:  # [N, C]: one sample of N positions
        return 1, a.shape[0], a.shape[1], (0, a.stride(0), a.stride(1))
    spatial = [(n, s) for n, s in zip(a.shape[2:], a.stride()[2:]) if n != 1]
    for (_, outer), (size, inner) in zip(spatial, spatial[1:]):
        if outer != size * inner:
            return None
    S = math.prod(a.shape[2:])
    s_s = spatial[-1][1] if spatial else 1
    return a.shape[0], S, a.shape[1], (a.stride(0), s_s, a.stride(1))


def _nsc_or_copy(a):
    view = _nsc(a)
    if view is None:
        a = contiguous(a)
        view = _nsc(a)
    return a, view


def _merged(N, S, *strides):
    """(N, S, strides) with the samples folded into the positions where every array steps from
    one sample to the next as from one position to the next (channels-last: sN = S * sS), so
    that tiles run across sample boundaries without masked lanes."""
    if N > 1 and all(s[0] == S * s[1] for s in strides):
        return 1, N * S, [(0, s[1], s[2]) for s in strides]
    return N, S, list(strides)


def _like_layout(x, channels_inner):
    """A new array of x's shape and dtype: channels-last when channels_inner, else contiguous;
    with its (stride_n, stride_s, stride_c)."""
    if x.dim() > 2 and channels_inner:
        n, c, spatial = x.shape[0], x.shape[1], tuple(x.shape[2:])
        buf = empty((n,) + spatial + (c,), x.dtype, x.device)
        out = buf.permute(0, x.dim() - 1, *range(1, x.dim() - 1))
        return out, (math.prod(spatial) * c, c, 1)
    out = empty(x.shape, x.dtype, x.device)
    if x.dim() == 2:
        return out, (0, x.shape[1], 1)
    s = math.prod(x.shape[2:])
    return out, (x.shape[1] * s, 1, s)


def _bn_tiles(N, S, C, channels_inner, device, *strides):
    """(grid, (n_sblocks, n_chunks, chunks_per_program), splits, meta): tiles of about TILE
    elements along the contiguous axis, spread over about _programs(device) programs; int32
    offsets in a sample unless some array's reach passes 2**31."""
    if channels_inner:
        block_c = min(next_power_of_2(C), 256)
        block_s = max(1, min(next_power_of_2(S), TILE // block_c))
    else:
        block_s = min(next_power_of_2(S), 1024)
        block_c = max(1, min(next_power_of_2(C), TILE // block_s))
    n_sblocks = cdiv(S, block_s)
    n_chunks = N * n_sblocks
    splits = max(1, min(n_chunks, cdiv(_programs(device), cdiv(C, block_c))))
    per = cdiv(n_chunks, splits)
    splits = cdiv(n_chunks, per)
    reach = max(abs(s_s) * (S + block_s) + abs(s_c) * (C + block_c) for _, s_s, s_c in strides)
    # 16 warps for a 4096-element tile: 8 elements a thread, no spills (about 100 registers)
    meta = {"BLOCK_S": block_s, "BLOCK_C": block_c, "OFF64": reach >= 2 ** 31,
            "num_warps": max(4, min(16, block_s * block_c // 256))}
    return (cdiv(C, block_c), splits), (n_sblocks, n_chunks, per), splits, meta


def _split_tile(splits, C):
    """(BLOCK_P, BLOCK_C) of the kernels that combine the [splits, C] partials: all splits in
    one tile up to 256 (one load each), channels filling about 2048 elements."""
    block_p = min(next_power_of_2(max(splits, 1)), 256)
    return block_p, max(1, min(next_power_of_2(C), 2048 // block_p))


def _check_bn(op, x, *channel_arrays):
    if x.dim() < 2 or not x.dtype.is_floating_point:
        raise ValueError(f"{op}: expected a floating point [N, C, *] array, got shape "
                         f"{tuple(x.shape)} {dtype_of(x).name}")
    for a in channel_arrays:
        if a is not None and tuple(a.shape) != (x.shape[1],):
            raise ValueError(f"{op}: per-channel array of shape {tuple(a.shape)} does not match "
                             f"input {tuple(x.shape)}")


@planned(settings=settings, arrays=6)
def batch_norm(x, weight, bias, running_mean, running_var, num_batches_tracked, training,
               momentum, eps, activation):
    """Batch norm (+ activation): (y, mean, rstd). x: [N, C, *] any strides (NCHW or
    channels-last); weight, bias, running_mean, running_var: [C] or None; num_batches_tracked:
    int64 [] / [1] or None, incremented in place when the running statistics update (and
    momentum=None then averages cumulatively). y in x's layout; mean, rstd: [C] float32."""
    _check_bn("batch_norm", x, weight, bias, running_mean, running_var)
    if not training and running_mean is None:
        raise ValueError(f"batch_norm: eval needs running statistics (input {tuple(x.shape)})")
    x, (N, S, C, x_strides) = _nsc_or_copy(x)
    channels_inner = x_strides[2] == 1 and C > 1
    y, y_strides = _like_layout(x, channels_inner)
    N, S, (x_strides, y_strides) = _merged(N, S, x_strides, y_strides)
    s = settings()
    if s.variant == "new":
        mean, rstd = norm_stream.bn_forward(
            y, x, weight, bias, running_mean, running_var, num_batches_tracked, training,
            momentum, eps, _ACTIVATIONS[activation], N, S, C, x_strides, y_strides,
            channels_inner, s)
        return y, mean, rstd
    acc = _acc(x.dtype)
    mean = empty((C,), _stat_dtype(x.dtype), x.device)
    rstd = empty((C,), _stat_dtype(x.dtype), x.device)
    grid, chunks, splits, meta = _bn_tiles(N, S, C, channels_inner, x.device, x_strides,
                                           y_strides)
    update = bool(training and running_mean is not None)
    if training:
        part = empty((3, splits, C), _stat_dtype(x.dtype), x.device)
        run(_bn_stats_kernel, grid, part, x, S, C, *x_strides, *chunks, splits, ACC=acc,
            **meta)
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
        BLOCK_P=block_p, BLOCK_C=block_c, ACC=acc, num_warps=4)
    run(_bn_apply_kernel, grid, y, x, mean, rstd,
        weight if weight is not None else x, bias if bias is not None else x,
        num_batches_tracked if has_nbt else mean, S, C, *x_strides, *y_strides, *chunks,
        ACT=_ACTIVATIONS[activation], HAS_W=weight is not None, HAS_B=bias is not None,
        HAS_NBT=has_nbt, ACC=acc, **meta)
    return y, mean, rstd


@planned(settings=settings, arrays=6)
def batch_norm_backward(dy, x, weight, bias, mean, rstd, training, activation, need_dx,
                        need_dw, need_db):
    """(dx, dweight, dbias) of batch_norm (+ activation), each None unless asked for. dy, x:
    [N, C, *] any strides; weight, bias: [C] or None; mean, rstd: batch_norm's. dx in x's
    layout."""
    _check_bn("batch_norm_backward", x, weight, bias, mean, rstd)
    if tuple(dy.shape) != tuple(x.shape):
        raise ValueError(f"batch_norm_backward: dy of shape {tuple(dy.shape)} does not match x "
                         f"of shape {tuple(x.shape)}")
    need_dw = bool(need_dw and weight is not None)
    need_db = bool(need_db and bias is not None)
    x, (N, S, C, x_strides) = _nsc_or_copy(x)
    dy, (_, _, _, d_strides) = _nsc_or_copy(dy)
    channels_inner = x_strides[2] == 1 and C > 1
    dx, o_strides = _like_layout(x, channels_inner) if need_dx else (None, x_strides)
    N, S, (x_strides, d_strides, o_strides) = _merged(N, S, x_strides, d_strides, o_strides)
    dw = empty((C,), weight.dtype, x.device) if need_dw else None
    db = empty((C,), bias.dtype, x.device) if need_db else None
    s = settings()
    if s.variant == "new":
        norm_stream.bn_backward(dx, dw, db, dy, x, weight, bias, mean, rstd, training,
                                _ACTIVATIONS[activation], N, S, C, x_strides, d_strides,
                                o_strides, channels_inner, s)
        return dx, dw, db
    acc = _acc(x.dtype)
    grid, chunks, splits, meta = _bn_tiles(N, S, C, channels_inner, x.device, x_strides,
                                           d_strides, o_strides)
    flags = dict(ACT=_ACTIVATIONS[activation], HAS_W=weight is not None, HAS_B=bias is not None,
                 ACC=acc, **meta)
    sums = mean
    if training and need_dx or need_dw or need_db:
        part = empty((2, splits, C), _stat_dtype(x.dtype), x.device)
        run(_bn_bwd_sums_kernel, grid, part, dy, x, mean, rstd,
            weight if weight is not None else x, bias if bias is not None else x, S, C,
            *x_strides, *d_strides, *chunks, splits, **flags)
        sums = empty((2, C), _stat_dtype(x.dtype), x.device)
        block_p, block_c = _split_tile(splits, C)
        run(_bn_bwd_finish_kernel, (cdiv(C, block_c),), sums, dw if need_dw else sums,
            db if need_db else sums, part, C, splits, WRITE_DW=need_dw, WRITE_DB=need_db,
            BLOCK_P=block_p, BLOCK_C=block_c, ACC=acc, num_warps=4)
    if need_dx:
        run(_bn_bwd_dx_kernel, grid, dx, dy, x, mean, rstd,
            weight if weight is not None else x, bias if bias is not None else x, sums, S, C,
            *x_strides, *d_strides, *o_strides, *chunks, 1.0 / max(N * S, 1),
            TRAINING=bool(training), **flags)
    return dx, dw, db
