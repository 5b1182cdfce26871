"""The numpy reference backend: the executable specification of every primitive in backend.py.

It is the CPU path (`td.set_backend("numpy")`) and the oracle every Triton kernel is tested
against. Clarity wins over speed here, except in the primitives that dominate a CPU training
step and evaluation: convolution (im2col as one strided copy and one BLAS product per direction,
by pieces of output rows whose columns stay in the cache; float32 convolutions with many
channels, stride 1, no dilation or groups, through the DFT: one small product per frequency
bin), max pooling (windows that tile the input copied once, offset by offset), relu and the
optimizer updates (in place, bit-pattern selects), written to keep up with PyTorch's CPU build
(benchmarks/bench_mnist.py --cpu, notes/PERF.md) and checked in the tests against PyTorch, the
loop definitions, the general paths and float64 finite differences. Every fast path gives the
general one's values (to the bit, or to float32 rounding where a product or sum is split
differently), NaN, inf and ties, except the DFT convolution: its float32 error is norm-wise
(~2e-7 of the largest sum of |terms| of an output, as the direct product's, but spread over
each plane rather than proportional to each element's own terms). float64, the oracle's type,
never takes it; `TRITONAD_NUMPY_FFT_CONV=0` turns it off.

Raw arrays are torch CPU tensors; we compute on numpy views of them. numpy has no bfloat16, so
bfloat16 arrays are widened to float32 on the way in and rounded (to nearest even) on the way out.
Half-precision inputs are computed in float32 and rounded once on output, as the kernels do.
"""
from __future__ import annotations

import functools
import math
import os
import threading
import types

import numpy as np
import torch

from . import dtypes, npmath
from . import elementwise as _table
from .backend import (Backend, check_gather_rows_at, check_metrics, check_mlp_cross_entropy,
                      check_take_row, check_weight_grad_outputs, register_backend)
from .dtypes import DType

# the elementwise table's formulas see npmath's vocabulary and the table's constants
_NUMPY_NAMESPACE = {name: value for name, value in vars(npmath).items()
                    if not name.startswith("__")}
_NUMPY_NAMESPACE.update(_table.CONSTANTS)
_NUMPY_FORMS = {}  # formula -> its function bound to _NUMPY_NAMESPACE


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


# ------------------------------------------------------------------------ Philox4x32-10


PHILOX_ROUND_A, PHILOX_ROUND_B = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57)
PHILOX_KEY_A, PHILOX_KEY_B = np.uint32(0x9E3779B9), np.uint32(0xBB67AE85)
_MASK32 = np.uint64(0xFFFFFFFF)


def philox(counter_lo, counter_hi, c2, c3, seed):
    """Philox4x32 with 10 rounds (Salmon et al. 2011) on uint32 counters; key = 64-bit seed.

    Returns the four uint32 output words. Kernels implement exactly this function.
    """
    c0, c1 = np.asarray(counter_lo, np.uint32), np.asarray(counter_hi, np.uint32)
    c2, c3 = np.broadcast_to(np.uint32(c2), c0.shape), np.broadcast_to(np.uint32(c3), c0.shape)
    k0, k1 = np.uint32(seed & 0xFFFFFFFF), np.uint32((seed >> 32) & 0xFFFFFFFF)
    with np.errstate(over="ignore"):
        for _ in range(10):
            prod_b = PHILOX_ROUND_B * c2.astype(np.uint64)
            prod_a = PHILOX_ROUND_A * c0.astype(np.uint64)
            c0, c1, c2, c3 = (
                (prod_b >> np.uint64(32)).astype(np.uint32) ^ c1 ^ k0,
                (prod_b & _MASK32).astype(np.uint32),
                (prod_a >> np.uint64(32)).astype(np.uint32) ^ c3 ^ k1,
                (prod_a & _MASK32).astype(np.uint32),
            )
            k0, k1 = k0 + PHILOX_KEY_A, k1 + PHILOX_KEY_B
    return c0, c1, c2, c3


def random_words(n, seed, offset):
    """The first two Philox words for counters offset .. offset + n - 1 (64-bit counters)."""
    counter = np.arange(n, dtype=np.uint64) + np.uint64(offset)
    w0, w1, _, _ = philox((counter & _MASK32).astype(np.uint32),
                          (counter >> np.uint64(32)).astype(np.uint32), 0, 0, seed)
    return w0, w1


def uniform01(word):
    """[0, 1) with 24 random bits: exact in float32, never rounds up to 1."""
    return (word >> np.uint32(8)).astype(np.float32) * np.float32(2.0 ** -24)


def normal01(w0, w1):
    """Box-Muller: sqrt(-2 ln u1) cos(2 pi u2), u1 in (0, 1] so that the log is finite."""
    u1 = ((w0 >> np.uint32(8)).astype(np.float32) + np.float32(1.0)) * np.float32(2.0 ** -24)
    u2 = uniform01(w1)
    return np.sqrt(np.float32(-2.0) * np.log(u1)) * np.cos(np.float32(2 * math.pi) * u2)


def feistel_bits(n):
    """Bits of the Feistel domain for randperm(n): even, at least 2, 2**bits >= n."""
    bits = max(2, (max(n, 1) - 1).bit_length())
    return bits + (bits & 1)


def randperm_numpy(n, seed, offset):
    """A keyed permutation of range(n): a 4-round Feistel network on 2**bits values, each round
    function the low bits of Philox(counter=(right half, round, offset lo, offset hi)),
    with cycle walking (re-apply until the value falls below n). Kernels implement exactly this."""
    bits = feistel_bits(n)
    half = bits // 2
    mask = np.uint32((1 << half) - 1)
    off_lo, off_hi = offset & 0xFFFFFFFF, (offset >> 32) & 0xFFFFFFFF
    x = np.arange(n, dtype=np.uint32)
    todo = np.ones(n, dtype=bool)
    while todo.any():
        v = x[todo]
        left, right = v >> np.uint32(half), v & mask
        for r in range(4):
            f, _, _, _ = philox(right, np.full_like(right, r), off_lo, off_hi, seed)
            left, right = right, left ^ (f & mask)
        v = (left << np.uint32(half)) | right
        x[todo] = v
        todo[todo] = v >= n
    return x.astype(np.int64)


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


# The convolution works on planes laid out [C, n, H, W] or [C, H, W, n], samples last: then
# the rows that a kernel offset reads (or adds to) are runs of Wo * n contiguous numbers, not of
# Wo, which numpy copies and adds about twice as fast, but the transpositions of x, y, dy and
# dx into and out of that layout are slower (a stride of n between neighbours). The layout
# that moves the larger of the columns (C kh kw rows) and the output (Co rows) in long runs
# wins: samples last for the MNIST cnn's second layer (800 rows of columns, 64 outputs), not
# for its first (25 and 32).


def _samples_last(c, kernel, co):
    return c * kernel[0] * kernel[1] > co


def _plane_window(rows, columns, samples_last):
    """The index of a kernel offset's rows and columns in planes of either layout."""
    every = slice(None)
    return (every, rows, columns, every) if samples_last else (every, every, rows, columns)


def _zero_planes(n, c, size, padding, samples_last, dtype):
    """Zeros in the planes' layout: [C, Hp, Wp, n] (samples_last) or [C, n, Hp, Wp]."""
    hp, wp = size[0] + 2 * padding[0], size[1] + 2 * padding[1]
    return np.zeros((c, hp, wp, n) if samples_last else (c, n, hp, wp), dtype)


def _interior(planes, padding, size, samples_last):
    """The unpadded part of the planes, as an [n, C, H, W] view."""
    (ph, pw), (h, w) = padding, size
    if samples_last:
        return planes[:, ph:ph + h, pw:pw + w, :].transpose(3, 0, 1, 2)
    return planes[:, :, ph:ph + h, pw:pw + w].transpose(1, 0, 2, 3)


def _conv_planes(v, padding, samples_last):
    """v [n, C, H, W] as zero-padded planes."""
    n, c, h, w = v.shape
    planes = _zero_planes(n, c, (h, w), padding, samples_last, v.dtype)
    _interior(planes, padding, (h, w), samples_last)[...] = v
    return planes


def _windows(planes, kernel, stride, dilation, out_hw, samples_last):
    """A read-only view of the planes (_conv_planes) as the columns' [C, kh, kw] + order:
    element (c, i, j, p, q, sample) is the planes' (c, p sh + i dh, q sw + j dw, sample). The
    windows overlap, so it is as_strided's, not a reshape (numpy's sliding_window_view takes no
    stride or dilation)."""
    (kh, kw), (sh, sw), (dh, dw) = kernel, stride, dilation
    if samples_last:  # [C, Hp, Wp, n]
        s_c, s_h, s_w, s_n = planes.strides
        shape = (planes.shape[0], kh, kw) + tuple(out_hw) + (planes.shape[3],)
        strides = (s_c, s_h * dh, s_w * dw, s_h * sh, s_w * sw, s_n)
    else:  # [C, n, Hp, Wp]
        s_c, s_n, s_h, s_w = planes.strides
        shape = (planes.shape[0], kh, kw, planes.shape[1]) + tuple(out_hw)
        strides = (s_c, s_h * dh, s_w * dw, s_n, s_h * sh, s_w * sw)
    return np.lib.stride_tricks.as_strided(planes, shape, strides, writeable=False)


def _gemm_columns(planes, kernel, stride, dilation, out_hw, samples_last, into=None):
    """im2col laid out for one GEMM over a whole batch: planes (_conv_planes) -> [C * kh * kw,
    Ho * Wo * n] with columns (p, q, sample) if samples_last, else [C * kh * kw, n * Ho * Wo];
    rows (c, i, j) as a weight's. One copy of the overlapping windows (_windows; numpy's calls
    per kernel offset cost as much as the copying itself for a piece of one output row), into
    `into` (a flat buffer, _KeptColumns) or the workspace "columns"."""
    windows = _windows(planes, kernel, stride, dilation, out_hw, samples_last)
    cols = _workspace("columns", windows.shape, planes.dtype) if into is None else \
        into[:windows.size * planes.itemsize].view(planes.dtype).reshape(windows.shape)
    np.copyto(cols, windows)
    return cols.reshape(math.prod(windows.shape[:3]), math.prod(windows.shape[3:]))


def _add_columns(planes, cols, kernel, stride, dilation, out_hw, samples_last):
    """col2im, the adjoint of _gemm_columns: cols (its layout) added into the planes, one
    strided add per kernel offset."""
    c, n = planes.shape[0], planes.shape[3 if samples_last else 1]
    order = tuple(out_hw) + (n,) if samples_last else (n,) + tuple(out_hw)
    cols = cols.reshape((c, kernel[0], kernel[1]) + order)
    # numpy runs a ufunc over strided operands through 8192-element buffers, copying runs
    # shorter than that into them; a buffer no longer than a run (Wo * n numbers, samples last)
    # lets it add in place: 2.5x faster for the MNIST cnn's second layer, same sums
    run = out_hw[1] * (n if samples_last else 1)
    saved = np.getbufsize()
    if run >= 256:
        np.setbufsize(256)
    try:
        for i, j, rows, columns in _taps(kernel, stride, dilation, out_hw):
            window = planes[_plane_window(rows, columns, samples_last)]
            np.add(window, cols[:, i, j], out=window)
    finally:
        np.setbufsize(saved)
    return planes


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


