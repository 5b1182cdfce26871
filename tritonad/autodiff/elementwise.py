"""The autodiff rules of the elementwise table (tritonad/elementwise.py), made from its entries.

For an entry `op` this module makes `Op.function`, a Function whose forward is the backend's
primitive of the same name, and whose backward evaluates the entry's derivatives:
- as one fused kernel each (`backend.elementwise(derivative, ...)`) when no graph of the
  backward is recorded, the common case;
- as Tensor ops when it is (`create_graph=True`): the derivative's formula with its vocabulary
  bound to this table's own differentiable functions, so every order of gradient exists.
It saves only what the derivatives of the inputs that need a gradient read (x, y or both).

The public function of each entry (`exp(x)`, `leaky_relu(x, negative_slope=0.01)`) takes the
entry's operands and then its numbers, by position or by name, as PyTorch's function of the
same name does.
"""
from __future__ import annotations

import inspect
import numbers
import types

import torch

from .. import elementwise as table
from ..backend import Backend, _state, backend_of
from . import autocast
from .grad_mode import grad_mode
from ..tensor import Tensor, tensor
from .function import Function


def _raw_backend(raw):
    be = _state.cuda if raw.is_cuda else _state.cpu
    return be if be is not None else backend_of(raw)


class ElementwiseFunction(Function):
    """The Function of one table entry (subclassed per entry, `op` set)."""

    op = None

    @classmethod
    def forward(cls, ctx, *args):
        op = cls.op
        be = _state.current
        y = be.elementwise(op, *args)
        needs = ctx.needs_input_grad
        if needs:
            kinds = tuple(isinstance(a, torch.Tensor) for a in args)
            saved = cls._saves.get((needs, kinds))
            if saved is None:  # (once per combination of needs and of array operands)
                saved = cls._saves[needs, kinds] = _saved_names(op, needs, kinds)
            ctx.save_for_backward(*(y if n == "y" else args[op.names.index(n)] for n in saved))
            ctx.saved_names = saved
            ctx.numbers = {n: a for n, a, k in zip(op.names, args, kinds) if not k}
        return y

    @classmethod
    def backward(cls, ctx, dy):
        op = cls.op
        values = dict(zip(ctx.saved_names, ctx.saved))
        values.update(ctx.numbers)
        values["dy"] = dy
        graph = grad_mode.enabled  # create_graph: the backward is recorded, in Tensor ops
        grads = []
        for name, need in zip(op.operands, ctx.needs_input_grad):
            if not need:
                grads.append(None)
                continue
            derivative = op.derivatives[name]
            if derivative.identity:
                grads.append(dy)
                continue
            args = [values[n] for n in derivative.reads]
            if graph:
                grads.append(tensor_form(derivative)(*args))
            else:
                raws = [a._data if isinstance(a, Tensor) else a for a in args]
                grads.append(Tensor._wrap(_raw_backend(dy._data).elementwise(derivative, *raws),
                                          False, None, 0, None))
        return tuple(grads) + (None,) * len(op.params)


def _saved_names(op, needs, kinds):
    """What forward saves: the arrays and y that the derivatives of the needed inputs read."""
    reads = set()
    for name, need in zip(op.operands, needs):
        if need:
            reads.update(op.derivatives[name].reads)
    arrays = {n for n, k in zip(op.names, kinds) if k} | {"y"}
    return tuple(n for n in op.names + ("y",) if n in reads and n in arrays)


class _NotDifferentiable(Function):
    """The Function of an entry without derivatives (comparisons, logical ops): bool results."""

    op = None

    @classmethod
    def forward(cls, ctx, *args):
        return _state.current.elementwise(cls.op, *args)


# ------------------------------------------------------------------ derivatives as Tensor ops

_TENSOR_NAMESPACE = {}
_TENSOR_FORMS = {}


def tensor_form(formula):
    """formula's function over Tensors: its vocabulary bound to the table's functions."""
    fn = _TENSOR_FORMS.get(formula)
    if fn is None:
        if not _TENSOR_NAMESPACE:
            from ..tensor import zeros_like
            functions = {op.name: op.public for op in table.OPS.values()}
            _TENSOR_NAMESPACE.update(functions, **table.CONSTANTS)
            _TENSOR_NAMESPACE.update(fabs=functions["abs"], rint=functions["round"],
                                     zeros_like=zeros_like)
        fn = _TENSOR_FORMS[formula] = types.FunctionType(
            formula.fn.__code__, _TENSOR_NAMESPACE, formula.name, formula.fn.__defaults__)
    return fn


# ------------------------------------------------------------------ the public functions

def _as_operand(x, like):
    """Tensors and numbers pass; sequences and arrays become tensors on like's device."""
    if isinstance(x, (Tensor, numbers.Number)) or like is None:
        return x
    return tensor(x, device=like.device)


