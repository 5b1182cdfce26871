"""The activation modules, one per entry of the elementwise table that names one
(`module="SiLU"` in tritonad/elementwise.py): `nn.SiLU()`, `nn.LeakyReLU(0.2)`.

A module takes the entry's numbers as constructor arguments with PyTorch's names and defaults,
and `inplace` as PyTorch's modules do; the result is computed out of place either way (the same
values; tritonad keeps no aliasing contract for activations).
"""
from __future__ import annotations

from .. import elementwise as table
from ..autodiff import elementwise as functions
from .module import Module

_INPLACE = {"ReLU", "LeakyReLU", "ELU", "Hardtanh", "ReLU6", "SiLU", "Hardswish", "Mish"}


def _module(op):
    params = dict(op.params)
    accepts_inplace = op.module in _INPLACE

    def __init__(self, *args, inplace=False, **kwargs):
        Module.__init__(self)
        names = list(params)
        if len(args) > len(names):
            raise TypeError(f"{op.module}() takes {len(names)} number arguments "
                            f"({', '.join(names) or 'none'}), got {len(args)}")
        values = dict(params)
        values.update(zip(names, args))
        for name, value in kwargs.items():
            if name not in params:
                raise TypeError(f"{op.module}() got an unexpected argument {name!r}")
            values[name] = value
        for name, value in values.items():
            setattr(self, name, value)
        if inplace and not accepts_inplace:
            raise TypeError(f"{op.module}() takes no inplace argument")
        self.inplace = inplace

    def forward(self, input):
        return op.public(input, *(getattr(self, name) for name in params))

    def extra_repr(self):
        return ", ".join(f"{name}={getattr(self, name)}" for name in params)

    return type(op.module, (Module,), {
        "__init__": __init__, "forward": forward, "extra_repr": extra_repr,
        "__doc__": f"nn.{op.module}: elementwise {op.doc}", "__module__": __name__})


MODULES = {op.module: _module(op) for op in table.OPS.values() if op.module}
globals().update(MODULES)


class GELU(Module):
    """nn.GELU(approximate='none'): x Phi(x), or its tanh form with approximate='tanh'."""

    def __init__(self, approximate="none"):
        super().__init__()
        if approximate not in ("none", "tanh"):
            raise ValueError(f"GELU: approximate must be 'none' or 'tanh', got {approximate!r}")
        self.approximate = approximate

    def forward(self, input):
        return functions.gelu(input, self.approximate)

    def extra_repr(self):
        return f"approximate={self.approximate!r}"


MODULES["GELU"] = GELU
__all__ = sorted(MODULES)
