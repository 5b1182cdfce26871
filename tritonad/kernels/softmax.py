"""Softmax, log-softmax (forward and backward) and the fused softmax cross-entropy.

All of them are row-wise: a "row" is one line of elements along the reduced dimension. The
launchers describe every operand as a 4-d strided view [n_out, n_mid, n_in, n_cols] (the
non-reduced dimensions merged into at most three row dimensions, the reduced one last), so any
dimension of any strided tensor is read in place; no copies.

One program owns BLOCK_N rows. The block rule (`_blocks`) is deterministic:
- rows of up to SINGLE_BLOCK_MAX columns are held in registers whole (next power of two) and read
  from memory once;
- wider rows are streamed LOOP_BLOCK columns at a time: a first pass keeps an online max and sum,
  a second pass re-reads the row (last block first, so the tail still sits in L2) and writes;
- narrow rows are packed BLOCK_N to a program so a program always moves about TILE elements.
Arithmetic is float32 (float64 for float64 inputs); half inputs are widened on load and rounded
once on store.

Cross-entropy is one fused pass per row block: loss and d(loss)/d(logits) are written together,
so the backward only scales the gradient by the incoming one. A tiny first kernel counts the rows
that are not ignored (the divisor of "mean", left on the device: no host sync before the main
kernel) and records the first out-of-range target; a tiny last kernel sums the row losses in a
fixed order (deterministic, no float atomics). Small problems do all three in one program.
"""
from __future__ import annotations

import itertools

import torch
import triton
import triton.language as tl

from ..backend import check_metrics
from . import errors
from .errors import report_at
from .launch import INTERPRET, PDL, cdiv, check_same_shape, dtype_of, next_power_of_2
from .plans import empty
from .launch import num_warps_for
from .plans import planned, run

PRIMITIVES = ("check_targets", "softmax", "log_softmax", "softmax_backward", "log_softmax_backward",
              "cross_entropy")

# block rule (read at call time, so tests and benchmarks may override them)
SINGLE_BLOCK_MAX = 32768                    # widest row held in registers whole (elements)
LOOP_BLOCK = 8192                           # columns per step when streaming wider rows
TILE = 1 << 16 if INTERPRET else 4096       # elements per program for narrow rows
STRIDED_ROWS = 16                           # rows per program when columns are strided
SMALL_PROBLEM = 16384                       # cross-entropy in one program up to N * C this big
TARGET_BLOCK = 1024                         # targets per step when counting / summing

_REDUCTIONS = {"none": 0, "sum": 1, "mean": 2}


# ------------------------------------------------------------------------------------ helpers


