"""Embeddings and indexing: embedding, one_hot, gather / scatter / scatter_add / scatter_reduce,
index_select, index_add, index_put, masked_fill, masked_select, take_along_dim, and advanced
indexing (`x[idx]`, `x[:, i, j]`, `x[mask]`) with assignment through all of them.

Two primitives carry everything: gather_rows (kernels/index.py) reads rows by an index, and
scatter_reduce_rows (kernels/scatter.py) writes rows by an index with a reduction, sorted and
deterministic. An op along a dim first checks its index on the device (index_check: the
asynchronous, named error of kernels/errors.py) and then either moves that dim first (a view)
and works on rows, or linearises its index into positions of the flattened tensor. Gradients:
gather's is a scatter-add (GatherRows), a scatter's is a gather plus the base with the written
rows cleared (ScatterRows), and scatter_reduce's splits among ties as PyTorch's
(ScatterReduce); all are written in tritonad ops, so they can be differentiated again.
"""
from __future__ import annotations

import math
import numbers

import numpy as np

from .. import dtypes
from ..backend import backend_for, backend_of
from ..tensor import Tensor, full, tensor
from .dims import broadcast_shapes
from .elementwise import where
from .function import Function
from .grad_mode import no_grad
from .shape_ops import (GatherRows, GetItem, IndexPut, basic_index, cast, contiguous, expand,
                        gather_rows, permute, reshape, unsqueeze)

__all__ = ["embedding", "one_hot", "gather", "scatter", "scatter_add", "scatter_reduce",
           "index_select", "index_add", "index_put", "masked_fill", "masked_select",
           "take_along_dim", "getitem", "setitem"]

_REDUCES = ("sum", "prod", "mean", "amax", "amin")


# ---------------------------------------------------------------------------------- helpers


def _check_index(index, size, op, wrap=False):
    """index (an integer Tensor) as an int64 Tensor with every value checked against a dim of
    `size` ([0, size), or [-size, size) wrapped with `wrap`), on the device."""
    raw = index._data
    return Tensor._wrap(backend_of(raw).index_check(raw, int(size), op, bool(wrap)))


def _arange(n, device):
    return Tensor._wrap(backend_for(device).arange(0, n, 1, dtypes.int64, device))


def _dim(op, dim, ndim):
    n = max(ndim, 1)
    if not isinstance(dim, numbers.Integral) or not -n <= dim < n:
        raise IndexError(f"{op}: dim {dim} is out of range for a tensor of {ndim} dims")
    return int(dim) % n


def _integer_index(op, index):
    if not isinstance(index, Tensor):
        raise TypeError(f"{op}: index must be a Tensor, got {type(index).__name__}")
    if index.dtype not in (dtypes.int64, dtypes.int32):
        raise TypeError(f"{op}: index must be an int64 (or int32) tensor, got {index.dtype} of "
                        f"shape {index.shape}")


def _move_first(x, dim):
    """x with `dim` moved to the front (a view)."""
    if dim == 0:
        return x
    return permute(x, (dim,) + tuple(d for d in range(x.ndim) if d != dim))


def _move_back(y, dim):
    """The inverse of _move_first."""
    if dim == 0:
        return y
    order = list(range(1, y.ndim))
    order.insert(dim, 0)
    return permute(y, tuple(order))


def _flat(x):
    return reshape(x, (x.numel(),))


def _in_place(x, name, compute, *operands):
    """x changed in place to compute(x), as torch: recorded (x takes the new history) when x or
    an operand takes part in autodiff, else computed without history and copied in."""
    grad_operand = next((o for o in operands if isinstance(o, Tensor) and o._requires_grad), None)
    if x._check_inplace(name, grad_operand):
        return x._rebase(name, compute)
    with no_grad():
        new = compute(x)
    if new.dtype is not x.dtype:
        new = cast(new, x.dtype)
    backend_of(x._data).copy_(x._data, new._data)
    x._bump_version()
    return x


# ---------------------------------------------------------------------------------- functions


