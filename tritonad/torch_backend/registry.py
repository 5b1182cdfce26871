"""The table of aten operators tritonad implements, and the dispatch mode that runs them.

While enabled, a `TorchDispatchMode` sits below PyTorch's autograd: every aten operator PyTorch
dispatches (forward ops, and the backward ops autograd calls) reaches `_Mode.__torch_dispatch__`,
which looks the operator up in `IMPLS`. A handler receives the aten arguments exactly as PyTorch
passes them (torch tensors, Python numbers, lists) and returns what the aten operator returns,
computed by tritonad's kernels; tritonad's primitives take torch tensors as their arrays, so a
handler is a few lines of argument translation around one primitive call. A handler raises
`Fallback` for a case it does not cover (a dtype, a layout, an argument it does not take), and
the operator then runs PyTorch's own kernel, counted as a fallback.

    @register("aten::add.Tensor", "aten::add_.Tensor")
    def add(a, b, *, alpha=1): ...

Devices: CUDA tensors run on the triton backend. CPU tensors run there too when Triton's
interpreter is on (a machine without a GPU, where the test suite runs the same handlers on small
samples); otherwise an operator on CPU tensors is not tritonad's business (a PyTorch program's
data loading on a GPU machine) and passes through, neither counted nor refused by `strict`.
"""
from __future__ import annotations

import threading

import torch
from torch.utils._python_dispatch import TorchDispatchMode


class Fallback(Exception):
    """Raised by a handler for a case it does not implement: PyTorch's kernel runs instead."""


IMPLS: dict = {}          # OpOverload -> handler


def _overload(name):
    """`"aten::add.Tensor"`, `"add.Tensor"`, `"aten::relu"` or an OpOverload -> OpOverload."""
    if not isinstance(name, str):
        return name
    name = name.removeprefix("aten::")
    base, _, overload = name.partition(".")
    packet = getattr(torch.ops.aten, base)
    return getattr(packet, overload or "default")


def register(*names):
    """Decorator: the handler implements every aten overload named."""
    def wrap(fn):
        for name in names:
            IMPLS[_overload(name)] = fn
        return fn
    return wrap


class _Counts:
    """Per aten operator: calls run on tritonad, calls that fell back to PyTorch."""

    def __init__(self):
        self.ours: dict = {}
        self.theirs: dict = {}
        self.noted: set = set()


COUNTS = _Counts()
_lock = threading.Lock()


def _devices_ok(args, kwargs, cpu_ok):
    """True when every tensor argument is on a device tritonad runs: cuda, or cpu under the
    interpreter. Tensors nested one level in lists (cat, foreach ops) count too."""
    for group in (args, kwargs.values()):
        for a in group:
            items = a if isinstance(a, (list, tuple)) else (a,)
            for t in items:
                if isinstance(t, torch.Tensor):
                    kind = t.device.type
                    if kind != "cuda" and not (cpu_ok and kind == "cpu"):
                        return False
    return True


def describe(args, kwargs) -> str:
    """The argument types of a call, for the strict error and the fallback note."""
    def one(a):
        if isinstance(a, torch.Tensor):
            return f"{str(a.dtype).removeprefix('torch.')}{list(a.shape)}@{a.device.type}"
        if isinstance(a, (list, tuple)):
            return "[" + ", ".join(one(x) for x in a[:4]) + (", ..." if len(a) > 4 else "") + "]"
        return type(a).__name__
    parts = [one(a) for a in args] + [f"{k}={one(v)}" for k, v in kwargs.items()]
    return ", ".join(parts)


class _Mode(TorchDispatchMode):
    def __init__(self, table, strict, cpu_ok, note):
        super().__init__()
        self.table, self.strict, self.cpu_ok, self.note = table, strict, cpu_ok, note

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if not _devices_ok(args, kwargs, self.cpu_ok):
            return func(*args, **kwargs)     # not ours to run (cpu data loading on a GPU machine)
        impl = self.table.get(func)
        why = "no tritonad kernel"
        if impl is not None:
            try:
                out = impl(*args, **kwargs)
            except Fallback as e:
                why = str(e) or "a case tritonad does not cover"
            else:
                COUNTS.ours[func] = COUNTS.ours.get(func, 0) + 1
                return out
        if self.strict:
            raise NotImplementedError(
                f"torch_backend (strict): aten::{func._opname}.{func._overloadname} fell back to "
                f"PyTorch ({why}) for ({describe(args, kwargs)})")
        COUNTS.theirs[func] = COUNTS.theirs.get(func, 0) + 1
        if self.note and func not in COUNTS.noted:
            with _lock:
                COUNTS.noted.add(func)
        return func(*args, **kwargs)
