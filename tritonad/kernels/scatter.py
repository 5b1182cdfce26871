"""Scatter with a reduction, deterministically: out[index[i]] = reduce(out[index[i]], src[i]),
the kernels behind embedding's backward, scatter / scatter_add / scatter_reduce, index_add,
index_put and assignment through an index (autodiff/index_ops.py); and the index check that
the ops along a dim run before they linearise their indices.

Everything is seen as rows: src [n, D] (n indices, D the trailing elements), out [R, D].
Float atomics would make the order of the additions into a row (so the last bits of a sum over
repeated indices) vary from run to run. Instead the n indices are sorted, and each output row
reduces its own segment of the sorted order, in increasing i: the same bits every run, and no
atomics at all. The sort key is row * n + i, unique, so the order is total:

    1. _sort_blocks_kernel: keys of BLOCK indices, sorted in registers (tl.sort, bitonic; under
       the interpreter by ranks, which it runs faster).
    2. _merge_kernel, log_8(n / BLOCK) times (once for n <= 32k): groups of 8 sorted runs
       merged into one. A key's place in its group's merge is its rank in its own run plus the
       number of keys of each other run below it (7 binary searches side by side; keys are
       unique, so no ties).
    3. _bounds_kernel: where the row changes along the sorted keys, the row's segment
       [start, end) (rows no index names keep an empty one).
    4. _segment_reduce_kernel: each output row folds its segment's src rows in registers, in
       increasing i, and writes out[r] once (rows no index names too: the base row or zero), so
       the output needs no fill beforehand.

Memory traffic: the sort moves 16 bytes a key per pass (8 read, 8 written), plus the searches'
cached reads; the bounds 16 bytes a row; the reduction reads each src row once (D * itemsize
bytes per index), the base once and writes out once (R * D * itemsize each). Embedding's backward at 32k indices into 50k x 768
float32: ~100 MB of dy read and ~154 MB of weight gradient written (its zero rows included).
"""
from __future__ import annotations

import math

import triton
import triton.language as tl

from .. import dtypes
from . import errors
from .elementwise import contiguous, copy_, fill_
from .errors import report
from .launch import INTERPRET, cdiv, dtype_of, next_power_of_2
from .plans import empty, planned, run

PRIMITIVES = ("index_check", "scatter_reduce_rows")

REDUCES = ("sum", "prod", "mean", "amax", "amin", "last")
SORT_BLOCK = 4096
RANK_BLOCK = 128
MERGE_BLOCK = 256
MERGE_GROUP = 8
BOUNDS_BLOCK = 1024
# sums of rows this wide fold BLOCK_K indices a step (_segment_sum_kernel)
SUM_MIN_WIDTH, SUM_BLOCK_K = 32, 16
# rows narrower than this (bytes) are written only where named (_segment_sparse_kernel): a
# row's segment bounds (16 bytes) would cost more than the row
SPARSE_ROW_BYTES = 64
# how a block of keys is sorted: tl.sort's bitonic network (1), or, under the interpreter, where
# that costs ~1 s a block, by ranks from a [BLOCK, BLOCK] comparison (2; tests check both)
BLOCK_SORT = 2 if INTERPRET else 1
TILE = 4096
_BIG = 2**63 - 1


# ----------------------------------------------------------------------------------- kernels


@triton.jit
def _index_check_kernel(index_ptr, out_ptr, flag_ptr, n, size, WRAP: tl.constexpr,
                        BLOCK: tl.constexpr):
    # One program: BLOCK indices checked against [0, size) ([-size, size) with WRAP, negative
    # ones wrapped); a bad one reported on the error flag, written clamped into range.
    # Traffic: 8 bytes read and 8 written per index. (Written clamped, so that the op it
    # feeds finds nothing more to report: the error names the op that checked.)
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = i < n
    v = tl.load(index_ptr + i, mask=mask, other=0).to(tl.int64)
    if WRAP:
        bad = (v < -size) | (v >= size)
    else:
        bad = (v < 0) | (v >= size)
    report(flag_ptr, mask & bad, i, v, size)
    v = tl.where(v < 0, v + size, v)
    v = tl.minimum(tl.maximum(v, 0), size - 1)
    tl.store(out_ptr + i, v, mask=mask)


