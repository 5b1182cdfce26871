"""Handlers: reductions (sum, mean, amax/amin, max/min with and without dim, argmax/argmin,
var/std with correction, var_mean/std_mean, all/any, linalg_vector_norm) on tritonad's reduction
kernels (kernels/reduce.py). Dims are normalised as PyTorch does (negative, a list, None or []
for all); empty reductions whose result PyTorch defines (a sum of nothing is 0) run, those it
refuses (the max of nothing) fall back so that PyTorch raises its own error.
"""
from __future__ import annotations

import math

import torch

from .. import dtypes
from .elementwise import B, FLOATS, check, write_into
from .registry import Fallback, register


def _dims(x, dim):
    """PyTorch's dim argument as tritonad's: None for all (None, [] or ()), else a tuple."""
    if dim is None:
        return None
    if isinstance(dim, int):
        return (dim,)
    dim = tuple(dim)
    return dim or None


def _dtype(dtype):
    if dtype is None:
        return None
    try:
        return dtypes.get_dtype(dtype)
    except TypeError:
        raise Fallback(f"dtype {dtype}") from None


def _finish(result, out):
    return result if out is None else write_into(out, result)


# ------------------------------------------------------------------------------ sum and mean

@register("aten::sum.default", "aten::sum.dim_IntList", "aten::sum.IntList_out",
          "aten::sum.out")
def sum_(x, dim=None, keepdim=False, *, dtype=None, out=None):
    check(x, out)
    return _finish(B.sum(x, _dims(x, dim), keepdim, _dtype(dtype)), out)


@register("aten::mean.default", "aten::mean.dim", "aten::mean.out")
def mean(x, dim=None, keepdim=False, *, dtype=None, out=None):
    check(x, out)
    if dtype is not None and dtype != x.dtype:
        if dtype not in FLOATS:
            raise Fallback(f"mean with dtype {dtype}")
        x = B.cast(x, dtypes.get_dtype(dtype))
    if x.dtype not in FLOATS:
        raise Fallback(f"mean of {x.dtype}")
    return _finish(B.mean(x, _dims(x, dim), keepdim), out)


# ------------------------------------------------------------------------------ extremes

def _nonempty(x, dims, name):
    if x.numel() == 0:
        raise Fallback(f"{name} of an empty tensor")
    if x.dtype is torch.bool:
        raise Fallback(f"{name} of bool")


@register("aten::amax.default", "aten::amax.out")
def amax(x, dim=(), keepdim=False, *, out=None):
    check(x, out)
    _nonempty(x, dim, "amax")
    return _finish(B.max(x, _dims(x, dim), keepdim), out)


@register("aten::amin.default", "aten::amin.out")
def amin(x, dim=(), keepdim=False, *, out=None):
    check(x, out)
    _nonempty(x, dim, "amin")
    return _finish(B.min(x, _dims(x, dim), keepdim), out)


def _extreme_dim(values, index):
    def handler(x, dim, keepdim=False):
        check(x)
        _nonempty(x, dim, "max")
        return values(x, (dim,), keepdim), index(x, dim, keepdim)
    return handler


register("aten::max.dim")(_extreme_dim(B.max, B.argmax))
register("aten::min.dim")(_extreme_dim(B.min, B.argmin))


@register("aten::max.default", "aten::max.unary_out")
def max_(x, *, out=None):
    check(x, out)
    _nonempty(x, None, "max")
    return _finish(B.max(x, None, False), out)


@register("aten::min.default", "aten::min.unary_out")
def min_(x, *, out=None):
    check(x, out)
    _nonempty(x, None, "min")
    return _finish(B.min(x, None, False), out)


@register("aten::argmax.default", "aten::argmax.out")
def argmax(x, dim=None, keepdim=False, *, out=None):
    check(x, out)
    _nonempty(x, dim, "argmax")
    return _finish(B.argmax(x, dim, keepdim), out)


@register("aten::argmin.default", "aten::argmin.out")
def argmin(x, dim=None, keepdim=False, *, out=None):
    check(x, out)
    _nonempty(x, dim, "argmin")
    return _finish(B.argmin(x, dim, keepdim), out)


# ------------------------------------------------------------------------------ var and std

def _var(x, dim, correction, keepdim):
    check(x)
    if x.dtype not in FLOATS:
        raise Fallback(f"var of {x.dtype}")
    correction = 1 if correction is None else correction
    return B.var(x, _dims(x, dim), correction, keepdim)


