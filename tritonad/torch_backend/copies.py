"""Handlers: copies, casts and fills (copy_, _to_copy, clone, fill_, zero_, zeros/ones/full and
their _like forms, cat, stack, masked_fill) on tritonad's strided copy kernel
(kernels/elementwise.py: any strides in, any strides out, a cast on the way).

Allocation is torch's (empty, empty_like: the one thing torch does for us); every value written
is our kernel's. A copy between devices is a transfer, not a kernel: it passes through to
PyTorch uncounted. `_to_copy` and `clone` keep the input's layout where PyTorch does
(memory_format=preserve_format: a dense input's strides, channels-last included).
"""
from __future__ import annotations

import torch

from .. import dtypes
from .elementwise import (STRIDED, B, _overlaps, broadcast, check, host_scalars, self_overlaps,
                          write_into)
from .registry import Fallback, Passthrough, register


def _fill(out, value):
    """out[...] = value: a Python number, or a 0-d tensor read on the device (no host sync)."""
    if out.numel():
        if isinstance(value, torch.Tensor):
            B.copy_(out, value)
        else:
            B.fill_(out, value)
    return out


@register("aten::copy_.default")
def copy_(self, src, non_blocking=False):
    check(self, src)
    if src.device != self.device:
        raise Passthrough()           # a transfer between devices
    if self_overlaps(self):
        raise Fallback("copy into a broadcast tensor")
    if self.numel() == 0:
        return self
    if _overlaps(self, src):
        src = B.contiguous(src)
    B.copy_(self, src)
    return self


def _elsewhere(device, here):
    """Whether `device` names another device than `here` ("cuda" names the current one)."""
    return device.type != here.type or (device.index is not None and device.index != here.index)


def _like(x, dtype=None, memory_format=None, device=None):
    """A new tensor shaped as x, as PyTorch's _like factories lay it out."""
    if memory_format is None:   # preserve_format: a dense input's strides
        return torch.empty_like(x, dtype=dtype, device=device)
    return torch.empty_like(x, dtype=dtype, device=device, memory_format=memory_format)


@register("aten::_to_copy.default")
def _to_copy(x, *, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False,
             memory_format=None):
    if device is not None and _elsewhere(torch.device(device), x.device):
        raise Passthrough()           # a transfer between devices
    check(x)
    if (layout is not None and layout is not STRIDED) or pin_memory:
        raise Fallback("a layout or pinned memory")
    if dtype is not None and dtype not in dtypes._BY_TORCH:
        raise Fallback(f"a cast to {dtype}")
    out = _like(x, dtype, memory_format)
    return _fill(out, x) if out.numel() else out


@register("aten::clone.default", "aten::clone.out")
def clone(x, *, memory_format=None, out=None):
    check(x, out)
    if out is not None:
        return write_into(out, x)
    result = _like(x, None, memory_format)
    return _fill(result, x) if result.numel() else result


@register("aten::fill_.Scalar", "aten::fill_.Tensor")
def fill_(self, value):
    check(self, value)
    if isinstance(value, torch.Tensor) and value.dim() != 0:
        raise Fallback("fill_ with a tensor of dimensions")  # PyTorch's error
    if isinstance(value, torch.Tensor) and value.device != self.device:
        (value,) = host_scalars(value)
        if isinstance(value, torch.Tensor):
            raise Fallback("fill_ from another device")
    if self_overlaps(self):
        raise Fallback("fill of a broadcast tensor")
    return _fill(self, value)


@register("aten::fill.Scalar", "aten::fill.Tensor")
def fill(x, value):
    check(x, value)
    return fill_(_like(x), value)


@register("aten::zero_.default")
def zero_(self):
    check(self)
    if self_overlaps(self):
        raise Fallback("fill of a broadcast tensor")
    return _fill(self, 0)


def _like_factory(value_of):
    def handler(x, *args, dtype=None, layout=None, device=None, pin_memory=None,
                memory_format=None):
        check(x)
        if (layout is not None and layout is not STRIDED) or pin_memory:
            raise Fallback("a layout or pinned memory")
        if dtype is not None and dtype not in dtypes._BY_TORCH:
            raise Fallback(f"dtype {dtype}")
        return _fill(_like(x, dtype, memory_format, device), value_of(*args))
    return handler


register("aten::zeros_like.default")(_like_factory(lambda: 0))
register("aten::ones_like.default")(_like_factory(lambda: 1))
register("aten::full_like.default")(_like_factory(lambda value: value))


def _factory(value_of):
    def handler(size, *args, dtype=None, layout=None, device=None, pin_memory=None):
        if (layout is not None and layout is not STRIDED) or pin_memory:
            raise Fallback("a layout or pinned memory")
        value = value_of(*args)
        check(value)
        if dtype is None and not isinstance(value, float):   # full(size, 3) is int64
            dtype = torch.bool if isinstance(value, bool) else \
                torch.int64 if isinstance(value, int) else None
        if dtype is not None and dtype not in dtypes._BY_TORCH:
            raise Fallback(f"dtype {dtype}")
        out = torch.empty(size, dtype=dtype, device=device)
        return _fill(out, value)
    return handler


