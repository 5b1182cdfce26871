"""Tensor: torch storage used as memory, plus shape/strides/dtype/device and autodiff state.

`Tensor._data` is a torch tensor (usually a strided view of some storage). torch only allocates
it, views it and moves it between devices; every computation on it is a backend primitive.
Operators and methods are thin wrappers over the differentiable ops in `tritonad.autodiff.ops`.
"""
from __future__ import annotations

import math
import numbers
import operator
from collections import namedtuple

import numpy as np
import torch

from . import dtypes, generator
from .backend import _state, backend_of, get_backend
from .dtypes import DType

MaxResult = namedtuple("MaxResult", ["values", "indices"])


def _device(device) -> torch.device:
    """A torch.device from a string, a device or None (the backend's default device)."""
    if device is None:
        return get_backend().default_device
    if isinstance(device, Tensor):
        return device.device
    device = torch.device(device)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError(f"device {str(device)!r} was asked for, but CUDA is not available "
                               "on this machine; use device='cpu'")
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
    elif device.type != "cpu":
        raise RuntimeError(f"unsupported device {str(device)!r}; tritonad runs on 'cpu' and 'cuda'")
    return device


def _shape(args, op="tensor") -> tuple:
    """Accept f(2, 3) and f((2, 3)) alike; `op` names the function in errors."""
    if len(args) == 1 and isinstance(args[0], (tuple, list, torch.Size)):
        args = tuple(args[0])
    try:  # integers only (as torch): int(2.5) or int("2") would hide a mistake
        shape = tuple(operator.index(s) for s in args)
    except TypeError:
        raise TypeError(f"{op}: sizes must be integers, got {args}") from None
    if any(s < 0 for s in shape):
        raise ValueError(f"{op}: negative dimension in shape {shape}")
    return shape


_new_tensor = object.__new__


