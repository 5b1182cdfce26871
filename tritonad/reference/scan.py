"""The numpy backend's scans and sorts: cumulative sums, products and log-sum-exps, running
maxima and minima with their indices, stable sorting and top-k (NaN the largest), and the
gathers and scatters along one dim their gradients use. Half precision is widened to float32."""
from __future__ import annotations

import numpy as np

from .. import dtypes
from .arrays import to_numpy


def _order_keys(v, descending):
    """Integer keys whose order is the sort order (the kernels' rule: -0.0 as +0.0, NaN above
    +inf, descending as the bitwise not), so that a stable argsort of them is the sort."""
    if v.dtype.kind == "f":
        wide = v.dtype == np.float64
        v = np.where(v == 0, 0.0, v).astype(np.float64 if wide else np.float32)
        bits = v.view(np.int64 if wide else np.int32).copy()
        bits[np.isnan(v)] = 0x7FF8000000000000 if wide else 0x7FC00000
        shift, mask = (63, 0x7FFFFFFFFFFFFFFF) if wide else (31, 0x7FFFFFFF)
        keys = bits ^ ((bits >> shift) & mask)
    else:
        keys = v.astype(np.int64)
    return ~keys if descending else keys


def _logaddexp_scan(v, axis):
    out = np.empty_like(v)
    v = np.moveaxis(v, axis, 0)
    o = np.moveaxis(out, axis, 0)
    acc = np.full(v.shape[1:], -np.inf, v.dtype)
    with np.errstate(all="ignore"):
        for j in range(v.shape[0]):
            acc = np.logaddexp(acc, v[j])
            o[j] = acc
    return out


class ScanOps:
    """Mixed into NumpyBackend."""

    def _scan_in(self, x):
        dtype = dtypes.get_dtype(x.dtype)
        v = np.asarray(to_numpy(x))
        if dtype in (dtypes.float16, dtypes.bfloat16):
            v = v.astype(np.float32)
        return dtype, v

    def cumulative(self, x, dim, op, reverse=False, dtype=None):
        in_dtype, v = self._scan_in(x)
        if dtype is None:
            dtype = dtypes.int64 if op != "logsumexp" and not in_dtype.is_floating_point \
                else in_dtype
        if dtype.is_floating_point:
            v = v.astype(np.float64 if dtype is dtypes.float64 else np.float32)
        else:
            v = v.astype(np.int64)
        if v.ndim == 0:
            return self._new(v, dtype)
        if reverse:
            v = np.flip(v, dim)
        with np.errstate(all="ignore"):
            if op == "sum":
                y = np.cumsum(v, axis=dim, dtype=v.dtype)
            elif op == "prod":
                y = np.cumprod(v, axis=dim, dtype=v.dtype)
            else:
                y = _logaddexp_scan(v, dim)
        if reverse:
            y = np.flip(y, dim)
        return self._new(y, dtype)

    def cumulative_extreme(self, x, dim, largest=True):
        dtype, v = self._scan_in(x)
        if v.ndim == 0:
            return self._new(v, dtype), self._new(np.zeros((), np.int64), dtypes.int64)
        m = np.moveaxis(v, dim, 0)
        vals, idx = np.empty_like(m), np.zeros(m.shape, np.int64)
        if m.shape[0]:
            cur, at = m[0].copy(), np.zeros(m.shape[1:], np.int64)
            for j in range(m.shape[0]):
                with np.errstate(invalid="ignore"):
                    better = (m[j] >= cur) if largest else (m[j] <= cur)
                take = better | np.isnan(m[j]) if m.dtype.kind == "f" else better
                if m.dtype.kind == "f":
                    take = take & ~(np.isnan(cur) & ~np.isnan(m[j]))
                cur = np.where(take, m[j], cur)
                at = np.where(take, j, at)
                vals[j], idx[j] = cur, at
        return (self._new(np.moveaxis(vals, 0, dim), dtype),
                self._new(np.moveaxis(idx, 0, dim), dtypes.int64))

    def sort(self, x, dim, descending=False, stable=False):
        dtype, v = self._scan_in(x)
        if v.ndim == 0:
            return self._new(v, dtype), self._new(np.zeros((), np.int64), dtypes.int64)
        order = np.argsort(_order_keys(v, descending), axis=dim, kind="stable")
        return (self._new(np.take_along_axis(v, order, dim), dtype),
                self._new(order.astype(np.int64), dtypes.int64))

    def topk(self, x, k, dim, largest=True, sorted=True):
        values, indices = self.sort(x, dim, descending=largest)
        if values.dim() == 0:
            return values, indices
        return (self._new(np.take(to_numpy(values), np.arange(k), axis=dim),
                          dtypes.get_dtype(values.dtype)),
                self._new(np.take(to_numpy(indices), np.arange(k), axis=dim), dtypes.int64))

    def gather_along(self, x, index, dim):
        dtype, v = self._scan_in(x)
        return self._new(np.take_along_axis(v, to_numpy(index).astype(np.int64), dim), dtype)

    def scatter_add_along(self, src, index, dim, size):
        dtype, v = self._scan_in(src)
        shape = list(v.shape)
        shape[dim] = size
        out = np.zeros(shape, v.dtype)
        idx = to_numpy(index).astype(np.int64)
        grids = list(np.indices(idx.shape, sparse=True))
        grids[dim] = idx
        np.add.at(out, tuple(grids), v)
        return self._new(out, dtype)
