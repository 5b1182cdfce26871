"""Handlers: indexing (index_select, gather, scatter_add, index_add, index.Tensor and index_put_
with one index tensor) on tritonad's row gather and deterministic row scatter
(kernels/index.py, kernels/scatter.py) and its gather/scatter along a dim (kernels/scan.py).

An index out of range is found on the device and raised at the next read of the device (the
op and the bad value named; kernels/errors.py), as tritonad does everywhere; the kernels clamp
it, so nothing faults. Boolean masks (a data-dependent shape) and several index tensors fall
back to PyTorch.
"""
from __future__ import annotations

import torch

from .. import dtypes
from .elementwise import B, check, host_scalars, write_into
from .registry import Fallback, register

_INDEX_TYPES = (torch.int64, torch.int32)


def _index(index, x=None):
    if index.dtype not in _INDEX_TYPES:
        raise Fallback(f"an index of {index.dtype}")
    if x is not None and index.device != x.device:
        raise Fallback("an index on another device")
    return index


def _dim(x, dim):
    rank = max(x.dim(), 1)
    if not -rank <= dim < rank:
        raise Fallback("dim out of range")   # PyTorch's IndexError
    return dim % rank


def _rows_first(x, dim, index):
    """x's rows along dim gathered by a 1-d index, as a new contiguous tensor of x's layout."""
    moved = x.movedim(dim, 0) if dim else x
    gathered = B.gather_rows(moved, index)
    if not dim:
        return gathered
    return B.contiguous(gathered.movedim(0, dim))


@register("aten::index_select.default", "aten::index_select.out")
def index_select(x, dim, index, *, out=None):
    check(x, index, out)
    _index(index, x)
    if index.dim() > 1:
        raise Fallback("index_select with a multi-dimensional index")
    if x.dim() == 0:   # a 0-d input: index [0] (or [-1]) selects the value, 0-d
        if index.numel() != 1 or dim not in (0, -1):
            raise Fallback("index_select of a 0-d tensor")
        result = B.gather_rows(x.reshape(1), index.reshape(1)).reshape(())
        return result if out is None else write_into(out, result)
    result = _rows_first(x, _dim(x, dim), index.reshape(-1))
    return result if out is None else write_into(out, result)


@register("aten::gather.default", "aten::gather.out")
def gather(x, dim, index, *, sparse_grad=False, out=None):
    check(x, index, out)
    _index(index, x)
    if index.dtype is not torch.int64 or index.dim() != x.dim() or x.dim() == 0:
        raise Fallback("gather of a 0-d tensor or a non-int64 index")
    dim = _dim(x, dim)
    if any(i > s for d, (i, s) in enumerate(zip(index.shape, x.shape)) if d != dim):
        raise Fallback("gather with an index larger than the input")  # PyTorch's error
    if index.numel() == 0:
        return torch.empty(index.shape, dtype=x.dtype, device=x.device) if out is None else out
    source = x
    for d, n in enumerate(index.shape):   # torch reads only the index's extent outside dim
        if d != dim and n != x.shape[d]:
            source = source.narrow(d, 0, n)
    checked = B.index_check(index, x.shape[dim], "gather", False)
    result = B.gather_along(source, checked, dim)
    return result if out is None else write_into(out, result)


@register("aten::scatter_add.default", "aten::scatter_add.out")
def scatter_add(x, dim, index, src, *, out=None):
    check(x, index, src, out)
    _index(index, x)
    if index.dtype is not torch.int64 or x.dim() == 0 or index.dim() != x.dim():
        raise Fallback("scatter_add of a 0-d tensor or a non-int64 index")
    dim = _dim(x, dim)
    if any(i != s for d, (i, s) in enumerate(zip(index.shape, x.shape)) if d != dim):
        raise Fallback("scatter_add with an index narrower than self")
    if x.dtype is torch.bool:
        raise Fallback("scatter_add of bools")
    if any(i > s for i, s in zip(index.shape, src.shape)) or src.dtype != x.dtype:
        raise Fallback("scatter_add with a smaller src or another type")
    if index.numel() == 0:
        return B.contiguous(x) if out is None else write_into(out, x)
    source = src
    for d, n in enumerate(index.shape):
        if n != src.shape[d]:
            source = source.narrow(d, 0, n)
    checked = B.index_check(index, x.shape[dim], "scatter_add", False)
    added = B.scatter_add_along(source, checked, dim, x.shape[dim])
    result = B.add(x, added)
    return result if out is None else write_into(out, result)