class Tensor:
    """An n-dimensional array on the CPU or a GPU that can record its history for autodiff.

    Build one with `td.tensor([[1., 2.], [3., 4.]], requires_grad=True)`.
    """

    __slots__ = ("_data", "_requires_grad", "grad", "grad_fn", "_output_index", "_version_box",
                 "_grad_buffer", "_const", "__weakref__")
    __array_priority__ = 1000  # numpy defers to our reflected operators

    def __init__(self, data, dtype=None, device=None, requires_grad=False):
        other = tensor(data, dtype=dtype, device=device, requires_grad=requires_grad)
        self._init(other._data, requires_grad=other.requires_grad)

    def _init(self, raw, requires_grad=False, grad_fn=None, output_index=0, version_box=None):
        self._data = raw
        self._requires_grad = requires_grad
        self.grad = None
        self.grad_fn = grad_fn
        self._output_index = output_index
        self._version_box = version_box if version_box is not None else [0]
        self._grad_buffer = None
        self._const = None

    @classmethod
    def _wrap(cls, raw, requires_grad=False, grad_fn=None, output_index=0, version_box=None):
        """A Tensor around a raw torch array, without copying or validation. version_box: the
        version counter to share (a view's is its base's), or None for a new one."""
        t = _new_tensor(cls)
        t._data = raw
        t._requires_grad = requires_grad
        t.grad = None
        t.grad_fn = grad_fn
        t._output_index = output_index
        t._version_box = version_box if version_box is not None else [0]
        t._grad_buffer = None
        t._const = None
        return t

    # ------------------------------------------------------------------ metadata
    @property
    def shape(self) -> tuple:
        return tuple(self._data.shape)

    def size(self, dim=None):
        return self.shape if dim is None else self.shape[dim]

    @property
    def ndim(self) -> int:
        return self._data.dim()

    def dim(self) -> int:
        return self._data.dim()

    def numel(self) -> int:
        return self._data.numel()

    def __len__(self):
        if self.ndim == 0:
            raise TypeError("len() of a 0-d tensor")
        return self.shape[0]

    def stride(self, dim=None):
        """Strides in elements (0 for broadcast dimensions)."""
        return self._data.stride() if dim is None else self._data.stride(dim)

    def is_contiguous(self) -> bool:
        return self._data.is_contiguous()

    @property
    def dtype(self) -> DType:
        return dtypes.get_dtype(self._data.dtype)

    @property
    def device(self) -> torch.device:
        return self._data.device

    @property
    def is_cuda(self) -> bool:
        return self._data.is_cuda

    def element_size(self) -> int:
        return self.dtype.itemsize

    def data_ptr(self) -> int:
        return self._data.data_ptr()

    @property
    def _version(self) -> int:
        return self._version_box[0]

    def _bump_version(self):
        self._version_box[0] += 1
        self._const = None

    def _constant(self):
        """The value every element holds, if this tensor was filled with one (td.full, fill_)
        and its memory was not changed since, through it or any view; else None."""
        const = self._const
        if const is not None and const[1] == self._version_box[0]:
            return const[0]
        return None

    # ------------------------------------------------------------------ autodiff state
    @property
    def requires_grad(self) -> bool:
        return self._requires_grad

    @requires_grad.setter
    def requires_grad(self, flag):
        if flag and not self.dtype.is_floating_point:
            raise RuntimeError(f"only floating point tensors can require gradients; this tensor "
                               f"has dtype {self.dtype} and shape {self.shape}")
        if not flag and self.grad_fn is not None:
            raise RuntimeError("requires_grad can only be turned off on leaf tensors; "
                               "use .detach() for a copy without history")
        self._requires_grad = bool(flag)

    def requires_grad_(self, flag=True) -> "Tensor":
        self.requires_grad = flag
        return self

    @property
    def is_leaf(self) -> bool:
        return self.grad_fn is None

    def detach(self) -> "Tensor":
        """The same memory without history."""
        return Tensor._wrap(self._data, version_box=self._version_box)

    def detach_(self) -> "Tensor":
        self.grad_fn = None
        self._requires_grad = False
        return self

    @property
    def data(self) -> "Tensor":
        return self.detach()

    @data.setter
    def data(self, value):
        value = value._data if isinstance(value, Tensor) else value
        if tuple(value.shape) != self.shape or value.dtype != self._data.dtype:
            raise RuntimeError(f"cannot set .data of a tensor of shape {self.shape} and dtype "
                               f"{self.dtype} to one of shape {tuple(value.shape)} and dtype "
                               f"{dtypes.get_dtype(value.dtype)}")
        self._data = value
        self._bump_version()

    def retain_grad(self) -> None:
        """Keep .grad of this non-leaf tensor after backward."""
        if self.grad_fn is not None:
            ctx = self.grad_fn
            ctx._retained = {**ctx._retained, self._output_index: self}  # (never in place)

    def backward(self, gradient=None, retain_graph=False, create_graph=False, inputs=None):
        """Accumulate d(self)/d(leaf) into each leaf's .grad.

        Calling it twice on one graph needs retain_graph=True the first time, as in torch;
        gradients accumulate across calls until zeroed.
        """
        from .autodiff.function import run_backward  # noqa: E402 (autodiff imports this module)

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

    # ------------------------------------------------------------------ conversion
    def numpy(self) -> np.ndarray:
        """The values as a numpy array (bfloat16 as float32). A CPU tensor shares its memory.
        A read of the device: errors that kernels found in the data since the last read (a bad
        class index, say) are raised here (see td.set_sync_checks)."""
        from .reference import to_numpy

        raw = self._data
        values = to_numpy(raw.detach().cpu())
        backend_of(raw).check_errors(raw.device)
        return values

    def __array__(self, dtype=None, copy=None):
        a = self.numpy()
        return a if dtype is None else a.astype(dtype)

    def item(self):
        if self.numel() != 1:
            raise RuntimeError(f"item(): a tensor with {self.numel()} elements (shape {self.shape}) "
                               "cannot be converted to a Python number")
        return self.numpy().reshape(-1)[0].item()

    def tolist(self):
        return self.numpy().tolist()

    def __float__(self): return float(self.item())
    def __int__(self): return int(self.item())

    def __index__(self):
        if self.dtype.category == 2:
            raise TypeError("only integer tensors can be used as an index")
        return int(self.item())

    def __bool__(self):
        if self.numel() != 1:
            raise RuntimeError(f"the truth value of a tensor with {self.numel()} elements is "
                               "ambiguous; use .any() or .all()")
        return bool(self.item())

    def torch(self) -> torch.Tensor:
        """The underlying torch memory (shared, not copied)."""
        return self._data

    def to(self, *args, **kwargs) -> "Tensor":
        """.to(device), .to(dtype), .to(device, dtype) or .to(other_tensor)."""
        from .autodiff import ops

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

    # ------------------------------------------------------------------ printing
    def __repr__(self):
        values = self.numpy()
        if self.dtype is dtypes.bfloat16 or self.dtype is dtypes.float16:
            values = values.astype(np.float32)
        body = np.array2string(values, separator=", ", prefix="tensor(", threshold=1000,
                               edgeitems=3, precision=4, floatmode="maxprec_equal")
        extras = []
        if self.device.type != "cpu":
            extras.append(f"device='{self.device}'")
        if self.dtype not in (dtypes.float32, dtypes.int64, dtypes.bool_):
            extras.append(f"dtype={self.dtype}")
        if self.numel() == 0:
            extras.append(f"size={self.shape}")
        if self.grad_fn is not None:
            extras.append(f"grad_fn={self.grad_fn!r}")
        elif self.requires_grad:
            extras.append("requires_grad=True")
        return "tensor(" + ", ".join([body] + extras) + ")"

    __str__ = __repr__
    __hash__ = object.__hash__

    def __getattr__(self, name):  # only for names Tensor lacks: a PyTorch one says what to use
        from ._hints import missing_method
        raise missing_method(type(self), name)

    # ------------------------------------------------------------------ operators
    # (__add__, __sub__, __mul__ and __truediv__ are tritonad.autodiff.ops' add, sub, mul and
    # div themselves, set there: one Python frame less on every eager `x + b`)
    def __add__(self, o): return _OPS.add(self, o)
    def __radd__(self, o): return _OPS.add(o, self)
    def __sub__(self, o): return _OPS.sub(self, o)
    def __rsub__(self, o): return _OPS.sub(o, self)
    def __mul__(self, o): return _OPS.mul(self, o)
    def __rmul__(self, o): return _OPS.mul(o, self)
    def __truediv__(self, o): return _OPS.div(self, o)
    def __rtruediv__(self, o): return _OPS.div(o, self)
    def __pow__(self, o): return _OPS.pow(self, o)
    def __rpow__(self, o): return _OPS.pow(o, self)
    def __matmul__(self, o): return _OPS.matmul(self, o)
    def __rmatmul__(self, o): return _OPS.matmul(o, self)
    def __neg__(self): return _OPS.neg(self)
    def __pos__(self): return self
    def __abs__(self): return _OPS.abs(self)
    def __invert__(self):
        """Bitwise not: logical not of a bool, -x - 1 of an integer (two's complement)."""
        if self.dtype is dtypes.bool_:
            return _OPS.eq(self, False)
        if self.dtype.is_floating_point:
            raise TypeError(f"~ (bitwise not) is defined for integer and bool tensors, got "
                            f"{self.dtype} of shape {self.shape}")
        return _OPS.sub(_OPS.neg(self), 1)
    bitwise_not = __invert__
    def __eq__(self, o): return _OPS.eq(self, o)
    def __ne__(self, o): return _OPS.ne(self, o)
    def __lt__(self, o): return _OPS.lt(self, o)
    def __le__(self, o): return _OPS.le(self, o)
    def __gt__(self, o): return _OPS.gt(self, o)
    def __ge__(self, o): return _OPS.ge(self, o)

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
        if not _state.enabled:
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
        new = new_value(_OPS.clone(self))
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
        return _OPS.where(everywhere, value, old)

    def _inplace(self, name, op, other):
        if self._check_inplace(name, other):
            return self._rebase(name, lambda old: getattr(_OPS, op)(old, other))
        raw = other._data if isinstance(other, Tensor) else other
        if isinstance(other, Tensor) and other.device != self.device:
            raise RuntimeError(f"{name}: tensors on different devices ({self.device} and "
                               f"{other.device})")
        result = dtypes.result_type(self._data, raw)
        if result.category > self.dtype.category:
            raise RuntimeError(f"{name}: the result type {result} cannot be stored in a tensor of "
                               f"dtype {self.dtype}")
        if isinstance(other, Tensor) and \
                _OPS.broadcast_shapes(name, self.shape, other.shape) != self.shape:
            raise RuntimeError(f"{name}: the operand of shape {other.shape} does not broadcast to "
                               f"this tensor's shape {self.shape}")
        getattr(get_backend(), op)(self._data, raw, out=self._data)
        self._bump_version()
        return self

    def __setitem__(self, key, value):
        if self._check_inplace("__setitem__", value):
            raise RuntimeError(f"__setitem__: assignment into a tensor of shape {self.shape} that "
                               "takes part in autodiff; build the result out of place (td.where, "
                               "td.cat) or assign under td.no_grad()")
        view = self._data[_OPS.basic_index(self, key)]
        if isinstance(value, Tensor):
            get_backend().copy_(view, value.to(self.device)._data)
        else:
            get_backend().fill_(view, value) if isinstance(value, numbers.Number) else \
                get_backend().copy_(view, tensor(value, dtype=self.dtype, device=self.device)._data)
        self._bump_version()

    def __getitem__(self, key):
        return _OPS.getitem(self, key)

    def __iter__(self):
        if self.ndim == 0:
            raise TypeError("iteration over a 0-d tensor")
        return (self[i] for i in range(self.shape[0]))

    # ------------------------------------------------------------------ methods (see autodiff.ops)
    def exp(self): return _OPS.exp(self)
    def log(self): return _OPS.log(self)
    def sqrt(self): return _OPS.sqrt(self)
    def abs(self): return _OPS.abs(self)
    def neg(self): return _OPS.neg(self)
    def sign(self): return _OPS.sign(self)
    def relu(self): return _OPS.relu(self)
    def sigmoid(self): return _OPS.sigmoid(self)
    def tanh(self): return _OPS.tanh(self)
    def square(self): return _OPS.pow(self, 2)
    def pow(self, exponent): return _OPS.pow(self, exponent)
    def clamp(self, min=None, max=None): return _OPS.clamp(self, min, max)
    clip = clamp
    def maximum(self, other): return _OPS.maximum(self, other)
    def minimum(self, other): return _OPS.minimum(self, other)
    def where(self, condition, other): return _OPS.where(condition, self, other)
    def eq(self, o): return _OPS.eq(self, o)
    def ne(self, o): return _OPS.ne(self, o)
    def lt(self, o): return _OPS.lt(self, o)
    def le(self, o): return _OPS.le(self, o)
    def gt(self, o): return _OPS.gt(self, o)
    def ge(self, o): return _OPS.ge(self, o)
    def add(self, o, *, alpha=1): return _OPS.add(self, o if alpha == 1 else o * alpha)
    def sub(self, o, *, alpha=1): return _OPS.sub(self, o if alpha == 1 else o * alpha)
    def mul(self, o): return _OPS.mul(self, o)
    def div(self, o, *, rounding_mode=None): return _OPS.div(self, o, rounding_mode=rounding_mode)
    def matmul(self, o): return _OPS.matmul(self, o)

    def sum(self, dim=None, keepdim=False, dtype=None): return _OPS.sum(self, dim, keepdim, dtype)
    def mean(self, dim=None, keepdim=False): return _OPS.mean(self, dim, keepdim)
    def var(self, dim=None, unbiased=None, keepdim=False, *, correction=None):
        return _OPS.var(self, dim, unbiased, keepdim, correction=correction)
    def std(self, dim=None, unbiased=None, keepdim=False, *, correction=None):
        return _OPS.std(self, dim, unbiased, keepdim, correction=correction)
    def max(self, dim=None, keepdim=False): return _OPS.max(self, dim, keepdim)
    def min(self, dim=None, keepdim=False): return _OPS.min(self, dim, keepdim)
    def amax(self, dim=None, keepdim=False): return _OPS.amax(self, dim, keepdim)
    def amin(self, dim=None, keepdim=False): return _OPS.amin(self, dim, keepdim)
    def argmax(self, dim=None, keepdim=False): return _OPS.argmax(self, dim, keepdim)
    def argmin(self, dim=None, keepdim=False): return _OPS.argmin(self, dim, keepdim)
    def any(self, dim=None, keepdim=False): return _OPS.reduce_any(self, dim, keepdim)
    def all(self, dim=None, keepdim=False): return _OPS.reduce_all(self, dim, keepdim)
    def softmax(self, dim, dtype=None): return _OPS.softmax(self, dim, dtype=dtype)
    def log_softmax(self, dim, dtype=None): return _OPS.log_softmax(self, dim, dtype=dtype)

    def reshape(self, *shape): return _OPS.reshape(self, _shape_arg(shape))
    def view(self, *shape):
        if len(shape) == 1 and isinstance(shape[0], (DType, torch.dtype)):
            raise NotImplementedError("view(dtype) is not supported; use .to(dtype)")
        return _OPS.view(self, _shape_arg(shape))
    def view_as(self, other): return self.view(other.shape)
    def reshape_as(self, other): return self.reshape(other.shape)
    def flatten(self, start_dim=0, end_dim=-1): return _OPS.flatten(self, start_dim, end_dim)
    def transpose(self, dim0, dim1): return _OPS.transpose(self, dim0, dim1)
    def permute(self, *dims): return _OPS.permute(self, _shape_arg(dims, allow_negative=True))
    def unsqueeze(self, dim): return _OPS.unsqueeze(self, dim)
    def squeeze(self, dim=None): return _OPS.squeeze(self, dim)
    def expand(self, *shape): return _OPS.expand(self, _shape_arg(shape, allow_negative=True))
    def expand_as(self, other): return self.expand(other.shape)
    def broadcast_to(self, shape): return self.expand(*shape)
    def contiguous(self): return _OPS.contiguous(self)
    def clone(self): return _OPS.clone(self)

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

    def reciprocal(self): return 1.0 / self
    def rsqrt(self): return 1.0 / self.sqrt()
    def isnan(self): return self != self
    def isinf(self): return self.abs() == float("inf")
    def isfinite(self): return (self - self) == 0  # NaN and +-inf give NaN
    def masked_fill(self, mask, value):
        """self where mask is False, `value` where it is True (mask broadcasts), as torch's."""
        return _OPS.where(mask, value, self)

    def norm(self, p=2, dim=None, keepdim=False):
        """The vector p-norm over `dim` (all elements by default): p = 2 ("fro"), 1 or inf."""
        if p in (2, "fro"):
            return self.square().sum(dim, keepdim=keepdim).sqrt()
        if p == 1:
            return self.abs().sum(dim, keepdim=keepdim)
        if p == float("inf"):
            return self.abs().amax(dim, keepdim=keepdim)
        raise NotImplementedError(f"norm: p={p!r} is not supported (2, 'fro', 1 or inf)")

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

    def new_full(self, size, fill_value, dtype=None, device=None, requires_grad=False):
        return full(size, fill_value, dtype=dtype or self.dtype, device=device or self.device,
                    requires_grad=requires_grad)

    def new_zeros(self, *size, dtype=None, device=None, requires_grad=False):
        return self.new_full(_shape_arg(size), 0, dtype, device, requires_grad)

    def new_ones(self, *size, dtype=None, device=None, requires_grad=False):
        return self.new_full(_shape_arg(size), 1, dtype, device, requires_grad)

    def new_empty(self, *size, dtype=None, device=None, requires_grad=False):
        return empty(_shape_arg(size), dtype=dtype or self.dtype, device=device or self.device,
                     requires_grad=requires_grad)

    def new_tensor(self, data, dtype=None, device=None, requires_grad=False):
        return tensor(data, dtype=dtype or self.dtype, device=device or self.device,
                      requires_grad=requires_grad)

    @property
    def T(self):
        return _OPS.permute(self, tuple(range(self._data.dim() - 1, -1, -1)))

    @property
    def mT(self):
        return self.transpose(-2, -1)


