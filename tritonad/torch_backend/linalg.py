"""Handlers: matrix products (mm, addmm, bmm, baddbmm, dot, mv) on tritonad's matmul kernel
(kernels/matmul.py), which takes strided operands (a transposed weight is read in place) and
fuses a bias row: `addmm(bias, x, w.t())`, nn.Linear's forward, is one kernel. float32 products
keep float32 accuracy as PyTorch's default (no TF32 unless `td.set_matmul_precision("high")`).
"""
from __future__ import annotations

from .. import dtypes
from .elementwise import B, FLOATS, check, write_into
from .registry import Fallback, register

_HALF = (dtypes.float16.torch, dtypes.bfloat16.torch)


def _operands(*xs):
    check(*xs)
    dtype = xs[0].dtype
    for x in xs:
        if x.dtype != dtype:
            raise Fallback("matmul of mixed types")  # PyTorch raises its own error
    if dtype not in FLOATS:
        raise Fallback(f"matmul of {dtype}")


def _finish(result, out):
    return result if out is None else write_into(out, result)


def _scaled_add(product, self, beta, alpha):
    """beta * self + alpha * product (self broadcast; ignored when beta is 0, as PyTorch).
    Half types: the product and the sum in float32, rounded once, as PyTorch's epilogue."""
    if alpha != 1:
        product = B.mul(product, alpha)
    if beta == 0:
        return product
    return B.add(product, self if beta == 1 else B.mul(self, beta))


@register("aten::mm.default", "aten::mm.out")
def mm(a, b, *, out=None):
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[0]:
        raise Fallback("mm of mismatched shapes")  # PyTorch's error
    _operands(a, b)
    return _finish(B.matmul(a, b), out)


@register("aten::addmm.default", "aten::addmm.out")
def addmm(self, a, b, *, beta=1, alpha=1, out=None):
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[0]:
        raise Fallback("addmm of mismatched shapes")
    _operands(self, a, b)
    n = b.shape[1]
    if beta == 1 and alpha == 1 and self.shape[-1:] == (n,) and \
            (self.dim() == 1 or (self.dim() == 2 and self.shape[0] == 1)):
        return _finish(B.matmul(a, b, bias=self.reshape(n)), out)   # a bias row: fused
    return _finish(_product_plus(self, a, b, beta, alpha), out)


def _product_plus(self, a, b, beta, alpha):
    """beta * self + alpha * (a @ b); half types in float32, rounded once (as PyTorch)."""
    if a.dtype in _HALF and beta != 0:
        wide = [B.cast(t, dtypes.float32) for t in (self, a, b)]
        return B.cast(_scaled_add(B.matmul(wide[1], wide[2]), wide[0], beta, alpha),
                      dtypes.get_dtype(a.dtype))
    return _scaled_add(B.matmul(a, b), self, beta, alpha)


@register("aten::bmm.default", "aten::bmm.out")
def bmm(a, b, *, out=None):
    if a.dim() != 3 or b.dim() != 3 or a.shape[0] != b.shape[0] or a.shape[2] != b.shape[1]:
        raise Fallback("bmm of mismatched shapes")
    _operands(a, b)
    return _finish(B.matmul(a, b), out)


@register("aten::baddbmm.default", "aten::baddbmm.out")
def baddbmm(self, a, b, *, beta=1, alpha=1, out=None):
    if a.dim() != 3 or b.dim() != 3 or a.shape[0] != b.shape[0] or a.shape[2] != b.shape[1]:
        raise Fallback("baddbmm of mismatched shapes")
    _operands(self, a, b)
    return _finish(_product_plus(self, a, b, beta, alpha), out)


@register("aten::dot.default", "aten::dot.out")
def dot(a, b, *, out=None):
    if a.dim() != 1 or b.dim() != 1 or a.shape != b.shape:
        raise Fallback("dot of mismatched shapes")
    _operands(a, b)
    k = a.shape[0]
    return _finish(B.matmul(a.reshape(1, k), b.reshape(k, 1)).reshape(()), out)


@register("aten::mv.default", "aten::mv.out")
def mv(a, v, *, out=None):
    if a.dim() != 2 or v.dim() != 1 or a.shape[1] != v.shape[0]:
        raise Fallback("mv of mismatched shapes")
    _operands(a, v)
    return _finish(B.matmul(a, v.reshape(v.shape[0], 1)).reshape(a.shape[0]), out)
