"""Convolution, relu and max pool as one kernel each way: the first layers of a LeNet-style
network (Conv2d, ReLU, MaxPool2d on an image of few channels).

A fusion for the pattern of the MNIST cnn recipe (models.cnn's first block), apart from the
general ops. Backend's default (conv2d, max_pool2d and their backwards) is its specification
and the numpy backend's implementation.

    forward   p[n, o, P, Q] = max over the pool window (P, Q) of relu(conv2d(x, w, b))[n, o, h, v]
              indices[n, o, P, Q] = h * Wo + v of the first maximum (max_pool2d's contract)
    weight    dw[o, c, i, j] = sum over (n, P, Q) with p > 0 of dp[n, o, P, Q] * x[n, c, y, z]
              db[o]          = sum over (n, P, Q) with p > 0 of dp[n, o, P, Q]
              where (h, v) = divmod(indices[n, o, P, Q], Wo), y = h*sh - ph + i*dh, z likewise

The forward computes each window's convolution outputs in registers and keeps their maximum:
the convolution's output (4x the pool's at 2x2) is never written or read back. The weight
gradient reads dp, p and the indices once: the pool's backward would scatter dp into a dense
gradient of the convolution's output (zero except at each window's maximum, and where p > 0:
relu'), which the convolution's weight gradient would then read whole.

Where: groups = 1, an input of few channels (the flat (c, i, j) K of the implicit GEMM: below
conv.Settings.channel_inner_min channels) and pool windows of at most
conv.Settings.pool_max_window taps that do not overlap (else a window's outputs would be
computed for each window that holds them); the weight gradient where the input needs no
gradient (a first layer). Elsewhere the two
primitives run (Backend's defaults). The weight gradient's split partials are summed in a
fixed order (conv.sum_splits): the same bits on every run. Products run at conv2d's
precision (conv_precision(): TF32, 3xTF32 or the half type's tensor cores), float32 sums.

H200 (benchmarks/sweep_conv_pool.py, CUDA graphs, MNIST conv1 100x1x28x28 -> 32, k5 p2, 2x2
pool, 2026-11-24): forward 14.8 us against 20.7 for conv2d + max_pool2d (TF32), 18.4 against
23.1 (3xTF32); weight and bias gradients 17.7 us against 19.2 for the pool's backward +
conv2d_backward (TF32), 23.8 against 39.5 (3xTF32).
"""
from __future__ import annotations

import hashlib

import torch
import triton
import triton.language as tl

from ..backend import Backend, check_weight_grad_outputs
from . import conv, pool
from .elementwise import fill_
from .launch import INTERPRET, cdiv, dtype_of
from .plans import empty, planned, run
from .tuning import Tuner

PRIMITIVES = ("conv2d_relu_max_pool2d", "conv2d_relu_max_pool2d_backward")

# Switches and plans: conv.Settings' pool_* fields (conv.using(pool_fuse=False), ...).


# ============================================================================ kernels


@triton.jit
def _im2col_tile(x_ptr, oh, ow, inside, k0, C_IN, H, W, KH, KW, stride_xc, stride_xh,
                 stride_xw, SH, SW, PAD_H, PAD_W, DIL_H, DIL_W, BLOCK_K: tl.constexpr):
    """x's im2col tile: a row per convolution output pixel (oh, ow) of the image at x_ptr (rows
    not `inside` read nothing), a column per flat (c, i, j) from k0; zero in the padding. The
    offsets are a row part plus a column part (int32: the fused path takes x < 2**31)."""
    taps = KH * KW
    k = k0 + tl.arange(0, BLOCK_K)
    ch = k // taps
    tap = k - ch * taps
    i = tap // KW
    j = tap - i * KW
    y0 = oh * SH - PAD_H
    x0 = ow * SW - PAD_W
    dy = i * DIL_H
    dx = j * DIL_W
    yy = y0[:, None] + dy[None, :]
    xx = x0[:, None] + dx[None, :]
    ok = inside[:, None] & (k < C_IN * taps)[None, :] & (yy >= 0) & (yy < H) & (xx >= 0) & \
        (xx < W)
    offs = (y0 * stride_xh + x0 * stride_xw)[:, None] + \
        (ch * stride_xc + dy * stride_xh + dx * stride_xw)[None, :]
    return tl.load(x_ptr + offs, mask=ok, other=0.0)