def parse_to_args(args, kwargs):
    """(device or None, DType or None) from the arguments of .to()."""
    device, dtype = kwargs.pop("device", None), kwargs.pop("dtype", None)
    if kwargs:
        raise TypeError(f"to(): unexpected arguments {sorted(kwargs)}")
    for a in args:
        if isinstance(a, Tensor):
            device, dtype = a.device, a.dtype
        elif isinstance(a, (DType, torch.dtype)) or a in (float, int, bool):
            dtype = a
        elif isinstance(a, str) and a in dtypes._BY_NAME:
            dtype = a
        else:
            device = a
    return (None if device is None else _device(device),
            None if dtype is None else dtypes.get_dtype(dtype))


def _shape_arg(args, allow_negative=False):
    if len(args) == 1 and isinstance(args[0], (tuple, list, torch.Size)):
        args = tuple(args[0])
    out = tuple(int(a) for a in args)
    if not allow_negative and any(a < -1 for a in out):
        raise ValueError(f"invalid shape {out}")
    return out


class _LazyOps:
    """tritonad.autodiff.ops, imported at first use (it imports this module): the first
    attribute read replaces the module global _OPS with the module itself."""

    def __getattr__(self, name):
        global _OPS
        from .autodiff import ops

        _OPS = ops
        return getattr(ops, name)


