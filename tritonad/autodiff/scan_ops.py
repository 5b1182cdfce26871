"""Scans and sorting, differentiable: cumsum, cumprod, logcumsumexp, cummax, cummin, sort,
argsort, topk (PyTorch's names, arguments and results), and the gather and scatter along one
dim that carry their gradients.

The primitives are backend.cumulative, cumulative_extreme, sort, topk, gather_along and
scatter_add_along (kernels/scan.py, reference/scan.py). Backwards are written in tritonad ops,
so gradients of gradients exist:
    cumsum:        dx = reverse cumsum of dy
    cumprod:       dx_i = sum_{j >= i} dy_j y_j / x_i where x_i != 0; at a row's first zero z,
                   dx_z = reverse cumsum of dy * cumprod(x with x_z = 1) at z; later zeros 0
    logcumsumexp:  dx_i = sum_{j >= i} dy_j exp(x_i - y_j), summed as reverse logcumsumexps of
                   log(dy) - y over the positive and the negative dy apart (no overflow)
    cummax/cummin, sort, topk: dy scattered back to the indices (added where they repeat).
"""
from __future__ import annotations

from .. import dtypes
from ..backend import get_backend
from ..tensor import MaxResult, Tensor
from .function import Function
from .ops import exp, log, where


def _dim(op, x, dim):
    if not isinstance(dim, int) or isinstance(dim, bool):
        raise TypeError(f"{op}: dim must be an int, got {type(dim).__name__}")
    n = max(x.ndim, 1)
    if not -n <= dim < n:
        raise IndexError(f"{op}: dimension {dim} is out of range for a tensor of shape "
                         f"{tuple(x.shape)} (expected to be in range of [{-n}, {n - 1}])")
    return dim % n


def _as_dtype(dtype):
    return None if dtype is None else dtypes.get_dtype(dtype)


def _scalar_safe(fn, x, *rest):
    """Run fn on x as [1] when x is 0-d (dim 0 of a 0-d tensor is its one element)."""
    if x.ndim:
        return fn(x, *rest)
    out = fn(x.reshape(1), *rest)
    if isinstance(out, tuple):
        return type(out)(*(o.reshape(()) for o in out))
    return out.reshape(())


# ------------------------------------------------------------------------------ gather/scatter


class GatherAlong(Function):
    """y = x[..., index, ...] along dim; dx = dy scattered back (added where index repeats)."""
    primitive = "gather_along"

    @staticmethod
    def forward(ctx, x, index, dim):
        ctx.size, ctx.dim = x.shape[dim], dim
        ctx.save_for_backward(index)
        return get_backend().gather_along(x, index, dim)

    @staticmethod
    def backward(ctx, dy):
        (index,) = ctx.saved
        return ScatterAddAlong.apply(dy, index, ctx.dim, ctx.size), None, None


class ScatterAddAlong(Function):
    """y = zeros with `size` along dim, src added at index; dsrc = dy gathered at index."""
    primitive = "scatter_add_along"

    @staticmethod
    def forward(ctx, src, index, dim, size):
        ctx.dim = dim
        ctx.save_for_backward(index)
        return get_backend().scatter_add_along(src, index, dim, size)

    @staticmethod
    def backward(ctx, dy):
        (index,) = ctx.saved
        return GatherAlong.apply(dy, index, ctx.dim), None, None, None


# ------------------------------------------------------------------------------------ scans


class Cumulative(Function):
    """Inclusive scan along dim (op "sum", "prod" or "logsumexp"; reversed when `reverse`)."""
    primitive = "cumulative"

    @staticmethod
    def forward(ctx, x, dim, op, reverse, dtype):
        y = get_backend().cumulative(x, dim, op, reverse, dtype)
        ctx.dim, ctx.op, ctx.reverse = dim, op, reverse
        if op != "sum":
            ctx.save_for_backward(x, y)
        return y

    @staticmethod
    def backward(ctx, dy):
        dim, reverse = ctx.dim, ctx.reverse
        if ctx.op == "sum":
            return Cumulative.apply(dy, dim, "sum", not reverse, None), None, None, None, None
        x, y = ctx.saved
        if ctx.op == "prod":
            return _cumprod_grad(x, y, dy, dim, reverse), None, None, None, None
        # logcumsumexp: dx_i = sum over the later j of dy_j exp(x_i - y_j)
        back = not reverse
        pos, neg = dy > 0, dy < 0
        # NOTE: -y inside the where: a row of -inf (y = -inf) gives no -inf - (-inf) = NaN
        log_pos = where(pos, log(where(pos, dy, 1.0)) - y, float("-inf"))
        log_neg = where(neg, log(where(neg, -dy, 1.0)) - y, float("-inf"))
        dx = exp(x + Cumulative.apply(log_pos, dim, "logsumexp", back, None)) - \
            exp(x + Cumulative.apply(log_neg, dim, "logsumexp", back, None))
        return dx, None, None, None, None


def _cumprod_grad(x, y, dy, dim, reverse):
    back = not reverse
    zero = x == 0
    total = Cumulative.apply(dy * y, dim, "sum", back, None)
    dx = where(zero, 0.0, total / where(zero, 1.0, x))
    # the first zero of a row (in scan order) sees the products of the elements after it
    first = zero & (Cumulative.apply(zero, dim, "sum", reverse, None) == 1)
    y_skip = Cumulative.apply(where(first, 1.0, x), dim, "prod", reverse, None)
    return where(first, Cumulative.apply(dy * y_skip, dim, "sum", back, None), dx)


