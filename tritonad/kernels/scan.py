"""Scans (cumsum, cumprod, logcumsumexp, cummax, cummin), sorting (sort, topk) and the
gathers and scatters along one dim that their gradients need.

Every operand is read as rows: x (made contiguous first if it is not) is [n_out, n, n_inner]
with the scanned or sorted dim in the middle, so row r = (r // n_inner, r % n_inner) starts at
(r // n_inner) * n * n_inner + r % n_inner and its columns are n_inner apart. Outputs are
contiguous in x's shape (dim of length n, or k for topk) and use the same row rule.

Scans. One program owns BLOCK_R rows and a chunk of CHUNK columns, streamed BLOCK_C at a time
through tl.associative_scan with a carry across tiles. Long rows with few of them (a 1M-element
cumsum) are cut into chunks so that the GPU fills: pass 1 reduces each chunk to its total,
pass 2 scans the totals of each row (the same kernel), pass 3 scans each chunk starting from
the total of the chunks before it; a float sum takes one launch instead, chunks looking back
at the totals their neighbours publish (scan_lookback.py). REVERSE scans from the last column
to the first (the gradients of cumsum and logcumsumexp).

Sorting. Every value becomes an integer key whose signed order is the order wanted (floats by
their bits with the negative ones' magnitude bits flipped, -0.0 as +0.0, every NaN as one NaN
above +inf; descending as the bitwise not), paired with its column index; pairs compare by key
and then index, so every sort is stable and NaN sorts as the largest, as PyTorch's. A row of up
to SORT_TILE columns is sorted in registers by a bitonic network carrying the index. Longer rows:
tiles sorted in registers, then the bitonic merges across tiles in memory (a compare-exchange
pass per stride down to the tile), each stage finished by sorting the tiles again in registers
(a tile is then a bitonic sequence in its place); rows of 32-bit keys take an LSD radix sort
instead (radix_sort.py). topk keeps the best next_pow2(k) of each tile, by halving sorted runs
of that length (topk_select.py) where 2 next_pow2(k) fits a tile, else by sorting the tile,
and repeats over the candidates until they fit one tile.

VARIANT (TRITONAD_SCAN_KERNELS) keeps the paths selectable for A/B runs (bench scan
--variant new,old,radix): "new" the look-back scan and the halving topk, with the bitonic
merge sort; "radix" also the radix sort; "old" the paths before all three. The radix sort is
not the default: on an H200 (2026-12-02, `bench scan --quick`) it took 0.495 ms for one row of
2^20 float32 keys against the bitonic merge's 0.523 (PyTorch 0.110), and 52.4 ms for
[4096, 32000] against 22.6 (PyTorch 9.40): its 16 launches and per-block histograms need work.
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from .. import dtypes
from .elementwise import contiguous as _contiguous
from .elementwise import fill_ as _fill
from . import radix_sort, scan_lookback, topk_select
from .sort_network import _bitonic_sort, _key_kind, _load_tile
from .launch import INTERPRET, cdiv, next_power_of_2, num_warps_for
from .plans import empty, planned, run

PRIMITIVES = ("cumulative", "cumulative_extreme", "sort", "topk", "gather_along",
              "scatter_add_along")

SCAN_BLOCK = 1 << 14 if INTERPRET else 1024   # columns per scan step
SCAN_TILE = 1 << 15 if INTERPRET else 4096     # elements per scan step (rows x columns)
SCAN_CHUNK = 1 << 20 if INTERPRET else 4096    # columns per program when long rows are split
SPLIT_ROWS = 264                               # fewer rows than this and long rows: split
SORT_TILE = 1024 if INTERPRET else 2048        # widest row sorted in registers (power of two)
MERGE_BLOCK = 1 << 14 if INTERPRET else 1024   # pairs per program in a merge pass
GATHER_BLOCK = 1 << 14 if INTERPRET else 1024

# "new": the single-pass cumsum (scan_lookback.py) and the halving topk (topk_select.py) where
# they apply; "radix": those and the radix sort (radix_sort.py); "old": the multi-pass scan,
# the bitonic merge sort and the full-tile topk everywhere. Part of every plan's key.
VARIANT = os.environ.get("TRITONAD_SCAN_KERNELS", "new")


def _variant():
    return VARIANT


_OPS = {"sum": 0, "prod": 1, "logsumexp": 2, "max": 3, "min": 4}


# ------------------------------------------------------------------------------ combine functions


@triton.jit
def _add(a, b):
    return a + b


@triton.jit
def _mul(a, b):
    return a * b


@triton.jit
def _logaddexp(a, b):
    # log(exp(a) + exp(b)) = m + log(1 + exp(lo - m)), m = max(a, b): never overflows.
    # NOTE: lo = -inf gives m (also when both are -inf); m = +inf gives +inf; NaN propagates.
    m = tl.maximum(a, b)
    lo = tl.minimum(a, b)
    r = m + tl.log(1.0 + tl.exp(lo - m))
    r = tl.where(lo == float("-inf"), m, r)
    r = tl.where(m == float("inf"), m, r)
    return tl.where((a != a) | (b != b), a + b, r)


@triton.jit
def _max_pick(va, ia, vb, ib):
    # the later of two (value, index) pairs wins a tie; NaN is above everything (as PyTorch's
    # cummax: `x >= max || isnan(x)`). Associative: the last position of the largest value.
    take = (vb >= va) | (vb != vb)
    return tl.where(take, vb, va), tl.where(take, ib, ia)


@triton.jit
def _min_pick(va, ia, vb, ib):
    take = (vb <= va) | (vb != vb)
    return tl.where(take, vb, va), tl.where(take, ib, ia)


# ------------------------------------------------------------------------------------ scans
#
# y[j] = x[0] (+) x[1] (+) ... (+) x[j] for (+) in {+, *, logaddexp, max-with-index, min-...}.
# Memory: one read of x and one write of y (plus the index for cummax/cummin); split rows read
# x twice (pass 1 and pass 3) and move 2 numbers per chunk in between.


@triton.jit
def _scan_kernel(y_ptr, yi_ptr, x_ptr, xi_ptr, part_ptr, parti_ptr, n_rows, n_cols, n_inner,
                 n_chunks, chunk,
                 OP: tl.constexpr, REVERSE: tl.constexpr, MODE: tl.constexpr,
                 HAS_XI: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
                 ACC: tl.constexpr):
    # One program: BLOCK_R rows, columns [c * chunk, (c + 1) * chunk) of the logical order
    # (reversed when REVERSE), c = program_id(1). MODE 0: scan and write y (carry from 0);
    # 1: write only the chunk's total into part[row, c]; 2: scan and write y, starting from the
    # inclusive scan of the totals before this chunk, part[row, c - 1].
    # OP: 0 sum, 1 prod, 2 logsumexp, 3 max (values and indices), 4 min.
    # HAS_XI: the indices come from xi (pass 2 over max/min totals), not the positions.
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    c = tl.program_id(1)
    row_ok = rows < n_rows
    r64 = rows.to(tl.int64)
    base = (r64 // n_inner) * n_cols * n_inner + r64 % n_inner
    if OP == 0:
        carry = tl.zeros([BLOCK_R], ACC)
    elif OP == 1:
        carry = tl.zeros([BLOCK_R], ACC) + 1
    elif OP == 2:
        carry = tl.full([BLOCK_R], float("-inf"), ACC)
    else:
        carry = tl.zeros([BLOCK_R], ACC)
    carry_i = tl.full([BLOCK_R], -1, tl.int64)
    have = tl.zeros([BLOCK_R], tl.int1)   # max/min: whether the carry holds a value yet
    start = c.to(tl.int64) * chunk
    if MODE == 2:
        if c > 0:
            at = r64 * n_chunks + c - 1
            carry = tl.load(part_ptr + at, mask=row_ok, other=0).to(ACC)
            if OP >= 3:
                carry_i = tl.load(parti_ptr + at, mask=row_ok, other=-1)
                have = row_ok
    end = tl.minimum(start + chunk, n_cols)
    for s in range(start, end, BLOCK_C):
        j = s + tl.arange(0, BLOCK_C).to(tl.int64)
        col_ok = j < end
        if REVERSE:
            phys = n_cols - 1 - j
        else:
            phys = j
        mask = row_ok[:, None] & col_ok[None, :]
        offs = base[:, None] + phys[None, :] * n_inner
        # NOTE: the masked tail only ever follows the real columns in scan order, so its
        # values reach no stored position (any `other` is fine).
        x = tl.load(x_ptr + offs, mask=mask, other=0).to(ACC)
        if OP == 0:
            y = tl.cumsum(x, 1) + carry[:, None]
            carry += tl.sum(tl.where(mask, x, 0), 1)
        elif OP == 1:
            y = tl.associative_scan(x, 1, _mul) * carry[:, None]
            carry *= tl.reduce(tl.where(mask, x, 1), 1, _mul)
        elif OP == 2:
            x = tl.where(mask, x, float("-inf"))
            y = _logaddexp(tl.associative_scan(x, 1, _logaddexp), carry[:, None])
            carry = _logaddexp(carry, tl.reduce(x, 1, _logaddexp))
        else:
            if HAS_XI:
                xi = tl.load(xi_ptr + offs, mask=mask, other=-1)
            else:
                xi = tl.broadcast_to(phys[None, :], [BLOCK_R, BLOCK_C])
            if OP == 3:
                v, vi = tl.associative_scan((x, xi), 1, _max_pick)
                cv, ci = _max_pick(carry[:, None], carry_i[:, None], v, vi)
            else:
                v, vi = tl.associative_scan((x, xi), 1, _min_pick)
                cv, ci = _min_pick(carry[:, None], carry_i[:, None], v, vi)
            # a carry not yet set is no value at all: the tile's own scan stands
            y = tl.where(have[:, None], cv, v)
            yi = tl.where(have[:, None], ci, vi)
            last = tl.max(tl.where(mask, j[None, :], -1), 1)
            pick = mask & (j[None, :] == last[:, None])
            carry = tl.sum(tl.where(pick, y, 0), 1)
            carry_i = tl.sum(tl.where(pick, yi, 0), 1)
            have = have | (last >= 0)
        if MODE != 1:
            tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=mask)
            if OP >= 3:
                tl.store(yi_ptr + offs, yi, mask=mask)
    if MODE == 1:
        at = r64 * n_chunks + c
        tl.store(part_ptr + at, carry.to(part_ptr.dtype.element_ty), mask=row_ok)
        if OP >= 3:
            tl.store(parti_ptr + at, carry_i, mask=row_ok)


# ------------------------------------------------------------------------------------ launchers


def _rows(x, dim):
    """(contiguous x, n_rows, n, n_inner) for scanning or sorting along dim."""
    if not x.is_contiguous():
        x = _contiguous(x)
    shape = tuple(x.shape)
    n = shape[dim] if shape else 1
    inner = 1
    for s in shape[dim + 1:]:
        inner *= s
    return x, (x.numel() // n if n else 0), n, inner


def _acc_for(dtype):
    if dtype.is_floating_point:
        return tl.float64 if dtype == torch.float64 else tl.float32
    return tl.int64


def _scan_blocks(n_rows, n):
    block_c = min(next_power_of_2(max(n, 1)), SCAN_BLOCK)
    block_r = max(1, min(next_power_of_2(max(n_rows, 1)), SCAN_TILE // block_c))
    return block_r, block_c, num_warps_for(block_r * block_c)


def _scan(x, dim, op, reverse, out_dtype, with_indices):
    x, n_rows, n, inner = _rows(x, dim)
    y = empty(x.shape, out_dtype, x.device)
    yi = empty(x.shape, torch.int64, x.device) if with_indices else y
    if x.numel() == 0:
        return y, yi
    code = _OPS[op]
    if with_indices:
        acc = tl.float32 if x.dtype in (torch.float16, torch.bfloat16) else \
            tl.float64 if x.dtype == torch.float64 else \
            tl.int64 if not x.dtype.is_floating_point else tl.float32
    else:
        acc = _acc_for(out_dtype)
    block_r, block_c, warps = _scan_blocks(n_rows, n)
    meta = dict(OP=code, REVERSE=reverse, BLOCK_R=block_r, BLOCK_C=block_c, ACC=acc,
                num_warps=warps)
    if n <= SCAN_CHUNK or n_rows >= SPLIT_ROWS:
        run(_scan_kernel, (cdiv(n_rows, block_r), 1), y, yi, x, x, y, yi, n_rows, n, inner,
            1, n, MODE=0, HAS_XI=False, **meta)
        return y, yi
    if VARIANT != "old" and scan_lookback.applies(n_rows, n, SCAN_CHUNK, acc, op):
        scan_lookback.cumsum_lookback(y, x, n_rows, n, inner, SCAN_CHUNK, reverse)
        return y, yi
    # long rows, few of them: totals per chunk, their scan, then each chunk from its offset
    chunks = cdiv(n, SCAN_CHUNK)
    part_dtype = torch.float64 if acc == tl.float64 else \
        torch.int64 if acc == tl.int64 else torch.float32
    part = empty((n_rows, chunks), part_dtype, x.device)
    parti = empty((n_rows, chunks), torch.int64, x.device) if with_indices else part
    grid = (cdiv(n_rows, block_r), chunks)
    run(_scan_kernel, grid, y, yi, x, x, part, parti, n_rows, n, inner, chunks, SCAN_CHUNK,
        MODE=1, HAS_XI=False, **meta)
    scanned = empty((n_rows, chunks), part_dtype, x.device)
    scanned_i = empty((n_rows, chunks), torch.int64, x.device) if with_indices else scanned
    br, bc, w = _scan_blocks(n_rows, chunks)
    run(_scan_kernel, (cdiv(n_rows, br), 1), scanned, scanned_i, part, parti, part, parti,
        n_rows, chunks, 1, 1, chunks, OP=code, REVERSE=False, MODE=0, HAS_XI=with_indices,
        BLOCK_R=br, BLOCK_C=bc, ACC=acc, num_warps=w)
    run(_scan_kernel, grid, y, yi, x, x, scanned, scanned_i, n_rows, n, inner, chunks,
        SCAN_CHUNK, MODE=2, HAS_XI=False, **meta)
    return y, yi


def _scan_dtype(x, op, dtype):
    if dtype is not None:
        return dtype.torch if isinstance(dtype, dtypes.DType) else dtype
    if op in ("sum", "prod") and not x.dtype.is_floating_point:
        return torch.int64
    return x.dtype


@planned(settings=_variant, arrays=1)
def cumulative(x, dim, op, reverse=False, dtype=None):
    """y[..., j, ...] = x[..., 0, ...] (+) ... (+) x[..., j, ...] along dim for op "sum",
    "prod" or "logsumexp" (from the last element back when reverse). Integers and bools sum and
    multiply to int64 unless dtype is given; floats keep their dtype (half ones computed in
    float32)."""
    _check_scan("cumulative", x, dim)
    return _scan(x, dim, op, reverse, _scan_dtype(x, op, dtype), False)[0]


@planned(arrays=1)
def cumulative_extreme(x, dim, largest=True):
    """(values, indices int64): the running maximum (largest) or minimum along dim and the index
    of its last occurrence so far; NaN propagates (torch.cummax / cummin)."""
    _check_scan("cumulative_extreme", x, dim)
    return _scan(x, dim, "max" if largest else "min", False, x.dtype, True)


def _check_scan(op, x, dim):
    if not isinstance(dim, int) or not 0 <= dim < max(x.dim(), 1):
        raise IndexError(f"{op}: dim must be a normalised axis in [0, {max(x.dim(), 1)}) for "
                         f"shape {tuple(x.shape)}, got {dim!r}")


# ------------------------------------------------------------------------------------ sorting
#
# Keys: a float f (widened to float32, or float64) as its bits b with b ^ ((b >> 31) & 0x7fffffff)
# (signed order = the float order; -0.0 first made +0.0, NaN made the one quiet NaN above +inf);
# integers are their own keys; descending is ~key (reverses the signed order). Pairs (key,
# index) compare lexicographically: a stable order, with ties kept in their original order.
# Memory: a row that fits a tile reads x once and writes values and indices once; longer rows
# write and read (key, index) pairs, 8 or 12 bytes an element, once per merge pass
# (log2(n / T) (log2(n / T) + 1) / 2 passes, plus one tile pass per stage).


@triton.jit
def _sort_tile_kernel(vals_ptr, ind_ptr, keys_out, idx_out, x_ptr, keys_in, idx_in,
                      n_rows, n_cols, n_inner, width_in, width_out, n_out,
                      FROM_X: tl.constexpr, FINAL: tl.constexpr, KEEP: tl.constexpr,
                      DESCENDING: tl.constexpr, KIND: tl.constexpr, MAX_KEY: tl.constexpr,
                      LOG: tl.constexpr, ROWS: tl.constexpr):
    # One program: ROWS rows x tile t = program_id(1) of 2**LOG positions, sorted in registers.
    # In: x's columns (FROM_X) or (key, index) pairs of rows width_in long. Out: the first KEEP
    # of the sorted tile, at t * KEEP on: values gathered from x and int64 indices (FINAL, the
    # first n_out positions of a row) or pairs in rows width_out long.
    row_ok, r64, t, x_base, k, i = _load_tile(x_ptr, keys_in, idx_in, n_rows, n_cols, n_inner,
                                              width_in, FROM_X, DESCENDING, KIND, MAX_KEY, LOG,
                                              ROWS)
    k, i = _bitonic_sort(k, i, LOG, ROWS)
    rank = tl.arange(0, 1 << LOG)
    out_pos = t * KEEP + rank
    if FINAL:
        m = row_ok[:, None] & ((rank < KEEP) & (out_pos < n_out))[None, :]
        v = tl.load(x_ptr + x_base[:, None] + i.to(tl.int64) * n_inner, mask=m, other=0)
        o_base = (r64 // n_inner) * n_out * n_inner + r64 % n_inner
        o = o_base[:, None] + out_pos[None, :] * n_inner
        tl.store(vals_ptr + o, v, mask=m)
        tl.store(ind_ptr + o, i.to(tl.int64), mask=m)
    else:
        m = row_ok[:, None] & ((rank < KEEP) & (out_pos < width_out))[None, :]
        o = r64[:, None] * width_out + out_pos[None, :]
        tl.store(keys_out + o, k, mask=m)
        tl.store(idx_out + o, i, mask=m)


@triton.jit
def _merge_pass_kernel(keys_ptr, idx_ptr, width, span, FLIP: tl.constexpr, BLOCK: tl.constexpr):
    # One program: BLOCK compare-exchanges in row program_id(0) (width = its padded length, a
    # power of two). FLIP: the pairs (p, S - 1 - p) of each block of S = span elements (the
    # first step of merging two sorted runs of S / 2); else the pairs span apart in each block
    # of 2 * span (the half-cleaners that follow).
    row = tl.program_id(0).to(tl.int64)
    p = tl.program_id(1).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = p < width // 2
    if FLIP:
        half = span // 2
        blk = p // half
        off = p % half
        a = blk * span + off
        b = blk * span + span - 1 - off
    else:
        blk = p // span
        off = p % span
        a = blk * 2 * span + off
        b = a + span
    base = row * width
    ka = tl.load(keys_ptr + base + a, mask=ok)
    kb = tl.load(keys_ptr + base + b, mask=ok)
    ia = tl.load(idx_ptr + base + a, mask=ok)
    ib = tl.load(idx_ptr + base + b, mask=ok)
    swap = (ka > kb) | ((ka == kb) & (ia > ib))
    tl.store(keys_ptr + base + a, tl.where(swap, kb, ka), mask=ok)
    tl.store(keys_ptr + base + b, tl.where(swap, ka, kb), mask=ok)
    tl.store(idx_ptr + base + a, tl.where(swap, ib, ia), mask=ok)
    tl.store(idx_ptr + base + b, tl.where(swap, ia, ib), mask=ok)


def _tile_rows(n_rows, tile):
    return max(1, min(next_power_of_2(max(n_rows, 1)), max(1, SORT_TILE // tile)))


def _sorted_rows(x, dim, descending, n_out):
    """The first n_out of each row of x along dim in sorted order: (values, int64 indices)."""
    x, n_rows, n, inner = _rows(x, dim)
    shape = list(x.shape)
    if shape:
        shape[dim] = n_out
    vals = empty(shape, x.dtype, x.device)
    ind = empty(shape, torch.int64, x.device)
    if n_rows == 0 or n_out == 0:
        return vals, ind
    kind, key_dtype, max_key = _key_kind(x.dtype)
    key_meta = dict(DESCENDING=bool(descending), KIND=kind, MAX_KEY=max_key)
    width = next_power_of_2(n)
    if width <= SORT_TILE:
        log = width.bit_length() - 1
        rows = _tile_rows(n_rows, width)
        run(_sort_tile_kernel, (cdiv(n_rows, rows), 1), vals, ind, ind, ind, x, ind, ind,
            n_rows, n, inner, 1, 1, n_out, FROM_X=True, FINAL=True, KEEP=width, LOG=log,
            ROWS=rows, num_warps=num_warps_for(rows * width), **key_meta)
        return vals, ind
    if VARIANT == "radix" and n_out == n and radix_sort.applies(x.dtype, n, SORT_TILE):
        return radix_sort.radix_sort(x, n_rows, n, inner, descending, vals, ind, kind)
    # long rows: sorted tiles, then bitonic merges across tiles in memory
    tile = SORT_TILE
    log = tile.bit_length() - 1
    keys = empty((n_rows, width), key_dtype, x.device)
    idx = empty((n_rows, width), torch.int32, x.device)
    warps = num_warps_for(tile)
    tiles = width // tile
    common = dict(KEEP=tile, LOG=log, ROWS=1, num_warps=warps, **key_meta)
    run(_sort_tile_kernel, (n_rows, tiles), vals, ind, keys, idx, x, keys, idx, n_rows, n,
        inner, width, width, n_out, FROM_X=True, FINAL=False, **common)
    pairs = cdiv(width // 2, MERGE_BLOCK)
    span = 2 * tile
    while span <= width:
        run(_merge_pass_kernel, (n_rows, pairs), keys, idx, width, span, FLIP=True,
            BLOCK=MERGE_BLOCK, num_warps=4)
        stride = span // 4
        while stride >= tile:
            run(_merge_pass_kernel, (n_rows, pairs), keys, idx, width, stride, FLIP=False,
                BLOCK=MERGE_BLOCK, num_warps=4)
            stride //= 2
        final = span == width
        run(_sort_tile_kernel, (n_rows, tiles), vals, ind, keys, idx, x, keys, idx, n_rows,
            n, inner, width, width, n_out, FROM_X=False, FINAL=final, **common)
        span *= 2
    return vals, ind


def _check_dim(op, x, dim):
    if not isinstance(dim, int) or not 0 <= dim < max(x.dim(), 1):
        raise IndexError(f"{op}: dim must be a normalised axis in [0, {max(x.dim(), 1)}) for "
                         f"shape {tuple(x.shape)}, got {dim!r}")


@planned(settings=_variant, arrays=1)
def sort(x, dim, descending=False, stable=False):
    """(values, indices int64) of x sorted along dim; stable in either direction (ties keep
    their order; `stable` is accepted for PyTorch's signature), NaN the largest."""
    _check_dim("sort", x, dim)
    return _sorted_rows(x, dim, descending, x.shape[dim] if x.dim() else 1)


@planned(settings=_variant, arrays=1)
def topk(x, k, dim, largest=True, sorted=True):
    """(values, indices int64) of the k largest (or smallest) along dim, best first (also when
    not `sorted`); ties go to the lower index, NaN is the largest."""
    _check_dim("topk", x, dim)
    x, n_rows, n, inner = _rows(x, dim)
    if VARIANT != "old" and n_rows and topk_select.applies(n, k, SORT_TILE):
        shape = list(x.shape)
        shape[dim] = k
        vals = empty(shape, x.dtype, x.device)
        ind = empty(shape, torch.int64, x.device)
        return topk_select.topk_halving(x, k, n_rows, n, inner, largest, vals, ind, SORT_TILE)
    keep = next_power_of_2(max(k, 1))
    if 2 * keep > SORT_TILE or next_power_of_2(n) <= SORT_TILE or k == 0:
        return _sorted_rows(x, dim, largest, k)
    # per-tile candidates: the best `keep` of every tile, until they fit one tile
    kind, key_dtype, max_key = _key_kind(x.dtype)
    common = dict(DESCENDING=bool(largest), KIND=kind, MAX_KEY=max_key, LOG=SORT_TILE.bit_length()
                  - 1, ROWS=1, num_warps=num_warps_for(SORT_TILE))
    width, from_x, keys, idx = n, True, None, None
    while True:
        tiles = cdiv(width, SORT_TILE)
        if tiles == 1:
            break
        new_width = tiles * keep
        new_keys = empty((n_rows, new_width), key_dtype, x.device)
        new_idx = empty((n_rows, new_width), torch.int32, x.device)
        run(_sort_tile_kernel, (n_rows, tiles), new_keys, new_idx, new_keys, new_idx, x,
            keys if keys is not None else new_keys, idx if idx is not None else new_idx,
            n_rows, n, inner, width, new_width, k, FROM_X=from_x, FINAL=False, KEEP=keep,
            **common)
        width, from_x, keys, idx = new_width, False, new_keys, new_idx
    shape = list(x.shape)
    shape[dim] = k
    vals = empty(shape, x.dtype, x.device)
    ind = empty(shape, torch.int64, x.device)
    run(_sort_tile_kernel, (n_rows, 1), vals, ind, keys, idx, x, keys, idx, n_rows, n, inner,
        width, width, k, FROM_X=False, FINAL=True, KEEP=SORT_TILE, **common)
    return vals, ind


# ------------------------------------------------------------------------- gather / scatter


@triton.jit
def _along_kernel(out_ptr, src_ptr, index_ptr, n, n_idx, n_src, n_dst, n_inner,
                  SCATTER: tl.constexpr, BLOCK: tl.constexpr):
    # p over the index's elements, p = (o, j, i) in its [n_out, n_idx, n_inner] view:
    #   gather:  out[o, j, i] = src[o, index[p], i]          (src rows n_src long)
    #   scatter: out[o, index[p], i] += src[o, j, i]         (out rows n_dst long, atomic)
    # NOTE: indices are clamped into range (internal use: they come from sort, topk, cummax).
    p = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = p < n
    inner = p % n_inner
    outer = p // (n_idx * n_inner)
    j = tl.load(index_ptr + p, mask=ok, other=0)
    if SCATTER:
        j = tl.minimum(tl.maximum(j, 0), n_dst - 1)
        v = tl.load(src_ptr + p, mask=ok, other=0)
        tl.atomic_add(out_ptr + (outer * n_dst + j) * n_inner + inner, v, mask=ok)
    else:
        j = tl.minimum(tl.maximum(j, 0), n_src - 1)
        v = tl.load(src_ptr + (outer * n_src + j) * n_inner + inner, mask=ok, other=0)
        tl.store(out_ptr + p, v, mask=ok)


def _along_geometry(op, x, index, dim):
    if index.dim() != x.dim() or any(a != b for d, (a, b) in
                                     enumerate(zip(index.shape, x.shape)) if d != dim):
        raise ValueError(f"{op}: index of shape {tuple(index.shape)} does not match the source "
                         f"of shape {tuple(x.shape)} outside dim {dim}")
    inner = 1
    for s in index.shape[dim + 1:]:
        inner *= s
    return inner


@planned(arrays=2)
def gather_along(x, index, dim):
    """out[..., j, ...] = x[..., index[..., j, ...], ...] along dim (torch.gather with an index
    of x's shape outside dim). x: any strides; index: int64."""
    inner = _along_geometry("gather_along", x, index, dim)
    x = x if x.is_contiguous() else _contiguous(x)
    index = index if index.is_contiguous() else _contiguous(index)
    out = empty(index.shape, x.dtype, x.device)
    n = index.numel()
    if n:
        run(_along_kernel, (cdiv(n, GATHER_BLOCK),), out, x, index, n, index.shape[dim],
            x.shape[dim], 1, inner, SCATTER=False, BLOCK=GATHER_BLOCK)
    return out


_WIDENED = {torch.float16: torch.float32, torch.bfloat16: torch.float32, torch.uint8: torch.int32}


@planned(arrays=2)
def scatter_add_along(src, index, dim, size):
    """The adjoint of gather_along: out of src's shape with `size` along dim, zeros, then
    out[..., index[..., j, ...], ...] += src[..., j, ...]. Accumulates in float32 for half
    types and in int32 for uint8 (atomics take neither; the cast back wraps as uint8 sums
    would); repeated indices add up in no fixed order (float atomics)."""
    inner = _along_geometry("scatter_add_along", src, index, dim)
    src = src if src.is_contiguous() else _contiguous(src)
    index = index if index.is_contiguous() else _contiguous(index)
    shape = list(src.shape)
    shape[dim] = size
    wide = src.dtype in _WIDENED
    out = empty(shape, _WIDENED.get(src.dtype, src.dtype), src.device)
    _fill(out, 0)
    n = index.numel()
    if n:
        run(_along_kernel, (cdiv(n, GATHER_BLOCK),), out, src, index, n, index.shape[dim],
            1, size, inner, SCATTER=True, BLOCK=GATHER_BLOCK)
    if wide:
        from .elementwise import cast
        out = cast(out, dtypes.get_dtype(src.dtype))
    return out
