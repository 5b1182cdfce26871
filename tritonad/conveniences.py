"""The small functions a PyTorch user reaches for, composed of our ops (each value is computed
by our kernels, or by numpy in the numpy backend): eye, linspace, logspace, randint, isclose,
allclose, unbind, split, chunk, and the legacy constructors LongTensor, FloatTensor, ...

    td.eye(3)                          # [3, 3] float32 identity
    td.linspace(0, 1, 5)               # [0, 0.25, 0.5, 0.75, 1]
    td.randint(0, 10, (2, 3))          # int64 in [0, 10), from the Philox stream
    td.allclose(a, b, atol=1e-6)       # a Python bool
    td.LongTensor([1, 2, 3])           # td.tensor([1, 2, 3], dtype=td.int64)
"""
from __future__ import annotations

import math
import numbers
import operator

import numpy as np

from . import dtypes
from .autodiff import ops
from .autodiff.elementwise import isfinite, isnan, logical_and, logical_or
from .backend import get_backend
from .generator import take_from
from .tensor import Tensor, _device, _shape, arange, empty, full, tensor, zeros

__all__ = ["eye", "linspace", "logspace", "randint", "isclose", "allclose", "unbind", "split",
           "chunk", "FloatTensor", "DoubleTensor", "HalfTensor", "BFloat16Tensor", "LongTensor",
           "IntTensor", "ByteTensor", "BoolTensor"]


def _count(op, name, value):
    try:
        value = operator.index(value)
    except TypeError:
        raise TypeError(f"{op}: {name} must be an int, got {value!r}") from None
    if value < 0:
        raise ValueError(f"{op}: {name} must be non-negative, got {value}")
    return value


def _number(op, name, value):
    if isinstance(value, Tensor):
        if value.numel() != 1:
            raise ValueError(f"{op}: {name} must be a number or a one-element tensor, got shape "
                             f"{value.shape}")
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{op}: {name} must be a real number, got {value!r}")
    return value


def eye(n, m=None, *, dtype=None, device=None, requires_grad=False):
    """The [n, m] matrix (m = n by default) with ones on the diagonal, zeros elsewhere."""
    n = _count("eye", "n", n)
    m = n if m is None else _count("eye", "m", m)
    device = _device(device)
    rows = arange(n, device=device).reshape(n, 1)
    out = (rows == arange(m, device=device).reshape(1, m)).to(dtype or dtypes.default_float)
    return out.requires_grad_() if requires_grad else out