@triton.jit
def _sort_blocks_kernel(index_ptr, keys_ptr, flag_ptr, n, n_rows, SORT: tl.constexpr,
                        BLOCK: tl.constexpr):
    # One program: keys = row * n + i of BLOCK indices (a row outside [0, n_rows) reported
    # and clamped), sorted ascending into the block's place: SORT 1 by tl.sort, 2 by ranks
    # (each key's count of smaller keys in the block; the keys are unique). Lanes past n sort
    # last as the largest int64 and are not stored.
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = i < n
    row = tl.load(index_ptr + i, mask=mask, other=0).to(tl.int64)
    report(flag_ptr, mask & ((row < 0) | (row >= n_rows)), i, row, n_rows)
    row = tl.minimum(tl.maximum(row, 0), n_rows - 1)
    keys = tl.where(mask, row * n + i, 9223372036854775807)
    if SORT == 1:
        tl.store(keys_ptr + i, tl.sort(keys), mask=mask)
    else:
        rank = tl.sum((keys[None, :] < keys[:, None]).to(tl.int32), axis=1)
        tl.store(keys_ptr + tl.program_id(0).to(tl.int64) * BLOCK + rank, keys, mask=mask)


@triton.jit
def _merge_kernel(keys_ptr, out_ptr, n, run, steps, GROUP: tl.constexpr, BLOCK: tl.constexpr):
    # One program: BLOCK keys of the sorted runs of length `run`, each written at its place in
    # the merge of its group of GROUP consecutive runs: its rank in its own run plus, for each
    # other run of the group, the number of that run's keys below it. The GROUP - 1 binary
    # searches run side by side ([BLOCK, GROUP] lanes a step), so a pass costs one search's
    # latency. Traffic: 16 bytes a key plus the searches' reads (cached).
    p = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = p < n
    key = tl.load(keys_ptr + p, mask=mask, other=0)
    own = p // run
    first = (own // GROUP) * GROUP
    other = first[:, None] + tl.arange(0, GROUP)[None, :]
    start = other * run
    length = tl.minimum(tl.maximum(n - start, 0), run)
    length = tl.where(other == own[:, None], 0, length)
    lo = tl.zeros([BLOCK, GROUP], tl.int64)
    hi = lo + length
    for _ in range(steps):
        active = lo < hi
        mid = (lo + hi) // 2
        v = tl.load(keys_ptr + start + mid, mask=active & mask[:, None], other=0)
        below = active & (v < key[:, None])
        lo = tl.where(below, mid + 1, lo)
        hi = tl.where(active & ~below, mid, hi)
    place = first * run + (p - own * run) + tl.sum(lo, axis=1)
    tl.store(out_ptr + place, key, mask=mask)


@triton.jit
def _bounds_kernel(keys_ptr, bounds_ptr, n, BLOCK: tl.constexpr):
    # One program: BLOCK positions of the sorted keys; where the row changes, the row's
    # segment [start, end) is written (bounds [R, 2], zeroed first: rows without an index keep
    # an empty segment). Traffic: 24 bytes a key.
    p = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = p < n
    row = tl.load(keys_ptr + p, mask=mask, other=0) // n
    before = tl.load(keys_ptr + p - 1, mask=mask & (p > 0), other=-1)
    after = tl.load(keys_ptr + p + 1, mask=mask & (p + 1 < n), other=-1)
    starts = mask & ((p == 0) | (tl.where(before < 0, -1, before // n) != row))
    ends = mask & ((p + 1 == n) | (tl.where(after < 0, -1, after // n) != row))
    tl.store(bounds_ptr + 2 * row, p, mask=starts)
    tl.store(bounds_ptr + 2 * row + 1, p + 1, mask=ends)


@triton.jit
def _segment_reduce_kernel(src_ptr, keys_ptr, bounds_ptr, base_ptr, out_ptr, n, n_rows, width,
                           zero_row, REDUCE: tl.constexpr, HAS_BASE: tl.constexpr,
                           INCLUDE_SELF: tl.constexpr, IS_FLOAT: tl.constexpr,
                           BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr):
    # One program: BLOCK_R output rows by BLOCK_D columns. Row r folds src[i] for the i of its
    # segment of the sorted keys, in increasing i (a fixed order: deterministic):
    #   sum / mean: + (mean divides by the count, the base row counting once with
    #   INCLUDE_SELF), prod: *, amax / amin: NaN-propagating max / min, last: the last i wins.
    # With a base row: rows no index names keep it; INCLUDE_SELF folds it in first.
    # REDUCE: 0 sum, 1 prod, 2 mean, 3 amax, 4 amin, 5 last.
    r = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    mask_r = r < n_rows
    d = tl.program_id(1).to(tl.int64) * BLOCK_D + tl.arange(0, BLOCK_D)
    mask_d = d < width
    start = tl.load(bounds_ptr + 2 * r, mask=mask_r, other=0)
    end = tl.load(bounds_ptr + 2 * r + 1, mask=mask_r, other=0)
    count = end - start
    if IS_FLOAT:
        acc = tl.zeros([BLOCK_R, BLOCK_D], tl.float32)
        if src_ptr.dtype.element_ty == tl.float64:
            acc = tl.zeros([BLOCK_R, BLOCK_D], tl.float64)
    else:
        acc = tl.zeros([BLOCK_R, BLOCK_D], tl.int64)
    longest = tl.max(count)
    for k in range(0, longest):
        valid = k < count
        key = tl.load(keys_ptr + start + k, mask=valid & mask_r, other=0)
        i = key - r * n
        m = (valid & mask_r)[:, None] & mask_d[None, :]
        v = tl.load(src_ptr + i[:, None] * width + d[None, :], mask=m, other=0).to(acc.dtype)
        if REDUCE == 0 or REDUCE == 2:
            folded = acc + v
        elif REDUCE == 1:
            folded = acc * v
        elif REDUCE == 3:
            folded = tl.where((v != v) | (v > acc), v, acc)
        elif REDUCE == 4:
            folded = tl.where((v != v) | (v < acc), v, acc)
        else:
            folded = v
        acc = tl.where(m, tl.where(k == 0, v, folded), acc)
    _finish(acc, count, r, mask_r, d, mask_d, base_ptr, out_ptr, width, zero_row, REDUCE,
            HAS_BASE, INCLUDE_SELF, IS_FLOAT)


@triton.jit
def _segment_sum_kernel(src_ptr, keys_ptr, bounds_ptr, base_ptr, out_ptr, n, n_rows, width,
                        zero_row, REDUCE: tl.constexpr, HAS_BASE: tl.constexpr,
                        INCLUDE_SELF: tl.constexpr, IS_FLOAT: tl.constexpr,
                        BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr):
    # One program: one output row r by BLOCK_D columns, for sum and mean of wide rows. The
    # segment is read BLOCK_K src rows at a time, each [BLOCK_K, BLOCK_D] tile summed by
    # tl.sum (a fixed tree: the same bits every run), the tiles in increasing i: a row that
    # many indices name (a frequent token) takes 1 / BLOCK_K of the serial steps of the
    # row-by-row fold. Epilogue as _segment_reduce_kernel's.
    r = tl.program_id(0).to(tl.int64)
    d = tl.program_id(1).to(tl.int64) * BLOCK_D + tl.arange(0, BLOCK_D)
    mask_d = d < width
    start = tl.load(bounds_ptr + 2 * r)
    end = tl.load(bounds_ptr + 2 * r + 1)
    if IS_FLOAT:
        acc = tl.zeros([BLOCK_D], tl.float32)
        if src_ptr.dtype.element_ty == tl.float64:
            acc = tl.zeros([BLOCK_D], tl.float64)
    else:
        acc = tl.zeros([BLOCK_D], tl.int64)
    for k0 in range(start, end, BLOCK_K):
        pos = k0 + tl.arange(0, BLOCK_K)
        valid = pos < end
        key = tl.load(keys_ptr + pos, mask=valid, other=0)
        i = key - r * n
        v = tl.load(src_ptr + i[:, None] * width + d[None, :],
                    mask=valid[:, None] & mask_d[None, :], other=0).to(acc.dtype)
        acc += tl.sum(v, axis=0)
    rows = tl.zeros([1], tl.int64) + r
    _finish(acc[None, :], tl.zeros([1], tl.int64) + (end - start), rows, rows < n_rows, d,
            mask_d, base_ptr, out_ptr, width, zero_row, REDUCE, HAS_BASE, INCLUDE_SELF, IS_FLOAT)


@triton.jit
def _segment_sparse_kernel(src_ptr, keys_ptr, base_ptr, out_ptr, n, width, zero_row, steps,
                           REDUCE: tl.constexpr, HAS_BASE: tl.constexpr,
                           INCLUDE_SELF: tl.constexpr, IS_FLOAT: tl.constexpr,
                           BLOCK_P: tl.constexpr, BLOCK_D: tl.constexpr):
    # One program: BLOCK_P positions of the sorted keys by BLOCK_D columns, for narrow rows
    # (a scatter along a dim sees every element as a row) where a row's segment bounds would
    # cost more than the rows. A position where a row's segment starts finds the segment's end
    # (a binary search for the next row's first key), folds it as _segment_reduce_kernel does
    # and writes the row; the other positions write nothing, and rows no index names keep what
    # out holds (base's copy, or zeros). Traffic: the copy of base, then per index its src row
    # and, per row named, one row written.
    p = tl.program_id(0).to(tl.int64) * BLOCK_P + tl.arange(0, BLOCK_P)
    mask_p = p < n
    key = tl.load(keys_ptr + p, mask=mask_p, other=0)
    row = key // n
    prev = tl.load(keys_ptr + p - 1, mask=mask_p & (p > 0), other=0)
    lead = mask_p & ((p == 0) | (prev // n != row))
    target = (row + 1) * n
    lo = p
    hi = tl.where(lead, n, p)
    for _ in range(steps):
        active = lo < hi
        mid = (lo + hi) // 2
        v = tl.load(keys_ptr + mid, mask=active, other=0)
        below = active & (v < target)
        lo = tl.where(below, mid + 1, lo)
        hi = tl.where(active & ~below, mid, hi)
    count = tl.where(lead, lo - p, 0)
    d = tl.program_id(1).to(tl.int64) * BLOCK_D + tl.arange(0, BLOCK_D)
    mask_d = d < width
    if IS_FLOAT:
        acc = tl.zeros([BLOCK_P, BLOCK_D], tl.float32)
        if src_ptr.dtype.element_ty == tl.float64:
            acc = tl.zeros([BLOCK_P, BLOCK_D], tl.float64)
    else:
        acc = tl.zeros([BLOCK_P, BLOCK_D], tl.int64)
    longest = tl.max(count)
    for k in range(0, longest):
        valid = k < count
        i = tl.load(keys_ptr + p + k, mask=valid, other=0) - row * n
        m = valid[:, None] & mask_d[None, :]
        v = tl.load(src_ptr + i[:, None] * width + d[None, :], mask=m, other=0).to(acc.dtype)
        if REDUCE == 0 or REDUCE == 2:
            folded = acc + v
        elif REDUCE == 1:
            folded = acc * v
        elif REDUCE == 3:
            folded = tl.where((v != v) | (v > acc), v, acc)
        elif REDUCE == 4:
            folded = tl.where((v != v) | (v < acc), v, acc)
        else:
            folded = v
        acc = tl.where(m, tl.where(k == 0, v, folded), acc)
    _finish(acc, count, row, lead, d, mask_d, base_ptr, out_ptr, width, zero_row, REDUCE,
            HAS_BASE, INCLUDE_SELF, IS_FLOAT)


@triton.jit
def _finish(acc, count, r, mask_r, d, mask_d, base_ptr, out_ptr, width, zero_row,
            REDUCE: tl.constexpr, HAS_BASE: tl.constexpr, INCLUDE_SELF: tl.constexpr,
            IS_FLOAT: tl.constexpr):
    """Fold the base row in (INCLUDE_SELF), divide a mean, keep the base (or zero) in rows no
    index names, zero row zero_row, and store: acc [R, D] of rows r, count [R] their indices."""
    has = (count > 0)[:, None]
    mask = mask_r[:, None] & mask_d[None, :]
    if HAS_BASE:
        b = tl.load(base_ptr + r[:, None] * width + d[None, :], mask=mask, other=0).to(acc.dtype)
        if INCLUDE_SELF:
            if REDUCE == 0 or REDUCE == 2:
                acc = acc + b
            elif REDUCE == 1:
                acc = acc * b
            elif REDUCE == 3:
                acc = tl.where((acc != acc) | (acc > b), acc, b)
            elif REDUCE == 4:
                acc = tl.where((acc != acc) | (acc < b), acc, b)
    if REDUCE == 2:
        total = count
        if HAS_BASE:
            if INCLUDE_SELF:
                total = count + 1
        total = tl.maximum(total, 1)[:, None]
        if IS_FLOAT:
            acc = acc / total.to(acc.dtype)
        else:  # integer mean: floor division, as torch (whatever // rounds to)
            q = acc // total
            acc = tl.where(q * total > acc, q - 1, q)
    if HAS_BASE:
        acc = tl.where(has, acc, b)
    else:
        acc = tl.where(has, acc, tl.zeros_like(acc))
    acc = tl.where((r == zero_row)[:, None], tl.zeros_like(acc), acc)
    tl.store(out_ptr + r[:, None] * width + d[None, :], acc.to(out_ptr.dtype.element_ty),
             mask=mask)


# ----------------------------------------------------------------------------------- launchers


def _steps(length):
    """Binary-search steps that settle any range of `length` keys."""
    return max(1, int(length).bit_length())


def index_check(index, size, op, wrap):
    """index as int64, checked against a dim of `size` (Backend.index_check)."""
    out = _index_check(index, size, op, wrap)
    errors.after(index.device)
    return out


@planned()
def _index_check(index, size, op, wrap):
    if dtype_of(index) not in (dtypes.int64, dtypes.int32, dtypes.uint8):
        raise TypeError(f"{op}: index must be an integer tensor, got {dtype_of(index).name}")
    n = index.numel()
    src = index if index.is_contiguous() else contiguous(index)
    out = empty(tuple(index.shape), dtypes.int64, index.device)
    if n and size == 0:
        raise IndexError(f"{op}: index into a dimension of size 0 (index shape "
                         f"{tuple(index.shape)})")
    if n:
        block = 256 if INTERPRET else 1024
        run(_index_check_kernel, (cdiv(n, block),), src, out,
            errors.flag(index.device, op), n, size, WRAP=bool(wrap),
            BLOCK=block, num_warps=4)
    return out


def scatter_reduce_rows(src, index, base, num_rows, reduce, include_self=True, zero_row=-1,
                        op="scatter_reduce"):
    """Deterministic row scatter with a reduction (Backend.scatter_reduce_rows)."""
    out = _scatter_reduce_rows(src, index, base, num_rows, reduce, include_self, zero_row, op)
    errors.after(src.device)
    return out


def _sorted_keys(index, n_rows, op):
    """The keys row * n + i of the n indices, sorted ascending (see the module docstring)."""
    n = index.numel()
    keys = empty((n,), dtypes.int64, index.device)
    block = SORT_BLOCK if BLOCK_SORT == 1 else RANK_BLOCK
    run(_sort_blocks_kernel, (cdiv(n, block),), index, keys, errors.flag(index.device, op),
        n, n_rows, SORT=BLOCK_SORT, BLOCK=block, num_warps=8 if block >= 2048 else 4)
    length = block
    other = None
    while length < n:
        other = empty((n,), dtypes.int64, index.device) if other is None else other
        run(_merge_kernel, (cdiv(n, MERGE_BLOCK),), keys, other, n, length, _steps(length),
            GROUP=MERGE_GROUP, BLOCK=MERGE_BLOCK, num_warps=4)
        keys, other = other, keys
        length *= MERGE_GROUP
    return keys


@planned()
def _scatter_reduce_rows(src, index, base, num_rows, reduce, include_self, zero_row, op):
    if reduce not in REDUCES:
        raise ValueError(f"{op}: reduce must be one of {REDUCES}, got {reduce!r}")
    if dtype_of(index) not in (dtypes.int64, dtypes.int32):
        raise TypeError(f"{op}: index must be int64 or int32, got {dtype_of(index).name}")
    if tuple(src.shape[:index.dim()]) != tuple(index.shape):
        raise ValueError(f"{op}: src shape {tuple(src.shape)} must start with the index shape "
                         f"{tuple(index.shape)}")
    rest = tuple(src.shape[index.dim():])
    dtype = dtype_of(src)
    if base is not None and (tuple(base.shape) != (num_rows,) + rest or dtype_of(base) != dtype):
        raise ValueError(f"{op}: base must be [{num_rows}, *{rest}] of {dtype.name}, got "
                         f"{tuple(base.shape)} of {dtype_of(base).name}")
    n, width = index.numel(), math.prod(rest)
    if n and num_rows == 0:
        raise IndexError(f"{op}: index into a dimension of size 0")
    out = empty((num_rows,) + rest, dtype, src.device)
    if out.numel() == 0:
        return out
    src = src if src.is_contiguous() else contiguous(src)
    index = index if index.is_contiguous() else contiguous(index)
    if base is not None and not base.is_contiguous():
        base = contiguous(base)
    block_d = max(2, min(next_power_of_2(width), 256))
    flags = dict(REDUCE=REDUCES.index(reduce), HAS_BASE=base is not None,
                 INCLUDE_SELF=bool(include_self), IS_FLOAT=dtype.is_floating_point)
    if width * src.element_size() < SPARSE_ROW_BYTES and (base is None or zero_row < 0):
        # narrow rows: out starts as base (or zeros); only the rows named are written
        if base is not None:
            copy_(out, base)
        else:
            fill_(out, 0)
        if n:
            keys = _sorted_keys(index, num_rows, op)
            block_p = max(2, min(TILE // block_d, 256))
            run(_segment_sparse_kernel, (cdiv(n, block_p), cdiv(width, block_d)), src, keys,
                base if base is not None else out, out, n, width, zero_row, _steps(n), **flags,
                BLOCK_P=block_p, BLOCK_D=block_d, num_warps=4)
        return out
    bounds = empty((num_rows, 2), dtypes.int64, src.device)
    fill_(bounds, 0)
    if n:
        keys = _sorted_keys(index, num_rows, op)
        run(_bounds_kernel, (cdiv(n, BOUNDS_BLOCK),), keys, bounds, n, BLOCK=BOUNDS_BLOCK,
            num_warps=4)
    else:  # no index: every segment is empty, and no key is read
        keys = bounds
    arrays = (src, keys, bounds, base if base is not None else out, out, n, num_rows, width,
              zero_row)
    if reduce in ("sum", "mean") and width >= SUM_MIN_WIDTH:
        grid = (num_rows, cdiv(width, block_d))
        run(_segment_sum_kernel, grid, *arrays, **flags, BLOCK_K=SUM_BLOCK_K, BLOCK_D=block_d,
            num_warps=4)
    else:
        block_r = max(2, min(TILE // block_d, next_power_of_2(num_rows), 64))
        grid = (cdiv(num_rows, block_r), cdiv(width, block_d))
        run(_segment_reduce_kernel, grid, *arrays, **flags, BLOCK_R=block_r, BLOCK_D=block_d,
            num_warps=4)
    return out