def _broadcast_check(op, operands):
    shapes = [tuple(x.shape) for x in operands if isinstance(x, Tensor)]
    rank = max((len(s) for s in shapes), default=0)
    for axis in range(-rank, 0):
        sizes = {s[axis] for s in shapes if len(s) >= -axis} - {1}
        if len(sizes) > 1:
            raise ValueError(f"{op.name}: shapes {' and '.join(str(s) for s in shapes)} cannot "
                             "be broadcast together")


def _public(op, function):
    """The user-facing function of an entry, with the entry's signature."""
    signature = inspect.signature(op.fn)
    n_operands = len(op.operands)

    in_float32 = op.name in autocast.FLOAT32_OPS  # (exp, log, ...: float32 under autocast)
    if op.arity == 1:  # exp(x): straight to Function.apply
        apply, casts = function.apply, autocast.state

        def public(x):
            if not isinstance(x, Tensor):
                raise TypeError(f"{op.name}: expected a tensor, got {type(x).__name__}")
            if in_float32 and casts.dtype:
                x = autocast.float32(x)
            return apply(x)
    else:
        def public(*args, **kwargs):
            try:
                bound = signature.bind(*args, **kwargs)
            except TypeError as err:
                raise TypeError(f"{op.name}{signature}: {err}") from None
            bound.apply_defaults()
            values = list(bound.arguments.values())
            operands = values[:n_operands]
            like = next((x for x in operands if isinstance(x, Tensor)), None)
            if like is None:
                raise TypeError(f"{op.name}: expected at least one tensor operand")
            operands = [_as_operand(x, like) for x in operands]
            if op.condition and operands[0].dtype.name != "bool":
                raise TypeError(f"{op.name}: the condition must be a bool tensor, got "
                                f"{operands[0].dtype}")
            for name, value in zip(op.params, values[n_operands:]):
                if not isinstance(value, numbers.Number) or isinstance(value, bool):
                    raise TypeError(f"{op.name}: {name} must be a number, got "
                                    f"{type(value).__name__}")
            _broadcast_check(op, operands)
            if in_float32 and autocast.state.dtype:
                operands = [autocast.float32(x) for x in operands]
            return function.apply(*operands, *(float(v) for v in values[n_operands:]))

    public.__name__ = public.__qualname__ = op.name
    public.__signature__ = signature
    public.__doc__ = f"{op.name}{signature}: {op.doc}"
    return public


def _make(op):
    op.names = op.operands + tuple(op.params)
    base = ElementwiseFunction if op.derivatives else _NotDifferentiable
    # (an entry registered after import has no primitive of its own name: forward calls
    # backend.elementwise)
    primitive = op.name if hasattr(Backend, op.name) else None
    function = type("".join(p.capitalize() for p in op.name.split("_")), (base,),
                    {"op": op, "primitive": primitive, "__doc__": op.doc, "_saves": {}})
    function.__module__ = __name__
    op.function = function
    op.public = _public(op, function)
    return op.public


FUNCTIONS = {op.name: _make(op) for op in table.OPS.values()}
globals().update(FUNCTIONS)


def clamp_tensor_bounds(x, min=None, max=None):
    """clamp with a tensor bound: clamp_tensor, or maximum / minimum for one bound."""
    if min is not None and max is not None:
        return FUNCTIONS["clamp_tensor"](x, min, max)
    return FUNCTIONS["maximum"](x, min) if max is None else FUNCTIONS["minimum"](x, max)


def gelu(input, approximate="none"):
    """GELU: x Phi(x), or its tanh form with approximate='tanh'."""
    if approximate == "none":
        return FUNCTIONS["gelu"](input)
    if approximate == "tanh":
        return FUNCTIONS["gelu_tanh"](input)
    raise ValueError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")


__all__ = sorted(FUNCTIONS) + ["gelu", "ElementwiseFunction", "tensor_form"]


def _method(public):
    def method(self, *args, **kwargs):
        return public(self, *args, **kwargs)
    method.__name__ = method.__qualname__ = public.__name__
    method.__doc__ = public.__doc__
    return method


def _bool_operator(name, logical):
    def operator(self, other):
        if self.dtype.name != "bool" or (isinstance(other, Tensor) and other.dtype.name != "bool"):
            raise TypeError(f"{name}: tritonad has bitwise operators for bool tensors only (as "
                            f"logical ops), got {self.dtype}")
        return logical(self, other)
    return operator


def install_methods():
    """(Called by autodiff/methods.py.) Tensor methods for the entries that are methods in PyTorch (`x.erf()`, `x.lerp(y, w)`),
    where Tensor does not define its own, and & | ^ on bool tensors."""
    for op in table.OPS.values():
        if op.method and not hasattr(Tensor, op.name):
            setattr(Tensor, op.name, _method(op.public))
    Tensor.__and__ = Tensor.__rand__ = _bool_operator("&", FUNCTIONS["logical_and"])
    Tensor.__or__ = Tensor.__ror__ = _bool_operator("|", FUNCTIONS["logical_or"])
    Tensor.__xor__ = Tensor.__rxor__ = _bool_operator("^", FUNCTIONS["logical_xor"])
