"""The numpy backend's index check and row scatter with a reduction: the plain specification of
kernels/scatter.py."""
from __future__ import annotations

import numpy as np

from .. import dtypes
from .arrays import compute_dtype, to_numpy

REDUCES = ("sum", "prod", "mean", "amax", "amin", "last")


class ScatterOps:
    """Mixed into NumpyBackend."""

    def index_check(self, index, size, op, wrap):
        idx = np.asarray(to_numpy(index))
        if idx.dtype.kind not in "iu":
            raise TypeError(f"{op}: index must be an integer tensor, got {index.dtype}")
        idx = idx.astype(np.int64)
        low = -size if wrap else 0
        bad = (idx < low) | (idx >= size)
        if bad.any():
            raise IndexError(f"{op}: index {int(idx[bad].reshape(-1)[0])} is out of bounds for "
                             f"size {size}")
        return self._new(np.where(idx < 0, idx + size, idx), dtypes.int64)

    def scatter_reduce_rows(self, src, index, base, num_rows, reduce, include_self=True,
                            zero_row=-1, op="scatter_reduce"):
        if reduce not in REDUCES:
            raise ValueError(f"{op}: reduce must be one of {REDUCES}, got {reduce!r}")
        dtype = dtypes.get_dtype(src.dtype)
        idx = np.asarray(to_numpy(index)).astype(np.int64).reshape(-1)
        bad = (idx < 0) | (idx >= num_rows)
        if bad.any():
            raise IndexError(f"{op}: index {int(idx[bad][0])} is out of bounds for size "
                             f"{num_rows}")
        work = compute_dtype(dtype) if dtype.is_floating_point else np.int64
        v = np.asarray(to_numpy(src)).astype(work)
        rest = v.shape[index.dim():]
        v = v.reshape((-1,) + rest)
        identity = {"sum": 0, "mean": 0, "prod": 1, "last": 0,
                    "amax": -np.inf if dtype.is_floating_point else np.iinfo(np.int64).min,
                    "amin": np.inf if dtype.is_floating_point else np.iinfo(np.int64).max}[reduce]
        out = np.full((num_rows,) + rest, identity, work)
        if reduce in ("sum", "mean"):
            np.add.at(out, idx, v)
        elif reduce == "prod":
            np.multiply.at(out, idx, v)
        elif reduce == "amax":
            np.maximum.at(out, idx, v)  # (NaN propagates)
        elif reduce == "amin":
            np.minimum.at(out, idx, v)
        else:
            for i, r in enumerate(idx):  # in order: the last i wins
                out[r] = v[i]
        count = np.bincount(idx, minlength=num_rows).reshape((num_rows,) + (1,) * len(rest))
        if base is not None:
            b = np.asarray(to_numpy(base)).astype(work)
            if include_self:
                if reduce in ("sum", "mean"):
                    out = out + b
                elif reduce == "prod":
                    out = out * b
                elif reduce == "amax":
                    out = np.maximum(out, b)
                elif reduce == "amin":
                    out = np.minimum(out, b)
            if reduce == "mean":
                total = np.maximum(count + (1 if include_self else 0), 1)
                out = out / total if dtype.is_floating_point else out // total
            out = np.where(count > 0, out, b)
        else:
            if reduce == "mean":
                out = out / np.maximum(count, 1) if dtype.is_floating_point else \
                    out // np.maximum(count, 1)
            out = np.where(count > 0, out, 0)
        if 0 <= zero_row < num_rows:
            out[zero_row] = 0
        return self._new(out.astype(work, copy=False), dtype)
