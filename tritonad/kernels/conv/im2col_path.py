"""The im2col path: materialise X_col [N, C*kh*kw, Ho*Wo] with the im2col kernel and call our
matmul; the input gradient is matmul(W^T, dY) followed by col2im (the gather form of im2col's
adjoint). The bias rides along as one more row of ones in X_col and one more column of W, so
the matmul adds it, and the same trick yields db beside dW.

When it applies (routing.layer_algorithm): groups = 1, and either the settings ask for it
(algo="im2col") or, under "auto", the input gradient of a layer with fewer than 8 input
channels, whose implicit GEMM would have M = C_in rows (a tensor-core tile mostly wasted),
where matmul(W^T, dY) has M = C_in*kh*kw and col2im then sums the columns cheaply. Simple, but
the column buffer is kh*kw times the input. The weight gradient's per-image products come out
of the matmul in the input dtype before their float32 sum over the batch (one more rounding
for half types). im2col and col2im are also primitives of their own (torch's unfold, fold).
"""
from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from ..launch import INTERPRET, cdiv
from ..plans import empty, run
from ..pool import nchw
from .common import Geometry, source_coord
from .settings import matmul_precision
from .sums import sum_splits


@triton.jit
def _im2col_kernel(x_ptr, cols_ptr, C, H, W, OUT_W, L, KH, KW, ROWS,
                   stride_xn, stride_xc, stride_xh, stride_xw,
                   stride_cn, stride_ck, stride_cl,
                   SH, SW, PH, PW, DH, DW,
                   ONES_ROW: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_L: tl.constexpr):
    # cols[n, (c, i, j), (p, q)] = x[n, c, p*SH - PH + i*DH, q*SW - PW + j*DW] (0 outside), and
    # with ONES_ROW an extra last row of ones (so that a bias rides along in the matmul).
    # One program: [BLOCK_K rows, BLOCK_L pixels] of image n.
    pid_l = tl.program_id(0)
    pid_k = tl.program_id(1)
    n = tl.program_id(2)
    rows = pid_k * BLOCK_K + tl.arange(0, BLOCK_K)
    pix = pid_l * BLOCK_L + tl.arange(0, BLOCK_L)
    taps = KH * KW
    k_total = C * taps
    c = rows // taps
    tap = rows - c * taps
    i = tap // KW
    j = tap - i * KW
    p = pix // OUT_W
    q = pix - p * OUT_W
    y = p[None, :] * SH - PH + (i * DH)[:, None]
    x = q[None, :] * SW - PW + (j * DW)[:, None]
    pix_ok = pix < L
    inside = (rows < k_total)[:, None] & pix_ok[None, :] & (y >= 0) & (y < H) & (x >= 0) & (x < W)
    src = x_ptr + n.to(tl.int64) * stride_xn + (c.to(tl.int64) * stride_xc)[:, None] + \
        y * stride_xh + x * stride_xw
    v = tl.load(src, mask=inside, other=0.0)
    if ONES_ROW:
        v = tl.where((rows == k_total)[:, None], 1.0, v.to(tl.float32))
    dst = cols_ptr + n.to(tl.int64) * stride_cn + (rows.to(tl.int64) * stride_ck)[:, None] + \
        (pix * stride_cl)[None, :]
    tl.store(dst, v.to(cols_ptr.dtype.element_ty), mask=(rows < ROWS)[:, None] & pix_ok[None, :])


@triton.jit
def _col2im_kernel(cols_ptr, x_ptr, TOTAL, C, H, W, OUT_H, OUT_W, KH, KW,
                   stride_cn, stride_ck, stride_cl,
                   SH, SW, PH, PW, DH, DW,
                   ACC_FP64: tl.constexpr, INDEX_64: tl.constexpr, BLOCK: tl.constexpr):
    # x[n, c, h, v] = sum over taps (i, j) of cols[n, (c, i, j), (p, q)] where
    # p = (h + PH - i*DH) / SH is exact and inside (the gather form of the adjoint of im2col:
    # each output element sums its own terms, so overlapping windows need no atomics).
    # One program: BLOCK elements of the contiguous output x.
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    if INDEX_64:
        offs = offs.to(tl.int64)
    ok = offs < TOTAL
    n, c, h, v = nchw(offs, C, H, W)
    base = cols_ptr + n.to(tl.int64) * stride_cn + (c * (KH * KW)).to(tl.int64) * stride_ck
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    if ACC_FP64:
        acc = acc.to(tl.float64)
    for i in range(0, KH):
        p, p_ok = source_coord(h + PH, -i * DH, SH, OUT_H, True)
        for j in range(0, KW):
            q, q_ok = source_coord(v + PW, -j * DW, SW, OUT_W, True)
            src = base + (i * KW + j) * stride_ck + (p * OUT_W + q) * stride_cl
            acc += tl.load(src, mask=ok & p_ok & q_ok, other=0.0).to(acc.dtype)
    tl.store(x_ptr + offs, acc.to(x_ptr.dtype.element_ty), mask=ok)