class _Selected(Function):
    """An op that returns (values, indices) of x along dim, each value x's element at its
    index (cummax/cummin, sort, topk): dx is dy added back at the indices (the engine gives
    the other arguments None)."""

    @staticmethod
    def _selected(ctx, x, dim, values, indices):
        ctx.dim, ctx.size = dim, x.shape[dim]
        ctx.save_for_backward(indices)
        ctx.mark_non_differentiable(indices)
        return values, indices

    @staticmethod
    def backward(ctx, dy, _):
        (indices,) = ctx.saved
        return ScatterAddAlong.apply(dy, indices, ctx.dim, ctx.size)


class CumExtreme(_Selected):
    """(values, indices) of the running max or min along dim."""
    @staticmethod
    def forward(ctx, x, dim, largest):
        return _Selected._selected(ctx, x, dim,
                                   *get_backend().cumulative_extreme(x, dim, largest))


def cumsum(input, dim, *, dtype=None):
    """Cumulative sum along dim: `td.cumsum(x, 0)`; integers and bools sum to int64 unless
    dtype is given (input is cast to dtype first, as torch)."""
    d = _dim("cumsum", input, dim)
    return _scalar_safe(lambda v: Cumulative.apply(v, d, "sum", False, _as_dtype(dtype)), input)


def cumprod(input, dim, *, dtype=None):
    """Cumulative product along dim: `td.cumprod(x, -1)`; integers to int64 as cumsum."""
    d = _dim("cumprod", input, dim)
    return _scalar_safe(lambda v: Cumulative.apply(v, d, "prod", False, _as_dtype(dtype)), input)


def logcumsumexp(input, dim):
    """log(cumsum(exp(x))) along dim without overflow: `td.logcumsumexp(x, 1)`."""
    d = _dim("logcumsumexp", input, dim)
    if not input.dtype.is_floating_point:
        raise TypeError(f"logcumsumexp: expected a floating point input, got {input.dtype.name} "
                        f"of shape {tuple(input.shape)}")
    return _scalar_safe(lambda v: Cumulative.apply(v, d, "logsumexp", False, None), input)


def cummax(input, dim):
    """(values, indices): the running maximum along dim and where it was last seen; NaN
    propagates. `td.cummax(x, 0).values`."""
    d = _dim("cummax", input, dim)
    return _scalar_safe(lambda v: MaxResult(*CumExtreme.apply(v, d, True)), input)


def cummin(input, dim):
    """(values, indices): the running minimum along dim (as cummax)."""
    d = _dim("cummin", input, dim)
    return _scalar_safe(lambda v: MaxResult(*CumExtreme.apply(v, d, False)), input)


# ------------------------------------------------------------------------------------ sorting


class Sort(_Selected):
    """(values, indices) sorted along dim (dx: dy put back through the permutation)."""
    @staticmethod
    def forward(ctx, x, dim, descending, stable):
        return _Selected._selected(ctx, x, dim, *get_backend().sort(x, dim, descending, stable))


class TopK(_Selected):
    """(values, indices) of the k best along dim (dx: dy at the indices, zeros elsewhere)."""
    @staticmethod
    def forward(ctx, x, k, dim, largest, sorted):
        return _Selected._selected(ctx, x, dim,
                                   *get_backend().topk(x, k, dim, largest, sorted))


def _check_sortable(op, x):
    if x.dtype is dtypes.bool_:
        return  # (sorted as 0 and 1)
    if not isinstance(x, Tensor):
        raise TypeError(f"{op}: expected a Tensor, got {type(x).__name__}")


def sort(input, dim=-1, descending=False, stable=False):
    """(values, indices) of input sorted along dim: `v, i = td.sort(x, descending=True)`.
    Always stable (ties keep their order); NaN sorts as the largest, as torch."""
    _check_sortable("sort", input)
    d = _dim("sort", input, dim)
    return _scalar_safe(lambda v: MaxResult(*Sort.apply(v, d, bool(descending), bool(stable))),
                        input)


def argsort(input, dim=-1, descending=False, stable=False):
    """The int64 indices that sort input along dim: `td.argsort(x, dim=1)`."""
    return sort(input, dim, descending, stable).indices


def topk(input, k, dim=-1, largest=True, sorted=True):
    """(values, indices) of the k largest (smallest if not largest) along dim, best first:
    `td.topk(logits, 5).indices`. Ties go to the lower index; NaN is the largest."""
    _check_sortable("topk", input)
    d = _dim("topk", input, dim)
    n = input.shape[d] if input.ndim else 1
    if isinstance(k, bool) or not isinstance(k, int):
        raise TypeError(f"topk: k must be an int, got {type(k).__name__}")
    if not 0 <= k <= n:
        raise RuntimeError(f"topk: k ({k}) is out of range for dimension {dim} of size {n} "
                           f"(shape {tuple(input.shape)})")
    return _scalar_safe(lambda v: MaxResult(*TopK.apply(v, k, d, bool(largest), bool(sorted))),
                        input)


def gather_along(input, index, dim):
    """input[..., index[..., j, ...], ...] along dim, index of input's shape outside dim."""
    return GatherAlong.apply(input, index, _dim("gather_along", input, dim))
