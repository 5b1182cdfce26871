"""The numpy backend's reductions: sum, mean, max, min, argmax, argmin, var (half precision
widened to float32, float32 accumulation at least)."""
from __future__ import annotations

import numpy as np

from .. import dtypes
from .arrays import compute_dtype, to_numpy


class ReduceOps:
    """Mixed into NumpyBackend."""

    def _reduce_in(self, x):
        dtype = dtypes.get_dtype(x.dtype)
        v = to_numpy(x)
        if dtype in (dtypes.float16, dtypes.bfloat16):
            v = v.astype(np.float32)
        return dtype, v

    def sum(self, x, dims=None, keepdim=False, dtype=None, out=None):
        in_dtype, v = self._reduce_in(x)
        if dtype is None:
            dtype = in_dtype if in_dtype.is_floating_point else dtypes.int64
        v = v.astype(compute_dtype(dtype) if dtype.is_floating_point else np.int64, copy=False)
        return self._out(np.sum(v, axis=dims, keepdims=keepdim), dtype, out)

    def mean(self, x, dims=None, keepdim=False):
        dtype, v = self._reduce_in(x)
        with np.errstate(all="ignore"):
            return self._new(np.mean(v, axis=dims, keepdims=keepdim), dtype)

    def max(self, x, dims=None, keepdim=False):
        dtype, v = self._reduce_in(x)
        if v.size == 0:
            raise RuntimeError(f"max: cannot reduce an empty tensor of shape {tuple(x.shape)}")
        return self._new(np.max(v, axis=dims, keepdims=keepdim), dtype)

    def min(self, x, dims=None, keepdim=False):
        dtype, v = self._reduce_in(x)
        if v.size == 0:
            raise RuntimeError(f"min: cannot reduce an empty tensor of shape {tuple(x.shape)}")
        return self._new(np.min(v, axis=dims, keepdims=keepdim), dtype)

    def _arg(self, fn, name, x, dim, keepdim):
        _, v = self._reduce_in(x)
        if v.size == 0:
            raise RuntimeError(f"{name}: cannot reduce an empty tensor of shape {tuple(x.shape)}")
        if dim is None:
            idx = fn(v.reshape(-1))  # numpy returns the first extreme (and the first NaN)
            return self._new(np.reshape(idx, (1,) * v.ndim) if keepdim else idx, dtypes.int64)
        return self._new(fn(v, axis=dim, keepdims=keepdim), dtypes.int64)

    def argmax(self, x, dim=None, keepdim=False): return self._arg(np.argmax, "argmax", x, dim, keepdim)
    def argmin(self, x, dim=None, keepdim=False): return self._arg(np.argmin, "argmin", x, dim, keepdim)

    def var(self, x, dims=None, correction=1, keepdim=False):
        dtype, v = self._reduce_in(x)
        with np.errstate(all="ignore"):
            return self._new(np.var(v, axis=dims, ddof=correction, keepdims=keepdim), dtype)
