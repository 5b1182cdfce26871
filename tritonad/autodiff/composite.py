"""Composite ops: written once as Python over Tensor ops, so their gradient comes from their
parts; a faster implementation may be registered beside, never instead.

    @composite
    def log_softmax(x, dim):
        m = x.detach().amax(dim, keepdim=True)   # (no gradient flows through the shift)
        z = x - where(isfinite(m), m, 0.0)
        return z - z.exp().sum(dim, keepdim=True).log()

    @log_softmax.fused("log_softmax")
    def _(x, dim):
        return LogSoftmax.apply(x, dim)        # one kernel each way, its own backward

A call runs the fused implementation when the backend of its tensors implements the named
primitive (the triton backend's kernels), and the composite otherwise (the numpy backend runs
the composite: fused steps need no numpy twin). The composite stays the fused form's test
oracle: `op.composed(*args)` runs it on any backend.
"""
from __future__ import annotations

from ..backend import Backend, backend_of
from ..tensor import Tensor
from . import autocast


def implements(backend, primitive):
    """True when `backend` has its own implementation of `primitive` (not Backend's default)."""
    mine = getattr(type(backend), primitive, None)
    return mine is not None and mine is not getattr(Backend, primitive, None)


class Composite:
    """A composite op (see the module docstring)."""

    def __init__(self, fn):
        self.composed = fn
        self.name = fn.__name__
        self.__name__ = self.__qualname__ = fn.__name__
        self.__doc__ = fn.__doc__
        self.fast = None          # (primitive, implementation) or None
        self.float32 = fn.__name__ in autocast.FLOAT32_OPS  # under autocast: float32 inputs
        self._decided = {}        # backend type -> use the fast implementation

    def fused(self, primitive):
        """Register the decorated function as the faster implementation, used on backends
        that implement `primitive`."""
        def register(fn):
            self.fast = (primitive, fn)
            self._decided.clear()
            return fn
        return register

    def __call__(self, *args, **kwargs):
        if self.float32 and autocast.state.dtype:
            args = [autocast.float32(a) if isinstance(a, Tensor) else a for a in args]
        fast = self.fast
        if fast is not None:
            x = next((a for a in args if isinstance(a, Tensor)), None)
            if x is not None:
                backend = backend_of(x._data)
                use = self._decided.get(type(backend))
                if use is None:
                    use = self._decided[type(backend)] = implements(backend, fast[0])
                if use:
                    return fast[1](*args, **kwargs)
        return self.composed(*args, **kwargs)

    def __repr__(self):
        return f"<composite op {self.name}>"


def composite(fn):
    """Make fn a Composite (see the module docstring)."""
    return Composite(fn)
