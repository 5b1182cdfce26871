"""2-d convolution (NCHW, cross-correlation as torch): im2col / col2im and implicit GEMM.

Notation: x [N, C, H, W], w [Co, C, kh, kw], y [N, Co, Ho, Wo]; stride s, padding pad, dilation d
per axis. Every direction is one matrix product over a gathered ("im2col") operand:

    forward  y[n, o, p, q]  = b[o] + sum_{c,i,j} w[o, c, i, j] * x[n, c, p*s - pad + i*d, ...]
             Y[o, (n,p,q)]  = W[o, (c,i,j)] @ X_col[(c,i,j), (n,p,q)]
    input    dx[n, c, h, v] = sum_{o,i,j} w[o, c, i, j] * dy[n, o, (h + pad - i*d) / s, ...]
             (only where the division is exact and lands inside dy: the transposed convolution
             written as a gather, so every dx element is owned by one program and nothing races)
    weight   dW[o, (c,i,j)] = sum_{(n,p,q)} dY[o, (n,p,q)] * X_col[(c,i,j), (n,p,q)]
    bias     db[o]          = sum_{(n,p,q)} dY[o, (n,p,q)]

Two ways to run them, both kept and tested:
- "im2col": materialise X_col with the im2col kernel and call our matmul (the bias rides along
  as one more row of ones in X_col and one more column of W, so the matmul adds it, and the
  same trick yields db beside dW); the input gradient is matmul(W^T, dY) followed by col2im.
  Simple, but the column buffer is kh*kw times the input. Groups run on the implicit path.
- "implicit": the implicit-GEMM kernels below build each X_col tile on the fly inside the K loop
  (no column buffer). The forward and the input gradient share one kernel (TRANSPOSED flag); the
  weight gradient splits its long K = N*Ho*Wo over programs and sums the partial tiles in a fixed
  order afterwards (deterministic, no atomics); the bias gradient's partials over the same
  splits come from a channel-sum kernel beside it and are summed in the same pass.
CONV_ALGO picks one ("auto" chooses per direction by the rules in `_algorithm`). On Hopper,
stride-1 layers on the implicit path run the window GEMM instead (_window_gemm_kernel, see the
comment above it): every tap's operand tile is one TMA rectangle of a padded channels-last
copy of the source.

GEMM orientation (what makes the implicit kernels fast on Hopper):
- forward / input gradient: acc[pixels, out channels] = X_col^T[pixels, K] @ W^T[K, channels].
  Pixels are M (thousands: enough programs), the gathered tile is the A operand and the weights
  the B operand. The weights are first copied K-major ([Co, kh, kw, C] for the forward,
  [C, kh, kw, Co] for dx; PACK_WEIGHTS), so B loads are 16-byte vectors and tf32 / half dots
  lower to wgmma. CHANNELS_LAST also copies the gathered source to NHWC so that A loads are
  vectors too (a copy pass of the activations; measured by benchmarks/sweep_conv.py).
- weight gradient: acc[Co, K columns] = dY[Co, pixels] @ X_col[pixels, K]: both operands are
  K-major (pixel-contiguous) in NCHW as they stand. Stride-1 "same" convolutions (the
  ResNet-style 3x3 layers, MNIST's conv1 and conv2) take the flat-shift kernel instead, where
  a tap is one constant shift of the flattened plane: dy's tiles come through TMA on Hopper
  and x's are single shifted rectangles (_shift_wgrad_kernel, FLAT_SHIFT); with few channels
  a tile's columns span taps (conv1: all 25 in one tile); float32 on small planes reads x as
  one zero-padded plane per kernel column, so that its tiles are TMA rectangles too
  (_shifted_planes, SHIFT_PLANES).
- float32 accuracy, 3x3, stride 1, padding 1, 128 channels and up (the ResNet-style layers):
  Winograd's F(4x4, 3x3) for all three directions (kernels/winograd.py, _winograd), a quarter
  of the multiply-adds, run as 36 batched 3xTF32 products between transform kernels.
- index arithmetic: the per-pixel (n, p, q) decomposition runs once per program, outside the K
  loop; inside it a tap adds scalar offsets. The weight gradient walks its pixels in blocks of
  whole output rows of one image, so a pixel's (p, q) is a shift and a mask (BLOCK_Q, a power
  of two >= the row width), never a division per element.
Gathered tiles with C_src >= 16 walk K as (i, j) outer, channel blocks inner ("channel-inner":
the spatial offset and bounds test are per pixel, not per element); with few channels (the
MNIST input, C = 1) K is the flat (c, i, j) index so that a K = 25 problem is one 32-wide tile,
not 25 mostly-empty ones.

NOTE: products accumulate in float32 (tl.dot); float32 inputs multiply in TF32 or, for float32
accuracy (conv_precision() "highest"), as 3xTF32, float16 / bfloat16 on their tensor cores;
results are rounded once.
On the im2col path the weight gradient's per-image products come out of the matmul in the
input dtype before their float32 sum over the batch (one more rounding for half types).
"""
from __future__ import annotations

import functools
import hashlib
import os

import torch
import triton
import triton.language as tl

from ..backend import autotuning, check_weight_grad_outputs, conv_precision
from .launch import INTERPRET, cdiv, dtype_of, next_power_of_2
from .plans import empty, planned, run
from .pool import _nchw
from .tuning import Tuner
from . import winograd

PRIMITIVES = ("conv2d", "conv2d_backward", "im2col", "col2im")

CONV_ALGO = "auto"       # "auto" | "im2col" | "implicit"
DW_SPLIT = None          # split-K count of the implicit weight gradient; None: sized to the GPU
CHANNEL_INNER_MIN = 16   # source channels from which gathered tiles walk K channel-inner
PACK_WEIGHTS = True      # channel-inner implicit GEMM: weights copied K-major first (vector loads)
CHANNELS_LAST = False    # channel-inner implicit GEMM: gathered source copied to NHWC first
DW_PRESPLIT = True       # 3xTF32 weight gradient: operands split into TF32 head + tail first
FLAT_SHIFT = True        # stride-1 "same" convolutions: the flat-shift weight gradient
SHIFT_TMA = True         # flat-shift weight gradient: dy through TMA (Hopper)
SHIFT_TAPS_BELOW = 16    # ... a tile's columns span several taps below this many channels
SHIFT_MIN_CHANNELS = 1   # ... from this many input channels
SHIFT_PLANES = True      # ... float32: x read as one shifted plane per kernel column, via TMA
SHIFT_PLANES_MAX_PIXELS = 256     # ... for planes of at most this many pixels
SHIFT_PLANES_MIN_CHANNELS = 128   # ... and this many channels (any at float32 accuracy)
SHIFT_PLANES_MAX_BYTES = 1 << 30  # ... taking at most this much memory
BATCH_INNER = True       # float32 stride-1 "same" weight gradients: batch-inner copies (Hopper)
BATCH_INNER_MIN_CHANNELS = 16     # ... from this many input channels (fewer: tiles spanning taps)
BATCH_INNER_MAX_PIXELS = 1024     # ... for planes of at most this many pixels
BATCH_INNER_MAX_BYTES = 1 << 30   # ... the copies taking at most this much memory
WINDOW_GEMM = True       # stride-1 forward / input gradient: the padded channels-last TMA kernel
WINDOW_WASTE = 3.0       # ... where the padded plane is at most this many times the output's
WINDOW_TAIL_TILE = 128 * 256  # ... tiles this large (one an SM) split a short last wave
WINDOW_WGRAD = True      # half-precision weight gradient of those layers: the window form too
WINDOW_DB_BYTES = 2 << 20  # ... its launch sums the bias gradient too: a program this much dy,
WINDOW_DB_MIN = 16         # ... in at least this many programs and at most one for two SMs
WINDOW_DB_PROGRAMS = None  # ... or this many programs (None: by the two above)
WINDOW_X3_MIN = 64       # window GEMM at float32 accuracy from this many reduced channels
#                          (below, the implicit GEMM was as fast or faster: H100 sweep; H200,
#                          256x64x56x56: forward 1024 -> 986 us, input gradient 1069 -> 975)
WINDOW_PRESPLIT = True   # ... its weights split into TF32 head + tail beforehand, the source
#                          in the kernel (else tl.dot's own split of both, in the kernel)
CHANNEL_SUM_TILE = 4096   # the bias gradient's partial sums: elements a program loads a step
CHANNEL_SUM_RUN = 512     # ... channels a program while their planes' run is this short
CHANNEL_SUM_PROGRAMS = 16  # ... programs an SM
CHANNEL_SUM_LOADS = 2     # ... and loads a program
WINOGRAD = True          # 3x3, stride 1, padding 1 at float32 accuracy: Winograd F(4x4, 3x3)
WINOGRAD_MIN_CHANNELS = 128       # ... from this many input and output channels (session 20)
WINOGRAD_MAX_BYTES = 1 << 30      # ... its two transformed operands taking at most this much
#                                   (larger batches run in chunks of images that fit)
WINOGRAD_WGRAD_MIN_TILES = 16     # ... weight gradient: from this many 4x4 tiles (H200, 512
#                                   channels at 7x7: 4 tiles 143 us against the direct 71, 16
#                                   tiles 89 against 109)
WINOGRAD_WGRAD_FILL = True        # ... and where its products fill the SMs (weight_grad_fills)
_ALGOS = ("auto", "im2col", "implicit")
# conv_precision() "highest" runs as 3xTF32 on tensor cores; TRITONAD_CONV_IEEE=1: IEEE FMA
CONV_IEEE = os.environ.get("TRITONAD_CONV_IEEE", "0") not in ("", "0")


# ============================================================================ kernels


@triton.jit
def _source_coord(base, shift, DIV, SIZE, TRANSPOSED: tl.constexpr):
    """Coordinate in the source of tap `shift` for a pixel whose window starts at `base`, and
    whether it exists: forward t = base + shift inside [0, SIZE); transposed (t / DIV) exact and
    inside. NOTE: t is clamped at 0 before dividing so no negative number is ever divided; with
    DIV = 1 (specialised to a constant) the division folds away."""
    t = base + shift
    if TRANSPOSED:
        coord = tl.maximum(t, 0) // DIV
        ok = (t >= 0) & (coord * DIV == t) & (coord < SIZE)
    else:
        coord = t
        ok = (t >= 0) & (t < SIZE)
    return coord, ok


# Spatial sizes that differ from layer to layer are not specialised (every specialisation is
# one more compilation of every autotuning config). Channel counts and strides are: a unit
# stride, strides and channel bounds divisible by 16 (packed weights, channels-last) are what
# lets the compiler prove 16-byte vector loads.
@triton.jit
def _split_share(units):
    """[lo, hi): split program_id(1)'s even share of `units` in order (of num_programs(1)
    splits; the last ones may be empty): the split-K weight gradients' K ranges."""
    return _even_share(units, tl.program_id(1), tl.num_programs(1))


@triton.jit
def _even_share(units, part, parts):
    """[lo, hi): part `part`'s even share of `units` in order, of `parts` (the last ones may
    be empty)."""
    share = tl.cdiv(units, parts)
    lo = part * share
    return lo, tl.minimum(lo + share, units)


_GEMM_SIZES = ["N_IMG", "SRC_H", "SRC_W", "OUT_H", "OUT_W"]
_WGRAD_SIZES = ["N_IMG", "H", "W", "OUT_H", "OUT_W"]


@triton.jit(do_not_specialize=_GEMM_SIZES)
def _conv_gemm_kernel(
        src_ptr, w_ptr, bias_ptr, out_ptr,
        N_IMG, K_CH, N_CH, SRC_H, SRC_W, OUT_H, OUT_W, KH, KW,
        stride_sn, stride_sc, stride_sh, stride_sw,
        stride_wk, stride_wn, stride_wi, stride_wj,
        stride_on, stride_oc, stride_oh, stride_ow, stride_bias,
        MUL_H, MUL_W, OFF_H, OFF_W, DIL_H, DIL_W, DIV_H, DIV_W,
        HAS_BIAS: tl.constexpr, RELU: tl.constexpr, TRANSPOSED: tl.constexpr,
        CHANNEL_INNER: tl.constexpr,
        INPUT_PRECISION: tl.constexpr, DOT_FP32: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    # out[n, c, p, q] = bias[c] + sum_{k,i,j} src[n, k, y(p, i), x(q, j)] * wk[k, c, i, j] with
    # y = (p*MUL + OFF + i*DIL) / DIV (forward: x gathered, wk = w^T; transposed: dy gathered for
    # dx, wk = w). One program: a [BLOCK_M output pixels (n, p, q) flat, BLOCK_N channels] tile.
    # Pixels are the GEMM's M: the gathered tile is the A operand, the weights the B operand
    # [K, N] (K-major in memory when packed), which lets Hopper use wgmma for tf32/half types.
    # RELU: out = max(out, 0) on the accumulator (the forward of conv + relu).
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < N_CH
    plane = OUT_H * OUT_W
    pix_ok = offs_m < N_IMG * plane
    # the per-pixel decomposition: once per program, outside the K loop
    img = offs_m // plane
    rem = offs_m - img * plane
    p = rem // OUT_W
    q = rem - p * OUT_W
    base_y = p * MUL_H + OFF_H
    base_x = q * MUL_W + OFF_W
    src_pix = src_ptr + img.to(tl.int64) * stride_sn
    w_cols = w_ptr + offs_n * stride_wn
    taps = KH * KW
    if CHANNEL_INNER:
        ch_blocks = tl.cdiv(K_CH, BLOCK_K)
        n_iter = taps * ch_blocks
    else:
        n_iter = tl.cdiv(K_CH * taps, BLOCK_K)

    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for it in range(0, n_iter):
        if CHANNEL_INNER:
            # one tap (i, j) and a block of channels: coordinates and bounds are per pixel
            tap = it // ch_blocks
            i = tap // KW
            j = tap - i * KW
            ch = (it - tap * ch_blocks) * BLOCK_K + tl.arange(0, BLOCK_K)
            ch_ok = ch < K_CH
            y, y_ok = _source_coord(base_y, i * DIL_H, DIV_H, SRC_H, TRANSPOSED)
            x, x_ok = _source_coord(base_x, j * DIL_W, DIV_W, SRC_W, TRANSPOSED)
            a_ptrs = (src_pix + y * stride_sh + x * stride_sw)[:, None] + \
                (ch * stride_sc)[None, :]
            a_mask = (pix_ok & y_ok & x_ok)[:, None] & ch_ok[None, :]
            b_ptrs = w_cols[None, :] + (ch * stride_wk + i * stride_wi + j * stride_wj)[:, None]
        else:
            # flat k = (channel, i, j): every element has its own tap
            k = it * BLOCK_K + tl.arange(0, BLOCK_K)
            ch_ok = k < K_CH * taps
            ch = k // taps
            tap = k - ch * taps
            i = tap // KW
            j = tap - i * KW
            y, y_ok = _source_coord(base_y[:, None], (i * DIL_H)[None, :], DIV_H, SRC_H, TRANSPOSED)
            x, x_ok = _source_coord(base_x[:, None], (j * DIL_W)[None, :], DIV_W, SRC_W, TRANSPOSED)
            a_ptrs = src_pix[:, None] + (ch * stride_sc)[None, :] + y * stride_sh + x * stride_sw
            a_mask = pix_ok[:, None] & ch_ok[None, :] & y_ok & x_ok
            b_ptrs = w_cols[None, :] + (ch * stride_wk + i * stride_wi + j * stride_wj)[:, None]
        a = tl.load(a_ptrs, mask=a_mask, other=0.0)
        b = tl.load(b_ptrs, mask=ch_ok[:, None] & n_ok[None, :], other=0.0)
        if DOT_FP32:  # NOTE: the interpreter's bfloat16 dot is wrong; products are exact in fp32
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        acc = tl.dot(a, b, acc=acc, input_precision=INPUT_PRECISION)

    if HAS_BIAS:
        bias = tl.load(bias_ptr + offs_n * stride_bias, mask=n_ok, other=0.0)
        acc += bias.to(tl.float32)[None, :]
    if RELU:
        acc = tl.where(acc < 0, 0.0, acc)  # NOTE: NaN stays NaN, as torch.relu
    out_ptrs = out_ptr + (img.to(tl.int64) * stride_on + p * stride_oh + q * stride_ow)[:, None] \
        + (offs_n * stride_oc)[None, :]
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=pix_ok[:, None] & n_ok[None, :])


