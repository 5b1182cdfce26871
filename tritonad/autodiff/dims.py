"""Shape helpers of the differentiable ops: numpy broadcasting with errors that name the op, and
dims arguments normalised as torch reads them."""
from __future__ import annotations

import builtins


_BROADCASTS = {}  # (shape, shape) -> their broadcast: op calls repeat a few shapes many times


def broadcast_shapes(op, *shapes):
    """numpy broadcasting of shapes, with an error naming the op and the shapes."""
    if len(shapes) == 2:
        known = _BROADCASTS.get(shapes)
        if known is not None:
            return known
        if len(_BROADCASTS) > 4096:
            _BROADCASTS.clear()
        result = _broadcast_shapes(op, shapes)
        _BROADCASTS[shapes] = result
        return result
    return _broadcast_shapes(op, shapes)


def _broadcast_shapes(op, shapes):
    ndim = builtins.max((len(s) for s in shapes), default=0)
    out = []
    for axis in range(-ndim, 0):
        sizes = {s[axis] for s in shapes if len(s) >= -axis} - {1}
        if len(sizes) > 1:
            raise ValueError(f"{op}: shapes {' and '.join(str(tuple(s)) for s in shapes)} cannot "
                             "be broadcast together")
        out.append(sizes.pop() if sizes else 1)
    return tuple(out)


def normalize_dims(op, dims, ndim):
    """None, an int or a sequence of ints -> a sorted tuple of non-negative axes (or None)."""
    if dims is None:
        return None
    if isinstance(dims, int):
        dims = (dims,)
    out = []
    for d in dims:
        n = builtins.max(ndim, 1)
        if not -n <= d < n:
            raise IndexError(f"{op}: dimension {d} is out of range for a tensor of {ndim} dims")
        out.append(d % n)
    if len(set(out)) != len(out):
        raise ValueError(f"{op}: dimension repeated in {tuple(dims)}")
    return tuple(sorted(out)) if ndim else None
