"""Handlers: softmax and log_softmax forward and backward (`_softmax`, `_log_softmax`,
`_softmax_backward_data`, `_log_softmax_backward_data`) on tritonad's row kernels
(kernels/softmax.py: one pass over a row held in registers, float32 inside for half types).
"""
from __future__ import annotations

from .. import dtypes
from .elementwise import B, FLOATS, check, write_into
from .registry import Fallback, register


def _rows(x, dim):
    """x as at least 1-d (a 0-d softmax is over one element) and dim normalised."""
    if x.dtype not in FLOATS:
        raise Fallback(f"softmax of {x.dtype}")
    if x.dim() == 0:
        if dim not in (0, -1):
            raise Fallback("dim out of range")
        return x.reshape(1), 0
    if not -x.dim() <= dim < x.dim():
        raise Fallback("dim out of range")  # PyTorch's IndexError
    return x, dim % x.dim()


def _forward(primitive):
    def handler(x, dim, half_to_float, *, out=None):
        check(x, out)
        shape = x.shape
        x, dim = _rows(x, dim)
        if half_to_float:
            if x.dtype not in (dtypes.float16.torch, dtypes.bfloat16.torch):
                raise Fallback("half_to_float of a float32 input")
            x = B.cast(x, dtypes.float32)
        y = primitive(x, dim).reshape(shape) if x.numel() else x.reshape(shape)
        if x.numel() == 0 and half_to_float:
            y = B.cast(y, dtypes.float32)
        return y if out is None else write_into(out, y)
    return handler


def _backward(primitive):
    def handler(dy, y, dim, input_dtype, *, out=None, grad_input=None):
        check(dy, y, out, grad_input)
        shape = dy.shape
        if dy.dtype != y.dtype:
            raise Fallback("softmax backward of mixed types")
        y, dim = _rows(y, dim)
        dy = dy.reshape(y.shape)
        dx = primitive(dy, y, dim).reshape(shape) if y.numel() else dy.reshape(shape)
        if dx.dtype != input_dtype:
            dx = B.cast(dx, dtypes.get_dtype(input_dtype))
        target = out if out is not None else grad_input
        return dx if target is None else write_into(target, dx)
    return handler


register("aten::_softmax.default", "aten::_softmax.out")(_forward(B.softmax))
register("aten::_log_softmax.default", "aten::_log_softmax.out")(_forward(B.log_softmax))
register("aten::_softmax_backward_data.default", "aten::_softmax_backward_data.out")(
    _backward(B.softmax_backward))
register("aten::_log_softmax_backward_data.default", "aten::_log_softmax_backward_data.out")(
    _backward(B.log_softmax_backward))
