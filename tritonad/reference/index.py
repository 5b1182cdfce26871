"""The numpy backend's row gather and its adjoint, the scatter-add."""
from __future__ import annotations

import numpy as np

from .. import dtypes
from .arrays import to_numpy


class IndexOps:
    """Mixed into NumpyBackend."""

    # indexing ---------------------------------------------------------------------------------
    def _check_index(self, op, idx, rows):
        if idx.size and (idx.min() < -rows or idx.max() >= rows):
            bad = idx[(idx < -rows) | (idx >= rows)][0]
            raise IndexError(f"{op}: index {int(bad)} is out of bounds for dimension 0 "
                             f"with size {rows}")
        return np.where(idx < 0, idx + rows, idx)

    def gather_rows(self, x, index):
        v = to_numpy(x)
        idx = self._check_index("gather_rows", to_numpy(index).astype(np.int64), v.shape[0])
        return self._new(v[idx], dtypes.get_dtype(x.dtype))

    def scatter_add_rows(self, src, index, num_rows):
        dtype = dtypes.get_dtype(src.dtype)
        v = self._float_in(src, dtype) if dtype.is_floating_point else to_numpy(src)
        idx = self._check_index("scatter_add_rows", to_numpy(index).astype(np.int64), num_rows)
        out = np.zeros((num_rows,) + v.shape[idx.ndim:], v.dtype)
        np.add.at(out, idx.reshape(-1), v.reshape((-1,) + v.shape[idx.ndim:]))
        return self._new(out, dtype)
