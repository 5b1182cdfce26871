"""The numpy backend's random draws: uniform, normal, dropout and randperm, from the Philox
stream of tritonad/philox.py (the kernels compute the same numbers)."""
from __future__ import annotations

import math

import numpy as np

from .. import dtypes
from ..philox import normal01, random_words, randperm_numpy, uniform01


class RandomOps:
    """Mixed into NumpyBackend."""

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