class ScatterRows(Function):
    """out = base with out[index[i]] = src[i] ("last": the largest i wins) or += src[i] ("sum"),
    or, without a base, the sums into zeros (embedding's weight gradient; row zero_row stays 0).
    dsrc = dy[index] (0 where index is zero_row); dbase = dy ("sum") or dy with the written rows
    cleared ("last")."""
    primitive = "scatter_reduce_rows"

    @staticmethod
    def forward(ctx, src, index, base, num_rows, reduce, include_self, zero_row, op):
        ctx.reduce, ctx.num_rows, ctx.zero_row, ctx.op = reduce, num_rows, zero_row, op
        ctx.save_for_backward(index)
        return backend_of(src).scatter_reduce_rows(src, index, base, num_rows, reduce,
                                                   include_self, zero_row, op)

    @staticmethod
    def backward(ctx, dy):
        (index,) = ctx.saved
        dsrc = dbase = None
        if ctx.needs_input_grad[0]:
            dsrc = GatherRows.apply(dy, index)
            if ctx.zero_row >= 0:
                keep = reshape(index != ctx.zero_row, tuple(index.shape) + (1,) * (dy.ndim - 1))
                dsrc = where(keep, dsrc, 0.0)
        if ctx.needs_input_grad[2]:
            if ctx.reduce == "sum":
                dbase = dy
            else:
                zero = full(tuple(index.shape) + tuple(dy.shape[1:]), 0, dtype=dy.dtype,
                            device=dy.device)
                dbase = ScatterRows.apply(zero, index, dy, ctx.num_rows, "last", True, -1,
                                          ctx.op)
        return dsrc, None, dbase, None, None, None, None, None


def _scatter_rows(src, index, base, num_rows, reduce, op, zero_row=-1):
    return ScatterRows.apply(src, index, base, num_rows, reduce, True, zero_row, op)


def _hits(index, num_rows, like):
    """How many indices name each row, as like's dtype [num_rows, 1, ...] (like: [R, *rest])."""
    ones = full(tuple(index.shape), 1, dtype=like.dtype, device=like.device)
    count = ScatterRows.apply(ones, index, None, num_rows, "sum", False, -1, "scatter_reduce")
    return reshape(count, (num_rows,) + (1,) * (like.ndim - 1))


class ScatterReduce(Function):
    """out = base with out[index[i]] = reduce(base row (include_self), the src[i] naming it),
    reduce in sum, prod, mean, amax, amin. Gradients as PyTorch's: mean divides by the count;
    amax / amin split dy evenly among every value equal to the result; prod sends dy times the
    product of the others (exact at zeros)."""

    @staticmethod
    def forward(ctx, base, src, index, reduce, include_self):
        ctx.reduce, ctx.include_self = reduce, include_self
        y = backend_of(src).scatter_reduce_rows(src, index, base, base.shape[0], reduce,
                                                include_self, -1, "scatter_reduce")
        ctx.save_for_backward(base, src, index, y)
        return y

    @staticmethod
    def backward(ctx, dy):
        base, src, index, y = ctx.saved
        rows, reduce, include_self = base.shape[0], ctx.reduce, ctx.include_self
        hit = _hits(index, rows, dy) > 0
        if reduce == "sum":
            dbase, dsrc_rows = dy, dy
        elif reduce == "mean":
            count = _hits(index, rows, dy) + (1.0 if include_self else 0.0)
            g = dy / where(count > 0, count, 1.0)
            dbase, dsrc_rows = g, g
        elif reduce in ("amax", "amin"):
            src_at = src == GatherRows.apply(y, index)
            # NOTE: base's value counts among the ties even without include_self, as PyTorch's
            # gradient counts it
            self_at = base == y
            ties = ScatterRows.apply(cast(src_at, dy.dtype), index, None, rows, "sum", False,
                                     -1, "scatter_reduce") + cast(self_at, dy.dtype)
            g = dy / where(ties > 0, ties, 1.0)
            dbase = where(self_at, g, 0.0)
            dsrc = where(src_at, GatherRows.apply(g, index), 0.0)
        else:  # prod: d/dv of a product = the product of the others, exact where v == 0
            zero_src = src == 0
            zeros = ScatterRows.apply(cast(zero_src, dy.dtype), index, None, rows, "sum", False,
                                      -1, "scatter_reduce")
            nonzero = ScatterReduce.apply(full(tuple(base.shape), 1, dtype=dy.dtype,
                                               device=dy.device),
                                          where(zero_src, 1.0, src), index, "prod", False)
            if include_self:
                zeros = zeros + cast(base == 0, dy.dtype)
                nonzero = nonzero * where(base == 0, 1.0, base)
            others_src = where(zero_src, where(GatherRows.apply(zeros, index) == 1,
                                               GatherRows.apply(nonzero, index), 0.0),
                               GatherRows.apply(y, index) / where(zero_src, 1.0, src))
            dsrc = GatherRows.apply(dy, index) * others_src
            dbase = dy
            if include_self:
                dbase = dy * where(base == 0, where(zeros == 1, nonzero, 0.0),
                                   y / where(base == 0, 1.0, base))
        if reduce in ("sum", "mean"):
            dsrc = GatherRows.apply(dsrc_rows, index)
        if not include_self:  # the base row takes part only where no index names it
            dbase = where(hit, 0.0, dy)
        return (dbase if ctx.needs_input_grad[0] else None,
                dsrc if ctx.needs_input_grad[1] else None, None, None, None)


