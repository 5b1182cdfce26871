"""The numpy backend's max and average pooling and their backwards.

Max pooling over windows that tile the input (the MNIST models' 2x2 pools) has a faster path
that gives the general path's values bit for bit where it runs (_max_pool_tiled)."""
from __future__ import annotations

import numpy as np

from .. import dtypes
from .arrays import _padded, _select, _taps, _workspace, pool_output_size, to_numpy


class PoolOps:
    """Mixed into NumpyBackend."""

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