@triton.jit(do_not_specialize=_WGRAD_SIZES)
def _conv_wgrad_kernel(
        dy_ptr, x_ptr, dw_ptr,
        N_IMG, C_OUT, C_IN, H, W, OUT_H, OUT_W, KH, KW,
        stride_dn, stride_dc, stride_dh, stride_dv,
        stride_xn, stride_xc, stride_xh, stride_xw,
        stride_ws, stride_wo, stride_wc, stride_wi, stride_wj, lo_dy, lo_x,
        SH, SW, PH, PW, DH, DW,
        CHANNEL_INNER: tl.constexpr, PRESPLIT: tl.constexpr,
        INPUT_PRECISION: tl.constexpr, DOT_FP32: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
        BLOCK_Q: tl.constexpr):
    # dw[s, o, c, i, j] = sum over the pixels (n, p, q) of split s of dy[n, o, p, q] * x[n, c, y, x]
    # with y = p*SH - PH + i*DH (db: _channel_sum_kernel, apart). One program: a [BLOCK_M out
    # channels, BLOCK_N (c, i, j) columns] tile
    # of split s. The pixels (the GEMM's K) come in blocks of BLOCK_K // BLOCK_Q whole output
    # rows x BLOCK_Q columns of one image, so a pixel's (p, q) is a shift and a mask of its
    # place in the block: no division per element. Split s takes an even share of the blocks.
    # PRESPLIT (3xTF32 from memory): dy and x are the TF32 heads of pre-split operands whose
    # tails lie lo_dy / lo_x elements further on (_split_tf32_kernel): dw = dy_lo @ x +
    # dy @ x_lo + dy @ x as three plain TF32 products whose tiles all stream straight from
    # memory into shared memory (tl.dot's "tf32x3" splits them in registers instead and writes
    # the parts back to shared memory: 4x a TF32 product's time, not 3x).
    pid = tl.program_id(0)
    split = tl.program_id(1)
    taps = KH * KW
    if CHANNEL_INNER:
        ch_blocks = tl.cdiv(C_IN, BLOCK_N)
        tiles_n = taps * ch_blocks
    else:
        tiles_n = tl.cdiv(C_IN * taps, BLOCK_N)
    pid_m = pid // tiles_n
    pid_n = pid - pid_m * tiles_n
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    m_ok = offs_m < C_OUT
    if CHANNEL_INNER:  # columns: one tap (i, j), a block of channels
        tap = pid_n // ch_blocks
        i = tap // KW
        j = tap - i * KW
        ch = (pid_n - tap * ch_blocks) * BLOCK_N + tl.arange(0, BLOCK_N)
        col_ok = ch < C_IN
    else:  # columns: flat (c, i, j)
        k = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        col_ok = k < C_IN * taps
        ch = k // taps
        tap = k - ch * taps
        i = tap // KW
        j = tap - i * KW
    dw_cols = ch * stride_wc + i * stride_wi + j * stride_wj
    shift_h = i * DH - PH
    shift_w = j * DW - PW
    dy_rows = dy_ptr + offs_m * stride_dc
    x_cols = x_ptr + ch * stride_xc

    ROWS: tl.constexpr = BLOCK_K // BLOCK_Q
    row_blocks = tl.cdiv(OUT_H, ROWS)
    col_blocks = tl.cdiv(OUT_W, BLOCK_Q)
    per_image = row_blocks * col_blocks
    u_lo, u_hi = _split_share(N_IMG * per_image)
    dp = tl.arange(0, BLOCK_K) // BLOCK_Q   # a power of two: shifts and masks
    dq = tl.arange(0, BLOCK_K) % BLOCK_Q
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for u in range(u_lo, u_hi):
        n = u // per_image
        r = u - n * per_image
        rb = r // col_blocks
        p = rb * ROWS + dp
        q = (r - rb * col_blocks) * BLOCK_Q + dq
        p_ok = (p < OUT_H) & (q < OUT_W)
        a_ptrs = dy_rows[:, None] + (n.to(tl.int64) * stride_dn + p * stride_dh +
                                     q * stride_dv)[None, :]
        a = tl.load(a_ptrs, mask=m_ok[:, None] & p_ok[None, :], other=0.0)
        # the x_col tile [pixels, columns]: pixels are K
        x_img = n.to(tl.int64) * stride_xn
        if CHANNEL_INNER:
            y = p * SH + shift_h
            x = q * SW + shift_w
            pix_ok = p_ok & (y >= 0) & (y < H) & (x >= 0) & (x < W)
            b_ptrs = (x_img + y * stride_xh + x * stride_xw)[:, None] + x_cols[None, :]
            b_mask = pix_ok[:, None] & col_ok[None, :]
        else:
            y = (p * SH)[:, None] + shift_h[None, :]
            x = (q * SW)[:, None] + shift_w[None, :]
            b_ptrs = x_cols[None, :] + x_img + y * stride_xh + x * stride_xw
            b_mask = p_ok[:, None] & col_ok[None, :] & (y >= 0) & (y < H) & (x >= 0) & (x < W)
        b = tl.load(b_ptrs, mask=b_mask, other=0.0)
        if PRESPLIT:
            a_lo = tl.load(a_ptrs + lo_dy, mask=m_ok[:, None] & p_ok[None, :], other=0.0)
            b_lo = tl.load(b_ptrs + lo_x, mask=b_mask, other=0.0)
            # NOTE: a step's three products start from zero and join acc by a float32 add:
            # chained onto acc, the tensor cores' accumulation (which truncates at every
            # instruction, relative to |acc|) cost ~1e-5 at conv2 and 5e-4 at 256x128x28x28
            step = tl.dot(a, b, input_precision="tf32")
            step = tl.dot(a_lo, b, acc=step, input_precision="tf32")
            step = tl.dot(a, b_lo, acc=step, input_precision="tf32")
            acc += step
        else:
            if DOT_FP32:
                a = a.to(tl.float32)
                b = b.to(tl.float32)
            acc = tl.dot(a, b, acc=acc, input_precision=INPUT_PRECISION)

    dw_ptrs = dw_ptr + split.to(tl.int64) * stride_ws + offs_m[:, None] * stride_wo + \
        dw_cols[None, :]
    tl.store(dw_ptrs, acc.to(dw_ptr.dtype.element_ty), mask=m_ok[:, None] & col_ok[None, :])


# The flat-shift weight gradient: stride-1, undilated, "same"-size convolutions (output plane =
# input plane: the ResNet-style 3x3 / pad 1 layers, MNIST's 5x5 / pad 2) over contiguous NCHW
# arrays. There a tap (i, j) moves every pixel by one constant along the flattened plane,
#     x[n, c, p + i - PH, q + j - PW] = x_flat[n, c, pix + (i - PH) * W + (j - PW)],
# exact wherever the column q + j - PW stays inside [0, W) (the "wrap" test: outside it the
# flat index lands on the neighbouring row, and the term must be zero), and zero wherever the
# flat index leaves [0, H*W) (the rows above and below: padding). So dy's tile is a plain
# rectangle of the [N*Co, H*W] matrix, which TMA loads straight into shared memory (USE_TMA,
# Hopper), and x's the rectangle at a shifted column, one masked load with a single bound and
# the wrap test per pixel. (TMA cannot load x's: on an H100 with Triton 3.6 a start column
# that is not a 16-byte multiple is an illegal instruction.) Measured against the
# implicit-GEMM kernel above, the forward and input gradient written this way were slower
# (notes/PERF.md), so only the weight gradient takes it.


@triton.jit
def _flat_tile(ptr, row, col, keep, ROWS, COLS, BR: tl.constexpr, BC: tl.constexpr):
    """The [BR, BC] rectangle at (row, col) of a contiguous [ROWS, COLS] matrix where keep[BC]
    (the wrap test of its columns, or True) holds, zero elsewhere (what a TMA load of it
    returns, with keep True): one masked load, so that the tile goes straight to shared memory
    (no pass in registers after)."""
    r = row + tl.arange(0, BR)
    c = col + tl.arange(0, BC)
    ok = (r < ROWS)[:, None] & ((c >= 0) & (c < COLS) & keep)[None, :]
    return tl.load(ptr + r.to(tl.int64)[:, None] * COLS + c[None, :], mask=ok, other=0.0)


_SHIFT_SIZES = ["N_IMG", "H", "W"]


@triton.jit
def _shifted_taps_tile(ptr, row0, pix0, shift, dq, C_IN, HW, W, col_ok,
                       BR: tl.constexpr, BC: tl.constexpr):
    """The [BR, BC] tile of x [N*C, HW] whose row r is channel row0 + r's row of the (image,
    channel) matrix at pixels pix0 + shift[r] + k (shift and dq, the tap's column offset, per
    row: rows of several taps), zero where that pixel leaves the plane, wraps into the next row
    (q + dq outside [0, W)) or where pix0 + k is past the plane (dy's zeros there)."""
    pix = pix0 + tl.arange(0, BC)
    q = pix % W
    src = pix[None, :] + shift[:, None]
    qs = q[None, :] + dq[:, None]
    ok = col_ok[:, None] & (pix < HW)[None, :] & (src >= 0) & (src < HW) & (qs >= 0) & (qs < W)
    return tl.load(ptr + row0.to(tl.int64)[:, None] * HW + src, mask=ok, other=0.0)


_SHIFT_SIZES = ["N_IMG", "H", "W"]


