"""The window GEMM: forward and input gradient of stride-1 convolutions on Hopper, fed by TMA,
and its weight gradient in half precision.

The gathered operand is first copied once into a zero-padded channels-last buffer
src_pad [N, HP, WP, KP] (layout.padded_channels_last), whose plane is the output's plus the
window's reach. Output pixels are then counted on the padded grid, p = (n*HP + oh)*WP + ow,
and tap (i, j) reads the row p + i*DH*WP + j*DW of the flat [N*HP*WP, KP] matrix: for a tile
of consecutive p, one rectangle, which TMA loads straight into shared memory, K-major (a
pixel's channels are contiguous), as wgmma wants it for every input type, TF32 included. No
bounds test and no gather: the padding is in memory, and a valid pixel's window never leaves
its own image. The price is the grid's pixels outside the output (ow >= OUT_W or oh >= OUT_H),
computed and dropped: HP*WP / (OUT_H*OUT_W), 1.07 at 56x56 k3, 1.31 at 14x14 k3, 1.65 at
MNIST conv2 (14x14 k5), and the copy pass. The input gradient at stride 1 is the same
computation on dy padded by the window's reach minus the padding, with the weights' taps
flipped and their channel axes swapped.

When it applies: `applies` (forward, input gradient) and `weight_grad_applies` (routing.py).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..launch import INTERPRET, cdiv, next_power_of_2
from .common import block, dot_fp32, even_share, menu_kind, round_up, run_tuned, sm_count, \
    tma_capable
from .layout import padded_channels_last
from .settings import dot_precision
from .tf32 import tf32_split

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
            a_hi, a_lo = tf32_split(a)
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


def _window_programs(rows, n_ch, sms, plan, tail_tile):
    """_window_gemm_kernel's grid for `plan` (as _window_full_tiles: one program a tile, two
    a tile of a split tail; PERSIST: at most PERSIST programs an SM, each taking tiles in
    turn)."""
    tiles = cdiv(rows, plan["BLOCK_M"]) * cdiv(n_ch, plan["BLOCK_N"])
    rest = tiles % sms if plan["BLOCK_M"] * plan["BLOCK_N"] >= tail_tile else 0
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
    # TAIL_TILE elements and up (Settings.window_tail_tile: one fills an SM): where the last wave of
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
    # same plane with dy at another corner: weight_grad), rows past ROWS zeros.
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
        lo, hi = even_share(tl.cdiv(ROWS, BLOCK_K), split,
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
    lo, hi = even_share(tl.cdiv(ROWS, DB_ROWS), part, parts)
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



# _window_gemm_kernel: (BLOCK_M grid pixels, BLOCK_N at most, K step, warps, stages[,
# PERSIST programs an SM]), best first by the H100 sweep of 2026-11-24 (benchmarks/sweep_conv.py
# --window: MNIST conv2 and the ResNet-style 3x3 layers). Above 64 output channels the
# persistent entries go first (H200, 2026-11-25, us: 256 channels at 14x14, 128x256 tiles,
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
# SM, the weights' tails from memory (Settings.window_presplit); H200, 2026-11-25, us, forward
# / input gradient, Winograd off: 256x64x56x56 776 / 791 against 816 / 831 one program a tile;
# 256x128x28x28 704 / 724 against 761 / 729 for 128x128 tiles with 8 warps; 256x256x14x14
# 713 / 729 against 742 / 713. MNIST conv2's input gradient: 66 against 64 one a tile.)



def configs(n_ch, max_k, kind):
    """Configs for _window_gemm_kernel: the pixels per tile, the output channels' block (the
    smallest power of two >= 16 covering them, at most the entry's cap), the K step (at most
    the reduced channels' block), warps and stages are tuned."""
    if INTERPRET:
        return [triton.Config({"BLOCK_M": 64, "BLOCK_N": block(n_ch), "BLOCK_K": min(32, max_k)},
                              num_warps=4, num_stages=1)]
    menu = [entry + (0,) * (6 - len(entry)) for entry in WINDOW_MENU[kind]]
    if n_ch > 64 and kind != "tf32x3":
        # persistent, wide tiles first: 256 columns from 256 channels, else 128
        menu = sorted(menu, key=lambda e: (n_ch >= 256 and e[1] < 256, e[1] < 128, not e[5]))
    configs = {}
    for bm, bn, bk, warps, stages, persist in menu:
        bn, bk = block(n_ch, bn), min(bk, max_k)
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
# test_gpu_window_weight_grad_menu checks for every entry. The H200's best on 2026-11-25 (dw +
# db, us): 256x64x56x56 (64, 4, 6) 281 against (128, 4, 3) 296; 14x14 and 28x28 (64, 8, 3),
# 207-210 against (32, 8, 4) 209-211 (14x14) and 246 against 248 (28x28). Tiles of 128 take
# WINDOW_WGRAD_WIDE_FIRST first (H200, 2026-11-25, with db's programs in the launch: bf16 and
# fp16 alike, 14x14 193 us against 209 for (128, 8, 3), 28x28 224-227 against 230-232).
WINDOW_WGRAD_MENU = [(128, 4, 3), (64, 4, 4), (128, 8, 3), (32, 4, 4), (64, 4, 6), (64, 8, 3)]
WINDOW_WGRAD_WIDE_FIRST = (64, 8, 3)