def _one_index(x, indices):
    """(position, index) of the one index tensor among indices (None elsewhere), else fall
    back: masks, several index tensors."""
    found = [(k, i) for k, i in enumerate(indices) if i is not None]
    if len(found) != 1:
        raise Fallback("indexing with several index tensors")
    [(k, index)] = found
    if index.dtype not in _INDEX_TYPES:
        raise Fallback(f"indexing with a {index.dtype} index (a mask)")
    if k >= x.dim():
        raise Fallback("too many indices")
    if index.device != x.device:   # PyTorch takes cpu indices for cuda tensors: a transfer
        index = index.to(x.device)
    return k, index


@register("aten::index.Tensor", "aten::index.Tensor_out")
def index(x, indices, *, out=None):
    check(x, out, *[i for i in indices if i is not None])
    k, idx = _one_index(x, indices)
    moved = x.movedim(k, 0) if k else x
    gathered = B.gather_rows(moved, idx)          # [*I, x's dims without k]
    if k:   # PyTorch puts the index's dims where the indexed dim was
        m = idx.dim()
        order = list(range(m, m + k)) + list(range(m)) + list(range(m + k, gathered.dim()))
        gathered = B.contiguous(gathered.permute(order))
    return gathered if out is None else write_into(out, gathered)


def _index_put(self, indices, values, accumulate):
    """A new tensor: self with rows at the index replaced by (or, accumulating, added to)
    values, deterministically (duplicates: the last wins, or all add up in order)."""
    check(self, values, *[i for i in indices if i is not None])
    k, idx = _one_index(self, indices)
    if k != 0:
        raise Fallback("index_put at a dim other than the first")
    if self.dim() == 0:
        raise Fallback("index_put into a 0-d tensor")
    (values,) = host_scalars(values) if values.dim() == 0 else (values,)
    rows = tuple(idx.shape) + tuple(self.shape[1:])
    if isinstance(values, torch.Tensor):
        if values.dtype != self.dtype:
            values = B.cast(values, _dtype(self))
        try:
            values = values.expand(rows)
        except RuntimeError:
            raise Fallback("values do not broadcast to the indexed rows") from None
        src = B.contiguous(values)
    else:
        src = B.full(rows, values, _dtype(self), self.device)
    base = self if self.is_contiguous() else B.contiguous(self)
    checked = B.index_check(idx, self.shape[0], "index_put", True)
    return B.scatter_reduce_rows(src, checked, base, self.shape[0],
                                 "sum" if accumulate else "last", True, -1, "index_put")


def _dtype(x):
    return dtypes.get_dtype(x.dtype)


@register("aten::index_put.default", "aten::index_put.out")
def index_put(self, indices, values, accumulate=False, *, out=None):
    result = _index_put(self, indices, values, accumulate)
    return result if out is None else write_into(out, result)


@register("aten::index_put_.default", "aten::_index_put_impl_.default")
def index_put_(self, indices, values, accumulate=False, unsafe=False):
    if self.numel() == 0:
        return self
    return write_into(self, _index_put(self, indices, values, accumulate))


def _index_add(self, dim, index, source, alpha):
    """self with source's slices along dim added at index (duplicates add up in order, no float
    atomics): the rows of the deterministic scatter with self as its base."""
    check(self, index, source)
    _index(index, self)
    if index.dim() > 1 or source.dtype != self.dtype or self.dtype is torch.bool:
        raise Fallback("index_add of a multi-dimensional index or mixed types")
    if self.dim() == 0:   # as a 1-d tensor of one element
        if source.numel() != index.numel() or dim not in (0, -1):
            raise Fallback("index_add into a 0-d tensor of another shape")
        return _index_add(self.reshape(1), 0, index.reshape(-1), source.reshape(-1),
                          alpha).reshape(())
    dim = _dim(self, dim)
    expect = list(self.shape)
    expect[dim] = index.numel()
    if list(source.shape) != expect:
        raise Fallback("index_add with a source of another shape")   # PyTorch's error
    if alpha != 1:
        source = B.mul(source, alpha)
    rows = [t.movedim(dim, 0) if dim else t for t in (self, source)]
    rows = [t if t.is_contiguous() else B.contiguous(t) for t in rows]
    checked = B.index_check(index.reshape(-1), self.shape[dim], "index_add", True)
    added = B.scatter_reduce_rows(rows[1], checked, rows[0], self.shape[dim], "sum", True, -1,
                                  "index_add")
    return B.contiguous(added.movedim(0, dim)) if dim else added


@register("aten::index_add.default", "aten::index_add.out")
def index_add(self, dim, index, source, *, alpha=1, out=None):
    result = _index_add(self, dim, index, source, alpha)
    return result if out is None else write_into(out, result)


@register("aten::index_add_.default")
def index_add_(self, dim, index, source, *, alpha=1):
    if self.numel() == 0:
        return self
    return write_into(self, _index_add(self, dim, index, source, alpha))