_OPS = _LazyOps()


# ---------------------------------------------------------------------- creation functions


def _infer_dtype(values: np.ndarray) -> DType:
    if values.dtype == np.bool_:
        return dtypes.bool_
    if values.dtype.kind in "iu":
        return dtypes.default_int if values.dtype != np.uint8 else dtypes.uint8
    if values.dtype.kind == "f":
        return dtypes.default_float if values.dtype != np.float16 else dtypes.float16
    raise TypeError(f"tensor(): cannot make a tensor from values of numpy dtype {values.dtype}")


def tensor(data, dtype=None, device=None, requires_grad=False) -> Tensor:
    """A new tensor holding a copy of `data` (nested lists, numbers, numpy arrays or tensors).

    Floats default to float32, integers to int64: `td.tensor([[1., 2.], [3., 4.]])`.
    """
    from .reference import from_numpy as raw_from_numpy

    if isinstance(data, Tensor):
        out = data.detach().to(device=device or data.device, dtype=dtype or data.dtype)
        if out is data or out._data is data._data:
            out = out.clone()
        return out.requires_grad_(requires_grad) if requires_grad else out
    if isinstance(data, torch.Tensor):
        dtype = dtype or data.dtype
        data = Tensor._wrap(data.detach().cpu()).numpy()
    try:
        values = np.asarray(data)
    except ValueError as err:
        raise ValueError(f"tensor(): the nested sequences are ragged ({err})") from None
    if values.dtype == object:
        raise TypeError(f"tensor(): cannot make a tensor from {type(data).__name__} values")
    if dtype is None:
        # a numpy array keeps its dtype; Python floats become float32, ints int64 (as torch)
        dtype = values.dtype if isinstance(data, np.ndarray) else _infer_dtype(values)
    dtype = dtypes.get_dtype(dtype)
    raw = raw_from_numpy(values, dtype).to(_device(device))
    return _leaf(raw, requires_grad)


