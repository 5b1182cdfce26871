"""Differentiable elementwise ops and reductions: each a Function with forward and backward.

Primitive backwards are written in tritonad ops, so they can be differentiated again; gradients
are returned at the broadcast shape and the engine sums them back to each input's shape.
The view/indexing ops live in shape_ops.py and the network ops (matmul, softmax, losses,
convolution, pooling, dropout) in nn_ops.py and conv_ops.py; all are re-exported here.
"""
from __future__ import annotations

import builtins
import math
import numbers

from .. import dtypes
from ..backend import _state, get_backend
from .autocast import float32, state as _autocast
from .grad_mode import grad_mode
from ..tensor import MaxResult, Tensor, arange, full, tensor, zeros  # noqa: F401  (re-exported)
from .. import elementwise as table
from .elementwise import *  # noqa: F401,F403  (every entry of the elementwise table)
from .elementwise import clamp_tensor_bounds, where
from .dims import _BROADCASTS, broadcast_shapes, normalize_dims  # noqa: F401
from . import function
from .function import Function


def backend():
    return get_backend()


# ---------------------------------------------------------------------------------- helpers


def _operand(x, like):
    """Tensors and Python numbers pass; sequences and arrays become tensors on like's device."""
    if isinstance(x, (Tensor, numbers.Number)):
        return x
    return tensor(x, device=like.device)


def _binary(fn, a, b):
    a_tensor, b_tensor = isinstance(a, Tensor), isinstance(b, Tensor)
    if a_tensor and b_tensor:
        sa, sb = a._data.shape, b._data.shape
        if sa != sb and (sa, sb) not in _BROADCASTS:  # (a pair met before needs no check)
            broadcast_shapes(fn.__name__.lower(), sa, sb)
        return fn.apply(a, b)
    if not a_tensor and not b_tensor:
        raise TypeError(f"{fn.__name__.lower()}: expected at least one tensor")
    if a_tensor and not isinstance(b, numbers.Number):
        b = _operand(b, a)  # a sequence or an array
        broadcast_shapes(fn.__name__.lower(), a.shape, b.shape)
    elif b_tensor and not isinstance(a, numbers.Number):
        a = _operand(a, b)
        broadcast_shapes(fn.__name__.lower(), a.shape, b.shape)
    return fn.apply(a, b)


def _kept_shape(shape, dims):
    """The shape of a keepdim=True reduction over dims (None: all)."""
    return tuple(1 if dims is None or i in dims else n for i, n in enumerate(shape))


def _expand_back(dy, shape, dims):
    """A reduction's output gradient viewed at keepdim shape and broadcast to the input shape."""
    if dy._requires_grad and grad_mode.enabled:  # create_graph: recorded views
        return dy.reshape(_kept_shape(shape, dims)).expand(shape)
    # (nothing to record: the two views of the memory at once; inserting size-1 dims is always a
    # view, and expand of the kept shape to the input's is valid by construction)
    raw = dy._data.view(_kept_shape(shape, dims)).expand(shape)
    return Tensor._wrap(raw, False, None, 0, dy._version_box)


def _require_float(op, x):
    if not x.dtype.is_floating_point:
        raise TypeError(f"{op}: expected a floating point tensor, got {x.dtype} of shape {x.shape}")


# ---------------------------------------------------------------------------------- binary ops


