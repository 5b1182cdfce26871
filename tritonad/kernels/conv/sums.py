"""Fixed-order sums: a split-K weight gradient's partial tiles summed over the splits, and the
bias gradient db[o] = sum of dy over (N, Ho, Wo) as per-split channel sums then their sum. The
same bits on every run: no atomics, the splits added in increasing order."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..launch import INTERPRET, cdiv, next_power_of_2
from ..plans import empty, run
from .common import sm_count, split_share


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
    # in order) and all pixels: the bias gradient's partials, which sum_splits adds in a
    # fixed order. One program: channels c0 .. c0 + BLOCK_C of one split. An image's
    # (channel, pixel) elements of those channels are one run of BLOCK_C * PLANE (contiguous
    # where FLAT), loaded BLOCK_N images at a time as a [BLOCK_N, BLOCK_E] tile, so that the
    # loads are wide whatever the plane's size: with several channels the run fits one tile
    # (BLOCK_E >= BLOCK_C * PLANE), with one it is walked in steps of BLOCK_E.
    c0 = tl.program_id(0) * BLOCK_C
    split = tl.program_id(1)
    n_lo, n_hi = split_share(N_IMG)
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
    block = max(8, min(4096 // block_s, next_power_of_2(cdiv(elements, 2 * sm_count(device)))))
    return min(next_power_of_2(splits), max(block_s, 8192 // block)), block


def sum_splits(part, out, part2=None, out2=None):
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


def channel_sum_blocks(n, co, plane, device, s):
    """(splits, BLOCK_C, BLOCK_N, BLOCK_E) of _channel_sum_kernel over dy [n, co, plane]:
    about s.channel_sum_tile elements a load; several channels a program only while their run
    stays within s.channel_sum_run (short planes: the tile's rows then still fill it, and the
    per-channel sums at the end stay few); images split for s.channel_sum_programs programs an
    SM, and into splits of at most s.channel_sum_loads loads where a plane allows. It is
    memory-bound: every SM streaming, each program few dependent loads (256x256x14x14 bf16:
    896 programs of five loads took 13-16 us; its 25.7 MB take 5.4 at 4.8 TB/s)."""
    target = s.channel_sum_programs * sm_count(device)
    block_c = 1
    while block_c < min(32, co) and 2 * block_c * plane <= s.channel_sum_run and \
            cdiv(co, 2 * block_c) * n >= target:
        block_c *= 2
    block_e = min(next_power_of_2(block_c * plane), s.channel_sum_tile)
    block_n = max(1, s.channel_sum_tile // block_e)
    steps = cdiv(block_c * plane, block_e)  # loads an image (of one block of channels)
    loads = block_n * max(1, s.channel_sum_loads // steps)  # images a split of that many loads
    splits = max(1, min(n, max(cdiv(target, cdiv(co, block_c)), cdiv(n, loads))))
    return splits, block_c, block_n, block_e


def channel_sums(dy, s, out=None):
    """out [S, Co] (float32, any strides) = the partial sums of dy [N, Co, Ho, Wo] over S
    splits of its images (_channel_sum_kernel); S = out.shape[0], or without `out` as many
    as channel_sum_blocks asks for (a new buffer)."""
    n, co, oh, ow = dy.shape
    splits, block_c, block_n, block_e = channel_sum_blocks(n, co, oh * ow, dy.device, s)
    if out is None:
        out = empty((splits, co), torch.float32, dy.device)
    flat = dy.stride(3) == 1 and dy.stride(2) == ow and dy.stride(1) == oh * ow
    run(_channel_sum_kernel, (cdiv(co, block_c), out.shape[0]), dy, out, n, co, ow, oh * ow,
        *dy.stride(), *out.stride(), FLAT=flat, BLOCK_C=block_c, BLOCK_N=block_n,
        BLOCK_E=block_e, num_warps=4)
    return out


def bias_grad(dy, db, s):
    """db [Co] = sum of dy over (N, Ho, Wo): partial sums over splits of the images, enough
    to keep every SM reading, then their fixed-order sum (channel_sums, sum_splits)."""
    if dy.shape[1] == 0:
        return db
    part = channel_sums(dy, s)
    sum_splits(part[:, None], db.view(1, -1))
    return db

