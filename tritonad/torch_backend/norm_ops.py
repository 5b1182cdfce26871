"""Handlers for the normalisation operators: native_layer_norm, _fused_rms_norm and
native_group_norm on kernels/norm.py's row kernels, and every batch-norm form aten has
(native_batch_norm, _native_batch_norm_legit*, cudnn_batch_norm, _batch_norm_with_update /
_no_update and their backwards) on its batch-norm kernels. See nn_ops.py for the conventions.
"""
from __future__ import annotations

import math

import torch

from ..kernels.norm import MAX_COLS
from .nn_ops import _FLOATS, _HALF, B, as_rows, channels_last, dtype_of, handler, in_format
from .registry import Fallback


# ---------------------------------------------------------------------------- row normalisation
# layer_norm (and rms_norm, and group_norm: one group a row) on kernels/norm.py's row kernels.
# aten keeps the statistics as [*lead, 1, ..., 1]: float32 for half inputs on CUDA, the input's
# dtype on CPU (PyTorch's CPU kernels), float64 for float64.


def _stats_out(stat, x, shape):
    if x.dtype in _HALF and x.device.type == "cpu":
        stat = B.cast(stat, dtype_of(x.dtype))
    return stat.view(shape)


def _stats_in(stat, rows, x):
    """A saved statistic as the [rows] array the backward kernels read (float32 at least)."""
    stat = stat.view(rows) if stat.is_contiguous() else B.contiguous(stat).view(rows)
    want = torch.float64 if x.dtype == torch.float64 else torch.float32
    return stat if stat.dtype == want else B.cast(stat, dtype_of(want))


def _row_geometry(op, x, normalized_shape):
    k = len(normalized_shape)
    cols = math.prod(normalized_shape)
    if x.dtype not in _FLOATS:
        raise Fallback(f"{op}: {x.dtype} input")
    if cols == 0 or cols > MAX_COLS or x.numel() == 0:
        raise Fallback(f"{op}: rows of {cols} elements (the fused rows hold 1..{MAX_COLS})")
    return x.numel() // cols, cols, tuple(x.shape[:x.dim() - k]) + (1,) * k


@handler("aten::native_layer_norm.default")
def native_layer_norm(x, normalized_shape, weight, bias, eps):
    rows, cols, stat_shape = _row_geometry("native_layer_norm", x, normalized_shape)
    y, mean, rstd = B.layer_norm(as_rows(x, rows, cols),
                                 weight.view(cols) if weight is not None else None,
                                 bias.view(cols) if bias is not None else None, eps, False)
    return (y.view(x.shape), _stats_out(mean, x, stat_shape), _stats_out(rstd, x, stat_shape))


@handler("aten::native_layer_norm_backward.default")
def native_layer_norm_backward(dy, x, normalized_shape, mean, rstd, weight, bias, output_mask):
    rows, cols, _ = _row_geometry("native_layer_norm_backward", x, normalized_shape)
    need_dx, need_dw, need_db = (bool(m) for m in output_mask)
    dx, dw, db = B.layer_norm_backward(
        as_rows(dy, rows, cols), as_rows(x, rows, cols),
        weight.view(cols) if weight is not None else None,
        bias.view(cols) if bias is not None else None,
        _stats_in(mean, rows, x), _stats_in(rstd, rows, x), False, need_dx, need_dw, need_db)
    return (dx.view(x.shape) if dx is not None else None,
            dw.view(weight.shape) if dw is not None else None,
            db.view(bias.shape) if db is not None else None)


@handler("aten::_fused_rms_norm.default")
def fused_rms_norm(x, normalized_shape, weight, eps):
    rows, cols, stat_shape = _row_geometry("_fused_rms_norm", x, normalized_shape)
    if eps is None:  # the machine epsilon of the arithmetic's dtype, as PyTorch's kernel
        eps = torch.finfo(torch.float64 if x.dtype == torch.float64 else torch.float32).eps
    y, _, rstd = B.layer_norm(as_rows(x, rows, cols),
                              weight.view(cols) if weight is not None else None, None, eps, True)
    return y.view(x.shape), _stats_out(rstd, x, stat_shape)