class Embedding(Function):
    """y = weight[index] (rows looked up). dweight = the rows of dy summed by index: sorted and
    deterministic (scatter_reduce_rows), row padding_idx zero; with scale_grad_by_freq each dy
    row is divided by how often its index occurs in the batch."""

    @staticmethod
    def forward(ctx, weight, index, padding_idx, scale_grad_by_freq):
        be = backend_of(weight)
        ctx.rows, ctx.padding_idx, ctx.scale = weight.shape[0], padding_idx, scale_grad_by_freq
        checked = be.index_check(index, weight.shape[0], "embedding", False)
        ctx.save_for_backward(checked)
        return be.gather_rows(weight, checked)

    @staticmethod
    def backward(ctx, dy):
        (index,) = ctx.saved
        if ctx.scale:
            count = _hits(index, ctx.rows, dy)
            dy = dy / unsqueeze(GatherRows.apply(reshape(count, (ctx.rows,)), index), -1)
        return ScatterRows.apply(dy, index, None, ctx.rows, "sum", False, ctx.padding_idx,
                                 "embedding"), None, None, None


def _renorm_rows_(weight, index, max_norm, norm_type):
    """The rows of weight that index names scaled in place to p-norm at most max_norm, as
    torch's embedding_renorm_: row *= max_norm / (norm + 1e-7) where norm > max_norm."""
    with no_grad():
        w = Tensor._wrap(weight._data)
        flat = _flat(index)
        rows = gather_rows(w, flat)
        if norm_type == math.inf:
            norms = rows.abs().amax(-1, keepdim=True)
        else:
            norms = rows.abs().pow(norm_type).sum(-1, keepdim=True).pow(1.0 / norm_type)
        scale = where(norms > max_norm, max_norm / (norms + 1e-7), 1.0)
        new = _scatter_rows(cast(rows * scale, w.dtype), flat, w, w.shape[0], "last",
                            "embedding")
        backend_of(weight._data).copy_(weight._data, new._data)
    weight._bump_version()


def embedding(input, weight, padding_idx=None, max_norm=None, norm_type=2.0,
              scale_grad_by_freq=False, sparse=False):
    """weight's rows picked by input, as torch.nn.functional.embedding: input int64/int32 [*],
    weight [num_embeddings, embedding_dim] -> [*, embedding_dim]. padding_idx's row gets no
    gradient; max_norm renormalises the looked-up rows of weight in place first.
    `F.embedding(td.tensor([[0, 2]]), weight)`"""
    _integer_index("embedding", input)
    if not isinstance(weight, Tensor) or weight.ndim != 2:
        raise ValueError(f"embedding: weight must be a 2-d tensor, got shape "
                         f"{getattr(weight, 'shape', None)}")
    if sparse:
        raise NotImplementedError("embedding: sparse=True (sparse gradients) is not supported; "
                                  "the dense gradient is computed deterministically")
    rows = weight.shape[0]
    if padding_idx is None:
        padding_idx = -1
    elif not -rows <= padding_idx < rows:
        raise ValueError(f"embedding: padding_idx {padding_idx} must be within [-{rows}, {rows}) "
                         f"(num_embeddings {rows})")
    else:
        padding_idx %= rows
    if max_norm is not None:
        checked = _check_index(input, rows, "embedding")
        _renorm_rows_(weight, checked, float(max_norm), float(norm_type))
    return Embedding.apply(weight, input, padding_idx, bool(scale_grad_by_freq))


