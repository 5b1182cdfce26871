"""Reductions: sum, mean, max, min, argmax, argmin and var over any set of dims, on strided
inputs.

The launcher views the input as a 2-d problem without moving it: the kept dims (in order) index
the outputs m, the reduced dims (in order) index the reduction r, and each group is collapsed
(neighbours merged where the strides allow). The reduced group becomes an "inner" dim, walked in
blocks of BLOCK_R lanes, and at most two "outer" dims, walked by a scalar loop; the kept group is
at most three dims, split into coordinates once per program. A program owns BLOCK_M outputs and
accumulates a [BLOCK_M, BLOCK_R] tile elementwise, reducing it across lanes once at the end.

Two tile orientations keep loads coalesced:
- rows   (the reduced inner dim has the smaller stride, e.g. sum over the last axis):
  tile [BLOCK_M, BLOCK_R], lanes along r.
- columns (a kept dim is contiguous, e.g. the bias gradient (N, C) -> (C)): tile [BLOCK_R,
  BLOCK_M], lanes along m, the loop walking down the rows.
When there are too few outputs to fill the GPU (a full sum, (N, C) -> (C) with small C), the
reduction loop is split across SPLIT programs writing float32 (or int64) partials [SPLIT, M],
and a second launch of the same kernel reduces those (columns orientation).

Half types accumulate in float32, integers and bools sum in int64. var is two passes (the mean,
then the sum of squared deviations from it), which is accurate without Welford updates.
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from .. import dtypes
from .elementwise import INT32_LIMIT, cast_for_store, collapse, copy_, div
from .launch import INTERPRET, cdiv, dtype_of, next_power_of_2
from .plans import empty, planned, run

PRIMITIVES = ("sum", "mean", "max", "min", "argmax", "argmin", "var", "count_correct_")

TILE, ARG_TILE = 4096, 2048    # elements of the accumulator tile (arg ops carry an index too)
INTERPRET_TILE = 1 << 15       # the interpreter pays per op, not per element: large tiles
MAX_BLOCK_M_COLS = 256         # lanes across a contiguous kept dim
SMALL_BLOCK_M_COLS = 32        # ... in a reduction too small to split
MIN_CHUNKS_PER_PROGRAM = 2     # split the loop no finer than this
SPLIT_MIN_ELEMENTS = 1 << 17   # below this a second launch costs more than one program's loop
_sm_count = {}
_abs, _max, _min, _sum = abs, max, min, sum  # this module defines its own sum, max and min
# programs per SM the split aims for; the interpreter runs programs one by one: no split
PROGRAMS_PER_SM = 4
split_target_override = None   # tests set this to exercise the split path on the CPU


# ----------------------------------------------------------------------------------- kernels


@triton.jit
def _max_combine(a, b):
    return tl.where((a > b) | (a != a), a, b)  # NaN wins: max propagates it


@triton.jit
def _min_combine(a, b):
    return tl.where((a < b) | (a != a), a, b)


@triton.jit
def _argmax_combine(a, index_a, b, index_b):
    # (a, index_a) wins if larger, or NaN (numpy returns the first NaN), or equal and earlier
    a_nan = a != a
    b_nan = b != b
    better = (a > b) | (a_nan & ~b_nan)
    same = (a == b) | (a_nan & b_nan)
    take_a = better | (same & (index_a < index_b))
    return tl.where(take_a, a, b), tl.where(take_a, index_a, index_b)


@triton.jit
def _argmin_combine(a, index_a, b, index_b):
    a_nan = a != a
    b_nan = b != b
    better = (a < b) | (a_nan & ~b_nan)
    same = (a == b) | (a_nan & b_nan)
    take_a = better | (same & (index_a < index_b))
    return tl.where(take_a, a, b), tl.where(take_a, index_a, index_b)


@triton.jit(do_not_specialize=["divisor"])
def _reduce_kernel(x_ptr, x_index_ptr, mean_ptr, out_ptr, out_index_ptr,
                   n_kept, size_k1, size_k2, stride_k0, stride_k1, stride_k2,
                   n_inner, stride_inner, size_o1, stride_o0, stride_o1,
                   inner_chunks, n_chunks, chunks_per_split, divisor,
                   OP: tl.constexpr, ACC: tl.constexpr, IS_FLOAT: tl.constexpr,
                   IDENTITY: tl.constexpr,
                   AXIS: tl.constexpr, HAS_INDEX_IN: tl.constexpr, WRITE_VALUES: tl.constexpr,
                   WRITE_INDEX: tl.constexpr, DIVIDE: tl.constexpr, INT64: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_R: tl.constexpr):
    # One program: outputs m in [pid_m * BLOCK_M, +BLOCK_M), over reduction chunks
    # [pid_s * chunks_per_split, +chunks_per_split); chunk c = (outer index o, inner block rb).
    pid_m = tl.program_id(0)
    pid_s = tl.program_id(1)
    m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    mask_m = m < n_kept
    if INT64:
        m = m.to(tl.int64)
    k2 = m % size_k2
    rest = m // size_k2
    k1 = rest % size_k1
    k0 = rest // size_k1
    off_m = k0 * stride_k0 + k1 * stride_k1 + k2 * stride_k2
    if AXIS == 0:  # columns: lanes along m, the tile reduced down axis 0
        lane = tl.arange(0, BLOCK_R)[:, None]
        off_m = off_m[None, :]
        tile_mask_m = mask_m[None, :]
        acc = tl.full((BLOCK_R, BLOCK_M), IDENTITY, ACC)
        acc_index = tl.full((BLOCK_R, BLOCK_M), 2**62, tl.int64)
    else:
        lane = tl.arange(0, BLOCK_R)[None, :]
        off_m = off_m[:, None]
        tile_mask_m = mask_m[:, None]
        acc = tl.full((BLOCK_M, BLOCK_R), IDENTITY, ACC)
        acc_index = tl.full((BLOCK_M, BLOCK_R), 2**62, tl.int64)
    if OP == "sumsq":  # squared deviations from the per-output mean
        mu = tl.load(mean_ptr + m, mask=mask_m, other=0)
        if AXIS == 0:
            mu = mu[None, :]
        else:
            mu = mu[:, None]
    if INT64:
        c_begin = pid_s.to(tl.int64) * chunks_per_split
    else:
        c_begin = pid_s * chunks_per_split
    c_end = tl.minimum(c_begin + chunks_per_split, n_chunks)
    for c in range(c_begin, c_end):
        o = c // inner_chunks
        r = (c - o * inner_chunks) * BLOCK_R + lane
        base = (o // size_o1) * stride_o0 + (o % size_o1) * stride_o1
        mask = tile_mask_m & (r < n_inner)
        offs = base + off_m + r * stride_inner
        v = tl.load(x_ptr + offs, mask=mask, other=0).to(ACC)
        if OP == "sum":
            acc += v
        elif OP == "sumsq":
            d = v - mu
            acc += tl.where(mask, d * d, 0)
        elif OP == "max":
            acc = _max_combine(tl.where(mask, v, IDENTITY), acc)
        elif OP == "min":
            acc = _min_combine(tl.where(mask, v, IDENTITY), acc)
        else:
            if HAS_INDEX_IN:  # a second pass: the partials carry their indices
                index = tl.load(x_index_ptr + offs, mask=mask, other=0)
            else:  # flat index over the reduced dims, C order
                index = o.to(tl.int64) * n_inner + r
            index = tl.where(mask, index, 2**62)  # masked lanes lose every tie
            v = tl.where(mask, v, IDENTITY)
            if OP == "argmax":
                acc, acc_index = _argmax_combine(v, index, acc, acc_index)
            else:
                acc, acc_index = _argmin_combine(v, index, acc, acc_index)
    # across the lanes: built-in max/min reductions (a tuple reduction with a custom combine is
    # slow under the interpreter); NaN handled on the side, the first index among the hits
    if OP == "sum" or OP == "sumsq":
        result = tl.sum(acc, axis=AXIS)
    else:
        if OP == "max" or OP == "argmax":
            best = tl.max(acc, axis=AXIS)
        else:
            best = tl.min(acc, axis=AXIS)
        result = best
        if IS_FLOAT:
            nan = acc != acc
            has_nan = tl.max(nan.to(tl.int32), axis=AXIS) > 0
            result = tl.where(has_nan, float("nan"), best)
        if OP == "argmax" or OP == "argmin":
            if AXIS == 0:
                hit = acc == best[None, :]
                if IS_FLOAT:
                    hit = tl.where(has_nan[None, :], nan, hit)
            else:
                hit = acc == best[:, None]
                if IS_FLOAT:
                    hit = tl.where(has_nan[:, None], nan, hit)
            result_index = tl.min(tl.where(hit, acc_index, 2**62), axis=AXIS)
    if DIVIDE:
        if ACC == tl.float32:
            result = tl.div_rn(result, divisor.to(ACC))  # NOTE: IEEE division, as numpy
        else:
            result = result / divisor.to(ACC)
    out_offs = pid_s * n_kept + m  # partials are [SPLIT, M]; the final output is [M]
    if WRITE_VALUES:
        tl.store(out_ptr + out_offs, cast_for_store(result, out_ptr), mask=mask_m)
    if WRITE_INDEX:
        tl.store(out_index_ptr + out_offs, result_index, mask=mask_m)


# ----------------------------------------------------------------------------------- planning


def _identity(op, acc):
    """The value masked lanes hold: the identity of the op in the accumulator type."""
    if op in ("sum", "sumsq"):
        return 0
    low = op in ("max", "argmax")
    if acc in (tl.float32, tl.float64):
        return float("-inf") if low else float("inf")
    bits = 63 if acc == tl.int64 else 31
    return -2**bits if low else 2**bits - 1


def _settings():
    return split_target_override


def _split_target(device):
    """How many programs a reduction should spread over (1 under the interpreter)."""
    if split_target_override is not None:
        return split_target_override
    if INTERPRET:
        return 1
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _sm_count:
        _sm_count[index] = torch.cuda.get_device_properties(index).multi_processor_count
    return PROGRAMS_PER_SM * _sm_count[index]


def _layout(x, dims):
    """(kept sizes, kept strides, reduced sizes, reduced strides), each group collapsed; None if
    a group keeps more dims than the kernel walks."""
    kept = [i for i in range(x.dim()) if i not in dims]
    k_sizes, k_strides = _collapse_group(x, kept)
    r_sizes, r_strides = _collapse_group(x, dims)
    if len(k_sizes) > 3 or len(r_sizes) > 3:
        return None
    return k_sizes, k_strides, r_sizes, r_strides


def _collapse_group(x, group):
    """(sizes, strides) of x's dims in group, collapsed; a group with a size 0 is one dim [0]."""
    sizes = [x.shape[i] for i in group]
    if 0 in sizes:
        return [0], [0]
    sizes, (strides,) = collapse(sizes, [[x.stride(i) for i in group]])
    return sizes, strides


