"""topk by halving: the best K = next_pow2(k) of a tile without sorting the whole tile.

A tile of T columns is cut into runs of K; each run is sorted in registers (the bitonic
network, 1 + ... + log2 K steps), the odd runs descending. Then, log2(T / K) times: each
ascending run A is paired with the descending run B beside it, and min(A[p], B[p]) (by (key,
index)) keeps the best K of the 2K as a bitonic sequence (the first half-cleaner of a bitonic
merge), which log2 K half-cleaner steps sort again (alternating directions, the last one
ascending). Per element that is log2 K (log2 K + 1) / 2 compare-exchanges for the run sort and
about (log2 K + 1) over all the halvings, against log2 T (log2 T + 1) / 2 for sorting the tile:
for T = 2048, K = 64, 28 against 66.

Long rows: every tile's best K (pass 1, from x) are written as runs that alternate ascending
and descending, so the next pass over those candidates starts at the halvings; passes repeat
until the candidates fit one tile, whose best k are the result (values gathered from x, int64
indices), best first, ties to the lower index, NaN the largest (as scan.py's sort).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .launch import cdiv, next_power_of_2, num_warps_for
from .plans import empty, run
from .sort_network import _bitonic_sort, _half_clean, _key_kind, _load_tile


# Memory per pass: the tile read once (x's elements, or 8 bytes a candidate pair) and K pairs
# written per tile (8 bytes each), or the k results (value and int64 index) per row at the end.
@triton.jit
def _topk_halving_kernel(vals_ptr, ind_ptr, keys_out, idx_out, x_ptr, keys_in, idx_in,
                         n_rows, n_cols, n_inner, width_in, width_out, n_out,
                         FROM_X: tl.constexpr, FINAL: tl.constexpr,
                         DESCENDING: tl.constexpr, KIND: tl.constexpr, MAX_KEY: tl.constexpr,
                         LOG: tl.constexpr, LOG_KEEP: tl.constexpr, ROWS: tl.constexpr):
    # One program: ROWS rows x tile t = program_id(1) of 2**LOG positions of x (FROM_X) or of
    # candidate pairs (rows width_in long, in runs of 2**LOG_KEEP that alternate ascending and
    # descending). Out: the tile's best 2**LOG_KEEP, ascending: the first n_out as values and
    # int64 indices (FINAL), or pairs at t * 2**LOG_KEEP in rows width_out long, descending
    # when t is odd.
    row_ok, r64, t, x_base, k, i = _load_tile(x_ptr, keys_in, idx_in, n_rows, n_cols, n_inner,
                                              width_in, FROM_X, DESCENDING, KIND, MAX_KEY, LOG,
                                              ROWS)
    k = tl.reshape(k, [ROWS << (LOG - LOG_KEEP), 1 << LOG_KEEP])
    i = tl.reshape(i, [ROWS << (LOG - LOG_KEEP), 1 << LOG_KEEP])
    if FROM_X:
        # sort every run, the odd ones descending: ~ reverses the order of keys and of indices
        odd = ((tl.arange(0, ROWS << (LOG - LOG_KEEP)) % 2) == 1)[:, None]
        k = tl.where(odd, ~k, k)
        i = tl.where(odd, ~i, i)
        k, i = _bitonic_sort(k, i, LOG_KEEP, ROWS << (LOG - LOG_KEEP))
        k = tl.where(odd, ~k, k)
        i = tl.where(odd, ~i, i)
    for level in tl.static_range(LOG - LOG_KEEP):
        # runs 2r (ascending) and 2r + 1 (descending) -> the best KEEP of both, bitonic
        ka, kb = tl.split(tl.permute(tl.reshape(k, [ROWS << (LOG - LOG_KEEP - level - 1), 2, 1 << LOG_KEEP]), (0, 2, 1)))
        ia, ib = tl.split(tl.permute(tl.reshape(i, [ROWS << (LOG - LOG_KEEP - level - 1), 2, 1 << LOG_KEEP]), (0, 2, 1)))
        take_b = (kb < ka) | ((kb == ka) & (ib < ia))
        k = tl.where(take_b, kb, ka)
        i = tl.where(take_b, ib, ia)
        # sorted again: alternating while a row still has several runs, then ascending
        if level < LOG - LOG_KEEP - 1:
            odd = ((tl.arange(0, ROWS << (LOG - LOG_KEEP - level - 1)) % 2) == 1)[:, None]
            k = tl.where(odd, ~k, k)
            i = tl.where(odd, ~i, i)
            k, i = _half_clean(k, i, LOG_KEEP, ROWS << (LOG - LOG_KEEP - level - 1))
            k = tl.where(odd, ~k, k)
            i = tl.where(odd, ~i, i)
        else:
            k, i = _half_clean(k, i, LOG_KEEP, ROWS << (LOG - LOG_KEEP - level - 1))
    rank = tl.arange(0, 1 << LOG_KEEP)
    if FINAL:
        m = row_ok[:, None] & (rank < n_out)[None, :]
        v = tl.load(x_ptr + x_base[:, None] + i.to(tl.int64) * n_inner, mask=m, other=0)
        o_base = (r64 // n_inner) * n_out * n_inner + r64 % n_inner
        o = o_base[:, None] + rank.to(tl.int64)[None, :] * n_inner
        tl.store(vals_ptr + o, v, mask=m)
        tl.store(ind_ptr + o, i.to(tl.int64), mask=m)
    else:
        out_pos = t * (1 << LOG_KEEP) + tl.where(t % 2 == 1, (1 << LOG_KEEP) - 1 - rank, rank)
        m = row_ok[:, None] & (out_pos < width_out)[None, :]
        o = r64[:, None] * width_out + out_pos[None, :]
        tl.store(keys_out + o, k, mask=m)
        tl.store(idx_out + o, i, mask=m)


def applies(n, k, tile):
    """Whether topk of k from rows of n goes by halving (tiles of at most `tile` columns)."""
    keep = next_power_of_2(max(k, 1))
    return k > 0 and 2 * keep <= tile and n > keep


def topk_halving(x, k, n_rows, n, inner, largest, vals, ind, tile):
    """vals, ind (x's row rule with k along the dim) = the best k of each row of contiguous x
    (n_rows rows of n, inner apart), tiles of at most `tile` (a power of two) columns."""
    kind, key_dtype, max_key = _key_kind(x.dtype)
    keep = next_power_of_2(k)
    meta = dict(DESCENDING=bool(largest), KIND=kind, MAX_KEY=max_key,
                LOG_KEEP=keep.bit_length() - 1)
    width, from_x, keys, idx = n, True, vals, ind
    while True:
        span = max(min(tile, next_power_of_2(width)), 2 * keep)
        log = span.bit_length() - 1
        tiles = cdiv(width, span)
        if tiles == 1:
            rows = max(1, min(next_power_of_2(n_rows), tile // span))
            run(_topk_halving_kernel, (cdiv(n_rows, rows), 1), vals, ind, keys, idx, x, keys,
                idx, n_rows, n, inner, width, width, k, FROM_X=from_x, FINAL=True, LOG=log,
                ROWS=rows, num_warps=num_warps_for(rows * span), **meta)
            return vals, ind
        new_width = tiles * keep
        new_keys = empty((n_rows, new_width), key_dtype, x.device)
        new_idx = empty((n_rows, new_width), torch.int32, x.device)
        run(_topk_halving_kernel, (n_rows, tiles), vals, ind, new_keys, new_idx, x, keys, idx,
            n_rows, n, inner, width, new_width, k, FROM_X=from_x, FINAL=False, LOG=log, ROWS=1,
            num_warps=num_warps_for(span), **meta)
        width, from_x, keys, idx = new_width, False, new_keys, new_idx
