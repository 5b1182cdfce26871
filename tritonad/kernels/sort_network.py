"""The sorting network the sort and topk kernels share: order keys and a bitonic sort in
registers.

Keys: a float f (widened to float32, or float64) as its bits b with b ^ ((b >> 31) & 0x7fffffff)
(signed order = the float order; -0.0 first made +0.0, NaN made the one quiet NaN above +inf);
integers are their own keys; descending is ~key (reverses the signed order). Pairs (key,
index) compare lexicographically: a stable order, with ties kept in their original order.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _order_key(x, DESCENDING: tl.constexpr, KIND: tl.constexpr):
    # KIND 0: floats of <= 32 bits -> int32; 1: float64 -> int64; 2: integers of <= 32 bits
    # -> int32; 3: int64
    if KIND == 0:
        v = x.to(tl.float32)
        v = tl.where(v == 0, 0.0, v)
        b = v.to(tl.int32, bitcast=True)
        b = tl.where(v != v, 0x7FC00000, b)
        key = b ^ ((b >> 31) & 0x7FFFFFFF)
    elif KIND == 1:
        v = tl.where(x == 0, 0.0, x)
        b = v.to(tl.int64, bitcast=True)
        b = tl.where(v != v, 0x7FF8000000000000, b)
        key = b ^ ((b >> 63) & 0x7FFFFFFFFFFFFFFF)
    elif KIND == 2:
        key = x.to(tl.int32)
    else:
        key = x.to(tl.int64)
    if DESCENDING:
        key = ~key
    return key


@triton.jit
def _load_tile(x_ptr, keys_in, idx_in, n_rows, n_cols, n_inner, width_in, FROM_X: tl.constexpr,
               DESCENDING: tl.constexpr, KIND: tl.constexpr, MAX_KEY: tl.constexpr,
               LOG: tl.constexpr, ROWS: tl.constexpr):
    # The tile of the sort and topk kernels' program (program_id(0), program_id(1)): ROWS rows
    # by tile t's 2**LOG positions, as (rows in range, rows as int64, t, x's row offsets, keys,
    # indices). In: x's columns as order keys (FROM_X; x viewed as [outer, n_cols, n_inner],
    # a row one (outer, inner) pair) or (key, index) pairs of rows width_in long. Positions
    # past a row pad with MAX_KEY and index 2**31 - 1, which sort after everything real.
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    row_ok = rows < n_rows
    r64 = rows.to(tl.int64)
    t = tl.program_id(1).to(tl.int64)
    pos = t * (1 << LOG) + tl.arange(0, 1 << LOG)
    x_base = (r64 // n_inner) * n_cols * n_inner + r64 % n_inner
    if FROM_X:
        ok = row_ok[:, None] & (pos < n_cols)[None, :]
        x = tl.load(x_ptr + x_base[:, None] + pos[None, :] * n_inner, mask=ok, other=0)
        k = _order_key(x, DESCENDING, KIND)
        i = tl.broadcast_to(pos.to(tl.int32)[None, :], [ROWS, 1 << LOG])
    else:
        ok = row_ok[:, None] & (pos < width_in)[None, :]
        at = r64[:, None] * width_in + pos[None, :]
        k = tl.load(keys_in + at, mask=ok, other=0)
        i = tl.load(idx_in + at, mask=ok, other=0)
    k = tl.where(ok, k, MAX_KEY)
    i = tl.where(ok, i, 2147483647)
    return row_ok, r64, t, x_base, k, i


@triton.jit
def _bitonic_sort(k, i, LOG: tl.constexpr, ROWS: tl.constexpr):
    # each row of k [ROWS, 2**LOG] ascending by (key, index), i carried along. A step
    # compare-exchanges the pairs 2**(LOG - level - 1) apart: the smaller (key, index) pair
    # first, unless flip (a descending run of the network). (One function, no nested calls:
    # the interpreter pays per call.)
    for stage in tl.static_range(1, LOG + 1):
        if stage < LOG:  # runs of 2**stage alternate up and down
            flip = tl.reshape(tl.broadcast_to(tl.arange(0, 2)[None, :, None],
                                              [ROWS * (1 << (LOG - 1 - stage)), 2, 1 << stage]),
                              [ROWS, 1 << LOG])
        else:
            flip = tl.zeros([ROWS, 1 << LOG], tl.int32)
        for step in tl.static_range(stage):
            # pairs as [groups, 2, distance] -> the two sides, each [groups, distance]
            kl, kr = tl.split(tl.permute(tl.reshape(
                k, [ROWS << (step + LOG - stage), 2, 1 << (stage - step - 1)]), (0, 2, 1)))
            il, ir = tl.split(tl.permute(tl.reshape(
                i, [ROWS << (step + LOG - stage), 2, 1 << (stage - step - 1)]), (0, 2, 1)))
            down, _ = tl.split(tl.permute(tl.reshape(
                flip, [ROWS << (step + LOG - stage), 2, 1 << (stage - step - 1)]), (0, 2, 1)))
            swap = ((kl > kr) | ((kl == kr) & (il > ir))) != (down != 0)
            k = tl.reshape(tl.permute(tl.join(tl.where(swap, kr, kl), tl.where(swap, kl, kr)),
                                      (0, 2, 1)), [ROWS, 1 << LOG])
            i = tl.reshape(tl.permute(tl.join(tl.where(swap, ir, il), tl.where(swap, il, ir)),
                                      (0, 2, 1)), [ROWS, 1 << LOG])
    return k, i


@triton.jit
def _half_clean(k, i, LOG: tl.constexpr, ROWS: tl.constexpr):
    # each row of k [ROWS, 2**LOG], a bitonic sequence of (key, index) pairs, made ascending
    # (i carried along): the half-cleaners 2**(LOG - 1), ..., 1 apart, the last stage of a
    # bitonic sort.
    for step in tl.static_range(LOG):
        kl, kr = tl.split(tl.permute(tl.reshape(
            k, [ROWS << step, 2, 1 << (LOG - step - 1)]), (0, 2, 1)))
        il, ir = tl.split(tl.permute(tl.reshape(
            i, [ROWS << step, 2, 1 << (LOG - step - 1)]), (0, 2, 1)))
        swap = (kl > kr) | ((kl == kr) & (il > ir))
        k = tl.reshape(tl.permute(tl.join(tl.where(swap, kr, kl), tl.where(swap, kl, kr)),
                                  (0, 2, 1)), [ROWS, 1 << LOG])
        i = tl.reshape(tl.permute(tl.join(tl.where(swap, ir, il), tl.where(swap, il, ir)),
                                  (0, 2, 1)), [ROWS, 1 << LOG])
    return k, i


def _key_kind(dtype):
    """(KIND, key torch dtype, the largest key)."""
    if dtype == torch.float64:
        return 1, torch.int64, 2 ** 63 - 1
    if dtype.is_floating_point:
        return 0, torch.int32, 2 ** 31 - 1
    if dtype == torch.int64:
        return 3, torch.int64, 2 ** 63 - 1
    return 2, torch.int32, 2 ** 31 - 1