def weight_grad_configs(block_m, block_n):
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



def applies(g, src, transposed, precision, s):
    """Whether the forward (or, transposed, the input gradient) of convolution g runs as
    _window_gemm_kernel: stride 1, at least s.channel_inner_min reduced channels
    (s.window_x3_min at float32 accuracy), TF32, 3xTF32 or half precision (not IEEE FMA),
    padding within the window's reach, a padded plane at most s.window_waste times the
    output's (plane), and a GPU whose TMA reads any row (Hopper; the interpreter runs it
    too)."""
    dot = dot_precision(src.dtype, precision)
    if not (s.window_gemm and (g.sh, g.sw) == (1, 1)) or dot == "ieee":
        return False
    reach = (g.dh * (g.kh - 1), g.dw * (g.kw - 1))
    least = s.window_x3_min if dot == "tf32x3" else s.channel_inner_min
    if src.shape[1] < least or g.ph > reach[0] or g.pw > reach[1]:
        return False
    side, padded, out_hw = plane(g, transposed)
    if padded[0] * padded[1] > s.window_waste * out_hw[0] * out_hw[1]:
        return False
    return INTERPRET or tma_capable(src.device)


def weight_grad_applies(g, dy, x, precision, s):
    """Whether the weight gradient of convolution g runs as _window_wgrad_kernel: where the
    forward would run as the window GEMM (applies), in half precision (wgmma reads the
    channel-contiguous tiles as M- and N-major operands, which it does for 16-bit types
    only), with at least s.channel_inner_min output channels."""
    return x.dtype in (torch.float16, torch.bfloat16) and dy.shape[1] >= s.channel_inner_min \
        and s.window_wgrad and applies(g, x, False, precision, s)


def plane(g, transposed):
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


def gemm(src, w, bias, out, g, transposed, relu, precision, s, keep=None):
    """Launch _window_gemm_kernel for one group (where `applies`): the forward (src = x,
    out = y) or the input gradient (src = dy, out = dx; keep, a dict: its padded copy of dy,
    corner and plane go to keep["dy"], for the weight gradient after it)."""
    # dx: dy padded by the reach less the padding, times the weights [C, Co, kh, kw] flipped
    wk = w.permute(1, 0, 2, 3) if transposed else w
    n_ch, k_ch = wk.shape[0], wk.shape[1]
    corner, padded, out_hw = plane(g, transposed)
    dot = dot_precision(src.dtype, precision)
    presplit = dot == "tf32x3" and s.window_presplit  # (the weights)
    kind = menu_kind(dot, src.dtype)
    kp, wk_ch = round_up(k_ch, 16), round_up(k_ch, 64)  # (16-byte rows; no step over taps)
    copies = (src, corner, padded, kp), (wk, (0, 0), (g.kh, g.kw), wk_ch, transposed)
    cuts = (False, presplit)
    if not transposed:  # one launch for both (~1.5 us less on a graph's chain)
        a, b = padded_channels_last(*copies, split=cuts)
    else:
        # NOTE: two launches. In the MNIST cnn's captured step the input gradient's GEMM then
        # starts after the weight gradient beside it, and the two share the GPU to the end;
        # with one launch it started first and took most of the GPU, and conv1's weight
        # gradient after it had to share with conv2's: 206.7 us a step against 202.4 (H200)
        (a,), (b,) = (padded_channels_last(c, split=cut) for c, cut in zip(copies, cuts))
        if keep is not None:
            keep["dy"] = a, corner, padded
    rows, sms = g.n * padded[0] * padded[1], sm_count(src.device)
    key = (f"window:{g.n}x{k_ch}x{n_ch}:{padded[0]}x{padded[1]}->{out_hw[0]}x{out_hw[1]}:"
           f"k{g.kh}x{g.kw}:d{g.dh}{g.dw}:{dot}{'-wsplit' if presplit else ''}:{kind}:"
           f"{str(src.dtype)[6:]}")
    tail_tile = s.window_tail_tile
    run_tuned(_window_gemm_kernel, configs(n_ch, block(k_ch, 64), kind), key,
              lambda plan: _window_programs(rows, n_ch, sms, plan, tail_tile), (
        a, b, bias if bias is not None else b, out,
        rows, kp, wk_ch, n_ch, padded[0], padded[1], out_hw[0], out_hw[1], g.kh, g.kw, g.dh,
        g.dw, *out.stride(), bias.stride(0) if bias is not None else 0,
        b[0].numel() if presplit else 0, sms),
        dict(HAS_BIAS=bias is not None, RELU=relu, PRESPLIT=presplit,
             INPUT_PRECISION="tf32" if presplit else dot,
             DOT_FP32=dot_fp32(src.dtype), TAIL_TILE=tail_tile), src.device)


