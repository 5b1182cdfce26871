"""Per-sample random geometric warps of an image batch (tritonad.transforms' RandomAffine,
RandomRotation, RandomCrop): the executable spec of Backend.random_warp, step by step in
float32 as the kernel (tritonad/kernels/augment.py) computes it."""
from __future__ import annotations

import math

import numpy as np

from .. import dtypes
from ..backend import check_random_warp
from ..philox import _MASK32, philox, uniform01
from .arrays import to_numpy

DEG_TO_RAD = np.float32(math.pi / 180)


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



class AugmentOps:
    """Mixed into NumpyBackend."""

    def random_warp(self, x, out_size, crop, ranges, fill, bilinear, seed, offset):
        out_h, out_w = check_random_warp(x, out_size, crop, ranges)
        dtype = dtypes.get_dtype(x.dtype)
        v = to_numpy(x).astype(np.float32)
        n, c, h, w = v.shape
        sx, sy = random_warp_sources(n, (out_h, out_w), (h, w), crop, ranges, seed, offset)
        with np.errstate(invalid="ignore"):  # inf * 0 weights give NaN, as in the kernel
            out = sample_image(v, sx, sy, fill, bilinear)
        return self._new(out.reshape(n, c, out_h, out_w), dtype)
