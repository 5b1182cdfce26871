"""The numpy backend's elementwise primitives: unary and binary ops, their fused backward
helpers and where, each as plain numpy on the operands widened to the compute type."""
from __future__ import annotations

import numpy as np

from .. import dtypes
from .arrays import _select, compute_dtype, to_numpy, write


class ElementwiseOps:
    """Mixed into NumpyBackend (reference/__init__.py), whose _out, _fresh and _float_in these
    call."""

    def _unary_float(self, fn, x, out):
        dtype = dtypes.get_dtype(x.dtype)
        if not dtype.is_floating_point:
            dtype = dtypes.default_float
        with np.errstate(all="ignore"):
            return self._out(fn(self._float_in(x, dtype)), dtype, out)

    def _binary(self, fn, a, b, out, result=None, float_result=False, fresh=False):
        # fresh: fn always returns a new array, which the result may keep without a copy
        dtype = dtypes.result_type(a, b)
        if float_result and not dtype.is_floating_point:
            dtype = dtypes.default_float
        if dtype.is_floating_point:
            va, vb = (np.asarray(to_numpy(v)).astype(compute_dtype(dtype), copy=False)
                      for v in (a, b))
        else:
            va, vb = (np.asarray(to_numpy(v)).astype(dtype.numpy, copy=False) for v in (a, b))
        with np.errstate(all="ignore"):
            values = fn(va, vb)
        if fresh and out is None:
            return self._fresh(values, result or dtype)
        return self._out(values, result or dtype, out)
    # unary ------------------------------------------------------------------------------------
    def neg(self, x, out=None):
        return self._out(-to_numpy(x), dtypes.get_dtype(x.dtype), out)

    def exp(self, x, out=None): return self._unary_float(np.exp, x, out)
    def log(self, x, out=None): return self._unary_float(np.log, x, out)
    def sqrt(self, x, out=None): return self._unary_float(np.sqrt, x, out)
    def tanh(self, x, out=None): return self._unary_float(np.tanh, x, out)

    def abs(self, x, out=None):
        return self._out(np.abs(to_numpy(x)), dtypes.get_dtype(x.dtype), out)

    def sign(self, x, out=None):
        return self._out(np.sign(to_numpy(x)), dtypes.get_dtype(x.dtype), out)

    def relu(self, x, out=None):
        v = to_numpy(x)
        # NOTE: NaN stays NaN (np.maximum propagates it), as torch.relu
        y = np.maximum(v, np.zeros((), v.dtype))
        dtype = dtypes.get_dtype(x.dtype)
        return self._fresh(y, dtype) if out is None else write(out, y)

    def sigmoid(self, x, out=None):
        def stable(v):
            # exp of a non-positive number only: no overflow for large |x|
            e = np.exp(-np.abs(v))
            return np.where(v >= 0, 1 / (1 + e), e / (1 + e))
        return self._unary_float(stable, x, out)

    def pow_scalar(self, x, exponent, out=None):
        return self._binary(np.power, x, exponent, out)

    def clamp(self, x, min=None, max=None, out=None):
        dtype = dtypes.get_dtype(x.dtype)
        v = to_numpy(x)
        if min is not None:
            v = np.where(v < min, np.asarray(min).astype(v.dtype), v)
        if max is not None:
            v = np.where(v > max, np.asarray(max).astype(v.dtype), v)
        return self._out(v, dtype, out)

    def relu_backward(self, dy, x, out=None):
        return self._binary(lambda g, v: _select(v > 0, g), dy, x, out,
                            result=dtypes.get_dtype(dy.dtype), fresh=True)

    def sigmoid_backward(self, dy, y, out=None):
        return self._binary(lambda g, s: g * s * (1 - s), dy, y, out)

    def tanh_backward(self, dy, y, out=None):
        return self._binary(lambda g, t: g * (1 - t * t), dy, y, out)

    # binary -----------------------------------------------------------------------------------
    def add(self, a, b, out=None): return self._binary(np.add, a, b, out)
    def sub(self, a, b, out=None): return self._binary(np.subtract, a, b, out)
    def mul(self, a, b, out=None): return self._binary(np.multiply, a, b, out)
    def div(self, a, b, out=None): return self._binary(np.divide, a, b, out, float_result=True)
    def pow(self, a, b, out=None): return self._binary(np.power, a, b, out)
    def maximum(self, a, b, out=None): return self._binary(np.maximum, a, b, out)
    def minimum(self, a, b, out=None): return self._binary(np.minimum, a, b, out)
    def eq(self, a, b, out=None): return self._binary(np.equal, a, b, out, dtypes.bool_)
    def ne(self, a, b, out=None): return self._binary(np.not_equal, a, b, out, dtypes.bool_)
    def lt(self, a, b, out=None): return self._binary(np.less, a, b, out, dtypes.bool_)
    def le(self, a, b, out=None): return self._binary(np.less_equal, a, b, out, dtypes.bool_)
    def gt(self, a, b, out=None): return self._binary(np.greater, a, b, out, dtypes.bool_)
    def ge(self, a, b, out=None): return self._binary(np.greater_equal, a, b, out, dtypes.bool_)

    def where(self, cond, a, b, out=None):
        dtype = dtypes.result_type(a, b)
        va, vb = (np.asarray(to_numpy(v)).astype(dtype.numpy, copy=False) for v in (a, b))
        return self._out(np.where(to_numpy(cond), va, vb), dtype, out)
