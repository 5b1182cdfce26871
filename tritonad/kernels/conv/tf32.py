"""3xTF32: float32 accuracy from TF32 tensor cores, and the one place where a float32 value is
split for it.

A float32 v is head + tail, head = v rounded to TF32 (10 mantissa bits) and tail = v - head
(exact in float32). Then a @ b = a_hi @ b_hi + a_lo @ b_hi + a_hi @ b_lo + a_lo @ b_lo, and the
last product is below float32's rounding: three TF32 products give float32's accuracy (a
tail's own TF32 rounding costs ~2**-22 relative). The kernels split an operand in registers
(tf32_split), or read heads and tails that a copy pass wrote (store_split, split_tf32: the
tails one buffer after the heads, `lo` elements on), so that their tiles stream from memory
into shared memory as TMA leaves them.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..launch import INTERPRET, cdiv
from ..plans import empty, run
from ..pool import nchw


@triton.jit
def tf32_split(v):
    """(head, tail) of float32 v: head = v rounded to TF32 (to nearest, by adding half of the
    13 dropped bits to the magnitude), tail = v - head, exact in float32."""
    head = ((v.to(tl.uint32, bitcast=True) + 0x1000) & 0xFFFFE000).to(tl.float32, bitcast=True)
    return head, v - head


@triton.jit
def store_split(dst, v, lo, mask, SPLIT: tl.constexpr):
    """Store v at dst; SPLIT: its TF32 head there and the tail lo elements on."""
    if SPLIT:
        head, tail = tf32_split(v)
        tl.store(dst, head, mask=mask)
        tl.store(dst + lo, tail, mask=mask)
    else:
        tl.store(dst, v, mask=mask)


@triton.jit
def _split_tf32_kernel(src_ptr, out_ptr, TOTAL, C, H, W,
                       stride_sn, stride_sc, stride_sh, stride_sw,
                       INDEX_64: tl.constexpr, BLOCK: tl.constexpr):
    # out[0] = head, out[1] = tail of src [N, C, H, W] (any strides), both contiguous: the head
    # is src rounded to TF32 (tf32_split), tail = src - head, exact in float32. A TF32 product
    # of a head reads it exactly; a tail's own TF32 rounding costs ~2**-22 relative: 3xTF32's
    # accuracy.
    # One program: BLOCK elements of the contiguous output.
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    if INDEX_64:
        offs = offs.to(tl.int64)
    ok = offs < TOTAL
    n, c, h, w = nchw(offs, C, H, W)
    v = tl.load(src_ptr + n * stride_sn + c * stride_sc + h * stride_sh + w * stride_sw, mask=ok,
                other=0.0)
    head, tail = tf32_split(v)
    tl.store(out_ptr + offs, head, mask=ok)
    tl.store(out_ptr + TOTAL + offs, tail, mask=ok)


def split_tf32(t):
    """t [N, C, H, W] (float32, any strides) -> the [N, C, H, W] TF32 heads, contiguous, whose
    tails follow them in the same buffer (t.numel() elements further on)."""
    out = empty((2,) + tuple(t.shape), torch.float32, t.device)
    total = t.numel()
    if total == 0:
        return out[0]
    block = 1024 if not INTERPRET else 4096
    run(_split_tf32_kernel, (cdiv(total, block),), t, out, total, *t.shape[1:], *t.stride(),
        INDEX_64=2 * total + block >= 2 ** 31, BLOCK=block, num_warps=4)
    return out[0]
