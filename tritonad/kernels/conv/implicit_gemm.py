"""Implicit GEMM: every direction as one matrix product whose gathered ("im2col") operand is
built tile by tile inside the K loop, with no column buffer. The forward and the input gradient
share one kernel (TRANSPOSED: the input gradient as a transposed convolution written as a
gather, so every dx element is owned by one program and nothing races); the weight gradient
splits its long K = N*Ho*Wo over programs, whose partial tiles sums.sum_splits adds in a fixed
order (deterministic, no atomics).

When it applies: any convolution (every stride, padding, dilation, group count, dtype and
precision); routing.py sends the others (Winograd, the window GEMM, the batch-inner and
flat-shift weight gradients) where they are faster, and keeps this for the rest.

GEMM orientation (what makes these kernels fast on Hopper):
- forward / input gradient: acc[pixels, out channels] = X_col^T[pixels, K] @ W^T[K, channels].
  Pixels are M (thousands: enough programs), the gathered tile is the A operand and the weights
  the B operand. The weights are first copied K-major ([Co, kh, kw, C] for the forward,
  [C, kh, kw, Co] for dx; Settings.pack_weights), so B loads are 16-byte vectors and tf32 /
  half dots lower to wgmma. Settings.channels_last also copies the gathered source to NHWC so
  that A loads are vectors too (a copy pass of the activations; measured by
  benchmarks/sweep_conv.py).
- weight gradient: acc[Co, K columns] = dY[Co, pixels] @ X_col[pixels, K]: both operands are
  K-major (pixel-contiguous) in NCHW as they stand.
- index arithmetic: the per-pixel (n, p, q) decomposition runs once per program, outside the K
  loop; inside it a tap adds scalar offsets. The weight gradient walks its pixels in blocks of
  whole output rows of one image, so a pixel's (p, q) is a shift and a mask (BLOCK_Q, a power
  of two >= the row width), never a division per element.
Gathered tiles with C_src >= Settings.channel_inner_min walk K as (i, j) outer, channel blocks
inner ("channel-inner": the spatial offset and bounds test are per pixel, not per element);
with few channels (the MNIST input, C = 1) K is the flat (c, i, j) index so that a K = 25
problem is one 32-wide tile, not 25 mostly-empty ones.
"""
from __future__ import annotations

import triton
import triton.language as tl

from ..launch import INTERPRET, cdiv, next_power_of_2
from .common import block, dot_fp32, menu_kind, run_tuned, source_coord, split_share
from .layout import channels_last
from .settings import dot_precision
from .tf32 import split_tf32

# Spatial sizes that differ from layer to layer are not specialised (every specialisation is
# one more compilation of every autotuning config). Channel counts and strides are: a unit
# stride, strides and channel bounds divisible by 16 (packed weights, channels-last) are what
# lets the compiler prove 16-byte vector loads.
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
            y, y_ok = source_coord(base_y, i * DIL_H, DIV_H, SRC_H, TRANSPOSED)
            x, x_ok = source_coord(base_x, j * DIL_W, DIV_W, SRC_W, TRANSPOSED)
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
            y, y_ok = source_coord(base_y[:, None], (i * DIL_H)[None, :], DIV_H, SRC_H, TRANSPOSED)
            x, x_ok = source_coord(base_x[:, None], (j * DIL_W)[None, :], DIV_W, SRC_W, TRANSPOSED)
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
    # tails lie lo_dy / lo_x elements further on (tf32.split_tf32): dw = dy_lo @ x +
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
    u_lo, u_hi = split_share(N_IMG * per_image)
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
# "tf32x3" is the pre-split kernel's menu (Settings.dw_presplit; tl.dot's own tf32x3 was best at
# (16, 2, 2), 0.34 ms at conv2).
WGRAD_MENU = {
    "ieee": [(16, 4, 1), (16, 4, 2), (32, 4, 2)],
    "tf32": [(32, 4, 3), (64, 8, 3), (16, 4, 3), (32, 4, 4)],
    "tf32x3": [(16, 4, 3), (32, 8, 3), (32, 4, 3), (16, 8, 3)],
    "half": [(64, 4, 3), (64, 8, 3), (128, 8, 3), (32, 4, 3), (32, 8, 3)],  # (the 32-pixel
}  # steps: the shipped table's bf16 plans at MNIST conv2 and the 128/256-channel layers)




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



