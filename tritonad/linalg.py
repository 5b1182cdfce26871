"""td.linalg: vector and matrix norms as torch.linalg has them, composed of our reductions.

    td.linalg.norm(x)                      # 2-norm of all elements (Frobenius for a matrix)
    td.linalg.vector_norm(x, 1, dim=-1)    # row-wise 1-norms
    td.linalg.matrix_norm(a, float("inf")) # largest absolute row sum

Norms that need singular values (ord 2, -2 and "nuc" of a matrix) are not available.
"""
from __future__ import annotations

import math
import numbers

from .autodiff.losses import vector_norm
from .autodiff.dims import normalize_dims
from .tensor import Tensor

__all__ = ["norm", "vector_norm", "matrix_norm"]


def matrix_norm(A, ord="fro", dim=(-2, -1), keepdim=False, *, dtype=None):
    """The matrix norm of A over the two dims `dim` (batched over the others): "fro"
    (Frobenius), inf / -inf (largest / smallest sum of |a| along a row), 1 / -1 (the same
    along a column)."""
    op = "linalg.matrix_norm"
    if not isinstance(A, Tensor):
        raise TypeError(f"{op}: expected a Tensor, got {type(A).__name__}")
    if dtype is not None:
        A = A.to(dtype)
    if A.ndim < 2:
        raise ValueError(f"{op}: expected a tensor of at least 2 dimensions, got {A.shape}")
    if isinstance(dim, numbers.Integral) or len(dim) != 2:
        raise ValueError(f"{op}: dim must be a pair of dimensions, got {dim!r}")
    normalize_dims(op, tuple(dim), A.ndim)  # (in range, not repeated)
    rows, cols = dim[0] % A.ndim, dim[1] % A.ndim
    if ord == "fro":
        return vector_norm(A, 2, (rows, cols), keepdim)
    if ord in ("nuc", 2, -2):
        raise NotImplementedError(f"{op}: ord={ord!r} needs singular values, which tritonad "
                                  "does not compute; use 'fro', 1, -1, inf or -inf")
    if isinstance(ord, bool) or not isinstance(ord, numbers.Real) or \
            abs(ord) not in (1, math.inf):
        raise ValueError(f"{op}: ord must be 'fro', 'nuc', 1, -1, 2, -2, inf or -inf, got "
                         f"{ord!r}")
    if not A.dtype.is_floating_point:
        raise TypeError(f"{op}: expected a floating point tensor, got {A.dtype.name}")
    if A.shape[rows] == 0 or A.shape[cols] == 0:
        raise ValueError(f"{op}: cannot compute the {ord} norm of an empty matrix ({A.shape})")
    summed, across = (cols, rows) if math.isinf(ord) else (rows, cols)
    sums = A.abs().sum(summed, keepdim=True)
    out = sums.amax(across, keepdim=True) if ord > 0 else sums.amin(across, keepdim=True)
    return out if keepdim else out.squeeze(max(rows, cols)).squeeze(min(rows, cols))


def norm(A, ord=None, dim=None, keepdim=False, *, dtype=None):
    """torch.linalg.norm: with dim an int (or one dim), the vector norm; with two dims, the
    matrix norm; with neither ord nor dim, the 2-norm of every element; with ord and no dim,
    A must be 1-d (vector norm) or 2-d (matrix norm).  `td.linalg.norm(x, dim=1)`"""
    op = "linalg.norm"
    if not isinstance(A, Tensor):
        raise TypeError(f"{op}: expected a Tensor, got {type(A).__name__}")
    if dim is not None:
        dims = (dim,) if isinstance(dim, numbers.Integral) else tuple(dim)
        if len(dims) == 1:
            return vector_norm(A, 2 if ord is None else ord, dims, keepdim, dtype=dtype)
        if len(dims) == 2:
            return matrix_norm(A, "fro" if ord is None else ord, dims, keepdim, dtype=dtype)
        raise ValueError(f"{op}: dim must be one or two dimensions, got {dim!r}")
    if ord is None:
        return vector_norm(A, 2, None, keepdim, dtype=dtype)
    if A.ndim == 1:
        return vector_norm(A, ord, None, keepdim, dtype=dtype)
    if A.ndim == 2:
        return matrix_norm(A, ord, (-2, -1), keepdim, dtype=dtype)
    raise ValueError(f"{op}: with ord given and no dim, the input must be 1-d or 2-d, got "
                     f"shape {A.shape}")


def __getattr__(name):  # a missing PyTorch name says what to use instead (see _hints.py)
    from ._hints import missing
    raise missing(__name__, name, globals())