def one_hot(tensor, num_classes=-1):
    """int64 [*, num_classes]: 1 at each value's class, as torch.nn.functional.one_hot; values
    must lie in [0, num_classes). num_classes=-1 takes max + 1 (a read of the device).
    `F.one_hot(td.tensor([0, 2]), 3)`"""
    if not isinstance(tensor, Tensor) or tensor.dtype is not dtypes.int64:
        raise TypeError(f"one_hot: expects an int64 tensor of class indices, got "
                        f"{getattr(tensor, 'dtype', type(tensor).__name__)}")
    if num_classes == -1:
        if tensor.numel() == 0:
            raise ValueError("one_hot: cannot infer the number of classes from an empty tensor; "
                             "pass num_classes")
        num_classes = int(tensor.amax().item()) + 1
    if num_classes < 0 or (num_classes == 0 and tensor.numel()):
        raise ValueError(f"one_hot: num_classes must be positive, got {num_classes}")
    checked = _check_index(tensor, num_classes, "one_hot")
    hot = unsqueeze(checked, -1) == _arange(num_classes, tensor.device)
    return cast(hot, dtypes.int64)


def _linear_index(op, shape, dim, index):
    """index (same number of dims as `shape`, no larger than it outside dim) checked against
    dim's size and turned into positions in the row-major flattening of `shape`: int64, index's
    shape."""
    lin = _check_index(index, shape[dim], op)
    strides = [1] * len(shape)
    for d in range(len(shape) - 2, -1, -1):
        strides[d] = strides[d + 1] * shape[d + 1]
    if strides[dim] != 1:
        lin = lin * strides[dim]
    for d, size in enumerate(index.shape):
        if d != dim and size > 1:
            view = [1] * index.ndim
            view[d] = size
            lin = lin + reshape(_arange(size, index.device) * strides[d], tuple(view))
    return lin


def _check_along(op, x, dim, index, src=None):
    if index.ndim != x.ndim and not (index.ndim <= 1 and x.ndim <= 1):
        raise ValueError(f"{op}: index has {index.ndim} dims but the tensor has {x.ndim} "
                         f"(shapes {index.shape} and {x.shape}); they must match")
    for d in range(index.ndim):
        if d != dim and index.shape[d] > (x.shape[d] if x.ndim else 1):
            raise ValueError(f"{op}: index shape {index.shape} is larger than the tensor's "
                             f"{x.shape} at dim {d} (only dim {dim} may differ)")
        if src is not None and index.shape[d] > (src.shape[d] if src.ndim else 1):
            raise ValueError(f"{op}: index shape {index.shape} is larger than src's "
                             f"{src.shape} at dim {d}")


def _as_1d(x):
    return reshape(x, (1,)) if x.ndim == 0 else x


def gather(input, dim, index, *, sparse_grad=False):
    """out[i][j][k] = input[index[i][j][k]][j][k] (for dim 0), as torch.gather: index int64 of
    input's number of dims, out of index's shape. `td.gather(x, 1, idx)`"""
    _integer_index("gather", index)
    dim = _dim("gather", dim, input.ndim)
    _check_along("gather", input, dim, index)
    x, idx = _as_1d(input), _as_1d(index)
    lin = _linear_index("gather", x.shape, dim, idx)
    out = gather_rows(_flat(contiguous(x)), lin)
    return reshape(out, index.shape) if index.ndim == 0 else out


