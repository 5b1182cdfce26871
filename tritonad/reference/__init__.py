"""The numpy reference backend: the executable specification of every primitive in backend.py.

It is the oracle every Triton kernel is tested against, and the CPU path
(`td.set_backend("numpy")`). Clarity wins over speed here, except in the primitives that dominate
a CPU training step and evaluation: convolution (im2col as one strided copy and one BLAS product
per direction, by pieces of output rows whose columns stay in the cache), max pooling (windows
that tile the input copied once, offset by offset), relu and the optimizer updates (in place,
bit-pattern selects), checked in the tests against PyTorch, the loop definitions, the general
paths and float64 finite differences. Every such path gives the general one's values (to the
bit, or to float32 rounding where a product or sum is split differently), NaN, inf and ties.
A faster CPU convolution whose values are not the oracle's (by the DFT, norm-wise float32
error) lives apart, in tritonad/cpu_fast.py, off unless switched on.

The fused training steps of Backend (its FusedPrimitives: the fused MLP step, the classifier
head, conv + relu + max pool, the device-side batch and cursor reads) have no numpy twins here:
this backend runs their composed defaults over its own primitives.

One module a family, each a mixin of NumpyBackend: arrays.py (numpy views of raw arrays,
dtype conversion, window geometry, the workspace), elementwise.py, reduce.py, nn.py (matmul,
softmax, cross-entropy), conv.py, pool.py, index.py, random.py (the Philox stream of
tritonad/philox.py), optim.py, augment.py (random_warp). Half-precision inputs are computed in
float32 and rounded once on output, as the kernels do.
"""
from __future__ import annotations

import numpy as np
import torch

from .. import dtypes
from ..backend import Backend, register_backend
from ..dtypes import DType
from ..philox import (PHILOX_KEY_A, PHILOX_KEY_B, PHILOX_ROUND_A, PHILOX_ROUND_B,  # noqa: F401
                      feistel_bits, normal01, philox, random_words, randperm_numpy, uniform01)
from .arrays import (_WORK, _as_dtype, _bf16_bits, _per_thread, _select,  # noqa: F401
                     _workspace, compute_dtype, from_numpy, pool_output_size, to_numpy, write)
from .augment import (DEG_TO_RAD, AugmentOps, random_warp_sources,  # noqa: F401
                      sample_image)
from .conv import ConvOps, _kept_columns, _KeptColumns  # noqa: F401
from .elementwise import ElementwiseOps
from .index import IndexOps
from .nn import NnOps
from .optim import OptimOps
from .pool import PoolOps
from .random import RandomOps
from .reduce import ReduceOps
# embeddings and indexing: the index check and the row scatter with a reduction
from .scatter import ScatterOps
from .scan import ScanOps  # scans and sorting


class NumpyBackend(ElementwiseOps, ReduceOps, NnOps, ConvOps, PoolOps, IndexOps, RandomOps,
                   OptimOps, AugmentOps, ScatterOps, ScanOps, Backend):
    """Every core primitive in numpy, on CPU tensors; the fused ones by Backend's defaults."""

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

    # memory, fills, casts ------------------------------------------------------------------
    def fill_(self, x, value):
        return write(x, value)

    def copy_(self, dst, src):
        return write(dst, to_numpy(src))

    def arange(self, start, end, step, dtype, device):
        self.check_device("arange", device)
        return self._new(np.arange(start, end, step), dtype)


register_backend("numpy", NumpyBackend)