class Pow(Function):
    """y = a ** b: da = dy * b * a ** (b - 1), db = dy * y * log(a).

    NOTE: as torch, da = 0 where b = 0 (also at a = 0, where 0 * 0 ** -1 would be nan), and
    db = 0 where a = 0 and b >= 0 (0 * log 0 would be nan); for a = 0, b < 0 it is
    inf * log 0 = -inf."""
    primitive = "pow"
    @staticmethod
    def forward(ctx, a, b):
        y = backend().pow(a, b)
        ctx.save_for_backward(a, b, y)
        return y

    @staticmethod
    def backward(ctx, dy):
        a, b, y = ctx.saved
        da = db = None
        if ctx.needs_input_grad[0]:
            if isinstance(b, Tensor):
                da = where(b == 0, 0.0, dy * b * a ** (b - 1))
            else:
                da = dy * 0.0 if b == 0 else dy * b * a ** (b - 1)
        if ctx.needs_input_grad[1]:
            if isinstance(a, Tensor):
                db = dy * y * log(a)
                db = where(a == 0, where(b >= 0, 0.0, db), db)
            elif a == 0:
                db = where(b >= 0, 0.0, dy * y * -math.inf)
            else:
                db = dy * y * (math.log(a) if a > 0 else math.nan)
        return da, db


class PowScalar(Function):
    """y = x ** p for a number p: dx = dy * p * x ** (p - 1)."""
    primitive = "pow_scalar"
    @staticmethod
    def forward(ctx, x, p):
        ctx.save_for_backward(x)
        ctx.p = p
        return backend().pow_scalar(x, p)

    @staticmethod
    def backward(ctx, dy):
        (x,) = ctx.saved
        if ctx.p == 0:
            return dy * 0.0, None
        return dy * ctx.p * (x ** (ctx.p - 1) if ctx.p != 2 else x), None


def _arithmetic(fn):
    """The op of binary Function `fn` (add, sub, mul, div): _binary and Function.apply's lean
    path in one frame for its commonest eager call, two plain Tensors with nothing to record;
    every other call takes _binary. Tensor's operators are these functions themselves (see the
    end of this module): from `x + b` to the backend primitive is two Python frames fewer."""
    primitive, name = fn.primitive, fn.__name__.lower()
    wrap = Tensor._wrap

    def op(a, b):
        if type(a) is Tensor and type(b) is Tensor:
            ra, rb = a._data, b._data
            sa, sb = ra.shape, rb.shape
            if sa != sb and (sa, sb) not in _BROADCASTS:  # (a pair met before needs no check)
                broadcast_shapes(name, sa, sb)
            if not ((a._requires_grad or b._requires_grad) and grad_mode.enabled) and \
                    ra.get_device() == rb.get_device():
                be = _state.cuda if ra.is_cuda else _state.cpu
                if be is not None:
                    return wrap(getattr(be, primitive)(ra, rb), False, None, 0, None)
            return fn.apply(a, b)
        return _binary(fn, a, b)

    op.__name__ = op.__qualname__ = name
    op.__doc__ = f"{name}(a, b): {fn.__doc__.strip()} Broadcasts as numpy; numbers allowed."
    return op


add, sub, mul, div = (_arithmetic(getattr(table, n).function) for n in ("add", "sub", "mul", "div"))
def maximum(a, b): return _binary(table.maximum.function, a, b)
def minimum(a, b): return _binary(table.minimum.function, a, b)
def eq(a, b): return _binary(table.eq.function, a, b)
def ne(a, b): return _binary(table.ne.function, a, b)
def lt(a, b): return _binary(table.lt.function, a, b)
def le(a, b): return _binary(table.le.function, a, b)
def gt(a, b): return _binary(table.gt.function, a, b)
def ge(a, b): return _binary(table.ge.function, a, b)


def pow(a, b):
    """a ** b; a number exponent uses the one-operand kernel."""
    if _autocast.dtype:  # (a float32 op under autocast)
        a, b = float32(a, b)
    if isinstance(a, Tensor) and isinstance(b, numbers.Number) and not isinstance(b, bool):
        return PowScalar.apply(a, b)
    return _binary(Pow, a, b)


# ---------------------------------------------------------------------------------- unary ops


class Clamp(Function):
    """y = min(max(x, lo), hi): the gradient passes where lo <= x <= hi (as torch)."""
    primitive = "clamp"
    @staticmethod
    def forward(ctx, x, lo, hi):
        ctx.save_for_backward(x)
        ctx.bounds = lo, hi
        return backend().clamp(x, lo, hi)

    @staticmethod
    def backward(ctx, dy):
        (x,) = ctx.saved
        lo, hi = ctx.bounds
        inside = None
        if lo is not None:
            inside = x >= lo
        if hi is not None:
            below = x <= hi
            inside = below if inside is None else where(inside, below, False)
        return where(inside, dy, 0.0), None, None




