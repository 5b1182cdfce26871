"""Row indexing: gather rows by an index tensor (`x[index]`, how batches are cut from a dataset)
and its adjoint, scatter-add into rows (duplicates accumulate).

Both see x as [R, D]: the rows, and everything after the first dim collapsed into one strided
dim of width D. A program moves a [BLOCK_I, BLOCK_D] tile: BLOCK_I indices by BLOCK_D columns.

Bounds: an index outside [-R, R) must raise IndexError. The kernel clamps every index into
[0, R) before using it (a bad index never faults) and reports the first bad one on the device's
error flags (kernels/errors.py): the host raises it at its next read of the device, without a
synchronisation here (inside a captured CUDA graph too).
"""
from __future__ import annotations

import math

import triton
import triton.language as tl

from .. import dtypes
from ..backend import check_gather_rows_at, check_take_row
from . import errors
from .elementwise import collapse, contiguous, copy_, fill_
from .errors import report
from .launch import INTERPRET, PDL, cdiv, dtype_of, next_power_of_2
from .plans import empty, planned, run

PRIMITIVES = ("gather_rows", "scatter_add_rows", "take_row_", "gather_rows_at_")

TILE, MAX_BLOCK_D = 4096, 512
INTERPRET_TILE = 1 << 16


# ----------------------------------------------------------------------------------- kernels


@triton.jit
def _rows(index_ptr, flag_ptr, i, mask_i, n_rows):
    """The rows named by index[i], negative ones wrapped, clamped into [0, n_rows); an index
    out of range is reported on the error flag (kernels/errors.py)."""
    row = tl.load(index_ptr + i, mask=mask_i, other=0).to(tl.int64)
    report(flag_ptr, mask_i & ((row < -n_rows) | (row >= n_rows)), i, row, n_rows)
    row = tl.where(row < 0, row + n_rows, row)
    return tl.minimum(tl.maximum(row, 0), n_rows - 1)


@triton.jit
def _copy_rows(x_ptr, out_ptr, row, i, mask_i, d, width, stride_row, stride_col):
    """out[i, d] = x[row, d] for a tile: the gathered rows into a contiguous [*, width] out."""
    mask = mask_i[:, None] & (d < width)[None, :]
    v = tl.load(x_ptr + row[:, None] * stride_row + d[None, :] * stride_col, mask=mask)
    tl.store(out_ptr + i.to(tl.int64)[:, None] * width + d[None, :], v, mask=mask)


@triton.jit
def _cursor_row(cursor, n_rows):
    """The table row a cursor points at: cursor modulo n_rows, in [0, n_rows)."""
    row = cursor % n_rows
    return tl.where(row < 0, row + n_rows, row)


@triton.jit
def _gather_rows_kernel(x_ptr, index_ptr, out_ptr, flag_ptr, n_index, n_rows, width,
                        stride_row, stride_col, BLOCK_I: tl.constexpr,
                        BLOCK_D: tl.constexpr, GDC: tl.constexpr):
    if GDC:  # programmatic dependent launch (launch.PDL): wait for the kernels before
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    # One program: out[i, d] = x[index[i], d] for BLOCK_I indices by BLOCK_D columns.
    i = tl.program_id(0) * BLOCK_I + tl.arange(0, BLOCK_I)
    mask_i = i < n_index
    row = _rows(index_ptr, flag_ptr, i, mask_i, n_rows)
    d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    _copy_rows(x_ptr, out_ptr, row, i, mask_i, d, width, stride_row, stride_col)


@triton.jit
def _gather_rows_at_kernel(x_ptr, y_ptr, x_out_ptr, y_out_ptr, table_ptr, cursor_ptr, flag_ptr,
                           n_table, n_index, n_rows, width_x, width_y, stride_xr, stride_xc,
                           stride_yr, stride_yc, BLOCK_I: tl.constexpr,
                           BLOCK_D: tl.constexpr, GDC: tl.constexpr):
    if GDC:  # programmatic dependent launch (launch.PDL): wait for the kernels before
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    # One program: BLOCK_I indices of the table row at the cursor by BLOCK_D columns of both
    # sources (y may be narrower, or absent with width 0): x_out[i, d] = x[index[i], d].
    row_of_table = _cursor_row(tl.load(cursor_ptr), n_table)
    i = tl.program_id(0) * BLOCK_I + tl.arange(0, BLOCK_I)
    mask_i = i < n_index
    row = _rows(table_ptr + row_of_table * n_index, flag_ptr, i, mask_i, n_rows)
    d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    _copy_rows(x_ptr, x_out_ptr, row, i, mask_i, d, width_x, stride_xr, stride_xc)
    _copy_rows(y_ptr, y_out_ptr, row, i, mask_i, d, width_y, stride_yr, stride_yc)