def from_numpy(array: np.ndarray, device=None) -> Tensor:
    """A tensor with the values and dtype of a numpy array (copied to the device)."""
    if not isinstance(array, np.ndarray):
        raise TypeError(f"from_numpy: expected a numpy array, got {type(array).__name__}")
    return tensor(array, dtype=dtypes.get_dtype(array.dtype), device=device)


def from_torch(t: torch.Tensor) -> Tensor:
    """A tensor sharing the memory of a torch tensor (no copy)."""
    dtypes.get_dtype(t.dtype)
    return Tensor._wrap(t.detach())


def empty(*shape, dtype=None, device=None, requires_grad=False) -> Tensor:
    dtype = dtypes.get_dtype(dtype or dtypes.default_float)
    raw = get_backend().empty(_shape(shape, "empty"), dtype, _device(device))
    return _leaf(raw, requires_grad)


def full(shape, fill_value, dtype=None, device=None, requires_grad=False) -> Tensor:
    """A tensor of `shape` filled with `fill_value` (dtype from the value if not given)."""
    if isinstance(shape, int):
        shape = (shape,)
    dtype = dtypes.get_dtype(dtype or dtypes.scalar_dtype(fill_value))
    device = _device(device)
    get_backend().check_device("full", device)
    t = _leaf(get_backend().full(_shape((shape,), "full"), fill_value, dtype, device),
              requires_grad)
    t._const = (fill_value, 0)
    return t


