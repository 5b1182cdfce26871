"""Image augmentation: a per-sample random geometric warp of a whole batch in one kernel (the
transforms RandomAffine, RandomRotation and RandomCrop), as tritonad/reference/augment.py
specifies it.

Sample n draws its parameters from the four Philox words of counter offset + n (the generator
of random.py), u_k = the top 24 bits of word k * 2**-24, and maps every output pixel (x, y) back
to the input position (sx, sy) it reads:
- affine: angle = deg_lo + (deg_hi - deg_lo) u0 (degrees, counter-clockwise as seen), shift
  tx = floor(max_dx (2 u1 - 1) + 0.5), ty likewise from u2, scale s = s_lo + (s_hi - s_lo) u3;
  with the image centre (cx, cy) = ((W - 1) / 2, (H - 1) / 2), a = cos(angle) / s and
  b = sin(angle) / s, the inverse of "rotate and scale about the centre, then shift":
      sx = a (x - cx - tx) - b (y - cy - ty) + cx,   sy = b (x - cx - tx) + a (y - cy - ty) + cy
- crop: top = floor(u0 (span_y + 1)), left = floor(u1 (span_x + 1)) in the padded image, so
      sx = x + (left - pad_left),   sy = y + (top - pad_top).
Sampling is nearest (the pixel at floor(s + 0.5)) or bilinear; positions outside the image read
the fill value. Everything is float32 in the reference's order of operations, without fused
multiply-adds, with IEEE division, and cos and sin computed in float64 and rounded once, so
that compiled or interpreted, the kernel matches the reference to the bit (barring an ulp of
float64 cos rounding across a float32 boundary).
"""
from __future__ import annotations

import functools
import math

import numpy as np
import triton
import triton.language as tl

from .. import generator
from ..backend import check_random_warp
from .elementwise import cast_for_store
from .launch import INTERPRET, KernelLaunch, cdiv, next_power_of_2, ptr
from .plans import PlanCache, empty
from .random import _philox, _seed_words, _uniform01

PRIMITIVES = ("random_warp",)

BLOCK, WARPS = 1024, 4
INTERPRET_BLOCK = 1 << 12
# pi / 180 rounded to float32, as the reference's DEG_TO_RAD
RADIANS_PER_DEGREE = tl.constexpr(float(np.float32(math.pi / 180)))


# ----------------------------------------------------------------------------------- kernels


@triton.jit
def _tap(x_ptr, base, iy, ix, H, W, stride_xh, stride_xw, fill, valid):
    # x at integer positions (iy, ix) of one image plane; fill outside the image
    inside = valid & (iy >= 0) & (iy < H) & (ix >= 0) & (ix < W)
    offset = base + iy.to(tl.int64) * stride_xh + ix.to(tl.int64) * stride_xw
    value = tl.load(x_ptr + offset, mask=inside, other=0).to(tl.float32)
    return tl.where(inside, value, fill)


@triton.jit(do_not_specialize=["seed_lo", "seed_hi", "offset", "p0", "p1", "p2", "p3", "p4",
                               "p5", "cx", "cy", "fill"])