def db_programs(g, co, dy, s):
    """Programs of the window weight gradient's launch that sum the bias gradient from dy's
    copy [rows, cols]: one for every s.window_db_bytes of it, at least s.window_db_min (a
    program beside the GEMM's reads ~50 GB/s: MNIST conv2's 4 MB took 40 us in 4 programs,
    its GEMM 33), at most one for two SMs (or s.window_db_programs)."""
    if s.window_db_programs is not None:
        return int(s.window_db_programs)
    _, padded, _ = plane(g, False)
    rows, cols = g.n * padded[0] * padded[1], round_up(co, 16)
    most = max(1, sm_count(dy.device) // 2)
    return min(most, max(s.window_db_min, cdiv(rows * cols * dy.element_size(),
                                                 s.window_db_bytes)))


def weight_grad(dy, x, part, db_part, g, tiling, splits, db_programs, dy_pad=None):
    """Launch _window_wgrad_kernel for one group: part [splits, Co, C, kh, kw] (float32
    partials, or dw itself with one split) of dy [N, Co, H, W] and x [N, C, H, W] (half
    types), and in the same launch, by its first db_programs programs, db's partials
    db_part [db_programs, Co]. tiling: (BLOCK_M, BLOCK_N, tiles, _) (weight_grad.py).
    dy_pad: the input gradient's padded copy of dy (gemm's keep), read instead of a copy."""
    block_m, block_n, tiles, _ = tiling
    co, c = dy.shape[1], x.shape[1]
    corner, padded, _ = plane(g, False)
    x_copy = x, corner, padded, round_up(c, 16)
    if dy_pad is not None and dy_pad[2] == padded and dy_pad[0].shape[-1] == round_up(co, 16):
        # the input gradient's copy: the same plane (stride 1), dy at corner (i, j)
        # instead of (0, 0), so dy_grid's pixel p is its row p + i*WP + j, and the rows
        # shifted in from the next image (or past the end) are its zeros: one copy less
        # (256x256x14x14 bf16: 19 of 39 us, H100)
        (x_pad,), dy_grid = padded_channels_last(x_copy), dy_pad[0]
        dy_shift = dy_pad[1][0] * padded[1] + dy_pad[1][1]
    else:
        x_pad, dy_grid = padded_channels_last(x_copy, (dy, (0, 0), padded, round_up(co, 16)))
        dy_shift = 0
    kind = menu_kind("tf32", x.dtype)  # ("half": 16-bit types only)
    key = (f"windoww:{g.n}x{co}x{c}:{padded[0]}x{padded[1]}->{g.oh}x{g.ow}:k{g.kh}x{g.kw}:"
           f"d{g.dh}{g.dw}:{kind}:{str(x.dtype)[6:]}:split{splits}")
    db_out = db_part if db_programs else part
    db_cols = min(next_power_of_2(co), 128)
    run_tuned(_window_wgrad_kernel, weight_grad_configs(block_m, block_n), key,
              lambda meta: (db_programs + tiles * splits,), (
        dy_grid, x_pad, part, db_out, g.n * padded[0] * padded[1], dy_grid.shape[-1],
        x_pad.shape[-1], co, c, padded[1], g.kh, g.kw, g.dh, g.dw, dy_shift, db_programs,
        *part.stride(), db_out.stride(0), db_out.stride(-1)),
        dict(DOT_FP32=dot_fp32(x.dtype), DB_ROWS=max(1, 4096 // db_cols),
             DB_COLS=db_cols), x.device)