def _src_region(src, shape, dtype, device):
    """src's leading region of `shape` (a number fills it), of dtype."""
    if not isinstance(src, Tensor):
        return full(shape, src, dtype=dtype, device=device)
    src = _as_1d(src)
    if tuple(src.shape) != tuple(shape):
        src = GetItem.apply(src, tuple(slice(0, s) for s in shape))
    return src


def _scatter_along(op, input, dim, index, src, reduce, include_self=True):
    _integer_index(op, index)
    dim = _dim(op, dim, input.ndim)
    _check_along(op, input, dim, index, src if isinstance(src, Tensor) else None)
    if isinstance(src, Tensor) and src.dtype is not input.dtype:
        raise TypeError(f"{op}: src has dtype {src.dtype} but the tensor {input.dtype}; they "
                        "must match")
    x, idx = _as_1d(input), _as_1d(index)
    lin = _flat(_linear_index(op, x.shape, dim, idx))
    values = _flat(_src_region(src, idx.shape, x.dtype, x.device))
    base = _flat(x)
    if reduce in ("last", "add"):
        out = _scatter_rows(values, lin, base, base.shape[0], "sum" if reduce == "add" else
                            "last", op)
    else:
        out = ScatterReduce.apply(base, values, lin, reduce, bool(include_self))
    return reshape(out, input.shape)


def scatter(input, dim, index, src=None, value=None, *, reduce=None):
    """input with input[index[i][j]][j] = src[i][j] (for dim 0), as torch.scatter; src a tensor
    or a number (value=). reduce="add" | "multiply" combines instead (torch's older form).
    Repeated indices: the last one in index's order wins. `x.scatter(0, idx, src)`"""
    if src is None:
        src = value
    if src is None:
        raise TypeError("scatter: give src (a tensor) or value (a number)")
    if reduce is None:
        return _scatter_along("scatter", input, dim, index, src, "last")
    kinds = {"add": "sum", "multiply": "prod"}
    if reduce not in kinds:
        raise ValueError(f"scatter: reduce must be 'add' or 'multiply', got {reduce!r}")
    return _scatter_along("scatter", input, dim, index, src, kinds[reduce])


def scatter_add(input, dim, index, src):
    """input with src added at the positions index names along dim (repeats add up), as
    torch.scatter_add; deterministic. `x.scatter_add(0, idx, src)`"""
    return _scatter_along("scatter_add", input, dim, index, src, "add")


def scatter_reduce(input, dim, index, src, reduce, *, include_self=True):
    """As torch.scatter_reduce: reduce in "sum", "prod", "mean", "amax", "amin"; include_self
    folds input's value at each named position in. Deterministic.
    `x.scatter_reduce(0, idx, src, "amax")`"""
    if reduce not in _REDUCES:
        raise ValueError(f"scatter_reduce: reduce must be one of {_REDUCES}, got {reduce!r}")
    return _scatter_along("scatter_reduce", input, dim, index, src, reduce, include_self)


def _vector_index(op, index):
    _integer_index(op, index)
    if index.ndim > 1:
        raise ValueError(f"{op}: index must be 0-d or 1-d, got shape {index.shape}")
    return reshape(index, (index.numel(),))


def index_select(input, dim, index):
    """input's entries at `index` (1-d int64) along dim, as torch.index_select.
    `td.index_select(x, 1, td.tensor([2, 0]))`"""
    index = _vector_index("index_select", index)
    dim = _dim("index_select", dim, input.ndim)
    x = _as_1d(input)
    checked = _check_index(index, x.shape[dim], "index_select")
    out = _move_back(gather_rows(_move_first(x, dim), checked), dim)
    return reshape(out, ()) if input.ndim == 0 else out


