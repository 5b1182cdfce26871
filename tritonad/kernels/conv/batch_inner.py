"""The batch-inner weight gradient (float32, Hopper): stride-1, undilated, "same"-size layers
whose batch is a multiple of 4 (after padding). x and dy are first copied with the batch
innermost (_batch_inner_kernel): x_t [C, HP, WP, NB] zero-padded by the window's reach
(HP = H + KH - 1, WP = W + KW - 1, x shifted by the padding) and dy_t [Co, H, WP, NB], zero
at w >= W and n >= N. Counting the GEMM's K as k = (h*WP + w)*NB + n, tap (i, j) reads
x_t's flat k + (i*WP + j)*NB: one constant shift, a multiple of NB floats, so that every x
tile is a TMA rectangle at a 16-byte aligned column, no mask and no kw copies of x (the
flat shift's planes); both operands K-major, as TF32 wgmma needs. The dy_t columns
w >= W are zero, so what x_t holds there (the next row's start) adds nothing. The copy of dy
also sums it per channel: the bias gradient's partials.

When it applies (`applies`; routing.py asks before the window and flat-shift forms): float32
at TF32 or 3xTF32, stride 1, no dilation, output plane = input plane, from 16 input channels,
planes of at most 1024 pixels, copies within 1 GiB (Settings.batch_inner_*), on Hopper.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..launch import INTERPRET, cdiv, next_power_of_2
from ..plans import empty, run
from .common import menu_kind, round_up, run_tuned, split_share, tma_capable
from .flat_shift import configs
from .tf32 import store_split, tf32_split


@triton.jit
def _batch_inner_kernel(src_ptr, out_ptr, sums_ptr, N_IMG, C, H, W, HP, WP, NB, TOP, LEFT, lo,
                        stride_sn, stride_sc, stride_sh, stride_sw,
                        SPLIT: tl.constexpr, SUMS: tl.constexpr,
                        BLOCK_P: tl.constexpr, BLOCK_B: tl.constexpr):
    # out[c, r, q, n] = src[n, c, r - TOP, q - LEFT] where that is inside src and n < N_IMG,
    # zero elsewhere: src [N, C, H, W] (any strides) to contiguous [C, HP, WP, NB]. SPLIT: TF32
    # heads, tails lo elements further on (tf32.store_split). SUMS: the tile's float32 sum too, at
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
    store_split(dst, v, lo, (pos < HP * WP)[:, None] & (n < NB)[None, :], SPLIT)
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
    # copies split before); three TF32 products a step, the small ones first (as window.py's
    # _window_tile).
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
    lo, hi = split_share(tl.cdiv(K, BLOCK_K))
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for step in range(lo, hi):
        k0 = step * BLOCK_K
        a = dy_desc.load([o0, k0])
        b = x_desc.load([c0, k0 + shift])
        if PRESPLIT:
            b_lo = x_lo_desc.load([c0, k0 + shift])
            a_hi, a_lo = tf32_split(a)
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



def applies(g, x, dot, presplit, s):
    """Whether the weight gradient of convolution g runs as _batch_inner_wgrad_kernel:
    s.batch_inner, float32 at TF32 or 3xTF32 (dot), stride 1, no dilation, output plane =
    input plane, at least s.batch_inner_min_channels input channels, planes of at most
    s.batch_inner_max_pixels, copies (presplit: x's heads and tails) of at most
    s.batch_inner_max_bytes, and a GPU whose TMA reads any row (Hopper; the interpreter runs
    it too).

    The rule is the H200's (bench conv, 2026-11-24, notes/PERF.md; us, dw + db, flat shift ->
    batch-inner, cuDNN): TF32 14x14 at 256 channels 496 -> 373 (440), 28x28 at 128 490 -> 439 (475),
    MNIST conv2 54 -> 60 eager (61) but 83 -> 61 in the captured cnn step, where it runs beside
    the input gradient (the step 199.8 -> 194.1); 56x56 at 64 channels 616 -> 1075 (909): the
    copies of a large plane and 64-channel tiles cost more than the masks they save."""
    if not (s.batch_inner and x.dtype == torch.float32 and dot != "ieee" and
            (g.sh, g.sw, g.dh, g.dw) == (1, 1, 1, 1) and (g.oh, g.ow) == (g.h, g.w) and
            g.c >= s.batch_inner_min_channels and g.h * g.w <= s.batch_inner_max_pixels):
        return False
    wp, nb = g.w + g.kw - 1, round_up(g.n, 4)
    size = (g.c * (g.h + g.kh - 1) * (1 + int(presplit)) + g.co * g.h) * wp * nb * 4
    return size <= s.batch_inner_max_bytes and (INTERPRET or tma_capable(x.device))


def copy(t, hp, wp, nb, top, left, split, sums=False):
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



def weight_grad(dy, x, part, g, tiling, splits, dot, presplit, sums):
    """Launch _batch_inner_wgrad_kernel for one group: part [splits, Co, C, kh, kw] (float32
    partials, or dw itself with one split) of dy [N, Co, H, W] and x [N, C, H, W], after their
    batch-inner copies (x's heads and tails where presplit). tiling: (BLOCK_M, BLOCK_N, tiles,
    _) (weight_grad.py). Returns dy's per-channel partial sums [rows, Co] where `sums`, else
    None: the bias gradient's, summed with dw's partials."""
    block_m, block_n, tiles, _ = tiling
    co, c = dy.shape[1], x.shape[1]
    kind = menu_kind(dot, x.dtype)
    # x and dy batch-inner (x's heads and tails where presplit): every tile TMA
    hp, wp, nb = g.h + g.kh - 1, g.w + g.kw - 1, round_up(g.n, 4)
    x, lo_x, _ = copy(x, hp, wp, nb, g.ph, g.pw, presplit)
    dy, _, db_part = copy(dy, g.h, wp, nb, 0, 0, False, sums)
    key = (f"batchw:{g.n}x{co}x{c}:{g.h}x{g.w}:k{g.kh}x{g.kw}:{dot}"
           f"{'-xsplit' if presplit else ''}:split{splits}")
    run_tuned(_batch_inner_wgrad_kernel, configs(block_m, block_n, kind), key,
              lambda meta: (tiles, splits), (
        dy, x, part, co, c, g.h * wp * nb, hp * wp * nb, wp, nb, g.kh, g.kw,
        *part.stride(), lo_x), dict(PRESPLIT=presplit), x.device)
    return db_part