@triton.jit(do_not_specialize=["H", "W", "OH", "OW", "POH", "POW", "BLOCKS"])
def _conv_relu_pool_kernel(
        x_ptr, w_ptr, bias_ptr, y_ptr, idx_ptr,
        C_IN, N_CH, H, W, OH, OW, POH, POW, KH, KW, BLOCKS,
        stride_xn, stride_xc, stride_xh, stride_xw,
        stride_wn, stride_wc, stride_wi, stride_wj, stride_bias,
        SH, SW, PAD_H, PAD_W, DIL_H, DIL_W,
        PKH: tl.constexpr, PKW: tl.constexpr, PSH: tl.constexpr, PSW: tl.constexpr,
        PPH: tl.constexpr, PPW: tl.constexpr, PDH: tl.constexpr, PDW: tl.constexpr,
        HAS_BIAS: tl.constexpr, STORE_INDEX: tl.constexpr,
        INPUT_PRECISION: tl.constexpr, DOT_FP32: tl.constexpr,
        BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    # One program: BLOCK_P pooled pixels of one image (a run of its flat POH x POW plane) and
    # BLOCK_N channels. For each tap (ti, tj) of the pool window, the convolution's outputs at
    # (P*PSH - PPH + ti*PDH, ...) for the tile, as conv.implicit_gemm's kernel computes them (the
    # im2col tile [pixels, flat (c, i, j)] @ w [(c, i, j), channels]), + bias, relu, rounded to
    # y's dtype (the values the pool would read), kept where larger (max_pool2d's rule: the
    # first real element, then strictly larger values, then the first NaN). y and indices:
    # contiguous [N, N_CH, POH, POW], so a channel's pixels are one run (coalesced stores).
    pid = tl.program_id(0)
    img = pid // BLOCKS
    pix = (pid - img * BLOCKS) * BLOCK_P + tl.arange(0, BLOCK_P)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < N_CH
    plane = POH * POW
    pix_ok = pix < plane
    pp = pix // POW
    pq = pix - pp * POW
    x_img = x_ptr + img.to(tl.int64) * stride_xn
    w_cols = w_ptr + offs_n * stride_wn
    taps = KH * KW
    k_total = C_IN * taps
    if HAS_BIAS:
        bias = tl.load(bias_ptr + offs_n * stride_bias, mask=n_ok, other=0.0).to(tl.float32)
    best = tl.full([BLOCK_P, BLOCK_N], float("-inf"), tl.float32)
    best_at = tl.full([BLOCK_P, BLOCK_N], -1, tl.int32)
    for t in tl.static_range(PKH * PKW):
        oh = pp * PSH - PPH + (t // PKW) * PDH
        ow = pq * PSW - PPW + (t % PKW) * PDW
        inside = pix_ok & (oh >= 0) & (oh < OH) & (ow >= 0) & (ow < OW)
        acc = tl.zeros([BLOCK_P, BLOCK_N], dtype=tl.float32)
        for k0 in range(0, k_total, BLOCK_K):
            a = _im2col_tile(x_img, oh, ow, inside, k0, C_IN, H, W, KH, KW, stride_xc,
                             stride_xh, stride_xw, SH, SW, PAD_H, PAD_W, DIL_H, DIL_W, BLOCK_K)
            k = k0 + tl.arange(0, BLOCK_K)
            ch = k // taps
            tap = k - ch * taps
            i = tap // KW
            b = tl.load(w_cols[None, :] + (ch * stride_wc + i * stride_wi +
                                           (tap - i * KW) * stride_wj)[:, None],
                        mask=(k < k_total)[:, None] & n_ok[None, :], other=0.0)
            if DOT_FP32:  # NOTE: the interpreter's bfloat16 dot is wrong; products exact in fp32
                a = a.to(tl.float32)
                b = b.to(tl.float32)
            acc = tl.dot(a, b, acc=acc, input_precision=INPUT_PRECISION)
        if HAS_BIAS:
            acc += bias[None, :]
        acc = tl.where(acc < 0, 0.0, acc)  # NOTE: NaN stays NaN, as torch.relu
        acc = acc.to(y_ptr.dtype.element_ty).to(tl.float32)
        take = inside[:, None] & ((best_at < 0) | (acc > best) | ((acc != acc) & (best == best)))
        best = tl.where(take, acc, best)
        best_at = tl.where(take, (oh * OW + ow)[:, None], best_at)
    out = (img.to(tl.int64) * N_CH + offs_n[None, :]) * plane + pix[:, None]
    ok = pix_ok[:, None] & n_ok[None, :]
    tl.store(y_ptr + out, best.to(y_ptr.dtype.element_ty), mask=ok)
    if STORE_INDEX:
        tl.store(idx_ptr + out, best_at.to(tl.int64), mask=ok)


@triton.jit(do_not_specialize=["TOTAL", "CHUNK", "PLANE", "POW", "H", "W", "OH", "OW"])
def _pooled_wgrad_kernel(
        dp_ptr, idx_ptr, p_ptr, x_ptr, part_ptr, dpart_ptr,
        TOTAL, CHUNK, PLANE, POW, C_IN, N_CH, H, W, OH, OW, KH, KW,
        stride_dn, stride_dc, stride_dh, stride_dw,
        stride_in, stride_ic, stride_ih, stride_iw,
        stride_pn, stride_pc, stride_ph, stride_pw,
        stride_xn, stride_xc, stride_xh, stride_xw,
        stride_ts, stride_to, stride_tk, stride_us, stride_uo,
        SH, SW, PAD_H, PAD_W, DIL_H, DIL_W,
        PKH: tl.constexpr, PKW: tl.constexpr, PSH: tl.constexpr, PSW: tl.constexpr,
        PPH: tl.constexpr, PPW: tl.constexpr, PDH: tl.constexpr, PDW: tl.constexpr,
        HAS_WEIGHT_GRAD: tl.constexpr, HAS_BIAS_GRAD: tl.constexpr,
        INPUT_PRECISION: tl.constexpr, DOT_FP32: tl.constexpr,
        BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    # One program: channels [nb * BLOCK_N, +BLOCK_N), flat (c, i, j) taps [kb * BLOCK_K, +),
    # and the pooled pixels (n, P, Q) [s * CHUNK, +CHUNK) of the N x POH x POW, BLOCK_P at a
    # time. The convolution's gradient is dp at each window's argmax where p > 0 (relu'),
    # zero elsewhere; so for each window tap (ti, tj), with G = that gradient where the
    # argmax is the tap, dw += G [channels, pixels] @ X [pixels, (c, i, j)], X the im2col tile
    # of the tap's convolution outputs: PKH x PKW products over the pooled pixels rather than
    # one over the convolution's (4x as many at 2x2) output pixels. The [channels, pixels]
    # tiles of dp, p and indices run along NCHW's contiguous pixels. db += G's row sums (the
    # first tap block's programs). Writes part[s] (and dpart[s]).
    s = tl.program_id(0)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    k0 = tl.program_id(2) * BLOCK_K
    n_ok = offs_n < N_CH
    start = s * CHUNK
    end = tl.minimum(start + CHUNK, TOTAL)
    acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    gsum = tl.zeros([BLOCK_N], dtype=tl.float32)
    for e0 in range(start, end, BLOCK_P):
        e = e0 + tl.arange(0, BLOCK_P)
        ok = e < end
        img = e // PLANE
        pix = e - img * PLANE
        pp = pix // POW
        pq = pix - pp * POW
        n64 = img.to(tl.int64)
        ok2 = n_ok[:, None] & ok[None, :]
        gate = tl.load(p_ptr + (offs_n * stride_pc)[:, None] +
                       (n64 * stride_pn + pp * stride_ph + pq * stride_pw)[None, :],
                       mask=ok2, other=0.0)
        live = ok2 & (gate > 0)
        g = tl.load(dp_ptr + (offs_n * stride_dc)[:, None] +
                    (n64 * stride_dn + pp * stride_dh + pq * stride_dw)[None, :],
                    mask=live, other=0.0)
        g = tl.where(live, g, 0.0)
        if HAS_BIAS_GRAD:
            gsum += tl.sum(g.to(tl.float32), axis=1)
        if HAS_WEIGHT_GRAD:
            at = tl.load(idx_ptr + (offs_n * stride_ic)[:, None] +
                         (n64 * stride_in + pp * stride_ih + pq * stride_iw)[None, :],
                         mask=live, other=-1).to(tl.int32)
            x_img = (x_ptr + n64 * stride_xn)[:, None]
            for t in tl.static_range(PKH * PKW):
                oh = pp * PSH - PPH + (t // PKW) * PDH
                ow = pq * PSW - PPW + (t % PKW) * PDW
                inside = ok & (oh >= 0) & (oh < OH) & (ow >= 0) & (ow < OW)
                gt = tl.where(inside[None, :] & (at == (oh * OW + ow)[None, :]), g, 0.0)
                xt = _im2col_tile(x_img, oh, ow, inside, k0, C_IN, H, W, KH, KW, stride_xc,
                                  stride_xh, stride_xw, SH, SW, PAD_H, PAD_W, DIL_H, DIL_W,
                                  BLOCK_K)
                gt = gt.to(xt.dtype)
                if DOT_FP32:  # NOTE: the interpreter's bfloat16 dot is wrong
                    gt = gt.to(tl.float32)
                    xt = xt.to(tl.float32)
                acc = tl.dot(gt, xt, acc=acc, input_precision=INPUT_PRECISION)
    if HAS_WEIGHT_GRAD:
        k = k0 + tl.arange(0, BLOCK_K)
        tl.store(part_ptr + s * stride_ts + (offs_n * stride_to)[:, None] +
                 (k * stride_tk)[None, :], acc.to(part_ptr.dtype.element_ty),
                 mask=n_ok[:, None] & (k < C_IN * KH * KW)[None, :])
    if HAS_BIAS_GRAD:
        if k0 == 0:
            tl.store(dpart_ptr + s * stride_us + offs_n * stride_uo,
                     gsum.to(dpart_ptr.dtype.element_ty), mask=n_ok)


# ============================================================================ launchers


def _source_hash():
    with open(__file__, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()[:16]


tuner = Tuner("conv_pool", _source_hash())


def _settings():
    return conv.plan_settings()


def _fusable(g, pool_geometry, x, s):
    """Whether the fused kernels take convolution g followed by this pool (module docstring),
    under the convolution's settings s."""
    (kh, kw), (sh, sw), _, (dh, dw), _ = pool_geometry
    return s.pool_fuse and g.groups == 1 and g.c < s.channel_inner_min and \
        kh * kw <= s.pool_max_window \
        and (kh - 1) * dh < sh and (kw - 1) * dw < sw and x.numel() < 2 ** 31 and \
        g.n * g.co * g.oh * g.ow < 2 ** 31


def _geometries(op, x, w, stride, padding, dilation, groups, kernel_size, pool_stride,
                pool_padding, pool_dilation, ceil_mode):
    g = conv.Geometry(op, x.shape, w.shape, stride, padding, dilation, groups)
    return g, pool.geometry(op, (g.n, g.co, g.oh, g.ow), kernel_size, pool_stride,
                             pool_padding, pool_dilation, ceil_mode)


@planned(settings=_settings, arrays=3)
def conv2d_relu_max_pool2d(x, w, bias=None, stride=(1, 1), padding=(0, 0), dilation=(1, 1),
                           groups=1, kernel_size=(2, 2), pool_stride=(2, 2), pool_padding=(0, 0),
                           pool_dilation=(1, 1), ceil_mode=False, with_indices=True):
    """(p, indices) = max_pool2d(relu(conv2d(x, w, bias, ...)), ...) without the convolution's
    output where the fused kernel applies (module docstring); indices int64 into the
    convolution's output planes, as max_pool2d's."""
    op = "conv2d_relu_max_pool2d"
    precision, s = conv.call_precision(), conv.current_settings()
    g, geometry = _geometries(op, x, w, stride, padding, dilation, groups, kernel_size,
                              pool_stride, pool_padding, pool_dilation, ceil_mode)
    conv.check_float(op, x, w, bias)
    if bias is not None and tuple(bias.shape) != (g.co,):
        raise ValueError(f"{op}: bias {tuple(bias.shape)} does not match weight "
                         f"{tuple(w.shape)} ({g.co} output channels)")
    if not _fusable(g, geometry, x, s):
        return Backend.conv2d_relu_max_pool2d(_Composed, x, w, bias, stride, padding, dilation,
                                              groups, kernel_size, pool_stride, pool_padding,
                                              pool_dilation, ceil_mode, with_indices)
    (pkh, pkw), (psh, psw), (pph, ppw), (pdh, pdw), (poh, pow_) = geometry
    y = empty((g.n, g.co, poh, pow_), x.dtype, x.device)
    indices = empty(y.shape, torch.int64, x.device) if with_indices else None
    if y.numel() == 0:
        return y, indices
    k_total = g.c * g.kh * g.kw
    block_n, block_k = conv.block(g.co), conv.block(k_total, 64)
    dot = conv.dot_precision(x.dtype, precision)
    kind = conv.menu_kind(dot, x.dtype)
    key = (f"crp:{g.n}x{g.c}x{g.co}:{g.h}x{g.w}->{g.oh}x{g.ow}->{poh}x{pow_}:k{g.kh}x{g.kw}:"
           f"s{g.sh}{g.sw}:pool{pkh}x{pkw}s{psh}{psw}:{dot}:{kind}:{str(x.dtype)[6:]}")
    plans = [{"BLOCK_P": pixels, "BLOCK_N": block_n, "BLOCK_K": block_k, "num_warps": warps,
              "num_stages": stages}
             for pixels, warps, stages in (s.pool_menu if not INTERPRET else [(128, 4, 1)])]
    args = (x, w, bias if bias is not None else w, y, indices if with_indices else y,
            g.c, g.co, g.h, g.w, g.oh, g.ow, poh, pow_, g.kh, g.kw)
    meta = dict(PKH=pkh, PKW=pkw, PSH=psh, PSW=psw, PPH=pph, PPW=ppw, PDH=pdh, PDW=pdw,
                HAS_BIAS=bias is not None, STORE_INDEX=with_indices,
                INPUT_PRECISION=dot, DOT_FP32=conv.dot_fp32(x.dtype))

    def launch(plan):
        blocks = cdiv(poh * pow_, plan["BLOCK_P"])
        run(_conv_relu_pool_kernel, (g.n * blocks, cdiv(g.co, block_n)), *args, blocks,
            *x.stride(), *w.stride(), bias.stride(0) if bias is not None else 0, *g.args,
            **meta, **plan)

    launch(plans[0] if INTERPRET else tuner.choose(key, lambda: plans, launch, x.device))
    return y, indices


def _splits(programs, total, block, steps, device, s):
    """(splits, chunk): the weight gradient's pooled pixels in `splits` chunks of `chunk` (a
    multiple of `block`), `programs` a split: up to s.pool_wgrad_per_sm programs an SM in all,
    each of at least `steps` blocks (s.pool_split overrides the count)."""
    blocks = cdiv(total, block)
    if s.pool_split is not None:
        splits = max(1, min(int(s.pool_split), blocks))
    else:
        splits = max(1, min(cdiv(s.pool_wgrad_per_sm * conv.sm_count(device), programs),
                            cdiv(blocks, steps)))
    chunk = cdiv(blocks, splits) * block
    return cdiv(total, chunk), chunk


@planned(settings=_settings, arrays=5)
def conv2d_relu_max_pool2d_backward(dp, indices, p, x, w, stride=(1, 1), padding=(0, 0),
                                    dilation=(1, 1), groups=1, kernel_size=(2, 2),
                                    pool_stride=(2, 2), pool_padding=(0, 0),
                                    pool_dilation=(1, 1), ceil_mode=False, input_grad=True,
                                    weight_grad=True, bias_grad=True, dw_out=None, db_out=None):
    """(dx, dw, db) of conv2d_relu_max_pool2d for dp; the weight and bias gradients straight
    from dp, indices and p where the fused kernel applies and no input gradient is asked for
    (module docstring), else the pool's backward and conv2d_backward."""
    op = "conv2d_relu_max_pool2d_backward"
    precision, s = conv.call_precision(), conv.current_settings()
    g, geometry = _geometries(op, x, w, stride, padding, dilation, groups, kernel_size,
                              pool_stride, pool_padding, pool_dilation, ceil_mode)
    conv.check_float(op, dp, x, w)
    shape = (g.n, g.co) + geometry[4]
    for name, a in (("dp", dp), ("indices", indices), ("p", p)):
        if tuple(a.shape) != shape:
            raise ValueError(f"{op}: {name} {tuple(a.shape)} does not match the pool's output "
                             f"{shape} of input {tuple(x.shape)} and weight {tuple(w.shape)}")
    if indices.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"{op}: indices must be int64, got {dtype_of(indices).name}")
    if p.dtype != dp.dtype:
        raise TypeError(f"{op}: p {dtype_of(p).name} and dp {dtype_of(dp).name} differ")
    if input_grad or not (weight_grad or bias_grad) or not _fusable(g, geometry, x, s):
        return Backend.conv2d_relu_max_pool2d_backward(
            _Composed, dp, indices, p, x, w, stride, padding, dilation, groups, kernel_size,
            pool_stride, pool_padding, pool_dilation, ceil_mode, input_grad, weight_grad,
            bias_grad, dw_out, db_out)
    check_weight_grad_outputs(op, w, dw_out, db_out)
    dw = (dw_out if dw_out is not None else empty(w.shape, w.dtype, w.device)) \
        if weight_grad else None
    db = (db_out if db_out is not None else empty((g.co,), w.dtype, w.device)) \
        if bias_grad else None
    k_total = g.c * g.kh * g.kw
    total = g.n * shape[2] * shape[3]
    if total == 0 or g.co == 0:  # no pooled pixel: zero gradients
        for out in (dw, db):
            if out is not None and out.numel():
                fill_(out, 0.0)
        return None, dw, db
    block_p, warps, stages, steps = s.pool_wgrad_plan if not INTERPRET else (256, 4, 1, 1)
    block_n, block_k = conv.block(g.co, 64), conv.block(k_total, 32)
    n_blocks = cdiv(g.co, block_n)
    k_blocks = cdiv(k_total, block_k) if dw is not None else 1
    splits, chunk = _splits(n_blocks * k_blocks, total, block_p, steps, dp.device, s)
    if splits == 1:  # straight into dw and db
        part = dw.view(1, g.co, k_total) if dw is not None else None
        dpart = db.view(1, g.co) if db is not None else None
    else:  # float32 partials [S, dw's elements, then db's], summed in a fixed order after
        cols = g.co * k_total if dw is not None else 0
        work = empty((splits, cols + (g.co if db is not None else 0)), torch.float32, dp.device)
        part = work[:, :cols].view(splits, g.co, k_total) if dw is not None else None
        dpart = work[:, cols:] if db is not None else None
    some = part if part is not None else dpart
    (pkh, pkw), (psh, psw), (pph, ppw), (pdh, pdw), _ = geometry
    run(_pooled_wgrad_kernel, (splits, n_blocks, k_blocks), dp, indices, p, x, some,
        dpart if dpart is not None else some, total, chunk, shape[2] * shape[3], shape[3], g.c,
        g.co, g.h, g.w, g.oh, g.ow, g.kh, g.kw, *dp.stride(), *indices.stride(), *p.stride(),
        *x.stride(), *(part.stride() if part is not None else (0, 0, 0)),
        *(dpart.stride() if dpart is not None else (0, 0)), *g.args,
        PKH=pkh, PKW=pkw, PSH=psh, PSW=psw, PPH=pph, PPW=ppw, PDH=pdh, PDW=pdw,
        HAS_WEIGHT_GRAD=dw is not None, HAS_BIAS_GRAD=db is not None,
        INPUT_PRECISION=conv.dot_precision(x.dtype, precision), DOT_FP32=conv.dot_fp32(x.dtype),
        BLOCK_P=block_p, BLOCK_N=block_n, BLOCK_K=block_k, num_warps=warps, num_stages=stages)
    if splits > 1:  # one launch of fixed-order sums
        conv.sum_splits(work[:, :cols].view(splits, 1, -1), dw.view(1, -1) if dw is not None
                        else None, dpart[:, None] if db is not None else None,
                        db.view(1, g.co) if db is not None else None)
    return None, dw, db


class _Composed:
    """The triton primitives that the composed paths call (Backend's defaults, unbound)."""
    conv2d = staticmethod(conv.conv2d)
    conv2d_backward = staticmethod(conv.conv2d_backward)
    max_pool2d = staticmethod(pool.max_pool2d)
    max_pool2d_backward = staticmethod(pool.max_pool2d_backward)