def _random_warp_kernel(out_ptr, x_ptr, base_ptr, seed_lo: tl.int64, seed_hi: tl.int64,
                        offset: tl.int64,
                        C, H, W, out_h, out_w, stride_xn, stride_xc, stride_xh, stride_xw,
                        p0, p1, p2, p3, p4, p5, cx, cy, fill,
                        CROP: tl.constexpr, BILINEAR: tl.constexpr, BASE: tl.constexpr,
                        BLOCK: tl.constexpr):
    # One program: output pixels [pid1 * BLOCK, +BLOCK) of sample pid0, in every channel. The
    # sample's parameters are computed in every lane (the same words): cheaper than a broadcast.
    # BASE: the counters also add the int64 at base_ptr (inside a captured graph,
    # generator.counted_from).
    n = tl.program_id(0)
    pixel = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    valid = pixel < out_h * out_w
    x = (pixel % out_w).to(tl.float32)
    y = (pixel // out_w).to(tl.float32)

    counter = offset + n.to(tl.int64) + tl.zeros([BLOCK], tl.int64)
    if BASE:
        counter += tl.load(base_ptr)
    zero = tl.zeros([BLOCK], tl.uint32)
    w0, w1, w2, w3 = _philox(counter.to(tl.uint32), (counter >> 32).to(tl.uint32), zero, zero,
                             seed_lo.to(tl.uint32), seed_hi.to(tl.uint32))
    # NOTE: float arguments enter only tensor arithmetic (the launcher combines them in
    # float32): the interpreter would compute a sum of two of them in float64
    if CROP:  # p0, p1: padding top, left; p2, p3: span of the window's corner + 1
        sx = x + (tl.floor(_uniform01(w1) * p3) - p1)
        sy = y + (tl.floor(_uniform01(w0) * p2) - p0)
    else:  # p0 + p1 u: degrees; p2, p3: largest shift in x, y; p4 + p5 u: scale; centre
        angle = p0 + p1 * _uniform01(w0)
        theta = angle * RADIANS_PER_DEGREE
        tx = tl.floor(p2 * (2.0 * _uniform01(w1) - 1.0) + 0.5)
        ty = tl.floor(p3 * (2.0 * _uniform01(w2) - 1.0) + 0.5)
        scale = p4 + p5 * _uniform01(w3)
        # NOTE: cos and sin in float64, rounded once: float32 versions differ by an ulp
        # between libraries (and between numpy's vector and scalar loops); IEEE division
        theta64 = theta.to(tl.float64)
        a = tl.div_rn(tl.cos(theta64).to(tl.float32), scale)
        b = tl.div_rn(tl.sin(theta64).to(tl.float32), scale)
        dx = x - cx - tx
        dy = y - cy - ty
        sx = a * dx - b * dy + cx
        sy = b * dx + a * dy + cy

    if BILINEAR:
        x0 = tl.floor(sx)
        y0 = tl.floor(sy)
        fx = sx - x0
        fy = sy - y0
        gx = 1.0 - fx
        gy = 1.0 - fy
        ix = x0.to(tl.int32)
        iy = y0.to(tl.int32)
    else:
        ix = tl.floor(sx + 0.5).to(tl.int32)
        iy = tl.floor(sy + 0.5).to(tl.int32)
    in_base = n.to(tl.int64) * stride_xn
    out_base = n.to(tl.int64) * C * out_h * out_w + pixel
    for c in range(C):
        plane = in_base + c * stride_xc
        if BILINEAR:
            top_row = gx * _tap(x_ptr, plane, iy, ix, H, W, stride_xh, stride_xw, fill, valid) + \
                fx * _tap(x_ptr, plane, iy, ix + 1, H, W, stride_xh, stride_xw, fill, valid)
            bottom_row = \
                gx * _tap(x_ptr, plane, iy + 1, ix, H, W, stride_xh, stride_xw, fill, valid) + \
                fx * _tap(x_ptr, plane, iy + 1, ix + 1, H, W, stride_xh, stride_xw, fill, valid)
            value = gy * top_row + fy * bottom_row
        else:
            value = _tap(x_ptr, plane, iy, ix, H, W, stride_xh, stride_xw, fill, valid)
        out = out_ptr + out_base + c * out_h * out_w
        tl.store(out, cast_for_store(value, out_ptr), mask=valid)


# ----------------------------------------------------------------------------------- launchers


@functools.lru_cache(maxsize=256)
def _kernel_parameters(crop, ranges, h, w):
    """p0..p5, cx, cy of the kernel: the ranges combined in float32 as the reference does
    (cached: numpy scalar arithmetic costs microseconds a call)."""
    r = [np.float32(v) for v in ranges]
    one = np.float32(1)
    p = (r[0], r[1], r[2] + one, r[3] + one, 0, 0) if crop else \
        (r[0], r[1] - r[0], r[2], r[3], r[4], r[5] - r[4])
    centre = (np.float32(w - 1) * np.float32(0.5), np.float32(h - 1) * np.float32(0.5))
    return [float(v) for v in p + centre]


_PLANS = PlanCache()


def random_warp(x, out_size, crop, ranges, fill, bilinear, seed, offset):
    """Per-sample random affine warp or crop of an image batch (see the module docstring).
    x: [N, C, H, W] float32/float16/bfloat16, any strides -> [N, C, Ho, Wo] of x's dtype.
    One bound launch per (batch layout, geometry); the seed and counter offset vary per call."""
    numbers = (*_seed_words(seed), int(offset))
    base = generator.device_base()  # (x stands in when there is none)
    key = (x.shape, x.stride(), x.dtype, x.device, x.data_ptr() % 16 == 0, out_size,
           bool(crop), tuple(float(v) for v in ranges), float(fill), bool(bilinear),
           base is not None)
    plan = _PLANS.get(key)
    if plan is not None:
        launch, out_shape = plan
        out = empty(out_shape, x.dtype, x.device)
        launch(ptr(out), ptr(x), ptr(x if base is None else base), *numbers)
        return out
    out_h, out_w = check_random_warp(x, out_size, crop, ranges)
    n, c, h, w = x.shape
    out = empty((n, c, out_h, out_w), x.dtype, x.device)
    pixels = out_h * out_w
    if out.numel() == 0:
        return out
    block, warps = (min(next_power_of_2(pixels), INTERPRET_BLOCK), 1) if INTERPRET else \
        (BLOCK, WARPS)
    _PLANS.keep(key, (KernelLaunch(
        _random_warp_kernel, (n, cdiv(pixels, block)),
        [out, x, x if base is None else base, *numbers, c, h, w, out_h, out_w, *x.stride(),
         *_kernel_parameters(bool(crop), tuple(float(v) for v in ranges), h, w),
         float(np.float32(fill))],
        dict(CROP=bool(crop), BILINEAR=bool(bilinear), BASE=base is not None, BLOCK=block,
             num_warps=warps,
             enable_fp_fusion=False),  # NOTE: each product rounded on its own, as the reference
        dynamic=range(6)), out.shape))
    return out
