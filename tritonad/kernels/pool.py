"""2-d max and average pooling (NCHW), forward and backward.

Window (p, q) of an input plane covers rows p*sh - ph + i*dh (i < kh) and columns likewise;
positions outside the input are padding. With ceil_mode the last window may run past the right
padding (torch's rule: it must start inside the input or the left padding).

    max:  y = max over the window (padding = -inf), index = h * W + w of the first maximum
          (NOTE: a NaN counts as the maximum, the first NaN wins, as in the reference; a window
          of -inf values points at its first real element, never at padding; a dilated window
          lying wholly in the padding gives -inf and index -1, which the backward skips)
          dx[h, w] = sum over the windows (p, q) holding (h, w) whose index is h * W + w of
          dy[p, q]: overlapping windows add up, gathered in the order of the kernel offsets.
    avg:  y = sum over the window / divisor, divisor = divisor_override, or the window clipped to
          the padded input (count_include_pad), or the count of real elements in it.
          dx[h, w] = sum over the windows (p, q) holding (h, w) of dy[p, q] / divisor(p, q).

Both backwards are gathers (every dx element owned by one program, no atomics), so the same
input gives the same gradient bits on every run, overlapping windows or not.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .launch import INTERPRET, cdiv, dtype_of
from .plans import empty, planned, run

PRIMITIVES = ("max_pool2d", "max_pool2d_backward", "avg_pool2d", "avg_pool2d_backward")

# the max-pool backward of windows that tile the input exactly, window by window
# (_max_pool_bwd_windows_kernel); False: every geometry element by element (tests compare;
# the switch is not in the launch plans' keys: launch.clear_plans() after changing it)
WINDOW_BACKWARD = True

_FLOATS = ("float32", "float16", "bfloat16", "float64")


# ============================================================================ kernels
# The window geometry (kernel, stride, padding, dilation) is constexpr: a network has a few
# pooling geometries, and with them known the tap loops have constant trip counts (the compiler
# unrolls small ones) and the divisions by the stride become shifts. Before, the integer work
# (12 runtime divisions an element in the max backward) bounded these memory-bound kernels.


@triton.jit
def nchw(offs, C, H, W):
    """(n, c, h, w) of flat offsets into a contiguous [N, C, H, W]: three divisions."""
    plane = offs // (H * W)
    hw = offs - plane * (H * W)
    h = hw // W
    n = plane // C
    return n, plane - n * C, h, hw - h * W


@triton.jit
def _max_pool_fwd_kernel(x_ptr, y_ptr, idx_ptr, TOTAL, C, H, W, OUT_H, OUT_W,
                         stride_xn, stride_xc, stride_xh, stride_xw,
                         KH: tl.constexpr, KW: tl.constexpr, SH: tl.constexpr, SW: tl.constexpr,
                         PH: tl.constexpr, PW: tl.constexpr, DH: tl.constexpr, DW: tl.constexpr,
                         ACC_FP64: tl.constexpr,
                         INDEX_64: tl.constexpr, STORE_INDEX: tl.constexpr, BLOCK: tl.constexpr):
    # One program: BLOCK outputs of the contiguous y [N, C, OUT_H, OUT_W] (and their indices,
    # if STORE_INDEX).
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    if INDEX_64:
        offs = offs.to(tl.int64)
    ok = offs < TOTAL
    n, c, p, q = nchw(offs, C, OUT_H, OUT_W)
    base = x_ptr + n.to(tl.int64) * stride_xn + c.to(tl.int64) * stride_xc
    h0 = p * SH - PH
    w0 = q * SW - PW
    best = tl.full([BLOCK], float("-inf"), tl.float32)
    if ACC_FP64:
        best = best.to(tl.float64)
    best_at = tl.full([BLOCK], -1, tl.int32)
    for i in range(0, KH):
        h = h0 + i * DH
        h_ok = ok & (h >= 0) & (h < H)
        for j in range(0, KW):
            w = w0 + j * DW
            inside = h_ok & (w >= 0) & (w < W)
            v = tl.load(base + h * stride_xh + w * stride_xw, mask=inside,
                        other=float("-inf")).to(best.dtype)
            # the first real element, then strictly larger values, then the first NaN
            take = inside & ((best_at < 0) | (v > best) | ((v != v) & (best == best)))
            best = tl.where(take, v, best)
            best_at = tl.where(take, (h * W + w).to(tl.int32), best_at)
    tl.store(y_ptr + offs, best.to(y_ptr.dtype.element_ty), mask=ok)
    if STORE_INDEX:
        tl.store(idx_ptr + offs, best_at.to(tl.int64), mask=ok)


@triton.jit
def _max_pool_bwd_kernel(dy_ptr, idx_ptr, gate_ptr, dx_ptr, TOTAL, C, H, W, OUT_H, OUT_W,
                         stride_dn, stride_dc, stride_dh, stride_dw,
                         stride_in, stride_ic, stride_ih, stride_iw,
                         stride_gn, stride_gc, stride_gh, stride_gw,
                         KH: tl.constexpr, KW: tl.constexpr, SH: tl.constexpr, SW: tl.constexpr,
                         PH: tl.constexpr, PW: tl.constexpr, DH: tl.constexpr, DW: tl.constexpr,
                         TILED: tl.constexpr, GATED: tl.constexpr, ACC_FP64: tl.constexpr,
                         INDEX_64: tl.constexpr, BLOCK: tl.constexpr):
    # dx[n, c, h, w] = sum over the windows (p, q) that hold (h, w) (p*SH - PH + i*DH = h for
    # some i < KH, likewise q) and whose index is h * W + w, of dy[n, c, p, q], summed in the
    # order (i, j): a gather, deterministic. GATED: only windows whose gate[n, c, p, q] > 0
    # count (relu' of a pooled relu: the gate is the pool's output, which is the relu's output
    # at the argmax). One program: BLOCK elements of the contiguous dx.
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    if INDEX_64:
        offs = offs.to(tl.int64)
    ok = offs < TOTAL
    n, c, h, w = nchw(offs, C, H, W)
    dy_base = dy_ptr + n.to(tl.int64) * stride_dn + c.to(tl.int64) * stride_dc
    idx_base = idx_ptr + n.to(tl.int64) * stride_in + c.to(tl.int64) * stride_ic
    gate_base = gate_ptr + n.to(tl.int64) * stride_gn + c.to(tl.int64) * stride_gc
    here = h * W + w
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    if ACC_FP64:
        acc = acc.to(tl.float64)
    if TILED:
        # windows that tile the plane (kernel = stride, no dilation): (h, w) lies in at most
        # one, so one index and one dy load, issued together (no dependent load)
        th = h + PH
        tw = w + PW
        p = th // SH
        q = tw // SW
        inside = ok & (p < OUT_H) & (q < OUT_W)
        at = tl.load(idx_base + p * stride_ih + q * stride_iw, mask=inside, other=-1)
        g = tl.load(dy_base + p * stride_dh + q * stride_dw, mask=inside, other=0.0)
        hit = at == here
        if GATED:
            hit &= tl.load(gate_base + p * stride_gh + q * stride_gw, mask=inside,
                           other=0.0) > 0
        acc += tl.where(hit, g.to(acc.dtype), 0.0)
    else:
        for i in range(0, KH):
            th = h + PH - i * DH  # = p * SH if window p holds h at tap i (NOTE: never divide < 0)
            p = tl.maximum(th, 0) // SH
            p_ok = ok & (th >= 0) & (p * SH == th) & (p < OUT_H)
            for j in range(0, KW):
                tw = w + PW - j * DW
                q = tl.maximum(tw, 0) // SW
                inside = p_ok & (tw >= 0) & (q * SW == tw) & (q < OUT_W)
                at = tl.load(idx_base + p * stride_ih + q * stride_iw, mask=inside, other=-1)
                hit = inside & (at == here)
                if GATED:
                    hit &= tl.load(gate_base + p * stride_gh + q * stride_gw, mask=hit,
                                   other=0.0) > 0
                g = tl.load(dy_base + p * stride_dh + q * stride_dw, mask=hit, other=0.0)
                acc += g.to(acc.dtype)
    tl.store(dx_ptr + offs, acc.to(dx_ptr.dtype.element_ty), mask=ok)


@triton.jit
def _max_pool_bwd_windows_kernel(dy_ptr, idx_ptr, gate_ptr, dx_ptr, TOTAL, C, OUT_H, OUT_W,
                                 stride_dn, stride_dc, stride_dh, stride_dw,
                                 stride_in, stride_ic, stride_ih, stride_iw,
                                 stride_gn, stride_gc, stride_gh, stride_gw,
                                 KH: tl.constexpr, KW: tl.constexpr, KW_P2: tl.constexpr,
                                 GATED: tl.constexpr, ACC_FP64: tl.constexpr,
                                 INDEX_64: tl.constexpr, BLOCK: tl.constexpr):
    # dx of a max pool whose windows tile the input exactly (kernel = stride, no padding or
    # dilation, H = OUT_H * KH, W = OUT_W * KW), window by window: each window's index, dy
    # (and gate) are loaded once, and its KH x KW elements of the contiguous dx written, dy at
    # the index (where gate > 0), 0 elsewhere. Every element lies in one window: the values of
    # the gather (_max_pool_bwd_kernel's TILED path), with a quarter of its loads and index
    # arithmetic for 2x2 windows. One program: BLOCK windows (n, c, p, q), flat.
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    if INDEX_64:
        offs = offs.to(tl.int64)
    ok = offs < TOTAL
    n, c, p, q = nchw(offs, C, OUT_H, OUT_W)
    at = tl.load(idx_ptr + n.to(tl.int64) * stride_in + c.to(tl.int64) * stride_ic +
                 p * stride_ih + q * stride_iw, mask=ok, other=-1)
    g = tl.load(dy_ptr + n.to(tl.int64) * stride_dn + c.to(tl.int64) * stride_dc +
                p * stride_dh + q * stride_dw, mask=ok, other=0.0)
    if GATED:
        gate = tl.load(gate_ptr + n.to(tl.int64) * stride_gn + c.to(tl.int64) * stride_gc +
                       p * stride_gh + q * stride_gw, mask=ok, other=0.0)
        at = tl.where(gate > 0, at, -1)
    W = OUT_W * KW
    plane = dx_ptr + (n * C + c).to(tl.int64) * (OUT_H * KH * W)
    j = tl.arange(0, KW_P2)
    for i in tl.static_range(KH):
        here = (p * KH + i) * W
        here = here[:, None] + (q * KW)[:, None] + j[None, :]
        acc = tl.zeros([BLOCK, KW_P2], dtype=tl.float32)
        if ACC_FP64:
            acc = acc.to(tl.float64)
        acc += tl.where(at[:, None] == here, g[:, None].to(acc.dtype), 0.0)
        tl.store(plane[:, None] + here, acc.to(dx_ptr.dtype.element_ty),
                 mask=ok[:, None] & (j < KW)[None, :])


@triton.jit
def _avg_window(p, SIZE, K, S, P):
    """Window p along one axis: first and one-past-last real position, and the length of the
    window clipped to the padded input (torch's pool_size)."""
    start = p * S - P
    end = tl.minimum(start + K, SIZE + P)
    return tl.maximum(start, 0), tl.minimum(end, SIZE), end - start


@triton.jit
def _avg_divisor(p, q, H, W, KH, KW, SH, SW, PH, PW, DIVISOR, COUNT_PAD: tl.constexpr):
    h_lo, h_hi, h_len = _avg_window(p, H, KH, SH, PH)
    w_lo, w_hi, w_len = _avg_window(q, W, KW, SW, PW)
    if COUNT_PAD:
        count = h_len * w_len
    else:
        count = (h_hi - h_lo) * (w_hi - w_lo)
    return tl.where(DIVISOR > 0, DIVISOR, count).to(tl.float32)


@triton.jit
def _avg_pool_fwd_kernel(x_ptr, y_ptr, TOTAL, C, H, W, OUT_H, OUT_W,
                         stride_xn, stride_xc, stride_xh, stride_xw,
                         DIVISOR, KH: tl.constexpr, KW: tl.constexpr, SH: tl.constexpr,
                         SW: tl.constexpr, PH: tl.constexpr, PW: tl.constexpr,
                         COUNT_PAD: tl.constexpr, ACC_FP64: tl.constexpr, INDEX_64: tl.constexpr,
                         BLOCK: tl.constexpr):
    # One program: BLOCK outputs of the contiguous y [N, C, OUT_H, OUT_W].
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    if INDEX_64:
        offs = offs.to(tl.int64)
    ok = offs < TOTAL
    n, c, p, q = nchw(offs, C, OUT_H, OUT_W)
    base = x_ptr + n.to(tl.int64) * stride_xn + c.to(tl.int64) * stride_xc
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    if ACC_FP64:
        acc = acc.to(tl.float64)
    for i in range(0, KH):
        h = p * SH - PH + i
        h_ok = ok & (h >= 0) & (h < H)
        for j in range(0, KW):
            w = q * SW - PW + j
            inside = h_ok & (w >= 0) & (w < W)
            acc += tl.load(base + h * stride_xh + w * stride_xw, mask=inside,
                           other=0.0).to(acc.dtype)
    div = _avg_divisor(p, q, H, W, KH, KW, SH, SW, PH, PW, DIVISOR, COUNT_PAD)
    tl.store(y_ptr + offs, (acc / div.to(acc.dtype)).to(y_ptr.dtype.element_ty), mask=ok)


@triton.jit
def _avg_pool_bwd_kernel(dy_ptr, dx_ptr, TOTAL, C, H, W, OUT_H, OUT_W,
                         stride_dn, stride_dc, stride_dh, stride_dw,
                         DIVISOR, KH: tl.constexpr, KW: tl.constexpr, SH: tl.constexpr,
                         SW: tl.constexpr, PH: tl.constexpr, PW: tl.constexpr,
                         COUNT_PAD: tl.constexpr, ACC_FP64: tl.constexpr, INDEX_64: tl.constexpr,
                         BLOCK: tl.constexpr):
    # dx[n, c, h, w] = sum over windows (p, q) with p*SH - PH + i = h (some i < KH), likewise q,
    # of dy[n, c, p, q] / divisor(p, q). One program: BLOCK elements of the contiguous dx.
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    if INDEX_64:
        offs = offs.to(tl.int64)
    ok = offs < TOTAL
    n, c, h, w = nchw(offs, C, H, W)
    base = dy_ptr + n.to(tl.int64) * stride_dn + c.to(tl.int64) * stride_dc
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    if ACC_FP64:
        acc = acc.to(tl.float64)
    for i in range(0, KH):
        th = h + PH - i  # = p * SH when window p holds h at tap i (NOTE: never divide a negative)
        p = tl.maximum(th, 0) // SH
        p_ok = ok & (th >= 0) & (p * SH == th) & (p < OUT_H)
        for j in range(0, KW):
            tw = w + PW - j
            q = tl.maximum(tw, 0) // SW
            inside = p_ok & (tw >= 0) & (q * SW == tw) & (q < OUT_W)
            g = tl.load(base + p * stride_dh + q * stride_dw, mask=inside, other=0.0)
            div = _avg_divisor(p, q, H, W, KH, KW, SH, SW, PH, PW, DIVISOR, COUNT_PAD)
            acc += g.to(acc.dtype) / div.to(acc.dtype)
    tl.store(dx_ptr + offs, acc.to(dx_ptr.dtype.element_ty), mask=ok)


# ============================================================================ launchers


def _pair(op, name, v, low):
    v = (int(v), int(v)) if isinstance(v, int) else tuple(int(i) for i in v)
    if len(v) != 2 or min(v) < low:
        raise ValueError(f"{op}: {name} must be a pair of ints >= {low}, got {v}")
    return v


def _out_size(size, k, s, p, d, ceil_mode):
    """torch's pooling output length (ceil_mode: the last window starts inside the input or the
    left padding)."""
    span = size + 2 * p - d * (k - 1) - 1
    out = (-(-span // s) if ceil_mode else span // s) + 1
    if ceil_mode and (out - 1) * s >= size + p:
        out -= 1
    return out


def geometry(op, shape, kernel_size, stride, padding, dilation, ceil_mode):
    """(kernel, stride, padding, dilation, (Ho, Wo)) validated for an input of `shape`."""
    if len(shape) != 4:
        raise ValueError(f"{op}: expected input [N, C, H, W], got {tuple(shape)}")
    kernel = _pair(op, "kernel_size", kernel_size, 1)
    stride = _pair(op, "stride", stride, 1)
    padding = _pair(op, "padding", padding, 0)
    dilation = _pair(op, "dilation", dilation, 1)
    out = tuple(_out_size(size, k, s, p, d, ceil_mode) for size, k, s, p, d in
                zip(shape[2:], kernel, stride, padding, dilation))
    if min(out) < 1:
        raise ValueError(f"{op}: kernel {kernel} (dilation {dilation}) does not fit the input "
                         f"{tuple(shape)} padded by {padding}")
    return kernel, stride, padding, dilation, out


def _check_float(op, *arrays):
    for a in arrays:
        if dtype_of(a).name not in _FLOATS:
            raise TypeError(f"{op}: expected a floating point array, got {tuple(a.shape)} "
                            f"{dtype_of(a).name}")


def _flat_launch(total):
    """(grid, BLOCK, INDEX_64, num_warps) for one program per BLOCK flat elements."""
    block = 4096 if INTERPRET else 512
    return (cdiv(total, block),), block, total + block >= 2 ** 31, 4


@planned(arrays=1)
def max_pool2d(x, kernel_size, stride, padding=(0, 0), dilation=(1, 1), ceil_mode=False,
               with_indices=True):
    """(y, indices): y [N, C, Ho, Wo] window maxima; indices int64, the flat index h * W + w in
    each input plane of the first maximum of each window (padding counts as -inf), or None
    when not with_indices."""
    _check_float("max_pool2d", x)
    (kh, kw), (sh, sw), (ph, pw), (dh, dw), (oh, ow) = geometry(
        "max_pool2d", x.shape, kernel_size, stride, padding, dilation, ceil_mode)
    n, c, h, w = x.shape
    y = empty((n, c, oh, ow), x.dtype, x.device)
    # (without indices the kernel stores none: y stands in for the pointer)
    indices = empty((n, c, oh, ow), torch.int64, x.device) if with_indices else None
    if y.numel():
        grid, block, index_64, warps = _flat_launch(y.numel())
        run(_max_pool_fwd_kernel, grid, x, y, y if indices is None else indices, y.numel(), c,
            h, w, oh, ow, *x.stride(), KH=kh, KW=kw, SH=sh, SW=sw, PH=ph, PW=pw, DH=dh, DW=dw,
            ACC_FP64=x.dtype == torch.float64, INDEX_64=index_64,
            STORE_INDEX=indices is not None, BLOCK=block, num_warps=warps)
    return y, indices


@planned(arrays=2)
def max_pool2d_backward(dy, indices, input_shape, kernel_size, stride, padding=(0, 0),
                        dilation=(1, 1), ceil_mode=False, gate=None):
    """dx [N, C, H, W] of max_pool2d with this geometry: each input position gathers dy
    [N, C, Ho, Wo] from the windows that hold it and whose index names it (no atomics: the
    same bits on every run); with `gate` [N, C, Ho, Wo] only the windows where gate > 0."""
    op = "max_pool2d_backward"
    _check_float(op, dy)
    input_shape = tuple(int(s) for s in input_shape)
    (kh, kw), (sh, sw), (ph, pw), (dh, dw), (oh, ow) = geometry(
        op, input_shape, kernel_size, stride, padding, dilation, ceil_mode)
    n, c, h, w = input_shape
    if tuple(dy.shape) != (n, c, oh, ow) or tuple(indices.shape) != tuple(dy.shape):
        raise ValueError(f"{op}: dy {tuple(dy.shape)} and indices {tuple(indices.shape)} do not "
                         f"match the output {(n, c, oh, ow)} of input {input_shape}")
    if indices.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"{op}: indices must be int64, got {indices.dtype}")
    if gate is not None and tuple(gate.shape) != tuple(dy.shape):
        raise ValueError(f"{op}: gate {tuple(gate.shape)} does not match dy {tuple(dy.shape)}")
    dx = empty(input_shape, dy.dtype, dy.device)
    gated = gate is not None
    if dx.numel() and WINDOW_BACKWARD and (kh, kw, dh, dw, ph, pw) == (sh, sw, 1, 1, 0, 0) and \
            (h, w) == (oh * kh, ow * kw):
        block = 1024 if INTERPRET else 128  # windows a program (512 elements of dx at 2x2)
        run(_max_pool_bwd_windows_kernel, (cdiv(dy.numel(), block),), dy, indices,
            gate if gated else dy, dx, dy.numel(), c, oh, ow, *dy.stride(), *indices.stride(),
            *(gate.stride() if gated else (0, 0, 0, 0)), KH=kh, KW=kw,
            KW_P2=triton.next_power_of_2(kw), GATED=gated, ACC_FP64=dy.dtype == torch.float64,
            INDEX_64=dy.numel() + block >= 2 ** 31, BLOCK=block, num_warps=4)
    elif dx.numel():
        grid, block, index_64, warps = _flat_launch(dx.numel())
        run(_max_pool_bwd_kernel, grid, dy, indices, gate if gated else dy, dx, dx.numel(), c,
            h, w, oh, ow, *dy.stride(), *indices.stride(),
            *(gate.stride() if gated else (0, 0, 0, 0)), KH=kh, KW=kw, SH=sh, SW=sw, PH=ph,
            PW=pw, DH=dh, DW=dw, TILED=(kh, kw, dh, dw) == (sh, sw, 1, 1), GATED=gated,
            ACC_FP64=dy.dtype == torch.float64, INDEX_64=index_64, BLOCK=block,
            num_warps=warps)
    return dx


def _avg_args(op, shape, kernel_size, stride, padding, ceil_mode, divisor_override):
    geo = geometry(op, shape, kernel_size, stride, padding, (1, 1), ceil_mode)
    if divisor_override is not None and int(divisor_override) <= 0:
        raise ValueError(f"{op}: divisor_override must be positive, got {divisor_override}")
    return geo, int(divisor_override or 0)


@planned(arrays=1)
def avg_pool2d(x, kernel_size, stride, padding=(0, 0), ceil_mode=False, count_include_pad=True,
               divisor_override=None):
    """Window means [N, C, Ho, Wo] with torch's padding and divisor rules."""
    _check_float("avg_pool2d", x)
    ((kh, kw), (sh, sw), (ph, pw), _, (oh, ow)), divisor = _avg_args(
        "avg_pool2d", x.shape, kernel_size, stride, padding, ceil_mode, divisor_override)
    n, c, h, w = x.shape
    y = empty((n, c, oh, ow), x.dtype, x.device)
    if y.numel():
        grid, block, index_64, warps = _flat_launch(y.numel())
        run(_avg_pool_fwd_kernel, grid, x, y, y.numel(), c, h, w, oh, ow, *x.stride(),
            divisor, KH=kh, KW=kw, SH=sh, SW=sw, PH=ph, PW=pw,
            COUNT_PAD=bool(count_include_pad), ACC_FP64=x.dtype == torch.float64,
            INDEX_64=index_64, BLOCK=block, num_warps=warps)
    return y


@planned(arrays=1)
def avg_pool2d_backward(dy, input_shape, kernel_size, stride, padding=(0, 0), ceil_mode=False,
                        count_include_pad=True, divisor_override=None):
    """dx [N, C, H, W] of avg_pool2d for dy [N, C, Ho, Wo]."""
    _check_float("avg_pool2d_backward", dy)
    input_shape = tuple(int(s) for s in input_shape)
    ((kh, kw), (sh, sw), (ph, pw), _, (oh, ow)), divisor = _avg_args(
        "avg_pool2d_backward", input_shape, kernel_size, stride, padding, ceil_mode,
        divisor_override)
    n, c, h, w = input_shape
    if tuple(dy.shape) != (n, c, oh, ow):
        raise ValueError(f"avg_pool2d_backward: dy {tuple(dy.shape)} does not match the output "
                         f"{(n, c, oh, ow)} of input {input_shape}")
    dx = empty(input_shape, dy.dtype, dy.device)
    if dx.numel():
        grid, block, index_64, warps = _flat_launch(dx.numel())
        run(_avg_pool_bwd_kernel, grid, dy, dx, dx.numel(), c, h, w, oh, ow, *dy.stride(),
            divisor, KH=kh, KW=kw, SH=sh, SW=sw, PH=ph, PW=pw,
            COUNT_PAD=bool(count_include_pad), ACC_FP64=dy.dtype == torch.float64,
            INDEX_64=index_64, BLOCK=block, num_warps=warps)
    return dx
