"""numpy views of raw arrays and back, dtype conversion, bit-exact selects, window geometry
and the per-thread workspace: what every module of the numpy backend computes with.

Raw arrays are torch CPU tensors; we compute on numpy views of them. numpy has no bfloat16, so
bfloat16 arrays are widened to float32 on the way in and rounded (to nearest even) on the way out.
"""
from __future__ import annotations

import math
import threading

import numpy as np
import torch

from .. import dtypes
from ..dtypes import DType

# ------------------------------------------------------------------------ numpy <-> raw arrays


def to_numpy(x) -> np.ndarray:
    """A numpy view of raw array x (a float32 copy for bfloat16); numbers pass through."""
    if not isinstance(x, torch.Tensor):
        return x
    if x.dtype == torch.bfloat16:
        bits = x.view(torch.int16).numpy().astype(np.uint16).astype(np.uint32)
        return (bits << 16).view(np.float32)
    return x.numpy()


def _bf16_bits(a: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit patterns (int16), rounding to nearest even; NaN stays NaN."""
    bits = np.ascontiguousarray(a, dtype=np.float32).reshape(np.shape(a)).view(np.uint32)
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1))) >> 16
    rounded = np.where(np.isnan(a), np.uint32(0x7FC0), rounded)
    return rounded.astype(np.uint16).view(np.int16)


def _as_dtype(a, dtype: DType) -> np.ndarray:
    """numpy values converted as a cast to dtype would (float -> int truncates, NaN -> 0)."""
    a = np.asarray(a)
    if dtype is dtypes.bfloat16:
        return a.astype(np.float32)
    if dtype.category == 1 and a.dtype.kind == "f":
        with np.errstate(invalid="ignore"):
            return np.nan_to_num(np.trunc(a)).astype(dtype.numpy)
    if dtype is dtypes.bool_:
        return a != 0
    return a.astype(dtype.numpy, copy=False)  # (callers copy: from_numpy, or write's assignment)


def from_numpy(a, dtype: DType) -> torch.Tensor:
    """A new contiguous raw array holding `a` converted to dtype."""
    a = np.asarray(a)
    if dtype is dtypes.bfloat16:
        return torch.from_numpy(_bf16_bits(a.astype(np.float32)).copy()).view(torch.bfloat16)
    return torch.from_numpy(np.array(_as_dtype(a, dtype), order="C", copy=True))


def write(dst: torch.Tensor, values) -> torch.Tensor:
    """dst[...] = values (broadcast, converted to dst's dtype), in place, any strides."""
    dtype = dtypes.get_dtype(dst.dtype)
    values = np.broadcast_to(np.asarray(values), tuple(dst.shape))
    if dtype is dtypes.bfloat16:
        dst.view(torch.int16).numpy()[...] = _bf16_bits(values.astype(np.float32))
    else:
        dst.numpy()[...] = _as_dtype(values, dtype)
    return dst


def compute_dtype(dtype: DType):
    """numpy type to compute a floating dtype in: float64 stays, everything else float32."""
    return np.float64 if dtype is dtypes.float64 else np.float32


# ------------------------------------------------------------------------ shape helpers


def pool_output_size(size, kernel, stride, padding, dilation, ceil_mode):
    """Output length of a pooling window sweep, with torch's ceil_mode rule (the last window
    must start inside the input or the left padding)."""
    span = size + 2 * padding - dilation * (kernel - 1) - 1
    out = (-(-span // stride) if ceil_mode else span // stride) + 1
    if ceil_mode and (out - 1) * stride >= size + padding:
        out -= 1
    return out


def _taps(kernel, stride, dilation, out_hw):
    """Each kernel offset (i, j), in order, with the row and column slices of a padded plane
    that it reads for all the windows at once: window (p, q) reads row p * sh + i * dh and
    column q * sw + j * dw. Convolution and pooling loop over these (kh * kw strided views,
    no loop over pixels)."""
    (kh, kw), (sh, sw), (dh, dw), (ho, wo) = kernel, stride, dilation, out_hw
    for i in range(kh):
        rows = slice(i * dh, i * dh + sh * (ho - 1) + 1, sh)
        for j in range(kw):
            yield i, j, rows, slice(j * dw, j * dw + sw * (wo - 1) + 1, sw)


def _padded(v, padding, fill, extra=(0, 0)):
    """v [N, C, H, W] surrounded by `fill` (padding on each side, `extra` more at the bottom
    and right), or v itself (no copy) when there is nothing to add."""
    if not any(padding) and not any(extra):
        return v
    (ph, pw), (eh, ew) = padding, extra
    n, c, h, w = v.shape
    out = np.full((n, c, h + 2 * ph + eh, w + 2 * pw + ew), fill, v.dtype)
    out[:, :, ph:ph + h, pw:pw + w] = v
    return out


def _select(take, a, b=None):
    """np.where(take, a, b) (b None: 0) for floats or ints of one size, exact to the bit, in
    unsigned integer arithmetic on the bit patterns: a * take, or b + take * (a - b) modulo
    2**bits. np.where branches on every element, several times slower on an unpredictable mask
    such as which element of a pooling window is the largest (or relu's)."""
    bits = np.dtype(f"u{a.dtype.itemsize}")
    a_bits = np.asarray(a).view(bits)
    if b is None:
        return np.multiply(take, a_bits).view(a.dtype)
    b_bits = np.asarray(b).view(bits)
    picked = np.subtract(a_bits, b_bits)
    np.multiply(picked, take, out=picked)
    return np.add(picked, b_bits, out=picked).view(a.dtype)


def _conv_out_hw(h, w, kernel, stride, padding, dilation):
    return tuple(pool_output_size(size, k, s, p, d, False) for size, k, s, p, d in
                 zip((h, w), kernel, stride, padding, dilation))


def _accumulate_windows(target, cols, kernel, stride, dilation, out_hw):
    """target[..., h, w] += cols[..., i, j, p, q] for each window position (the col2im sum:
    one strided add per kernel offset)."""
    for i, j, rows, columns in _taps(kernel, stride, dilation, out_hw):
        target[..., rows, columns] += cols[..., i, j, :, :]
    return target

_WORK = threading.local()


def _workspace(name, shape, dtype):
    """An uninitialised array for a large temporary (a convolution's columns), reused from call
    to call in this thread: memory freshly taken from the system costs a page fault per 4 kB
    on first touch, as much as the copy itself (glibc hands blocks above 32 MB back at every
    free). Never returned to a caller; one array per name, as large as its largest use."""
    size = math.prod(shape) * np.dtype(dtype).itemsize
    buf = getattr(_WORK, name, None)
    if buf is None or buf.size < size:
        buf = np.empty(size, np.uint8)
        setattr(_WORK, name, buf)
    return buf[:size].view(dtype).reshape(shape)



def _per_thread(name, make):
    """This thread's object `name` (made by make() on first use): kept buffers are per thread."""
    value = getattr(_WORK, name, None)
    if value is None:
        value = make()
        setattr(_WORK, name, value)
    return value


def _transpose_into(dst, src):
    """dst [a, b] = src [b, a].T, in blocks of src rows. A plain transposing copy between the
    convolution's [Co L, n] and [n, Co L] (samples last) runs about half as fast: each run of
    dst reads a column of all of src. Blocks of 512 rows when src's rows are short (a product
    into y), else of one cache line's worth of samples (dy into the columns' order: 16 rows of
    800 kB fit the L2 cache)."""
    block = 512 if src.shape[1] <= 128 else max(1, 64 // src.itemsize)
    for lo in range(0, src.shape[0], block):
        np.copyto(dst[:, lo:lo + block], src[lo:lo + block].T)
    return dst