def zeros(*shape, dtype=None, device=None, requires_grad=False) -> Tensor:
    return full(_shape(shape, "zeros"), 0, dtype or dtypes.default_float, device, requires_grad)


def ones(*shape, dtype=None, device=None, requires_grad=False) -> Tensor:
    return full(_shape(shape, "ones"), 1, dtype or dtypes.default_float, device, requires_grad)


def zeros_like(t, dtype=None, device=None, requires_grad=False) -> Tensor:
    return zeros(t.shape, dtype=dtype or t.dtype, device=device or t.device,
                 requires_grad=requires_grad)


def ones_like(t, dtype=None, device=None, requires_grad=False) -> Tensor:
    return ones(t.shape, dtype=dtype or t.dtype, device=device or t.device,
                requires_grad=requires_grad)


def full_like(t, fill_value, dtype=None, device=None, requires_grad=False) -> Tensor:
    return full(t.shape, fill_value, dtype=dtype or t.dtype, device=device or t.device,
                requires_grad=requires_grad)


def empty_like(t, dtype=None, device=None, requires_grad=False) -> Tensor:
    return empty(t.shape, dtype=dtype or t.dtype, device=device or t.device,
                 requires_grad=requires_grad)


def rand(*shape, dtype=None, device=None, requires_grad=False) -> Tensor:
    """Uniform on [0, 1), from the global seed (`td.manual_seed`)."""
    return uniform(_shape(shape, "rand"), 0.0, 1.0, dtype=dtype, device=device,
                   requires_grad=requires_grad)