class _KeptColumns:
    """The columns of recent convolution forwards in sample order (few input channels, as the
    MNIST cnn's first layer; a batch of one chunk), for their backwards' weight gradient: 8 MB
    there, whose building again costs about 1 ms.

    An entry is found only by the geometry and the exact bits of the input, compared with a copy
    taken in the forward, so a lookup can never return columns of other values, whatever
    happened to the input in between (in-place changes, a reused array, another thread: the
    slots are per thread). A backward takes its entry and frees the slot. At most SLOTS entries;
    a forward with no slot free takes the oldest entry's. Buffers stay, to be reused: memory
    freshly taken from the system costs a page fault per 4 kB (see _workspace)."""

    SLOTS = 4

    def __init__(self):
        self.slots = []  # [buffer (uint8), input copy, key or None (free), last use]
        self.clock = 0

    def buffer(self, nbytes):
        """A flat uint8 buffer of at least nbytes for columns that keep() will hold."""
        free = [s for s in self.slots if s[2] is None]
        if free:
            fits = [s for s in free if s[0].size >= nbytes]
            size = lambda slot: slot[0].size  # noqa: E731
            slot = min(fits, key=size) if fits else max(free, key=size)
        elif len(self.slots) < self.SLOTS:
            slot = [np.empty(0, np.uint8), None, None, 0]
            self.slots.append(slot)
        else:
            slot = min(self.slots, key=lambda s: s[3])  # the oldest entry goes
        slot[2] = None
        if slot[0].size < nbytes:
            slot[0] = np.empty(nbytes, np.uint8)
        return slot[0]

    def keep(self, buf, key, v):
        """Hold the columns now in buf (from buffer()) for input v and the geometry key."""
        for slot in self.slots:
            if slot[0] is buf:
                if slot[1] is None or slot[1].shape != v.shape or slot[1].dtype != v.dtype:
                    slot[1] = np.empty(v.shape, v.dtype)
                np.copyto(slot[1], v)
                self.clock += 1
                slot[2], slot[3] = key, self.clock

    def take(self, key, v):
        """The flat buffer kept for exactly these input values and geometry (None if none); its
        slot is free again for the next forward, so use it before calling buffer()."""
        bits = np.dtype(f"u{v.itemsize}")
        for slot in self.slots:
            if slot[2] == key and np.array_equal(slot[1].view(bits), v.view(bits)):
                slot[2] = None
                return slot[0]
        return None


def _per_thread(name, make):
    """This thread's object `name` (made by make() on first use): kept buffers are per thread."""
    value = getattr(_WORK, name, None)
    if value is None:
        value = make()
        setattr(_WORK, name, value)
    return value


def _kept_columns():
    return _per_thread("kept_columns", _KeptColumns)


# The columns of a convolution are kh * kw times the size of its input: a batch is convolved
# in chunks of samples whose columns take about this many bytes (all at once for a training
# batch of the MNIST cnn, ~60 MB; a 1000-image evaluation batch in ten chunks).
CONV_CHUNK_BYTES = 64 << 20
# Samples last, a chunk goes in pieces of whole output rows whose columns take about this many
# bytes (one row, 4.5 MB, for the MNIST cnn's second layer): each piece's columns are built in
# a reused buffer and multiplied while they are in the cache, and its column gradients are
# added up there too. The 63 MB of a whole batch's columns took ~4.5 ms to write through to
# memory, pieces ~1.9 ms (so the backward builds them again rather than keeping them), and
# the products run 10-20% faster on operands in the cache; pieces much larger than 4 MB fall
# out of the shared cache again.
CONV_ROWS_BYTES = 4 << 20


