"""Tensor: torch storage used as memory, plus shape/strides/dtype/device and autodiff state.

`Tensor._data` is a torch tensor (usually a strided view of some storage). torch only allocates
it, views it and moves it between devices; every computation on it is a backend primitive.
Its operators and op methods (`x + y`, `x.exp()`, `x.reshape(...)`, `x.backward()`) are installed
by tritonad/autodiff/methods.py, in one place; this module imports nothing of autodiff.
"""
from __future__ import annotations

import math
import operator
from collections import namedtuple

import numpy as np
import torch

from . import dtypes, generator
from .backend import backend_of, get_backend
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