@register("aten::var.correction", "aten::var.correction_out")
def var(x, dim=None, *, correction=None, keepdim=False, out=None):
    return _finish(_var(x, dim, correction, keepdim), out)


@register("aten::std.correction", "aten::std.correction_out")
def std(x, dim=None, *, correction=None, keepdim=False, out=None):
    return _finish(B.sqrt(_var(x, dim, correction, keepdim)), out)


@register("aten::var_mean.correction")
def var_mean(x, dim=None, *, correction=None, keepdim=False):
    return _var(x, dim, correction, keepdim), B.mean(x, _dims(x, dim), keepdim)


@register("aten::std_mean.correction")
def std_mean(x, dim=None, *, correction=None, keepdim=False):
    return B.sqrt(_var(x, dim, correction, keepdim)), B.mean(x, _dims(x, dim), keepdim)


# ------------------------------------------------------------------------------ all and any
# all: no element is zero (the count of zeros is 0); any: some element is nonzero.

def _truth(x, dim, keepdim, every):
    check(x)
    if x.dtype is torch.uint8:
        raise Fallback("all/any of uint8 (a uint8 result)")
    if every:
        return B.eq(B.sum(B.logical_not(x), _dims(x, dim), keepdim), 0)
    return B.ne(B.sum(B.ne(x, 0), _dims(x, dim), keepdim), 0)


def _truth_handler(every):
    def handler(x, dim=None, keepdim=False, *, out=None):
        check(out)
        return _finish(_truth(x, dim, keepdim, every), out)
    return handler


register("aten::all.default", "aten::all.dim", "aten::all.dims", "aten::all.out",
         "aten::all.dims_out", "aten::all.all_out")(_truth_handler(True))
register("aten::any.default", "aten::any.dim", "aten::any.dims", "aten::any.out",
         "aten::any.dims_out", "aten::any.all_out")(_truth_handler(False))


# ------------------------------------------------------------------------------ norms

@register("aten::linalg_vector_norm.default", "aten::linalg_vector_norm.out")
def linalg_vector_norm(x, ord=2, dim=None, keepdim=False, *, dtype=None, out=None):
    """||x||_ord over dim: sqrt(sum x^2), sum |x|, max |x|, min |x|, count of nonzeros, or
    (sum |x|^p)^(1/p)."""
    check(x, out)
    if dtype is not None and dtype != x.dtype:
        if dtype not in FLOATS:
            raise Fallback(f"norm with dtype {dtype}")
        x = B.cast(x, dtypes.get_dtype(dtype))
    if x.dtype not in FLOATS:
        raise Fallback(f"norm of {x.dtype}")
    if x.dtype in (torch.float16, torch.bfloat16) and ord not in (0, math.inf, -math.inf):
        # powers and sums in float32, as PyTorch's (a float16 square overflows from 256 on)
        half = dtypes.get_dtype(x.dtype)
        return _finish(B.cast(linalg_vector_norm(B.cast(x, dtypes.float32), ord, dim,
                                                 keepdim), half), out)
    dims = _dims(x, dim)
    if ord == 2:
        result = B.sqrt(B.sum(B.mul(x, x), dims, keepdim))
    elif ord == 1:
        result = B.sum(B.abs(x), dims, keepdim)
    elif ord == math.inf or ord == -math.inf:
        if x.numel() == 0:
            raise Fallback("an infinity norm of an empty tensor")
        reduce = B.max if ord > 0 else B.min
        result = reduce(B.abs(x), dims, keepdim)
    elif ord == 0:
        result = B.sum(B.ne(x, 0), dims, keepdim, dtypes.get_dtype(x.dtype))
    else:
        if ord < 0:
            raise Fallback("a negative norm order")
        powered = B.sum(B.pow_scalar(B.abs(x), float(ord)), dims, keepdim)
        result = B.pow_scalar(powered, 1.0 / ord)
    return _finish(result, out)


# ------------------------------------------------------------------------------ scans and sorting
# kernels/scan.py: scans with a carry across tiles; a bitonic sort in registers, merged across
# tiles in memory (stable: ties keep their order, NaN the largest, as PyTorch's CPU sort).

def _scan_input(x, dim):
    check(x)
    rank = max(x.dim(), 1)
    if not -rank <= dim < rank:
        raise Fallback("dim out of range")
    return (x.reshape(1) if x.dim() == 0 else x), dim % rank