def uniform(shape, low=0.0, high=1.0, dtype=None, device=None, requires_grad=False) -> Tensor:
    """Uniform on [low, high)."""
    return _draw("uniform", shape, low, high, dtype, device, requires_grad)


def randn(*shape, dtype=None, device=None, requires_grad=False) -> Tensor:
    """Standard normal samples, from the global seed."""
    return normal(_shape(shape, "randn"), 0.0, 1.0, dtype=dtype, device=device,
                  requires_grad=requires_grad)


def normal(shape, mean=0.0, std=1.0, dtype=None, device=None, requires_grad=False) -> Tensor:
    """Normal samples with the given mean and standard deviation."""
    return _draw("normal", shape, mean, std, dtype, device, requires_grad)


def _draw(kind, shape, a, b, dtype, device, requires_grad):
    """A random draw of `kind` from the global (seed, counter) stream."""
    shape = _shape((shape,), kind)
    dtype = dtypes.get_dtype(dtype or dtypes.default_float)
    if not dtype.is_floating_point:
        raise TypeError(f"{kind}: expected a floating point dtype, got {dtype}")
    device = _device(device)
    get_backend().check_device(kind, device)
    seed, offset = generator.take(math.prod(shape))
    raw = getattr(get_backend(), kind)(shape, float(a), float(b), seed, offset, dtype, device)
    return _leaf(raw, requires_grad)


def _leaf(raw, requires_grad=False) -> Tensor:
    """A new leaf Tensor around freshly made raw memory."""
    t = Tensor._wrap(raw)
    return t.requires_grad_() if requires_grad else t


def rand_like(t, dtype=None, device=None) -> Tensor:
    return rand(t.shape, dtype=dtype or t.dtype, device=device or t.device)


def randn_like(t, dtype=None, device=None) -> Tensor:
    return randn(t.shape, dtype=dtype or t.dtype, device=device or t.device)


def randperm(n, device=None) -> Tensor:
    """A random permutation of range(n) (int64), drawn on the device."""
    try:
        n = operator.index(n)
    except TypeError:
        raise TypeError(f"randperm: n must be an int, got {n!r}") from None
    if n < 0:
        raise ValueError(f"randperm: n must be non-negative, got {n}")
    device = _device(device)
    get_backend().check_device("randperm", device)
    seed, offset = generator.take(n)
    return Tensor._wrap(get_backend().randperm(int(n), seed, offset, device))


def arange(start, end=None, step=1, dtype=None, device=None, requires_grad=False) -> Tensor:
    """Values from start (0 if only one bound is given) up to end, excluding it."""
    if end is None:
        start, end = 0, start
    for name, value in (("start", start), ("end", end), ("step", step)):
        try:
            finite = math.isfinite(value)
        except TypeError:
            raise TypeError(f"arange: {name} must be a number, got {value!r}") from None
        if not finite:
            raise ValueError(f"arange: {name} must be a finite number, got {value!r}")
    if step == 0:
        raise ValueError("arange: step must be nonzero")
    if dtype is None:
        floats = any(isinstance(v, float) for v in (start, end, step))
        dtype = dtypes.default_float if floats else dtypes.default_int
    dtype = dtypes.get_dtype(dtype)
    device = _device(device)
    get_backend().check_device("arange", device)
    raw = get_backend().arange(start, end, step, dtype, device)
    return _leaf(raw, requires_grad)


def is_tensor(obj) -> bool:
    return isinstance(obj, Tensor)