register("aten::zeros.default")(_factory(lambda: 0.0))
register("aten::ones.default")(_factory(lambda: 1.0))
register("aten::full.default")(_factory(lambda value: value))


# ------------------------------------------------------------------------------ cat and stack

def _cat(tensors, dim, out=None):
    check(out, *tensors)
    # PyTorch skips 1-d empty tensors (legacy), whatever the other shapes
    parts = [t for t in tensors if not (t.dim() == 1 and t.shape[0] == 0)]
    if not parts:
        if not tensors:
            raise Fallback("cat of nothing")
        parts = tensors[:1]
    first = parts[0]
    if first.dim() == 0 or not -first.dim() <= dim < first.dim():
        raise Fallback("cat of 0-d tensors or dim out of range")
    dim %= first.dim()
    shape = list(first.shape)
    for t in parts[1:]:
        if t.dim() != first.dim() or any(a != b for i, (a, b) in
                                         enumerate(zip(t.shape, first.shape)) if i != dim):
            raise Fallback("cat of mismatched shapes")   # PyTorch's error
        if t.device != first.device:
            raise Fallback("cat across devices")
    shape[dim] = sum(t.shape[dim] for t in parts)
    dtype = dtypes.result_type(*[t if t.dim() else t.reshape(1) for t in parts]).torch
    result = torch.empty(shape, dtype=dtype, device=first.device)
    offset = 0
    for t in parts:
        n = t.shape[dim]
        if n and t.numel():
            B.copy_(result.narrow(dim, offset, n), t)
        offset += n
    return result if out is None else write_into(out, result)


@register("aten::cat.default", "aten::cat.out")
def cat(tensors, dim=0, *, out=None):
    return _cat(list(tensors), dim, out)


@register("aten::stack.default", "aten::stack.out")
def stack(tensors, dim=0, *, out=None):
    tensors = list(tensors)
    if not tensors or any(t.shape != tensors[0].shape for t in tensors):
        raise Fallback("stack of mismatched shapes")
    rank = tensors[0].dim() + 1
    if not -rank <= dim < rank:
        raise Fallback("dim out of range")
    dim %= rank
    return _cat([t.unsqueeze(dim) for t in tensors], dim, out)


# ------------------------------------------------------------------------------ masked_fill

def _masked_fill(self, mask, value, out):
    """out[...] = where(mask, value, self), value cast to self's type."""
    check(self, mask, value)
    if mask.dtype is not torch.bool:
        raise Fallback(f"masked_fill with a {mask.dtype} mask")
    if isinstance(value, torch.Tensor):
        if value.dim() != 0:
            raise Fallback("masked_fill with a tensor of dimensions")
        (value,) = host_scalars(value) if value.device != self.device else (value,)
        if isinstance(value, torch.Tensor) and value.device != self.device:
            raise Fallback("masked_fill from another device")
    if self.numel():
        B.where(mask, value, self, out=out)
    return out


@register("aten::masked_fill.Scalar", "aten::masked_fill.Tensor")
def masked_fill(self, mask, value):
    shape = broadcast(self, mask)
    if tuple(shape) != tuple(self.shape):
        raise Fallback("masked_fill with a mask that broadcasts self")
    return _masked_fill(self, mask, value, torch.empty(self.shape, dtype=self.dtype,
                                                       device=self.device))


@register("aten::masked_fill_.Scalar", "aten::masked_fill_.Tensor")
def masked_fill_(self, mask, value):
    if self_overlaps(self) or _overlaps(self, mask):
        raise Fallback("masked_fill_ into a broadcast or overlapping tensor")
    shape = broadcast(self, mask)
    if tuple(shape) != tuple(self.shape):
        raise Fallback("masked_fill_ with a mask that broadcasts self")
    return _masked_fill(self, mask, value, self)


# ------------------------------------------------------------------------------ more factories

def _check_factory(dtype, layout, pin_memory):
    if (layout is not None and layout is not STRIDED) or pin_memory:
        raise Fallback("a layout or pinned memory")
    if dtype is not None and dtype not in dtypes._BY_TORCH:
        raise Fallback(f"dtype {dtype}")


