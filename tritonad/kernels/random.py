"""Random numbers: uniform and normal fills, dropout masks and random permutations, from the
counter-based Philox4x32-10 generator of tritonad/philox.py, bit for bit.

Element i of a draw runs Philox with key = the 64-bit seed (low word, high word) and counter
(lo32(offset + i), hi32(offset + i), 0, 0); nothing is carried from one element to the next, so
every program computes its own elements independently, and the same (seed, offset) gives the
same numbers on every backend and any launch configuration.
- uniform: word 0 -> its top 24 bits * 2**-24, exact in float32, in [0, 1).
- normal: Box-Muller on words 0 and 1: sqrt(-2 ln u1) cos(2 pi u2) with u1 in (0, 1].
- dropout: keep where the uniform of word 0 is >= p.
- randperm: a keyed bijection of [0, 2**bits): a 4-round Feistel network whose round function
  is Philox, applied repeatedly until the value falls below n (cycle walking), so that it maps
  [0, n) onto itself.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import dtypes, generator
from ..philox import feistel_bits
from .elementwise import cast_for_store, contiguous
from .launch import INTERPRET, KernelLaunch, cdiv, dtype_of, next_power_of_2, ptr
from .plans import PlanCache, empty

PRIMITIVES = ("uniform", "normal", "dropout", "randperm")

BLOCK, WARPS = 1024, 4
INTERPRET_BLOCK = 1 << 16

PHILOX_ROUND_A = tl.constexpr(0xD2511F53)
PHILOX_ROUND_B = tl.constexpr(0xCD9E8D57)
PHILOX_KEY_A = tl.constexpr(0x9E3779B9)
PHILOX_KEY_B = tl.constexpr(0xBB67AE85)


# ----------------------------------------------------------------------------------- kernels


@triton.jit
def _philox(c0, c1, c2, c3, k0, k1):
    """Philox4x32-10 (Salmon et al. 2011) on uint32 words: 10 rounds of
        (c0, c1, c2, c3) <- (hi(B c2) ^ c1 ^ k0, lo(B c2), hi(A c0) ^ c3 ^ k1, lo(A c0)),
    the key bumped by the Weyl constants after each round."""
    # the constants are all >= 2**31, so Triton types them uint32: products wrap mod 2**32
    for _ in tl.static_range(10):
        hi_b = tl.umulhi(c2, PHILOX_ROUND_B)
        lo_b = c2 * PHILOX_ROUND_B
        hi_a = tl.umulhi(c0, PHILOX_ROUND_A)
        lo_a = c0 * PHILOX_ROUND_A
        c0 = hi_b ^ c1 ^ k0
        c1 = lo_b
        c2 = hi_a ^ c3 ^ k1
        c3 = lo_a
        k0 = k0 + PHILOX_KEY_A
        k1 = k1 + PHILOX_KEY_B
    return c0, c1, c2, c3


@triton.jit
def _uniform01(word):
    # the top 24 bits scaled by 2**-24: exact in float32, never rounds up to 1
    return (word >> 8).to(tl.float32) * (1.0 / 16777216.0)


# NOTE: the per-call numbers are typed (tl.int64, tl.float32) and not specialized, so every
# call of a shape runs the same compiled kernel whatever the seed (launch.KernelLaunch relies on
# it; an untyped int argument is compiled as i32 or i64 depending on its value)
@triton.jit(do_not_specialize=["seed_lo", "seed_hi", "offset", "low", "span", "p", "scale"])
def _random_kernel(out_ptr, x_ptr, mask_ptr, base_ptr, seed_lo: tl.int64, seed_hi: tl.int64,
                   offset: tl.int64, low: tl.float32, span: tl.float32, p: tl.float32,
                   scale: tl.float32, n, DIST: tl.constexpr, BASE: tl.constexpr,
                   BLOCK: tl.constexpr):
    # One program: elements [pid * BLOCK, +BLOCK) of the draw, element i from counter offset + i
    # (+ the int64 at base_ptr when BASE: a draw inside a captured graph, generator.counted_from)
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    valid = i < n
    counter = offset + i
    if BASE:
        counter += tl.load(base_ptr)
    zero = tl.zeros_like(counter).to(tl.uint32)
    w0, w1, _, _ = _philox(counter.to(tl.uint32), (counter >> 32).to(tl.uint32), zero, zero,
                           seed_lo.to(tl.uint32), seed_hi.to(tl.uint32))
    if DIST == "uniform":  # low + (high - low) * u, in float32 as the reference
        value = low + span * _uniform01(w0)
    elif DIST == "normal":  # mean + std * z: low carries the mean, span the std
        u1 = ((w0 >> 8).to(tl.float32) + 1.0) * (1.0 / 16777216.0)
        u2 = _uniform01(w1)
        z = tl.sqrt_rn(-2.0 * tl.log(u1)) * tl.cos(6.2831854820251465 * u2)  # float32(2 pi)
        value = low + span * z
    else:  # dropout: y = x * keep * 1 / (1 - p)
        keep = _uniform01(w0) >= p
        x = tl.load(x_ptr + i, mask=valid, other=0).to(tl.float32)
        value = x * keep.to(tl.float32) * scale
        tl.store(mask_ptr + i, keep, mask=valid)
    tl.store(out_ptr + i, cast_for_store(value, out_ptr), mask=valid)


@triton.jit(do_not_specialize=["n", "seed_lo", "seed_hi", "offset_lo", "offset_hi", "half"])
def _randperm_kernel(out_ptr, seed_lo: tl.int64, seed_hi: tl.int64, offset_lo: tl.int64,
                     offset_hi: tl.int64, n, half, BLOCK: tl.constexpr):
    # One program: positions [pid * BLOCK, +BLOCK). Each value v splits into halves (left, right)
    # of `half` bits; a round maps (left, right) -> (right, left ^ F(right, round)) with
    # F = Philox word 0 of counter (right, round, offset lo, offset hi). Values landing at or past
    # n go round again (cycle walking); the loop ends when the whole block is inside [0, n).
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    valid = i < n
    v = i.to(tl.uint32)
    n32 = n.to(tl.uint32)
    shift = half.to(tl.uint32)
    low_bits = (tl.full(v.shape, 1, tl.uint32) << shift) - 1
    k0 = seed_lo.to(tl.uint32)
    k1 = seed_hi.to(tl.uint32)
    c2 = offset_lo.to(tl.uint32)
    c3 = offset_hi.to(tl.uint32)
    todo = valid
    while tl.max(todo.to(tl.int32), axis=0) > 0:
        left = v >> shift
        right = v & low_bits
        for r in tl.static_range(4):
            f, _, _, _ = _philox(right, tl.full(right.shape, r, tl.uint32), c2, c3, k0, k1)
            left, right = right, left ^ (f & low_bits)
        v = tl.where(todo, (left << shift) | right, v)
        todo = todo & (v >= n32)
    tl.store(out_ptr + i, v.to(tl.int64), mask=valid)


# ----------------------------------------------------------------------------------- launchers


def _seed_words(seed):
    seed = int(seed) & 0xFFFFFFFFFFFFFFFF
    return seed & 0xFFFFFFFF, seed >> 32


def _block(n):
    return (min(next_power_of_2(max(n, 1)), INTERPRET_BLOCK), 1) if INTERPRET else (BLOCK, WARPS)


# Plans: a draw of one (kind, shape, dtype, device) launches the same kernel on every call with
# new pointers, seed and counter offset (the numbers vary per call, so they are the launch's
# dynamic arguments rather than part of a recorded plan).
_PLANS = PlanCache()


def _numbers(seed, offset, low, span, p, scale):
    lo, hi = _seed_words(seed)
    return lo, hi, int(offset), float(low), float(span), float(p), float(scale)


def _launch_draw(key, out, x, mask, numbers, dist, n):
    base = generator.device_base()  # (out stands in when there is none)
    key = key + (base is not None,)
    launch = _PLANS.get(key)
    if launch is None:
        block, warps = _block(n)
        _PLANS.keep(key, KernelLaunch(
            _random_kernel, (cdiv(n, block),), [out, x, mask, out if base is None else base,
                                                *numbers, n],
            dict(DIST=dist, BASE=base is not None, BLOCK=block, num_warps=warps,
                 enable_fp_fusion=False),  # NOTE: low + span * u rounded twice, as the reference
            dynamic=range(11)))
        return
    launch(ptr(out), ptr(x), ptr(mask), ptr(out if base is None else base), *numbers)


def _draw(dist, shape, low, span, seed, offset, dtype, device):
    dtype = dtypes.get_dtype(dtype)
    out = empty(tuple(shape), dtype.torch, device)
    n = out.numel()
    if n:
        _launch_draw((dist, out.shape, out.dtype, out.device), out, out, out,
                     _numbers(seed, offset, low, span, 0.0, 0.0), dist, n)
    return out


def uniform(shape, low, high, seed, offset, dtype, device):
    """U[low, high) of `shape`; element i from Philox counter offset + i."""
    return _draw("uniform", shape, low, float(high) - float(low), seed, offset, dtype, device)


def normal(shape, mean, std, seed, offset, dtype, device):
    """N(mean, std^2) of `shape` by Box-Muller; element i from Philox counter offset + i."""
    return _draw("normal", shape, mean, std, seed, offset, dtype, device)


def dropout(x, p, seed, offset):
    """(y, mask): mask bool, True with probability 1 - p (element i in C order from counter
    offset + i); y = x * mask / (1 - p), 0 everywhere when p = 1. x: [any shape]."""
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout: p must be in [0, 1], got {p}")
    if not dtype_of(x).is_floating_point:
        raise TypeError(f"dropout: x must be floating point, got {dtype_of(x).name}")
    if not x.is_contiguous():
        x = contiguous(x)
    y = empty(x.shape, x.dtype, x.device)
    keep = empty(x.shape, torch.bool, x.device)
    n = x.numel()
    if n:
        scale = 1.0 / (1.0 - p) if p < 1 else 0.0
        key = ("dropout", x.shape, x.dtype, x.device, x.data_ptr() % 16 == 0)
        _launch_draw(key, y, x, keep, _numbers(seed, offset, 0.0, 0.0, p, scale), "dropout", n)
    return y, keep


def randperm(n, seed, offset, device):
    """A uniformly drawn permutation of range(n) as int64 [n], computed on the device."""
    if n < 0:
        raise ValueError(f"randperm: n must be non-negative, got {n}")
    if n >= 2**31:
        raise ValueError(f"randperm: n = {n} is too large (at most 2**31 - 1)")
    if generator.device_base() is not None:
        raise RuntimeError("randperm: a permutation cannot be drawn from a device counter "
                           "(inside a captured step); draw it before the step")
    out = empty((n,), torch.int64, device)
    if n:
        offset = int(offset)
        numbers = (*_seed_words(seed), offset & 0xFFFFFFFF, (offset >> 32) & 0xFFFFFFFF)
        key = ("randperm", n, out.device)
        launch = _PLANS.get(key)
        if launch is None:
            block, warps = _block(n)
            _PLANS.keep(key, KernelLaunch(_randperm_kernel, (cdiv(n, block),),
                                          [out, *numbers, n, feistel_bits(n) // 2],
                                          dict(BLOCK=block, num_warps=warps), dynamic=range(5)))
        else:
            launch(ptr(out), *numbers)
    return out