@triton.jit
def _row_starts(rows, n_mid, n_in, s_out, s_mid, s_in):
    """Element offset of each row's first element; row r = (o, m, i) with i fastest (int64)."""
    rows = rows.to(tl.int64)
    inner = rows % n_in
    rest = rows // n_in
    return (rest // n_mid) * s_out + (rest % n_mid) * s_mid + inner * s_in


@triton.jit
def _col_offsets(cols, stride, COL64: tl.constexpr):
    offs = cols * stride
    if COL64:  # n_cols * stride reaches 2**31
        offs = cols.to(tl.int64) * stride
    return offs


@triton.jit
def _finite_or_zero(m):
    # NOTE: the row max is used as a shift only where it is finite: a row of -inf (or one
    # holding +inf) is shifted by 0, as the reference does, so exp(-inf - (-inf)) never makes NaN.
    return tl.where(tl.abs(m) == float("inf"), 0.0, m)


@triton.jit
def _online_max_sum(x_rows, row_ok, n_cols, stride_col, BLOCK_N: tl.constexpr,
                    BLOCK_C: tl.constexpr, COL64: tl.constexpr, ACC: tl.constexpr):
    """Pass 1 over wide rows: m = max(x), s = sum(exp(x - f(m))), f = _finite_or_zero.

    Online update per block of columns, with m' = max(m, max(block)):
        s' = s * exp(f(m) - f(m')) + sum(exp(block - f(m')))
    NOTE: while a row has seen only -inf, s is 0 (or NaN) and must stay so: the factor is taken
    as 0 there instead of exp(0 - f(m')), which overflows for m' < -88.
    """
    m = tl.full([BLOCK_N], float("-inf"), ACC)
    s = tl.zeros([BLOCK_N], ACC)
    for start in range(0, n_cols, BLOCK_C):
        cols = start + tl.arange(0, BLOCK_C)
        mask = row_ok[:, None] & (cols < n_cols)[None, :]
        x = tl.load(x_rows + _col_offsets(cols, stride_col, COL64)[None, :], mask=mask,
                    other=float("-inf"), eviction_policy="evict_last").to(ACC)
        m_new = tl.maximum(m, tl.max(x, 1))
        shift = _finite_or_zero(m_new)
        alpha = tl.where(m == float("-inf"), 0.0, tl.exp(_finite_or_zero(m) - shift))
        s = s * alpha + tl.sum(tl.exp(x - shift[:, None]), 1)
        m = m_new
    return m, s


# ------------------------------------------------------------------------------------ softmax


@triton.jit
def _softmax_fwd_kernel(y_ptr, x_ptr, n_rows, n_cols, n_mid, n_in,
                        sx_out, sx_mid, sx_in, sx_col, sy_out, sy_mid, sy_in, sy_col,
                        LOG: tl.constexpr, SINGLE: tl.constexpr, BLOCK_N: tl.constexpr,
                        BLOCK_C: tl.constexpr, COL64: tl.constexpr, ACC: tl.constexpr):
    # softmax:      y = exp(x - f) / s          s = sum(exp(x - f)), f = finite row max or 0
    # log-softmax:  y = (x - f) - log(s)
    # One program: BLOCK_N rows, whole (SINGLE) or streamed BLOCK_C columns at a time.
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < n_rows
    x_rows = x_ptr + _row_starts(rows, n_mid, n_in, sx_out, sx_mid, sx_in)[:, None]
    y_rows = y_ptr + _row_starts(rows, n_mid, n_in, sy_out, sy_mid, sy_in)[:, None]
    if SINGLE:
        cols = tl.arange(0, BLOCK_C)
        mask = row_ok[:, None] & (cols < n_cols)[None, :]
        x = tl.load(x_rows + _col_offsets(cols, sx_col, COL64)[None, :], mask=mask,
                    other=float("-inf")).to(ACC)
        shift = _finite_or_zero(tl.max(x, 1))
        z = x - shift[:, None]
        e = tl.exp(z)
        s = tl.sum(e, 1)
        if LOG:
            y = z - tl.log(s)[:, None]
        else:
            y = e * (1.0 / s)[:, None]  # NOTE: s = 0 (a row of -inf) gives NaN, as 0 / 0 does
        tl.store(y_rows + _col_offsets(cols, sy_col, COL64)[None, :],
                 y.to(y_ptr.dtype.element_ty), mask=mask)
    else:
        m, s = _online_max_sum(x_rows, row_ok, n_cols, sx_col, BLOCK_N, BLOCK_C, COL64, ACC)
        shift = _finite_or_zero(m)[:, None]
        log_s = tl.log(s)[:, None]
        inv_s = (1.0 / s)[:, None]
        n_blocks = (n_cols + BLOCK_C - 1) // BLOCK_C
        for i in range(n_blocks):  # last block first: it is the one most likely in L2
            cols = (n_blocks - 1 - i) * BLOCK_C + tl.arange(0, BLOCK_C)
            mask = row_ok[:, None] & (cols < n_cols)[None, :]
            x = tl.load(x_rows + _col_offsets(cols, sx_col, COL64)[None, :], mask=mask,
                        other=float("-inf"), eviction_policy="evict_first").to(ACC)
            if LOG:
                y = (x - shift) - log_s
            else:
                y = tl.exp(x - shift) * inv_s
            tl.store(y_rows + _col_offsets(cols, sy_col, COL64)[None, :],
                     y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _softmax_bwd_kernel(dx_ptr, dy_ptr, y_ptr, n_rows, n_cols, n_mid, n_in,
                        sx_out, sx_mid, sx_in, sx_col, sd_out, sd_mid, sd_in, sd_col,
                        sy_out, sy_mid, sy_in, sy_col,
                        LOG: tl.constexpr, SINGLE: tl.constexpr, BLOCK_N: tl.constexpr,
                        BLOCK_C: tl.constexpr, COL64: tl.constexpr, ACC: tl.constexpr):
    # softmax:      dx = y * (dy - sum(dy * y))      (y = softmax(x))
    # log-softmax:  dx = dy - exp(y) * sum(dy)       (y = log_softmax(x))
    # One program: BLOCK_N rows; wide rows take one pass for the sum and one to write dx.
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < n_rows
    dx_rows = dx_ptr + _row_starts(rows, n_mid, n_in, sx_out, sx_mid, sx_in)[:, None]
    dy_rows = dy_ptr + _row_starts(rows, n_mid, n_in, sd_out, sd_mid, sd_in)[:, None]
    y_rows = y_ptr + _row_starts(rows, n_mid, n_in, sy_out, sy_mid, sy_in)[:, None]
    if SINGLE:
        cols = tl.arange(0, BLOCK_C)
        mask = row_ok[:, None] & (cols < n_cols)[None, :]
        dy = tl.load(dy_rows + _col_offsets(cols, sd_col, COL64)[None, :], mask=mask,
                     other=0.0).to(ACC)
        y = tl.load(y_rows + _col_offsets(cols, sy_col, COL64)[None, :], mask=mask,
                    other=0.0).to(ACC)
        if LOG:
            dx = dy - tl.exp(y) * tl.sum(dy, 1)[:, None]
        else:
            dx = y * (dy - tl.sum(dy * y, 1)[:, None])
        tl.store(dx_rows + _col_offsets(cols, sx_col, COL64)[None, :],
                 dx.to(dx_ptr.dtype.element_ty), mask=mask)
    else:
        total = tl.zeros([BLOCK_N], ACC)
        for start in range(0, n_cols, BLOCK_C):
            cols = start + tl.arange(0, BLOCK_C)
            mask = row_ok[:, None] & (cols < n_cols)[None, :]
            dy = tl.load(dy_rows + _col_offsets(cols, sd_col, COL64)[None, :], mask=mask,
                         other=0.0, eviction_policy="evict_last").to(ACC)
            if LOG:
                total += tl.sum(dy, 1)
            else:
                y = tl.load(y_rows + _col_offsets(cols, sy_col, COL64)[None, :], mask=mask,
                            other=0.0, eviction_policy="evict_last").to(ACC)
                total += tl.sum(dy * y, 1)
        n_blocks = (n_cols + BLOCK_C - 1) // BLOCK_C
        for i in range(n_blocks):  # last block first (L2)
            cols = (n_blocks - 1 - i) * BLOCK_C + tl.arange(0, BLOCK_C)
            mask = row_ok[:, None] & (cols < n_cols)[None, :]
            dy = tl.load(dy_rows + _col_offsets(cols, sd_col, COL64)[None, :], mask=mask,
                         other=0.0, eviction_policy="evict_first").to(ACC)
            y = tl.load(y_rows + _col_offsets(cols, sy_col, COL64)[None, :], mask=mask,
                        other=0.0, eviction_policy="evict_first").to(ACC)
            if LOG:
                dx = dy - tl.exp(y) * total[:, None]
            else:
                dx = y * (dy - total[:, None])
            tl.store(dx_rows + _col_offsets(cols, sx_col, COL64)[None, :],
                     dx.to(dx_ptr.dtype.element_ty), mask=mask)


# ------------------------------------------------------------------------------ cross-entropy
#
# Per row, with eps = label_smoothing, f = the finite row max (or 0), s = sum(exp(x - f)):
#   loss = logsumexp(x) - (1 - eps) x[t] - eps/C sum(x)
#        = log(s) + (1 - eps)(f - x[t]) + eps/C sum(f - x)      (differences of nearby numbers
#                                                                are exact; no 1e4 - 1e4 loss)
#   dloss/dx = softmax(x) - q,  q = (1 - eps) onehot(t) + eps/C.
# Reading the logits once and writing the gradient once is the whole memory traffic (torch reads
# and writes the N x C matrix about six times: log_softmax, nll backward, log_softmax backward).


@triton.jit
def _ce_check_targets(target_ptr, n_rows, n_cols, stride_t, ignore_index, BLOCK: tl.constexpr):
    """(rows not ignored, first row whose target is outside [0, C) or n_rows, that target)."""
    kept = tl.zeros([BLOCK], tl.int32)
    first = tl.zeros([BLOCK], tl.int64) + n_rows  # per lane: the first bad row it saw
    value = tl.zeros([BLOCK], tl.int64)
    for start in range(0, n_rows, BLOCK):
        offs = (start + tl.arange(0, BLOCK)).to(tl.int64)
        t = tl.load(target_ptr + offs * stride_t, mask=offs < n_rows, other=ignore_index)
        t = t.to(tl.int64)
        keep = t != ignore_index
        bad = keep & ((t < 0) | (t >= n_cols))
        kept += keep.to(tl.int32)
        value = tl.where(bad & (first == n_rows), t, value)
        first = tl.where(bad & (first == n_rows), offs, first)
    first_bad = tl.min(first, 0)
    bad_value = tl.sum(tl.where(first == first_bad, value, 0), 0)
    return tl.sum(kept, 0), first_bad, bad_value


@triton.jit
def _ce_rows(logits_ptr, grad_ptr, target_ptr, rows, n_rows, n_cols, stride_n, stride_c,
             stride_gn, stride_gc, stride_t, ignore_index, smoothing, grad_scale,
             SINGLE: tl.constexpr, SMOOTH: tl.constexpr, COMPUTE_GRAD: tl.constexpr,
             BLOCK_N: tl.constexpr, BLOCK_C: tl.constexpr, COL64: tl.constexpr,
             ACC: tl.constexpr):
    """Loss of each row in `rows` (0 where ignored); writes grad_scale * dloss/dx (0 if ignored)."""
    row_ok = rows < n_rows
    t = tl.load(target_ptr + rows.to(tl.int64) * stride_t, mask=row_ok, other=ignore_index)
    t = t.to(tl.int64)
    kept = row_ok & (t != ignore_index)
    # NOTE: out-of-range targets were flagged by _ce_check_targets; clamp so nothing faults
    t = tl.where(kept & (t >= 0) & (t < n_cols), t, 0)
    x_rows = logits_ptr + (rows.to(tl.int64) * stride_n)[:, None]
    g_rows = grad_ptr + (rows.to(tl.int64) * stride_gn)[:, None]
    x_t = tl.load(logits_ptr + rows.to(tl.int64) * stride_n + t * stride_c, mask=row_ok,
                  other=0.0).to(ACC)
    q_hit = 1.0 - smoothing               # q = q_hit at the target column, + q_all everywhere
    q_all = smoothing / n_cols
    if SINGLE:
        cols = tl.arange(0, BLOCK_C)
        mask = row_ok[:, None] & (cols < n_cols)[None, :]
        x = tl.load(x_rows + _col_offsets(cols, stride_c, COL64)[None, :], mask=mask,
                    other=float("-inf")).to(ACC)
        shift = _finite_or_zero(tl.max(x, 1))
        loss = (1.0 - smoothing) * (shift - x_t)
        if SMOOTH:
            loss += q_all * tl.sum(tl.where(mask, shift[:, None] - x, 0.0), 1)
        e = tl.exp(x - shift[:, None])
        s = tl.sum(e, 1)
        loss += tl.log(s)
        if COMPUTE_GRAD:
            q = tl.where(cols[None, :] == t[:, None], q_hit, 0.0) + q_all
            g = tl.where(kept[:, None], (e * (1.0 / s)[:, None] - q) * grad_scale, 0.0)
            tl.store(g_rows + _col_offsets(cols, stride_gc, COL64)[None, :],
                     g.to(grad_ptr.dtype.element_ty), mask=mask)
    else:
        m, s = _online_max_sum(x_rows, row_ok, n_cols, stride_c, BLOCK_N, BLOCK_C, COL64, ACC)
        shift = _finite_or_zero(m)
        loss = tl.log(s) + (1.0 - smoothing) * (shift - x_t)
        if SMOOTH or COMPUTE_GRAD:  # the second pass: re-read, write the gradient
            inv_s = (1.0 / s)[:, None]
            spread = tl.zeros([BLOCK_N], ACC)
            n_blocks = (n_cols + BLOCK_C - 1) // BLOCK_C
            for i in range(n_blocks):  # last block first (L2)
                cols = (n_blocks - 1 - i) * BLOCK_C + tl.arange(0, BLOCK_C)
                mask = row_ok[:, None] & (cols < n_cols)[None, :]
                x = tl.load(x_rows + _col_offsets(cols, stride_c, COL64)[None, :], mask=mask,
                            other=float("-inf"), eviction_policy="evict_first").to(ACC)
                if SMOOTH:
                    spread += tl.sum(tl.where(mask, shift[:, None] - x, 0.0), 1)
                if COMPUTE_GRAD:
                    q = tl.where(cols[None, :] == t[:, None], q_hit, 0.0) + q_all
                    p = tl.exp(x - shift[:, None]) * inv_s
                    g = tl.where(kept[:, None], (p - q) * grad_scale, 0.0)
                    tl.store(g_rows + _col_offsets(cols, stride_gc, COL64)[None, :],
                             g.to(grad_ptr.dtype.element_ty), mask=mask,
                             eviction_policy="evict_first")
            if SMOOTH:
                loss += q_all * spread
    return tl.where(kept, loss, 0.0)


@triton.jit
def _ce_count_kernel(info_ptr, flag_ptr, target_ptr, n_rows, n_cols, stride_t, ignore_index,
                     BLOCK_T: tl.constexpr):
    # one program: info = rows not ignored; a target outside [0, C) is reported on the flag
    count, first_bad, bad_value = _ce_check_targets(target_ptr, n_rows, n_cols, stride_t,
                                                    ignore_index, BLOCK_T)
    tl.store(info_ptr, count.to(tl.int64))
    if first_bad < n_rows:
        report_at(flag_ptr, first_bad, bad_value, n_cols)


@triton.jit
def _ce_rows_kernel(loss_ptr, grad_ptr, info_ptr, logits_ptr, target_ptr, n_rows, n_cols,
                    stride_n, stride_c, stride_gn, stride_gc, stride_t, ignore_index, smoothing,
                    MEAN: tl.constexpr, SINGLE: tl.constexpr, SMOOTH: tl.constexpr,
                    COMPUTE_GRAD: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_C: tl.constexpr,
                    COL64: tl.constexpr, ACC: tl.constexpr):
    # one program: loss and gradient of BLOCK_N rows; "mean" divides by the count on the device
    grad_scale = 1.0
    if MEAN:
        grad_scale = 1.0 / tl.load(info_ptr).to(ACC)
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    loss = _ce_rows(logits_ptr, grad_ptr, target_ptr, rows, n_rows, n_cols, stride_n, stride_c,
                    stride_gn, stride_gc, stride_t, ignore_index, smoothing, grad_scale,
                    SINGLE, SMOOTH, COMPUTE_GRAD, BLOCK_N, BLOCK_C, COL64, ACC)
    tl.store(loss_ptr + rows, loss.to(loss_ptr.dtype.element_ty), mask=rows < n_rows)


@triton.jit
def _ce_reduce_kernel(out_ptr, loss_ptr, info_ptr, n_rows, MEAN: tl.constexpr,
                      BLOCK: tl.constexpr, ACC: tl.constexpr):
    # one program: out = sum of the row losses (/ rows counted), in a fixed order
    total = tl.zeros([BLOCK], ACC)
    for start in range(0, n_rows, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        total += tl.load(loss_ptr + offs, mask=offs < n_rows, other=0.0).to(ACC)
    result = tl.sum(total, 0)
    if MEAN:
        result = result / tl.load(info_ptr).to(ACC)  # NOTE: 0 / 0 = NaN when every row is ignored
    tl.store(out_ptr, result.to(out_ptr.dtype.element_ty))


@triton.jit
def _row_hits(logits_ptr, target_ptr, rows, n_rows, n_cols, stride_n, stride_c, stride_t,
              BLOCK_C: tl.constexpr, COL64: tl.constexpr, ACC: tl.constexpr):
    """How many of `rows` (whole rows of BLOCK_C >= n_cols columns) have their first largest
    logit at the target; NaN counts as +inf (count_correct_'s rule)."""
    row_ok = rows < n_rows
    cols = tl.arange(0, BLOCK_C)
    mask = row_ok[:, None] & (cols < n_cols)[None, :]
    x = tl.load(logits_ptr + (rows.to(tl.int64) * stride_n)[:, None]
                + _col_offsets(cols, stride_c, COL64)[None, :], mask=mask,
                other=float("-inf")).to(ACC)
    x = tl.where(x != x, float("inf"), x)
    m = tl.max(x, 1)
    first = tl.min(tl.where((x == m[:, None]) & mask, cols[None, :], n_cols), 1)
    t = tl.load(target_ptr + rows.to(tl.int64) * stride_t, mask=row_ok, other=-1).to(tl.int64)
    return tl.sum((row_ok & (first.to(tl.int64) == t)).to(tl.int64), 0)


@triton.jit
def _ce_small_kernel(out_ptr, grad_ptr, flag_ptr, logits_ptr, target_ptr, loss_total_ptr,
                     correct_ptr, n_rows, n_cols,
                     stride_n, stride_c, stride_gn, stride_gc, stride_t, ignore_index, smoothing,
                     REDUCTION: tl.constexpr, SMOOTH: tl.constexpr, COMPUTE_GRAD: tl.constexpr,
                     BLOCK_N: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_T: tl.constexpr,
                     COL64: tl.constexpr, ACC: tl.constexpr, METRICS: tl.constexpr,
                     GDC: tl.constexpr):
    if GDC:  # programmatic dependent launch (launch.PDL): wait for the kernels before
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    # one program does it all (one launch for MNIST-sized losses): check and count the targets,
    # every block of rows, the reduction; with METRICS also the training loop's running loss
    # total and correct count (one program: plain read-modify-write, no atomics).
    # REDUCTION: 0 none, 1 sum, 2 mean.
    count, first_bad, bad_value = _ce_check_targets(target_ptr, n_rows, n_cols, stride_t,
                                                    ignore_index, BLOCK_T)
    if first_bad < n_rows:
        report_at(flag_ptr, first_bad, bad_value, n_cols)
    grad_scale = 1.0
    if REDUCTION == 2:
        grad_scale = 1.0 / count.to(ACC)
    total = tl.zeros([BLOCK_N], ACC)
    hits = tl.zeros([], tl.int64)
    for start in range(0, n_rows, BLOCK_N):
        rows = start + tl.arange(0, BLOCK_N)
        loss = _ce_rows(logits_ptr, grad_ptr, target_ptr, rows, n_rows, n_cols, stride_n,
                        stride_c, stride_gn, stride_gc, stride_t, ignore_index, smoothing,
                        grad_scale, True, SMOOTH, COMPUTE_GRAD, BLOCK_N, BLOCK_C, COL64, ACC)
        if REDUCTION == 0:
            tl.store(out_ptr + rows, loss.to(out_ptr.dtype.element_ty), mask=rows < n_rows)
        if REDUCTION != 0 or METRICS:
            total += loss
        if METRICS:
            hits += _row_hits(logits_ptr, target_ptr, rows, n_rows, n_cols, stride_n, stride_c,
                              stride_t, BLOCK_C, COL64, ACC)
    if METRICS:
        running = tl.load(loss_total_ptr).to(ACC) + tl.sum(total, 0)
        tl.store(loss_total_ptr, running.to(loss_total_ptr.dtype.element_ty))
        tl.store(correct_ptr, tl.load(correct_ptr) + hits)
    if REDUCTION != 0:
        result = tl.sum(total, 0)
        if REDUCTION == 2:
            result = result / count.to(ACC)
        tl.store(out_ptr, result.to(out_ptr.dtype.element_ty))


# ------------------------------------------------------------------------------------ launchers


def _acc(dtype):
    """The arithmetic type: float64 for float64 inputs, float32 for everything else."""
    return tl.float64 if dtype == torch.float64 else tl.float32


def _blocks(n_rows, n_cols, cols_contiguous, operands=1):
    """(BLOCK_N, BLOCK_C, SINGLE, num_warps): whole rows while `operands` row tiles fit in
    SINGLE_BLOCK_MAX elements (the registers of one program at 16 warps), streamed rows above;
    narrow rows packed to about TILE elements a program; strided columns (rows adjacent in
    memory) take STRIDED_ROWS rows at least, for coalesced loads."""
    width = next_power_of_2(max(n_cols, 1))
    min_rows = 1 if cols_contiguous else min(STRIDED_ROWS, next_power_of_2(max(n_rows, 1)))
    single = width * min_rows * operands <= SINGLE_BLOCK_MAX
    block_c = width if single else max(LOOP_BLOCK // min_rows, 16)
    block_n = max(min_rows, min(next_power_of_2(max(n_rows, 1)), TILE // block_c))
    return block_n, block_c, single, num_warps_for(block_n * block_c)


def _col64(n_cols, *strides):
    return max(n_cols - 1, 0) * max(abs(s) for s in strides) >= 2 ** 31


def _row_views(dim, *arrays):
    """Each array (all of one shape) as 4-d views [n_out, n_mid, n_in, n_cols] with the reduced
    dim last: the other dims, in order, merged while every array allows it (stride of the outer
    = size * stride of the inner). More than three groups left: the outer ones are looped here,
    one list entry (a tuple of views, one per array) for each."""
    shape = tuple(arrays[0].shape)
    if not shape:
        return [tuple(a.as_strided((1, 1, 1, 1), (0, 0, 0, 0)) for a in arrays)]
    groups = []  # [size, [stride in each array]]
    for d, size in enumerate(shape):
        if d == dim or size == 1:
            continue
        strides = [a.stride(d) for a in arrays]
        if groups and all(outer == size * s for outer, s in zip(groups[-1][1], strides)):
            groups[-1] = [groups[-1][0] * size, strides]
        else:
            groups.append([size, strides])
    groups = [[1, [0] * len(arrays)]] * max(0, 3 - len(groups)) + groups
    looped, kept = groups[:-3], groups[-3:]
    sizes = [g[0] for g in kept] + [shape[dim]]
    views = []
    for index in itertools.product(*(range(g[0]) for g in looped)):
        views.append(tuple(
            a.as_strided(sizes, [g[1][k] for g in kept] + [a.stride(dim)],
                         a.storage_offset() + sum(i * g[1][k] for i, g in zip(index, looped)))
            for k, a in enumerate(arrays)))
    return views


def _check_float(op, *arrays):
    for a in arrays:
        if not a.dtype.is_floating_point:
            raise TypeError(f"{op}: expected floating point input, got {dtype_of(a).name} of "
                            f"shape {tuple(a.shape)}")


def _check_dim(op, x, dim):
    if not isinstance(dim, int) or not 0 <= dim < max(x.dim(), 1):
        raise IndexError(f"{op}: dim must be a normalised axis in [0, {max(x.dim(), 1)}) for "
                         f"shape {tuple(x.shape)}, got {dim!r}")


def _softmax_forward(op, x, dim, log):
    _check_float(op, x)
    _check_dim(op, x, dim)
    y = empty(x.shape, x.dtype, x.device)
    if x.numel() == 0:
        return y
    for yv, xv in _row_views(dim, y, x):
        n_out, n_mid, n_in, n_cols = xv.shape
        n_rows = n_out * n_mid * n_in
        block_n, block_c, single, warps = _blocks(n_rows, n_cols, xv.stride(3) == 1)
        run(_softmax_fwd_kernel, (cdiv(n_rows, block_n),),
            yv, xv, n_rows, n_cols, n_mid, n_in, *xv.stride(), *yv.stride(),
            LOG=log, SINGLE=single, BLOCK_N=block_n, BLOCK_C=block_c,
            COL64=_col64(n_cols, xv.stride(3), yv.stride(3)), ACC=_acc(x.dtype),
            num_warps=warps)
    return y


def _softmax_backward(op, dy, y, dim, log):
    _check_float(op, dy, y)
    check_same_shape(op, dy, y)
    _check_dim(op, y, dim)
    if dy.dtype != y.dtype:
        raise TypeError(f"{op}: dy is {dtype_of(dy).name} but y is {dtype_of(y).name}")
    dx = empty(y.shape, y.dtype, y.device)
    if y.numel() == 0:
        return dx
    for dxv, dyv, yv in _row_views(dim, dx, dy, y):
        n_out, n_mid, n_in, n_cols = yv.shape
        n_rows = n_out * n_mid * n_in
        block_n, block_c, single, warps = _blocks(n_rows, n_cols, yv.stride(3) == 1,
                                                    operands=2)  # dy and y
        run(_softmax_bwd_kernel, (cdiv(n_rows, block_n),),
            dxv, dyv, yv, n_rows, n_cols, n_mid, n_in, *dxv.stride(), *dyv.stride(), *yv.stride(),
            LOG=log, SINGLE=single, BLOCK_N=block_n, BLOCK_C=block_c,
            COL64=_col64(n_cols, dxv.stride(3), dyv.stride(3), yv.stride(3)),
            ACC=_acc(y.dtype), num_warps=warps)
    return dx


@planned(arrays=1)
def softmax(x, dim):
    """y = exp(x - max) / sum(exp(x - max)) along dim. x: [any shape], any strides; y contiguous.
    A row of -inf gives NaN (0 / 0), as the reference."""
    return _softmax_forward("softmax", x, dim, log=False)


@planned(arrays=1)
def log_softmax(x, dim):
    """y = x - logsumexp(x) along dim. x: [any shape], any strides; y contiguous."""
    return _softmax_forward("log_softmax", x, dim, log=True)


@planned(arrays=2)
def softmax_backward(dy, y, dim):
    """dx = y * (dy - sum(dy * y, dim)) with y = softmax(x). dy, y: [same shape], any strides."""
    return _softmax_backward("softmax_backward", dy, y, dim, log=False)


@planned(arrays=2)
def log_softmax_backward(dy, y, dim):
    """dx = dy - exp(y) * sum(dy, dim) with y = log_softmax(x). dy, y: [same shape]."""
    return _softmax_backward("log_softmax_backward", dy, y, dim, log=True)


def _check_cross_entropy(logits, target, reduction, label_smoothing):
    op = "cross_entropy"
    if logits.dim() != 2 or not logits.dtype.is_floating_point:
        raise ValueError(f"{op}: logits must be a floating point [N, C] array, got shape "
                         f"{tuple(logits.shape)} {dtype_of(logits).name}")
    if target.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"{op}: target must be int64 (or int32) class indices, got "
                        f"{dtype_of(target).name}")
    if tuple(target.shape) != tuple(logits.shape[:1]):
        raise ValueError(f"{op}: expected logits [N, C] and target [N], got logits "
                         f"{tuple(logits.shape)} and target {tuple(target.shape)}")
    if target.device != logits.device:
        raise ValueError(f"{op}: logits are on {logits.device} but target on {target.device}")
    check_loss_options(op, reduction, label_smoothing)
    if logits.shape[1] == 0:
        raise ValueError(f"{op}: logits of shape {tuple(logits.shape)} have no classes")


def check_loss_options(op, reduction, label_smoothing):
    """cross_entropy's reduction and label_smoothing, or a one-line error naming `op`."""
    if reduction not in _REDUCTIONS:
        raise ValueError(f"{op}: reduction must be one of {tuple(_REDUCTIONS)}, got {reduction!r}")
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"{op}: label_smoothing must be in [0, 1], got {label_smoothing}")


def _add_metrics(metrics, rows_loss, logits, target):
    """The metrics of a loss too large for the one-program kernel, by separate kernels."""
    from .elementwise import add
    from .reduce import count_correct_
    from .reduce import sum as sum_dims

    loss_total, correct = metrics
    total = sum_dims(rows_loss, dtype=dtype_of(loss_total))
    add(loss_total, total.reshape(loss_total.shape), out=loss_total)
    count_correct_(logits, target, correct)


def check_targets(target, n_classes, ignore_index=-100, op="nll_loss"):
    """Report a class index outside [0, n_classes) other than ignore_index on the device's
    error flags (raised at the next read of the device). target: [N] int64/int32."""
    if target.dtype not in (torch.int64, torch.int32) or target.dim() != 1:
        raise TypeError(f"{op}: target must be int64 (or int32) class indices [N], got "
                        f"{tuple(target.shape)} {dtype_of(target).name}")
    _check_targets(target, n_classes, ignore_index, op)
    errors.after(target.device)


@planned()
def _check_targets(target, n_classes, ignore_index, op):
    info = empty((1,), torch.int64, target.device)
    run(_ce_count_kernel, (1,), info, errors.flag(target.device, op), target, target.shape[0],
        n_classes, target.stride(0), ignore_index, BLOCK_T=TARGET_BLOCK, num_warps=4)


def cross_entropy(logits, target, reduction="mean", ignore_index=-100, label_smoothing=0.0,
                  compute_grad=True, metrics=None):
    """Fused softmax cross-entropy (see _cross_entropy); a bad target is raised at the next
    read of the device, or here with td.set_sync_checks(True)."""
    result = _cross_entropy(logits, target, reduction, ignore_index, label_smoothing,
                            compute_grad, metrics)
    errors.after(logits.device)
    return result


@planned()
def _cross_entropy(logits, target, reduction="mean", ignore_index=-100, label_smoothing=0.0,
                  compute_grad=True, metrics=None):
    """Fused softmax cross-entropy: (loss, dloss/dlogits or None).

    logits: [N, C] float, any strides; target: [N] int64/int32 in [0, C) or ignore_index.
    loss: [N] ("none") or 0-d ("sum", "mean" = sum / rows not ignored), logits' dtype.
    dlogits: [N, C] contiguous, logits' dtype, already divided for "mean"; 0 on ignored rows.
    metrics: (loss_total, correct) running totals to add the summed row losses and the count
    of correct rows to (Backend.cross_entropy).
    Launches: one kernel when N * C is small (metrics included), else count + rows (+ reduce,
    + the metrics' sum, add and count_correct_). No host read: a bad target is reported on the
    device's error flags (kernels/errors.py) and raised at the next read of the device.
    """
    _check_cross_entropy(logits, target, reduction, label_smoothing)
    if metrics is not None:
        check_metrics("cross_entropy", logits, metrics)
    n_rows, n_cols = logits.shape
    device, acc = logits.device, _acc(logits.dtype)
    grad = empty((n_rows, n_cols), logits.dtype, device) if compute_grad else None
    grad_arg = grad if compute_grad else logits  # never written without COMPUTE_GRAD
    out = empty((n_rows,) if reduction == "none" else (), logits.dtype, device)
    flag = errors.flag(device, "cross_entropy")
    block_n, block_c, single, warps = _blocks(n_rows, n_cols, logits.stride(1) == 1)
    smoothing = float(label_smoothing)
    strides = (*logits.stride(), *grad_arg.stride(), target.stride(0))
    flags = {"SMOOTH": smoothing > 0.0, "COMPUTE_GRAD": compute_grad, "BLOCK_C": block_c,
             "COL64": _col64(n_cols, logits.stride(1), grad_arg.stride(1)), "ACC": acc}
    if single and n_rows * block_c <= SMALL_PROBLEM:
        loss_total, correct = metrics if metrics is not None else (out, out)
        run(_ce_small_kernel, (1,), out, grad_arg, flag, logits, target, loss_total, correct,
            n_rows, n_cols, *strides, ignore_index, smoothing,
            REDUCTION=_REDUCTIONS[reduction], BLOCK_N=block_n, BLOCK_T=TARGET_BLOCK,
            num_warps=warps, METRICS=metrics is not None, **flags, **PDL)
    else:
        info = empty((1,), torch.int64, device)
        run(_ce_count_kernel, (1,), info, flag, target, n_rows, n_cols, target.stride(0),
            ignore_index, BLOCK_T=TARGET_BLOCK, num_warps=4)
        loss_dtype = torch.float64 if acc == tl.float64 else torch.float32
        rows_loss = out if reduction == "none" else empty((n_rows,), loss_dtype, device)
        if n_rows:
            run(_ce_rows_kernel, (cdiv(n_rows, block_n),),
                rows_loss, grad_arg, info, logits, target, n_rows, n_cols, *strides,
                ignore_index, smoothing, MEAN=reduction == "mean", SINGLE=single,
                BLOCK_N=block_n, num_warps=warps, **flags)
        if reduction != "none":
            run(_ce_reduce_kernel, (1,), out, rows_loss, info, n_rows, MEAN=reduction == "mean",
                BLOCK=TARGET_BLOCK, ACC=acc, num_warps=4)
        if metrics is not None:
            _add_metrics(metrics, rows_loss, logits, target)
    return out, grad
