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

Operators that compute nothing pass through to PyTorch, neither counted nor refused by
`strict`: views and metadata (every overload aten marks as a view: view, t, transpose, expand,
as_strided, select, slice, permute, squeeze, unsqueeze, detach, alias, _reshape_alias, ...,
and `_unsafe_view`), allocation without a fill (empty, empty_like, empty_strided, new_empty)
and host reads (`_local_scalar_dense`, `.item()`). A handler raises `Passthrough` for a call
of the same kind (a copy between devices is a transfer, not a kernel).

Devices: CUDA tensors run on the triton backend. CPU tensors run there too when Triton's
interpreter is on (a machine without a GPU, where the test suite runs the same handlers on small
samples); otherwise an operator on CPU tensors is not tritonad's business (a PyTorch program's
data loading on a GPU machine) and passes through, neither counted nor refused by `strict`.
"""
from __future__ import annotations

import sys
import threading

import torch
from torch.utils._python_dispatch import TorchDispatchMode


class Fallback(Exception):
    """Raised by a handler for a case it does not implement: PyTorch's kernel runs instead."""


class Passthrough(Exception):
    """Raised by a handler for a call that is no kernel (a transfer between devices): PyTorch
    runs it, neither counted nor refused by strict mode."""


IMPLS: dict = {}          # OpOverload -> handler
MISSING: list = []        # names given to register() that this PyTorch does not have


def _overload(name):
    """`"aten::add.Tensor"`, `"add.Tensor"`, `"aten::relu"` or an OpOverload -> OpOverload."""
    if not isinstance(name, str):
        return name
    name = name.removeprefix("aten::")
    base, _, overload = name.partition(".")
    packet = getattr(torch.ops.aten, base)
    return getattr(packet, overload or "default")


def register(*names):
    """Decorator: the handler implements every aten overload named. A name whose overload this
    PyTorch lacks is skipped (the overload sets differ a little between versions)."""
    def wrap(fn):
        for name in names:
            try:
                op = _overload(name)
            except AttributeError:
                MISSING.append(name)
                continue
            IMPLS[op] = fn
        return fn
    return wrap


def name_of(op) -> str:
    """"aten::add.Tensor" for an OpOverload."""
    return f"aten::{op._opname}.{op._overloadname}"


# operators that compute nothing and are not marked as views by aten (see the module docstring)
_NOT_KERNELS = ("_unsafe_view.default", "empty.memory_format", "empty_like.default",
                "empty_strided.default", "new_empty.default", "new_empty_strided.default",
                "_local_scalar_dense.default", "is_same_size.default", "resize_.default",
                "set_.source_Storage", "set_.source_Storage_storage_offset",
                "set_.source_Tensor", "record_stream.default", "_pin_memory.default",
                "is_pinned.default", "_has_compatible_shallow_copy_type.default",
                "sym_size.int", "sym_stride.int", "sym_numel.default",
                "sym_storage_offset.default", "dim.default", "size.int", "stride.int",
                "_nested_tensor_size.default", "_make_dep_token.default",
                "_record_function_enter.default", "_record_function_enter_new.default",
                "_record_function_exit.default", "_record_function_exit._RecordFunction",
                # in-place views: they change a tensor's metadata, not its memory
                "as_strided_.default", "squeeze_.default", "squeeze_.dim", "squeeze_.dims",
                "unsqueeze_.default", "transpose_.default", "t_.default", "swapdims_.default",
                "detach_.default")
NOT_KERNELS: set = set()
for _name in _NOT_KERNELS:
    try:
        NOT_KERNELS.add(_overload(_name))
    except AttributeError:
        pass


# host reads: where the device's error flags are read (an index out of range found by a kernel
# is raised there, as tritonad raises it at .item() / .cpu(); kernels/errors.py)
HOST_READS: set = set()
for _name in ("_local_scalar_dense.default", "equal.default", "is_nonzero.default"):
    try:
        HOST_READS.add(_overload(_name))
    except AttributeError:
        pass
check_errors = None      # set by the handlers' modules: check_errors() raises a pending error


def computes(op) -> bool:
    """False for an operator that computes nothing: a view, metadata, allocation, a host read,
    an operator of no tensors at all (the profiler's record_function)."""
    if op in NOT_KERNELS or op.is_view:
        return False
    schema = op._schema
    return any("Tensor" in str(a.type) for a in list(schema.arguments) + list(schema.returns))