def clamp(x, min=None, max=None):
    if min is None and max is None:
        raise ValueError("clamp: at least one of min and max must be given")
    if isinstance(min, Tensor) or isinstance(max, Tensor):
        return clamp_tensor_bounds(x, min, max)
    return Clamp.apply(x, min, max)


# ---------------------------------------------------------------------------------- reductions


class Sum(Function):
    """y = sum over dims: dx = dy broadcast back."""
    primitive = "sum"
    @staticmethod
    def forward(ctx, x, dims, keepdim, dtype):
        ctx.shape, ctx.dims = tuple(x.shape), dims
        return backend().sum(x, dims, keepdim, dtype)

    @staticmethod
    def backward(ctx, dy):
        return _expand_back(dy, ctx.shape, ctx.dims), None, None, None


class Mean(Function):
    """y = mean over dims: dx = dy / n broadcast back."""
    primitive = "mean"
    @staticmethod
    def forward(ctx, x, dims, keepdim):
        ctx.shape, ctx.dims = tuple(x.shape), dims
        ctx.count = _reduced_count(x.shape, dims)
        return backend().mean(x, dims, keepdim)

    @staticmethod
    def backward(ctx, dy):
        return _expand_back(dy / builtins.max(ctx.count, 1), ctx.shape, ctx.dims), None, None


def _reduced_count(shape, dims):
    """How many elements each output of a reduction over dims sums."""
    n = 1
    for i, s in enumerate(shape):
        if dims is None or i in dims:
            n *= s
    return n


class Amax(Function):
    """Largest value over dims. NOTE: ties split the gradient evenly (as torch's max())."""
    pick = "max"

    @classmethod
    def forward(cls, ctx, x, dims, keepdim):
        ctx.shape, ctx.dims = tuple(x.shape), dims
        y = getattr(backend(), cls.pick)(x, dims, keepdim)
        ctx.save_for_backward(x, y)
        return y

    @classmethod
    def backward(cls, ctx, dy):
        x, y = ctx.saved
        hit = x == y.detach().reshape(_kept_shape(ctx.shape, ctx.dims))
        count = hit.sum(ctx.dims, keepdim=True)
        return where(hit, _expand_back(dy, ctx.shape, ctx.dims) / count, 0.0), None, None


class Amin(Amax):
    pick = "min"


class MaxDim(Function):
    """(values, indices) along one dim; the gradient goes to the first extreme (as torch)."""
    pick = "max"

    @classmethod
    def forward(cls, ctx, x, dim, keepdim):
        values = getattr(backend(), cls.pick)(x, (dim,), keepdim)
        indices = getattr(backend(), "arg" + cls.pick)(x, dim, keepdim)
        ctx.shape, ctx.dim, ctx.keepdim = tuple(x.shape), dim, keepdim
        ctx.save_for_backward(indices)
        ctx.mark_non_differentiable(indices)
        return values, indices

    @classmethod
    def backward(cls, ctx, dy, _):
        (indices,) = ctx.saved
        kept = _kept_shape(ctx.shape, (ctx.dim,))
        positions = arange(ctx.shape[ctx.dim], device=dy.device).reshape(
            [-1 if i == ctx.dim else 1 for i in range(len(ctx.shape))])
        hit = positions == indices.reshape(kept)
        return where(hit, dy.reshape(kept), 0.0), None, None


class MinDim(MaxDim):
    pick = "min"