@triton.jit
def _pack_weight_kernel(w_ptr, bias_ptr, out_ptr, C_OUT, C, KH, KW,
                        stride_wo, stride_wc, stride_wi, stride_wj, stride_bias,
                        HAS_BIAS: tl.constexpr, BLOCK: tl.constexpr):
    # out[o, (c, i, j)] = w[o, c, i, j]; with HAS_BIAS one more column out[o, C*KH*KW] = bias[o].
    # One program: BLOCK elements of the contiguous [C_OUT, C*KH*KW (+1)] output.
    taps = KH * KW
    k_total = C * taps
    if HAS_BIAS:
        cols = k_total + 1
    else:
        cols = k_total
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < C_OUT * cols
    o = offs // cols
    k = offs - o * cols
    c = k // taps
    tap = k - c * taps
    i = tap // KW
    j = tap - i * KW
    is_w = k < k_total
    v = tl.load(w_ptr + o * stride_wo + c * stride_wc + i * stride_wi + j * stride_wj,
                mask=ok & is_w, other=0.0)
    if HAS_BIAS:
        b = tl.load(bias_ptr + o * stride_bias, mask=ok & (k == k_total), other=0.0)
        v = tl.where(is_w, v, b)
    tl.store(out_ptr + offs, v, mask=ok)



def have_matmul():
    """Whether tritonad.kernels.matmul is there (the im2col path needs it)."""
    try:
        from ..matmul import matmul  # noqa: F401
    except ImportError:
        return False
    return True


def _matmul(precision):
    """Our matmul, at the convolution's precision (not matmul_precision())."""
    try:
        from ..matmul import matmul
    except ImportError as err:
        raise RuntimeError("conv2d: the im2col path needs tritonad.kernels.matmul, which is "
                           f"not available ({err}); use conv.using(algo='implicit')") from err
    return functools.partial(matmul, precision=matmul_precision(precision))


def im2col_buffer(x, g, ones_row):
    """Columns [N, C*kh*kw (+1 row of ones), Ho*Wo] of x."""
    rows = g.c * g.kh * g.kw + int(ones_row)
    cols = empty((g.n, rows, g.oh * g.ow), x.dtype, x.device)
    if cols.numel() == 0:
        return cols
    block_k, block_l = (32, 128) if not INTERPRET else (64, 256)
    grid = (cdiv(g.oh * g.ow, block_l), cdiv(rows, block_k), g.n)
    run(_im2col_kernel, grid, x, cols, g.c, g.h, g.w, g.ow, g.oh * g.ow, g.kh, g.kw, rows,
        *x.stride(), *cols.stride(), *g.args,
        ONES_ROW=ones_row, BLOCK_K=block_k, BLOCK_L=block_l, num_warps=4)
    return cols


def col2im_into(cols, out, g):
    """out [N, C, H, W] (contiguous) = the window sums of cols [N, C*kh*kw, Ho*Wo]."""
    total = out.numel()
    block = 512 if not INTERPRET else 4096
    run(_col2im_kernel, (cdiv(total, block),),
        cols, out, total, g.c, g.h, g.w, g.oh, g.ow, g.kh, g.kw, *cols.stride(), *g.args,
        ACC_FP64=out.dtype == torch.float64, INDEX_64=total + block >= 2 ** 31, BLOCK=block,
        num_warps=4)
    return out


def _packed_weight(w, bias):
    """w as a [Co, C*kh*kw] matrix (a view when contiguous and no bias), bias as one more column."""
    co, c, kh, kw = w.shape
    if bias is None and w.is_contiguous():
        return w.view(co, c * kh * kw)
    out = empty((co, c * kh * kw + int(bias is not None)), w.dtype, w.device)
    block = 1024
    run(_pack_weight_kernel, (cdiv(out.numel(), block),),
        w, bias if bias is not None else w, out, co, c, kh, kw, *w.stride(),
        bias.stride(0) if bias is not None else 0,
        HAS_BIAS=bias is not None, BLOCK=block, num_warps=4)
    return out


def _flat_pixels(t):
    """t [N, C, H, W] as [N, C, H*W]: a view when (H, W) merge, else a contiguous copy (an
    im2col with a 1x1 kernel is exactly that copy)."""
    n, c, h, w = t.shape
    if t.stride(2) == w * t.stride(3) or h == 1 or w == 1:
        step = t.stride(3) if w > 1 else t.stride(2)
        return t.as_strided((n, c, h * w), (t.stride(0), t.stride(1), step))
    g = Geometry("conv2d", t.shape, (1, c, 1, 1), 1, 0, 1, 1)
    return im2col_buffer(t, g, False)



def forward(x, w, bias, g, activation, precision):
    """y [N, Co, Ho, Wo] = conv(x, w) + bias (then relu where activation="relu"): the bias as
    a row of ones in the columns and a column of the weights, added by the matmul."""
    cols = im2col_buffer(x, g, ones_row=bias is not None)
    wmat = _packed_weight(w, bias)
    out = _matmul(precision)(wmat.unsqueeze(0).expand(g.n, *wmat.shape), cols,
                             activation=activation)
    return out.view(g.n, g.co, g.oh, g.ow)


def input_grad(dy, w, dx, g, precision):
    """dx [N, C, H, W] (contiguous) = col2im(W^T @ dY)."""
    wmat = _packed_weight(w, None).t()                       # [C*kh*kw, Co]
    dcols = _matmul(precision)(wmat.unsqueeze(0).expand(g.n, *wmat.shape), _flat_pixels(dy))
    col2im_into(dcols, dx, g)
    del dcols
    return dx


def weight_grad(dy, x, dw, db, g, precision):
    """dw [Co, C, kh, kw] and db [Co] (or None), contiguous: the per-image products dY @
    X_col^T (db from a row of ones), summed over the images in a fixed order."""
    cols = im2col_buffer(x, g, ones_row=db is not None)         # [N, K (+1), L]
    part = _matmul(precision)(_flat_pixels(dy), cols.transpose(1, 2))  # [N, Co, K (+1)]
    del cols
    k_total = g.c * g.kh * g.kw
    sum_splits(part[:, :, :k_total], dw.view(g.co, k_total))
    if db is not None:
        sum_splits(part[:, :, k_total:], db.view(g.co, 1))