def gemm(src, w, bias, out, g, transposed, relu, precision, s):
    """Launch _conv_gemm_kernel for one group: the forward (src = x, out = y; relu: max(y, 0)
    in the epilogue) or the input gradient (src = dy, out = dx). Arrays may be strided views
    (groups slice them)."""
    if transposed:  # dx: channels n = C, reduced k = Co, gathered from dy
        n_ch, k_ch, src_hw, out_hw = w.shape[1], w.shape[0], (g.oh, g.ow), (g.h, g.w)
        mul, off, dil, div = (1, 1), (g.ph, g.pw), (-g.dh, -g.dw), (g.sh, g.sw)
        wk = w                              # [k = Co, n = C, kh, kw]
    else:
        n_ch, k_ch, src_hw, out_hw = w.shape[0], w.shape[1], (g.h, g.w), (g.oh, g.ow)
        mul, off, dil, div = (g.sh, g.sw), (-g.ph, -g.pw), (g.dh, g.dw), (1, 1)
        wk = w.permute(1, 0, 2, 3)          # [k = C, n = Co, kh, kw]
    channel_inner = k_ch >= s.channel_inner_min
    if channel_inner and s.pack_weights:
        # K-major B operand: [n, kh, kw, k] memory, so a K step's weights are vector loads
        wk = channels_last(wk.permute(1, 0, 2, 3)).permute(1, 0, 2, 3)
    if channel_inner and s.channels_last and src.stride(1) != 1:
        src = channels_last(src)            # a pixel's channels contiguous: vector gathers
    block_n = block(n_ch)
    max_k = block(k_ch, 64) if channel_inner else block(k_ch * g.kh * g.kw, 64)
    single = not channel_inner and k_ch * g.kh * g.kw <= max_k   # K fits one step
    dot = dot_precision(src.dtype, precision)
    kind = menu_kind(dot, src.dtype)
    pixels = g.n * out_hw[0] * out_hw[1]
    grid = lambda meta: (cdiv(pixels, meta["BLOCK_M"]), cdiv(n_ch, meta["BLOCK_N"]))  # noqa: E731
    key = (f"gemm:{g.n}x{k_ch}x{n_ch}:{src_hw[0]}x{src_hw[1]}->{out_hw[0]}x{out_hw[1]}:"
           f"k{g.kh}x{g.kw}:m{mul[0]}{mul[1]}d{div[0]}{div[1]}:{'t' if transposed else 'f'}:"
           f"{dot}:{kind}:{str(src.dtype)[6:]}:{'ci' if channel_inner else 'kk'}")
    # NOTE: relu stays out of the key: the same tile plans serve it
    run_tuned(_conv_gemm_kernel, _gemm_configs(block_n, max_k, single, kind), key, grid, (
        src, wk, bias if bias is not None else wk, out,
        g.n, k_ch, n_ch, src_hw[0], src_hw[1], out_hw[0], out_hw[1], g.kh, g.kw,
        *src.stride(), *wk.stride(), *out.stride(), bias.stride(0) if bias is not None else 0,
        mul[0], mul[1], off[0], off[1], dil[0], dil[1], div[0], div[1]),
        dict(HAS_BIAS=bias is not None, RELU=relu, TRANSPOSED=transposed,
             CHANNEL_INNER=channel_inner, INPUT_PRECISION=dot,
             DOT_FP32=dot_fp32(src.dtype)), src.device)


def weight_grad(dy, x, part, g, tiling, splits, dot, presplit):
    """Launch _conv_wgrad_kernel for one group: part [splits, Co, C, kh, kw] (float32 partials,
    or dw itself with one split) of dy [N, Co, Ho, Wo] and x [N, C, H, W]. tiling: (BLOCK_M,
    BLOCK_N, tiles, channel_inner) (weight_grad.py); presplit: 3xTF32 from heads and tails
    that one pass over each operand writes first."""
    block_m, block_n, tiles, channel_inner = tiling
    co, c = dy.shape[1], x.shape[1]
    kind = menu_kind(dot, x.dtype)
    lo_dy = lo_x = 0
    if presplit:  # heads and tails: one memory-bound pass over each operand
        dy, lo_dy = split_tf32(dy), dy.numel()
        x, lo_x = split_tf32(x), x.numel()
    key = (f"wgrad:{g.n}x{co}x{c}:{g.h}x{g.w}->{g.oh}x{g.ow}:k{g.kh}x{g.kw}:s{g.sh}:"
           f"{dot}{'-split' if presplit else ''}:{kind}:{str(x.dtype)[6:]}:"
           f"split{splits}")
    run_tuned(_conv_wgrad_kernel,
              _wgrad_configs(block_m, block_n, next_power_of_2(g.ow), kind), key,
              lambda meta: (tiles, splits), (
        dy, x, part, g.n, co, c, g.h, g.w, g.oh, g.ow, g.kh, g.kw,
        *dy.stride(), *x.stride(), *part.stride(), lo_dy, lo_x, *g.args),
        dict(CHANNEL_INNER=channel_inner, PRESPLIT=presplit,
             INPUT_PRECISION="tf32" if presplit else dot,
             DOT_FP32=dot_fp32(x.dtype)), x.device)