class Var(Function):
    """y = sum((x - mean)^2) / (n - correction): dx = dy * 2 (x - mean) / (n - correction)."""
    primitive = "var"
    @staticmethod
    def forward(ctx, x, dims, correction, keepdim):
        ctx.save_for_backward(x)
        ctx.dims, ctx.correction = dims, correction
        return backend().var(x, dims, correction, keepdim)

    @staticmethod
    def backward(ctx, dy):
        (x,) = ctx.saved
        dof = _reduced_count(x.shape, ctx.dims) - ctx.correction
        centred = x - x.mean(ctx.dims, keepdim=True)
        # NOTE: no degrees of freedom left (n <= correction) scales by inf, as torch: the
        # gradient is inf or nan, and empty where x is empty
        scale = 2.0 / dof if dof > 0 else math.inf
        return _expand_back(dy, x.shape, ctx.dims) * centred * scale, None, None, None


class SumTo(Function):
    """Sum a broadcast tensor back to `shape` (the engine's un-broadcasting); dx = dy expanded."""
    primitive = "sum_to"
    @staticmethod
    def forward(ctx, x, shape):
        ctx.shape = tuple(x.shape)
        return backend().sum_to(x, shape)

    @staticmethod
    def backward(ctx, dy):
        return dy.expand(ctx.shape), None


def sum_to(x, shape):
    return x if x.shape == tuple(shape) else SumTo.apply(x, tuple(shape))


function.SUM_TO = sum_to  # the engine un-broadcasts gradients with it


def sum(x, dim=None, keepdim=False, dtype=None):
    if _autocast.dtype and dtype is None:  # (a float32 op under autocast)
        x = float32(x)
    dims = normalize_dims("sum", dim, x.ndim)
    return Sum.apply(x, dims, keepdim, dtypes.get_dtype(dtype) if dtype else None)


def mean(x, dim=None, keepdim=False):
    _require_float("mean", x)
    return Mean.apply(x, normalize_dims("mean", dim, x.ndim), keepdim)


def var(x, dim=None, unbiased=None, keepdim=False, *, correction=None):
    """torch's forms: var(x, dim, unbiased=True, keepdim), var(x, dim, correction=1, keepdim)
    and var(x, unbiased) (a lone bool is unbiased, not a dim)."""
    _require_float("var", x)
    dim, correction = _var_args("var", dim, unbiased, correction)
    return Var.apply(x, normalize_dims("var", dim, x.ndim), correction, keepdim)


def _var_args(op, dim, unbiased, correction):
    """(dim, correction) from var/std's arguments, as torch reads them."""
    if isinstance(dim, bool):
        if unbiased is not None:
            raise TypeError(f"{op}: unbiased given twice ({dim} as the first argument, then "
                            f"{unbiased})")
        dim, unbiased = None, dim
    if unbiased is not None and correction is not None:
        raise TypeError(f"{op}: give unbiased or correction, not both")
    if unbiased is not None:
        return dim, int(unbiased)
    return dim, 1 if correction is None else correction


def std(x, dim=None, unbiased=None, keepdim=False, *, correction=None):
    """sqrt(var(...)), with var's arguments."""
    _require_float("std", x)
    dim, correction = _var_args("std", dim, unbiased, correction)
    return Var.apply(x, normalize_dims("std", dim, x.ndim), correction, keepdim).sqrt()


def _extreme(name, full_fn, dim_fn, x, dim, keepdim):
    if isinstance(dim, Tensor):
        return (maximum if name == "max" else minimum)(x, dim)
    if x.numel() == 0:
        raise RuntimeError(f"{name}: cannot reduce an empty tensor of shape {x.shape}")
    if dim is None:
        return full_fn.apply(x, None, False)
    (d,) = normalize_dims(name, dim, x.ndim) or (0,)
    if x.ndim == 0:  # dim 0 (or -1) of a 0-d tensor: its one element, as [1] along dim 0
        return MaxResult(*dim_fn.apply(x.reshape(1), 0, False))
    return MaxResult(*dim_fn.apply(x, d, keepdim))


def max(x, dim=None, keepdim=False):
    """max() over everything, or (values, indices) along dim, or elementwise with a tensor."""
    return _extreme("max", Amax, MaxDim, x, dim, keepdim)