def _batch_chunks(n, bytes_per_sample):
    step = max(1, CONV_CHUNK_BYTES // max(1, bytes_per_sample))
    return [(lo, min(n, lo + step)) for lo in range(0, n, step)]


def _row_pieces(out_rows, bytes_per_row, samples_last):
    """(p0, p1) pieces of output rows for the columns (all rows at once unless samples_last)."""
    if not samples_last:
        return [(0, out_rows)]
    step = max(1, CONV_ROWS_BYTES // max(1, bytes_per_row))
    return [(p0, min(out_rows, p0 + step)) for p0 in range(0, out_rows, step)]


# ------------------------------------------------------------------------ convolution by DFT
# A stride-1, undilated, ungrouped convolution with many channels (the MNIST cnn's second layer)
# runs in the frequency domain: there a correlation is one product per frequency bin, and per bin
# it is a small matrix product over channels, [Co, C] @ [C, n] (complex), so the direct
# product's C Co kh kw multiply-adds per output pixel become ~4 C Co per bin with ~1 bin per
# output pixel: 2.0 -> 0.24 GFLOP per direction for MNIST's conv2. The planes are transformed
# by dense DFT matrices, as BLAS products (numpy's FFT takes ~8 ms for the 3200 16x16 planes of
# that layer's input, where two products take ~1 ms: at sizes like 16, a transform's
# O(P^2) per row by a GEMM beats an FFT's O(P log P) in numpy's one-line-at-a-time loop).
#
# The maths, along one axis (the 2-d transform is one along H, then one along W). With the
# input x [H] placed on a circle of P >= H positions at offset `pad`, and spectra
#   X[u] = sum_h x[h] z^(-u (h + pad)),  K[u] = sum_i k[i] z^(u i),  z = e^(2 pi i / P),
# the circular correlation yc[p] = sum_i k[i] xc[p + i] has Y[u] = K[u] X[u], and
# yc[p] = (1/P) sum_u Y[u] z^(u p). It equals the padded input's correlation y[p] for every
# output p in [0, Ho) when no position p + i < H + 2 pad that the zero padding holds wraps onto
# an input position (_dft_period). x is real, so along H only the bins u <= P/2 are needed (the
# rest are conjugates): the inverse is Re(sum_u a_u ...) with a_u = 2 except u = 0 and P/2.
# Complex numbers are kept as (real, imaginary) pairs of float32 rows, so every step is a real
# matrix product: each of the linear maps below has a real matrix, the gradients are the
# products by their transposes (exactly the adjoint of the forward's computation), and the
# per-bin complex product is the real [2 Co, 2 C] @ [2 C, n] of Kb = [[Kr, -Ki], [Ki, Kr]].
#
# Layout: planes [H, W, (C, n)] (pixels first, samples last): each transform is a left
# product (the pixel axis contracted is the rows), which leaves spectra bins first,
# [Bu, Pw, 2, C, n], so that a bin's [2 C, n] is one matrix for the batched product.
#
# Accuracy: a transform spreads float32 rounding over each plane. The error of y, dx and dw is
# ~2e-7 of their largest sum of |terms| (norm-wise; the direct product's largest error is about
# the same), but an element whose own terms are small (an output near 0 because its window
# holds zeros) gets that absolute error too, where the direct product's error is proportional
# to its own terms. float64 (the oracle of the kernel tests) always takes the direct path.
# Non-finite values spread over a whole plane in a transform, so any NaN or inf in x, k or dy
# sends the call to the direct path (the zero-frequency bin of a spectrum is the plain sum of
# its plane: checked there, cheaply).
DFT_CONV = os.environ.get("TRITONAD_NUMPY_FFT_CONV", "1") not in ("", "0")
# The DFT path is taken when the direct path's modelled time exceeds its own by this factor
# (_direct_conv_cost, _dft_conv_cost: fitted to 14 shapes timed on one thread, 1-128
# channels, 7x7-56x56 images, 3x3-7x7 kernels; the modelled ratio of the two was 0.63-1.7x the
# measured one, and on the measured side of 1 for all but a near-tie, measured 1.14).
DFT_CONV_GAIN = 1.0
# Samples are transformed and multiplied in chunks whose spectra take about this many bytes
# (a training batch of the MNIST cnn at once: 11 MB; a 1000-image evaluation batch in seven).
DFT_CHUNK_BYTES = 16 << 20


@functools.lru_cache(maxsize=None)
def _dft_period(size, pad, k):
    """The smallest circle P >= size on which the padded input's correlation with a k-tap
    kernel (stride 1) is exact: every position t < size + 2 pad read by an output lands, modulo
    P, on an input position exactly when t is one (no zero of the padding wraps onto an input
    value, and no input value onto another)."""
    span = size + 2 * pad  # positions read by the outputs: 0 .. Ho + k - 2
    period = max(size, 1)
    while any((pad <= t % period < pad + size) != (pad <= t < pad + size) for t in range(span)):
        period += 1
    return period


class _DftPlan:
    """The real DFT matrices of one geometry (input size, kernel, padding, float type):

    spectra      planes [H, W, M] -> [Bu, 2 Pw, M]:  A [(u, re/im), h], then per u
                 B [(v, re/im), (re/im, w)]
    outputs      spectra -> planes [Ho, Wo, M]:     per u C [(re/im, q), (v, re/im)], then
                 D [p, (u, re/im)] (a_u / (Ph Pw) folded in; only the outputs wanted)
    kernel       k [Co, C, kh, kw] -> Kb [Bu Pw, 2 Co, 2 C]: E [(i, j), (re/im, u, v)]
    and the transposes for the gradients. M is any number of planes (channels x samples)."""

    def __init__(self, in_hw, kernel, padding, dtype):
        (h, w), (kh, kw), (ph, pw) = in_hw, kernel, padding
        self.in_hw, self.kernel = (h, w), (kh, kw)
        self.out_hw = (h + 2 * ph - kh + 1, w + 2 * pw - kw + 1)
        self.period = (_dft_period(h, ph, kh), _dft_period(w, pw, kw))
        (per_h, per_w), (ho, wo) = self.period, self.out_hw
        self.half = bu = per_h // 2 + 1  # bins along H: a real input's spectrum is symmetric
        self.bins = bu * per_w
        u, v = np.arange(bu), np.arange(per_w)
        # A: along H, real -> complex, the input at offset ph on the circle
        angle = 2 * math.pi * np.outer(u, np.arange(h) + ph) / per_h
        a = np.stack([np.cos(angle), -np.sin(angle)], axis=1).reshape(2 * bu, h)
        # B: along W, complex -> complex: (re, im) times e^(-i phi), phi = 2 pi v (w + pw) / Pw
        phi = 2 * math.pi * np.outer(v, np.arange(w) + pw) / per_w
        b = np.empty((per_w, 2, 2, w))
        b[:, 0, 0], b[:, 0, 1], b[:, 1, 0], b[:, 1, 1] = np.cos(phi), np.sin(phi), \
            -np.sin(phi), np.cos(phi)
        # C: back along W, times e^(+i psi), psi = 2 pi v q / Pw, for the outputs q < Wo only
        psi = 2 * math.pi * np.outer(np.arange(wo), v) / per_w
        c = np.empty((2, wo, per_w, 2))
        c[0, :, :, 0], c[0, :, :, 1], c[1, :, :, 0], c[1, :, :, 1] = np.cos(psi), \
            -np.sin(psi), np.sin(psi), np.cos(psi)
        # D: back along H, the real part of a_u e^(+i theta) (.), theta = 2 pi u p / Ph
        weight = np.where((u == 0) | (2 * u == per_h), 1.0, 2.0) / (per_h * per_w)
        theta = 2 * math.pi * np.outer(np.arange(ho), u) / per_h
        d = np.stack([weight * np.cos(theta), -weight * np.sin(theta)], axis=2)
        # E: the kernel's spectrum K[u, v] = sum_ij k[i, j] e^(+2 pi i (u i / Ph + v j / Pw))
        angle = 2 * math.pi * (np.add.outer(np.outer(np.arange(kh), u) / per_h,
                                            np.outer(np.arange(kw), v) / per_w))  # [i, u, j, v]
        angle = angle.transpose(0, 2, 1, 3).reshape(kh * kw, self.bins)
        e = np.stack([np.cos(angle), np.sin(angle)], axis=1).reshape(kh * kw, 2 * self.bins)
        self.a, self.b, self.c, self.d, self.e = (
            np.ascontiguousarray(m, dtype=dtype) for m in
            (a, b.reshape(2 * per_w, 2 * w), c.reshape(2 * wo, 2 * per_w),
             d.reshape(ho, 2 * bu), e))

    def spectra(self, planes, name):
        """planes [H, W, M] -> spectra [Bu Pw, 2, M] (workspace `name`)."""
        h, w, m = planes.shape
        step = np.matmul(self.a, planes.reshape(h, w * m),
                         out=_workspace("dft_step", (2 * self.half, w * m), planes.dtype))
        out = _workspace(name, (self.half, 2 * self.period[1], m), planes.dtype)
        np.matmul(self.b, step.reshape(self.half, 2 * w, m), out=out)
        return out.reshape(self.bins, 2, m)

    def spectra_adjoint(self, spectra, name):
        """The transpose of spectra(): [Bu Pw, 2, M] -> planes [H, W, M]."""
        (h, w), m = self.in_hw, spectra.shape[-1]
        step = np.matmul(self.b.T, spectra.reshape(self.half, 2 * self.period[1], m),
                         out=_workspace("dft_step", (self.half, 2 * w, m), spectra.dtype))
        out = _workspace(name, (h, w * m), spectra.dtype)
        np.matmul(self.a.T, step.reshape(2 * self.half, w * m), out=out)
        return out.reshape(h, w, m)

    def outputs(self, spectra, name):
        """spectra [Bu Pw, 2, M] -> the output planes [Ho, Wo, M] (the inverse, restricted)."""
        (ho, wo), m = self.out_hw, spectra.shape[-1]
        step = np.matmul(self.c, spectra.reshape(self.half, 2 * self.period[1], m),
                         out=_workspace("dft_step", (self.half, 2 * wo, m), spectra.dtype))
        out = _workspace(name, (ho, wo * m), spectra.dtype)
        np.matmul(self.d, step.reshape(2 * self.half, wo * m), out=out)
        return out.reshape(ho, wo, m)

    def outputs_adjoint(self, planes, name):
        """The transpose of outputs(): output planes [Ho, Wo, M] -> [Bu Pw, 2, M]."""
        ho, wo, m = planes.shape
        step = np.matmul(self.d.T, planes.reshape(ho, wo * m),
                         out=_workspace("dft_step", (2 * self.half, wo * m), planes.dtype))
        out = _workspace(name, (self.half, 2 * self.period[1], m), planes.dtype)
        np.matmul(self.c.T, step.reshape(self.half, 2 * wo, m), out=out)
        return out.reshape(self.bins, 2, m)

    def kernel_spectra(self, k):
        """k [Co, C, kh, kw] -> Kb [Bu Pw, 2 Co, 2 C] = [[Kr, -Ki], [Ki, Kr]] per bin."""
        co, c = k.shape[:2]
        parts = np.matmul(self.e.T, k.reshape(co * c, -1).T).reshape(2, self.bins, co, c)
        kb = np.empty((self.bins, 2, co, 2, c), k.dtype)
        kb[:, 0, :, 0] = kb[:, 1, :, 1] = parts[0]
        kb[:, 1, :, 0] = parts[1]
        np.negative(parts[1], out=kb[:, 0, :, 1])
        return kb.reshape(self.bins, 2 * co, 2 * c)

    def kernel_grad(self, dkb):
        """The transpose of kernel_spectra(): dKb [Bu Pw, 2 Co, 2 C] -> dk [Co, C, kh, kw]."""
        co, c = dkb.shape[1] // 2, dkb.shape[2] // 2
        blocks = dkb.reshape(self.bins, 2, co, 2, c)
        parts = np.empty((2, self.bins, co, c), dkb.dtype)
        np.add(blocks[:, 0, :, 0], blocks[:, 1, :, 1], out=parts[0])
        np.subtract(blocks[:, 1, :, 0], blocks[:, 0, :, 1], out=parts[1])
        dk = np.matmul(self.e, parts.reshape(2 * self.bins, co * c))  # [(i, j), (o, c)]
        return np.ascontiguousarray(dk.T).reshape(co, c, *self.kernel)


_DFT_PLANS = {}


def _dft_plan(in_hw, kernel, padding, dtype):
    key = (tuple(in_hw), tuple(kernel), tuple(padding), np.dtype(dtype).str)
    plan = _DFT_PLANS.get(key)
    if plan is None:
        plan = _DFT_PLANS[key] = _DftPlan(in_hw, kernel, padding, dtype)
    return plan


def _direct_conv_cost(c, co, kernel, out_hw):
    """The direct path's time for a forward and both gradients, per sample, in multiply-adds
    of its large GEMMs (~45 G/s a thread here): three products, and its columns built twice
    (~4 each per element) and added back once (~18)."""
    taps = c * kernel[0] * kernel[1] * out_hw[0] * out_hw[1]
    return (3 * co + 26) * taps


def _dft_conv_cost(c, co, in_hw, out_hw, period):
    """The DFT path's time on the same scale: its transforms (x twice, dx; y and dy) and
    per-bin products run at ~2/3 of the direct GEMMs' rate, each element of a layout change
    (_to_planes, _from_planes) costs ~28, of the X^T copy ~8."""
    (h, w), (ho, wo), (per_h, per_w) = in_hw, out_hw, period
    half, bins = per_h // 2 + 1, (per_h // 2 + 1) * per_w
    plane_in = 2 * half * h * w + 4 * half * per_w * w  # spectra() of one plane
    plane_out = 4 * half * per_w * wo + 2 * half * ho * wo  # outputs() of one plane
    products = 1.5 * (3 * c * plane_in + 2 * co * plane_out + 12 * c * co * bins)
    return products + 28 * (3 * c * h * w + 2 * co * ho * wo) + 16 * c * bins


def _dft_conv_plan(v, k, stride, padding, dilation, groups):
    """The _DftPlan for this convolution when the DFT path is on and pays (the cost models
    above, DFT_CONV_GAIN), else None. float32 only: float64 is the oracle's, exact to its
    rounding, and stays direct."""
    n, c, h, w = v.shape
    co, _, kh, kw = k.shape
    if not DFT_CONV or v.dtype != np.float32 or k.dtype != np.float32 or groups != 1 or \
            tuple(stride) != (1, 1) or tuple(dilation) != (1, 1) or n == 0 or c == 0 or co == 0:
        return None
    out_hw = (h + 2 * padding[0] - kh + 1, w + 2 * padding[1] - kw + 1)
    # (the dense transforms' cost grows as the cube of the image side: small images only)
    if min(out_hw) < 1 or kh * kw == 1 or h * w > 64 * 64:
        return None
    period = (_dft_period(h, padding[0], kh), _dft_period(w, padding[1], kw))
    if _direct_conv_cost(c, co, (kh, kw), out_hw) <= \
            DFT_CONV_GAIN * _dft_conv_cost(c, co, (h, w), out_hw, period):
        return None
    return _dft_plan((h, w), (kh, kw), tuple(padding), v.dtype)


def _to_planes(v, name):
    """[n, C, H, W] -> planes [H, W, C, n] (workspace `name`): pixels first, samples last.
    Contiguous, in two passes: [n, (C H W)] -> [(C H W), n] by blocks (_transpose_into), then
    [C, HW, n] -> [HW, C, n] in runs of n (one strided copy takes twice as long)."""
    n, c, h, w = v.shape
    planes = _workspace(name, (h, w, c, n), v.dtype)
    if not v.flags.c_contiguous:
        np.copyto(planes, v.transpose(2, 3, 1, 0))
        return planes
    staged = _transpose_into(_workspace("dft_stage", (c * h * w, n), v.dtype),
                             v.reshape(n, c * h * w))
    np.copyto(planes.reshape(h * w, c, n), staged.reshape(c, h * w, n).transpose(1, 0, 2))
    return planes


def _from_planes(dst, planes):
    """dst [n, C, H, W] = planes [H, W, C, n] (the inverse of _to_planes)."""
    h, w, c, n = planes.shape
    staged = _workspace("dft_stage", (c, h * w, n), planes.dtype)
    np.copyto(staged, planes.reshape(h * w, c, n).transpose(1, 0, 2))
    _transpose_into(dst.reshape(n, c * h * w), staged.reshape(c * h * w, n))
    return dst


def _all_finite(spectra):
    """Whether the planes behind spectra [Bu Pw, 2, M] (of spectra() or outputs_adjoint())
    hold only finite values: bin 0's real part is each plane's plain sum (times a positive
    constant), so a NaN or an inf anywhere in a plane, or a sum that overflows, makes it
    non-finite."""
    return bool(np.isfinite(spectra[0, 0]).all())


def _dft_chunks(n, plan, c, co, itemsize):
    step = max(1, DFT_CHUNK_BYTES // (plan.bins * 2 * (c + co) * itemsize))
    return [(lo, min(n, lo + step)) for lo in range(0, n, step)]


class _KeptKernelSpectra:
    """The kernel spectra of the last DFT forward in this thread, for its backward: found only
    by the plan and the exact bits of the kernel (compared with a copy taken in the forward)."""

    def __init__(self):
        self.key, self.kernel, self.spectra = None, None, None

    def keep(self, key, k, spectra):
        if self.kernel is None or self.kernel.shape != k.shape or self.kernel.dtype != k.dtype:
            self.kernel = np.empty_like(k)
        np.copyto(self.kernel, k)
        self.key, self.spectra = key, spectra

    def take(self, key, k):
        bits = np.dtype(f"u{k.itemsize}")
        if self.key == key and self.kernel.shape == k.shape and \
                np.array_equal(self.kernel.view(bits), k.view(bits)):
            return self.spectra
        return None


def _kept_kernel_spectra():
    return _per_thread("kernel_spectra", _KeptKernelSpectra)


# ------------------------------------------------------------------------ the backend


class NumpyBackend(Backend):
    """Every primitive in numpy, on CPU tensors."""

    name = "numpy"

    def check_device(self, op, device):
        if torch.device(device).type != "cpu":
            raise RuntimeError(f"{op}: the numpy backend runs on the CPU but got a tensor on "
                               f"{device}; move it with .cpu() or select the triton backend")

    # helpers -------------------------------------------------------------------------------
    def _new(self, values, dtype: DType):
        return from_numpy(values, dtype)

    def _fresh(self, values, dtype: DType):
        """A raw array of `values`, a new numpy array that nothing else holds: taken as it is
        (no copy) when it is contiguous and already of dtype's numpy type."""
        values = np.asarray(values)  # (a 0-d result of numpy is a scalar)
        if dtype is not dtypes.bfloat16 and values.dtype == dtype.numpy and \
                values.flags.c_contiguous:
            return torch.from_numpy(values)
        return self._new(values, dtype)

    def _out(self, values, dtype: DType, out):
        if out is None:
            return self._new(values, dtype)
        return write(out, values)

    def _float_in(self, x, dtype: DType):
        """x's values in the type a float result of `dtype` is computed in."""
        return np.asarray(to_numpy(x)).astype(compute_dtype(dtype), copy=False)

    def _binary(self, fn, a, b, out, result=None, float_result=False, fresh=False):
        # fresh: fn always returns a new array, which the result may keep without a copy
        dtype = dtypes.result_type(a, b)
        if float_result and not dtype.is_floating_point:
            dtype = dtypes.default_float
        if dtype.is_floating_point:
            va, vb = (np.asarray(to_numpy(v)).astype(compute_dtype(dtype), copy=False)
                      for v in (a, b))
        else:
            va, vb = (np.asarray(to_numpy(v)).astype(dtype.numpy, copy=False) for v in (a, b))
        with np.errstate(all="ignore"):
            values = fn(va, vb)
        if fresh and out is None:
            return self._fresh(values, result or dtype)
        return self._out(values, result or dtype, out)

    # memory, fills, casts ------------------------------------------------------------------
    def fill_(self, x, value):
        return write(x, value)

    def copy_(self, dst, src):
        return write(dst, to_numpy(src))

    def arange(self, start, end, step, dtype, device):
        self.check_device("arange", device)
        return self._new(np.arange(start, end, step), dtype)

    # the elementwise table ---------------------------------------------------------------------
    def elementwise(self, formula, *operands, out=None):
        """Any entry or derivative of tritonad/elementwise.py, its formula evaluated with numpy
        (npmath's vocabulary) in the compute type, rounded once to the result's type."""
        fn = _NUMPY_FORMS.get(formula)
        if fn is None:
            fn = _NUMPY_FORMS[formula] = types.FunctionType(
                formula.fn.__code__, _NUMPY_NAMESPACE, formula.fn.__name__, formula.fn.__defaults__)
        arrays = [x for x in operands if isinstance(x, torch.Tensor)]
        if not arrays:
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
        values = []
        for i, x in enumerate(operands):
            if isinstance(x, torch.Tensor):
                v = np.asarray(to_numpy(x))
                if i == 0 and formula.condition:
                    v = v.astype(bool, copy=False)
                elif compute.is_floating_point:
                    v = v.astype(compute_dtype(compute), copy=False)
                else:
                    v = v.astype(compute.numpy, copy=False)
            else:
                v = x
            values.append(v)
        with np.errstate(all="ignore"):
            result = np.asarray(fn(*values))
        shape = np.broadcast_shapes(*(np.shape(v) for v in values))
        return self._out(np.broadcast_to(result, shape), dtype, out)

    def relu_backward(self, dy, x, out=None):
        """dx = dy where x > 0, else 0 (relu's derivative, as a gate for fused backwards)."""
        return self.elementwise(_table.relu.derivatives["x"], x, dy, out=out)

    def pow_scalar(self, x, exponent, out=None):
        return self._binary(np.power, x, exponent, out)

    def clamp(self, x, min=None, max=None, out=None):
        dtype = dtypes.get_dtype(x.dtype)
        v = to_numpy(x)
        if min is not None:
            v = np.where(v < min, np.asarray(min).astype(v.dtype), v)
        if max is not None:
            v = np.where(v > max, np.asarray(max).astype(v.dtype), v)
        return self._out(v, dtype, out)

    def pow(self, a, b, out=None): return self._binary(np.power, a, b, out)

    # reductions -------------------------------------------------------------------------------
    def _reduce_in(self, x):
        dtype = dtypes.get_dtype(x.dtype)
        v = to_numpy(x)
        if dtype in (dtypes.float16, dtypes.bfloat16):
            v = v.astype(np.float32)
        return dtype, v

    def sum(self, x, dims=None, keepdim=False, dtype=None, out=None):
        in_dtype, v = self._reduce_in(x)
        if dtype is None:
            dtype = in_dtype if in_dtype.is_floating_point else dtypes.int64
        v = v.astype(compute_dtype(dtype) if dtype.is_floating_point else np.int64, copy=False)
        return self._out(np.sum(v, axis=dims, keepdims=keepdim), dtype, out)

    def mean(self, x, dims=None, keepdim=False):
        dtype, v = self._reduce_in(x)
        with np.errstate(all="ignore"):
            return self._new(np.mean(v, axis=dims, keepdims=keepdim), dtype)

    def max(self, x, dims=None, keepdim=False):
        dtype, v = self._reduce_in(x)
        if v.size == 0:
            raise RuntimeError(f"max: cannot reduce an empty tensor of shape {tuple(x.shape)}")
        return self._new(np.max(v, axis=dims, keepdims=keepdim), dtype)

    def min(self, x, dims=None, keepdim=False):
        dtype, v = self._reduce_in(x)
        if v.size == 0:
            raise RuntimeError(f"min: cannot reduce an empty tensor of shape {tuple(x.shape)}")
        return self._new(np.min(v, axis=dims, keepdims=keepdim), dtype)

    def _arg(self, fn, name, x, dim, keepdim):
        _, v = self._reduce_in(x)
        if v.size == 0:
            raise RuntimeError(f"{name}: cannot reduce an empty tensor of shape {tuple(x.shape)}")
        if dim is None:
            idx = fn(v.reshape(-1))  # numpy returns the first extreme (and the first NaN)
            return self._new(np.reshape(idx, (1,) * v.ndim) if keepdim else idx, dtypes.int64)
        return self._new(fn(v, axis=dim, keepdims=keepdim), dtypes.int64)

    def argmax(self, x, dim=None, keepdim=False): return self._arg(np.argmax, "argmax", x, dim, keepdim)
    def argmin(self, x, dim=None, keepdim=False): return self._arg(np.argmin, "argmin", x, dim, keepdim)

    def var(self, x, dims=None, correction=1, keepdim=False):
        dtype, v = self._reduce_in(x)
        with np.errstate(all="ignore"):
            return self._new(np.var(v, axis=dims, ddof=correction, keepdims=keepdim), dtype)

    def count_correct_(self, logits, target, counter):
        hits = np.argmax(to_numpy(logits), axis=1) == to_numpy(target)
        c = to_numpy(counter)
        c[...] = c + int(hits.sum())
        return counter

    # matmul -------------------------------------------------------------------------------------
    def matmul(self, a, b, bias=None, activation=None, out=None, a_gate=None, a_row_sums=None):
        dtype = dtypes.get_dtype(a.dtype)
        ct = compute_dtype(dtype)
        av = to_numpy(a).astype(ct, copy=False)
        if (a_gate is not None or a_row_sums is not None) and (av.ndim != 2 or b.ndim != 2):
            raise ValueError(f"matmul: a_gate and a_row_sums need 2-d operands, got a "
                             f"{tuple(a.shape)} @ b {tuple(b.shape)}")
        if a_gate is not None:
            if tuple(a_gate.shape) != av.shape:
                raise ValueError(f"matmul: a_gate must have a's shape {av.shape}, got "
                                 f"{tuple(a_gate.shape)}")
            av = _select(to_numpy(a_gate) > 0, av)
        if a_row_sums is not None:
            if tuple(a_row_sums.shape) != av.shape[:1]:
                raise ValueError(f"matmul: a_row_sums must have shape {av.shape[:1]}, got "
                                 f"{tuple(a_row_sums.shape)}")
            write(a_row_sums, av.sum(axis=1))
        if activation not in (None, "relu"):
            raise ValueError(f"matmul: unknown activation {activation!r}")
        bv = to_numpy(b).astype(ct, copy=False)
        # the product straight into out where it can be (a weight gradient into the optimizer's
        # flat buffer: one copy of the weight's size less), else into a new array; the bias
        # and relu in place on it
        target = None
        if out is not None and out.dtype != torch.bfloat16 and av.ndim == 2 and bv.ndim == 2:
            target = out.numpy()
            if target.dtype != ct or target.shape != (av.shape[0], bv.shape[1]):
                target = None
        y = np.asarray(np.matmul(av, bv, out=target))  # (1-d @ 1-d: a 0-d array, not a scalar)
        if bias is not None:
            bias_v = to_numpy(bias).astype(ct, copy=False)
            y = np.add(y, bias_v, out=y if np.broadcast_shapes(y.shape, bias_v.shape) == y.shape
                       else None)
        if activation == "relu":
            np.maximum(y, np.zeros((), ct), out=y)
        if target is not None:
            return out
        return self._fresh(y, dtype) if out is None else write(out, y)

    # softmax and cross-entropy ------------------------------------------------------------------
    def _softmax_parts(self, x, dim):
        dtype = dtypes.get_dtype(x.dtype)
        v = self._float_in(x, dtype)
        m = np.max(v, axis=dim, keepdims=True, initial=-np.inf)  # (initial: a zero-size dim)
        m = np.where(np.isfinite(m), m, 0)  # rows of -inf: exp(-inf - 0) = 0, not NaN from inf-inf
        with np.errstate(all="ignore"):
            z = v - m
            s = np.sum(np.exp(z), axis=dim, keepdims=True)
        return dtype, z, s

    def softmax(self, x, dim):
        dtype, z, s = self._softmax_parts(x, dim)
        with np.errstate(all="ignore"):
            return self._new(np.exp(z) / s, dtype)

    def log_softmax(self, x, dim):
        dtype, z, s = self._softmax_parts(x, dim)
        with np.errstate(all="ignore"):
            return self._new(z - np.log(s), dtype)

    def softmax_backward(self, dy, y, dim):
        dtype = dtypes.get_dtype(y.dtype)
        g, s = self._float_in(dy, dtype), self._float_in(y, dtype)
        return self._new(s * (g - np.sum(g * s, axis=dim, keepdims=True)), dtype)

    def log_softmax_backward(self, dy, y, dim):
        dtype = dtypes.get_dtype(y.dtype)
        g, ls = self._float_in(dy, dtype), self._float_in(y, dtype)
        return self._new(g - np.exp(ls) * np.sum(g, axis=dim, keepdims=True), dtype)

    def check_targets(self, target, n_classes, ignore_index=-100, op="nll_loss"):
        t = to_numpy(target).astype(np.int64).reshape(-1)
        bad = (t != ignore_index) & ((t < 0) | (t >= n_classes))
        if bad.any():
            row = int(np.argmax(bad))
            raise ValueError(f"{op}: target {int(t[row])} is outside [0, {n_classes}) (at row "
                             f"{row})")

    def cross_entropy(self, logits, target, reduction="mean", ignore_index=-100,
                      label_smoothing=0.0, compute_grad=True, metrics=None):
        if metrics is not None:
            check_metrics("cross_entropy", logits, metrics)
        dtype = dtypes.get_dtype(logits.dtype)
        x = self._float_in(logits, dtype)
        t = to_numpy(target).astype(np.int64)
        n, c = x.shape
        kept = t != ignore_index
        bad = kept & ((t < 0) | (t >= c))
        if bad.any():
            row = int(np.argmax(bad))
            raise ValueError(f"cross_entropy: target {int(t[row])} is outside [0, {c}) (at row "
                             f"{row}; ignore_index={ignore_index}); logits shape "
                             f"{tuple(x.shape)}")
        safe_t = np.where(kept, t, 0)
        m = np.max(x, axis=1, keepdims=True) if c else np.zeros((n, 1), x.dtype)
        m = np.where(np.isfinite(m), m, 0)
        with np.errstate(all="ignore"):
            # NOTE: everything relative to the row max m, so that logits like 1e4 lose no digits:
            # loss = log(sum(exp(z))) - (1 - eps) z_t - eps / C sum(z),  z = x - m
            z = x - m
            e = np.exp(z)
            s = e.sum(axis=1, keepdims=True)
            eps = label_smoothing
            z_t = z[np.arange(n), safe_t]
            smooth = z.sum(axis=1) * (eps / c) if eps else 0.0
            loss = np.where(kept, np.log(s[:, 0]) - (1 - eps) * z_t - smooth, 0).astype(x.dtype)
        count = kept.sum()
        scale = {"none": 1.0, "sum": 1.0, "mean": None}[reduction]
        with np.errstate(all="ignore"):
            if reduction == "none":
                out_loss = loss
            else:
                out_loss = loss.sum()
                if reduction == "mean":
                    out_loss = out_loss / x.dtype.type(count)  # NOTE: 0/0 = nan when all ignored
                    scale = 1.0 / count if count else 0.0
        grad = None
        if compute_grad:
            q = np.zeros_like(x)
            q[np.arange(n), safe_t] = 1 - eps
            q += eps / c
            with np.errstate(all="ignore"):  # NOTE: ignored rows are 0 even where e / s is NaN
                grad = np.where(kept[:, None], (e / s - q) * x.dtype.type(scale), 0)
            grad = self._new(grad, dtype)
        if metrics is not None:
            loss_total, correct = metrics
            write(loss_total, to_numpy(loss_total) + loss.sum())
            self.count_correct_(logits, target, correct)
        return self._new(out_loss, dtype), grad

    # convolution ------------------------------------------------------------------------------
    # im2col + one BLAS product per direction, in the compute type (float32 unless the input
    # is float64). With K = C/G * kh * kw, L = Ho * Wo and the columns cols_g [K, n L] of group
    # g (_gemm_columns):
    #   forward  y_g [Co/G, L n] = W_g [Co/G, K] @ cols_g
    #   weight   dW_g^T = cols_g @ dy_g^T
    #   input    dcols_g = W_g^T @ dy_g, then col2im: each kernel offset's rows of dcols added
    #            to the strided slice of the padded input it was read from
    # Samples last (_samples_last), every direction runs over pieces of output rows
    # (CONV_ROWS_BYTES) with their columns in the cache. Otherwise (few channels, as the MNIST
    # cnn's first layer) the columns of a whole batch are small: the forward keeps them for the
    # backward (_KeptColumns), and the weight gradient is one product per sample. float32
    # convolutions where the DFT's cost model wins (_dft_conv_plan: the MNIST cnn's second
    # layer, not its first) go through the frequency domain instead (_DftPlan).
    def im2col(self, x, kernel_size, stride=(1, 1), padding=(0, 0), dilation=(1, 1)):
        dtype = dtypes.get_dtype(x.dtype)
        v = to_numpy(x)
        n, c, h, w = v.shape
        kh, kw = kernel_size
        out_hw = _conv_out_hw(h, w, kernel_size, stride, padding, dilation)
        xp = _padded(v, padding, 0)
        cols = np.empty((n, c, kh, kw) + out_hw, v.dtype)
        for i, j, rows, columns in _taps(kernel_size, stride, dilation, out_hw):
            cols[:, :, i, j] = xp[:, :, rows, columns]
        return self._fresh(cols.reshape(n, c * kh * kw, out_hw[0] * out_hw[1]), dtype)

    def col2im(self, cols, output_size, kernel_size, stride=(1, 1), padding=(0, 0),
               dilation=(1, 1)):
        dtype = dtypes.get_dtype(cols.dtype)
        v = self._float_in(cols, dtype)
        h, w = output_size
        kh, kw = kernel_size
        n = v.shape[0]
        c = v.shape[1] // (kh * kw)
        out_hw = _conv_out_hw(h, w, kernel_size, stride, padding, dilation)
        target = np.zeros((n, c, h + 2 * padding[0], w + 2 * padding[1]), v.dtype)
        _accumulate_windows(target, v.reshape(n, c, kh, kw, *out_hw), kernel_size, stride,
                            dilation, out_hw)
        return self._new(target[:, :, padding[0]:padding[0] + h, padding[1]:padding[1] + w], dtype)

    def conv2d(self, x, w, bias=None, stride=(1, 1), padding=(0, 0), dilation=(1, 1), groups=1,
               activation=None):
        if activation not in (None, "relu"):
            raise ValueError(f"conv2d: unknown activation {activation!r} (None or 'relu')")
        y = self._conv2d(x, w, bias, stride, padding, dilation, groups)
        if activation != "relu":
            return y
        if y.dtype == torch.bfloat16:  # (to_numpy is a copy there)
            return self.relu(y)
        v = y.numpy()
        np.maximum(v, np.zeros((), v.dtype), out=v)  # NOTE: NaN stays NaN, as torch.relu
        return y

    def _conv2d(self, x, w, bias, stride, padding, dilation, groups):
        dtype = dtypes.get_dtype(x.dtype)
        v, k = self._float_in(x, dtype), self._float_in(w, dtype)
        n, c, h, wd = v.shape
        co, cg, kh, kw = k.shape
        b = None if bias is None else self._float_in(bias, dtype)[:, None]
        plan = _dft_conv_plan(v, k, stride, padding, dilation, groups)
        if plan is not None:
            with np.errstate(all="ignore"):  # (non-finite values: the direct path warns)
                y = self._conv2d_dft(plan, v, k, b)
            if y is not None:
                return self._fresh(y, dtype)
        out_hw = _conv_out_hw(h, wd, (kh, kw), stride, padding, dilation)
        size, depth = out_hw[0] * out_hw[1], cg * kh * kw
        last = _samples_last(c, (kh, kw), co)
        weights = k.reshape(groups, co // groups, depth)
        y = np.empty((n, co, size), v.dtype)
        chunks = _batch_chunks(n, c * kh * kw * size * v.itemsize)
        for lo, hi in chunks:
            m = hi - lo
            planes = _conv_planes(v[lo:hi], padding, last)
            prod = _workspace("conv_product", (groups, co // groups, size * m), v.dtype)
            row = out_hw[1] * m  # columns per output row (samples last; else one piece)
            # a batch in one chunk keeps whole-batch columns for the backward
            keep = not last and len(chunks) == 1
            into = _kept_columns().buffer(c * kh * kw * size * m * v.itemsize) if keep else None
            for p0, p1 in _row_pieces(out_hw[0], c * kh * kw * row * v.itemsize, last):
                cols = _gemm_columns(planes[:, p0 * stride[0]:], (kh, kw), stride, dilation,
                                     (p1 - p0, out_hw[1]), last, into)
                np.matmul(weights, cols.reshape(groups, depth, (p1 - p0) * row),
                          out=prod[:, :, p0 * row:p1 * row])
            prod = prod.reshape(co, size * m)
            if b is not None:
                np.add(prod, b, out=prod)  # (rows of L m numbers: before the transposition)
            if last:  # [Co, L, m] -> [m, Co, L]
                _transpose_into(y[lo:hi].reshape(m, co * size), prod.reshape(co * size, m))
            else:  # [Co, m, L] -> [m, Co, L]
                np.copyto(y[lo:hi], prod.reshape(co, m, size).transpose(1, 0, 2))
            if keep:
                _kept_columns().keep(into, ((kh, kw), stride, padding, dilation, out_hw), v)
        return self._fresh(y.reshape(n, co, *out_hw), dtype)

    def conv2d_backward(self, dy, x, w, stride=(1, 1), padding=(0, 0), dilation=(1, 1),
                        groups=1, input_grad=True, weight_grad=True, bias_grad=True, gate=None,
                        dw_out=None, db_out=None):
        check_weight_grad_outputs("conv2d_backward", w, dw_out, db_out)
        dx, dw, db = self._conv2d_backward(dy, x, w, stride, padding, dilation, groups,
                                           input_grad, weight_grad, bias_grad, gate)
        if dw is not None and dw_out is not None:
            dw = self.copy_(dw_out, dw)
        if db is not None and db_out is not None:
            db = self.copy_(db_out, db)
        return dx, dw, db

    def _conv2d_backward(self, dy, x, w, stride, padding, dilation, groups, input_grad,
                         weight_grad, bias_grad, gate):
        dtype = dtypes.get_dtype(x.dtype)
        g, v, k = (self._float_in(a, dtype) for a in (dy, x, w))
        if gate is not None:
            if tuple(gate.shape) != g.shape or gate.dtype != dy.dtype:
                raise ValueError(f"conv2d_backward: gate {tuple(gate.shape)} "
                                 f"{dtypes.get_dtype(gate.dtype).name} does not match dy "
                                 f"{g.shape} {dtypes.get_dtype(dy.dtype).name}")
            g = _select(self._float_in(gate, dtype) > 0, g)
        n, c, h, wd = v.shape
        co, cg, kh, kw = k.shape
        out_hw = tuple(g.shape[2:])
        size, depth = out_hw[0] * out_hw[1], cg * kh * kw
        plan = _dft_conv_plan(v, k, stride, padding, dilation, groups) \
            if input_grad or weight_grad else None
        grads = None
        if plan is not None:
            with np.errstate(all="ignore"):
                grads = self._conv2d_backward_dft(plan, g, v, k, input_grad, weight_grad)
        if grads is not None:
            db = g.reshape(n, co, size).sum(axis=2).sum(axis=0) if bias_grad else None
            return (None if grads[0] is None else self._fresh(grads[0], dtype),
                    None if grads[1] is None else self._fresh(grads[1], dtype),
                    self._new(db, dtype) if bias_grad else None)
        last = _samples_last(c, (kh, kw), co)
        weights = k.reshape(groups, co // groups, depth)
        dx = np.empty((n, c, h, wd), g.dtype) if input_grad else None
        dw = np.zeros((groups, co // groups, depth), g.dtype) if weight_grad else None
        db = None
        chunks = _batch_chunks(n, c * kh * kw * size * v.itemsize)
        key = ((kh, kw), stride, padding, dilation, out_hw)
        for lo, hi in chunks if input_grad or weight_grad else ():
            m = hi - lo
            gm = g[lo:hi].reshape(m, co, size)
            row = out_hw[1] * m  # columns per output row (samples last; else one piece)
            dyt = None
            if last or input_grad:  # dy of the chunk as [G, Co/G, L m], in the columns' order
                dyt = _workspace("conv_dy", (co, size * m), g.dtype)
                if last:  # [m, Co, L] -> [Co, L, m]
                    _transpose_into(dyt.reshape(co * size, m), gm.reshape(m, co * size))
                else:  # [m, Co, L] -> [Co, m, L]
                    np.copyto(dyt.reshape(co, m, size), gm.transpose(1, 0, 2))
                if bias_grad:  # (contiguous rows: faster than a sum over dy's axes 0, 2, 3)
                    db = dyt.sum(axis=1) if db is None else db + dyt.sum(axis=1)
                dyt = dyt.reshape(groups, co // groups, size * m)
            kept = _kept_columns().take(key, v) if weight_grad and not last and \
                len(chunks) == 1 else None
            planes = _conv_planes(v[lo:hi], padding, last) if weight_grad and kept is None \
                else None
            grad_planes = _zero_planes(m, c, (h, wd), padding, last, g.dtype) if input_grad \
                else None
            for p0, p1 in _row_pieces(out_hw[0], c * kh * kw * row * g.itemsize, last):
                piece_hw, span = (p1 - p0, out_hw[1]), slice(p0 * row, p1 * row)
                if weight_grad and last:
                    cols = _gemm_columns(planes[:, p0 * stride[0]:], (kh, kw), stride,
                                         dilation, piece_hw, last)
                    # dW^T = cols @ dy^T: OpenBLAS runs this orientation ~15% faster than
                    # dy @ cols^T at the MNIST cnn's shapes (a long K = L m)
                    dw += np.matmul(cols.reshape(groups, depth, -1),
                                    dyt[:, :, span].transpose(0, 2, 1)).transpose(0, 2, 1)
                elif weight_grad:
                    # columns (sample, p, q): one product per sample straight from dy, summed,
                    # instead of dy transposed to the columns' order first (2x faster for the
                    # MNIST cnn's first layer: K = 25, L = 784)
                    cols = kept[:c * kh * kw * size * m * g.itemsize].view(g.dtype) \
                        if kept is not None else _gemm_columns(planes, (kh, kw), stride,
                                                               dilation, out_hw, last)
                    per_sample = np.matmul(
                        cols.reshape(groups, depth, m, size).transpose(0, 2, 1, 3),
                        gm.reshape(m, groups, co // groups, size).transpose(1, 0, 3, 2))
                    dw += per_sample.sum(axis=1).transpose(0, 2, 1)
                if input_grad:
                    dcols = np.matmul(weights.transpose(0, 2, 1), dyt[:, :, span],
                                      out=_workspace("column_grads",
                                                     (groups, depth, (p1 - p0) * row), g.dtype))
                    _add_columns(grad_planes[:, p0 * stride[0]:] if last else grad_planes,
                                 dcols, (kh, kw), stride, dilation, piece_hw, last)
            if input_grad:
                dx[lo:hi] = _interior(grad_planes, padding, (h, wd), last)
        if bias_grad and db is None:
            db = g.reshape(n, co, size).sum(axis=2).sum(axis=0)
        return (None if dx is None else self._fresh(dx, dtype),
                None if dw is None else self._fresh(dw.reshape(co, cg, kh, kw), dtype),
                self._new(db, dtype) if bias_grad else None)

    # The DFT path (_DftPlan): each returns None when a value is not finite (the caller then
    # takes the direct path, whose NaN and inf stay where the windows put them).
    @staticmethod
    def _conv2d_dft(plan, v, k, bias):
        """y [n, Co, Ho, Wo] = conv(v, k) + bias: per chunk of samples, x's spectra, one
        product per bin with the kernel's spectra, the inverse; bias added to bin 0."""
        n, c, h, w = v.shape
        co = k.shape[0]
        kb = plan.kernel_spectra(k)
        if not np.isfinite(kb[0]).all() or (bias is not None and not np.isfinite(bias).all()):
            return None
        y = np.empty((n, co) + plan.out_hw, v.dtype)
        for lo, hi in _dft_chunks(n, plan, c, co, v.itemsize):
            m = hi - lo
            xs = plan.spectra(_to_planes(v[lo:hi], "dft_planes").reshape(h, w, c * m), "dft_x")
            if not _all_finite(xs):
                return None
            ys = np.matmul(kb, xs.reshape(plan.bins, 2 * c, m),
                           out=_workspace("dft_y", (plan.bins, 2 * co, m), v.dtype))
            if bias is not None:  # a constant plane's spectrum: Ph Pw b at bin 0, real
                ys[0, :co] += bias * (plan.period[0] * plan.period[1])
            out = plan.outputs(ys.reshape(plan.bins, 2, co * m), "dft_planes")
            _from_planes(y[lo:hi], out.reshape(*plan.out_hw, co, m))
        _kept_kernel_spectra().keep(plan, k, kb)
        return y

    @staticmethod
    def _conv2d_backward_dft(plan, g, v, k, input_grad, weight_grad):
        """(dx, dk) by the transposes of the forward's maps: dy's spectra are
        outputs_adjoint(dy); dx = spectra_adjoint(Kb^T @ them) and dKb = them @ X^T per bin."""
        n, c, h, w = v.shape
        co = k.shape[0]
        kb = None
        if input_grad:
            kb = _kept_kernel_spectra().take(plan, k)
            kb = plan.kernel_spectra(k) if kb is None else kb
            if not np.isfinite(kb[0]).all():
                return None
        dx = np.empty(v.shape, v.dtype) if input_grad else None
        dkb = None
        for lo, hi in _dft_chunks(n, plan, c, co, v.itemsize):
            m = hi - lo
            dys = plan.outputs_adjoint(_to_planes(g[lo:hi], "dft_planes").reshape(
                *plan.out_hw, co * m), "dft_y")
            if not _all_finite(dys):
                return None
            dys = dys.reshape(plan.bins, 2 * co, m)
            if weight_grad:
                xs = plan.spectra(_to_planes(v[lo:hi], "dft_planes").reshape(h, w, c * m),
                                  "dft_x")
                if not _all_finite(xs):
                    return None
                # X^T copied first: OpenBLAS runs this product with a transposed right operand
                # (K = m) at half the rate on one thread and a quarter on two
                xs_t = _workspace("dft_xt", (plan.bins, m, 2 * c), v.dtype)
                np.copyto(xs_t, xs.reshape(plan.bins, 2 * c, m).transpose(0, 2, 1))
                part = np.matmul(dys, xs_t)
                dkb = part if dkb is None else np.add(dkb, part, out=dkb)
            if input_grad:
                dxs = np.matmul(kb.transpose(0, 2, 1), dys,
                                out=_workspace("dft_x", (plan.bins, 2 * c, m), v.dtype))
                planes = plan.spectra_adjoint(dxs.reshape(plan.bins, 2, c * m), "dft_planes")
                _from_planes(dx[lo:hi], planes.reshape(h, w, c, m))
        return dx, None if dkb is None else plan.kernel_grad(dkb)

    # pooling ------------------------------------------------------------------------------------
    # One pass per kernel offset over strided views of the padded input (_taps), as the
    # convolution: no copy of the windows, no loop over pixels.
    def _pool_geometry(self, shape, kernel, stride, padding, dilation, ceil_mode):
        h, w = shape[2:]
        out_hw = tuple(pool_output_size(size, k, s, p, d, ceil_mode) for size, k, s, p, d in
                       zip((h, w), kernel, stride, padding, dilation))
        # ceil_mode windows may run past the right padding: pad that far as well
        extra = tuple(max(0, (o - 1) * s + d * (k - 1) + 1 - (size + 2 * p)) for o, s, d, k, size, p
                      in zip(out_hw, stride, dilation, kernel, (h, w), padding))
        return out_hw, extra

    @staticmethod
    def _tap_positions(shape, kernel, stride, padding, dilation, out_hw):
        """[kh * kw, Ho, Wo] int64: for kernel offset t = i * kw + j, the flat index h * W + w
        in the input plane that window (p, q) reads there, or -2 where it reads padding (an
        index that no argmax has, not even -1)."""
        h, w = shape[2:]
        positions = np.empty((kernel[0] * kernel[1],) + tuple(out_hw), np.int64)
        for i in range(kernel[0]):
            rows = np.arange(out_hw[0])[:, None] * stride[0] - padding[0] + i * dilation[0]
            for j in range(kernel[1]):
                cols = np.arange(out_hw[1])[None, :] * stride[1] - padding[1] + j * dilation[1]
                real = (rows >= 0) & (rows < h) & (cols >= 0) & (cols < w)
                positions[i * kernel[1] + j] = np.where(real, rows * w + cols, -2)
        return positions

    @staticmethod
    def _window_corners(shape, kernel, stride, padding, dilation, out_hw):
        """(corner [Ho, Wo], shift [kh * kw]) int64: kernel offset t = i * kw + j of window
        (p, q) reads the flat position h * W + w = (p sh - ph + i dh) W + (q sw - pw + j dw)
        = corner[p, q] + shift[t] of an input plane (meaningless where that is padding)."""
        w = shape[3]
        rows = np.arange(out_hw[0])[:, None] * stride[0] - padding[0]
        cols = np.arange(out_hw[1])[None, :] * stride[1] - padding[1]
        shift = np.array([i * dilation[0] * w + j * dilation[1]
                          for i in range(kernel[0]) for j in range(kernel[1])], np.int64)
        return rows * w + cols, shift

    @staticmethod
    def _tiled(kernel, stride, padding, dilation, extra):
        """Whether the windows tile the input: side by side (stride = kernel), no padding, no
        dilation, no ceil_mode overhang. Max pooling then has the faster paths below."""
        return tuple(kernel) == tuple(stride) and not any(padding) and \
            tuple(dilation) == (1, 1) and not any(extra) and kernel[0] * kernel[1] < 127

    def _max_pool_tiled(self, v, kernel, out_hw, with_indices):
        """(y, index or None) of max_pool2d over tiled windows (_tiled), or None where the
        general path must decide (a NaN, a -0.0).

        The windows are copied once into [kh kw, n, C, Ho, Wo], offset by offset, so that every
        later pass runs over contiguous arrays (numpy's loops over the strided views run Wo
        numbers at a time: 14 on the MNIST cnn). y is the np.maximum of the offsets, and the
        index that of the first offset equal to it: the first maximum wins, as torch. That is
        the general path's result bit for bit except where it cannot be: np.maximum may keep
        either zero of a tie of -0.0 and 0.0, and a NaN is the maximum only there."""
        (kh, kw), (ho, wo) = kernel, out_hw
        n, c, h, w = v.shape
        tiles = _workspace("pool_tiles", (kh, kw, n, c, ho, wo), v.dtype)
        np.copyto(tiles, v[:, :, :ho * kh, :wo * kw].reshape(n, c, ho, kh, wo, kw)
                  .transpose(3, 5, 0, 1, 2, 4))
        tiles = tiles.reshape(kh * kw, n, c, ho, wo)
        y = tiles[0].copy() if len(tiles) == 1 else np.maximum(tiles[0], tiles[1])
        for tile in tiles[2:]:
            np.maximum(y, tile, out=y)
        bits = np.dtype(f"u{v.itemsize}")
        infinity, negative_zero = np.array([np.inf, -0.0], v.dtype).view(bits)
        # no NaN and no -0.0 for sure when no bit pattern lies above +inf's (no negative
        # number, no NaN: a relu's output), else look for them (one reduction, no temporary)
        if tiles.view(bits).max() > infinity and (
                np.isnan(y).any() or (tiles.view(bits) == negative_zero).any()):
            return None
        if not with_indices:
            return y, None
        # tap: how many offsets come before the first one holding the maximum
        later = tiles[0] != y
        tap = later.view(np.int8).copy()
        differs = np.empty_like(later)
        for tile in tiles[1:-1]:
            np.not_equal(tile, y, out=differs)
            later &= differs
            tap += later.view(np.int8)
        corner, shift = self._window_corners(v.shape, kernel, kernel, (0, 0), (1, 1), out_hw)
        index = np.take(shift, tap)
        index += corner
        return y, index

    def _check_max_pool_backward(self, dy, indices, input_shape, out_hw):
        n, c = input_shape[:2]
        if tuple(dy.shape) != (n, c) + tuple(out_hw) or tuple(indices.shape) != tuple(dy.shape):
            raise ValueError(f"max_pool2d_backward: dy {tuple(dy.shape)} and indices "
                             f"{tuple(indices.shape)} do not match the output "
                             f"{(n, c) + tuple(out_hw)} of input {tuple(input_shape)}")

    def max_pool2d(self, x, kernel_size, stride, padding=(0, 0), dilation=(1, 1),
                   ceil_mode=False, with_indices=True):
        dtype = dtypes.get_dtype(x.dtype)
        v = self._float_in(x, dtype)
        n, c, h, w = v.shape
        out_hw, extra = self._pool_geometry(v.shape, kernel_size, stride, padding, dilation,
                                            ceil_mode)
        if v.size and min(out_hw) > 0 and \
                self._tiled(kernel_size, stride, padding, dilation, extra):
            tiled = self._max_pool_tiled(v, kernel_size, out_hw, with_indices)
            if tiled is not None:
                y, index = tiled
                return self._fresh(y, dtype), \
                    None if index is None else self._fresh(index, dtypes.int64)
        positions = self._tap_positions(v.shape, kernel_size, stride, padding, dilation, out_hw)
        # a window whose real elements are all -inf points at its first real element, never at
        # padding (as torch); one lying wholly in the padding (dilated) gets -1
        first_real = np.full(out_hw, -1, np.int64)
        for at in positions[::-1]:
            first_real = np.where(at >= 0, at, first_real)
        y = np.full((n, c) + out_hw, -np.inf, v.dtype)
        if y.size == 0:
            return self._fresh(y, dtype), self._new(np.broadcast_to(first_real, y.shape),
                                                    dtypes.int64) if with_indices else None
        xp = _padded(v, padding, -np.inf, extra)
        nan = bool(np.isnan(v).any())
        # taken: 1 + the kernel offset of the element y holds (0: none yet); offsets come in
        # increasing order, so the latest one taken is the largest
        taken = np.zeros(y.shape, np.int8 if len(positions) < 127 else np.int32)
        for t, (_, _, rows, columns) in enumerate(_taps(kernel_size, stride, dilation, out_hw)):
            window = np.ascontiguousarray(xp[:, :, rows, columns])
            # the first maximum wins: take strictly larger values only, and the first NaN (the
            # maximum, as in torch) over any number; padding (-inf) is never taken
            take = window > y
            if nan:
                take |= np.isnan(window) & ~np.isnan(y)
            y = _select(take, window, y)
            if with_indices:
                np.maximum(taken, take * taken.dtype.type(t + 1), out=taken)
        if not with_indices:
            return self._fresh(y, dtype), None
        # index: the flat position that the offset t = taken - 1 of window (p, q) reads
        corner, shift = self._window_corners(v.shape, kernel_size, stride, padding, dilation,
                                             out_hw)
        index = np.take(np.concatenate([[0], shift]), taken.astype(np.intp)) + corner
        none = taken == 0
        if none.any():
            index[none] = np.broadcast_to(first_real, y.shape)[none]
        return self._fresh(y, dtype), self._fresh(index, dtypes.int64)

    def max_pool2d_backward(self, dy, indices, input_shape, kernel_size, stride, padding=(0, 0),
                            dilation=(1, 1), ceil_mode=False, gate=None):
        # dx[h, w] = the sum of dy over the windows that hold (h, w) and whose argmax it is:
        # a gather, window offset by window offset (the order the kernel sums in); with a
        # gate, the windows where gate <= 0 give nothing
        dtype = dtypes.get_dtype(dy.dtype)
        input_shape = tuple(int(s) for s in input_shape)
        n, c, h, w = input_shape
        out_hw, extra = self._pool_geometry(input_shape, kernel_size, stride, padding, dilation,
                                            ceil_mode)
        self._check_max_pool_backward(dy, indices, input_shape, out_hw)
        g = self._float_in(dy, dtype)
        if gate is not None:
            if tuple(gate.shape) != tuple(dy.shape):
                raise ValueError(f"max_pool2d_backward: gate {tuple(gate.shape)} does not "
                                 f"match dy {tuple(dy.shape)}")
            g = np.where(to_numpy(gate) > 0, g, g.dtype.type(0))
        if g.size and self._tiled(kernel_size, stride, padding, dilation, extra):
            # tiled windows: each index that lies in its own window (all of them, from our
            # forward) is a distinct position, so the gather is one assignment dx[index] = dy
            corner, shift = self._window_corners(input_shape, kernel_size, stride, padding,
                                                 dilation, out_hw)
            index = to_numpy(indices)
            at = index - corner
            inside = at == shift[0]
            for offset in shift[1:]:
                inside |= at == offset
            if inside.all():
                dx = np.zeros((n, c, h, w), g.dtype)
                planes = np.arange(n * c, dtype=np.int64).reshape(n, c, 1, 1) * (h * w)
                dx.reshape(-1)[(index + planes).reshape(-1)] = g.reshape(-1)
                return self._fresh(dx, dtype)
        target = np.zeros((n, c, h + 2 * padding[0] + extra[0], w + 2 * padding[1] + extra[1]),
                          g.dtype)
        if g.size:
            # window (p, q) holds the flat position corner[p, q] + shift[t] at kernel offset t
            # (_window_corners). A match at an offset that reads padding lands in the padding
            # of target, which is cut off: only indices of real positions in the window count.
            corner, shift = self._window_corners(input_shape, kernel_size, stride, padding,
                                                 dilation, out_hw)
            at = to_numpy(indices) - corner
            # windows side by side (no position in two of them): each offset writes its own
            # positions, so it can assign instead of adding (half the memory traffic)
            apart = dilation == (1, 1) and all(s >= k for s, k in zip(stride, kernel_size))
            for t, (_, _, rows, columns) in enumerate(_taps(kernel_size, stride, dilation,
                                                            out_hw)):
                if apart:
                    target[:, :, rows, columns] = _select(at == shift[t], g)
                else:
                    target[:, :, rows, columns] += _select(at == shift[t], g)
        dx = np.ascontiguousarray(target[:, :, padding[0]:padding[0] + h,
                                         padding[1]:padding[1] + w])
        return self._fresh(dx, dtype)

    def _avg_divisor(self, shape, kernel, stride, padding, ceil_mode, count_include_pad,
                     divisor_override, out_hw):
        if divisor_override:
            return np.float64(divisor_override)
        sizes = []
        for axis in range(2):
            size, k, s, p = shape[2 + axis], kernel[axis], stride[axis], padding[axis]
            start = np.arange(out_hw[axis]) * s - p
            end = np.minimum(start + k, size + p)
            full = end - start  # window clipped to the padded input (torch's pool_size)
            inside = np.minimum(end, size) - np.maximum(start, 0)
            sizes.append(full if count_include_pad else inside)
        return sizes[0][:, None] * sizes[1][None, :]

    def avg_pool2d(self, x, kernel_size, stride, padding=(0, 0), ceil_mode=False,
                   count_include_pad=True, divisor_override=None):
        dtype = dtypes.get_dtype(x.dtype)
        v = self._float_in(x, dtype)
        out_hw, extra = self._pool_geometry(v.shape, kernel_size, stride, padding, (1, 1),
                                            ceil_mode)
        xp = _padded(v, padding, 0, extra)
        total = np.zeros(v.shape[:2] + out_hw, v.dtype)
        for _, _, rows, columns in _taps(kernel_size, stride, (1, 1), out_hw):
            total += xp[:, :, rows, columns]
        div = self._avg_divisor(v.shape, kernel_size, stride, padding, ceil_mode,
                                count_include_pad, divisor_override, out_hw)
        total /= np.asarray(div).astype(v.dtype)
        return self._fresh(total, dtype)

    def avg_pool2d_backward(self, dy, input_shape, kernel_size, stride, padding=(0, 0),
                            ceil_mode=False, count_include_pad=True, divisor_override=None):
        dtype = dtypes.get_dtype(dy.dtype)
        g = self._float_in(dy, dtype)
        n, c, h, w = input_shape
        out_hw, extra = self._pool_geometry(input_shape, kernel_size, stride, padding, (1, 1),
                                            ceil_mode)
        div = self._avg_divisor(input_shape, kernel_size, stride, padding, ceil_mode,
                                count_include_pad, divisor_override, out_hw)
        share = g / np.asarray(div).astype(g.dtype)  # each window's dy / divisor
        target = np.zeros((n, c, h + 2 * padding[0] + extra[0], w + 2 * padding[1] + extra[1]),
                          g.dtype)
        for _, _, rows, columns in _taps(kernel_size, stride, (1, 1), out_hw):
            target[:, :, rows, columns] += share
        return self._new(target[:, :, padding[0]:padding[0] + h, padding[1]:padding[1] + w], dtype)

    # indexing ---------------------------------------------------------------------------------
    def _check_index(self, op, idx, rows):
        if idx.size and (idx.min() < -rows or idx.max() >= rows):
            bad = idx[(idx < -rows) | (idx >= rows)][0]
            raise IndexError(f"{op}: index {int(bad)} is out of bounds for dimension 0 "
                             f"with size {rows}")
        return np.where(idx < 0, idx + rows, idx)

    def gather_rows(self, x, index):
        v = to_numpy(x)
        idx = self._check_index("gather_rows", to_numpy(index).astype(np.int64), v.shape[0])
        return self._new(v[idx], dtypes.get_dtype(x.dtype))

    def scatter_add_rows(self, src, index, num_rows):
        dtype = dtypes.get_dtype(src.dtype)
        v = self._float_in(src, dtype) if dtype.is_floating_point else to_numpy(src)
        idx = self._check_index("scatter_add_rows", to_numpy(index).astype(np.int64), num_rows)
        out = np.zeros((num_rows,) + v.shape[idx.ndim:], v.dtype)
        np.add.at(out, idx.reshape(-1), v.reshape((-1,) + v.shape[idx.ndim:]))
        return self._new(out, dtype)

    def gather_rows_at_(self, sources, outs, table, cursor):
        check_gather_rows_at(sources, outs, table, cursor)
        row = to_numpy(table)[int(to_numpy(cursor).reshape(-1)[0]) % table.shape[0]]
        for x, out in zip(sources, outs):
            write(out, to_numpy(self.gather_rows(x, self._new(row, dtypes.int64))))
        return outs

    def take_row_(self, table, cursor, out, advance=False):
        check_take_row(table, cursor, out)
        c = to_numpy(cursor)
        write(out, to_numpy(table)[int(c.reshape(-1)[0]) % table.shape[0]])
        if advance:
            c[...] = c + 1
        return out

    # the fused MLP step -------------------------------------------------------------------------
    def mlp_cross_entropy_grads_(self, x, target, weights, biases, weight_grads, bias_grads,
                                 metrics, rows=None, cursor=None, advance=False):
        op = "mlp_cross_entropy_grads_"
        batch = check_mlp_cross_entropy(x, target, weights, biases, weight_grads, bias_grads,
                                        metrics, rows, cursor, advance)
        n = x.shape[0]
        index = np.arange(n)
        if rows is not None:
            index = to_numpy(rows).astype(np.int64)
            if index.ndim == 2:
                index = index[int(to_numpy(cursor).reshape(-1)[0]) % index.shape[0]]
        bad = (index < -n) | (index >= n)
        if bad.any():
            raise IndexError(f"{op}: index {int(index[bad][0])} (batch row "
                             f"{int(np.argmax(bad))}) is out of bounds for dimension 0 with "
                             f"size {n}")
        index = index % n
        t = to_numpy(target)[index].astype(np.int64)
        n_classes = weights[-1].shape[0]
        bad = (t < 0) | (t >= n_classes)
        if bad.any():
            raise ValueError(f"{op}: target {int(t[bad][0])} (sample "
                             f"{int(index[np.argmax(bad)])}) is outside [0, {n_classes})")
        ws = [to_numpy(w).astype(np.float32) for w in weights]
        hs = [to_numpy(x)[index].astype(np.float32, copy=False)]
        for w, b in zip(ws[:-1], biases[:-1]):
            hs.append(np.maximum(hs[-1] @ w.T + to_numpy(b), 0))
        logits = hs[-1] @ ws[-1].T + to_numpy(biases[-1])
        z = logits - logits.max(axis=1, keepdims=True)
        e = np.exp(z)
        s = e.sum(axis=1, keepdims=True)
        rows_loss = np.log(s[:, 0]) - z[np.arange(batch), t]
        dz = e / s
        dz[np.arange(batch), t] -= 1
        dz /= np.float32(batch)
        for layer in reversed(range(len(ws))):
            write(weight_grads[layer], dz.T @ hs[layer])
            write(bias_grads[layer], dz.sum(axis=0))
            if layer:
                dz = (dz @ ws[layer]) * (hs[layer] > 0)
        loss_total, correct = metrics
        write(loss_total, to_numpy(loss_total) + rows_loss.sum())
        c = to_numpy(correct)
        c[...] = c + int((np.argmax(logits, axis=1) == t).sum())
        if advance:
            k = to_numpy(cursor)
            k[...] = k + 1
        return self._new(np.float32(rows_loss.sum() / batch), dtypes.float32)

    # random -----------------------------------------------------------------------------------
    def uniform(self, shape, low, high, seed, offset, dtype, device):
        self.check_device("uniform", device)
        w0, _ = random_words(math.prod(shape), seed, offset)
        u = uniform01(w0)
        return self._new((low + (high - low) * u).reshape(shape), dtype)

    def normal(self, shape, mean, std, seed, offset, dtype, device):
        self.check_device("normal", device)
        w0, w1 = random_words(math.prod(shape), seed, offset)
        return self._new((mean + std * normal01(w0, w1)).reshape(shape), dtype)

    def dropout(self, x, p, seed, offset):
        dtype = dtypes.get_dtype(x.dtype)
        w0, _ = random_words(x.numel(), seed, offset)
        keep = (uniform01(w0) >= np.float32(p)).reshape(tuple(x.shape))
        scale = 1.0 / (1.0 - p) if p < 1 else 0.0
        y = self._float_in(x, dtype) * keep * np.float32(scale)
        return self._new(y, dtype), self._new(keep, dtypes.bool_)

    def randperm(self, n, seed, offset, device):
        self.check_device("randperm", device)
        return self._new(randperm_numpy(n, seed, offset), dtypes.int64)

    # optimizers -------------------------------------------------------------------------------
    @staticmethod
    def _number(v):
        return float(to_numpy(v).reshape(-1)[0]) if isinstance(v, torch.Tensor) else float(v)

    @staticmethod
    def _decayed_grad(param, grad, weight_decay, maximize):
        """(p, g): the parameters (a view) and g = (-grad if maximize else grad) + wd * p, the
        gradient itself (a view: the updates only read it) when that is all."""
        p, g = to_numpy(param), to_numpy(grad).astype(np.float32, copy=False)
        if maximize:
            g = -g
        if weight_decay:
            g = g + np.float32(weight_decay) * p
        return p, g

    @staticmethod
    def _count(count):
        if count is not None:
            c = to_numpy(count)
            c[...] = c + np.float32(1)

    def sgd_step_(self, param, grad, momentum_buf, lr, momentum=0.0, dampening=0.0,
                  weight_decay=0.0, nesterov=False, maximize=False, first_step=False):
        p, g = self._decayed_grad(param, grad, weight_decay, maximize)
        lr, momentum = np.float32(self._number(lr)), np.float32(self._number(momentum))
        # in place, each product and sum rounded once as written (a flat buffer of a whole
        # model: temporaries of its size cost as much as the arithmetic)
        if momentum:
            buf = to_numpy(momentum_buf)
            if first_step:
                buf[...] = g
            else:
                np.multiply(buf, momentum, out=buf)
                damped = g if dampening == 0 else g * np.float32(1 - dampening)  # (1 * g = g)
                np.add(buf, damped, out=buf)
            g = g + momentum * buf if nesterov else buf
        step = _workspace("sgd_step", g.shape, np.result_type(lr, g))
        np.multiply(g, lr, out=step)
        np.subtract(p, step, out=p)
        return param

    def adam_step_(self, param, grad, exp_avg, exp_avg_sq, step, lr, beta1=0.9, beta2=0.999,
                   eps=1e-8, weight_decay=0.0, decoupled_weight_decay=False, maximize=False):
        p, g = to_numpy(param), to_numpy(grad).astype(np.float32)
        m, v = to_numpy(exp_avg), to_numpy(exp_avg_sq)
        lr, step = np.float32(self._number(lr)), self._number(step)
        if maximize:
            g = -g
        if weight_decay:
            if decoupled_weight_decay:
                p *= np.float32(1 - lr * weight_decay)
            else:
                g = g + np.float32(weight_decay) * p
        m[...] = beta1 * m + (1 - beta1) * g
        v[...] = beta2 * v + (1 - beta2) * g * g
        bias1 = np.float32(1 - beta1 ** step)
        bias2 = np.float32(1 - beta2 ** step)
        p -= lr * (m / bias1) / (np.sqrt(v / bias2) + np.float32(eps))
        return param

    # NOTE: the three below compute in float32 in torch's order of operations (1 - rho and
    # 1 - alpha rounded once from float64, as torch's scalar arguments), so that hundreds of
    # steps agree with torch.optim to float32 rounding
    def adadelta_step_(self, param, grad, square_avg, acc_delta, lr, rho=0.9, eps=1e-6,
                       weight_decay=0.0, maximize=False, count=None):
        p, g = self._decayed_grad(param, grad, weight_decay, maximize)
        v, u = to_numpy(square_avg), to_numpy(acc_delta)
        f = np.float32
        lr, eps, keep, take = f(self._number(lr)), f(eps), f(rho), f(1 - rho)
        v[...] = keep * v + take * g * g
        delta = np.sqrt(u + eps) / np.sqrt(v + eps) * g
        u[...] = keep * u + take * delta * delta
        p -= lr * delta
        self._count(count)
        return param

    def rmsprop_step_(self, param, grad, square_avg, grad_avg, momentum_buf, lr, alpha=0.99,
                      eps=1e-8, weight_decay=0.0, momentum=0.0, centered=False, maximize=False,
                      count=None):
        p, g = self._decayed_grad(param, grad, weight_decay, maximize)
        v = to_numpy(square_avg)
        f = np.float32
        lr, momentum, eps = f(self._number(lr)), f(self._number(momentum)), f(eps)
        w = f(1 - alpha)
        v[...] = f(alpha) * v + w * g * g
        square = v
        if centered:
            a = to_numpy(grad_avg)
            a[...] = a + w * (g - a) if w < 0.5 else g - (g - a) * (f(1) - w)  # torch's lerp
            square = v - a * a
        avg = np.sqrt(square) + eps
        if momentum:
            buf = to_numpy(momentum_buf)
            buf[...] = momentum * buf + g / avg
            p -= lr * buf
        else:
            p -= lr * (g / avg)
        self._count(count)
        return param

    def adagrad_step_(self, param, grad, state_sum, step, lr, lr_decay=0.0, eps=1e-10,
                      weight_decay=0.0, maximize=False, count=None):
        p, g = self._decayed_grad(param, grad, weight_decay, maximize)
        s = to_numpy(state_sum)
        f = np.float32
        lr = f(self._number(lr))
        clr = lr / (f(1) + (f(self._number(step)) - f(1)) * f(lr_decay)) if lr_decay else lr
        s[...] = s + g * g
        p -= clr * (g / (np.sqrt(s) + f(eps)))
        self._count(count)
        return param

    def total_norm(self, arrays, norm_type=2.0):
        """The L_p norm of all elements of all arrays together (0-d float32): p = 2, 1, inf
        (max |x|) or any finite p > 0."""
        arrays = list(arrays)
        if not arrays:
            raise ValueError("total_norm: no arrays given")
        p = float(norm_type)
        if not p > 0:
            raise ValueError(f"total_norm: norm_type must be a positive number or inf, got {p}")
        values = np.concatenate([np.abs(to_numpy(a).astype(np.float64)).reshape(-1)
                                 for a in arrays])
        if p == math.inf:
            norm = values.max() if values.size else 0.0
        else:
            norm = np.sum(values ** p) ** (1.0 / p)
        return self._new(np.float32(norm), dtypes.float32)

    def clip_scale_(self, arrays, total_norm, max_norm, eps=1e-6):
        """x *= min(1, max_norm / (total_norm + eps)) for each array, in place."""
        coef = np.minimum(np.float32(max_norm) / (np.float32(self._number(total_norm))
                                                  + np.float32(eps)), np.float32(1.0))
        for a in arrays:
            write(a, self._float_in(a, dtypes.get_dtype(a.dtype)) * coef)
        return list(arrays)


register_backend("numpy", NumpyBackend)


# ------------------------------------------------------------------------ image augmentation
# Per-sample random geometric warps of an image batch (tritonad.transforms' RandomAffine,
# RandomRotation, RandomCrop): the executable spec of Backend.random_warp, step by step in
# float32 as the kernel (tritonad/kernels/augment.py) computes it.

DEG_TO_RAD = np.float32(math.pi / 180)


def check_random_warp(x, out_size, crop, ranges):
    """The argument checks of Backend.random_warp, shared by the backends; returns (Ho, Wo)."""
    op = "random_warp"
    if x.dim() != 4:
        raise ValueError(f"{op}: images must be [N, C, H, W], got shape {tuple(x.shape)}")
    if x.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise TypeError(f"{op}: images must be float32, float16 or bfloat16, got "
                        f"{dtypes.get_dtype(x.dtype).name}")
    out_h, out_w = (int(s) for s in out_size)
    if out_h < 1 or out_w < 1:
        raise ValueError(f"{op}: the output size must be positive, got {tuple(out_size)}")
    if len(ranges) != (4 if crop else 6):
        raise ValueError(f"{op}: {'crop' if crop else 'affine'} takes "
                         f"{4 if crop else 6} ranges, got {len(ranges)}")
    if not crop and (out_h, out_w) != tuple(x.shape[2:]):
        raise ValueError(f"{op}: an affine warp keeps the image size {tuple(x.shape[2:])}, got "
                         f"an output size of {(out_h, out_w)}")
    return out_h, out_w


def random_warp_sources(n, out_size, in_size, crop, ranges, seed, offset):
    """Where each output pixel of each sample reads: (sx, sy) float32 [n, Ho * Wo] in input
    pixel coordinates, from the sample's four Philox words (counter offset + i)."""
    counter = np.arange(n, dtype=np.uint64) + np.uint64(offset)
    words = philox((counter & _MASK32).astype(np.uint32),
                   (counter >> np.uint64(32)).astype(np.uint32), 0, 0, seed)
    u = [uniform01(w)[:, None] for w in words]  # [n, 1] each
    out_h, out_w = out_size
    pixel = np.arange(out_h * out_w)
    x = (pixel % out_w).astype(np.float32)[None]
    y = (pixel // out_w).astype(np.float32)[None]
    r = [np.float32(v) for v in ranges]
    one, half = np.float32(1), np.float32(0.5)
    if crop:  # ranges: pad top, pad left, span y, span x
        top = np.floor(u[0] * (r[2] + one))
        left = np.floor(u[1] * (r[3] + one))
        return x + (left - r[1]), y + (top - r[0])
    # ranges: degrees low, high; largest shift x, y in pixels; scale low, high
    angle = r[0] + (r[1] - r[0]) * u[0]
    theta = angle * DEG_TO_RAD
    tx = np.floor(r[2] * (np.float32(2) * u[1] - one) + half)
    ty = np.floor(r[3] * (np.float32(2) * u[2] - one) + half)
    scale = r[4] + (r[5] - r[4]) * u[3]
    theta64 = theta.astype(np.float64)  # NOTE: float64 cos and sin, rounded once
    a = np.cos(theta64).astype(np.float32) / scale
    b = np.sin(theta64).astype(np.float32) / scale
    cx, cy = np.float32(in_size[1] - 1) * half, np.float32(in_size[0] - 1) * half
    dx, dy = x - cx - tx, y - cy - ty
    return a * dx - b * dy + cx, b * dx + a * dy + cy


def sample_image(v, sx, sy, fill, bilinear):
    """v: float32 [n, C, H, W]; sx, sy: float32 [n, P] source positions. Returns [n, C, P]:
    the nearest pixel (floor(s + 0.5)) or the bilinear blend of the four around s; pixels
    outside the image read `fill`."""
    n, c, h, w = v.shape
    fill = np.float32(fill)

    def tap(iy, ix):  # [n, C, P]: v at integer positions, fill outside
        inside = (iy >= 0) & (iy < h) & (ix >= 0) & (ix < w)
        flat = (np.clip(iy, 0, h - 1) * w + np.clip(ix, 0, w - 1)).astype(np.int64)
        got = np.take_along_axis(v.reshape(n, c, h * w), flat[:, None].repeat(c, 1), axis=2)
        return np.where(inside[:, None], got, fill)

    if not bilinear:
        return tap(np.floor(sy + np.float32(0.5)), np.floor(sx + np.float32(0.5)))
    x0, y0 = np.floor(sx), np.floor(sy)
    fx, fy = (sx - x0)[:, None], (sy - y0)[:, None]
    gx, gy = np.float32(1) - fx, np.float32(1) - fy
    top = gx * tap(y0, x0) + fx * tap(y0, x0 + 1)
    bottom = gx * tap(y0 + 1, x0) + fx * tap(y0 + 1, x0 + 1)
    return gy * top + fy * bottom


def _numpy_random_warp(self, x, out_size, crop, ranges, fill, bilinear, seed, offset):
    out_h, out_w = check_random_warp(x, out_size, crop, ranges)
    dtype = dtypes.get_dtype(x.dtype)
    v = to_numpy(x).astype(np.float32)
    n, c, h, w = v.shape
    sx, sy = random_warp_sources(n, (out_h, out_w), (h, w), crop, ranges, seed, offset)
    with np.errstate(invalid="ignore"):  # inf * 0 weights give NaN, as in the kernel
        out = sample_image(v, sx, sy, fill, bilinear)
    return self._new(out.reshape(n, c, out_h, out_w), dtype)


NumpyBackend.random_warp = _numpy_random_warp
