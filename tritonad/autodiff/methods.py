"""Tensor's operators and methods, installed in this one place (tensor.py defines the Tensor's
state and memory; it imports nothing of autodiff).

Each method is a thin call of the differentiable op in autodiff (ops.py, shape_ops.py,
nn_ops.py, elementwise.py); `install()` sets them on Tensor, then the elementwise table's entries
that PyTorch has as methods and that are not written here (`x.erf()`, `x.lerp(y, w)`), and last
the lean arithmetic operators (`x + y` calls ops.add itself: no method frame in between).
"""
from __future__ import annotations

import torch

from .. import dtypes
from ..backend import backend_of, get_backend
from .grad_mode import grad_mode
from ..dtypes import DType
from ..tensor import Tensor, _shape_arg, full, parse_to_args, tensor
from . import elementwise, index_ops, losses, ops
from .function import run_backward


class TensorMethods:
    """The methods install() puts on Tensor (written here as methods, for reading)."""

    def backward(self, gradient=None, retain_graph=False, create_graph=False, inputs=None):
        """Accumulate d(self)/d(leaf) into each leaf's .grad.

        Calling it twice on one graph needs retain_graph=True the first time, as in torch;
        gradients accumulate across calls until zeroed.
        """
        if gradient is None:
            if self.numel() != 1:
                raise RuntimeError(f"backward: a gradient can be created implicitly only for a "
                                   f"scalar output, but this tensor has shape {self.shape}; pass "
                                   "gradient=<tensor of that shape>")
            raw = self._data  # (the seed straight from the backend: no checks to repeat)
            backend, dtype = backend_of(raw), dtypes.get_dtype(raw.dtype)
            # a backward may skip the multiply by a seed of ones; one that says it then never
            # reads the seed (skips_unit_gradient: cross-entropy's) leaves it unfilled, one fill
            # kernel less a step, unless someone else sees the seed: the root kept by
            # retain_grad(), asked for in `inputs`, or a graph of the backward itself
            ctx = self.grad_fn
            unread = ctx is not None and inputs is None and not create_graph and \
                getattr(ctx.function, "skips_unit_gradient", False) and \
                self._output_index not in ctx._retained
            gradient = Tensor._wrap(backend.empty(raw.shape, dtype, raw.device) if unread
                                    else backend.full(raw.shape, 1.0, dtype, raw.device))
            gradient._const = (1.0, gradient._version_box[0])
        elif not isinstance(gradient, Tensor):
            gradient = tensor(gradient, dtype=self.dtype, device=self.device)
        if gradient.shape != self.shape:
            raise RuntimeError(f"backward: gradient has shape {gradient.shape} but the tensor has "
                               f"shape {self.shape}")
        if inputs is not None:
            grads = run_backward([self], [gradient], retain_graph or create_graph, create_graph,
                                 inputs=list(inputs))
            for t, g in zip(inputs, grads):
                if g is not None:
                    t.grad = g if t.grad is None else t.grad + g
            return
        run_backward([self], [gradient], retain_graph or create_graph, create_graph)

    def to(self, *args, **kwargs) -> "Tensor":
        """.to(device), .to(dtype), .to(device, dtype) or .to(other_tensor)."""
        device, dtype = parse_to_args(args, kwargs)
        out = self
        if dtype is not None and dtype is not self.dtype:
            out = ops.cast(out, dtype)
        if device is not None and device != self.device:
            out = ops.to_device(out, device)
        return out

    def float(self): return self.to(dtypes.float32)
    def double(self): return self.to(dtypes.float64)
    def half(self): return self.to(dtypes.float16)
    def bfloat16(self): return self.to(dtypes.bfloat16)
    def long(self): return self.to(dtypes.int64)
    def int(self): return self.to(dtypes.int32)
    def bool(self): return self.to(dtypes.bool_)
    def cuda(self): return self.to("cuda")
    def cpu(self): return self.to("cpu")
    def type_as(self, other): return self.to(other.dtype)

    # ------------------------------------------------------------------ operators
    # (__add__, __sub__, __mul__ and __truediv__ are tritonad.autodiff.ops' add, sub, mul and
    # div themselves, set there: one Python frame less on every eager `x + b`)
    def __add__(self, o): return ops.add(self, o)
    def __radd__(self, o): return ops.add(o, self)
    def __sub__(self, o): return ops.sub(self, o)
    def __rsub__(self, o): return ops.sub(o, self)
    def __mul__(self, o): return ops.mul(self, o)
    def __rmul__(self, o): return ops.mul(o, self)
    def __truediv__(self, o): return ops.div(self, o)
    def __rtruediv__(self, o): return ops.div(o, self)
    def __pow__(self, o): return ops.pow(self, o)
    def __rpow__(self, o): return ops.pow(o, self)
    def __matmul__(self, o): return ops.matmul(self, o)
    def __rmatmul__(self, o): return ops.matmul(o, self)
    def __neg__(self): return ops.neg(self)
    def __pos__(self): return self
    def __abs__(self): return ops.abs(self)
    def __invert__(self):
        """Bitwise not: logical not of a bool, -x - 1 of an integer (two's complement)."""
        if self.dtype is dtypes.bool_:
            return ops.eq(self, False)
        if self.dtype.is_floating_point:
            raise TypeError(f"~ (bitwise not) is defined for integer and bool tensors, got "
                            f"{self.dtype} of shape {self.shape}")
        return ops.sub(ops.neg(self), 1)
    bitwise_not = __invert__
    def __eq__(self, o): return ops.eq(self, o)
    def __ne__(self, o): return ops.ne(self, o)
    def __lt__(self, o): return ops.lt(self, o)
    def __le__(self, o): return ops.le(self, o)
    def __gt__(self, o): return ops.gt(self, o)
    def __ge__(self, o): return ops.ge(self, o)

    # in place (no history: not allowed on tensors that take part in autodiff)
    def __iadd__(self, o): return self.add_(o)
    def __isub__(self, o): return self.sub_(o)
    def __imul__(self, o): return self.mul_(o)
    def __itruediv__(self, o): return self.div_(o)

    def add_(self, o, alpha=1):
        return self._inplace("add_", "add", o if alpha == 1 else o * alpha)

    def sub_(self, o, alpha=1):
        return self._inplace("sub_", "sub", o if alpha == 1 else o * alpha)

    def mul_(self, o): return self._inplace("mul_", "mul", o)
    def div_(self, o): return self._inplace("div_", "div", o)

    def clamp_(self, min=None, max=None):
        if self._check_inplace("clamp_"):
            return self._rebase("clamp_", lambda old: old.clamp(min, max))
        get_backend().clamp(self._data, min, max, out=self._data)
        self._bump_version()
        return self

    def zero_(self): return self.fill_(0)

    def fill_(self, value):
        if self._check_inplace("fill_", value):
            return self._rebase("fill_", lambda old: self._overwritten(old, value))
        if isinstance(value, Tensor):
            get_backend().copy_(self._data, value._data)
        else:
            get_backend().fill_(self._data, value)
        self._bump_version()
        if not isinstance(value, Tensor):
            self._const = (value, self._version_box[0])
        return self

    def copy_(self, src):
        """Copy src (broadcast, converted to this dtype) into this tensor's memory."""
        if self._check_inplace("copy_", src):
            src = src.to(self.device) if isinstance(src, Tensor) else src
            return self._rebase("copy_", lambda old: self._overwritten(old, src))
        if isinstance(src, Tensor):
            if src.device != self.device:
                src = src.to(self.device)
            get_backend().copy_(self._data, src._data)
        else:
            get_backend().copy_(self._data, tensor(src, dtype=self.dtype)._data)
        self._bump_version()
        return self

    def _check_inplace(self, op, operand=None):
        """Whether an in-place op must be recorded (grad mode on, and this tensor or the operand
        takes part in autodiff). As torch, refused on a leaf that requires grad."""
        if not grad_mode.enabled:
            return False
        if self._requires_grad and self.grad_fn is None:
            raise RuntimeError(f"{op}: in-place update of a leaf tensor that requires grad (shape "
                               f"{self.shape}) would corrupt autodiff; wrap it in td.no_grad() or "
                               "use the out-of-place form")
        return self._requires_grad or (isinstance(operand, Tensor) and operand._requires_grad)

    def _rebase(self, op, new_value):
        """A recorded in-place op, as torch: new_value(a copy of the old value) is written into
        this memory and this tensor takes its history. The copy keeps the old value for the new
        node's backward; a saved use of this memory elsewhere fails at backward (its version
        changed). NOTE: a view is refused: its base's history would not see the change."""
        if self._data._base is not None:
            raise RuntimeError(f"{op}: in-place update of a view (shape {self.shape}) that takes "
                               "part in autodiff; update the tensor it views, or use the "
                               "out-of-place form")
        new = new_value(ops.clone(self))
        if new.dtype is not self.dtype:
            new = new.to(self.dtype)
        get_backend().copy_(self._data, new._data)
        self._bump_version()
        self.grad_fn, self._output_index = new.grad_fn, new._output_index
        self._requires_grad = new._requires_grad
        return self

    def _overwritten(self, old, value):
        """value (a number or a tensor, broadcast) in old's shape: its gradient goes to value."""
        everywhere = full(self.shape, True, dtype=dtypes.bool_, device=self.device)
        return ops.where(everywhere, value, old)

    def _inplace(self, name, op, other):
        if self._check_inplace(name, other):
            return self._rebase(name, lambda old: getattr(ops, op)(old, other))
        raw = other._data if isinstance(other, Tensor) else other
        if isinstance(other, Tensor) and other.device != self.device:
            raise RuntimeError(f"{name}: tensors on different devices ({self.device} and "
                               f"{other.device})")
        result = dtypes.result_type(self._data, raw)
        if result.category > self.dtype.category:
            raise RuntimeError(f"{name}: the result type {result} cannot be stored in a tensor of "
                               f"dtype {self.dtype}")
        if isinstance(other, Tensor) and \
                ops.broadcast_shapes(name, self.shape, other.shape) != self.shape:
            raise RuntimeError(f"{name}: the operand of shape {other.shape} does not broadcast to "
                               f"this tensor's shape {self.shape}")
        getattr(get_backend(), op)(self._data, raw, out=self._data)
        self._bump_version()
        return self

    def __setitem__(self, key, value):
        index_ops.setitem(self, key, value)

    def __getitem__(self, key):
        return ops.getitem(self, key)

    def __iter__(self):
        if self.ndim == 0:
            raise TypeError("iteration over a 0-d tensor")
        return (self[i] for i in range(self.shape[0]))

    # ------------------------------------------------------------------ methods (see autodiff.ops)
    def exp(self): return ops.exp(self)
    def log(self): return ops.log(self)
    def sqrt(self): return ops.sqrt(self)
    def abs(self): return ops.abs(self)
    def neg(self): return ops.neg(self)
    def sign(self): return ops.sign(self)
    def relu(self): return ops.relu(self)
    def sigmoid(self): return ops.sigmoid(self)
    def tanh(self): return ops.tanh(self)
    def square(self): return ops.pow(self, 2)
    def pow(self, exponent): return ops.pow(self, exponent)
    def clamp(self, min=None, max=None): return ops.clamp(self, min, max)
    clip = clamp
    def maximum(self, other): return ops.maximum(self, other)
    def minimum(self, other): return ops.minimum(self, other)
    def where(self, condition, other): return ops.where(condition, self, other)
    def eq(self, o): return ops.eq(self, o)
    def ne(self, o): return ops.ne(self, o)
    def lt(self, o): return ops.lt(self, o)
    def le(self, o): return ops.le(self, o)
    def gt(self, o): return ops.gt(self, o)
    def ge(self, o): return ops.ge(self, o)
    def add(self, o, *, alpha=1): return ops.add(self, o if alpha == 1 else o * alpha)
    def sub(self, o, *, alpha=1): return ops.sub(self, o if alpha == 1 else o * alpha)
    def mul(self, o): return ops.mul(self, o)
    def div(self, o, *, rounding_mode=None): return ops.div(self, o, rounding_mode=rounding_mode)
    def matmul(self, o): return ops.matmul(self, o)

    def sum(self, dim=None, keepdim=False, dtype=None): return ops.sum(self, dim, keepdim, dtype)
    def mean(self, dim=None, keepdim=False): return ops.mean(self, dim, keepdim)
    def var(self, dim=None, unbiased=None, keepdim=False, *, correction=None):
        return ops.var(self, dim, unbiased, keepdim, correction=correction)
    def std(self, dim=None, unbiased=None, keepdim=False, *, correction=None):
        return ops.std(self, dim, unbiased, keepdim, correction=correction)
    def max(self, dim=None, keepdim=False): return ops.max(self, dim, keepdim)
    def min(self, dim=None, keepdim=False): return ops.min(self, dim, keepdim)
    def amax(self, dim=None, keepdim=False): return ops.amax(self, dim, keepdim)
    def amin(self, dim=None, keepdim=False): return ops.amin(self, dim, keepdim)
    def argmax(self, dim=None, keepdim=False): return ops.argmax(self, dim, keepdim)
    def argmin(self, dim=None, keepdim=False): return ops.argmin(self, dim, keepdim)
    def any(self, dim=None, keepdim=False): return ops.reduce_any(self, dim, keepdim)
    def all(self, dim=None, keepdim=False): return ops.reduce_all(self, dim, keepdim)
    def softmax(self, dim, dtype=None): return ops.softmax(self, dim, dtype=dtype)
    def log_softmax(self, dim, dtype=None): return ops.log_softmax(self, dim, dtype=dtype)

    def reshape(self, *shape): return ops.reshape(self, _shape_arg(shape))
    def view(self, *shape):
        if len(shape) == 1 and isinstance(shape[0], (DType, torch.dtype)):
            raise NotImplementedError("view(dtype) is not supported; use .to(dtype)")
        return ops.view(self, _shape_arg(shape))
    def view_as(self, other): return self.view(other.shape)
    def reshape_as(self, other): return self.reshape(other.shape)
    def flatten(self, start_dim=0, end_dim=-1): return ops.flatten(self, start_dim, end_dim)
    def transpose(self, dim0, dim1): return ops.transpose(self, dim0, dim1)
    def permute(self, *dims): return ops.permute(self, _shape_arg(dims, allow_negative=True))
    def unsqueeze(self, dim): return ops.unsqueeze(self, dim)
    def squeeze(self, dim=None): return ops.squeeze(self, dim)
    def expand(self, *shape): return ops.expand(self, _shape_arg(shape, allow_negative=True))
    def expand_as(self, other): return self.expand(other.shape)
    def broadcast_to(self, shape): return self.expand(*shape)
    def contiguous(self): return ops.contiguous(self)
    def clone(self): return ops.clone(self)

    # ---- PyTorch conveniences composed of the ops above (their gradients come with them)
    def t(self):
        """The transpose of a matrix (a 0-d or 1-d tensor as it is), as torch's t()."""
        if self.ndim > 2:
            raise ValueError(f"t(): expects a tensor of at most 2 dimensions, got {self.shape}; "
                             "use transpose(dim0, dim1) or permute")
        return self.transpose(0, 1) if self.ndim == 2 else self

    def type(self, dtype=None):
        """The dtype's name (no argument, as 'torch.FloatTensor' is not ours: 'tritonad.float32'),
        or the tensor converted to `dtype`."""
        return f"tritonad.{self.dtype.name}" if dtype is None else self.to(dtype)

    def split(self, split_size_or_sections, dim=0):
        """Views of consecutive pieces along `dim`: of split_size each (the last may be
        shorter), or of the given sizes, as torch's split."""
        size = self.shape[dim]
        if isinstance(split_size_or_sections, int):
            step = split_size_or_sections
            if step <= 0:
                raise ValueError(f"split: split_size must be positive, got {step}")
            sizes = [min(step, size - k) for k in range(0, size, step)] or [0]
        else:
            sizes = [int(n) for n in split_size_or_sections]
            if sum(sizes) != size or any(n < 0 for n in sizes):
                raise ValueError(f"split: sizes {sizes} do not sum to dimension {dim}'s size "
                                 f"{size}")
        index = [slice(None)] * (dim % self.ndim)
        pieces, start = [], 0
        for n in sizes:
            pieces.append(self[tuple(index + [slice(start, start + n)])])
            start += n
        return tuple(pieces)

    def chunk(self, chunks, dim=0):
        """At most `chunks` views of equal size along `dim` (the last may be smaller)."""
        if chunks <= 0:
            raise ValueError(f"chunk: chunks must be positive, got {chunks}")
        return self.split(max(1, -(-self.shape[dim] // chunks)), dim)

    def repeat(self, *sizes):
        """The tensor tiled sizes[i] times along each dimension (a copy), as torch's repeat."""
        sizes = _shape_arg(sizes)
        if len(sizes) < self.ndim:
            raise ValueError(f"repeat: {len(sizes)} sizes for a {self.ndim}-d tensor; give at "
                             "least one per dimension")
        dims = (1,) * (len(sizes) - self.ndim) + tuple(self.shape)
        x = self.reshape(tuple(a for d in dims for a in (1, d)))  # [1, d0, 1, d1, ...]
        x = x.expand(*(a for n, d in zip(sizes, dims) for a in (n, d)))  # [n0, d0, n1, d1, ...]
        return x.reshape(tuple(n * d for n, d in zip(sizes, dims)))

    # ---- embeddings and indexing (autodiff/index_ops.py)
    def gather(self, dim, index): return ops.gather(self, dim, index)
    def take_along_dim(self, indices, dim=None): return ops.take_along_dim(self, indices, dim)
    def index_select(self, dim, index): return ops.index_select(self, dim, index)
    def masked_select(self, mask): return ops.masked_select(self, mask)
    def masked_fill(self, mask, value): return ops.masked_fill(self, mask, value)
    def masked_fill_(self, mask, value):
        return index_ops._in_place(self, "masked_fill_",
                                   lambda old: ops.masked_fill(old, mask, value), value)
    def scatter(self, dim, index, src=None, value=None, *, reduce=None):
        return ops.scatter(self, dim, index, src, value, reduce=reduce)
    def scatter_(self, dim, index, src=None, value=None, *, reduce=None):
        return index_ops._in_place(self, "scatter_", lambda old: ops.scatter(
            old, dim, index, src, value, reduce=reduce), src)
    def scatter_add(self, dim, index, src): return ops.scatter_add(self, dim, index, src)
    def scatter_add_(self, dim, index, src):
        return index_ops._in_place(self, "scatter_add_",
                                   lambda old: ops.scatter_add(old, dim, index, src), src)
    def scatter_reduce(self, dim, index, src, reduce, *, include_self=True):
        return ops.scatter_reduce(self, dim, index, src, reduce, include_self=include_self)
    def scatter_reduce_(self, dim, index, src, reduce, *, include_self=True):
        return index_ops._in_place(self, "scatter_reduce_", lambda old: ops.scatter_reduce(
            old, dim, index, src, reduce, include_self=include_self), src)
    def index_add(self, dim, index, source, *, alpha=1):
        return ops.index_add(self, dim, index, source, alpha=alpha)
    def index_add_(self, dim, index, source, *, alpha=1):
        return index_ops._in_place(self, "index_add_", lambda old: ops.index_add(
            old, dim, index, source, alpha=alpha), source)
    def index_put(self, indices, values, accumulate=False):
        return ops.index_put(self, indices, values, accumulate)
    def index_put_(self, indices, values, accumulate=False):
        return index_ops._in_place(self, "index_put_", lambda old: ops.index_put(
            old, indices, values, accumulate), values)

    @property
    def T(self):
        return ops.permute(self, tuple(range(self._data.dim() - 1, -1, -1)))

    @property
    def mT(self):
        return self.transpose(-2, -1)


_NOT_METHODS = {"__module__", "__qualname__", "__doc__", "__dict__", "__weakref__", "__hash__",
                "__firstlineno__", "__static_attributes__"}


# scans, sorting and tensor ops (scan_ops.py, tensor_ops.py): x.cumsum(1), x.topk(5), x.tril()
from . import scan_ops as _scan_ops, tensor_ops as _tensor_ops  # noqa: E402

for _module, _names in ((_scan_ops, ("cumsum", "cumprod", "logcumsumexp", "cummax", "cummin",
                                     "sort", "argsort", "topk")),
                        (_tensor_ops, ("tril", "triu", "mm", "bmm"))):
    for _name in _names:
        setattr(TensorMethods, _name, getattr(_module, _name))
# ---- the small pieces: norm (any p), unbind, unflatten


class SmallPieces:
    def norm(self, p="fro", dim=None, keepdim=False, dtype=None):
        """The vector p-norm over dim (every element by default), as torch's Tensor.norm:
        p a number (2, 1, inf, -inf, 0, any real) or "fro" (the 2-norm of the elements)."""
        if p == "nuc":
            raise NotImplementedError("norm: p='nuc' needs singular values, which tritonad does "
                                      "not compute")
        return losses.vector_norm(self, 2 if p == "fro" else p, dim, keepdim, dtype=dtype)

    def unbind(self, dim=0):
        """The slices along dim, as a tuple of views."""
        if self.ndim == 0:
            raise IndexError("unbind: cannot unbind a 0-d tensor")
        if not -self.ndim <= dim < self.ndim:
            raise IndexError(f"unbind: dimension {dim} is out of range for shape {self.shape}")
        lead = (slice(None),) * (dim % self.ndim)
        return tuple(self[lead + (i,)] for i in range(self.shape[dim]))

    def unflatten(self, dim, sizes):
        """Dimension dim split into sizes (one may be -1)."""
        n = self.ndim
        if n == 0 or not -n <= dim < n:
            raise IndexError(f"unflatten: dimension {dim} is out of range for shape {self.shape}")
        dim %= n
        sizes = tuple(int(s) for s in sizes)
        known = 1
        for s in sizes:
            known *= 1 if s == -1 else s
        size = self.shape[dim]
        if not sizes or sizes.count(-1) > 1 or \
                (known != size if -1 not in sizes else known == 0 or size % known):
            raise ValueError(f"unflatten: sizes {sizes} do not multiply to dimension {dim}'s "
                             f"size {size} (shape {self.shape})")
        return self.reshape(tuple(self.shape[:dim]) + sizes + tuple(self.shape[dim + 1:]))


def install():
    for cls in (TensorMethods, SmallPieces):
        for name, value in vars(cls).items():
            if name not in _NOT_METHODS:
                setattr(Tensor, name, value)
    elementwise.install_methods()
    # the arithmetic operators are ops' lean functions themselves (no method frame)
    Tensor.__add__, Tensor.__sub__, Tensor.__mul__, Tensor.__truediv__ = ops.arithmetic


install()