@handler("aten::_fused_rms_norm_backward.default")
def fused_rms_norm_backward(dy, x, normalized_shape, rstd, weight, output_mask):
    rows, cols, _ = _row_geometry("_fused_rms_norm_backward", x, normalized_shape)
    r = _stats_in(rstd, rows, x)
    dx, dw, _ = B.layer_norm_backward(
        as_rows(dy, rows, cols), as_rows(x, rows, cols),
        weight.view(cols) if weight is not None else None, None, r, r, True,
        bool(output_mask[0]), bool(output_mask[1]), False)
    return (dx.view(x.shape) if dx is not None else None,
            dw.view(weight.shape) if dw is not None else None)


def _group_rows(x, n, c, hxw, group):
    if x.dtype not in _FLOATS or x.numel() == 0:
        raise Fallback(f"native_group_norm: {x.dtype} input of {x.numel()} elements")
    cols = (c // group) * hxw
    if cols == 0 or cols > MAX_COLS:
        raise Fallback(f"native_group_norm: groups of {cols} elements")
    x = x if x.is_contiguous() else B.contiguous(x)  # (NCHW rows; channels-last is copied)
    return x.view(n * group, cols), x.view(n, c, hxw)


@handler("aten::native_group_norm.default")
def native_group_norm(x, weight, bias, n, c, hxw, group, eps):
    rows, _ = _group_rows(x, n, c, hxw, group)
    y, mean, rstd = B.layer_norm(rows, None, None, eps, False)
    y = y.view(n, c, hxw)
    if weight is not None:
        y = B.mul(y, weight.view(1, c, 1))
    if bias is not None:
        y = B.add(y, bias.view(1, c, 1))
    if y.dtype != x.dtype:
        y = B.cast(y, dtype_of(x.dtype))
    stats = (n, group)
    return y.view(x.shape), _stats_out(mean, x, stats), _stats_out(rstd, x, stats)


@handler("aten::native_group_norm_backward.default")
def native_group_norm_backward(dy, x, mean, rstd, weight, n, c, hxw, group, output_mask):
    # y = xhat * w[c] + b[c]: d(xhat) = dy * w[c] goes through the row kernel's backward;
    # dw[c] = sum over (n, hw) of dy * xhat, db[c] = sum of dy
    rows, x3 = _group_rows(x, n, c, hxw, group)
    dy3 = dy if dy.is_contiguous() else B.contiguous(dy)
    dy3 = dy3.view(n, c, hxw)
    m, r = _stats_in(mean, n * group, x), _stats_in(rstd, n * group, x)
    dx = dw = db = None
    if output_mask[0]:
        g = B.mul(dy3, weight.view(1, c, 1)) if weight is not None else dy3
        if g.dtype != x.dtype:
            g = B.cast(g, dtype_of(x.dtype))
        dx = B.layer_norm_backward(g.view(rows.shape), rows, None, None, m, r, False, True,
                                   False, False)[0].view(x.shape)
    if output_mask[1] and weight is not None:
        xg = x3.view(n, group, -1)
        xhat = B.mul(B.sub(xg, m.view(n, group, 1)), r.view(n, group, 1)).view(n, c, hxw)
        dw = B.sum(B.mul(dy3, xhat), (0, 2))
        dw = dw if dw.dtype == weight.dtype else B.cast(dw, dtype_of(weight.dtype))
    if output_mask[2]:
        db = B.sum(dy3, (0, 2), dtype=dtype_of(torch.float32) if dy.dtype in _HALF else None)
        want = weight.dtype if weight is not None else dy.dtype
        db = db if db.dtype == want else B.cast(db, dtype_of(want))
    return dx, dw, db


# ----------------------------------------------------------------------------------- batch norm
# kernels/norm.py's batch norm over NCHW or channels-last memory: statistics, the running
# statistics' update (PyTorch's unbiased running variance) and the normalisation; the output in
# the input's format. save_mean / save_invstd are float32 [C] (empty in evaluation, as aten).


def _bn_forward(x, weight, bias, running_mean, running_var, training, momentum, eps):
    if x.dtype not in _FLOATS or x.dim() < 2 or x.numel() == 0:
        raise Fallback(f"batch_norm: {x.dtype} input of shape {tuple(x.shape)}")
    y, mean, rstd = B.batch_norm(x, weight, bias, running_mean, running_var, None,
                                 bool(training), float(momentum), float(eps), None)
    if not training:
        none = torch.empty((0,), dtype=mean.dtype, device=x.device)
        return y, none, none
    return y, mean, rstd


def _bn_backward(dy, x, weight, running_mean, running_var, save_mean, save_invstd, training,
                 eps, output_mask):
    if x.dtype not in _FLOATS or x.numel() == 0:
        raise Fallback(f"batch_norm_backward: {x.dtype} input of shape {tuple(x.shape)}")
    if training or running_mean is None:
        mean, rstd = save_mean, save_invstd
    else:  # evaluation: the running statistics normalised
        mean = running_mean
        rstd = B.rsqrt(B.add(running_var, float(eps)))
    # the kernels read a bias only for a fused activation (none here): any [C] array flags db
    flag_bias = weight if weight is not None else mean
    need_dx, need_dw, need_db = (bool(m) for m in output_mask)
    dx, dw, db = B.batch_norm_backward(dy, x, weight, flag_bias if need_db else None, mean, rstd,
                                       bool(training or running_mean is None), None, need_dx,
                                       need_dw, need_db)
    if dx is not None and channels_last(x) != channels_last(dx):
        dx = in_format(dx if dx.is_contiguous() else B.contiguous(dx), channels_last(x))
    return dx, dw, db


@handler("aten::native_batch_norm.default", "aten::_native_batch_norm_legit.default")
def native_batch_norm(x, weight, bias, running_mean, running_var, training, momentum, eps):
    return _bn_forward(x, weight, bias, running_mean, running_var, training, momentum, eps)


@handler("aten::_native_batch_norm_legit.no_stats")
def native_batch_norm_no_stats(x, weight, bias, training, momentum, eps):
    return _bn_forward(x, weight, bias, None, None, True, momentum, eps)


@handler("aten::_native_batch_norm_legit_no_training.default")
def native_batch_norm_no_training(x, weight, bias, running_mean, running_var, momentum, eps):
    return _bn_forward(x, weight, bias, running_mean, running_var, False, momentum, eps)


@handler("aten::native_batch_norm_backward.default")
def native_batch_norm_backward(dy, x, weight, running_mean, running_var, save_mean, save_invstd,
                               train, eps, output_mask):
    return _bn_backward(dy, x, weight, running_mean, running_var, save_mean, save_invstd, train,
                        eps, output_mask)


def _reserve(x):
    return torch.empty((0,), dtype=torch.uint8, device=x.device)


@handler("aten::cudnn_batch_norm.default")
def cudnn_batch_norm(x, weight, bias, running_mean, running_var, training, factor, eps):
    return _bn_forward(x, weight, bias, running_mean, running_var, training, factor,
                       eps) + (_reserve(x),)


@handler("aten::cudnn_batch_norm_backward.default")
def cudnn_batch_norm_backward(x, dy, weight, running_mean, running_var, save_mean, save_var, eps,
                              reserve):
    # cuDNN's backward is the training one (autograd calls it only after a training forward)
    return _bn_backward(dy, x, weight, running_mean, running_var, save_mean, save_var, True,
                        eps, (True, True, True))


@handler("aten::_batch_norm_with_update.default")
def batch_norm_with_update(x, weight, bias, running_mean, running_var, momentum, eps):
    return _bn_forward(x, weight, bias, running_mean, running_var, True, momentum,
                       eps) + (_reserve(x),)


@handler("aten::_batch_norm_no_update.default")
def batch_norm_no_update(x, weight, bias, running_mean, running_var, momentum, eps):
    training = running_mean is None or running_var is None
    return _bn_forward(x, weight, bias, running_mean, running_var, training, momentum,
                       eps) + (_reserve(x),)


@handler("aten::batch_norm_backward.default")
def batch_norm_backward(dy, x, weight, running_mean, running_var, save_mean, save_var, update,
                        eps, output_mask, reserve):
    return _bn_backward(dy, x, weight, running_mean, running_var, save_mean, save_var,
                        bool(update), eps, output_mask)