def index_add(input, dim, index, source, *, alpha=1):
    """input with alpha * source[i] added along dim at index[i] (repeats add up), as
    torch.index_add; deterministic. `x.index_add(0, idx, src)`"""
    index = _vector_index("index_add", index)
    dim = _dim("index_add", dim, input.ndim)
    x, source = _as_1d(input), _as_1d(source)
    expected = x.shape[:dim] + (index.numel(),) + x.shape[dim + 1:]
    if tuple(source.shape) != expected:
        raise ValueError(f"index_add: source shape {source.shape} must be {expected} (the "
                         f"tensor's {x.shape} with dim {dim} the index's length)")
    if source.dtype is not x.dtype:
        raise TypeError(f"index_add: source has dtype {source.dtype} but the tensor {x.dtype}")
    checked = _check_index(index, x.shape[dim], "index_add")
    src = _move_first(source, dim)
    if alpha != 1:
        src = src * alpha
    out = _scatter_rows(src, checked, _move_first(x, dim), x.shape[dim], "sum", "index_add")
    return reshape(_move_back(out, dim), input.shape)


def index_put(input, indices, values, accumulate=False):
    """input with input[indices] = values (added with accumulate), as torch.index_put: indices
    a tuple of index tensors (int64 or bool), values broadcast to the indexed shape.
    `x.index_put((rows, cols), td.tensor(1.0))`"""
    if not isinstance(indices, (tuple, list)):
        raise TypeError("index_put: indices must be a tuple of tensors")
    return _put(input, tuple(indices), values, accumulate, "index_put")


def masked_fill(input, mask, value):
    """input where mask is False, value (a number or a 0-d tensor) where True; mask (bool)
    broadcasts, as torch.masked_fill. `x.masked_fill(x < 0, 0.0)`"""
    if not isinstance(mask, Tensor) or mask.dtype is not dtypes.bool_:
        raise TypeError(f"masked_fill: mask must be a bool tensor, got "
                        f"{getattr(mask, 'dtype', type(mask).__name__)}")
    if isinstance(value, Tensor):
        if value.ndim != 0:
            raise ValueError(f"masked_fill: value must be a number or a 0-d tensor, got shape "
                             f"{value.shape}")
        value = cast(value, input.dtype)
    out = where(mask, value, input)
    return out if out.dtype is input.dtype else cast(out, input.dtype)


def _nonzero(mask):
    """The positions of the True values of a bool tensor, int64 [count, ndim] on the host's
    read of the device (the result's size depends on the data)."""
    return np.argwhere(mask.numpy())


def masked_select(input, mask):
    """The values of input where mask (bool, broadcast with input) is True, as a 1-d tensor;
    its size needs a read of the device, as torch's. `x.masked_select(x > 0)`"""
    if not isinstance(mask, Tensor) or mask.dtype is not dtypes.bool_:
        raise TypeError(f"masked_select: mask must be a bool tensor, got "
                        f"{getattr(mask, 'dtype', type(mask).__name__)}")
    shape = broadcast_shapes("masked_select", tuple(input.shape), tuple(mask.shape))
    picks = np.flatnonzero(expand(mask, shape).numpy().reshape(-1)).astype(np.int64)
    return gather_rows(_flat(expand(input, shape)), tensor(picks, device=input.device))


def take_along_dim(input, indices, dim=None):
    """input's values at indices along dim, input and indices broadcast against each other
    outside dim, as torch.take_along_dim (dim=None: both flattened).
    `td.take_along_dim(x, x.argsort(1), 1)`"""
    _integer_index("take_along_dim", indices)
    if dim is None:
        return gather(_flat(input), 0, _flat(indices))
    dim = _dim("take_along_dim", dim, input.ndim)
    if indices.ndim != input.ndim:
        raise ValueError(f"take_along_dim: indices have {indices.ndim} dims but input has "
                         f"{input.ndim} (shapes {indices.shape} and {input.shape})")
    outer = broadcast_shapes("take_along_dim",
                             tuple(1 if d == dim else s for d, s in enumerate(input.shape)),
                             tuple(1 if d == dim else s for d, s in enumerate(indices.shape)))
    x = expand(input, tuple(input.shape[d] if d == dim else s for d, s in enumerate(outer)))
    idx = expand(indices, tuple(indices.shape[d] if d == dim else s for d, s in enumerate(outer)))
    return gather(x, dim, idx)


# ---------------------------------------------------------------------------------- x[key]


def _is_advanced(k):
    return isinstance(k, (Tensor, list, tuple, np.ndarray)) and not isinstance(k, str)