class _Counts:
    """Per aten operator: calls run on tritonad (`ours`), calls that fell back to PyTorch
    (`theirs`); `noted`: the operators the fallback note has listed (each once per process).
    The calls on tritonad are counted in one-element lists (`cells`) that the mode's table
    holds beside each handler, so that a call costs one dict lookup."""

    def __init__(self):
        self.cells: dict = {}
        self.theirs: dict = {}
        self.noted: set = set()

    def cell(self, op):
        return self.cells.setdefault(op, [0])

    @property
    def ours(self) -> dict:
        return {op: c[0] for op, c in list(self.cells.items()) if c[0]}

    def reset(self):
        for c in self.cells.values():
            c[0] = 0
        self.theirs.clear()
        self.noted.clear()


COUNTS = _Counts()
_lock = threading.Lock()
_Tensor = torch.Tensor


def _devices_ok(args, kwargs, cpu_ok):
    """True when the call's tensors are on a device tritonad runs: cuda, or cpu under the
    interpreter. The first tensor decides (tensors nested one level in lists count: cat, foreach
    ops), skipping 0-d cpu tensors (a number beside cuda tensors); a call without tensors (a
    factory) is decided by its `device=` (cpu when absent)."""
    for group in (args, kwargs.values()):
        for a in group:
            if isinstance(a, (list, tuple)):
                if not a or not isinstance(a[0], _Tensor):
                    continue
                a = a[0]
            elif not isinstance(a, _Tensor):
                continue
            if a.is_cuda:
                return True
            if not a.is_cpu:
                return False          # meta, or another device
            if cpu_ok:
                return True
            if a.dim() != 0:
                return False
    device = kwargs.get("device")
    if device is None:
        return cpu_ok
    kind = device.type if isinstance(device, torch.device) else torch.device(device).type
    return kind == "cuda" or (cpu_ok and kind == "cpu")


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
    """The dispatch mode: `table` (OpOverload -> handler) for this enable(), `strict` raises at
    a fallback, `cpu_ok` runs cpu tensors (the interpreter), `note` prints the fallback note at
    disable(). `fallbacks`: {OpOverload: calls} that fell back while this mode was on."""

    def __init__(self, table, strict, cpu_ok, note):
        super().__init__()
        self.table = {op: (fn, COUNTS.cell(op)) for op, fn in table.items()}
        self.strict, self.cpu_ok, self.note = strict, cpu_ok, note
        self.fallbacks: dict = {}
        self.reasons: dict = {}
        self.passes: dict = {}   # OpOverload -> whether it computes (cached)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if kwargs is None:
            kwargs = {}
        entry = self.table.get(func)
        if entry is not None:
            if not _devices_ok(args, kwargs, self.cpu_ok):
                return func(*args, **kwargs)   # not ours (cpu data loading on a GPU machine)
            impl, calls = entry
            try:
                out = impl(*args, **kwargs)
            except Fallback as e:
                why = str(e) or "a case tritonad does not cover"
            except Passthrough:
                if check_errors is not None:
                    check_errors()        # a transfer reads the device
                return func(*args, **kwargs)
            else:
                calls[0] += 1
                return out
        else:
            computing = self.passes.get(func)
            if computing is None:
                computing = self.passes[func] = computes(func)
            if not computing or not _devices_ok(args, kwargs, self.cpu_ok):
                if func in HOST_READS and check_errors is not None:
                    check_errors()
                return func(*args, **kwargs)   # a view, metadata, allocation: no kernel
            why = "no tritonad kernel"
        if self.strict:
            raise NotImplementedError(
                f"torch_backend (strict): {name_of(func)} fell back to PyTorch ({why}) for "
                f"({describe(args, kwargs)})")
        with _lock:
            COUNTS.theirs[func] = COUNTS.theirs.get(func, 0) + 1
            self.fallbacks[func] = self.fallbacks.get(func, 0) + 1
            if func not in self.reasons:
                self.reasons[func] = f"{why}: ({describe(args, kwargs)})"
        return func(*args, **kwargs)

    def print_note(self, file=None):
        """The one-time note: the operators that fell back while this mode was on and that no
        earlier note listed, with their counts and the first reason, to stderr."""
        if not self.note:
            return
        with _lock:
            new = {op: n for op, n in self.fallbacks.items() if op not in COUNTS.noted}
            COUNTS.noted.update(new)
        if not new:
            return
        lines = [f"tritonad.torch_backend: {len(new)} aten operator(s) ran on PyTorch's kernels "
                 "(fell back), calls and first reason:"]
        for op, n in sorted(new.items(), key=lambda kv: -kv[1]):
            lines.append(f"  {name_of(op)}: {n}  ({self.reasons.get(op, '')})")
        print("\n".join(lines), file=file or sys.stderr)