def _reduce(op, x, dims, out, acc, x_index=None, mean=None, divisor=None, values=True,
            out_index=None, allow_split=True):
    """Reduce x over dims into out (contiguous, kept dims in order) and/or out_index."""
    layout = _layout(x, dims)
    if layout is None:
        # more dims than the kernel walks: one copy into [kept..., reduced...] order first
        kept = [i for i in range(x.dim()) if i not in dims]
        view = x.permute(kept + list(dims))
        x = copy_(empty(view.shape, x.dtype, x.device), view)
        dims = tuple(range(len(kept), x.dim()))
        layout = _layout(x, dims)
    k_sizes, k_strides, r_sizes, r_strides = layout
    n_kept, n_reduced = math.prod(k_sizes), math.prod(r_sizes)
    if n_kept == 0:
        return
    k_sizes, k_strides = [1] * (3 - len(k_sizes)) + k_sizes, [0] * (3 - len(k_strides)) + k_strides
    r_sizes = [1] * (3 - len(r_sizes)) + r_sizes
    r_strides = [0] * (3 - len(r_strides)) + r_strides
    n_inner, stride_inner = r_sizes[2], r_strides[2]
    cols = n_kept > 1 and k_strides[2] != 0 and _abs(k_strides[2]) < _abs(stride_inner)

    arg = op in ("argmax", "argmin")
    tile = INTERPRET_TILE if INTERPRET else (ARG_TILE if arg else TILE)
    if cols:
        block_m = _max(1, _min(next_power_of_2(n_kept), tile if INTERPRET else MAX_BLOCK_M_COLS))
        if not INTERPRET and n_kept * n_reduced < SPLIT_MIN_ELEMENTS:
            # a small sum (a bias gradient [128, 256] -> [256]) is not split: narrower column
            # blocks give it more programs, each summing its rows in one tile
            block_m = _min(block_m, SMALL_BLOCK_M_COLS)
        block_r = _max(1, _min(tile // block_m, next_power_of_2(n_inner)))
    else:
        block_r = _max(1, _min(next_power_of_2(n_inner), tile))
        block_m = _max(1, _min(tile // block_r, next_power_of_2(n_kept)))
    m_blocks = cdiv(n_kept, block_m)
    inner_chunks = cdiv(n_inner, block_r)
    n_chunks = inner_chunks * r_sizes[0] * r_sizes[1]
    split, target = 1, _split_target(x.device)
    if allow_split and m_blocks < target and n_chunks >= 2 * MIN_CHUNKS_PER_PROGRAM \
            and n_kept * n_reduced >= SPLIT_MIN_ELEMENTS:
        split = _min(cdiv(target, m_blocks), n_chunks // MIN_CHUNKS_PER_PROGRAM)
    chunks_per_split = cdiv(n_chunks, split) if n_chunks else 0
    split = cdiv(n_chunks, chunks_per_split) if n_chunks else 1

    final = split == 1
    if final:
        dest, dest_index = out, out_index
    else:
        dest = empty((split, n_kept), _torch_type(acc), x.device)
        dest_index = empty((split, n_kept), torch.int64, x.device) if arg \
            else None
    dummy = dest if dest is not None else dest_index
    max_offset = _sum((s - 1) * _abs(st) for s, st in zip(k_sizes + r_sizes,
                                                          k_strides + r_strides))
    int64 = _max(max_offset, split * n_kept, n_reduced) >= INT32_LIMIT
    tile_elems = block_m * block_r
    run(_reduce_kernel, (m_blocks, split),
        x, x_index if x_index is not None else x, mean if mean is not None else x,
        dest if dest is not None else dummy, dest_index if dest_index is not None else dummy,
        n_kept, k_sizes[1], k_sizes[2], *k_strides,
        n_inner, stride_inner, r_sizes[1], r_strides[0], r_strides[1],
        inner_chunks, n_chunks, chunks_per_split, divisor if final and divisor is not None else 1,
        OP=op, ACC=acc, IS_FLOAT=acc in (tl.float32, tl.float64), IDENTITY=_identity(op, acc),
        AXIS=0 if cols else 1, HAS_INDEX_IN=x_index is not None,
        WRITE_VALUES=(values or not final) and dest is not None,
        WRITE_INDEX=arg and dest_index is not None, DIVIDE=final and divisor is not None,
        INT64=int64, BLOCK_M=block_m, BLOCK_R=block_r,
        num_warps=8 if tile_elems >= 4096 else 4 if tile_elems >= 1024 else 2)
    if not final:  # reduce the [SPLIT, M] partials down their columns
        second = {"sumsq": "sum"}.get(op, op)
        _reduce(second, dest, (0,), out, acc, x_index=dest_index, divisor=divisor,
                values=values, out_index=out_index, allow_split=False)


_TORCH = {tl.float32: torch.float32, tl.float64: torch.float64, tl.int64: torch.int64,
          tl.int32: torch.int32}


def _torch_type(acc):
    return _TORCH[acc]


# ----------------------------------------------------------------------------------- launchers


def _normalise(op, x, dims):
    if dims is None:
        return tuple(range(x.dim()))
    if isinstance(dims, int):
        dims = (dims,)
    ndim = _max(x.dim(), 1)
    out = []
    for d in dims:
        if not -ndim <= d < ndim:
            raise IndexError(f"{op}: dim {d} is out of range for a tensor of shape "
                             f"{tuple(x.shape)}")
        out.append(d % ndim)
    if x.dim() == 0:
        return ()
    return tuple(sorted(set(out)))


def _out_shape(x, dims, keepdim):
    if keepdim:
        return tuple(1 if i in dims else s for i, s in enumerate(x.shape))
    return tuple(s for i, s in enumerate(x.shape) if i not in dims)


def _float_acc(dtype):
    return tl.float64 if dtype is dtypes.float64 or not dtype.is_floating_point else tl.float32


def _value_acc(dtype):
    """Accumulator of max/min/argmax: the values' own type (float32 for halves)."""
    if dtype.is_floating_point:
        return tl.float64 if dtype is dtypes.float64 else tl.float32
    return tl.int64 if dtype is dtypes.int64 else tl.int32


@planned(settings=_settings, arrays=1)
def sum(x, dims=None, keepdim=False, dtype=None, out=None):
    """Sum over dims. x: [any shape], any strides. Bool and integer inputs sum to int64 unless
    dtype is given; floats keep their dtype, accumulating in float32 at least. `out`: an
    existing contiguous array of the result's shape and dtype to write into."""
    in_dtype = dtype_of(x)
    if dtype is None:
        dtype = in_dtype if in_dtype.is_floating_point else dtypes.int64
    dtype = dtypes.get_dtype(dtype)
    acc = (tl.float64 if dtype is dtypes.float64 else tl.float32) if dtype.is_floating_point \
        else tl.int64
    dims = _normalise("sum", x, dims)
    shape = _out_shape(x, dims, keepdim)
    if out is None:
        out = empty(shape, dtype.torch, x.device)
    elif tuple(out.shape) != tuple(shape) or out.dtype != dtype.torch or not out.is_contiguous():
        raise ValueError(f"sum: out must be a contiguous {tuple(shape)} {dtype.name} array, got "
                         f"{tuple(out.shape)} {dtype_of(out).name}")
    _reduce("sum", x, dims, out, acc)
    return out


@planned(settings=_settings, arrays=1)
def mean(x, dims=None, keepdim=False):
    """Mean over dims (sum / count, NaN for an empty reduction). x: [any shape]."""
    dtype = dtype_of(x)
    dims = _normalise("mean", x, dims)
    count = math.prod(x.shape[d] for d in dims)
    out = empty(_out_shape(x, dims, keepdim), dtype.torch, x.device)
    _reduce("sum", x, dims, out, _float_acc(dtype), divisor=count)
    return out


@planned(settings=_settings, arrays=1)
def var(x, dims=None, correction=1, keepdim=False):
    """Variance over dims: sum((x - mean)^2) / max(n - correction, 0), two passes."""
    dtype = dtype_of(x)
    dims = _normalise("var", x, dims)
    count = math.prod(x.shape[d] for d in dims)
    acc = _float_acc(dtype)
    shape = _out_shape(x, dims, keepdim)
    centre = empty(shape, _torch_type(acc), x.device)
    _reduce("sum", x, dims, centre, acc, divisor=count)
    out = empty(shape, dtype.torch, x.device)
    divisor = _max(count - correction, 0)
    if divisor == int(divisor):
        _reduce("sumsq", x, dims, out, acc, mean=centre, divisor=int(divisor))
        return out
    # a fractional correction (PyTorch takes any number): the kernel divides by an integer
    # count, so the sum of squares stays in the accumulator type and one division follows
    total = empty(shape, _torch_type(acc), x.device)
    _reduce("sumsq", x, dims, total, acc, mean=centre)
    return div(total, float(divisor), out=out)



def _extreme(op, x, dims, keepdim):
    if x.numel() == 0:
        raise RuntimeError(f"{op}: cannot reduce an empty tensor of shape {tuple(x.shape)}")
    dtype = dtype_of(x)
    dims = _normalise(op, x, dims)
    out = empty(_out_shape(x, dims, keepdim), dtype.torch, x.device)
    _reduce(op, x, dims, out, _value_acc(dtype))
    return out


@planned(settings=_settings, arrays=1)
def max(x, dims=None, keepdim=False):
    """Largest value over dims (NaN propagates). Empty x raises RuntimeError."""
    return _extreme("max", x, dims, keepdim)


@planned(settings=_settings, arrays=1)
def min(x, dims=None, keepdim=False):
    """Smallest value over dims (NaN propagates). Empty x raises RuntimeError."""
    return _extreme("min", x, dims, keepdim)


def _arg(op, x, dim, keepdim):
    if x.numel() == 0:
        raise RuntimeError(f"{op}: cannot reduce an empty tensor of shape {tuple(x.shape)}")
    dtype = dtype_of(x)
    if dim is None:  # over the flattened x: the flat C-order index of x's shape
        dims = tuple(range(x.dim()))
        shape = (1,) * x.dim() if keepdim else ()
    else:
        dims = _normalise(op, x, (dim,))
        shape = _out_shape(x, dims, keepdim)
    out = empty(shape, torch.int64, x.device)
    _reduce(op, x, dims, None, _value_acc(dtype), values=False, out_index=out)
    return out


@planned(settings=_settings, arrays=1)
def argmax(x, dim=None, keepdim=False):
    """int64 index of the first largest value along dim (over the flattened x if None); the
    first NaN counts as largest, as numpy."""
    return _arg("argmax", x, dim, keepdim)


@planned(settings=_settings, arrays=1)
def argmin(x, dim=None, keepdim=False):
    """int64 index of the first smallest value along dim (the first NaN, if any)."""
    return _arg("argmin", x, dim, keepdim)


@triton.jit
def _count_correct_kernel(logits_ptr, target_ptr, counter_ptr, n_rows, n_cols,
                          stride_lr, stride_lc, stride_t,
                          BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    # One program: BLOCK_R rows. Each row's first largest logit (NOTE: NaN is taken as +inf) is
    # compared with the row's target; the program adds its hits to the counter atomically.
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    row_ok = rows < n_rows
    row_off = rows.to(tl.int64) * stride_lr
    best = tl.full([BLOCK_R], float("-inf"), tl.float32)
    best_at = tl.zeros([BLOCK_R], tl.int64)
    for start in range(0, n_cols, BLOCK_C):
        cols = start + tl.arange(0, BLOCK_C)
        ok = row_ok[:, None] & (cols < n_cols)[None, :]
        x = tl.load(logits_ptr + row_off[:, None] + cols[None, :] * stride_lc, mask=ok,
                    other=float("-inf")).to(tl.float32)
        x = tl.where(x != x, float("inf"), x)
        m = tl.max(x, axis=1)
        first = tl.min(tl.where((x == m[:, None]) & ok, cols[None, :], n_cols), axis=1)
        better = m > best  # strictly: an earlier block keeps its ties
        best_at = tl.where(better, first.to(tl.int64), best_at)
        best = tl.where(better, m, best)
    target = tl.load(target_ptr + rows * stride_t, mask=row_ok, other=-1).to(tl.int64)
    hits = tl.sum((row_ok & (best_at == target)).to(tl.int64), axis=0)
    tl.atomic_add(counter_ptr, hits)


@planned(settings=_settings)
def count_correct_(logits, target, counter):
    """counter += number of rows whose first largest logit is at the target: one launch, no
    host sync. logits: [N, C] float (any strides), target: [N] int, counter: 1 int64 element."""
    if logits.dim() != 2 or target.shape != logits.shape[:1]:
        raise ValueError(f"count_correct_: expected logits [N, C] and target [N], got "
                         f"{tuple(logits.shape)} and {tuple(target.shape)}")
    if counter.numel() != 1 or counter.dtype != torch.int64:
        raise ValueError(f"count_correct_: counter must be one int64 element, got "
                         f"{tuple(counter.shape)} {dtype_of(counter).name}")
    n, c = logits.shape
    if n == 0:
        return counter
    block_c = next_power_of_2(c) if 0 < c < 1024 else 1024
    block_r = 256 if INTERPRET else (64 if block_c <= 64 else 4096 // block_c)
    run(_count_correct_kernel, (cdiv(n, block_r),),
        logits, target, counter, n, c, logits.stride(0), logits.stride(1), target.stride(0),
        BLOCK_R=block_r, BLOCK_C=block_c, num_warps=4)
    return counter

