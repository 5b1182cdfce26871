"""Which algorithm runs each direction of a convolution: two tables of conditions, read top to
bottom, the first whose condition holds wins. Each condition is the `applies` of the
algorithm's module, where its docstring gives the rule and the measurement behind it.

    forward, input gradient (one group)      weight gradient (one group)
    im2col    settings.algo, or "auto" and   im2col       as for the forward ("auto": never)
              dx of < 8 input channels
    winograd  3x3, stride 1, pad 1, float32  winograd     as for the forward, with enough 4x4
              accuracy, >= 128 channels                   tiles to fill the GPU
    window    stride 1 on Hopper, a padded   batch_inner  float32 stride-1 "same" layers on
              plane within window_waste                   Hopper, small planes
    implicit  everything else                window       half types where the forward is window
                                             flat_shift   stride-1 "same" layers, TMA for dy
                                             implicit     everything else
"""
from __future__ import annotations

from . import batch_inner, flat_shift, implicit_gemm, window, winograd
from .common import sm_count
from .im2col_path import have_matmul
from .settings import dot_precision


def layer_algorithm(direction, g, s):
    """Whether `direction` ("forward", "input", "weight") of convolution g runs by im2col or by
    the implicit family (implicit GEMM and the algorithms that replace it where they apply).

    auto: the implicit family everywhere (no column buffer, fused bias, split-K weight
    gradient), except the input gradient of a layer with fewer than 8 input channels per
    group: its GEMM has M = C_in rows, which a tensor-core tile (>= 16 rows) would mostly
    waste, while matmul(W^T, dY) has M = C_in*kh*kw and col2im then sums the columns cheaply."""
    if g.groups > 1:
        return "implicit"  # the im2col path handles groups=1 only
    if s.algo == "auto":
        small = direction == "input" and g.c < 8
        return "im2col" if small and have_matmul() else "implicit"
    return s.algo


# ---------------------------------------------------------------- forward and input gradient
# conditions(direction, g, src, n_ch, precision, s): src the gathered operand of one group
# (x, or dy for the input gradient), n_ch its output channels


def _gemm_im2col(direction, g, src, n_ch, precision, s):
    return layer_algorithm(direction, g, s) == "im2col"


def _gemm_winograd(direction, g, src, n_ch, precision, s):
    return winograd.applies(g, src.shape[1], n_ch, src.dtype, precision, s)


def _gemm_window(direction, g, src, n_ch, precision, s):
    return window.applies(g, src, direction == "input", precision, s)


def _always(*_):
    return True


GEMM_ROUTES = (
    ("im2col", _gemm_im2col),
    ("winograd", _gemm_winograd),
    ("window", _gemm_window),
    ("implicit", _always),
)


def gemm_algorithm(direction, g, src, n_ch, precision, s):
    """The algorithm of the forward ("forward") or input gradient ("input") of one group."""
    return next(name for name, holds in GEMM_ROUTES if holds(direction, g, src, n_ch,
                                                             precision, s))


def run_gemm(algo, src, w, bias, out, g, transposed, relu, precision, s, keep=None):
    """One group's forward (src = x, out = y) or input gradient (transposed: src = dy, out = dx)
    by `algo` (not im2col, which runs whole layers: __init__.py). keep: window.gemm's."""
    if algo == "winograd":
        return winograd.conv3x3(src, w, bias, out, transposed, relu,
                                winograd.chunks(g, src.shape[1], out.shape[1], s))
    if algo == "window":
        return window.gemm(src, w, bias, out, g, transposed, relu, precision, s, keep)
    return implicit_gemm.gemm(src, w, bias, out, g, transposed, relu, precision, s)


# ---------------------------------------------------------------- weight gradient
# conditions(g, dy, x, precision, s): dy and x of one group


def _wgrad_im2col(g, dy, x, precision, s):
    return layer_algorithm("weight", g, s) == "im2col"


def _wgrad_winograd(g, dy, x, precision, s):
    return winograd.weight_grad_applies(g, dy, x, precision, s, sm_count(x.device))


def _wgrad_batch_inner(g, dy, x, precision, s):
    dot = dot_precision(x.dtype, precision)
    return batch_inner.applies(g, x, dot, dot == "tf32x3" and s.dw_presplit, s)


def _wgrad_flat_shift(g, dy, x, precision, s):
    return flat_shift.applies(g, dy, x, s)


WEIGHT_GRAD_ROUTES = (
    ("im2col", _wgrad_im2col),
    ("winograd", _wgrad_winograd),
    ("batch_inner", _wgrad_batch_inner),
    ("window", window.weight_grad_applies),
    ("flat_shift", _wgrad_flat_shift),
    ("implicit", _always),
)


def weight_grad_algorithm(g, dy, x, precision, s):
    """The algorithm of the weight gradient of one group."""
    return next(name for name, holds in WEIGHT_GRAD_ROUTES if holds(g, dy, x, precision, s))
