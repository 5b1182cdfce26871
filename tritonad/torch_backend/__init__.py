"""tritonad as a PyTorch backend: PyTorch's aten operators on CUDA tensors run tritonad's kernels.

    import tritonad.torch_backend as tb
    tb.enable()                 # or: with tb.use(): ...
    model(x).sum().backward()   # PyTorch's autograd, modules and optimizers; tritonad's kernels
    print(tb.coverage())        # per aten operator: calls on tritonad, calls that fell back

PyTorch's autograd stays as it is: the mode sits below it, so both the forward operators and the
backward operators autograd calls arrive here. See registry.py for how a handler is written,
and docs/DESIGN.md section 12. `registered()` lists the aten overloads with a handler; an
operator without one (or a case its handler does not cover) runs PyTorch's kernel, counted in
`coverage()` and listed once on stderr at `disable()`; `strict=True` raises there instead.
Views, metadata and allocation compute nothing and always pass through, uncounted.
"""
from __future__ import annotations

import atexit
import contextlib
import importlib
import os

from torch.utils._python_dispatch import _pop_mode, _push_mode

from . import registry
from .registry import COUNTS, IMPLS, Fallback, Passthrough, register

__all__ = ["enable", "disable", "use", "coverage", "reset_coverage", "registered", "register",
           "Fallback", "Passthrough"]

_active: list = []


def _load_handlers():
    """Import the modules whose handlers fill registry.IMPLS (each registers at import)."""
    importlib.import_module(".ops", __name__)


def _cpu_ok() -> bool:
    importlib.import_module("tritonad")  # sets TRITON_INTERPRET where there is no GPU
    return os.environ.get("TRITON_INTERPRET") == "1"


def _table(include, exclude):
    _load_handlers()
    table = dict(IMPLS)
    def names(ops):
        return {registry._overload(o) for o in ops}
    def matches(op, chosen):
        return op in chosen or op._overloadpacket in {c._overloadpacket for c in chosen}
    if include is not None:
        chosen = names(include)
        table = {op: fn for op, fn in table.items() if matches(op, chosen)}
    if exclude is not None:
        chosen = names(exclude)
        table = {op: fn for op, fn in table.items() if not matches(op, chosen)}
    return table


def enable(include=None, exclude=None, strict=False, *, note=True):
    """Run aten operators on tritonad's kernels in this thread (and in autograd's backward) until
    `disable()`. `include`/`exclude`: aten names ("add.Tensor", or "add" for every overload) to
    take or leave. `strict=True` raises at the first operator that would fall back to PyTorch.
    `note=False` silences the note of fallbacks printed at `disable()` (or at exit)."""
    mode = registry._Mode(_table(include, exclude), strict, _cpu_ok(), note=note)
    _push_mode(mode)
    _active.append(mode)
    return mode


def disable():
    """Undo the latest `enable()`, and print the note of the operators that fell back."""
    if not _active:
        return
    mode = _active.pop()
    _pop_mode()
    mode.print_note()


@atexit.register
def _note_at_exit():
    for mode in reversed(_active):   # modes still enabled when the interpreter ends
        mode.print_note()


@contextlib.contextmanager
def use(include=None, exclude=None, strict=False, *, note=True):
    """`with use(): ...` runs the block on tritonad's kernels."""
    enable(include, exclude, strict, note=note)
    try:
        yield
    finally:
        disable()


def coverage() -> dict:
    """{"aten::name.overload": {"tritonad": calls, "pytorch": calls}} for every operator that
    computed since the last reset (views, metadata and allocation are not listed: see
    registry.py)."""
    out = {}
    for counts, key in ((COUNTS.ours, "tritonad"), (COUNTS.theirs, "pytorch")):
        for op, n in list(counts.items()):
            out.setdefault(registry.name_of(op), {"tritonad": 0, "pytorch": 0})[key] += n
    return dict(sorted(out.items()))


def registered() -> list:
    """The names of the aten operators (overloads) tritonad implements, sorted."""
    _load_handlers()
    return sorted(registry.name_of(op) for op in IMPLS)


def reset_coverage() -> None:
    """Forget the counts of coverage() and which operators the fallback note has listed."""
    COUNTS.reset()
