"""Differentiable views, basic indexing, casts and device moves (advanced indexing: index_ops.py).

Views are metadata only: the output shares the input's memory through torch's view machinery
(shape, strides, offset), and the gradient is mapped back the same way, also without copies
where it can be.
"""
from __future__ import annotations

import numbers


from .. import dtypes
from ..backend import get_backend
from .grad_mode import grad_mode
from ..tensor import Tensor, full
from .function import Function

__all__ = ["view", "reshape", "flatten", "permute", "transpose", "expand", "unsqueeze", "squeeze",
           "contiguous", "clone", "cast", "to_device", "basic_index", "gather_rows",
           "scatter_add_rows", "zeros", "cat", "stack"]


def zeros(shape, dtype=dtypes.float32, device=None):
    return full(tuple(shape), 0, dtype=dtype, device=device)


# ---------------------------------------------------------------------------------- views


class Restride(Function):
    """A view that keeps the element order (view, squeeze, unsqueeze): dx = dy reshaped back."""
    is_view = True

    @staticmethod
    def forward(ctx, x, method, args):
        ctx.shape = tuple(x.shape)
        return getattr(x, method)(*args)

    @staticmethod
    def backward(ctx, dy):
        return reshape(dy, ctx.shape), None, None


class Permute(Function):
    """y = x with its axes reordered: dx = dy with the inverse order."""
    is_view = True

    @staticmethod
    def forward(ctx, x, dims):
        ctx.inverse = dims if dims == (1, 0) else tuple(sorted(range(len(dims)),
                                                               key=dims.__getitem__))
        return x.permute(dims)

    @staticmethod
    def backward(ctx, dy):
        return permute(dy, ctx.inverse), None


class Expand(Function):
    """A stride-0 broadcast view; the engine sums the gradient back to the input's shape."""
    is_view = True

    @staticmethod
    def forward(ctx, x, shape):
        return x.expand(shape)

    @staticmethod
    def backward(ctx, dy):
        return dy, None


def _unrecorded_view(x, raw):
    """A view made without history (nothing to record: grad mode off, or x needs no gradient),
    sharing x's version counter as every view does. The fast path of the view ops."""
    return Tensor._wrap(raw, False, None, 0, x._version_box)


def _records(x):
    return x._requires_grad and grad_mode.enabled


def view(x, shape):
    """The same memory seen with another shape; raises if that needs a copy (use reshape)."""
    shape = _infer_shape("view", x, shape)
    try:
        x._data.view(shape)
    except RuntimeError:
        raise RuntimeError(f"view: a tensor of shape {x.shape} and strides {x.stride()} cannot be "
                           f"viewed as shape {shape} without a copy; use .reshape(), which copies "
                           "when it must") from None
    if shape == x.shape:
        return x
    if not _records(x):
        return _unrecorded_view(x, x._data.view(shape))
    return Restride.apply(x, "view", (shape,))


def reshape(x, shape):
    """view() when possible, otherwise a contiguous copy viewed with the new shape."""
    shape = _infer_shape("reshape", x, shape)
    if shape == x.shape:
        return x
    try:
        raw = x._data.view(shape)
    except RuntimeError:
        x = contiguous(x)
        raw = x._data.view(shape)
    if not _records(x):
        return _unrecorded_view(x, raw)
    return Restride.apply(x, "view", (shape,))