@register("aten::arange.default", "aten::arange.start", "aten::arange.start_step")
def arange(*numbers, dtype=None, layout=None, device=None, pin_memory=None):
    """[start, end) by step: int64 when every number is an integer, else the default float."""
    _check_factory(dtype, layout, pin_memory)
    start, end, step = (0, numbers[0], 1) if len(numbers) == 1 else \
        (numbers[0], numbers[1], numbers[2] if len(numbers) > 2 else 1)
    if any(not isinstance(v, (int, float)) or isinstance(v, bool) for v in (start, end, step)):
        raise Fallback("arange of other numbers")
    if step == 0 or (end - start) * step < 0:
        raise Fallback("arange with a step of the wrong sign")   # PyTorch's error
    integral = all(isinstance(v, int) for v in (start, end, step))
    if dtype is None:
        dtype = torch.int64 if integral else torch.empty(0).dtype
    if not integral and dtype not in (torch.float32, torch.float64):
        raise Fallback("a float arange of another type")  # PyTorch counts in the target type
    if device is None:
        device = torch.empty(0).device
    return B.arange(start, end, step, dtypes.get_dtype(dtype), device)


@register("aten::arange.start_out", "aten::arange.out")
def arange_out(*numbers, out):
    check(out)
    return write_into(out, arange(*numbers, dtype=out.dtype, device=out.device))


@register("aten::scalar_tensor.default")
def scalar_tensor(value, *, dtype=None, layout=None, device=None, pin_memory=None):
    _check_factory(dtype, layout, pin_memory)
    check(value)
    return _fill(torch.empty((), dtype=dtype, device=device), value)


def _new_factory(value_of):
    def handler(x, size, *args, dtype=None, layout=None, device=None, pin_memory=None):
        check(x)
        _check_factory(dtype, layout, pin_memory)
        out = torch.empty(size, dtype=dtype or x.dtype, device=device or x.device)
        return _fill(out, value_of(*args))
    return handler


register("aten::new_zeros.default")(_new_factory(lambda: 0))
register("aten::new_ones.default")(_new_factory(lambda: 1))
register("aten::new_full.default")(_new_factory(lambda value: value))


@register("aten::eye.default", "aten::eye.m")
def eye(n, m=None, *, dtype=None, layout=None, device=None, pin_memory=None):
    """Zeros, then ones written through the diagonal's view (stride m + 1)."""
    _check_factory(dtype, layout, pin_memory)
    m = n if m is None else m
    out = _fill(torch.empty((n, m), dtype=dtype, device=device), 0)
    k = min(n, m)
    if k:
        _fill(out.as_strided((k,), (m + 1,)), 1)
    return out


@register("aten::repeat.default")
def repeat(x, repeats):
    """out[i * d + j] = x[j] per dim: x viewed as (1, d0, 1, d1, ...), broadcast to
    (r0, d0, r1, d1, ...) and copied once."""
    check(x)
    repeats = list(repeats)
    if len(repeats) < x.dim():
        raise Fallback("fewer repeats than dims")   # PyTorch's error
    shape = [1] * (len(repeats) - x.dim()) + list(x.shape)
    paired = [v for d in shape for v in (1, d)]
    expanded = [v for r, d in zip(repeats, shape) for v in (r, d)]
    out = torch.empty(expanded, dtype=x.dtype, device=x.device)
    if out.numel():
        B.copy_(out, x.reshape(paired).expand(expanded))
    return out.reshape([r * d for r, d in zip(repeats, shape)])


# ------------------------------------------------------------------------------ tril and triu

def _triangle(x, diagonal, lower):
    """where(keep, x, 0) with keep = (j - i <= diagonal) for tril, (j - i >= diagonal) for
    triu over the last two dims: the offsets j - i from two aranges (broadcast [M, 1], [1, N]),
    one compare, one where."""
    check(x)
    if x.dim() < 2:
        raise Fallback("tril/triu of fewer than 2 dims")   # PyTorch's error
    m, n = x.shape[-2], x.shape[-1]
    rows = B.arange(0, m, 1, dtypes.int64, x.device).reshape(m, 1)
    cols = B.arange(0, n, 1, dtypes.int64, x.device).reshape(1, n)
    offsets = B.sub(cols, rows)
    keep = B.le(offsets, diagonal) if lower else B.ge(offsets, diagonal)
    zero = False if x.dtype is torch.bool else 0
    return keep, zero


def _tri_handler(lower):
    def handler(x, diagonal=0, *, out=None):
        check(out)
        if x.numel() == 0:
            result = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        else:
            keep, zero = _triangle(x, diagonal, lower)
            result = B.where(keep, x, zero)
            if result.dtype != x.dtype:
                result = B.cast(result, dtypes.get_dtype(x.dtype))
        return result if out is None else write_into(out, result)
    return handler


def _tri_inplace(lower):
    def handler(self, diagonal=0):
        if self_overlaps(self):
            raise Fallback("tril_/triu_ of a broadcast tensor")
        if self.numel():
            keep, zero = _triangle(self, diagonal, lower)
            B.where(keep, self, zero, out=self)
        return self
    return handler


register("aten::tril.default", "aten::tril.out")(_tri_handler(True))
register("aten::triu.default", "aten::triu.out")(_tri_handler(False))
register("aten::tril_.default")(_tri_inplace(True))
register("aten::triu_.default")(_tri_inplace(False))