def _expand_key(x, key):
    """key as torch reads it: a list of ints, slices, None and int64 index tensors (lists and
    arrays made tensors, bool masks made the index tensors of their True positions, Ellipsis
    replaced by the slices it stands for)."""
    key = key if isinstance(key, tuple) else (key,)
    items = []
    for k in key:
        if isinstance(k, (list, tuple, np.ndarray)):
            values = np.asarray(k)
            if values.size == 0 and values.dtype != np.bool_:
                values = values.astype(np.int64)
            k = tensor(values, device=x.device)
        if isinstance(k, Tensor):
            if k.dtype.is_floating_point:
                raise IndexError(f"indexing: tensors used as indices must be int64, int32, uint8 "
                                 f"or bool, got {k.dtype} of shape {k.shape}")
            if k.ndim == 0 and k.dtype is not dtypes.bool_:
                k = int(k.item())
        items.append(k)
    used = sum(k.ndim if isinstance(k, Tensor) and k.dtype in (dtypes.bool_, dtypes.uint8)
               else 0 if k is None or k is Ellipsis else 1 for k in items)
    if used > x.ndim:
        raise IndexError(f"indexing: too many indices ({used}) for a tensor of shape {x.shape}")
    if sum(1 for k in items if k is Ellipsis) > 1:
        raise IndexError("indexing: an index can only have a single ellipsis ('...')")
    out, pos = [], 0
    for k in items:
        if k is Ellipsis:
            fill = x.ndim - used
            out.extend([slice(None)] * fill)
            pos += fill
        elif isinstance(k, Tensor) and k.dtype in (dtypes.bool_, dtypes.uint8):
            covered = tuple(x.shape[pos:pos + k.ndim])
            if tuple(k.shape) != covered:
                raise IndexError(f"indexing: the mask of shape {k.shape} does not match the "
                                 f"indexed tensor's shape {x.shape} at dims {pos}..{pos + k.ndim - 1}")
            where_true = _nonzero(k if k.dtype is dtypes.bool_ else k != 0)
            if k.ndim == 0:  # x[True] adds a dim of size 1
                if not where_true.size:
                    raise NotImplementedError("indexing: x[False] (an empty dim) is not supported")
                out.append(None)
                continue
            out.extend(tensor(np.ascontiguousarray(where_true[:, j]), dtype=dtypes.int64,
                              device=x.device) for j in range(k.ndim))
            pos += k.ndim
        else:
            out.append(k)
            pos += k is not None
    return out


def _broadcast_indices(tensors):
    shapes = [tuple(t.shape) for t in tensors]
    try:
        return broadcast_shapes("indexing", *shapes) if len(shapes) > 1 else shapes[0]
    except ValueError:
        raise IndexError("indexing: shape mismatch: index tensors of shapes "
                         f"{', '.join(str(s) for s in shapes)} cannot be broadcast together") \
            from None