@triton.jit(do_not_specialize=_SHIFT_SIZES)
def _shift_wgrad_kernel(
        dy_ptr, x_ptr, dw_ptr,
        N_IMG, C_OUT, C_IN, H, W, KH, KW, PH, PW, WP, HP,
        stride_ws, stride_wo, stride_wc, stride_wi, stride_wj, lo_dy, lo_x,
        PRESPLIT: tl.constexpr, USE_TMA: tl.constexpr,
        ONE_TAP: tl.constexpr, X_TMA: tl.constexpr, INPUT_PRECISION: tl.constexpr,
        DOT_FP32: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    # dw[s, o, c, i, j] = sum over the pixels of split s of dy[n, o, pix] * x[n, c, pix + (i -
    # PH)*W + j - PW] (wrap-tested in x's load mask). dy [N, Co, H*W] and x [N, C, H*W] contiguous.
    # One program: a [BLOCK_M out channels, BLOCK_N columns] tile of split s, the columns a block
    # of the flat (tap, channel) axis of length KH*KW*C, the pixels (the GEMM's K) in steps of
    # BLOCK_K within one image; split s takes an even share of the (image, step) units. Both
    # operands are K-major. ONE_TAP: a tile's columns are channels of one tap, so x's tile is one
    # shifted rectangle with a per-pixel mask; else (few channels: MNIST's conv1 has one) a tile
    # spans several taps, each row shifted by its own tap with a per-element mask, and one dy tile
    # serves them all. Rows of a one-tap tile past the channel count read the next image's
    # channels: they only reach columns never stored.
    # X_TMA (one-tap tiles, with USE_TMA): x comes as KW planes shifted by each kernel column
    # (_shifted_planes: [KW, N*C, HP, WP], zero where the shift leaves a row, PH zero rows above,
    # pitch WP), and dy on the same pitch ([N*Co, H*WP]), so that tap (i, j) of the pixels
    # p = h*WP + q is row (j*N + n)*C + c at p + i*WP: one TMA rectangle at a 16-byte aligned
    # column, no mask (the zeros are in memory). Without X_TMA, WP = W.
    # PRESPLIT: dy and x are TF32 heads with tails lo_dy / lo_x elements on (_split_tf32), three
    # TF32 products per step as _conv_wgrad_kernel.
    pid = tl.program_id(0)
    split = tl.program_id(1)
    COLS = KH * KW * C_IN
    if ONE_TAP:
        ch_blocks = tl.cdiv(C_IN, BLOCK_N)
        tiles_n = KH * KW * ch_blocks
    else:
        tiles_n = tl.cdiv(COLS, BLOCK_N)
    pid_m = pid // tiles_n
    pid_n = pid - pid_m * tiles_n
    o0 = pid_m * BLOCK_M
    if ONE_TAP:
        tap = pid_n // ch_blocks
        i = tap // KW
        j = tap - i * KW
        c0 = (pid_n - tap * ch_blocks) * BLOCK_N
        ch = c0 + tl.arange(0, BLOCK_N)
        col_ok = ch < C_IN
        shift = (i - PH) * W + (j - PW)
        dw_ = j - PW
    else:
        col = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        col_ok = col < COLS
        tap = col // C_IN
        ch = col - tap * C_IN
        i = tap // KW
        j = tap - i * KW
        shifts = (i - PH) * W + (j - PW)
        dqs = j - PW
    HW = H * WP  # dy's plane
    if USE_TMA:
        dy_desc = tl.make_tensor_descriptor(dy_ptr, shape=[N_IMG * C_OUT, HW], strides=[HW, 1],
                                            block_shape=[BLOCK_M, BLOCK_K])
        if PRESPLIT:
            dy_lo_desc = tl.make_tensor_descriptor(dy_ptr + lo_dy, shape=[N_IMG * C_OUT, HW],
                                                   strides=[HW, 1],
                                                   block_shape=[BLOCK_M, BLOCK_K])
    if X_TMA:
        x_desc = tl.make_tensor_descriptor(x_ptr, shape=[KW * N_IMG * C_IN, HP * WP],
                                           strides=[HP * WP, 1], block_shape=[BLOCK_N, BLOCK_K])
        if PRESPLIT:
            x_lo_desc = tl.make_tensor_descriptor(x_ptr + lo_x, shape=[KW * N_IMG * C_IN, HP * WP],
                                                  strides=[HP * WP, 1],
                                                  block_shape=[BLOCK_N, BLOCK_K])
    blocks = tl.cdiv(HW, BLOCK_K)
    u_lo, u_hi = _split_share(N_IMG * blocks)
    offs_k = tl.arange(0, BLOCK_K)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for u in range(u_lo, u_hi):
        n = u // blocks
        pix0 = (u - n * blocks) * BLOCK_K
        row_a = n * C_OUT + o0
        if USE_TMA:
            a = dy_desc.load([row_a, pix0])
        else:
            a = _flat_tile(dy_ptr, row_a, pix0, True, N_IMG * C_OUT, HW, BLOCK_M, BLOCK_K)
        if X_TMA:
            b = x_desc.load([(j * N_IMG + n) * C_IN + c0, pix0 + i * WP])
        elif ONE_TAP:
            q = (pix0 + offs_k) % W
            keep = (q + dw_ >= 0) & (q + dw_ < W) & (pix0 + offs_k < HW)
            b = _flat_tile(x_ptr, n * C_IN + c0, pix0 + shift, keep, N_IMG * C_IN, HW,
                           BLOCK_N, BLOCK_K)
        else:
            b = _shifted_taps_tile(x_ptr, n * C_IN + ch, pix0, shifts, dqs, C_IN, HW, W, col_ok,
                                   BLOCK_N, BLOCK_K)
        if PRESPLIT:
            if USE_TMA:
                a_lo = dy_lo_desc.load([row_a, pix0])
            else:
                a_lo = _flat_tile(dy_ptr + lo_dy, row_a, pix0, True, N_IMG * C_OUT, HW,
                                  BLOCK_M, BLOCK_K)
            if X_TMA:
                b_lo = x_lo_desc.load([(j * N_IMG + n) * C_IN + c0, pix0 + i * WP])
            elif ONE_TAP:
                b_lo = _flat_tile(x_ptr + lo_x, n * C_IN + c0, pix0 + shift, keep, N_IMG * C_IN,
                                  HW, BLOCK_N, BLOCK_K)
            else:
                b_lo = _shifted_taps_tile(x_ptr + lo_x, n * C_IN + ch, pix0, shifts, dqs, C_IN,
                                          HW, W, col_ok, BLOCK_N, BLOCK_K)
            # NOTE: as _conv_wgrad_kernel, a step's products start from zero and join acc by a
            # float32 add (chained onto acc, the tensor cores' accumulation loses accuracy)
            step = tl.dot(a, b.T, input_precision="tf32")
            step = tl.dot(a_lo, b.T, acc=step, input_precision="tf32")
            step = tl.dot(a, b_lo.T, acc=step, input_precision="tf32")
            acc += step
        else:
            if DOT_FP32:
                a = a.to(tl.float32)
                b = b.to(tl.float32)
            acc = tl.dot(a, b.T, acc=acc, input_precision=INPUT_PRECISION)

    offs_m = o0 + tl.arange(0, BLOCK_M)
    m_ok = offs_m < C_OUT
    dw_ptrs = dw_ptr + split.to(tl.int64) * stride_ws + offs_m[:, None] * stride_wo + \
        (ch * stride_wc + i * stride_wi + j * stride_wj)[None, :]
    tl.store(dw_ptrs, acc.to(dw_ptr.dtype.element_ty), mask=m_ok[:, None] & col_ok[None, :])


# The batch-inner weight gradient (float32, Hopper): stride-1, undilated, "same"-size layers
# whose batch is a multiple of 4 (after padding). x and dy are first copied with the batch
# innermost (_batch_inner_kernel): x_t [C, HP, WP, NB] zero-padded by the window's reach
# (HP = H + KH - 1, WP = W + KW - 1, x shifted by the padding) and dy_t [Co, H, WP, NB], zero
# at w >= W and n >= N. Counting the GEMM's K as k = (h*WP + w)*NB + n, tap (i, j) reads
# x_t's flat k + (i*WP + j)*NB: one constant shift, a multiple of NB floats, so that every x
# tile is a TMA rectangle at a 16-byte aligned column, no mask and no kw copies of x (the
# flat shift's planes); both operands K-major, as TF32 wgmma needs. The dy_t columns
# w >= W are zero, so what x_t holds there (the next row's start) adds nothing.

@triton.jit
def _batch_inner_kernel(src_ptr, out_ptr, sums_ptr, N_IMG, C, H, W, HP, WP, NB, TOP, LEFT, lo,
                        stride_sn, stride_sc, stride_sh, stride_sw,
                        SPLIT: tl.constexpr, SUMS: tl.constexpr,
                        BLOCK_P: tl.constexpr, BLOCK_B: tl.constexpr):
    # out[c, r, q, n] = src[n, c, r - TOP, q - LEFT] where that is inside src and n < N_IMG,
    # zero elsewhere: src [N, C, H, W] (any strides) to contiguous [C, HP, WP, NB]. SPLIT: TF32
    # heads, tails lo elements further on (_store_split). SUMS: the tile's float32 sum too, at
    # sums[block, c] (contiguous [position blocks * image blocks, C]: a weight gradient's dy,
    # the bias gradient's partials). One program: BLOCK_P positions (r, q) of one channel by
    # BLOCK_B images; Triton turns the tile in shared memory between the load (along q) and
    # the store (along n), both coalesced.
    c = tl.program_id(0)
    pos = tl.program_id(1) * BLOCK_P + tl.arange(0, BLOCK_P)
    n = tl.program_id(2) * BLOCK_B + tl.arange(0, BLOCK_B)
    r = pos // WP
    h = r - TOP
    w = pos - r * WP - LEFT
    inside = ((pos < HP * WP) & (h >= 0) & (h < H) & (w >= 0) & (w < W))[:, None] & \
        (n < N_IMG)[None, :]
    v = tl.load(src_ptr + c.to(tl.int64) * stride_sc + (h * stride_sh + w * stride_sw)[:, None]
                + n.to(tl.int64)[None, :] * stride_sn, mask=inside, other=0.0)
    dst = out_ptr + c.to(tl.int64) * HP * WP * NB + pos[:, None] * NB + n[None, :]
    _store_split(dst, v, lo, (pos < HP * WP)[:, None] & (n < NB)[None, :], SPLIT)
    if SUMS:
        block = tl.program_id(1) * tl.num_programs(2) + tl.program_id(2)
        tl.store(sums_ptr + block * C + c, tl.sum(tl.sum(v.to(tl.float32), axis=1), axis=0))


@triton.jit
def _batch_inner_wgrad_kernel(
        dy_ptr, x_ptr, dw_ptr, C_OUT, C_IN, K, XK, WP, NB, KH, KW,
        stride_ws, stride_wo, stride_wc, stride_wi, stride_wj, lo_x,
        PRESPLIT: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    # dw[s, o, c, i, j] = sum over split s's K steps of dy_t[o, k] * x_t[c, k + (i*WP + j)*NB]
    # (see above: dy_t [Co, K = H*WP*NB], x_t [C, XK = HP*WP*NB]). One program: a [BLOCK_M out
    # channels, BLOCK_N channels] tile of one tap; split s takes an even share of the K steps.
    # PRESPLIT (3xTF32): x's copy holds TF32 heads with tails lo_x elements on; dy's tiles are
    # split here (wgmma's A operand, from registers), so that dy's copy, which every tap's
    # programs read, is half the bytes (MNIST conv2, H200: dw + db 88.5 -> 71.4 us, both
    # copies split before); three TF32 products a step, the small ones first (_window_tile).
    pid = tl.program_id(0)
    split = tl.program_id(1)
    ch_blocks = tl.cdiv(C_IN, BLOCK_N)
    tiles_n = KH * KW * ch_blocks
    pid_m = pid // tiles_n
    pid_n = pid - pid_m * tiles_n
    tap = pid_n // ch_blocks
    i = tap // KW
    j = tap - i * KW
    o0 = pid_m * BLOCK_M
    c0 = (pid_n - tap * ch_blocks) * BLOCK_N
    shift = (i * WP + j) * NB
    dy_desc = tl.make_tensor_descriptor(dy_ptr, shape=[C_OUT, K], strides=[K, 1],
                                        block_shape=[BLOCK_M, BLOCK_K])
    x_desc = tl.make_tensor_descriptor(x_ptr, shape=[C_IN, XK], strides=[XK, 1],
                                       block_shape=[BLOCK_N, BLOCK_K])
    if PRESPLIT:
        x_lo_desc = tl.make_tensor_descriptor(x_ptr + lo_x, shape=[C_IN, XK], strides=[XK, 1],
                                              block_shape=[BLOCK_N, BLOCK_K])
    lo, hi = _split_share(tl.cdiv(K, BLOCK_K))
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for step in range(lo, hi):
        k0 = step * BLOCK_K
        a = dy_desc.load([o0, k0])
        b = x_desc.load([c0, k0 + shift])
        if PRESPLIT:
            b_lo = x_lo_desc.load([c0, k0 + shift])
            a_hi = _tf32_head(a)
            a_lo = a - a_hi
            part = tl.dot(a_lo, b.T, input_precision="tf32")
            part = tl.dot(a_hi, b_lo.T, acc=part, input_precision="tf32")
            part = tl.dot(a_hi, b.T, acc=part, input_precision="tf32")
            acc += part
        else:
            acc = tl.dot(a, b.T, acc=acc, input_precision="tf32")

    offs_m = o0 + tl.arange(0, BLOCK_M)
    ch = c0 + tl.arange(0, BLOCK_N)
    dw_ptrs = dw_ptr + split.to(tl.int64) * stride_ws + offs_m[:, None] * stride_wo + \
        (ch * stride_wc + i * stride_wi + j * stride_wj)[None, :]
    tl.store(dw_ptrs, acc.to(dw_ptr.dtype.element_ty),
             mask=(offs_m < C_OUT)[:, None] & (ch < C_IN)[None, :])


# The window GEMM: forward and input gradient of stride-1 convolutions on Hopper, fed by TMA.
# The gathered operand is first copied once into a zero-padded channels-last buffer
# src_pad [N, HP, WP, KP] (_padded_channels_last), whose plane is the output's plus the
# window's reach. Output pixels are then counted on the padded grid, p = (n*HP + oh)*WP + ow,
# and tap (i, j) reads the row p + i*DH*WP + j*DW of the flat [N*HP*WP, KP] matrix: for a tile
# of consecutive p, one rectangle, which TMA loads straight into shared memory, K-major (a
# pixel's channels are contiguous), as wgmma wants it for every input type, TF32 included. No
# bounds test and no gather: the padding is in memory, and a valid pixel's window never leaves
# its own image. The price is the grid's pixels outside the output (ow >= OUT_W or oh >= OUT_H),
# computed and dropped: HP*WP / (OUT_H*OUT_W), 1.07 at 56x56 k3, 1.31 at 14x14 k3, 1.65 at
# MNIST conv2 (14x14 k5), and the copy pass. The input gradient at stride 1 is the same
# computation on dy padded by the window's reach minus the padding, with the weights' taps
# flipped and their channel axes swapped.

_WINDOW_SIZES = ["ROWS", "HP", "WP", "OUT_H", "OUT_W"]


@triton.jit
def _window_tile(
        a_desc, b_desc, b_lo_desc, bias_ptr, out_ptr, p0, n0,
        ROWS, KP, WK, N_CH, HP, WP, OUT_H, OUT_W, KH, KW, DH, DW,
        stride_on, stride_oc, stride_oh, stride_ow, stride_bias,
        HAS_BIAS: tl.constexpr, RELU: tl.constexpr, PRESPLIT: tl.constexpr,
        INPUT_PRECISION: tl.constexpr, DOT_FP32: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    # out[n, c, oh, ow] = bias[c] + sum_{i, j, k} src_pad[n, oh + i*DH, ow + j*DW, k] *
    # w_pack[c, i*KW + j, k]; src_pad flat [ROWS = N*HP*WP, KP] (a_desc's rows of BLOCK_K
    # channels), w_pack flat [N_CH, KH*KW*WK] (b_desc's; WK: a multiple of 64, so that a K step
    # never crosses taps; channels past the real count are zero in both). Here: the
    # [BLOCK_M grid pixels, BLOCK_N channels] tile at (p0, n0).
    # PRESPLIT (3xTF32): w_pack holds the weights' TF32 heads, whose tails b_lo_desc reads; the
    # source's tile is split here (wgmma's A operand, from registers): the weights' tiles then
    # go to the tensor cores from shared memory as TMA left them, where tl.dot's own split
    # rewrites them there every step (H200, 256x64x56x56 input gradient: 958 -> 791 us). A
    # step's three TF32 products start from zero, the small ones first (as tl.dot's "tf32x3";
    # the large one first: 2.7x its error), and join acc by a float32 add (chained onto acc,
    # the tensor cores' accumulation loses accuracy).
    ch_blocks = tl.cdiv(KP, BLOCK_K)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for it in range(0, KH * KW * ch_blocks):
        tap = it // ch_blocks
        k0 = (it - tap * ch_blocks) * BLOCK_K
        i = tap // KW
        row = p0 + i * DH * WP + (tap - i * KW) * DW
        col = tap * WK + k0
        a = a_desc.load([row, k0])
        b = b_desc.load([n0, col])
        if PRESPLIT:
            b_lo = b_lo_desc.load([n0, col])
            a_hi = _tf32_head(a)
            a_lo = a - a_hi
            step = tl.dot(a_lo, b.T, input_precision="tf32")
            step = tl.dot(a_hi, b_lo.T, acc=step, input_precision="tf32")
            step = tl.dot(a_hi, b.T, acc=step, input_precision="tf32")
            acc += step
        else:
            if DOT_FP32:  # NOTE: the interpreter's bfloat16 dot is wrong
                a = a.to(tl.float32)
                b = b.to(tl.float32)
            acc = tl.dot(a, b.T, acc=acc, input_precision=INPUT_PRECISION)

    offs_n = n0 + tl.arange(0, BLOCK_N)
    n_ok = offs_n < N_CH
    if HAS_BIAS:
        bias = tl.load(bias_ptr + offs_n * stride_bias, mask=n_ok, other=0.0)
        acc += bias.to(tl.float32)[None, :]
    if RELU:
        acc = tl.where(acc < 0, 0.0, acc)  # NOTE: NaN stays NaN, as torch.relu
    # the grid pixel's (n, oh, ow): once per tile, in the epilogue; pixels off the output drop
    offs_m = p0 + tl.arange(0, BLOCK_M)
    plane = HP * WP
    img = offs_m // plane
    rem = offs_m - img * plane
    oh = rem // WP
    ow = rem - oh * WP
    ok = (offs_m < ROWS) & (oh < OUT_H) & (ow < OUT_W)
    out_ptrs = out_ptr + (img.to(tl.int64) * stride_on + oh * stride_oh + ow * stride_ow)[:, None] \
        + (offs_n * stride_oc)[None, :]
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=ok[:, None] & n_ok[None, :])


@triton.jit
def _window_full_tiles(tiles, SMS):
    """The tiles that _window_gemm_kernel runs whole: all of them, or, where the last wave
    would fill at most half the SMS, the full waves (the rest run as half tiles)."""
    rest = tiles % SMS
    return tl.where((rest > 0) & (2 * rest <= SMS), tiles - rest, tiles)


def _window_programs(rows, n_ch, sms, plan):
    """_window_gemm_kernel's grid for `plan` (as _window_full_tiles: one program a tile, two
    a tile of a split tail; PERSIST: at most PERSIST programs an SM, each taking tiles in
    turn)."""
    tiles = cdiv(rows, plan["BLOCK_M"]) * cdiv(n_ch, plan["BLOCK_N"])
    rest = tiles % sms if plan["BLOCK_M"] * plan["BLOCK_N"] >= WINDOW_TAIL_TILE else 0
    units = tiles + rest if 0 < 2 * rest <= sms else tiles
    persist = plan.get("PERSIST", 0)
    return (min(units, persist * sms) if persist else units,)


@triton.jit(do_not_specialize=_WINDOW_SIZES)
def _window_gemm_kernel(
        src_ptr, w_ptr, bias_ptr, out_ptr,
        ROWS, KP, WK, N_CH, HP, WP, OUT_H, OUT_W, KH, KW, DH, DW,
        stride_on, stride_oc, stride_oh, stride_ow, stride_bias, lo_w, SMS,
        HAS_BIAS: tl.constexpr, RELU: tl.constexpr, PRESPLIT: tl.constexpr,
        INPUT_PRECISION: tl.constexpr, DOT_FP32: tl.constexpr, TAIL_TILE: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
        PERSIST: tl.constexpr = 0):
    # The window GEMM (_window_tile), [BLOCK_M, BLOCK_N] tiles, pixel blocks fastest. Tiles of
    # TAIL_TILE elements and up (WINDOW_TAIL_TILE: one fills an SM): where the last wave of
    # tiles would fill at most half of the SMS, its tiles run as two half-wide tiles each, on
    # twice the SMs: half a wave's time instead of a whole one (256x256x14x14 k3: 450 tiles of
    # 128x256 on 132 SMs, 3.4 waves; _window_programs). One program a tile (half tile), or
    # PERSIST: a grid of at most PERSIST programs an SM, program p taking tiles p, p + grid, ...
    # and then the half tiles the same way; a program's next tile's loads then start while
    # its last one's epilogue runs, and no program waits for a slot on an SM (H200, 14x14
    # TF32 forward: 218 -> 196 us).
    taps_k = KH * KW * WK
    a_desc = tl.make_tensor_descriptor(src_ptr, shape=[ROWS, KP], strides=[KP, 1],
                                       block_shape=[BLOCK_M, BLOCK_K])
    b_desc = tl.make_tensor_descriptor(w_ptr, shape=[N_CH, taps_k], strides=[taps_k, 1],
                                       block_shape=[BLOCK_N, BLOCK_K])
    b_lo_desc = b_desc
    if PRESPLIT:  # the weights' tails, lo_w elements on
        b_lo_desc = tl.make_tensor_descriptor(w_ptr + lo_w, shape=[N_CH, taps_k],
                                              strides=[taps_k, 1],
                                              block_shape=[BLOCK_N, BLOCK_K])
    m_blocks = tl.cdiv(ROWS, BLOCK_M)
    tiles = m_blocks * tl.cdiv(N_CH, BLOCK_N)
    full = tiles
    if BLOCK_M * BLOCK_N >= TAIL_TILE:
        full = _window_full_tiles(tiles, SMS)
    if PERSIST:
        for unit in range(tl.program_id(0), full + 2 * (tiles - full), tl.num_programs(0)):
            _window_unit(unit, full, m_blocks, a_desc, b_desc, b_lo_desc, w_ptr,
                         lo_w, bias_ptr, out_ptr, ROWS, KP, WK, N_CH, HP, WP, OUT_H, OUT_W,
                         KH, KW, DH, DW, stride_on, stride_oc, stride_oh, stride_ow,
                         stride_bias, HAS_BIAS, RELU, PRESPLIT, INPUT_PRECISION, DOT_FP32,
                         BLOCK_M * BLOCK_N >= TAIL_TILE, BLOCK_M, BLOCK_N, BLOCK_K)
    else:
        _window_unit(tl.program_id(0), full, m_blocks, a_desc, b_desc, b_lo_desc,
                     w_ptr, lo_w, bias_ptr, out_ptr, ROWS, KP, WK, N_CH, HP, WP, OUT_H, OUT_W,
                     KH, KW, DH, DW, stride_on, stride_oc, stride_oh, stride_ow, stride_bias,
                     HAS_BIAS, RELU, PRESPLIT, INPUT_PRECISION, DOT_FP32,
                     BLOCK_M * BLOCK_N >= TAIL_TILE, BLOCK_M, BLOCK_N, BLOCK_K)


@triton.jit
def _window_unit(
        unit, full, m_blocks, a_desc, b_desc, b_lo_desc, w_ptr, lo_w,
        bias_ptr, out_ptr, ROWS, KP, WK, N_CH, HP, WP, OUT_H, OUT_W, KH, KW, DH, DW,
        stride_on, stride_oc, stride_oh, stride_ow, stride_bias,
        HAS_BIAS: tl.constexpr, RELU: tl.constexpr, PRESPLIT: tl.constexpr,
        INPUT_PRECISION: tl.constexpr, DOT_FP32: tl.constexpr, SPLIT_TAIL: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """Work unit `unit` of _window_gemm_kernel: tile `unit` while below `full`, else (SPLIT_TAIL)
    half h = unit - full of tile full + h // 2, whose weights' half-wide boxes (from w_ptr,
    and the tails lo_w on) only these units make."""
    if unit < full:
        pid_n = unit // m_blocks
        _window_tile(a_desc, b_desc, b_lo_desc, bias_ptr, out_ptr,
                     (unit - pid_n * m_blocks) * BLOCK_M, pid_n * BLOCK_N,
                     ROWS, KP, WK, N_CH, HP, WP, OUT_H, OUT_W, KH, KW, DH, DW,
                     stride_on, stride_oc, stride_oh, stride_ow, stride_bias,
                     HAS_BIAS, RELU, PRESPLIT, INPUT_PRECISION, DOT_FP32,
                     BLOCK_M, BLOCK_N, BLOCK_K)
    elif SPLIT_TAIL:
        taps_k = KH * KW * WK
        h_desc = tl.make_tensor_descriptor(w_ptr, shape=[N_CH, taps_k], strides=[taps_k, 1],
                                           block_shape=[BLOCK_N // 2, BLOCK_K])
        h_lo_desc = h_desc
        if PRESPLIT:
            h_lo_desc = tl.make_tensor_descriptor(w_ptr + lo_w, shape=[N_CH, taps_k],
                                                  strides=[taps_k, 1],
                                                  block_shape=[BLOCK_N // 2, BLOCK_K])
        tile = full + (unit - full) // 2
        pid_n = tile // m_blocks
        _window_tile(a_desc, h_desc, h_lo_desc, bias_ptr, out_ptr,
                     (tile - pid_n * m_blocks) * BLOCK_M,
                     pid_n * BLOCK_N + (unit - full) % 2 * (BLOCK_N // 2),
                     ROWS, KP, WK, N_CH, HP, WP, OUT_H, OUT_W, KH, KW, DH, DW,
                     stride_on, stride_oc, stride_oh, stride_ow, stride_bias,
                     HAS_BIAS, RELU, PRESPLIT, INPUT_PRECISION, DOT_FP32,
                     BLOCK_M, BLOCK_N // 2, BLOCK_K)


@triton.jit(do_not_specialize=["ROWS", "WP", "DY_SHIFT", "DB_PROGRAMS"])
def _window_wgrad_kernel(
        dy_ptr, x_ptr, dw_ptr, db_ptr,
        ROWS, COP, CP, C_OUT, C_IN, WP, KH, KW, DH, DW, DY_SHIFT, DB_PROGRAMS,
        stride_ws, stride_wo, stride_wc, stride_wi, stride_wj, stride_ds, stride_dc,
        DOT_FP32: tl.constexpr, DB_ROWS: tl.constexpr, DB_COLS: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    # The window GEMM's weight gradient (half types): dw[s, o, c, i, j] = sum over the grid
    # pixels p of split s of dy_grid[p, o] * x_pad[p + i*DH*WP + j*DW, c]. x_pad [ROWS, CP] is
    # the forward's padded channels-last buffer; dy_grid [ROWS, COP] holds dy at the output
    # pixels of the same grid and zeros elsewhere, so pixels off the output add nothing. Both
    # tiles are TMA rectangles, channel-contiguous: [BLOCK_K pixels, channels], read by wgmma
    # as M-major A (dy transposed) and N-major B, which it takes for 16-bit types only.
    # dy_grid's pixel p is row p + DY_SHIFT of dy_ptr (the input gradient's copy of dy, the
    # same plane with dy at another corner: _implicit_wgrad), rows past ROWS zeros.
    # One program: a [BLOCK_M out channels, BLOCK_N channels] tile of one tap, the pixels (the
    # GEMM's K) in steps of BLOCK_K; split s takes an even share of the steps. The grid's first
    # DB_PROGRAMS programs sum the bias gradient's partials instead (_window_db_part), on SMs
    # the GEMM's one wave leaves free; then programs tile by tile, split by split.
    pid = tl.program_id(0)
    if pid < DB_PROGRAMS:
        _window_db_part(dy_ptr, db_ptr, pid, DB_PROGRAMS, ROWS, COP, C_OUT, DY_SHIFT,
                        stride_ds, stride_dc, DB_ROWS, DB_COLS)
    else:
        co_blocks = tl.cdiv(C_OUT, BLOCK_M)
        c_blocks = tl.cdiv(C_IN, BLOCK_N)
        tiles = co_blocks * c_blocks * KH * KW
        pid -= DB_PROGRAMS
        split = pid // tiles
        tile = pid - split * tiles
        tap = tile // (co_blocks * c_blocks)
        r = tile - tap * co_blocks * c_blocks
        pid_m = r // c_blocks
        pid_n = r - pid_m * c_blocks
        i = tap // KW
        j = tap - i * KW
        o0 = pid_m * BLOCK_M
        c0 = pid_n * BLOCK_N
        shift = i * DH * WP + j * DW
        dy_desc = tl.make_tensor_descriptor(dy_ptr, shape=[ROWS, COP], strides=[COP, 1],
                                            block_shape=[BLOCK_K, BLOCK_M])
        x_desc = tl.make_tensor_descriptor(x_ptr, shape=[ROWS, CP], strides=[CP, 1],
                                           block_shape=[BLOCK_K, BLOCK_N])
        lo, hi = _even_share(tl.cdiv(ROWS, BLOCK_K), split,
                             (tl.num_programs(0) - DB_PROGRAMS) // tiles)
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for step in range(lo, hi):
            p0 = step * BLOCK_K
            a = dy_desc.load([p0 + DY_SHIFT, o0])
            b = x_desc.load([p0 + shift, c0])
            if DOT_FP32:  # NOTE: the interpreter's bfloat16 dot is wrong
                a = a.to(tl.float32)
                b = b.to(tl.float32)
            acc = tl.dot(a.T, b, acc=acc)

        offs_m = o0 + tl.arange(0, BLOCK_M)
        ch = c0 + tl.arange(0, BLOCK_N)
        m_ok = offs_m < C_OUT
        dw_ptrs = dw_ptr + split.to(tl.int64) * stride_ws + offs_m[:, None] * stride_wo + \
            (ch * stride_wc + i * stride_wi + j * stride_wj)[None, :]
        tl.store(dw_ptrs, acc.to(dw_ptr.dtype.element_ty),
                 mask=m_ok[:, None] & (ch < C_IN)[None, :])


@triton.jit
def _window_db_part(dy_ptr, db_ptr, part, parts, ROWS, COP, C_OUT, DY_SHIFT,
                    stride_ds, stride_dc, DB_ROWS: tl.constexpr, DB_COLS: tl.constexpr):
    # db[part, o] = the float32 sum of dy_grid[p, o] over part's even share of the grid pixels
    # p (blocks of DB_ROWS, in order): dy_grid's pixel p is row p + DY_SHIFT of dy_ptr [ROWS,
    # COP] (rows past ROWS: zeros), whichever copy of dy it is, so that both copies give the
    # same sums in the same order. Plain loads of [DB_ROWS, DB_COLS] tiles, four a step (a
    # program keeps ~32 kB in flight: it runs beside the GEMM's programs, few of it).
    lo, hi = _even_share(tl.cdiv(ROWS, DB_ROWS), part, parts)
    lo *= DB_ROWS
    hi = tl.minimum(hi * DB_ROWS, ROWS)
    rows = tl.arange(0, DB_ROWS)
    for c0 in range(0, C_OUT, DB_COLS):
        cols = c0 + tl.arange(0, DB_COLS)
        col_ok = cols < C_OUT
        acc = tl.zeros([DB_ROWS, DB_COLS], dtype=tl.float32)
        for p0 in range(lo, hi, 4 * DB_ROWS):  # (four loads issued before their sums)
            t0 = _db_tile(dy_ptr, p0 + rows, hi, ROWS, COP, DY_SHIFT, cols, col_ok)
            t1 = _db_tile(dy_ptr, p0 + DB_ROWS + rows, hi, ROWS, COP, DY_SHIFT, cols, col_ok)
            t2 = _db_tile(dy_ptr, p0 + 2 * DB_ROWS + rows, hi, ROWS, COP, DY_SHIFT, cols,
                          col_ok)
            t3 = _db_tile(dy_ptr, p0 + 3 * DB_ROWS + rows, hi, ROWS, COP, DY_SHIFT, cols,
                          col_ok)
            acc += (t0.to(tl.float32) + t1.to(tl.float32)) + \
                (t2.to(tl.float32) + t3.to(tl.float32))
        tl.store(db_ptr + part * stride_ds + cols * stride_dc, tl.sum(acc, axis=0), mask=col_ok)


@triton.jit
def _db_tile(dy_ptr, p, hi, ROWS, COP, DY_SHIFT, cols, col_ok):
    r = p + DY_SHIFT
    ok = (p < hi) & (r < ROWS)
    return tl.load(dy_ptr + r.to(tl.int64)[:, None] * COP + cols[None, :],
                   mask=ok[:, None] & col_ok[None, :], other=0.0)


@triton.jit
def _tf32_head(v):
    """v (float32) rounded to TF32 (10 mantissa bits, to nearest by adding half of the dropped
    13 bits to the magnitude); v - head is exact in float32."""
    return ((v.to(tl.uint32, bitcast=True) + 0x1000) & 0xFFFFE000).to(tl.float32, bitcast=True)


@triton.jit
def _store_split(dst, v, lo, mask, SPLIT: tl.constexpr):
    """Store v at dst; SPLIT: its TF32 head there and the tail (v - head) lo elements on."""
    if SPLIT:
        head = _tf32_head(v)
        tl.store(dst, head, mask=mask)
        tl.store(dst + lo, v - head, mask=mask)
    else:
        tl.store(dst, v, mask=mask)


@triton.jit
def _channels_last_block(src_ptr, out_ptr, pid, C, H, W, CP, HP, WP, TOP, LEFT, lo,
                         stride_sn, stride_sc, stride_sh, stride_sw,
                         FLIP: tl.constexpr, SPLIT: tl.constexpr,
                         BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr):
    # out[n, (hp, wp), c] = src[n, c, hp - TOP, wp - LEFT] (FLIP: src[n, c, H-1-h, W-1-w] at
    # that (h, w)) where inside src and c < C, zero elsewhere: src [N, C, H, W] (any strides)
    # to a contiguous [N, HP*WP, CP] buffer. With no padding (HP, WP, CP = H, W, C) the plain
    # channels-last copy of activations or weights. SPLIT (float32): TF32 heads, and their
    # tails lo elements further on (_tf32_head).
    # Block pid (pixel blocks first, then channel blocks, then images): [BLOCK_P pixels,
    # BLOCK_C channels] of one image.
    blocks_p = tl.cdiv(HP * WP, BLOCK_P)
    blocks_c = tl.cdiv(CP, BLOCK_C)
    rest = pid // blocks_p
    pix = (pid - rest * blocks_p) * BLOCK_P + tl.arange(0, BLOCK_P)
    ch = (rest % blocks_c) * BLOCK_C + tl.arange(0, BLOCK_C)
    n = (rest // blocks_c).to(tl.int64)
    hp = pix // WP
    h = hp - TOP
    w = pix - hp * WP - LEFT
    if FLIP:
        h = H - 1 - h
        w = W - 1 - w
    inside = (h >= 0) & (h < H) & (w >= 0) & (w < W)
    ok = (pix < HP * WP)[:, None] & (ch < CP)[None, :]
    v = tl.load(src_ptr + n * stride_sn + (h * stride_sh + w * stride_sw)[:, None] +
                (ch * stride_sc)[None, :], mask=ok & inside[:, None] & (ch < C)[None, :],
                other=0.0)
    _store_split(out_ptr + n * HP * WP * CP + (pix * CP)[:, None] + ch[None, :], v, lo, ok,
                 SPLIT)


@triton.jit
def _channels_last_kernel(src_ptr, out_ptr, C, H, W, CP, HP, WP, TOP, LEFT, lo,
                          stride_sn, stride_sc, stride_sh, stride_sw, PROGRAMS,
                          src2_ptr, out2_ptr, C2, H2, W2, CP2, HP2, WP2, TOP2, LEFT2, lo2,
                          stride2_sn, stride2_sc, stride2_sh, stride2_sw,
                          FLIP: tl.constexpr, FLIP2: tl.constexpr, SPLIT: tl.constexpr,
                          SPLIT2: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr):
    # _channels_last_block's copy of src to out by the first PROGRAMS programs, and of src2 to
    # out2 by the rest (none where the grid has PROGRAMS): two arrays in one launch, such as a
    # convolution's source and its weights (one dependent launch less, ~1.5 us in a graph).
    pid = tl.program_id(0)
    if pid < PROGRAMS:
        _channels_last_block(src_ptr, out_ptr, pid, C, H, W, CP, HP, WP, TOP, LEFT, lo,
                             stride_sn, stride_sc, stride_sh, stride_sw,
                             FLIP, SPLIT, BLOCK_P, BLOCK_C)
    else:
        _channels_last_block(src2_ptr, out2_ptr, pid - PROGRAMS, C2, H2, W2, CP2, HP2, WP2,
                             TOP2, LEFT2, lo2, stride2_sn, stride2_sc, stride2_sh, stride2_sw,
                             FLIP2, SPLIT2, BLOCK_P, BLOCK_C)


@triton.jit
def _shifted_planes_kernel(src_ptr, out_ptr, ROWS, NC, C, H, W, HP, WP, TOP, LEFT, lo,
                           stride_sn, stride_sc, stride_sh, stride_sw,
                           SPLIT: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_W: tl.constexpr):
    # out[j, n*C + c, r, q] = src[n, c, r - TOP, q + j - LEFT] where that is inside src and
    # q < W, zero elsewhere: src [N, C, H, W] (any strides) to contiguous [KW, N*C, HP, WP]
    # planes, one per kernel column j (ROWS = KW*N*C*HP rows of WP). SPLIT (float32): TF32
    # heads, and their tails lo elements further on (_tf32_head).
    # One program: BLOCK_R rows of BLOCK_W >= WP columns.
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    q = tl.arange(0, BLOCK_W)
    plane = rows // HP
    h = rows - plane * HP - TOP
    j = plane // NC
    nc = plane - j * NC
    n = nc // C
    w = q[None, :] + (j - LEFT)[:, None]
    ok = (rows < ROWS)[:, None] & (q < WP)[None, :]
    inside = ok & ((h >= 0) & (h < H))[:, None] & (q < W)[None, :] & (w >= 0) & (w < W)
    v = tl.load(src_ptr + (n.to(tl.int64) * stride_sn + (nc - n * C) * stride_sc +
                           h * stride_sh)[:, None] + w * stride_sw, mask=inside, other=0.0)
    _store_split(out_ptr + rows.to(tl.int64)[:, None] * WP + q[None, :], v, lo, ok, SPLIT)


@triton.jit
def _split_tf32_kernel(src_ptr, out_ptr, TOTAL, C, H, W,
                       stride_sn, stride_sc, stride_sh, stride_sw,
                       INDEX_64: tl.constexpr, BLOCK: tl.constexpr):
    # out[0] = head, out[1] = tail of src [N, C, H, W] (any strides), both contiguous: the head
    # is src rounded to TF32 (_tf32_head), tail = src - head, exact in float32. A TF32 product
    # of a head reads it exactly; a tail's own TF32 rounding costs ~2**-22 relative: 3xTF32's
    # accuracy.
    # One program: BLOCK elements of the contiguous output.
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    if INDEX_64:
        offs = offs.to(tl.int64)
    ok = offs < TOTAL
    n, c, h, w = _nchw(offs, C, H, W)
    v = tl.load(src_ptr + n * stride_sn + c * stride_sc + h * stride_sh + w * stride_sw, mask=ok,
                other=0.0)
    head = _tf32_head(v)
    tl.store(out_ptr + offs, head, mask=ok)
    tl.store(out_ptr + TOTAL + offs, v - head, mask=ok)


@triton.jit
def _sum_splits_block(part_ptr, out_ptr, pid, S, ROWS, COLS, stride_ps, stride_pr, stride_pc,
                      stride_or, stride_oc, BLOCK_S: tl.constexpr, BLOCK: tl.constexpr):
    # out[r, c] = sum_s part[s, r, c] for BLOCK flat (r, c) positions from pid * BLOCK:
    # BLOCK_S splits at a time, summed down a [BLOCK_S, BLOCK] tile, the chunks in increasing
    # order (the same result every run).
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    ok = offs < ROWS * COLS
    r = offs // COLS
    c = offs - r * COLS
    src = part_ptr + r * stride_pr + c * stride_pc
    splits = tl.arange(0, BLOCK_S)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, S, BLOCK_S):
        s = start + splits
        v = tl.load(src[None, :] + s[:, None] * stride_ps, mask=(s[:, None] < S) & ok[None, :],
                    other=0.0)
        acc += tl.sum(v.to(tl.float32), axis=0)
    tl.store(out_ptr + r * stride_or + c * stride_oc, acc.to(out_ptr.dtype.element_ty), mask=ok)


@triton.jit
def _sum_splits_kernel(part_ptr, out_ptr, S, ROWS, COLS,
                       stride_ps, stride_pr, stride_pc, stride_or, stride_oc,
                       part2_ptr, out2_ptr, S2, ROWS2, COLS2,
                       stride2_ps, stride2_pr, stride2_pc, stride2_or, stride2_oc, PROGRAMS2,
                       BLOCK_S: tl.constexpr, BLOCK: tl.constexpr,
                       BLOCK_S2: tl.constexpr, BLOCK2: tl.constexpr):
    # out = the fixed-order sum of part over its splits (_sum_splits_block), by the programs
    # from PROGRAMS2 on; out2 that of part2 by the first PROGRAMS2 (none without a second sum):
    # a weight gradient and its bias gradient in one launch, each with its own split count
    # and blocks. (The second comes first, so that its few programs start first.)
    pid = tl.program_id(0)
    if pid < PROGRAMS2:
        _sum_splits_block(part2_ptr, out2_ptr, pid, S2, ROWS2, COLS2, stride2_ps, stride2_pr,
                          stride2_pc, stride2_or, stride2_oc, BLOCK_S2, BLOCK2)
    else:
        _sum_splits_block(part_ptr, out_ptr, pid - PROGRAMS2, S, ROWS, COLS, stride_ps,
                          stride_pr, stride_pc, stride_or, stride_oc, BLOCK_S, BLOCK)


@triton.jit
def _channel_sum_kernel(x_ptr, out_ptr, N_IMG, C, W, PLANE,
                        stride_xn, stride_xc, stride_xh, stride_xw, stride_os, stride_oc,
                        FLAT: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_N: tl.constexpr,
                        BLOCK_E: tl.constexpr):
    # out[s, c] = the float32 sum of x[n, c, h, w] over the images of split s (an even share,
    # in order) and all pixels: the bias gradient's partials, which _sum_splits adds in a
    # fixed order. One program: channels c0 .. c0 + BLOCK_C of one split. An image's
    # (channel, pixel) elements of those channels are one run of BLOCK_C * PLANE (contiguous
    # where FLAT), loaded BLOCK_N images at a time as a [BLOCK_N, BLOCK_E] tile, so that the
    # loads are wide whatever the plane's size: with several channels the run fits one tile
    # (BLOCK_E >= BLOCK_C * PLANE), with one it is walked in steps of BLOCK_E.
    c0 = tl.program_id(0) * BLOCK_C
    split = tl.program_id(1)
    n_lo, n_hi = _split_share(N_IMG)
    run_len = tl.minimum(BLOCK_C, C - c0) * PLANE
    e = tl.arange(0, BLOCK_E)
    acc = tl.zeros([BLOCK_N, BLOCK_E], dtype=tl.float32)
    for n0 in range(n_lo, n_hi, BLOCK_N):
        n = n0 + tl.arange(0, BLOCK_N)
        rows = x_ptr + n.to(tl.int64)[:, None] * stride_xn
        for step in range(0, tl.cdiv(run_len, BLOCK_E)):
            e0 = step * BLOCK_E  # (a multiple of BLOCK_E, known: wide loads)
            if FLAT:
                offs = c0 * stride_xc + e0 + e
            else:
                ch = (e0 + e) // PLANE
                pix = e0 + e - ch * PLANE
                h = pix // W
                offs = (c0 + ch) * stride_xc + h * stride_xh + (pix - h * W) * stride_xw
            acc += tl.load(rows + offs[None, :], mask=(n < n_hi)[:, None] &
                           (e0 + e < run_len)[None, :], other=0.0).to(tl.float32)
    col = tl.sum(acc, axis=0)
    if BLOCK_C == 1:
        tl.store(out_ptr + split * stride_os + c0 * stride_oc, tl.sum(col, axis=0))
    else:
        ch = e // PLANE
        for k in tl.static_range(BLOCK_C):
            tl.store(out_ptr + split * stride_os + (c0 + k) * stride_oc,
                     tl.sum(tl.where(ch == k, col, 0.0), axis=0), mask=c0 + k < C)


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
    n, c, h, v = _nchw(offs, C, H, W)
    base = cols_ptr + n.to(tl.int64) * stride_cn + (c * (KH * KW)).to(tl.int64) * stride_ck
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    if ACC_FP64:
        acc = acc.to(tl.float64)
    for i in range(0, KH):
        p, p_ok = _source_coord(h + PH, -i * DH, SH, OUT_H, True)
        for j in range(0, KW):
            q, q_ok = _source_coord(v + PW, -j * DW, SW, OUT_W, True)
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


# ============================================================================ launchers


class _Geometry:
    """Sizes of one convolution, validated: n, c, h, w, co, kh, kw, oh, ow, groups and the
    per-axis stride (sh, sw), padding (ph, pw), dilation (dh, dw)."""

    def __init__(self, op, x_shape, w_shape, stride, padding, dilation, groups):
        if len(x_shape) != 4 or len(w_shape) != 4:
            raise ValueError(f"{op}: expected x [N, C, H, W] and weight [Co, C/groups, kh, kw], "
                             f"got x {tuple(x_shape)} and weight {tuple(w_shape)}")
        self.n, self.c, self.h, self.w = x_shape
        self.co, cg, self.kh, self.kw = w_shape
        self.groups = int(groups)
        if self.groups < 1 or self.co % self.groups or self.c != cg * self.groups:
            raise ValueError(f"{op}: input {tuple(x_shape)} does not match weight {tuple(w_shape)} "
                             f"with groups={groups} (C must equal weight.shape[1] * groups and "
                             f"Co must be divisible by groups)")
        (self.sh, self.sw), (self.ph, self.pw), (self.dh, self.dw) = \
            _pair(op, "stride", stride, 1), _pair(op, "padding", padding, 0), \
            _pair(op, "dilation", dilation, 1)
        self.oh = (self.h + 2 * self.ph - self.dh * (self.kh - 1) - 1) // self.sh + 1
        self.ow = (self.w + 2 * self.pw - self.dw * (self.kw - 1) - 1) // self.sw + 1
        if self.kh < 1 or self.kw < 1 or self.oh < 1 or self.ow < 1:
            raise ValueError(f"{op}: kernel {(self.kh, self.kw)} (dilation {(self.dh, self.dw)}) "
                             f"does not fit the input {(self.h, self.w)} padded by "
                             f"{(self.ph, self.pw)} (input {tuple(x_shape)}, weight "
                             f"{tuple(w_shape)})")

    @property
    def args(self):
        return self.sh, self.sw, self.ph, self.pw, self.dh, self.dw


def _pair(op, name, v, low):
    v = (int(v), int(v)) if isinstance(v, int) else tuple(int(i) for i in v)
    if len(v) != 2 or min(v) < low:
        raise ValueError(f"{op}: {name} must be a pair of ints >= {low}, got {v}")
    return v


def _check_float(op, *arrays, allow_f64=False):
    arrays = [a for a in arrays if a is not None]
    allowed = ("float32", "float16", "bfloat16") + (("float64",) if allow_f64 else ())
    if len({a.dtype for a in arrays}) != 1 or dtype_of(arrays[0]).name not in allowed:
        names = ", ".join(f"{tuple(a.shape)} {dtype_of(a).name}" for a in arrays)
        raise TypeError(f"{op}: expected arrays of one dtype among {allowed}, got {names}")
    if len({a.device for a in arrays}) != 1:
        raise ValueError(f"{op}: arrays on different devices: "
                         f"{', '.join(str(a.device) for a in arrays)}")


def _precision(dtype):
    """tl.dot input precision: TF32 unless conv_precision() is "highest" (float32 accuracy); half
    types use their tensor cores whatever it says (the flag only concerns float32). Float32
    accuracy runs as 3xTF32 ("tf32x3": each operand split into a TF32 head and tail, three
    tensor-core products, tail x tail dropped), as the matmul does: relative error at float32's
    level, on tensor cores rather than the CUDA cores' FMA (TRITONAD_CONV_IEEE=1: the FMA path)."""
    if dtype == torch.float32 and conv_precision() == "highest":
        return "ieee" if CONV_IEEE else "tf32x3"
    return "tf32"


def _dot_fp32(dtype):
    return INTERPRET and dtype != torch.float32


# Config menus, GEMM: (BLOCK_M pixels, K step, warps, stages); weight gradient: (K step in
# pixels, warps, stages). Few configs: every one costs seconds of compilation (the FMA path of
# "ieee" the most) and the first epoch pays for them. The first entry is the heuristic's choice
# (kernels/tuning.py): one that compiles without spills at every layer checked (sm_90, 3.6).
# benchmarks/sweep_conv.py swaps these tables for wider ones to time the space on a GPU.
# The entries are ordered by the H200 sweep of 2026-11-21 (benchmarks/sweep_conv.py): the best
# at the MNIST layers and at 256x64x56x56 first.
GEMM_MENU = {
    "ieee": [(128, 16, 4, 2), (64, 16, 4, 2), (128, 32, 8, 2)],   # CUDA-core FMA
    "tf32": [(64, 32, 4, 3), (64, 32, 4, 4), (128, 32, 4, 3)],    # wgmma, cp.async pipelined
    "tf32x3": [(64, 32, 4, 3), (64, 32, 4, 2), (128, 32, 8, 3)],  # three products per step
    "half": [(128, 64, 4, 3), (64, 64, 4, 4), (128, 64, 8, 3)],
}
# Weight gradient: H100 sweep of 2026-11-24 (sweep_conv.py --wgrad); tiles of 128x128 and up
# take the first entry with 8 warps (_wgrad_configs: 4 warps spill there, 5-10x slower).
# "tf32x3" is the pre-split kernel's menu (DW_PRESPLIT; tl.dot's own tf32x3 was best at
# (16, 2, 2), 0.34 ms at conv2).
WGRAD_MENU = {
    "ieee": [(16, 4, 1), (16, 4, 2), (32, 4, 2)],
    "tf32": [(32, 4, 3), (64, 8, 3), (16, 4, 3), (32, 4, 4)],
    "tf32x3": [(16, 4, 3), (32, 8, 3), (32, 4, 3), (16, 8, 3)],
    "half": [(64, 4, 3), (64, 8, 3), (128, 8, 3), (32, 4, 3), (32, 8, 3)],  # (the 32-pixel
}  # steps: the shipped table's bf16 plans at MNIST conv2 and the 128/256-channel layers)


# _shift_wgrad_kernel: (K step in pixels, warps, stages), best first by the H100 sweep of
# 2026-11-24 (benchmarks/sweep_conv.py --shift; tiles of 128x128 and up run with 8 warps).
SHIFT_WGRAD_MENU = {
    "ieee": [(16, 4, 2), (32, 4, 2)],
    "tf32": [(64, 4, 3), (32, 4, 3), (16, 4, 4)],
    "tf32x3": [(32, 4, 3), (32, 8, 3), (16, 4, 3), (64, 4, 3)],  # (64: the batch-inner form's
    "half": [(128, 4, 3), (64, 8, 3), (64, 4, 3)],                # best at MNIST conv2, H200)
}


# _window_gemm_kernel: (BLOCK_M grid pixels, BLOCK_N at most, K step, warps, stages[,
# PERSIST programs an SM]), best first by the H100 sweep of 2026-11-24 (benchmarks/sweep_conv.py
# --window: MNIST conv2 and the ResNet-style 3x3 layers). Above 64 output channels the
# persistent entries go first (H200, session 24, us: 256 channels at 14x14, 128x256 tiles,
# TF32 218 -> 196 (four stages: 4 less again), bf16 116 -> 107; 128 channels at 28x28,
# 128x128 tiles with one warpgroup, two programs an SM, TF32 235 -> 223, bf16 130 -> 121; 64
# channels at 56x56 no faster), and from 256 channels the 256-wide tiles.
WINDOW_MENU = {
    "tf32": [(128, 128, 32, 8, 3), (256, 128, 32, 8, 4), (128, 256, 32, 8, 3),
             (128, 128, 32, 4, 4), (128, 128, 32, 4, 3, 2), (128, 256, 32, 8, 4, 1),
             (256, 128, 32, 8, 3, 1)],
    "tf32x3": [(128, 64, 32, 4, 3, 2), (128, 64, 32, 4, 3), (128, 128, 32, 8, 3),
               (128, 64, 32, 4, 4, 2)],
    "half": [(128, 128, 64, 4, 3), (128, 256, 64, 8, 3), (256, 128, 64, 8, 3),
             (128, 128, 64, 4, 3, 2), (128, 256, 64, 8, 3, 1), (256, 128, 64, 8, 3, 1)],
}
# (tf32x3's first entry at every channel count: one warpgroup's 64-wide tiles, two programs an
# SM, the weights' tails from memory (WINDOW_PRESPLIT); H200, session 25, us, forward / input
# gradient, Winograd off: 256x64x56x56 776 / 791 against 816 / 831 one program a tile;
# 256x128x28x28 704 / 724 against 761 / 729 for 128x128 tiles with 8 warps; 256x256x14x14
# 713 / 729 against 742 / 713. MNIST conv2's input gradient: 66 against 64 one a tile.)


def _menu_kind(precision, dtype):
    return "half" if dtype in (torch.float16, torch.bfloat16) else precision


def _gemm_configs(block_n, max_k, single, kind):
    """Configs for _conv_gemm_kernel. BLOCK_N (output channels) is fixed by the channel count
    (the smallest power of two >= 16 covering it, at most 128); the pixels per tile (BLOCK_M),
    the K step, warps and stages are tuned. A K that fits one step is not pipelined (software
    pipelining a one-trip loop only duplicates its address arithmetic)."""
    if INTERPRET:
        return [triton.Config({"BLOCK_M": 128, "BLOCK_N": block_n, "BLOCK_K": min(32, max_k)},
                              num_warps=4, num_stages=1)]
    configs = {}
    for bm, bk, warps, stages in GEMM_MENU[kind]:
        if bk >= max_k:
            bk, stages = max_k, (1 if single else stages)
        configs[bm, bk, warps, stages] = triton.Config(
            {"BLOCK_M": bm, "BLOCK_N": block_n, "BLOCK_K": bk}, num_warps=warps,
            num_stages=stages)
    return list(configs.values())


def _wgrad_configs(block_m, block_n, block_q, kind):
    """Configs for _conv_wgrad_kernel: the tile is fixed by the channel counts; the K step (a
    block of BLOCK_K // BLOCK_Q output rows of BLOCK_Q pixels), warps and stages are tuned."""
    if INTERPRET:
        return [triton.Config({"BLOCK_M": block_m, "BLOCK_N": block_n, "BLOCK_K": 64,
                               "BLOCK_Q": min(block_q, 64)}, num_warps=4, num_stages=1)]
    menu = WGRAD_MENU[kind]
    if block_m * block_n >= 128 * 128:  # big tiles: the 8-warp entries first
        menu = sorted(menu, key=lambda entry: entry[1] < 8)
    configs = {}
    for bk, warps, stages in menu:
        bk = max(bk, 16)
        configs[bk, warps, stages] = triton.Config(
            {"BLOCK_M": block_m, "BLOCK_N": block_n, "BLOCK_K": bk, "BLOCK_Q": min(block_q, bk)},
            num_warps=warps, num_stages=stages)
    return list(configs.values())


def _shift_wgrad_configs(block_m, block_n, kind):
    """Configs for _shift_wgrad_kernel: the tile is fixed by the channel counts; the K step in
    pixels, warps and stages are tuned (8 warps first for tiles of 128x128 and up)."""
    if INTERPRET:
        return [triton.Config({"BLOCK_M": block_m, "BLOCK_N": block_n, "BLOCK_K": 32},
                              num_warps=4, num_stages=1)]
    menu = SHIFT_WGRAD_MENU[kind]
    if block_m * block_n >= 128 * 128:
        menu = [(bk, max(warps, 8), stages) for bk, warps, stages in menu]
    configs = {}
    for bk, warps, stages in menu:
        configs[bk, warps, stages] = triton.Config(
            {"BLOCK_M": block_m, "BLOCK_N": block_n, "BLOCK_K": bk}, num_warps=warps,
            num_stages=stages)
    return list(configs.values())


def _window_configs(n_ch, max_k, kind):
    """Configs for _window_gemm_kernel: the pixels per tile, the output channels' block (the
    smallest power of two >= 16 covering them, at most the entry's cap), the K step (at most
    the reduced channels' block), warps and stages are tuned."""
    if INTERPRET:
        return [triton.Config({"BLOCK_M": 64, "BLOCK_N": _block(n_ch), "BLOCK_K": min(32, max_k)},
                              num_warps=4, num_stages=1)]
    menu = [entry + (0,) * (6 - len(entry)) for entry in WINDOW_MENU[kind]]
    if n_ch > 64 and kind != "tf32x3":
        # persistent, wide tiles first: 256 columns from 256 channels, else 128
        menu = sorted(menu, key=lambda e: (n_ch >= 256 and e[1] < 256, e[1] < 128, not e[5]))
    configs = {}
    for bm, bn, bk, warps, stages, persist in menu:
        bn, bk = _block(n_ch, bn), min(bk, max_k)
        blocks = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk}
        if persist:  # (else no key: the plans cached and shipped before PERSIST stay valid)
            blocks["PERSIST"] = persist
        configs[bm, bn, bk, warps, stages, persist] = triton.Config(
            blocks, num_warps=warps, num_stages=stages)
    return list(configs.values())


# _window_wgrad_kernel: (K step in pixels, warps, stages), best first by the H100 sweep of
# 2026-11-24 (benchmarks/sweep_conv.py --window). NOTE: tiles with 128 rows or columns run
# with 8 warps: with 4 (one warpgroup), 64- and 128-pixel steps gave wrong weight gradients
# at 256x128x28x28 in bf16 and fp16 on Triton 3.6 (errors 3e-2 to 1e-1 of the largest
# element, against 3e-3 with 8 warps; 32-pixel steps were right), which
# test_gpu_window_weight_grad_menu checks for every entry. The H200's best in session 24 (dw +
# db, us): 256x64x56x56 (64, 4, 6) 281 against (128, 4, 3) 296; 14x14 and 28x28 (64, 8, 3),
# 207-210 against (32, 8, 4) 209-211 (14x14) and 246 against 248 (28x28). Tiles of 128 take
# WINDOW_WGRAD_WIDE_FIRST first: session 25 (H200, with db's programs in the launch), bf16 and
# fp16 alike, 14x14 193 us against 209 for (128, 8, 3), 28x28 224-227 against 230-232.
WINDOW_WGRAD_MENU = [(128, 4, 3), (64, 4, 4), (128, 8, 3), (32, 4, 4), (64, 4, 6), (64, 8, 3)]
WINDOW_WGRAD_WIDE_FIRST = (64, 8, 3)


def _window_wgrad_configs(block_m, block_n):
    """Configs for _window_wgrad_kernel: the tile is fixed by the channel counts; the K step in
    pixels, warps (8 for tiles with 128 rows or columns) and stages are tuned."""
    if INTERPRET:
        return [triton.Config({"BLOCK_M": block_m, "BLOCK_N": block_n, "BLOCK_K": 32},
                              num_warps=4, num_stages=1)]
    least = 8 if max(block_m, block_n) >= 128 else 1
    menu = [WINDOW_WGRAD_WIDE_FIRST] * (least == 8) + WINDOW_WGRAD_MENU
    configs = {}
    for bk, warps, stages in menu:
        warps = max(warps, least)
        configs[bk, warps, stages] = triton.Config(
            {"BLOCK_M": block_m, "BLOCK_N": block_n, "BLOCK_K": bk}, num_warps=warps,
            num_stages=stages)
    return list(configs.values())


def _source_hash():
    with open(__file__, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()[:16]


tuner = Tuner("conv", _source_hash())


def _plans(configs):
    """triton.Config menus as plain plans: the kernel's block constexprs, warps and stages."""
    return [{**c.kwargs, "num_warps": c.num_warps, "num_stages": c.num_stages} for c in configs]


def _run_tuned(kernel, configs, key, grid, args, meta, device):
    """Launch `kernel` with the plan chosen for `key` among `configs` (kernels/tuning.py: this
    machine's cache, the shipped table, timing when autotuning, else the menu's first entry),
    through run() so that a plan being recorded sees the launch."""
    plans = _plans(configs)

    def launch(plan):
        run(kernel, grid(plan), *args, **meta, **plan)

    plan = plans[0] if INTERPRET else tuner.choose(key, lambda: plans, launch, device)
    launch(plan)


def _block(n, cap=128):
    return max(16, min(cap, next_power_of_2(max(int(n), 1))))


def _channels_last(t):
    """t [N, C, H, W] (any strides) copied to channels-last memory: returns the [N, C, H, W] view
    of a contiguous [N, H, W, C] buffer (stride along C = 1)."""
    n, c, h, w = t.shape
    out, = _padded_channels_last((t, (0, 0), (h, w), c))
    return out.view(n, h, w, c).permute(0, 3, 1, 2)


def _padded_channels_last(*copies, split=False):
    """Each copy (t, corner, plane, channels[, flip]), one or two of them, in one launch: t
    [N, C, H, W] (any strides) placed at `corner` (top, left) of a zeroed channels-last buffer
    [N, plane[0], plane[1], channels] (channels >= C; flip: each plane turned by 180 degrees
    first; split, for all copies or a tuple of one a copy: float32 as TF32 heads, their tails
    one buffer further on). Returns the buffers, contiguous ([2, N, ...] where split)."""
    assert 1 <= len(copies) <= 2
    splits = tuple(split) if isinstance(split, tuple) else (split,) * len(copies)
    outs, jobs = [], []
    block_p, block_c = (64, 32) if not INTERPRET else (256, 64)
    for (t, corner, (hp, wp), channels, *flip), cut in zip(copies, splits):
        n, c, h, w = t.shape
        out = empty((1 + int(cut), n, hp, wp, channels), t.dtype, t.device)
        outs.append(out if cut else out[0])
        programs = cdiv(hp * wp, block_p) * cdiv(channels, block_c) * n
        if programs:
            jobs.append(((t, out, c, h, w, channels, hp, wp, corner[0], corner[1],
                          out[0].numel(), *t.stride()), programs, bool(flip and flip[0]),
                         bool(cut)))
    if jobs:
        (args, programs, flip, cut), (args2, programs2, flip2, cut2) = jobs[0], jobs[-1]
        total = programs + (programs2 if len(jobs) == 2 else 0)
        run(_channels_last_kernel, (total,), *args, programs, *args2, FLIP=flip, FLIP2=flip2,
            SPLIT=cut, SPLIT2=cut2, BLOCK_P=block_p, BLOCK_C=block_c, num_warps=4)
    return outs


def _winograd(g, k_ch, n_ch, dtype):
    """Whether convolution g (one group of k_ch input and n_ch output channels) runs by
    Winograd's F(4x4, 3x3) (kernels/winograd.py): a 3x3 kernel, stride 1, padding 1, no
    dilation, float32 accuracy on tensor cores (3xTF32, not IEEE FMA), WINOGRAD_MIN_CHANNELS
    channels on both sides, and one image's transformed operands within WINOGRAD_MAX_BYTES."""
    return WINOGRAD and _precision(dtype) == "tf32x3" and \
        (g.kh, g.kw, g.sh, g.sw, g.ph, g.pw, g.dh, g.dw) == (3, 3, 1, 1, 1, 1, 1, 1) and \
        min(k_ch, n_ch) >= WINOGRAD_MIN_CHANNELS and \
        winograd.workspace_bytes(1, g.h, g.w, k_ch, n_ch) <= WINOGRAD_MAX_BYTES


def _winograd_chunks(g, k_ch, n_ch):
    """The batch's slices (start, stop) for Winograd calls whose transformed operands take at
    most WINOGRAD_MAX_BYTES (one slice, the whole batch, at the ResNet-style layers' 256)."""
    step = max(1, WINOGRAD_MAX_BYTES // winograd.workspace_bytes(1, g.h, g.w, k_ch, n_ch))
    return [(i, min(i + step, g.n)) for i in range(0, g.n, step)]


def _window(g, src, transposed):
    """Whether the forward (or, transposed, the input gradient) of convolution g runs as
    _window_gemm_kernel: stride 1, at least CHANNEL_INNER_MIN reduced channels (WINDOW_X3_MIN
    at float32 accuracy), TF32, 3xTF32 or half precision (not IEEE FMA), padding within the
    window's reach, a padded plane at most WINDOW_WASTE times the output's (_window_plane),
    and a GPU whose TMA reads any row (Hopper; the interpreter runs it too)."""
    precision = _precision(src.dtype)
    if not (WINDOW_GEMM and (g.sh, g.sw) == (1, 1)) or precision == "ieee":
        return False
    reach = (g.dh * (g.kh - 1), g.dw * (g.kw - 1))
    least = WINDOW_X3_MIN if precision == "tf32x3" else CHANNEL_INNER_MIN
    if src.shape[1] < least or g.ph > reach[0] or g.pw > reach[1]:
        return False
    side, plane, out_hw = _window_plane(g, transposed)
    if plane[0] * plane[1] > WINDOW_WASTE * out_hw[0] * out_hw[1]:
        return False
    return INTERPRET or _tma_capable(src.device)


def _window_plane(g, transposed):
    """(side padding, padded plane, output plane) of the window GEMM for convolution g. A padded
    row is the source row and one side's padding, zeros first: the zeros that start the next
    row (or image) are this one's padding on the other side, since a window that runs past
    its row's end reads on into them (the last image's run past the buffer's end reads the
    zeros TMA returns out of bounds). So the plane is (H + ph) x (W + pw), not
    (H + 2ph) x (W + 2pw): 16x16 at MNIST conv2 (1.31 times its 14x14 output), 15x15 at
    14x14 k3."""
    reach = (g.dh * (g.kh - 1), g.dw * (g.kw - 1))
    if transposed:  # dx: dy padded by the reach less the padding
        side, src_hw, out_hw = (reach[0] - g.ph, reach[1] - g.pw), (g.oh, g.ow), (g.h, g.w)
    else:
        side, src_hw, out_hw = (g.ph, g.pw), (g.h, g.w), (g.oh, g.ow)
    return side, (src_hw[0] + side[0], src_hw[1] + side[1]), out_hw


def _window_wgrad(g, dy, x):
    """Whether the weight gradient of convolution g runs as _window_wgrad_kernel: where the
    forward would run as the window GEMM (_window), in half precision (wgmma reads the
    channel-contiguous tiles as M- and N-major operands, which it does for 16-bit types
    only), with at least CHANNEL_INNER_MIN output channels."""
    return x.dtype in (torch.float16, torch.bfloat16) and dy.shape[1] >= CHANNEL_INNER_MIN \
        and WINDOW_WGRAD and _window(g, x, False)


def _round_up(n, m):
    return cdiv(n, m) * m


def _window_gemm(src, w, bias, out, g, transposed, relu, keep=None):
    """Launch _window_gemm_kernel for one group (where _window says so): the forward (src = x,
    out = y) or the input gradient (src = dy, out = dx; keep, a dict: its padded copy of dy,
    corner and plane go to keep["dy"], for the weight gradient after it)."""
    # dx: dy padded by the reach less the padding, times the weights [C, Co, kh, kw] flipped
    wk = w.permute(1, 0, 2, 3) if transposed else w
    n_ch, k_ch = wk.shape[0], wk.shape[1]
    corner, plane, out_hw = _window_plane(g, transposed)
    precision = _precision(src.dtype)
    presplit = precision == "tf32x3" and WINDOW_PRESPLIT  # (the weights)
    kind = _menu_kind(precision, src.dtype)
    kp, wk_ch = _round_up(k_ch, 16), _round_up(k_ch, 64)  # (16-byte rows; no step over taps)
    copies = (src, corner, plane, kp), (wk, (0, 0), (g.kh, g.kw), wk_ch, transposed)
    cuts = (False, presplit)
    if not transposed:  # one launch for both (~1.5 us less on a graph's chain)
        a, b = _padded_channels_last(*copies, split=cuts)
    else:
        # NOTE: two launches. In the MNIST cnn's captured step the input gradient's GEMM then
        # starts after the weight gradient beside it, and the two share the GPU to the end;
        # with one launch it started first and took most of the GPU, and conv1's weight
        # gradient after it had to share with conv2's: 206.7 us a step against 202.4 (H200)
        (a,), (b,) = (_padded_channels_last(c, split=cut) for c, cut in zip(copies, cuts))
        if keep is not None:
            keep["dy"] = a, corner, plane
    rows, sms = g.n * plane[0] * plane[1], _sm_count(src.device)
    key = (f"window:{g.n}x{k_ch}x{n_ch}:{plane[0]}x{plane[1]}->{out_hw[0]}x{out_hw[1]}:"
           f"k{g.kh}x{g.kw}:d{g.dh}{g.dw}:{precision}{'-wsplit' if presplit else ''}:{kind}:"
           f"{str(src.dtype)[6:]}")
    _run_tuned(_window_gemm_kernel, _window_configs(n_ch, _block(k_ch, 64), kind), key,
               lambda plan: _window_programs(rows, n_ch, sms, plan), (
        a, b, bias if bias is not None else b, out,
        rows, kp, wk_ch, n_ch, plane[0], plane[1], out_hw[0], out_hw[1], g.kh, g.kw, g.dh, g.dw,
        *out.stride(), bias.stride(0) if bias is not None else 0,
        b[0].numel() if presplit else 0, sms),
        dict(HAS_BIAS=bias is not None, RELU=relu, PRESPLIT=presplit,
             INPUT_PRECISION="tf32" if presplit else precision,
             DOT_FP32=_dot_fp32(src.dtype), TAIL_TILE=WINDOW_TAIL_TILE), src.device)


def _flat_shift(g, dy, x):
    """(use _shift_wgrad_kernel?, load dy through TMA?) for the weight gradient of convolution
    g: stride 1, no dilation, output plane = input plane, one group of at least
    SHIFT_MIN_CHANNELS input channels, contiguous dy and x. On a GPU only where TMA can read dy
    (Hopper: compute capability 9+, 16-byte aligned arrays and planes): the pointer-load form
    is slower there than _conv_wgrad_kernel. The interpreter runs the pointer-load form."""
    if not (FLAT_SHIFT and g.groups == 1 and (g.sh, g.sw, g.dh, g.dw) == (1, 1, 1, 1) and
            (g.oh, g.ow) == (g.h, g.w) and g.c >= SHIFT_MIN_CHANNELS and
            dy.is_contiguous() and x.is_contiguous()):
        return False, False
    if INTERPRET:
        return True, False
    tma = SHIFT_TMA and _tma_capable(dy.device) and dy.data_ptr() % 16 == 0 and \
        g.h * g.w * dy.element_size() % 16 == 0
    return tma, tma


def _batch_inner(g, x, presplit):
    """Whether the weight gradient of convolution g runs as _batch_inner_wgrad_kernel:
    BATCH_INNER, float32 at TF32 or 3xTF32, stride 1, no dilation, output plane = input plane,
    at least BATCH_INNER_MIN_CHANNELS input channels, planes of at most BATCH_INNER_MAX_PIXELS,
    copies of at most BATCH_INNER_MAX_BYTES, and a GPU whose TMA reads any row (Hopper; the
    interpreter runs it too).

    The rule is the H200's (notes/PERF.md, session 21; us, dw + db, flat shift -> batch-inner,
    cuDNN): TF32 14x14 at 256 channels 496 -> 373 (440), 28x28 at 128 490 -> 439 (475),
    MNIST conv2 54 -> 60 eager (61) but 83 -> 61 in the captured cnn step, where it runs beside
    the input gradient (the step 199.8 -> 194.1); 56x56 at 64 channels 616 -> 1075 (909): the
    copies of a large plane and 64-channel tiles cost more than the masks they save."""
    if not (BATCH_INNER and x.dtype == torch.float32 and _precision(x.dtype) != "ieee" and
            (g.sh, g.sw, g.dh, g.dw) == (1, 1, 1, 1) and (g.oh, g.ow) == (g.h, g.w) and
            g.c >= BATCH_INNER_MIN_CHANNELS and g.h * g.w <= BATCH_INNER_MAX_PIXELS):
        return False
    wp, nb = g.w + g.kw - 1, _round_up(g.n, 4)
    size = (g.c * (g.h + g.kh - 1) * (1 + int(presplit)) + g.co * g.h) * wp * nb * 4
    return size <= BATCH_INNER_MAX_BYTES and (INTERPRET or _tma_capable(x.device))


def _batch_inner_copy(t, hp, wp, nb, top, left, split, sums=False):
    """t [N, C, H, W] (any strides) as the contiguous [C, hp, wp, nb] (_batch_inner_kernel).
    Returns (the buffer, the elements from it to the tails: split makes it TF32 heads, tails
    one buffer further on, with `sums` t's float32 partial sums per channel [rows, C], whose
    sum over the rows is t's channel sums, else None)."""
    n, c, h, w = t.shape
    out = empty((1 + int(split), c, hp, wp, nb), t.dtype, t.device)
    block_b = min(64, next_power_of_2(nb))
    block_p = 4096 // block_b
    grid = (c, cdiv(hp * wp, block_p), cdiv(nb, block_b))
    part = empty((grid[1] * grid[2], c), torch.float32, t.device) if sums else out
    if out.numel():
        run(_batch_inner_kernel, grid, t, out, part, n, c, h, w, hp, wp, nb, top, left,
            out[0].numel(), *t.stride(), SPLIT=split, SUMS=sums, BLOCK_P=block_p,
            BLOCK_B=block_b, num_warps=4)
    return out, out[0].numel(), part if sums else None


@functools.lru_cache(maxsize=None)
def _tma_capable(device):
    return torch.cuda.get_device_capability(device)[0] >= 9


def _implicit_gemm(src, w, bias, out, g, transposed, relu=False, keep=None):
    """Launch _conv_gemm_kernel for one group: the forward (src = x, out = y; relu: max(y, 0)
    in the epilogue) or the input gradient (src = dy, out = dx). Arrays may be strided views
    (groups slice them). Stride-1 layers take the window GEMM where _window says so (keep:
    see _window_gemm), 3x3 ones at float32 accuracy with many channels Winograd's form where
    _winograd says so."""
    if _winograd(g, src.shape[1], out.shape[1], src.dtype):
        return winograd.conv3x3(src, w, bias, out, transposed, relu,
                                _winograd_chunks(g, src.shape[1], out.shape[1]))
    if _window(g, src, transposed):
        return _window_gemm(src, w, bias, out, g, transposed, relu, keep)
    if transposed:  # dx: channels n = C, reduced k = Co, gathered from dy
        n_ch, k_ch, src_hw, out_hw = w.shape[1], w.shape[0], (g.oh, g.ow), (g.h, g.w)
        mul, off, dil, div = (1, 1), (g.ph, g.pw), (-g.dh, -g.dw), (g.sh, g.sw)
        wk = w                              # [k = Co, n = C, kh, kw]
    else:
        n_ch, k_ch, src_hw, out_hw = w.shape[0], w.shape[1], (g.h, g.w), (g.oh, g.ow)
        mul, off, dil, div = (g.sh, g.sw), (-g.ph, -g.pw), (g.dh, g.dw), (1, 1)
        wk = w.permute(1, 0, 2, 3)          # [k = C, n = Co, kh, kw]
    channel_inner = k_ch >= CHANNEL_INNER_MIN
    if channel_inner and PACK_WEIGHTS:
        # K-major B operand: [n, kh, kw, k] memory, so a K step's weights are vector loads
        wk = _channels_last(wk.permute(1, 0, 2, 3)).permute(1, 0, 2, 3)
    if channel_inner and CHANNELS_LAST and src.stride(1) != 1:
        src = _channels_last(src)           # a pixel's channels contiguous: vector gathers
    block_n = _block(n_ch)
    max_k = _block(k_ch, 64) if channel_inner else _block(k_ch * g.kh * g.kw, 64)
    single = not channel_inner and k_ch * g.kh * g.kw <= max_k   # K fits one step
    precision = _precision(src.dtype)
    kind = _menu_kind(precision, src.dtype)
    pixels = g.n * out_hw[0] * out_hw[1]
    grid = lambda meta: (cdiv(pixels, meta["BLOCK_M"]), cdiv(n_ch, meta["BLOCK_N"]))  # noqa: E731
    key = (f"gemm:{g.n}x{k_ch}x{n_ch}:{src_hw[0]}x{src_hw[1]}->{out_hw[0]}x{out_hw[1]}:"
           f"k{g.kh}x{g.kw}:m{mul[0]}{mul[1]}d{div[0]}{div[1]}:{'t' if transposed else 'f'}:"
           f"{precision}:{kind}:{str(src.dtype)[6:]}:{'ci' if channel_inner else 'kk'}")
    # NOTE: relu stays out of the key: the same tile plans serve it
    _run_tuned(_conv_gemm_kernel, _gemm_configs(block_n, max_k, single, kind), key, grid, (
        src, wk, bias if bias is not None else wk, out,
        g.n, k_ch, n_ch, src_hw[0], src_hw[1], out_hw[0], out_hw[1], g.kh, g.kw,
        *src.stride(), *wk.stride(), *out.stride(), bias.stride(0) if bias is not None else 0,
        mul[0], mul[1], off[0], off[1], dil[0], dil[1], div[0], div[1]),
        dict(HAS_BIAS=bias is not None, RELU=relu, TRANSPOSED=transposed,
             CHANNEL_INNER=channel_inner, INPUT_PRECISION=precision,
             DOT_FP32=_dot_fp32(src.dtype)), src.device)


def _wgrad_splits(tiles, pixels, device, reserved=0):
    """Split-K count for the weight gradient: at most two programs per SM in all (less
    `reserved` programs of other work in the same launch), each with at least a few hundred
    pixels. NOTE: at most, not about: the programs are equal, so a few over a whole number of
    rounds cost one more round (28x28 TF32: 9 tiles x 30 splits = 270 > 264)."""
    if DW_SPLIT is not None:
        return max(1, min(int(DW_SPLIT), pixels))
    return max(1, min((2 * _sm_count(device) - reserved) // tiles, pixels // 256))


def _window_db_programs(rows, cols, itemsize, device):
    """Programs of the window weight gradient's launch that sum the bias gradient from dy's
    copy [rows, cols]: one for every WINDOW_DB_BYTES of it, at least WINDOW_DB_MIN (a program
    beside the GEMM's reads ~50 GB/s: MNIST conv2's 4 MB took 40 us in 4 programs, its GEMM 33),
    at most one for two SMs."""
    if WINDOW_DB_PROGRAMS is not None:
        return int(WINDOW_DB_PROGRAMS)
    most = max(1, _sm_count(device) // 2)
    return min(most, max(WINDOW_DB_MIN, cdiv(rows * cols * itemsize, WINDOW_DB_BYTES)))


@functools.lru_cache(maxsize=None)
def _sm_count(device):
    return 1 if INTERPRET else torch.cuda.get_device_properties(device).multi_processor_count


def _implicit_wgrad(dy, x, dw, db, g, dy_pad=None):
    """dw [Co, C, kh, kw] (and db [Co] unless None) of one group by split-K implicit GEMM;
    dw and db contiguous. dy_pad: the input gradient's window copy of dy (_window_gemm's keep),
    which the window form reads instead of copying dy again.

    Each split writes float32 partial tiles to a workspace [S, Co, C, kh, kw], and
    _channel_sum_kernel db's partials (over splits of their own) to another; one launch of
    fixed-order sums then writes both. With one split the kernel writes dw itself and db is
    _bias_grad's. The batch-inner form takes db's partials from its copy of dy instead, the
    window form from programs of its own launch (_window_db_part), with or without splits. (3x3
    layers at float32 accuracy with many channels and enough tiles: Winograd's form instead,
    see _winograd.)"""
    co, c = dy.shape[1], x.shape[1]
    tiles, sms = g.n * cdiv(g.h, 4) * cdiv(g.w, 4), _sm_count(x.device)
    if _winograd(g, c, co, x.dtype) and tiles >= WINOGRAD_WGRAD_MIN_TILES and \
            (winograd.weight_grad_fills(tiles, c, co, sms) or not WINOGRAD_WGRAD_FILL):
        chunks = _winograd_chunks(g, c, co)
        if len(chunks) == 1:
            winograd.weight_grad(dy, x, dw, db, sms)
            return
        # one dw (and db) a chunk of images, then their sums in a fixed order
        part = empty((len(chunks), co, c * 9), torch.float32, x.device)
        part_db = empty((len(chunks), 1, co), torch.float32, x.device)
        for k, (i, j) in enumerate(chunks):
            winograd.weight_grad(dy[i:j], x[i:j], part[k].view(co, c, 3, 3),
                                 None if db is None else part_db[k, 0], sms)
        _sum_splits(part, dw.view(co, c * 9))
        if db is not None:
            _sum_splits(part_db, db.view(1, co))
        return
    k_total = c * g.kh * g.kw
    precision = _precision(x.dtype)
    presplit = precision == "tf32x3" and DW_PRESPLIT
    inner = _batch_inner(g, x, presplit)
    window = not inner and _window_wgrad(g, dy, x)
    shift, use_tma = (False, False) if window or inner else _flat_shift(g, dy, x)
    channel_inner = c >= CHANNEL_INNER_MIN or inner  # (always where window)
    block_m = _block(co)
    # the flat shift's tiles: columns of one tap where C fills a tile's worth (tiles spanning
    # taps, with a shift and a wrap test per row, measured 1.2-1.3x slower at 32 and 64
    # channels, H100); of several where C is small (MNIST conv1: 2.2x faster than the implicit
    # kernel, all 25 taps in one tile)
    spans = shift and c < SHIFT_TAPS_BELOW
    by_tap = not spans if shift else channel_inner  # (else columns of the flat (c, i, j))
    block_n = _block(c) if by_tap else _block(k_total)
    tiles = cdiv(co, block_m) * (g.kh * g.kw * cdiv(c, block_n) if by_tap
                                 else cdiv(k_total, block_n))
    pixels = g.n * g.oh * g.ow
    # NOTE: db by its own programs, not summed in the GEMM's loop: that read each dy tile from
    # shared memory into registers beside wgmma and cost 6-98 us at the ResNet-style layers
    # (28x28 TF32: 549 -> 451 us; 14x14 bf16: 241 -> 195; H200, notes/PERF.md, session 21)
    # The batch-inner form's copy of dy sums it too: db is the fixed-order sum of those
    # partials, not a pass of its own (TF32 dw + db at 28x28: 535 -> 488 us, 14x14: 442 ->
    # 419, H100). The window form's launch has programs of its own that sum its copy of dy,
    # on the SMs its GEMM leaves free (a pass of its own cost 10-34 us at 14x14-56x56 bf16;
    # summed as the copy is written, more: its tiles are one image's, notes/PERF.md, session 22)
    db_in_copy = db is not None and inner
    db_programs = 0
    if window and db is not None:
        _, plane, _ = _window_plane(g, False)
        db_programs = _window_db_programs(g.n * plane[0] * plane[1], _round_up(co, 16),
                                          dy.element_size(), dy.device)
    splits = _wgrad_splits(tiles, pixels, dy.device, db_programs)
    db_part = None  # db's partials [rows, Co], summed beside dw's
    if db_programs:
        db_part = empty((db_programs, co), torch.float32, dw.device)
    if splits == 1:
        part = dw.unsqueeze(0)
        if db is not None and not db_in_copy and not db_programs:
            _bias_grad(dy, db)
    else:
        part = empty((splits, *dw.shape), torch.float32, dw.device)
        if db is not None and not db_in_copy and not db_programs:  # (splits of their own)
            db_part = _channel_sums(dy)
    kind = _menu_kind(precision, x.dtype)
    lo_dy = lo_x = 0
    planes = use_tma and not spans and _use_shifted_planes(g, x, presplit)
    wp, hp = g.w, g.h
    if inner:  # x and dy batch-inner (x's heads and tails where presplit): every tile TMA
        hp, wp, nb = g.h + g.kh - 1, g.w + g.kw - 1, _round_up(g.n, 4)
        x, lo_x, _ = _batch_inner_copy(x, hp, wp, nb, g.ph, g.pw, presplit)
        dy, _, sums = _batch_inner_copy(dy, g.h, wp, nb, 0, 0, False, db_in_copy)
        db_part = sums if db_in_copy else db_part
    elif planes:  # x as KW shifted planes of pitch wp (and dy on that pitch): every tile TMA
        wp, hp = _round_up(g.w, 4), g.h + g.kh - 1
        x, lo_x = _shifted_planes(x, g.kw, g.ph, g.pw, hp, wp, presplit)
        if wp != g.w or presplit:
            dy, lo_dy = _shifted_planes(dy, 1, 0, 0, g.h, wp, presplit)
    elif presplit:  # heads and tails: one memory-bound pass over each operand
        dy, lo_dy = _split_tf32(dy), dy.numel()
        x, lo_x = _split_tf32(x), x.numel()
    if inner:
        key = (f"batchw:{g.n}x{co}x{c}:{g.h}x{g.w}:k{g.kh}x{g.kw}:{precision}"
               f"{'-xsplit' if presplit else ''}:split{splits}")
        _run_tuned(_batch_inner_wgrad_kernel, _shift_wgrad_configs(block_m, block_n, kind), key,
                   lambda meta: (tiles, splits), (
            dy, x, part, co, c, g.h * wp * nb, hp * wp * nb, wp, nb, g.kh, g.kw,
            *part.stride(), lo_x), dict(PRESPLIT=presplit), x.device)
    elif window:
        corner, plane, _ = _window_plane(g, False)
        x_copy = x, corner, plane, _round_up(c, 16)
        if dy_pad is not None and dy_pad[2] == plane and dy_pad[0].shape[-1] == _round_up(co, 16):
            # the input gradient's copy: the same plane (stride 1), dy at corner (i, j)
            # instead of (0, 0), so dy_grid's pixel p is its row p + i*WP + j, and the rows
            # shifted in from the next image (or past the end) are its zeros: one copy less
            # (256x256x14x14 bf16: 19 of 39 us, H100)
            (x_pad,), dy_grid = _padded_channels_last(x_copy), dy_pad[0]
            dy_shift = dy_pad[1][0] * plane[1] + dy_pad[1][1]
        else:
            x_pad, dy_grid = _padded_channels_last(x_copy, (dy, (0, 0), plane, _round_up(co, 16)))
            dy_shift = 0
        key = (f"windoww:{g.n}x{co}x{c}:{plane[0]}x{plane[1]}->{g.oh}x{g.ow}:k{g.kh}x{g.kw}:"
               f"d{g.dh}{g.dw}:{kind}:{str(x.dtype)[6:]}:split{splits}")
        db_out = db_part if db_programs else part
        db_cols = min(next_power_of_2(co), 128)
        _run_tuned(_window_wgrad_kernel, _window_wgrad_configs(block_m, block_n), key,
                   lambda meta: (db_programs + tiles * splits,), (
            dy_grid, x_pad, part, db_out, g.n * plane[0] * plane[1], dy_grid.shape[-1],
            x_pad.shape[-1], co, c, plane[1], g.kh, g.kw, g.dh, g.dw, dy_shift, db_programs,
            *part.stride(), db_out.stride(0), db_out.stride(-1)),
            dict(DOT_FP32=_dot_fp32(x.dtype), DB_ROWS=max(1, 4096 // db_cols),
                 DB_COLS=db_cols), x.device)
    elif shift:
        key = (f"shiftw:{g.n}x{co}x{c}:{g.h}x{g.w}:k{g.kh}x{g.kw}:{precision}"
               f"{'-split' if presplit else ''}:{kind}:{str(x.dtype)[6:]}:split{splits}:"
               f"{'tma' if use_tma else 'ptr'}{'-planes' if planes else ''}:cols{block_n}")
        _run_tuned(_shift_wgrad_kernel, _shift_wgrad_configs(block_m, block_n, kind), key,
                   lambda meta: (tiles, splits), (
            dy, x, part, g.n, co, c, g.h, g.w, g.kh, g.kw, g.ph, g.pw, wp, hp, *part.stride(),
            lo_dy, lo_x),
            dict(PRESPLIT=presplit, USE_TMA=use_tma,
                 ONE_TAP=not spans, X_TMA=planes, INPUT_PRECISION="tf32" if presplit else precision,
                 DOT_FP32=_dot_fp32(x.dtype)), x.device)
    else:
        key = (f"wgrad:{g.n}x{co}x{c}:{g.h}x{g.w}->{g.oh}x{g.ow}:k{g.kh}x{g.kw}:s{g.sh}:"
               f"{precision}{'-split' if presplit else ''}:{kind}:{str(x.dtype)[6:]}:"
               f"split{splits}")
        _run_tuned(_conv_wgrad_kernel,
                   _wgrad_configs(block_m, block_n, next_power_of_2(g.ow), kind), key,
                   lambda meta: (tiles, splits), (
            dy, x, part, g.n, co, c, g.h, g.w, g.oh, g.ow, g.kh, g.kw,
            *dy.stride(), *x.stride(), *part.stride(), lo_dy, lo_x, *g.args),
            dict(CHANNEL_INNER=channel_inner, PRESPLIT=presplit,
                 INPUT_PRECISION="tf32" if presplit else precision,
                 DOT_FP32=_dot_fp32(x.dtype)), x.device)
    # dw's and db's partials: one launch of fixed-order sums
    db_sum = (db_part[:, None], db.view(1, co)) if db_part is not None else (None, None)
    if splits > 1:
        _sum_splits(part.view(splits, 1, -1), dw.view(1, -1), *db_sum)
    elif db_part is not None:
        _sum_splits(*db_sum)


def _use_shifted_planes(g, x, presplit):
    """Whether the flat-shift weight gradient (one-tap tiles, dy through TMA) reads x as
    shifted planes (_shifted_planes): SHIFT_PLANES, float32 (half types take the window form),
    planes of at most SHIFT_PLANES_MAX_PIXELS, 3xTF32 or at least SHIFT_PLANES_MIN_CHANNELS
    channels, the planes' memory at most SHIFT_PLANES_MAX_BYTES.

    The rule is the H100 sweep's (benchmarks/sweep_conv.py --shift, 2026-11-24; ms, masked
    loads -> planes): 14x14 k3 at 256 channels 0.614 -> 0.553 (TF32), 1.356 -> 1.052
    (3xTF32); MNIST conv2 3xTF32 0.110 -> 0.098, TF32 0.061 -> 0.064 (32 channels: x's tile
    is the small one); 28x28 and 56x56 TF32 0.50 -> 0.74 and 0.67 -> 1.20: kw copies of a
    large plane cost more than the masks they save."""
    size = g.kw * g.n * g.c * (g.h + g.kh - 1) * _round_up(g.w, 4) * 4 * (1 + int(presplit))
    return SHIFT_PLANES and x.dtype == torch.float32 and \
        (presplit or g.c >= SHIFT_PLANES_MIN_CHANNELS) and \
        g.h * g.w <= SHIFT_PLANES_MAX_PIXELS and size <= SHIFT_PLANES_MAX_BYTES


def _shifted_planes(t, kw, top, left, hp, wp, split):
    """t [N, C, H, W] (any strides) as kw planes [N*C, hp, wp], plane j shifted left by
    j - left columns and down by top rows, zero where that leaves t or past column W
    (_shifted_planes_kernel). Returns (the contiguous [kw, N*C, hp, wp] buffer, the elements
    from it to the tails: split (float32) makes it TF32 heads, tails one buffer further on)."""
    n, c, h, w = t.shape
    out = empty((1 + int(split), kw, n * c, hp, wp), t.dtype, t.device)
    rows = kw * n * c * hp
    if rows:
        block_w = next_power_of_2(wp)
        block_r = max(1, (4096 if not INTERPRET else 16384) // block_w)
        run(_shifted_planes_kernel, (cdiv(rows, block_r),), t, out, rows, n * c, c, h, w, hp,
            wp, top, left, out[0].numel(), *t.stride(), SPLIT=split, BLOCK_R=block_r,
            BLOCK_W=block_w, num_warps=4)
    return out, out[0].numel()


def _split_tf32(t):
    """t [N, C, H, W] (float32, any strides) -> the [N, C, H, W] TF32 heads, contiguous, whose
    tails follow them in the same buffer (t.numel() elements further on)."""
    out = empty((2,) + tuple(t.shape), torch.float32, t.device)
    total = t.numel()
    if total == 0:
        return out[0]
    block = 1024 if not INTERPRET else 4096
    run(_split_tf32_kernel, (cdiv(total, block),), t, out, total, *t.shape[1:], *t.stride(),
        INDEX_64=2 * total + block >= 2 ** 31, BLOCK=block, num_warps=4)
    return out[0]


def _sum_blocks(splits, elements, device):
    """(BLOCK_S, BLOCK) of a fixed-order sum of `splits` partials of `elements` values. Many
    splits of a small output (conv1's weight gradient: 264 x 832) are summed as tiles, BLOCK_S
    splits a load, over enough programs to keep the SMs busy; with few programs (a small
    output) a tile takes up to 8192 elements, so that each program loads its splits in one or
    two steps, not one dependent load after another; and as few as 8 columns, so that the
    programs are many (conv1's dw + db, 264 splits of 832: 4.5 us in 26 programs of 32
    columns, 2.4 in 104 of 8, H100)."""
    if INTERPRET:
        return min(16, next_power_of_2(splits)), 4096
    block_s = min(32, next_power_of_2(splits))
    block = max(8, min(4096 // block_s, next_power_of_2(cdiv(elements, 2 * _sm_count(device)))))
    return min(next_power_of_2(splits), max(block_s, 8192 // block)), block


def _sum_splits(part, out, part2=None, out2=None):
    """out [R, K] = sum over the leading axis of part [S, R, K] (any strides), fixed order;
    with part2 [S2, R2, K2] and out2 [R2, K2] (any strides) the same for them, in the same
    launch (a weight gradient's splits and its bias gradient's)."""
    def job(p, o):  # (kernel arguments, programs, blocks) of one sum; None: nothing to sum
        s, rows, cols = p.shape
        if rows * cols == 0:
            return None
        block_s, block = _sum_blocks(s, rows * cols, o.device)
        return (p, o, s, rows, cols, *p.stride(), *o.stride()), cdiv(rows * cols, block), \
            (block_s, block)

    first = job(part, out)
    second = job(part2, out2) if part2 is not None else None
    if first is None:
        first, second = second, None
    if first is None:
        return out
    (args, programs, (block_s, block)), (args2, programs2, (block_s2, block2)) = \
        first, second or (first[0], 0, (1, 32))
    run(_sum_splits_kernel, (programs + programs2,), *args, *args2, programs2,
        BLOCK_S=block_s, BLOCK=block, BLOCK_S2=block_s2, BLOCK2=block2, num_warps=4)
    return out


def _channel_sum_blocks(n, co, plane, device):
    """(splits, BLOCK_C, BLOCK_N, BLOCK_E) of _channel_sum_kernel over dy [n, co, plane]:
    about CHANNEL_SUM_TILE elements a load; several channels a program only while their run
    stays within CHANNEL_SUM_RUN (short planes: the tile's rows then still fill it, and the
    per-channel sums at the end stay few); images split for CHANNEL_SUM_PROGRAMS programs an
    SM, and into splits of at most CHANNEL_SUM_LOADS loads where a plane allows. It is
    memory-bound: every SM streaming, each program few dependent loads (256x256x14x14 bf16:
    896 programs of five loads took 13-16 us; its 25.7 MB take 5.4 at 4.8 TB/s)."""
    target = CHANNEL_SUM_PROGRAMS * _sm_count(device)
    block_c = 1
    while block_c < min(32, co) and 2 * block_c * plane <= CHANNEL_SUM_RUN and \
            cdiv(co, 2 * block_c) * n >= target:
        block_c *= 2
    block_e = min(next_power_of_2(block_c * plane), CHANNEL_SUM_TILE)
    block_n = max(1, CHANNEL_SUM_TILE // block_e)
    steps = cdiv(block_c * plane, block_e)  # loads an image (of one block of channels)
    loads = block_n * max(1, CHANNEL_SUM_LOADS // steps)  # images a split of that many loads
    splits = max(1, min(n, max(cdiv(target, cdiv(co, block_c)), cdiv(n, loads))))
    return splits, block_c, block_n, block_e


def _channel_sums(dy, out=None):
    """out [S, Co] (float32, any strides) = the partial sums of dy [N, Co, Ho, Wo] over S
    splits of its images (_channel_sum_kernel); S = out.shape[0], or without `out` as many
    as _channel_sum_blocks asks for (a new buffer)."""
    n, co, oh, ow = dy.shape
    splits, block_c, block_n, block_e = _channel_sum_blocks(n, co, oh * ow, dy.device)
    if out is None:
        out = empty((splits, co), torch.float32, dy.device)
    flat = dy.stride(3) == 1 and dy.stride(2) == ow and dy.stride(1) == oh * ow
    run(_channel_sum_kernel, (cdiv(co, block_c), out.shape[0]), dy, out, n, co, ow, oh * ow,
        *dy.stride(), *out.stride(), FLAT=flat, BLOCK_C=block_c, BLOCK_N=block_n,
        BLOCK_E=block_e, num_warps=4)
    return out


def _bias_grad(dy, db):
    """db [Co] = sum of dy over (N, Ho, Wo): partial sums over splits of the images, enough
    to keep every SM reading, then their fixed-order sum (_channel_sums, _sum_splits)."""
    if dy.shape[1] == 0:
        return db
    part = _channel_sums(dy)
    _sum_splits(part[:, None], db.view(1, -1))
    return db


def _matmul():
    """Our matmul, at the convolution's precision (conv_precision(), not matmul_precision())."""
    try:
        from .matmul import matmul
    except ImportError as err:
        raise RuntimeError("conv2d: the im2col path needs tritonad.kernels.matmul, which is "
                           f"not available ({err}); set conv.CONV_ALGO = 'implicit'") from err
    return functools.partial(matmul, precision=conv_precision())


def _have_matmul():
    try:
        from .matmul import matmul  # noqa: F401
    except ImportError:
        return False
    return True


def _algorithm(direction, g):
    """Which path runs `direction` ("forward", "input", "weight") of convolution g.

    auto: implicit GEMM everywhere (no column buffer, fused bias, split-K weight gradient),
    except the input gradient of a layer with fewer than 8 input channels per group: its GEMM
    has M = C_in rows, which a tensor-core tile (>= 16 rows) would mostly waste, while
    matmul(W^T, dY) has M = C_in*kh*kw and col2im then sums the columns cheaply."""
    algo = CONV_ALGO
    if algo not in _ALGOS:
        raise ValueError(f"conv2d: CONV_ALGO must be one of {_ALGOS}, got {algo!r}")
    if g.groups > 1:
        return "implicit"  # the im2col path handles groups=1 only
    if algo == "auto":
        small = direction == "input" and g.c < 8
        return "im2col" if small and _have_matmul() else "implicit"
    return algo


def _im2col_buffer(x, g, ones_row):
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


def _col2im_into(cols, out, g):
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
    g = _Geometry("conv2d", t.shape, (1, c, 1, 1), 1, 0, 1, 1)
    return _im2col_buffer(t, g, False)


# ---------------------------------------------------------------------------- primitives


def _settings():
    return conv_precision(), CONV_ALGO, DW_SPLIT, CHANNEL_INNER_MIN, autotuning(), \
        PACK_WEIGHTS, CHANNELS_LAST, DW_PRESPLIT, FLAT_SHIFT, SHIFT_TMA, SHIFT_TAPS_BELOW, \
        SHIFT_MIN_CHANNELS, SHIFT_PLANES, SHIFT_PLANES_MAX_PIXELS, SHIFT_PLANES_MIN_CHANNELS, \
        SHIFT_PLANES_MAX_BYTES, WINDOW_GEMM, WINDOW_WASTE, WINDOW_PRESPLIT, WINDOW_X3_MIN, \
        BATCH_INNER, BATCH_INNER_MIN_CHANNELS, BATCH_INNER_MAX_PIXELS, BATCH_INNER_MAX_BYTES, \
        WINDOW_WGRAD, WINDOW_DB_BYTES, WINDOW_DB_MIN, WINDOW_DB_PROGRAMS, WINOGRAD, \
        WINOGRAD_MIN_CHANNELS, WINOGRAD_MAX_BYTES, WINOGRAD_WGRAD_MIN_TILES, WINOGRAD_WGRAD_FILL, \
        winograd.settings()


@planned(settings=_settings, arrays=3)
def conv2d(x, w, bias=None, stride=(1, 1), padding=(0, 0), dilation=(1, 1), groups=1,
           activation=None):
    """y = conv(x, w) + bias, cross-correlation as torch (then relu in the same kernel if
    activation="relu"). x: [N, C, H, W], w: [Co, C // groups, kh, kw], bias: [Co] or None ->
    y: [N, Co, Ho, Wo]."""
    g = _Geometry("conv2d", x.shape, w.shape, stride, padding, dilation, groups)
    _check_float("conv2d", x, w, bias)
    if activation not in (None, "relu"):
        raise ValueError(f"conv2d: unknown activation {activation!r} (None or 'relu')")
    if bias is not None and tuple(bias.shape) != (g.co,):
        raise ValueError(f"conv2d: bias {tuple(bias.shape)} does not match weight "
                         f"{tuple(w.shape)} ({g.co} output channels)")
    y = empty((g.n, g.co, g.oh, g.ow), x.dtype, x.device)
    if y.numel() == 0:
        return y
    if _algorithm("forward", g) == "im2col":
        cols = _im2col_buffer(x, g, ones_row=bias is not None)
        wmat = _packed_weight(w, bias)
        out = _matmul()(wmat.unsqueeze(0).expand(g.n, *wmat.shape), cols, activation=activation)
        return out.view(g.n, g.co, g.oh, g.ow)
    cg, cog = g.c // g.groups, g.co // g.groups
    for k in range(g.groups):
        _implicit_gemm(x[:, k * cg:(k + 1) * cg], w[k * cog:(k + 1) * cog],
                       None if bias is None else bias[k * cog:(k + 1) * cog],
                       y[:, k * cog:(k + 1) * cog], g, transposed=False,
                       relu=activation == "relu")
    return y


@planned(settings=_settings, arrays=3)
def conv2d_backward(dy, x, w, stride=(1, 1), padding=(0, 0), dilation=(1, 1), groups=1,
                    input_grad=True, weight_grad=True, bias_grad=True, gate=None, dw_out=None,
                    db_out=None):
    """(dx [N, C, H, W], dw [Co, C // groups, kh, kw], db [Co]) of conv2d for dy [N, Co, Ho, Wo];
    an entry is None when not asked for. gate (dy's shape; the output of a conv2d with
    activation="relu"): dy is taken as where(gate > 0, dy, 0), relu's backward. dw_out, db_out:
    contiguous arrays of w's dtype to write dw and db into (an optimizer's gradient buffer)."""
    g = _Geometry("conv2d_backward", x.shape, w.shape, stride, padding, dilation, groups)
    _check_float("conv2d_backward", dy, x, w)
    if tuple(dy.shape) != (g.n, g.co, g.oh, g.ow):
        raise ValueError(f"conv2d_backward: dy {tuple(dy.shape)} does not match the output "
                         f"{(g.n, g.co, g.oh, g.ow)} of input {tuple(x.shape)} and weight "
                         f"{tuple(w.shape)}")
    if gate is not None:
        if tuple(gate.shape) != tuple(dy.shape) or gate.dtype != dy.dtype:
            raise ValueError(f"conv2d_backward: gate {tuple(gate.shape)} {dtype_of(gate).name} "
                             f"does not match dy {tuple(dy.shape)} {dtype_of(dy).name}")
        # NOTE: one pass, read by every kernel after. Applied as the kernels read dy, the
        # gate's loads cost more than this pass in these gather-bound kernels (conv1's
        # implicit weight gradient on an H200: 44 us with the gate in its reads against
        # 26 + 7 us; a direct FMA kernel that read dy once as plain tiles: 34 + 10 us)
        # (notes/PERF.md, session 9)
        from .elementwise import relu_backward
        dy = relu_backward(dy, gate)
    dx = empty(x.shape, x.dtype, x.device) if input_grad else None
    dw, db = _weight_grad_outputs(w, g.co, weight_grad, bias_grad, dw_out, db_out)
    cg, cog = g.c // g.groups, g.co // g.groups
    # what the input gradient leaves the weight gradient (its copy of dy: _window_gemm)
    kept = [{} if dw is not None and dw.numel() else None for _ in range(g.groups)]
    if dx is not None and dx.numel():
        if _algorithm("input", g) == "im2col":
            wmat = _packed_weight(w, None).t()                       # [C*kh*kw, Co]
            dcols = _matmul()(wmat.unsqueeze(0).expand(g.n, *wmat.shape), _flat_pixels(dy))
            _col2im_into(dcols, dx, g)
            del dcols
        else:
            for k in range(g.groups):
                _implicit_gemm(dy[:, k * cog:(k + 1) * cog], w[k * cog:(k + 1) * cog], None,
                               dx[:, k * cg:(k + 1) * cg], g, transposed=True, keep=kept[k])
    if (dw is None or dw.numel() == 0) and (db is None or db.numel() == 0):
        return dx, dw, db
    if dw is not None and dw.numel() and _algorithm("weight", g) == "im2col":
        cols = _im2col_buffer(x, g, ones_row=db is not None)         # [N, K (+1), L]
        part = _matmul()(_flat_pixels(dy), cols.transpose(1, 2))     # [N, Co, K (+1)]
        del cols
        k_total = g.c * g.kh * g.kw
        _sum_splits(part[:, :, :k_total], dw.view(g.co, k_total))
        if db is not None:
            _sum_splits(part[:, :, k_total:], db.view(g.co, 1))
    elif dw is None or dw.numel() == 0:
        if db is not None:
            _bias_grad(dy, db)
    else:
        for k in range(g.groups):
            _implicit_wgrad(dy[:, k * cog:(k + 1) * cog], x[:, k * cg:(k + 1) * cg],
                            dw[k * cog:(k + 1) * cog],
                            None if db is None else db[k * cog:(k + 1) * cog], g,
                            kept[k].get("dy"))
    return dx, dw, db


def _weight_grad_outputs(w, co, weight_grad, bias_grad, dw_out, db_out):
    """(dw, db) for conv2d_backward: the given outputs (checked) or new arrays; None where not
    asked for."""
    check_weight_grad_outputs("conv2d_backward", w, dw_out, db_out)
    dw = (dw_out if dw_out is not None else empty(w.shape, w.dtype, w.device)) \
        if weight_grad else None
    db = (db_out if db_out is not None else empty((co,), w.dtype, w.device)) \
        if bias_grad else None
    return dw, db


@planned()
def im2col(x, kernel_size, stride=(1, 1), padding=(0, 0), dilation=(1, 1)):
    """Sliding windows as columns (torch's unfold).
    x: [N, C, H, W] -> [N, C*kh*kw, Ho*Wo], rows ordered (c, i, j)."""
    if x.dim() != 4:
        raise ValueError(f"im2col: expected x [N, C, H, W], got {tuple(x.shape)}")
    kh, kw = _pair("im2col", "kernel_size", kernel_size, 1)
    g = _Geometry("im2col", x.shape, (1, x.shape[1], kh, kw), stride, padding, dilation, 1)
    if x.numel() == 0:
        return empty((g.n, g.c * kh * kw, g.oh * g.ow), x.dtype, x.device)
    return _im2col_buffer(x, g, ones_row=False)


@planned()
def col2im(cols, output_size, kernel_size, stride=(1, 1), padding=(0, 0), dilation=(1, 1)):
    """The adjoint of im2col (torch's fold): overlapping windows are summed.
    cols: [N, C*kh*kw, L] -> [N, C, H, W], (H, W) = output_size."""
    kh, kw = _pair("col2im", "kernel_size", kernel_size, 1)
    h, w = _pair("col2im", "output_size", output_size, 1)
    if cols.dim() != 3 or cols.shape[1] % (kh * kw):
        raise ValueError(f"col2im: columns {tuple(cols.shape)} are not [N, C*{kh}*{kw}, L]")
    _check_float("col2im", cols, allow_f64=True)
    n, c = cols.shape[0], cols.shape[1] // (kh * kw)
    g = _Geometry("col2im", (n, c, h, w), (1, c, kh, kw), stride, padding, dilation, 1)
    if cols.shape[2] != g.oh * g.ow:
        raise ValueError(f"col2im: columns {tuple(cols.shape)} need L = {g.oh}*{g.ow} windows for "
                         f"output_size {(h, w)}, kernel {(kh, kw)}, stride {(g.sh, g.sw)}, "
                         f"padding {(g.ph, g.pw)}, dilation {(g.dh, g.dw)}")
    out = empty((n, c, h, w), cols.dtype, cols.device)
    return _col2im_into(cols, out, g) if out.numel() else out
