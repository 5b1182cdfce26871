"""The numpy backend's elementwise primitives: every entry of the elementwise table
(tritonad/elementwise.py) and its derivatives, each formula evaluated with numpy (the vocabulary
of tritonad/npmath.py) on the operands widened to the compute type, rounded once to the result's
type; then the few ops outside the table (fills, copies, arange, clamp by numbers, pow)."""
from __future__ import annotations

import types

import numpy as np
import torch

from .. import dtypes, npmath
from .. import elementwise as table
from .arrays import compute_dtype, to_numpy

# a formula's names: npmath's vocabulary and the table's constants
_NAMESPACE = {name: value for name, value in vars(npmath).items() if not name.startswith("__")}
_NAMESPACE.update(table.CONSTANTS)
_FORMS = {}  # formula -> its function bound to _NAMESPACE


def bound(formula):
    """formula's function with its names looked up in numpy's vocabulary."""
    fn = _FORMS.get(formula)
    if fn is None:
        fn = _FORMS[formula] = types.FunctionType(formula.fn.__code__, _NAMESPACE,
                                                  formula.fn.__name__, formula.fn.__defaults__)
    return fn


class ElementwiseOps:
    """Mixed into NumpyBackend (reference/__init__.py), whose _out and _new these call."""

    def elementwise(self, formula, *operands, out=None):
        """Any entry or derivative of the table, by its formula in numpy."""
        if not any(isinstance(x, torch.Tensor) for x in operands):
            raise TypeError(f"{formula.name}: expected at least one array operand")
        deciding = operands[1 if formula.condition else 0:
                            len(getattr(formula, "operands", ())) or formula.arity]
        promoted = dtypes.result_type(*deciding)
        if formula.result == "bool":
            dtype, compute = dtypes.bool_, promoted
        else:
            dtype = promoted
            if formula.result == "float" and not dtype.is_floating_point:
                dtype = dtypes.default_float
            compute = dtype
        numpy_type = compute_dtype(compute) if compute.is_floating_point else compute.numpy
        values = []
        for i, x in enumerate(operands):
            if isinstance(x, torch.Tensor):
                v = np.asarray(to_numpy(x))
                v = v.astype(bool if i == 0 and formula.condition else numpy_type, copy=False)
            elif isinstance(x, float) and not compute.is_floating_point and \
                    compute is not dtypes.bool_:
                # a number parameter on integers: in their type, as the kernel takes it and
                # PyTorch does (addcmul of ints with value=0.5 adds 0)
                v = np.dtype(numpy_type).type(x)
            else:
                v = x
            values.append(v)
        with np.errstate(all="ignore"):
            result = np.asarray(bound(formula)(*values))
        shape = np.broadcast_shapes(*(np.shape(v) for v in values))
        return self._out(np.broadcast_to(result, shape), dtype, out)

    def pow_scalar(self, x, exponent, out=None):
        return self.pow(x, exponent, out)

    def pow(self, a, b, out=None):
        dtype = dtypes.result_type(a, b)
        numpy_type = compute_dtype(dtype) if dtype.is_floating_point else dtype.numpy
        va, vb = (np.asarray(to_numpy(v)).astype(numpy_type, copy=False) for v in (a, b))
        with np.errstate(all="ignore"):
            return self._out(np.power(va, vb), dtype, out)

    def clamp(self, x, min=None, max=None, out=None):
        dtype = dtypes.get_dtype(x.dtype)
        v = to_numpy(x)
        if min is not None:
            v = np.where(v < min, np.asarray(min).astype(v.dtype), v)
        if max is not None:
            v = np.where(v > max, np.asarray(max).astype(v.dtype), v)
        return self._out(v, dtype, out)