def _cumulative(op):
    def handler(x, dim, *, dtype=None, out=None):
        check(out)
        shape = x.shape
        x, dim = _scan_input(x, dim)
        if x.dtype is torch.bool and dtype is None and op == "prod":
            raise Fallback("cumprod of bools")
        result = B.cumulative(x, dim, op, False, _dtype(dtype)).reshape(shape)
        return _finish(result, out)
    return handler


register("aten::cumsum.default", "aten::cumsum.out")(_cumulative("sum"))
register("aten::cumprod.default", "aten::cumprod.out")(_cumulative("prod"))


def _extremes(largest):
    def handler(x, dim):
        shape = x.shape
        x, dim = _scan_input(x, dim)
        if x.dtype is torch.bool:
            raise Fallback("cummax of bools")
        values, indices = B.cumulative_extreme(x, dim, largest)
        return values.reshape(shape), indices.reshape(shape)
    return handler


register("aten::cummax.default")(_extremes(True))
register("aten::cummin.default")(_extremes(False))


def _sort(x, dim=-1, descending=False):
    shape = x.shape
    x, dim = _scan_input(x, dim)
    if x.dtype is torch.bool:
        raise Fallback("sort of bools")
    values, indices = B.sort(x, dim, descending, True)
    return values.reshape(shape), indices.reshape(shape)


@register("aten::sort.default")
def sort(x, dim=-1, descending=False):
    return _sort(x, dim, descending)


@register("aten::sort.stable")
def sort_stable(x, *, stable=None, dim=-1, descending=False):
    return _sort(x, dim, descending)


@register("aten::topk.default")
def topk(x, k, dim=-1, largest=True, sorted=True):
    shape = x.shape
    x, dim = _scan_input(x, dim)
    if x.dtype is torch.bool or not 0 <= k <= x.shape[dim]:
        raise Fallback("topk of bools or k out of range")
    values, indices = B.topk(x, k, dim, largest, sorted)
    if len(shape) == 0:
        return values.reshape(shape), indices.reshape(shape)
    return values, indices


# ------------------------------------------------------------------------------ composed reductions

@register("aten::logsumexp.default", "aten::logsumexp.out")
def logsumexp(x, dim, keepdim=False, *, out=None):
    """m + log(sum(exp(x - m))) with m the max over dim (0 where m is infinite, so that a row of
    -inf gives -inf and a +inf gives +inf, as PyTorch); integers give float32."""
    check(x, out)
    if x.numel() == 0:
        raise Fallback("logsumexp of an empty tensor")
    dims = _dims(x, dim)
    if x.dtype not in FLOATS:
        x = B.cast(x, dtypes.float32)
    m = B.max(x, dims, True)
    m = B.where(B.isfinite(m), m, 0)
    s = B.log(B.sum(B.exp(B.sub(x, m)), dims, True))
    result = B.add(s, m)
    if not keepdim:
        kept = dims if dims is not None else tuple(range(x.dim()))
        kept = {d % max(x.dim(), 1) for d in kept}
        result = result.reshape([n for i, n in enumerate(x.shape) if i not in kept])
    return _finish(result, out)


@register("aten::prod.default", "aten::prod.dim_int", "aten::prod.int_out")
def prod(x, dim=None, keepdim=False, *, dtype=None, out=None):
    """The last element of the running product along dim (kernels/scan.py's carried scan);
    over every element, the running product of the flattened tensor."""
    check(x, out)
    if x.dtype is torch.bool and dtype is None:
        raise Fallback("prod of bools")
    if dim is None:
        flat = (x if x.is_contiguous() else B.contiguous(x)).reshape(-1)
        if flat.numel() == 0:
            raise Fallback("prod of an empty tensor")
        result = B.cumulative(flat, 0, "prod", False, _dtype(dtype))[-1]
        return _finish(B.contiguous(result), out)
    x1, d = _scan_input(x, dim)
    if x1.shape[d] == 0:
        raise Fallback("prod over an empty dim")
    running = B.cumulative(x1, d, "prod", False, _dtype(dtype))
    result = B.contiguous(running.narrow(d, x1.shape[d] - 1, 1))
    if x.dim() == 0:
        return _finish(result.reshape(()), out)
    return _finish(result if keepdim else result.squeeze(d), out)
