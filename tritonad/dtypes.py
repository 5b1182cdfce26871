"""Data types: tritonad's names for the element types, and torch's promotion rules.

A DType is a thin, printable handle on the torch dtype that the storage uses.
"""
from __future__ import annotations

import numpy as np
import torch


class DType:
    """An element type. `td.float32` prints as `tritonad.float32`."""

    __slots__ = ("name", "torch", "itemsize", "is_floating_point", "is_signed")

    def __init__(self, name, torch_dtype, itemsize, is_floating_point, is_signed=True):
        self.name = name
        self.torch = torch_dtype
        self.itemsize = itemsize
        self.is_floating_point = is_floating_point
        self.is_signed = is_signed

    @property
    def category(self):
        """0 bool, 1 integer, 2 floating point: the order in which types promote."""
        if self.is_floating_point:
            return 2
        return 0 if self.name == "bool" else 1

    @property
    def numpy(self):
        """The numpy dtype holding values of this type (float32 stands in for bfloat16)."""
        return np.dtype("float32") if self.name == "bfloat16" else np.dtype(self.name)

    def __repr__(self):
        return f"tritonad.{self.name}"

    def __reduce__(self):
        return (get_dtype, (self.name,))


float64 = DType("float64", torch.float64, 8, True)
float32 = DType("float32", torch.float32, 4, True)
float16 = DType("float16", torch.float16, 2, True)
bfloat16 = DType("bfloat16", torch.bfloat16, 2, True)
int64 = DType("int64", torch.int64, 8, False)
int32 = DType("int32", torch.int32, 4, False)
uint8 = DType("uint8", torch.uint8, 1, False, is_signed=False)
bool_ = DType("bool", torch.bool, 1, False, is_signed=False)

ALL = (float64, float32, float16, bfloat16, int64, int32, uint8, bool_)
FLOATING = (float64, float32, float16, bfloat16)
_BY_NAME = {d.name: d for d in ALL}
_BY_TORCH = {d.torch: d for d in ALL}
_BY_NUMPY = {np.dtype(d.name): d for d in ALL if d is not bfloat16}
_ALIASES = {"float": float32, "double": float64, "half": float16, "long": int64, "int": int32}

default_float = float32
default_int = int64


def get_dtype(spec) -> DType:
    """A DType from a DType, a name ("float32", "half"), a torch dtype or a numpy dtype."""
    if isinstance(spec, DType):
        return spec
    if isinstance(spec, str):
        found = _BY_NAME.get(spec) or _ALIASES.get(spec)
        if found is None:
            raise TypeError(f"unknown dtype {spec!r}; expected one of {sorted(_BY_NAME)}")
        return found
    if isinstance(spec, torch.dtype):
        if spec not in _BY_TORCH:
            raise TypeError(f"tritonad does not support the torch dtype {spec}")
        return _BY_TORCH[spec]
    if spec is bool:
        return bool_
    if spec is int:
        return default_int
    if spec is float:
        return default_float
    try:
        np_dtype = np.dtype(spec)
    except TypeError:
        raise TypeError(f"cannot interpret {spec!r} as a dtype") from None
    if np_dtype not in _BY_NUMPY:
        raise TypeError(f"tritonad does not support the numpy dtype {np_dtype}")
    return _BY_NUMPY[np_dtype]


def promote_types(a: DType, b: DType) -> DType:
    """The smallest type both a and b convert to without losing their category (as torch)."""
    if a is b:
        return a
    if a.category != b.category:
        return a if a.category > b.category else b
    if a.category == 2:
        if {a.name, b.name} == {"float16", "bfloat16"}:
            return float32
        return a if a.itemsize >= b.itemsize else b
    if a.category == 1:
        if uint8 in (a, b):  # uint8 with a signed type: the signed one, widened if needed
            other = b if a is uint8 else a
            return other if other.itemsize > 1 else int32
        return a if a.itemsize >= b.itemsize else b
    return a


def scalar_dtype(value) -> DType:
    """The dtype a Python scalar would have as a tensor."""
    if isinstance(value, (bool, np.bool_)):
        return bool_
    if isinstance(value, (int, np.integer)):
        return default_int
    if isinstance(value, (float, np.floating)):
        return default_float
    raise TypeError(f"expected a number, got {type(value).__name__}")


def result_type(*operands) -> DType:
    """The dtype of an elementwise op on `operands`, each a raw torch tensor or a Python number.

    torch's rule: tensors with dimensions decide within the highest category present among them;
    0-d tensors decide only if they raise the category; Python numbers only if they raise it
    further, and then give the default type of their category (int tensor * 0.5 -> float32).
    """
    groups = ([], [], [])  # dimensioned tensors, 0-d tensors, scalars
    for op in operands:
        if isinstance(op, torch.Tensor):
            groups[0 if op.dim() > 0 else 1].append(get_dtype(op.dtype))
        else:
            groups[2].append(scalar_dtype(op))
    result = None
    for rank, group in enumerate(groups):
        if not group:
            continue
        best = group[0]
        for d in group[1:]:
            best = promote_types(best, d)
        if rank == 2:
            best = {0: bool_, 1: default_int, 2: default_float}[best.category]
        if result is None or best.category > result.category:
            result = best
    return result
