"""Philox4x32-10 on the host, in numpy: the counter-based random stream both backends draw from.

Element i of a draw runs Philox with key = the 64-bit seed and counter offset + i (Salmon et al.
2011, "Parallel random numbers: as easy as 1, 2, 3"). The numpy backend computes its random
numbers with these functions; the kernels (kernels/random.py, kernels/augment.py) implement
the same functions bit for bit and import only feistel_bits from here, the host-side size of
randperm's Feistel domain. A neutral module, so that the kernels never import the reference
backend.
"""
from __future__ import annotations

import math

import numpy as np

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