def _infer_shape(op, x, shape):
    shape = tuple(int(s) for s in shape)
    if shape.count(-1) > 1:
        raise ValueError(f"{op}: only one dimension can be -1, got {shape}")
    known = 1
    for s in shape:
        if s != -1:
            known *= s
    if -1 in shape:
        if known == 0 or x.numel() % known:
            raise RuntimeError(f"{op}: shape {shape} is invalid for a tensor of {x.numel()} "
                               f"elements (shape {x.shape})")
        shape = tuple(x.numel() // known if s == -1 else s for s in shape)
    elif known != x.numel():
        raise RuntimeError(f"{op}: shape {shape} is invalid for a tensor of {x.numel()} elements "
                           f"(shape {x.shape})")
    return shape


def flatten(x, start_dim=0, end_dim=-1):
    if x.ndim == 0:
        return reshape(x, (1,))
    start, end = start_dim % x.ndim, end_dim % x.ndim
    if start > end:
        raise ValueError(f"flatten: start_dim {start_dim} comes after end_dim {end_dim}")
    size = 1
    for s in x.shape[start:end + 1]:
        size *= s
    return reshape(x, x.shape[:start] + (size,) + x.shape[end + 1:])


def permute(x, dims):
    n = x._data.dim()
    if n == 2 and dims == (1, 0):  # .T of a matrix, the most common permute
        if not _records(x):
            return _unrecorded_view(x, x._data.t())
        return Permute.apply(x, dims)
    if len(dims) != n or sorted(d % max(n, 1) for d in dims) != list(range(n)):
        raise ValueError(f"permute: {tuple(dims)} is not a permutation of the {n} dims of a "
                         f"tensor of shape {x.shape}")
    dims = tuple(d % n for d in dims)
    if dims == tuple(range(n)):
        return x
    if not _records(x):
        return _unrecorded_view(x, x._data.permute(dims))
    return Permute.apply(x, dims)


def transpose(x, dim0, dim1):
    n = max(x.ndim, 1)
    for d in (dim0, dim1):
        if not -n <= d < n:
            raise IndexError(f"transpose: dimension {d} is out of range for shape {x.shape}")
    dims = list(range(x.ndim))
    if x.ndim:
        dims[dim0 % n], dims[dim1 % n] = dims[dim1 % n], dims[dim0 % n]
    return permute(x, tuple(dims))


def expand(x, shape):
    """Broadcast to `shape` without copying (-1 keeps a size)."""
    shape = tuple(shape)
    lead = len(shape) - x.ndim
    if lead < 0:
        raise ValueError(f"expand: cannot expand shape {x.shape} to fewer dims {shape}")
    target = tuple(x.shape[i - lead] if s == -1 and i >= lead else s for i, s in enumerate(shape))
    for i, s in enumerate(x.shape):
        if s != 1 and s != target[lead + i]:
            raise ValueError(f"expand: shape {x.shape} cannot be expanded to {shape} (dim {i} has "
                             f"size {s}, not 1)")
    if target == x.shape:
        return x
    if not _records(x):
        return _unrecorded_view(x, x._data.expand(target))
    return Expand.apply(x, target)


def unsqueeze(x, dim):
    if not -x.ndim - 1 <= dim <= x.ndim:
        raise IndexError(f"unsqueeze: dimension {dim} is out of range for shape {x.shape}")
    return Restride.apply(x, "unsqueeze", (dim % (x.ndim + 1),))


def squeeze(x, dim=None):
    if dim is None:
        return x if 1 not in x.shape else Restride.apply(x, "squeeze", ())
    dims = (dim,) if isinstance(dim, int) else tuple(dim)
    for d in dims:
        if not -max(x.ndim, 1) <= d < max(x.ndim, 1):
            raise IndexError(f"squeeze: dimension {d} is out of range for shape {x.shape}")
    keep = tuple(s for i, s in enumerate(x.shape)
                 if not (i in {d % max(x.ndim, 1) for d in dims} and s == 1))
    return x if keep == x.shape else Restride.apply(x, "view", (keep,))


# ---------------------------------------------------------------------------------- copies


class Contiguous(Function):
    """A contiguous copy: dx = dy."""
    primitive = "contiguous"
    @staticmethod
    def forward(ctx, x):
        return get_backend().contiguous(x)

    @staticmethod
    def backward(ctx, dy):
        return dy


def contiguous(x):
    return x if x.is_contiguous() else Contiguous.apply(x)


def clone(x):
    return Contiguous.apply(x)


class Cast(Function):
    """Convert to another dtype; the engine casts the gradient back to the input's dtype."""
    primitive = "cast"
    @staticmethod
    def forward(ctx, x, dtype):
        return get_backend().cast(x, dtype)

    @staticmethod
    def backward(ctx, dy):
        # a leaf whose gradient buffer the engine lends (a weight that autocast casts to bf16):
        # the gradient cast straight into it, one kernel where the engine's cast and its copy
        # into .grad would take two
        buffer = ctx.gradient_buffer(0)
        if buffer is not None and buffer.shape == dy._data.shape:
            return Tensor._wrap(get_backend().copy_(buffer, dy._data)), None
        return dy, None


def cast(x, dtype):
    return x if x.dtype is dtype else Cast.apply(x, dtype)


class ToDevice(Function):
    """A host <-> device transfer; the gradient travels back."""
    runs_on_backend = False

    @staticmethod
    def forward(ctx, x, device):
        ctx.device = x.device
        return x.to(device)

    @staticmethod
    def backward(ctx, dy):
        return to_device(dy, ctx.device), None


def to_device(x, device):
    if x.device == device:
        return x
    return ToDevice.apply(x, device)


class Cat(Function):
    """y = the inputs joined along `dim` (one copy each into its slice of y): dx_i = the slice
    of dy where x_i went, a view."""

    @staticmethod
    def forward(ctx, dim, *xs):
        ctx.dim, ctx.sizes = dim, [x.shape[dim] for x in xs]
        shape = list(xs[0].shape)
        shape[dim] = sum(ctx.sizes)
        be = get_backend()
        out = be.empty(tuple(shape), dtypes.get_dtype(xs[0].dtype), xs[0].device)
        start = 0
        for x, n in zip(xs, ctx.sizes):
            if n and x.numel():
                be.copy_(out.narrow(dim, start, n), x)
            start += n
        return out

    @staticmethod
    def backward(ctx, dy):
        grads, start = [None], 0
        for n in ctx.sizes:
            grads.append(GetItem.apply(dy, (slice(None),) * ctx.dim + (slice(start, start + n),)))
            start += n
        return tuple(grads)


def cat(tensors, dim=0):
    """The tensors joined along an existing dimension, as torch.cat: every shape equal but at
    `dim`; dtypes promote (as torch's); all on one device. Differentiable."""
    tensors = list(tensors) if not isinstance(tensors, Tensor) else None
    if not tensors or not all(isinstance(t, Tensor) for t in tensors):
        raise TypeError("cat: expected a non-empty list or tuple of Tensors")
    first = tensors[0]
    if first.ndim == 0:
        raise ValueError("cat: zero-dimensional tensors cannot be joined; use stack")
    if not isinstance(dim, int) or not -first.ndim <= dim < first.ndim:
        raise IndexError(f"cat: dim {dim} is out of range for {first.ndim}-d tensors")
    dim %= first.ndim
    for i, t in enumerate(tensors):
        if t.ndim != first.ndim or any(a != b for k, (a, b) in
                                       enumerate(zip(t.shape, first.shape)) if k != dim):
            raise ValueError(f"cat: tensor {i} has shape {tuple(t.shape)}, which does not match "
                             f"tensor 0's {tuple(first.shape)} outside dim {dim}")
    dtype = first.dtype
    for t in tensors[1:]:
        dtype = dtypes.promote_types(dtype, t.dtype)
    tensors = [cast(t, dtype) for t in tensors]
    if len(tensors) == 1:
        return clone(tensors[0])
    return Cat.apply(dim, *tensors)


def stack(tensors, dim=0):
    """The tensors (all of one shape) joined along a new dimension, as torch.stack."""
    tensors = list(tensors) if not isinstance(tensors, Tensor) else None
    if not tensors or not all(isinstance(t, Tensor) for t in tensors):
        raise TypeError("stack: expected a non-empty list or tuple of Tensors")
    ndim = tensors[0].ndim + 1
    if not isinstance(dim, int) or not -ndim <= dim < ndim:
        raise IndexError(f"stack: dim {dim} is out of range for {ndim - 1}-d tensors")
    for i, t in enumerate(tensors):
        if t.shape != tensors[0].shape:
            raise ValueError(f"stack: tensor {i} has shape {tuple(t.shape)}, tensor 0 "
                             f"{tuple(tensors[0].shape)}; stack needs equal shapes")
    return cat([unsqueeze(t, dim % ndim) for t in tensors], dim % ndim)


# ---------------------------------------------------------------------------------- indexing


class GetItem(Function):
    """Basic indexing (ints, slices, None, ...): a view; the gradient is scattered into zeros."""
    is_view = True

    @staticmethod
    def forward(ctx, x, key):
        ctx.shape, ctx.dtype, ctx.key = tuple(x.shape), dtypes.get_dtype(x.dtype), key
        return x[key]

    @staticmethod
    def backward(ctx, dy):
        return IndexPut.apply(dy, ctx.shape, ctx.key), None


class IndexPut(Function):
    """out = zeros(shape); out[key] = src. Adjoint of GetItem."""
    @staticmethod
    def forward(ctx, src, shape, key):
        ctx.key = key
        out = get_backend().full(shape, 0, dtypes.get_dtype(src.dtype), src.device)
        get_backend().copy_(out[key], src)
        return out

    @staticmethod
    def backward(ctx, g):
        return GetItem.apply(g, ctx.key), None, None


class GatherRows(Function):
    """y = x[index] along dim 0: dx = scatter-add of dy into x's rows."""
    primitive = "gather_rows"
    @staticmethod
    def forward(ctx, x, index):
        ctx.rows = x.shape[0]
        ctx.save_for_backward(index)
        return get_backend().gather_rows(x, index)

    @staticmethod
    def backward(ctx, dy):
        (index,) = ctx.saved
        return ScatterAddRows.apply(dy, index, ctx.rows), None


class ScatterAddRows(Function):
    """out[index[i]] += src[i]: d(src) = g[index]."""
    primitive = "scatter_add_rows"
    @staticmethod
    def forward(ctx, src, index, rows):
        ctx.save_for_backward(index)
        return get_backend().scatter_add_rows(src, index, rows)

    @staticmethod
    def backward(ctx, g):
        (index,) = ctx.saved
        return GatherRows.apply(g, index), None, None


def gather_rows(x, index):
    """x[index] for an integer index tensor: rows of x picked (and repeated) along dim 0."""
    if index.dtype not in (dtypes.int64, dtypes.int32):
        raise TypeError(f"gather_rows: index must be int64 or int32, got {index.dtype}")
    if x.ndim == 0:
        raise IndexError("gather_rows: cannot index a 0-d tensor")
    return GatherRows.apply(x, index)


def scatter_add_rows(src, index, num_rows):
    return ScatterAddRows.apply(src, index, int(num_rows))


def basic_index(x, key):
    """Validate a basic index (ints, slices with positive steps, None, Ellipsis) for torch."""
    key = key if isinstance(key, tuple) else (key,)
    out = []
    for k in key:
        if isinstance(k, Tensor) and k.ndim == 0 and not k.dtype.is_floating_point \
                and k.dtype is not dtypes.bool_:
            k = int(k.item())
        if isinstance(k, slice):
            if k.step is not None and k.step <= 0:
                raise ValueError(f"indexing: slice step must be positive, got {k.step}")
        elif not (isinstance(k, (numbers.Integral, type(None))) or k is Ellipsis):
            raise TypeError(f"indexing: unsupported index {k!r} of type {type(k).__name__}")
        out.append(int(k) if isinstance(k, numbers.Integral) else k)
    dims_used = sum(1 for k in out if k is not None and k is not Ellipsis)
    if dims_used > x.ndim:
        raise IndexError(f"indexing: too many indices ({dims_used}) for a tensor of shape "
                         f"{x.shape}")
    pos = 0
    for k in out:
        if k is Ellipsis:
            pos = x.ndim - (dims_used - pos)
            continue
        if isinstance(k, int):
            size = x.shape[pos]
            if not -size <= k < size:
                raise IndexError(f"indexing: index {k} is out of bounds for dimension {pos} with "
                                 f"size {size}")
        if k is not None:
            pos += 1
    return tuple(out)
