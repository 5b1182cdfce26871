"""Normalisation kernels: layer_norm / rms_norm over rows, batch_norm over channels (with relu or
gelu fused), forward and backward. These are the fused forms of the composites in
autodiff/norm_ops.py (their oracle); the numpy backend runs the composites.

Row norms (layer_norm, rms_norm; group_norm reuses them on rows of one group): x is [rows, cols]
with any strides; the forward kernel here holds BLOCK_M whole rows in registers (BLOCK_N = next
power of two of cols, at most MAX_COLS), several rows a program for narrow rows so that a program
moves about TILE elements. The backward (kernels/norm_stream.py) writes dx and one row of
partial sums of dweight and dbias per program into a [programs, cols] float32 buffer; a second
kernel here sums those rows in order (deterministic, no float atomics).

Batch norm: x is [N, C, *spatial] viewed as [N, S, C] with strides (any of NCHW, channels-last,
[N, C]); the launchers here find that view (or take a contiguous copy) and lay the output out
as x; kernels/norm_stream.py holds the passes. Statistics combine per-tile means and squared
deviations by Chan's parallel formula in float32 (float64 for float64 inputs), so a large mean
loses no digits; the finish kernel also updates the running statistics and num_batches_tracked
on the device (no host read: a CUDA graph can capture a training step).
"""
from __future__ import annotations

import math

import triton
import triton.language as tl

from .elementwise import contiguous
from .launch import INTERPRET, cdiv, dtype_of, next_power_of_2
from . import norm_stream
from .norm_common import acc_type, col_offsets, settings, stat_dtype
from .plans import empty, planned, run

PRIMITIVES = ("layer_norm", "layer_norm_backward", "batch_norm", "batch_norm_backward")

MAX_COLS = 16384                          # widest row held in registers (norm_ops composes above)
TILE = 1 << 14 if INTERPRET else 4096     # elements a program holds at once
_ACTIVATIONS = {None: 0, "relu": 1, "gelu": 2}
_acc, _stat_dtype = acc_type, stat_dtype


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
    dx, parts = norm_stream.rows_backward(dy, x, weight, mean, rstd, rms, bool(need_dx), need_dw,
                                          need_db, settings(), col64)
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
    mean, rstd = norm_stream.bn_forward(
        y, x, weight, bias, running_mean, running_var, num_batches_tracked, training, momentum,
        eps, _ACTIVATIONS[activation], N, S, C, x_strides, y_strides, channels_inner, settings())
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
    norm_stream.bn_backward(dx, dw, db, dy, x, weight, bias, mean, rstd, training,
                            _ACTIVATIONS[activation], N, S, C, x_strides, d_strides, o_strides,
                            channels_inner, settings())
    return dx, dw, db
