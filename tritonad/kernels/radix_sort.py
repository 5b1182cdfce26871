"""Sorting long rows of 32-bit keys: a least-significant-digit radix sort, BITS bits a pass.

Applies to rows longer than one register tile (scan.py SORT_TILE) whose keys are 32-bit
(float32, float16, bfloat16 and the integers of up to 32 bits), any number of rows: every pass
is segmented by row (the row is part of every histogram's and every scatter's index), so one
long row and [4096, 32000] rows take the same kernels. Keys are sort_network's order keys (the
float order with NaN the largest; ~key when descending) with the sign bit flipped into an
unsigned order, paired with their column index.

A pass over digit p = (ukey >> shift) & (2**BITS - 1) is two launches:
  histogram: counts[row, d, b] = #{elements of block b of the row with digit d};
  scatter:   each element goes to  sum_{d' < d} total[d'] + sum_{b' < b} counts[row, d, b']
             + its rank among the elements of its block with digit d (tl.cumsum over a one-hot
             of the digit, packed as four 16-bit counters to an int64 word), which keeps equal
             digits in their order: the sort is stable, and
             after the last pass (key, index) pairs are in order, as the bitonic path leaves them.
Passes over bits that every key shares (the low 16 bits of a widened bfloat16, 13 of a
float16) are skipped: they would move nothing.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .launch import cdiv, next_power_of_2
from .plans import empty, run
from .sort_network import _order_key

BITS = 4            # bits of the key a pass sorts on (2**BITS bins)
RADIX_BLOCK = 4096  # columns a program owns (at least; more when a row has over MAX_BLOCKS)
RADIX_SUB = 512     # columns ranked at once inside a block (112 registers a thread at 8 warps)
MAX_BLOCKS = 256    # blocks per row: the scatter reads all 2**BITS x blocks counts of its row


@triton.jit
def _radix_digit(key, shift, flip, ok, BITS: tl.constexpr):
    # the pass's digit of the unsigned order of a signed 32-bit key (the sign bit flipped: only
    # the top digit sees it, through `flip`); 2**BITS for masked-off columns (no bin)
    d = ((key >> shift) & ((1 << BITS) - 1)) ^ flip
    return tl.where(ok, d, 1 << BITS)


@triton.jit
def _radix_load(keys_in, idx_in, x_ptr, row, j, ok, n_cols, n_inner,
                FROM_X: tl.constexpr, DESCENDING: tl.constexpr, KIND: tl.constexpr):
    # (keys, column indices) of columns j of a row: computed from x on the first pass, else
    # read from the pass before's buffers (rows n_cols long)
    if FROM_X:
        base = (row // n_inner) * n_cols * n_inner + row % n_inner
        x = tl.load(x_ptr + base + j * n_inner, mask=ok, other=0)
        key = _order_key(x, DESCENDING, KIND)
        idx = j.to(tl.int32)
    else:
        key = tl.load(keys_in + row * n_cols + j, mask=ok, other=0)
        idx = tl.load(idx_in + row * n_cols + j, mask=ok, other=0)
    return key, idx


# Memory per element and pass: one 4-byte key read (x's element on the first pass).
@triton.jit
def _radix_hist_kernel(counts_ptr, keys_in, idx_in, x_ptr, n_cols, n_inner, n_blocks, shift,
                       flip, FROM_X: tl.constexpr, DESCENDING: tl.constexpr,
                       KIND: tl.constexpr, BITS: tl.constexpr, BLOCK: tl.constexpr,
                       SUB: tl.constexpr):
    # counts[row, d, b] for row = program_id(0), b = program_id(1), d < 2**BITS
    row = tl.program_id(0).to(tl.int64)
    b = tl.program_id(1).to(tl.int64)
    bins = tl.arange(0, 1 << BITS)
    acc = tl.zeros([1 << BITS], tl.int32)
    for s in range(0, BLOCK, SUB):
        j = b * BLOCK + s + tl.arange(0, SUB).to(tl.int64)
        ok = j < n_cols
        key, _ = _radix_load(keys_in, idx_in, x_ptr, row, j, ok, n_cols, n_inner, FROM_X,
                             DESCENDING, KIND)
        d = _radix_digit(key, shift, flip, ok, BITS)
        acc += tl.sum((d[:, None] == bins[None, :]).to(tl.int32), 0)
    tl.store(counts_ptr + (row * (1 << BITS) + bins) * n_blocks + b, acc)


# Memory per element and pass: the (key, index) pair read and written (16 bytes; x's element
# read on the first pass; the last pass writes the value, gathered from x, and the int64
# index); per program 2**BITS x n_blocks counts of its row read (L2).
@triton.jit
def _radix_scatter_kernel(keys_out, idx_out, vals_ptr, ind_ptr, keys_in, idx_in, x_ptr,
                          counts_ptr, n_cols, n_inner, n_blocks, shift, flip,
                          FROM_X: tl.constexpr, FINAL: tl.constexpr, DESCENDING: tl.constexpr,
                          KIND: tl.constexpr, BITS: tl.constexpr, BLOCK: tl.constexpr,
                          SUB: tl.constexpr, NB: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    b = tl.program_id(1).to(tl.int64)
    bins = tl.arange(0, 1 << BITS)
    words = tl.arange(0, 1 << (BITS - 2))
    blocks = tl.arange(0, NB)
    c = tl.load(counts_ptr + (row * (1 << BITS) + bins[:, None]) * n_blocks + blocks[None, :],
                mask=(blocks < n_blocks)[None, :], other=0)
    total = tl.sum(c, 1)
    # where digit d's elements of this block start: every smaller digit of the row, then d's
    # elements of the blocks before
    running = tl.cumsum(total, 0) - total + tl.sum(tl.where(blocks[None, :] < b, c, 0), 1)
    for s in range(0, BLOCK, SUB):
        j = b * BLOCK + s + tl.arange(0, SUB).to(tl.int64)
        ok = j < n_cols
        key, idx = _radix_load(keys_in, idx_in, x_ptr, row, j, ok, n_cols, n_inner, FROM_X,
                               DESCENDING, KIND)
        d = _radix_digit(key, shift, flip, ok, BITS)
        # rank among the sub-chunk's elements of the same digit: counters of 16 bits, four
        # digits to an int64 word, so the scan runs over 2**BITS / 4 words, not 2**BITS bins
        word = d >> 2
        field = ((d & 3) * 16).to(tl.int64)
        in_word = word[:, None] == words[None, :]
        one = tl.full([SUB], 1, tl.int64) << field
        seen = tl.sum(tl.where(in_word, tl.cumsum(tl.where(in_word, one[:, None], 0), 0), 0), 1)
        rank = ((seen >> field) & 0xFFFF) - 1
        hot = d[:, None] == bins[None, :]
        dest = tl.sum(tl.where(hot, running[None, :], 0), 1).to(tl.int64) + rank
        running += tl.sum(hot.to(tl.int32), 0)
        if FINAL:
            base = (row // n_inner) * n_cols * n_inner + row % n_inner
            v = tl.load(x_ptr + base + idx.to(tl.int64) * n_inner, mask=ok, other=0)
            tl.store(vals_ptr + base + dest * n_inner, v, mask=ok)
            tl.store(ind_ptr + base + dest * n_inner, idx.to(tl.int64), mask=ok)
        else:
            tl.store(keys_out + row * n_cols + dest, key, mask=ok)
            tl.store(idx_out + row * n_cols + dest, idx, mask=ok)


def applies(dtype, n, tile):
    """Whether rows of n elements of dtype sort by radix: 32-bit keys, longer than a tile."""
    return n > tile and dtype not in (torch.float64, torch.int64)


def _low_bits(dtype):
    """Low key bits that every element shares (a narrower float widened to float32)."""
    return {torch.bfloat16: 16, torch.float16: 13}.get(dtype, 0)


def radix_sort(x, n_rows, n, inner, descending, vals, ind, kind):
    """vals, ind (x's row rule) = each row of contiguous x sorted (stable, NaN the largest)."""
    block = max(RADIX_BLOCK, next_power_of_2(cdiv(n, MAX_BLOCKS)))
    block = min(block, next_power_of_2(n))
    sub = min(RADIX_SUB, block)
    n_blocks = cdiv(n, block)
    nb = next_power_of_2(n_blocks)
    counts = empty((n_rows, 1 << BITS, n_blocks), torch.int32, x.device)
    first = _low_bits(x.dtype) // BITS
    passes = 32 // BITS
    bufs = [(empty((n_rows, n), torch.int32, x.device), empty((n_rows, n), torch.int32,
                                                              x.device))]
    if passes - first > 1:
        bufs.append((empty((n_rows, n), torch.int32, x.device),
                     empty((n_rows, n), torch.int32, x.device)))
    meta = dict(DESCENDING=bool(descending), KIND=kind, BITS=BITS, BLOCK=block, SUB=sub,
                num_warps=8 if sub >= 512 else 4)
    grid = (n_rows, n_blocks)
    src = bufs[0]
    for p in range(first, passes):
        shift = p * BITS
        flip = 1 << (BITS - 1) if p == passes - 1 else 0
        from_x, final = p == first, p == passes - 1
        dst = bufs[(p - first + 1) % len(bufs)] if not final else src
        run(_radix_hist_kernel, grid, counts, src[0], src[1], x, n, inner, n_blocks, shift,
            flip, FROM_X=from_x, **meta)
        run(_radix_scatter_kernel, grid, dst[0], dst[1], vals, ind, src[0], src[1], x, counts,
            n, inner, n_blocks, shift, flip, FROM_X=from_x, FINAL=final, NB=nb, **meta)
        src = dst
    return vals, ind
