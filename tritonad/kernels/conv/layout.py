"""Channels-last copies: a convolution operand [N, C, H, W] (any strides) copied to [N, H, W,
C] memory, optionally zero-padded around each plane and in channels, turned by 180 degrees,
or split into TF32 heads and tails (tf32.store_split). The implicit GEMM packs its weights
K-major this way; the window GEMM copies its gathered source and weights into the padded
buffers that its TMA reads."""
from __future__ import annotations

import triton
import triton.language as tl

from ..launch import INTERPRET, cdiv
from ..plans import empty, run
from .tf32 import store_split


@triton.jit
def _channels_last_block(src_ptr, out_ptr, pid, C, H, W, CP, HP, WP, TOP, LEFT, lo,
                         stride_sn, stride_sc, stride_sh, stride_sw,
                         FLIP: tl.constexpr, SPLIT: tl.constexpr,
                         BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr):
    # out[n, (hp, wp), c] = src[n, c, hp - TOP, wp - LEFT] (FLIP: src[n, c, H-1-h, W-1-w] at
    # that (h, w)) where inside src and c < C, zero elsewhere: src [N, C, H, W] (any strides)
    # to a contiguous [N, HP*WP, CP] buffer. With no padding (HP, WP, CP = H, W, C) the plain
    # channels-last copy of activations or weights. SPLIT (float32): TF32 heads, and their
    # tails lo elements further on (tf32.store_split).
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
    store_split(out_ptr + n * HP * WP * CP + (pix * CP)[:, None] + ch[None, :], v, lo, ok,
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



def channels_last(t):
    """t [N, C, H, W] (any strides) copied to channels-last memory: returns the [N, C, H, W] view
    of a contiguous [N, H, W, C] buffer (stride along C = 1)."""
    n, c, h, w = t.shape
    out, = padded_channels_last((t, (0, 0), (h, w), c))
    return out.view(n, h, w, c).permute(0, 3, 1, 2)


def padded_channels_last(*copies, split=False):
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