@triton.jit
def _scatter_add_rows_kernel(src_ptr, index_ptr, out_ptr, flag_ptr, n_index, n_rows, width,
                             BLOCK_I: tl.constexpr, BLOCK_D: tl.constexpr,
                             GDC: tl.constexpr):
    if GDC:  # programmatic dependent launch (launch.PDL): wait for the kernels before
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    # One program: out[index[i], d] += src[i, d], atomically (indices may repeat).
    i = tl.program_id(0) * BLOCK_I + tl.arange(0, BLOCK_I)
    mask_i = i < n_index
    row = _rows(index_ptr, flag_ptr, i, mask_i, n_rows)
    d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    mask = mask_i[:, None] & (d < width)[None, :]
    v = tl.load(src_ptr + i.to(tl.int64)[:, None] * width + d[None, :], mask=mask, other=0)
    v = v.to(out_ptr.dtype.element_ty)
    tl.atomic_add(out_ptr + row[:, None] * width + d[None, :], v, mask=mask)


@triton.jit
def _take_row_kernel(table_ptr, cursor_ptr, out_ptr, n_rows, width, ADVANCE: tl.constexpr,
                     BLOCK: tl.constexpr, GDC: tl.constexpr):
    if GDC:  # programmatic dependent launch (launch.PDL): wait for the kernels before
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    # One program: out = table[cursor % n_rows], then cursor += 1. NOTE: a single program, so
    # that the cursor is read before it is advanced, with no other program in between.
    cursor = tl.load(cursor_ptr)
    src = table_ptr + _cursor_row(cursor, n_rows) * width
    for start in range(0, width, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        tl.store(out_ptr + offs, tl.load(src + offs, mask=offs < width), mask=offs < width)
    if ADVANCE:
        tl.store(cursor_ptr, cursor + 1)


# ----------------------------------------------------------------------------------- launchers


def _check_index_dtype(op, index):
    if dtype_of(index) not in (dtypes.int32, dtypes.int64):
        raise TypeError(f"{op}: index must be int32 or int64, got {dtype_of(index).name}")


def _blocks(n_index, width):
    tile = INTERPRET_TILE if INTERPRET else TILE
    block_d = max(2, min(next_power_of_2(max(width, 1)), tile if INTERPRET else MAX_BLOCK_D))
    block_i = max(2, min(tile // block_d, next_power_of_2(max(n_index, 1))))
    return block_i, block_d


def gather_rows(x, index):
    """x[index] along dim 0. x: [R, *rest] any strides, index: int64/int32 [*I] ->
    [*I, *rest]. An index outside [-R, R) raises IndexError (at the next read of the device,
    see kernels/errors.py); negative ones count from the end."""
    out = _gather_rows(x, index)
    errors.after(x.device)
    return out


@planned()
def _gather_rows(x, index):
    _check_index_dtype("gather_rows", index)
    if x.dim() == 0:
        raise ValueError("gather_rows: x must have at least one dim, got a 0-d array")
    if x.device != index.device:
        raise RuntimeError(f"gather_rows: x is on {x.device} but index on {index.device}")
    n_rows, rest = x.shape[0], tuple(x.shape[1:])
    out = empty(tuple(index.shape) + rest, x.dtype, x.device)
    n_index, width = index.numel(), math.prod(rest)
    if n_index and n_rows == 0:
        raise IndexError(f"gather_rows: index into dimension 0 of size 0 (x shape "
                         f"{tuple(x.shape)})")
    if out.numel() == 0:
        return out
    sizes, (strides,) = collapse(rest, [list(x.stride()[1:])])
    if len(sizes) > 1:  # rows that are not one strided run: copy once
        x = contiguous(x)
        strides = [1]
    stride_col = strides[0] if strides else 1
    index = index if index.is_contiguous() else contiguous(index)
    block_i, block_d = _blocks(n_index, width)
    grid = (cdiv(n_index, block_i), cdiv(width, block_d))
    run(_gather_rows_kernel, grid, x, index, out, errors.flag(x.device, "gather_rows"),
        n_index, n_rows, width, x.stride(0), stride_col, BLOCK_I=block_i, BLOCK_D=block_d,
        num_warps=4, **PDL)
    return out


# accumulate in a type atomics support, then cast: half types and small ints widen
_ACCUMULATE = {dtypes.float16: dtypes.float32, dtypes.bfloat16: dtypes.float32,
               dtypes.uint8: dtypes.int32, dtypes.bool_: dtypes.int32}


def scatter_add_rows(src, index, num_rows):
    """The adjoint of gather_rows: out [num_rows, *rest] zeros, out[index[i]] += src[i];
    duplicate indices accumulate. src: [*I, *rest], index: int64/int32 [*I].
    NOTE: float16/bfloat16 accumulate in float32 and round once; float atomics make the order
    of additions (so the last bits of a sum over duplicates) vary from run to run."""
    out = _scatter_add_rows(src, index, num_rows)
    errors.after(src.device)
    return out


@planned()
def _scatter_add_rows(src, index, num_rows):
    _check_index_dtype("scatter_add_rows", index)
    if tuple(src.shape[:index.dim()]) != tuple(index.shape):
        raise ValueError(f"scatter_add_rows: src shape {tuple(src.shape)} must start with the "
                         f"index shape {tuple(index.shape)}")
    if src.device != index.device:
        raise RuntimeError(f"scatter_add_rows: src is on {src.device} but index on "
                           f"{index.device}")
    dtype = dtype_of(src)
    rest = tuple(src.shape[index.dim():])
    out = empty((num_rows,) + rest, dtype.torch, src.device)
    n_index, width = index.numel(), math.prod(rest)
    if n_index and num_rows == 0:
        raise IndexError("scatter_add_rows: index into dimension 0 of size 0")
    acc_dtype = _ACCUMULATE.get(dtype)
    acc = out if acc_dtype is None else empty(out.shape, acc_dtype.torch, src.device)
    fill_(acc, 0)
    if n_index and width:
        src = src if src.is_contiguous() else contiguous(src)
        index = index if index.is_contiguous() else contiguous(index)
        block_i, block_d = _blocks(n_index, width)
        grid = (cdiv(n_index, block_i), cdiv(width, block_d))
        run(_scatter_add_rows_kernel, grid, src, index, acc,
            errors.flag(src.device, "scatter_add_rows"), n_index, num_rows, width,
            BLOCK_I=block_i, BLOCK_D=block_d, num_warps=4, **PDL)
    if acc is not out:
        copy_(out, acc)
    return out


def _row_view(x):
    """(x, width, row stride, column stride) of x seen as [R, D] (copied if its trailing dims do
    not form one strided run)."""
    sizes, (strides,) = collapse(tuple(x.shape[1:]), [list(x.stride()[1:])])
    if len(sizes) > 1:
        x = contiguous(x)
        strides = [1]
    return x, math.prod(x.shape[1:]), x.stride(0), strides[0] if strides else 1


def gather_rows_at_(sources, outs, table, cursor):
    """outs[j] = sources[j][table[cursor % R]] for one or two sources in one launch; the index
    row is read on the device (Backend.gather_rows_at_)."""
    result = _gather_rows_at_(sources, outs, table, cursor)
    errors.after(table.device)
    return result


@planned()
def _gather_rows_at_(sources, outs, table, cursor):
    check_gather_rows_at(sources, outs, table, cursor)
    n_index, n_rows = table.shape[1], sources[0].shape[0]
    if any(x.shape[0] != n_rows for x in sources):
        raise ValueError(f"gather_rows_at_: the sources differ in length: "
                         f"{[tuple(x.shape) for x in sources]}")
    if n_index == 0:
        return outs
    if n_rows == 0:
        raise IndexError("gather_rows_at_: index into dimension 0 of size 0")
    (x, width_x, sxr, sxc), (y, width_y, syr, syc) = [_row_view(s) for s in sources[:1]] + (
        [_row_view(sources[1])] if len(sources) > 1 else [(sources[0], 0, 0, 0)])
    x_out, y_out = outs[0], outs[1] if len(outs) > 1 else outs[0]
    block_i, block_d = _blocks(n_index, max(width_x, width_y))
    grid = (cdiv(n_index, block_i), cdiv(max(width_x, width_y, 1), block_d))
    table = table if table.is_contiguous() else contiguous(table)
    run(_gather_rows_at_kernel, grid, x, y, x_out, y_out, table, cursor,
        errors.flag(x.device, "gather_rows_at_"), table.shape[0], n_index, n_rows, width_x,
        width_y, sxr, sxc, syr, syc, BLOCK_I=block_i, BLOCK_D=block_d, num_warps=4, **PDL)
    return outs


@planned()
def take_row_(table, cursor, out, advance=False):
    """out[...] = table[cursor % R], read on the device; cursor += 1 if `advance` (one program,
    no host sync). table [R, *out.shape] may be pinned host memory on a GPU."""
    check_take_row(table, cursor, out)
    width = out.numel()
    block = max(16, min(1024, next_power_of_2(max(width, 1))))
    run(_take_row_kernel, (1,), table, cursor, out, table.shape[0], width,
        ADVANCE=bool(advance), BLOCK=block, num_warps=4, **PDL)
    return out