def getitem(x, key):
    """x[key] as torch: ints, slices, None and ... give views; index tensors, lists and bool
    masks (in any position, several broadcast together) gather. Ints apply first (as selects);
    the index tensors' broadcast shape takes the place of their dims when those are adjacent,
    else it comes first."""
    if not isinstance(key, tuple):
        if not _is_advanced(key):
            return GetItem.apply(x, basic_index(x, key))
        if isinstance(key, Tensor) and key.ndim and key.dtype in (dtypes.int64, dtypes.int32):
            return gather_rows(x, key)  # x[idx], the commonest: rows picked along dim 0
    elif not any(_is_advanced(k) for k in key):
        return GetItem.apply(x, basic_index(x, key))
    items = _expand_key(x, key)
    if not any(isinstance(k, Tensor) for k in items):
        return GetItem.apply(x, basic_index(x, tuple(items)))
    basic, advanced, dim = [], [], 0
    for k in items:
        if isinstance(k, Tensor):
            advanced.append((dim, k))
            basic.append(slice(None))
        else:
            basic.append(k)
        if not isinstance(k, numbers.Integral):
            dim += 1
    basic_key = basic_index(x, tuple(basic))
    y = x if all(k == slice(None) for k in basic_key) else GetItem.apply(x, basic_key)
    dims = [d for d, _ in advanced]
    for _, t in advanced:
        _integer_index("indexing", t)
    shape = _broadcast_indices([t for _, t in advanced])
    rest = [d for d in range(y.ndim) if d not in dims]
    moved = permute(y, tuple(dims + rest))
    if len(advanced) == 1:
        out = gather_rows(moved, advanced[0][1])  # (checks and wraps its own indices)
    else:
        lin = None
        for d, t in advanced:
            checked = _check_index(t, y.shape[d], "indexing", wrap=True)
            lin = checked if lin is None else lin * y.shape[d] + checked
        if tuple(lin.shape) != shape:
            lin = expand(lin, shape)
        rows = reshape(moved, (math.prod(y.shape[d] for d in dims),) +
                       tuple(y.shape[d] for d in rest))
        out = gather_rows(rows, lin)
    first = dims[0]
    if dims == list(range(first, first + len(dims))) and first > 0:
        b = len(shape)
        order = [b + i for i in range(first)] + list(range(b)) + \
            [b + i for i in range(first, len(rest))]
        out = permute(out, tuple(order))
    return out


def _put(x, key, values, accumulate, op):
    """x with x[key] = values (+= with accumulate), out of place: the positions key picks out of
    x's row-major numbering, then one deterministic row scatter."""
    items = key if isinstance(key, tuple) else (key,)
    if not accumulate and len(items) == 1 and isinstance(items[0], Tensor) and \
            items[0].dtype is dtypes.bool_ and items[0].shape == x.shape and \
            (not isinstance(values, Tensor) or values.numel() == 1):
        value = values if not isinstance(values, Tensor) else reshape(values, ())
        return masked_fill(x, items[0], value)  # x[mask] = v: one elementwise select
    with no_grad():
        positions = reshape(_arange(x.numel(), x.device), x.shape)
        lin = getitem(positions, key)
    if not isinstance(values, Tensor):
        values = full(tuple(lin.shape), values, dtype=x.dtype, device=x.device)
    elif values.dtype is not x.dtype:
        values = cast(values, x.dtype)
    try:
        values = expand(values, tuple(lin.shape))
    except ValueError:
        raise ValueError(f"{op}: values of shape {values.shape} cannot be broadcast to the "
                         f"indexed shape {lin.shape}") from None
    out = _scatter_rows(_flat(values), _flat(lin), _flat(x), x.numel(),
                        "sum" if accumulate else "last", op)
    return reshape(out, x.shape)


def _set_basic(x, key, value):
    """x with x[key] = value for a basic key, out of place and differentiable."""
    view_shape = tuple(x._data[key].shape)
    mask = full(tuple(x.shape), False, dtype=dtypes.bool_, device=x.device)
    backend_of(mask._data).fill_(mask._data[key], True)
    if not isinstance(value, Tensor):
        return where(mask, value, x)
    placed = IndexPut.apply(expand(cast(value, x.dtype), view_shape), tuple(x.shape), key)
    return where(mask, placed, x)


def setitem(x, key, value):
    """x[key] = value in place (value a number or a tensor broadcast to x[key]), through any key
    getitem takes; recorded for autodiff as torch records it."""
    if isinstance(value, (list, tuple, np.ndarray)):
        value = tensor(value, dtype=x.dtype, device=x.device)
    elif isinstance(value, Tensor) and value.device != x.device:
        value = value.to(x.device)
    items = key if isinstance(key, tuple) else (key,)
    if not any(_is_advanced(k) for k in items):
        key = basic_index(x, key)
        if x._check_inplace("__setitem__", value):
            return x._rebase("__setitem__", lambda old: _set_basic(old, key, value))
        view = x._data[key]
        be = backend_of(x._data)
        if isinstance(value, Tensor):
            be.copy_(view, value._data)
        else:
            be.fill_(view, value)
        x._bump_version()
        return x
    return _in_place(x, "__setitem__", lambda old: _put(old, key, value, False, "indexing"),
                     value)
