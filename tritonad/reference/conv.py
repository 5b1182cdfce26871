"""The numpy backend's convolution: im2col, col2im, conv2d and its backward, computed
directly (exact to the rounding of its sums; float64 exact to float64's).

im2col + one BLAS product per direction, by pieces of output rows whose columns stay in the
cache; a batch's columns kept from the forward for the backward where they are small. These
shape the work, not the values: every path gives the direct product's sums to float32
rounding. The DFT convolution is not here: it is the fast CPU path (tritonad/cpu_fast.py), off
unless switched on, tested against this one.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from .. import cpu_fast, dtypes
from ..backend import check_weight_grad_outputs
from .arrays import (_accumulate_windows, _conv_out_hw, _padded, _per_thread, _select,
                     _taps, _transpose_into, _workspace, to_numpy)

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



class ConvOps:
    """Mixed into NumpyBackend."""

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
    # backward (_KeptColumns), and the weight gradient is one product per sample. Where the
    # fast CPU path is switched on (tritonad/cpu_fast.py, off by default), float32
    # convolutions that its cost model sends there go through the frequency domain instead.
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
        plan = cpu_fast.conv_plan(v, k, stride, padding, dilation, groups)
        if plan is not None:
            with np.errstate(all="ignore"):  # (non-finite values: the direct path warns)
                y = cpu_fast.conv2d(plan, v, k, b)
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
        plan = cpu_fast.conv_plan(v, k, stride, padding, dilation, groups) \
            if input_grad or weight_grad else None
        grads = None
        if plan is not None:
            with np.errstate(all="ignore"):
                grads = cpu_fast.conv2d_backward(plan, g, v, k, input_grad, weight_grad)
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