def linspace(start, end, steps, *, dtype=None, device=None, requires_grad=False):
    """`steps` values evenly spaced from start to end inclusive, as torch.linspace: value i is
    start + i * step in the first half and end - (steps - 1 - i) * step in the second, with
    step = (end - start) / (steps - 1), computed in the output dtype (float64 for integers)."""
    start, end = _number("linspace", "start", start), _number("linspace", "end", end)
    steps = _count("linspace", "steps", steps)
    dtype = dtypes.get_dtype(dtype or dtypes.default_float)
    work = dtype if dtype.is_floating_point else dtypes.float64
    device = _device(device)
    if steps <= 1:
        out = full((steps,), start, dtype=work, device=device)
    else:
        step = (end - start) / (steps - 1)
        i = arange(steps, dtype=work, device=device)
        out = ops.where(i < steps // 2, start + i * step, end - (steps - 1 - i) * step)
    out = out.to(dtype)
    return out.requires_grad_() if requires_grad else out


def logspace(start, end, steps, base=10.0, *, dtype=None, device=None, requires_grad=False):
    """base ** linspace(start, end, steps) (the exponents in float64)."""
    base = _number("logspace", "base", base)
    dtype = dtypes.get_dtype(dtype or dtypes.default_float)
    exponents = linspace(start, end, steps, dtype=dtypes.float64, device=device)
    out = ops.pow(float(base), exponents).to(dtype)
    return out.requires_grad_() if requires_grad else out


_UNIT = 1 << 24        # a uniform draw is k / 2**24 for an integer k (kernels/random.py)
_WIDEST = 1 << 48      # two draws give a 48-bit integer


def randint(*args, size=None, low=None, high=None, generator=None, dtype=None, device=None,
            requires_grad=False):
    """Integers uniform in [low, high) of shape `size`, as torch.randint(low=0, high, size):
    `td.randint(10, (3,))`, `td.randint(5, 10, (2, 2))`. Drawn from the global Philox stream
    (td.manual_seed), or from `generator` (a td.Generator): the same numbers on every backend.

    A draw is an integer k in [0, 2**24) (a uniform of kernels/random.py times 2**24, exact);
    the value is low + (k * span) >> 24 for a span up to 2**24 (bias at most span / 2**24), and
    low + (2**24 k1 + k2) mod span from two draws for spans up to 2**48."""
    op = "randint"
    if len(args) > 3:
        raise TypeError(f"{op}: takes (high, size) or (low, high, size), got {len(args)} "
                        "positional arguments")
    if len(args) == 3:
        low, high, size = args
    elif len(args) == 2:
        if size is None and high is None:
            high, size = args
        elif size is None:
            low, size = args[0], args[1]
        else:
            low, high = args
    elif len(args) == 1:
        if high is None:
            high = args[0]
        else:
            low = args[0]
    if high is None or size is None:
        raise TypeError(f"{op}: needs high and size, as randint(high, size) or "
                        "randint(low, high, size)")
    low = 0 if low is None else low
    for name, value in (("low", low), ("high", high)):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise TypeError(f"{op}: {name} must be an int, got {value!r}")
    low, high = int(low), int(high)
    span = high - low
    if span <= 0:
        raise ValueError(f"{op}: expected low < high, got low={low} and high={high}")
    if span > _WIDEST:
        raise ValueError(f"{op}: a range wider than 2**48 is not supported (got {span})")
    shape = _shape((size,), op)
    dtype = dtypes.get_dtype(dtype or dtypes.int64)
    if requires_grad and not dtype.is_floating_point:
        raise RuntimeError(f"{op}: only floating point tensors can require gradients, got "
                           f"dtype={dtype.name}")
    device = _device(device)
    backend = get_backend()
    backend.check_device(op, device)
    n = math.prod(shape)
    wide = span > _UNIT
    seed, offset = take_from(generator, 2 * n if wide else n)

    def draw(at):
        u = backend.uniform(shape, 0.0, 1.0, seed, at, dtypes.float32, device)
        return (Tensor._wrap(u) * float(_UNIT)).to(dtypes.int64)

    k = draw(offset)
    if wide:
        r = k * _UNIT + draw(offset + n)
        value = r - ops.div(r, span, rounding_mode="floor") * span
    else:
        value = ops.div(k * span, _UNIT, rounding_mode="floor")
    out = (value + low).to(dtype) if low else value.to(dtype)
    return out.requires_grad_() if requires_grad else out


def isclose(input, other, rtol=1e-05, atol=1e-08, equal_nan=False):
    """|input - other| <= atol + rtol |other| elementwise (broadcast), as torch.isclose:
    infinities are close only to themselves, NaN only to NaN and only with equal_nan."""
    op = "isclose"
    for name, t in (("input", input), ("other", other)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{op}: {name} must be a Tensor, got {type(t).__name__}")
    if input.dtype is not other.dtype:
        raise TypeError(f"{op}: input ({input.dtype.name}, {input.shape}) and other "
                        f"({other.dtype.name}, {other.shape}) must have the same dtype")
    if rtol < 0 or atol < 0:
        raise ValueError(f"{op}: rtol and atol must be non-negative, got rtol={rtol}, "
                         f"atol={atol}")
    same = input == other
    if input.dtype is dtypes.bool_:
        return same
    a, b = input, other
    if not a.dtype.is_floating_point:
        a, b = a.to(dtypes.float64), b.to(dtypes.float64)
    near = (a - b).abs() <= atol + rtol * b.abs()
    if input.dtype.is_floating_point:
        near = logical_and(near, logical_and(isfinite(a), isfinite(b)))
        if equal_nan:
            same = logical_or(same, logical_and(isnan(a), isnan(b)))
    return logical_or(same, near)


def allclose(input, other, rtol=1e-05, atol=1e-08, equal_nan=False):
    """Whether every element of input is close to other's (isclose), as a Python bool."""
    return bool(isclose(input, other, rtol, atol, equal_nan).all().item())


def unbind(input, dim=0):
    """The slices of input along dim, as a tuple of views (each without that dim)."""
    if not isinstance(input, Tensor):
        raise TypeError(f"unbind: expected a Tensor, got {type(input).__name__}")
    if input.ndim == 0:
        raise IndexError("unbind: cannot unbind a 0-d tensor")
    if not -input.ndim <= dim < input.ndim:
        raise IndexError(f"unbind: dimension {dim} is out of range for shape {input.shape}")
    lead = (slice(None),) * (dim % input.ndim)
    return tuple(input[lead + (i,)] for i in range(input.shape[dim]))


def split(tensor, split_size_or_sections, dim=0):
    """Views of consecutive pieces along dim (Tensor.split)."""
    return tensor.split(split_size_or_sections, dim)


def chunk(input, chunks, dim=0):
    """At most `chunks` views of equal size along dim (Tensor.chunk)."""
    return input.chunk(chunks, dim)


# ---- the legacy constructors: td.LongTensor([1, 2]), td.FloatTensor(2, 3), isinstance checks


class _LegacyTensorType(type):
    """td.FloatTensor(data) is td.tensor(data, dtype=td.float32); td.FloatTensor(2, 3) is
    zeros of that shape (torch leaves them uninitialized); isinstance(x, td.FloatTensor) checks
    the dtype."""

    def __call__(cls, *args, device=None):
        if not args:
            return empty(0, dtype=cls.dtype, device=device)
        if all(isinstance(a, numbers.Integral) and not isinstance(a, bool) for a in args):
            return zeros(*args, dtype=cls.dtype, device=device)
        if len(args) == 1:
            data = args[0]
            if isinstance(data, Tensor):
                return data.to(cls.dtype) if device is None else data.to(device, cls.dtype)
            return tensor(np.asarray(data) if isinstance(data, np.ndarray) else data,
                          dtype=cls.dtype, device=device)
        raise TypeError(f"{cls.__name__}: expected data (a list, an array or a Tensor) or "
                        f"sizes (ints), got {args!r}")

    def __instancecheck__(cls, obj):
        return isinstance(obj, Tensor) and obj.dtype is cls.dtype


def _legacy(name, dtype):
    return _LegacyTensorType(name, (), {"dtype": dtype, "__module__": __name__})


FloatTensor = _legacy("FloatTensor", dtypes.float32)
DoubleTensor = _legacy("DoubleTensor", dtypes.float64)
HalfTensor = _legacy("HalfTensor", dtypes.float16)
BFloat16Tensor = _legacy("BFloat16Tensor", dtypes.bfloat16)
LongTensor = _legacy("LongTensor", dtypes.int64)
IntTensor = _legacy("IntTensor", dtypes.int32)
ByteTensor = _legacy("ByteTensor", dtypes.uint8)
BoolTensor = _legacy("BoolTensor", dtypes.bool_)