def min(x, dim=None, keepdim=False):
    return _extreme("min", Amin, MinDim, x, dim, keepdim)


def amax(x, dim=None, keepdim=False):
    return Amax.apply(x, normalize_dims("amax", dim, x.ndim), keepdim)


def amin(x, dim=None, keepdim=False):
    return Amin.apply(x, normalize_dims("amin", dim, x.ndim), keepdim)


class _ArgExtreme(Function):
    """Index of the first extreme along a dim: int64, no gradient."""
    @staticmethod
    def forward(ctx, x, name, dim, keepdim):
        return getattr(backend(), name)(x, dim, keepdim)


def _arg_extreme(name, x, dim, keepdim):
    if x.numel() == 0:
        raise RuntimeError(f"{name}: cannot reduce an empty tensor of shape {x.shape}")
    if dim is not None:
        dims = normalize_dims(name, dim, x.ndim)
        dim = dims[0] if dims else 0
    return _ArgExtreme.apply(x, name, dim, keepdim)


def argmax(x, dim=None, keepdim=False):
    return _arg_extreme("argmax", x, dim, keepdim)


def argmin(x, dim=None, keepdim=False):
    return _arg_extreme("argmin", x, dim, keepdim)


# Tensor's arithmetic operators are these lean functions themselves (installed by methods.py)
arithmetic = add, sub, mul, div

from .shape_ops import *  # noqa: E402,F401,F403
from .index_ops import *  # noqa: E402,F401,F403  (embeddings and indexing)
from .nn_ops import *  # noqa: E402,F401,F403
from .conv_ops import *  # noqa: E402,F401,F403


# ------------------------------------------------------------- torch's keyword forms on top


def _with_alpha(op):
    """op(a, b, alpha=k) = op(a, b * k), as torch's add and sub."""
    def scaled(a, b, *, alpha=1):
        return op(a, b if alpha == 1 else b * alpha)
    scaled.__name__, scaled.__doc__ = op.__name__, op.__doc__
    return scaled


add, sub = _with_alpha(add), _with_alpha(sub)
_true_div = div


def div(a, b, *, rounding_mode=None):
    """a / b; rounding_mode 'trunc' rounds the quotient towards zero, 'floor' down (integers
    stay integers, as torch). NOTE: a rounded quotient takes no gradient (torch's is zero)."""
    if rounding_mode is None:
        return _true_div(a, b)
    if rounding_mode not in ("trunc", "floor"):
        raise ValueError(f"div: rounding_mode must be None, 'trunc' or 'floor', got "
                         f"{rounding_mode!r}")
    a = a.detach() if isinstance(a, Tensor) else a
    b = b.detach() if isinstance(b, Tensor) else b
    result = dtypes.result_type(*(t._data if isinstance(t, Tensor) else t for t in (a, b)))
    if not result.is_floating_point:  # NOTE: exact while |a| < 2**53 (a float64 quotient)
        a = a.to(dtypes.float64) if isinstance(a, Tensor) else float(a)
    q = _true_div(a, b)
    rounded = trunc(q) if rounding_mode == "trunc" else floor(q)  # (the table's kernels)
    if rounding_mode == "floor":  # NOTE: torch's floor division of an infinite a is NaN
        infinite = isinf(a) if isinstance(a, Tensor) else math.isinf(a)
        rounded = where(infinite, math.nan, rounded) if isinstance(infinite, Tensor) else \
            (rounded * math.nan if infinite else rounded)
    return rounded if result.is_floating_point else rounded.to(result)


def reduce_any(x, dim=None, keepdim=False):
    """Whether any element is nonzero (NaN counts), over dim or everything: td.any."""
    return ne(x, 0).sum(dim, keepdim) > 0


def reduce_all(x, dim=None, keepdim=False):
    """Whether every element is nonzero, over dim or everything: td.all."""
    return eq(x, 0).sum(dim, keepdim) == 0
