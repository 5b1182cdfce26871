"""3x3 convolution (stride 1, padding 1) by Winograd's minimal filtering F(4x4, 3x3).

Notation as in the package's __init__.py: x [N, C, H, W], w [Co, C, 3, 3], y [N, Co, H, W].
The output is cut into 4x4 tiles; tile t reads the 6x6 window d of x that starts one pixel
above and left of it (zeros outside x). With Lavin and Gray's matrices B^T (6x6), G (6x3) and
A^T (4x6), points 0, +-1, +-2:

    forward  y_tile = A^T [ sum_c (G g[o, c] G^T) * (B^T d[c] B) ] A          (* elementwise)
    weight   dw[o, c] = G^T [ sum_tiles (A dy_tile[o] A^T) * (B^T d[c] B) ] G

The weight-gradient form is the forward's transpose: the sum over a tile of dy * y is
sum_e (A dy A^T)_e (G g G^T)_e (B^T d B)_e, whose derivative in g is the line above. In the
36-point transform domain the sums over channels (forward) and over tiles (weight gradient)
are 36 independent matrix products, which run as one batched call of tritonad's matmul at
float32 accuracy (3xTF32 on tensor cores):

    forward  M[e] = U[e] [tiles, C] @ V[e]^T [C, Co],  U = input transform, V = weight transform
    weight   M[e] = D[e] [Co, tiles] @ U[e]^T [tiles, C],  D = dy's transform, U as above
    input    the forward of dy with w flipped by 180 degrees and its channels swapped

36 products for 16 outputs (forward, input gradient) or 9 (weight gradient): a quarter of
direct convolution's multiply-adds, for values that pass through transforms with
coefficients up to 8 (relative error ~6e-7 of the result's norm on ResNet-style layers,
against ~1-2e-7 for the direct 3xTF32 kernels: H200, 2026-11-24, notes/PERF.md).

When it applies (`applies`, `weight_grad_applies`, routing.py): the float32-accuracy layers
with many channels (a 3x3 kernel, stride 1, padding 1). TF32 and half precision keep
the direct kernels: the transforms would amplify their inputs' rounding (2^-11 and coarser)
by the same factor, to errors several times those of cuDNN's TF32 and half convolutions.

Non-finite inputs: a NaN or Inf in x reaches every output whose window holds it, as in
direct convolution, and through the transforms also the rest of the 4x4 tiles whose 6x6
windows hold it (Inf as NaN where a transform subtracts it from itself); nothing further.
A NaN in w or dy spreads as in direct convolution: to its output channel or weights.

Layouts: the transforms are written [36, tiles, channels] (channels contiguous) for the
forward, so that both operands of the products are K-major (what 3xTF32 wgmma reads), and
[36, splits, channels, tiles / splits] for the weight gradient, whose reduction over tiles is
cut into `splits` slices batched beside the 36 (the products' split-K), summed in a fixed
order by the output transform (deterministic).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..launch import INTERPRET, cdiv
from ..plans import empty, run
from .settings import dot_precision
from .sums import sum_splits


# ============================================================================ 1-d transforms


@triton.jit
def _bt(d0, d1, d2, d3, d4, d5):
    """B^T d: the input transform of a line of 6 values."""
    return (4.0 * d0 - 5.0 * d2 + d4,
            d3 + d4 - 4.0 * (d1 + d2),
            4.0 * (d1 - d2) - d3 + d4,
            2.0 * (d3 - d1) - d2 + d4,
            2.0 * (d1 - d3) - d2 + d4,
            4.0 * d1 - 5.0 * d3 + d5)


@triton.jit
def _g(g0, g1, g2):
    """G g: the weight transform of a line of 3 taps."""
    return (0.25 * g0,
            (g0 + g1 + g2) * (-1.0 / 6.0),
            (g0 - g1 + g2) * (-1.0 / 6.0),
            g0 * (1.0 / 24.0) + g1 * (1.0 / 12.0) + g2 * (1.0 / 6.0),
            g0 * (1.0 / 24.0) - g1 * (1.0 / 12.0) + g2 * (1.0 / 6.0),
            g2)


@triton.jit
def _at(m0, m1, m2, m3, m4, m5):
    """A^T m: 6 transformed values back to a line of 4 outputs."""
    return (m0 + m1 + m2 + m3 + m4,
            m1 - m2 + 2.0 * (m3 - m4),
            m1 + m2 + 4.0 * (m3 + m4),
            m1 - m2 + 8.0 * (m3 - m4) + m5)


@triton.jit
def _a(v0, v1, v2, v3):
    """A v: a line of 4 output gradients into the transform domain (A^T's transpose)."""
    return (v0,
            v0 + v1 + v2 + v3,
            v0 - v1 + v2 - v3,
            v0 + 2.0 * v1 + 4.0 * v2 + 8.0 * v3,
            v0 - 2.0 * v1 + 4.0 * v2 - 8.0 * v3,
            v3)


@triton.jit
def _gt(m0, m1, m2, m3, m4, m5):
    """G^T m: 6 transformed values back to a line of 3 weight-gradient taps."""
    return (0.25 * m0 - (m1 + m2) * (1.0 / 6.0) + (m3 + m4) * (1.0 / 24.0),
            (m2 - m1) * (1.0 / 6.0) + (m3 - m4) * (1.0 / 12.0),
            (m3 + m4 - m1 - m2) * (1.0 / 6.0) + m5)


# ============================================================================ tile helpers


@triton.jit
def _tile_origin(p, TH, TW):
    """(image, top row, left column) of output tiles p, numbered image by image, row-major."""
    n = p // (TH * TW)
    r = p - n * (TH * TW)
    th = r // TW
    return n, th * 4, (r - th * TW) * 4


@triton.jit
def _tile_block(ptr, TH, TW, P, C, s_n, s_c, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr):
    """This program's tiles p and channels c: (p, c, the tiles' top row and left column,
    the pointers to their images' channel planes, the mask of real tiles and channels)."""
    p = tl.program_id(0) * BLOCK_P + tl.arange(0, BLOCK_P)
    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    n, h0, w0 = _tile_origin(p, TH, TW)
    base = ptr + (n.to(tl.int64) * s_n)[:, None] + (c.to(tl.int64) * s_c)[None, :]
    return p, c, h0, w0, base, (p < P)[:, None] & (c < C)[None, :]


@triton.jit
def _bt_row(base, h, w0, H, W, sh, sw, ok):
    """B^T of row h of the 6-wide windows starting at column w0 (zeros outside the plane)."""
    ok = ok & ((h >= 0) & (h < H))[:, None]
    at = base + (h * sh + w0 * sw)[:, None]
    cols = w0[:, None]
    d0 = tl.load(at, mask=ok & (cols >= 0) & (cols < W), other=0.0)
    d1 = tl.load(at + sw, mask=ok & (cols + 1 < W), other=0.0)  # (cols >= -1)
    d2 = tl.load(at + 2 * sw, mask=ok & (cols + 2 < W), other=0.0)
    d3 = tl.load(at + 3 * sw, mask=ok & (cols + 3 < W), other=0.0)
    d4 = tl.load(at + 4 * sw, mask=ok & (cols + 4 < W), other=0.0)
    d5 = tl.load(at + 5 * sw, mask=ok & (cols + 5 < W), other=0.0)
    return _bt(d0.to(tl.float32), d1.to(tl.float32), d2.to(tl.float32), d3.to(tl.float32),
               d4.to(tl.float32), d5.to(tl.float32))


@triton.jit
def _a_row(base, h, w0, H, W, sh, sw, ok):
    """A of row h of the 4-wide output tiles starting at column w0 (zeros outside the plane)."""
    ok = ok & (h < H)[:, None]
    at = base + (h * sh + w0 * sw)[:, None]
    cols = w0[:, None]
    v0 = tl.load(at, mask=ok & (cols < W), other=0.0)
    v1 = tl.load(at + sw, mask=ok & (cols + 1 < W), other=0.0)
    v2 = tl.load(at + 2 * sw, mask=ok & (cols + 2 < W), other=0.0)
    v3 = tl.load(at + 3 * sw, mask=ok & (cols + 3 < W), other=0.0)
    return _a(v0.to(tl.float32), v1.to(tl.float32), v2.to(tl.float32), v3.to(tl.float32))


@triton.jit
def _store6(at, plane, v0, v1, v2, v3, v4, v5, ok):
    """Six transformed values of a column of the 6x6 domain, one plane apart."""
    tl.store(at, v0, mask=ok)
    tl.store(at + plane, v1, mask=ok)
    tl.store(at + 2 * plane, v2, mask=ok)
    tl.store(at + 3 * plane, v3, mask=ok)
    tl.store(at + 4 * plane, v4, mask=ok)
    tl.store(at + 5 * plane, v5, mask=ok)


@triton.jit
def _transformed_address(out_ptr, p, c, SPLIT_LEN, s_split, s_p, s_c):
    """Where point 0 of tile p, channel c goes: slice p // SPLIT_LEN of the tiles (the weight
    gradient's split-K), position p % SPLIT_LEN in it."""
    part = p // SPLIT_LEN
    return out_ptr + (part.to(tl.int64) * s_split + (p - part * SPLIT_LEN) * s_p)[:, None] + \
        (c * s_c)[None, :]


# ============================================================================ kernels


@triton.jit
def _input_transform_kernel(x_ptr, u_ptr, C, H, W, TH, TW, P, P_ALL, SPLIT_LEN,
                            sxn, sxc, sxh, sxw, s_e, s_split, s_p, s_c,
                            BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr):
    """U[e, p, c] = (B^T d B)[e] for the 6x6 window d of tile p in channel c, for p < P_ALL
    (tiles P and on, the padding of the weight gradient's slices: zeros)."""
    p, c, h0, w0, base, ok = _tile_block(x_ptr, TH, TW, P, C, sxn, sxc, BLOCK_P, BLOCK_C)
    h0 -= 1  # (the window starts one pixel above and left of its tile)
    w0 -= 1
    # B^T along each of the window's 6 rows, then along its 6 columns
    t00, t01, t02, t03, t04, t05 = _bt_row(base, h0, w0, H, W, sxh, sxw, ok)
    t10, t11, t12, t13, t14, t15 = _bt_row(base, h0 + 1, w0, H, W, sxh, sxw, ok)
    t20, t21, t22, t23, t24, t25 = _bt_row(base, h0 + 2, w0, H, W, sxh, sxw, ok)
    t30, t31, t32, t33, t34, t35 = _bt_row(base, h0 + 3, w0, H, W, sxh, sxw, ok)
    t40, t41, t42, t43, t44, t45 = _bt_row(base, h0 + 4, w0, H, W, sxh, sxw, ok)
    t50, t51, t52, t53, t54, t55 = _bt_row(base, h0 + 5, w0, H, W, sxh, sxw, ok)
    at = _transformed_address(u_ptr, p, c, SPLIT_LEN, s_split, s_p, s_c)
    keep = (p < P_ALL)[:, None] & (c < C)[None, :]
    # point (k, m) = 6k + m: column m's six points are 6 planes apart
    u0, u1, u2, u3, u4, u5 = _bt(t00, t10, t20, t30, t40, t50)
    _store6(at, 6 * s_e, u0, u1, u2, u3, u4, u5, keep)
    u0, u1, u2, u3, u4, u5 = _bt(t01, t11, t21, t31, t41, t51)
    _store6(at + s_e, 6 * s_e, u0, u1, u2, u3, u4, u5, keep)
    u0, u1, u2, u3, u4, u5 = _bt(t02, t12, t22, t32, t42, t52)
    _store6(at + 2 * s_e, 6 * s_e, u0, u1, u2, u3, u4, u5, keep)
    u0, u1, u2, u3, u4, u5 = _bt(t03, t13, t23, t33, t43, t53)
    _store6(at + 3 * s_e, 6 * s_e, u0, u1, u2, u3, u4, u5, keep)
    u0, u1, u2, u3, u4, u5 = _bt(t04, t14, t24, t34, t44, t54)
    _store6(at + 4 * s_e, 6 * s_e, u0, u1, u2, u3, u4, u5, keep)
    u0, u1, u2, u3, u4, u5 = _bt(t05, t15, t25, t35, t45, t55)
    _store6(at + 5 * s_e, 6 * s_e, u0, u1, u2, u3, u4, u5, keep)


@triton.jit
def _grad_transform_kernel(dy_ptr, d_ptr, C, H, W, TH, TW, P, P_ALL, SPLIT_LEN,
                           syn, syc, syh, syw, s_e, s_split, s_p, s_c,
                           BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr):
    """D[e, p, c] = (A v A^T)[e] for the 4x4 tile v of dy at tile p in channel c (zeros past
    the plane's edge and for tiles P and on)."""
    p, c, h0, w0, base, ok = _tile_block(dy_ptr, TH, TW, P, C, syn, syc, BLOCK_P, BLOCK_C)
    t00, t01, t02, t03, t04, t05 = _a_row(base, h0, w0, H, W, syh, syw, ok)
    t10, t11, t12, t13, t14, t15 = _a_row(base, h0 + 1, w0, H, W, syh, syw, ok)
    t20, t21, t22, t23, t24, t25 = _a_row(base, h0 + 2, w0, H, W, syh, syw, ok)
    t30, t31, t32, t33, t34, t35 = _a_row(base, h0 + 3, w0, H, W, syh, syw, ok)
    at = _transformed_address(d_ptr, p, c, SPLIT_LEN, s_split, s_p, s_c)
    keep = (p < P_ALL)[:, None] & (c < C)[None, :]
    u0, u1, u2, u3, u4, u5 = _a(t00, t10, t20, t30)
    _store6(at, 6 * s_e, u0, u1, u2, u3, u4, u5, keep)
    u0, u1, u2, u3, u4, u5 = _a(t01, t11, t21, t31)
    _store6(at + s_e, 6 * s_e, u0, u1, u2, u3, u4, u5, keep)
    u0, u1, u2, u3, u4, u5 = _a(t02, t12, t22, t32)
    _store6(at + 2 * s_e, 6 * s_e, u0, u1, u2, u3, u4, u5, keep)
    u0, u1, u2, u3, u4, u5 = _a(t03, t13, t23, t33)
    _store6(at + 3 * s_e, 6 * s_e, u0, u1, u2, u3, u4, u5, keep)
    u0, u1, u2, u3, u4, u5 = _a(t04, t14, t24, t34)
    _store6(at + 4 * s_e, 6 * s_e, u0, u1, u2, u3, u4, u5, keep)
    u0, u1, u2, u3, u4, u5 = _a(t05, t15, t25, t35)
    _store6(at + 5 * s_e, 6 * s_e, u0, u1, u2, u3, u4, u5, keep)


@triton.jit
def _g_row(at, i, sh, sw, ok):
    """G of row i of the 3x3 filters at `at`, loaded as float32."""
    g0 = tl.load(at + i * sh, mask=ok, other=0.0).to(tl.float32)
    g1 = tl.load(at + i * sh + sw, mask=ok, other=0.0).to(tl.float32)
    g2 = tl.load(at + i * sh + 2 * sw, mask=ok, other=0.0).to(tl.float32)
    return _g(g0, g1, g2)


@triton.jit
def _weight_transform_kernel(w_ptr, v_ptr, N, K, s_n, s_k, sh, sw, s_e,
                             BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """V[e, n, k] = (G g G^T)[e] for the filter g at w_ptr + n * s_n + k * s_k (taps sh, sw
    apart: negative strides from the last tap read the filter turned by 180 degrees)."""
    nn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    k = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    ok = (nn < N)[:, None] & (k < K)[None, :]
    at = w_ptr + (nn.to(tl.int64) * s_n)[:, None] + (k.to(tl.int64) * s_k)[None, :]
    t00, t01, t02, t03, t04, t05 = _g_row(at, 0, sh, sw, ok)
    t10, t11, t12, t13, t14, t15 = _g_row(at, 1, sh, sw, ok)
    t20, t21, t22, t23, t24, t25 = _g_row(at, 2, sh, sw, ok)
    out = v_ptr + (nn * K)[:, None] + k[None, :]
    u0, u1, u2, u3, u4, u5 = _g(t00, t10, t20)
    _store6(out, 6 * s_e, u0, u1, u2, u3, u4, u5, ok)
    u0, u1, u2, u3, u4, u5 = _g(t01, t11, t21)
    _store6(out + s_e, 6 * s_e, u0, u1, u2, u3, u4, u5, ok)
    u0, u1, u2, u3, u4, u5 = _g(t02, t12, t22)
    _store6(out + 2 * s_e, 6 * s_e, u0, u1, u2, u3, u4, u5, ok)
    u0, u1, u2, u3, u4, u5 = _g(t03, t13, t23)
    _store6(out + 3 * s_e, 6 * s_e, u0, u1, u2, u3, u4, u5, ok)
    u0, u1, u2, u3, u4, u5 = _g(t04, t14, t24)
    _store6(out + 4 * s_e, 6 * s_e, u0, u1, u2, u3, u4, u5, ok)
    u0, u1, u2, u3, u4, u5 = _g(t05, t15, t25)
    _store6(out + 5 * s_e, 6 * s_e, u0, u1, u2, u3, u4, u5, ok)


@triton.jit
def _at_row(src, a, s_e, ok):
    """A^T along row a of the 6x6 domain: the row's 6 points, 4 values."""
    at = src + 6 * a * s_e
    m0 = tl.load(at, mask=ok, other=0.0)
    m1 = tl.load(at + s_e, mask=ok, other=0.0)
    m2 = tl.load(at + 2 * s_e, mask=ok, other=0.0)
    m3 = tl.load(at + 3 * s_e, mask=ok, other=0.0)
    m4 = tl.load(at + 4 * s_e, mask=ok, other=0.0)
    m5 = tl.load(at + 5 * s_e, mask=ok, other=0.0)
    return _at(m0, m1, m2, m3, m4, m5)


@triton.jit
def _store_output_row(base, row, col, H, W, sh, sw, ok, v0, v1, v2, v3, bias,
                      RELU: tl.constexpr):
    """Row `row` of the 4x4 tiles (+ bias, relu), a row's 4 outputs side by side: one 16-byte
    store a thread where the row is contiguous (4 stores of every 4th pixel took 2-3x as long:
    H200, 2026-11-24, notes/PERF.md)."""
    v = tl.join(tl.join(v0, v2), tl.join(v1, v3)).reshape(v0.shape[0], v0.shape[1], 4) + bias
    if RELU:
        v = tl.where(v < 0, 0.0, v)  # NOTE: NaN stays NaN, as torch.relu
    j = tl.arange(0, 4)[None, None, :]
    ptrs = (base + (row * sh + col * sw)[:, None])[:, :, None] + j * sw
    keep = (ok & (row < H)[:, None])[:, :, None] & ((col[:, None][:, :, None] + j) < W)
    tl.store(ptrs, v.to(base.dtype.element_ty), mask=keep)


@triton.jit
def _output_transform_kernel(m_ptr, y_ptr, b_ptr, N, H, W, TH, TW, P, s_e, s_p,
                             syn, syc, syh, syw, s_b,
                             HAS_BIAS: tl.constexpr, RELU: tl.constexpr,
                             BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr):
    """y[n, c, 4 th + i, 4 tw + j] = bias[c] + (A^T m A)[i, j] for tile p = (n, th, tw), m the
    36 points M[:, p, c] (M [36, P, N], channels contiguous)."""
    p = tl.program_id(0) * BLOCK_P + tl.arange(0, BLOCK_P)
    c = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    ok = (p < P)[:, None] & (c < N)[None, :]
    src = m_ptr + (p.to(tl.int64) * s_p)[:, None] + c[None, :]
    s00, s01, s02, s03 = _at_row(src, 0, s_e, ok)
    s10, s11, s12, s13 = _at_row(src, 1, s_e, ok)
    s20, s21, s22, s23 = _at_row(src, 2, s_e, ok)
    s30, s31, s32, s33 = _at_row(src, 3, s_e, ok)
    s40, s41, s42, s43 = _at_row(src, 4, s_e, ok)
    s50, s51, s52, s53 = _at_row(src, 5, s_e, ok)
    y00, y10, y20, y30 = _at(s00, s10, s20, s30, s40, s50)
    y01, y11, y21, y31 = _at(s01, s11, s21, s31, s41, s51)
    y02, y12, y22, y32 = _at(s02, s12, s22, s32, s42, s52)
    y03, y13, y23, y33 = _at(s03, s13, s23, s33, s43, s53)
    if HAS_BIAS:
        bias = tl.load(b_ptr + c * s_b, mask=c < N, other=0.0).to(tl.float32)[None, :]
    else:
        bias = tl.zeros((1, BLOCK_N), tl.float32)
    bias = bias[:, :, None]
    n, h0, w0 = _tile_origin(p, TH, TW)
    base = y_ptr + (n.to(tl.int64) * syn)[:, None] + (c.to(tl.int64) * syc)[None, :]
    _store_output_row(base, h0, w0, H, W, syh, syw, ok, y00, y01, y02, y03, bias, RELU)
    _store_output_row(base, h0 + 1, w0, H, W, syh, syw, ok, y10, y11, y12, y13, bias, RELU)
    _store_output_row(base, h0 + 2, w0, H, W, syh, syw, ok, y20, y21, y22, y23, bias, RELU)
    _store_output_row(base, h0 + 3, w0, H, W, syh, syw, ok, y30, y31, y32, y33, bias, RELU)


@triton.jit
def _split_sum(at, S, s_split, ok):
    """The sum of S partial values s_split apart, in order."""
    acc = tl.load(at, mask=ok, other=0.0)
    for s in range(1, S):
        acc += tl.load(at + s * s_split, mask=ok, other=0.0)
    return acc


@triton.jit
def _gt_row(src, a, s_e, S, s_split, ok):
    """G^T along row a of the 6x6 domain, each point summed over the S slices first."""
    at = src + 6 * a * s_e
    return _gt(_split_sum(at, S, s_split, ok), _split_sum(at + s_e, S, s_split, ok),
               _split_sum(at + 2 * s_e, S, s_split, ok), _split_sum(at + 3 * s_e, S, s_split, ok),
               _split_sum(at + 4 * s_e, S, s_split, ok), _split_sum(at + 5 * s_e, S, s_split, ok))


@triton.jit
def _store_taps(at, sw, v0, v1, v2, ok):
    tl.store(at, v0.to(at.dtype.element_ty), mask=ok)
    tl.store(at + sw, v1.to(at.dtype.element_ty), mask=ok)
    tl.store(at + 2 * sw, v2.to(at.dtype.element_ty), mask=ok)


@triton.jit
def _weight_output_kernel(m_ptr, dw_ptr, CO, C, S, s_e, s_split,
                          s_o, s_c, sh, sw, BLOCK_O: tl.constexpr, BLOCK_C: tl.constexpr):
    """dw[o, c] = G^T m G, m the 36 points sum_s M[:, s, o, c] (M [36, S, CO, C])."""
    o = tl.program_id(0) * BLOCK_O + tl.arange(0, BLOCK_O)
    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    ok = (o < CO)[:, None] & (c < C)[None, :]
    src = m_ptr + (o * C)[:, None] + c[None, :]
    q00, q01, q02 = _gt_row(src, 0, s_e, S, s_split, ok)
    q10, q11, q12 = _gt_row(src, 1, s_e, S, s_split, ok)
    q20, q21, q22 = _gt_row(src, 2, s_e, S, s_split, ok)
    q30, q31, q32 = _gt_row(src, 3, s_e, S, s_split, ok)
    q40, q41, q42 = _gt_row(src, 4, s_e, S, s_split, ok)
    q50, q51, q52 = _gt_row(src, 5, s_e, S, s_split, ok)
    out = dw_ptr + (o.to(tl.int64) * s_o)[:, None] + (c.to(tl.int64) * s_c)[None, :]
    w00, w10, w20 = _gt(q00, q10, q20, q30, q40, q50)
    w01, w11, w21 = _gt(q01, q11, q21, q31, q41, q51)
    w02, w12, w22 = _gt(q02, q12, q22, q32, q42, q52)
    _store_taps(out, sw, w00, w01, w02, ok)
    _store_taps(out + sh, sw, w10, w11, w12, ok)
    _store_taps(out + 2 * sh, sw, w20, w21, w22, ok)


# ============================================================================ launchers

# tiles x channels a program, 4 warps: forward layout (and the output transform), weight
# gradient layout (H200, Triton 3.6, 2026-11-24, at 28x28 / 14x14 with 128 / 256 channels:
# input transform 117 / 75 us at 16x32 against 157 / 98 at 32x32; blocks of 2048 spill)
BLOCK = (16, 32) if not INTERPRET else (128, 64)
BLOCK_WGRAD = (32, 16) if not INTERPRET else (128, 64)


def applies(g, k_ch, n_ch, dtype, precision, s):
    """Whether convolution g (one group of k_ch input and n_ch output channels) runs here: a
    3x3 kernel, stride 1, padding 1, no dilation, float32 accuracy on tensor cores (3xTF32, not
    IEEE FMA), s.winograd_min_channels channels on both sides, and one image's transformed
    operands within s.winograd_max_bytes."""
    return s.winograd and dot_precision(dtype, precision) == "tf32x3" and \
        (g.kh, g.kw, g.sh, g.sw, g.ph, g.pw, g.dh, g.dw) == (3, 3, 1, 1, 1, 1, 1, 1) and \
        min(k_ch, n_ch) >= s.winograd_min_channels and \
        workspace_bytes(1, g.h, g.w, k_ch, n_ch) <= s.winograd_max_bytes


def weight_grad_applies(g, dy, x, precision, s, sms):
    """Whether the weight gradient of one group of convolution g runs here: where `applies`,
    with at least s.winograd_wgrad_min_tiles 4x4 tiles, and (s.winograd_wgrad_fill) where
    its products fill the `sms` SMs (weight_grad_fills)."""
    c, co = x.shape[1], dy.shape[1]
    tiles = g.n * cdiv(g.h, 4) * cdiv(g.w, 4)
    return applies(g, c, co, x.dtype, precision, s) and tiles >= s.winograd_wgrad_min_tiles \
        and (weight_grad_fills(tiles, c, co, sms, s) or not s.winograd_wgrad_fill)


def chunks(g, k_ch, n_ch, s):
    """The batch's slices (start, stop) for calls whose transformed operands take at most
    s.winograd_max_bytes (one slice, the whole batch, at the ResNet-style layers' 256)."""
    step = max(1, s.winograd_max_bytes // workspace_bytes(1, g.h, g.w, k_ch, n_ch))
    return [(i, min(i + step, g.n)) for i in range(0, g.n, step)]


def workspace_bytes(n, h, w, k_ch, n_ch):
    """Bytes of the two transformed operands of convolution x [n, k_ch, h, w] -> n_ch."""
    return 4 * 36 * n * cdiv(h, 4) * cdiv(w, 4) * (k_ch + n_ch)


def _transform_input(x, out_layout):
    """U of x [N, C, H, W] (any strides): out_layout (tiles, splits) -> [36, splits, C,
    tiles / splits] (splits > 0, the weight gradient's) or [36, tiles, C] (splits 0)."""
    n, c, h, w = x.shape
    th, tw = cdiv(h, 4), cdiv(w, 4)
    tiles, (p_all, splits) = n * th * tw, out_layout
    if splits:
        split_len = p_all // splits
        u = empty((36, splits, c, split_len), torch.float32, x.device)
        strides = (u.stride(0), u.stride(1), 1, u.stride(2))
    else:
        split_len = p_all
        u = empty((36, p_all, c), torch.float32, x.device)
        strides = (u.stride(0), 0, c, 1)
    bp, bc = BLOCK_WGRAD if splits else BLOCK
    run(_input_transform_kernel, (cdiv(p_all, bp), cdiv(c, bc)), x, u, c, h, w, th, tw, tiles,
        p_all, split_len, *x.stride(), *strides, BLOCK_P=bp, BLOCK_C=bc, num_warps=4)
    return u


def _transform_weight(w, transposed):
    """V [36, n, k] of w [Co, C, 3, 3]: (n, k) = (Co, C) for the forward; (C, Co) with each
    filter turned by 180 degrees for the input gradient."""
    co, c = w.shape[:2]
    n, k = (c, co) if transposed else (co, c)
    v = empty((36, n, k), torch.float32, w.device)
    s_n, s_k = (w.stride(1), w.stride(0)) if transposed else (w.stride(0), w.stride(1))
    sh, sw = w.stride(2), w.stride(3)
    # turned: tap (i, j) of the new filter is (2 - i, 2 - j) of the old: start at the last tap
    origin = w[:, :, 2, 2] if transposed else w
    if transposed:
        sh, sw = -sh, -sw
    bn, bk = 16, 16  # (32x32 blocks would give 16 programs at 128 channels)
    run(_weight_transform_kernel, (cdiv(n, bn), cdiv(k, bk)), origin, v, n, k, s_n, s_k, sh,
        sw, v.stride(0), BLOCK_N=bn, BLOCK_K=bk, num_warps=4)
    return v


def conv3x3(src, w, bias, out, transposed, relu=False, chunks=None):
    """out = conv2d(src, w, bias, padding=1), then relu (the forward: src x [N, C, H, W], out
    y), or the input gradient (transposed: src dy [N, Co, H, W], out dx [N, C, H, W], which
    is dy convolved with w's filters turned and its channels swapped). Any strides. chunks:
    slices (start, stop) of the batch to run one after another (default: all at once); the
    weights are transformed once for all of them."""
    from ..matmul import matmul

    n_ch = out.shape[1]
    v = _transform_weight(w, transposed)
    for i, j in chunks or [(0, src.shape[0])]:
        n, k_ch, h, wd = src[i:j].shape
        th, tw = cdiv(h, 4), cdiv(wd, 4)
        tiles = n * th * tw
        u = _transform_input(src[i:j], (tiles, 0))
        m = matmul(u, v.transpose(1, 2), precision="highest")   # [36, tiles, n_ch]
        del u
        bp, bn = BLOCK
        run(_output_transform_kernel, (cdiv(tiles, bp), cdiv(n_ch, bn)),
            m, out[i:j], bias if bias is not None else m, n_ch, h, wd, th, tw, tiles,
            m.stride(0), m.stride(1), *out.stride(), bias.stride(0) if bias is not None else 0,
            HAS_BIAS=bias is not None, RELU=relu, BLOCK_P=bp, BLOCK_N=bn, num_warps=4)
    return out


def weight_grad_slices(tiles, c, co, sms, s):
    """How many slices of the tiles the weight gradient's products take (see weight_grad)."""
    per_slice = 36 * cdiv(co, 128) * cdiv(c, 128)
    return max(1, min(16, cdiv(s.winograd_split_programs * sms, per_slice),
                      tiles // s.winograd_min_slice_tiles))


def weight_grad_fills(tiles, c, co, sms, s):
    """Whether the weight gradient's products give every SM a 128x128 tile. With fewer (small
    batches at 128 channels: 36 products of one tile, in 1-3 slices) the direct kernels were
    as fast or faster on an H200: 164 against 188 us at 16x128x28x28, 242 against 416 at 32;
    from 64 images (6 slices) they tie, at 256 Winograd takes 598 us against 1302."""
    return 36 * cdiv(co, 128) * cdiv(c, 128) * weight_grad_slices(tiles, c, co, sms, s) >= sms


def weight_grad(dy, x, dw, db, sms, s):
    """dw [Co, C, 3, 3] (any strides) and db [Co] (contiguous, or None) of the 3x3, stride-1,
    padding-1 convolution of x [N, C, H, W] that gave dy [N, Co, H, W]. The 36 products
    [Co, tiles] @ [tiles, C] are split along the tiles into enough slices for `sms` SMs to
    have s.winograd_split_programs 128x128 tiles each (at most 16 slices, each at least
    s.winograd_min_slice_tiles tiles). db is the sum of dy's transform at point (1, 1), row 1
    of A being all ones: each tile's sum, so 1/36 of dy's bytes to read (6-11 us at 28x28,
    14x14 and 7x7 on an H200, where plane sums of dy took 63-100 us)."""
    from ..matmul import matmul
    from ..reduce import sum as sum_dims

    n, c, h, wd = x.shape
    co = dy.shape[1]
    tiles = n * cdiv(h, 4) * cdiv(wd, 4)
    splits = weight_grad_slices(tiles, c, co, sms, s)
    p_all = cdiv(tiles, splits * 4) * splits * 4   # slices of a multiple of 4 tiles (16 bytes)
    u = _transform_input(x, (p_all, splits))       # [36, S, C, L]
    d = empty((36, splits, co, p_all // splits), torch.float32, x.device)
    bp, bc = BLOCK_WGRAD
    run(_grad_transform_kernel, (cdiv(p_all, bp), cdiv(co, bc)), dy, d, co, h, wd,
        cdiv(h, 4), cdiv(wd, 4), tiles, p_all, p_all // splits, *dy.stride(), d.stride(0),
        d.stride(1), 1, d.stride(2), BLOCK_P=bp, BLOCK_C=bc, num_warps=4)
    m = matmul(d.view(36 * splits, co, -1), u.view(36 * splits, c, -1).transpose(1, 2),
               precision="highest")                # [36 * S, Co, C]
    if db is not None:
        sum_dims(d[7], (0, 2), out=db)             # point 7 = (1, 1): [S, Co, L]
    del u, d
    bo, bc = 32, 32
    run(_weight_output_kernel, (cdiv(co, bo), cdiv(c, bc)), m, dw, co, c, splits,
        splits * m.stride(0), m.stride(0), *dw.stride(), BLOCK_O=bo, BLOCK_C=bc, num_warps=4)
    return dw


def weight_grad_in_chunks(dy, x, dw, db, g, sms, s):
    """dw [Co, C, 3, 3] and db [Co] (or None) of one group (weight_grad), over the batch's
    chunks (chunks): one dw (and db) a chunk of images, then their sums in a fixed order."""
    co, c = dy.shape[1], x.shape[1]
    parts = chunks(g, c, co, s)
    if len(parts) == 1:
        weight_grad(dy, x, dw, db, sms, s)
        return
    part = empty((len(parts), co, c * 9), torch.float32, x.device)
    part_db = empty((len(parts), 1, co), torch.float32, x.device)
    for k, (i, j) in enumerate(parts):
        weight_grad(dy[i:j], x[i:j], part[k].view(co, c, 3, 3),
                    None if db is None else part_db[k, 0], sms, s)
    sum_splits(part, dw.view(co, c * 9))
    if db is not None:
        sum_splits(part_db, db.view(1, co))
