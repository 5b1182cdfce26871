"""Handlers for the network operators: convolution, pooling, normalisation, embedding, losses
and dropout (attention: attention_ops.py; optimizers: optim_ops.py).

Each handler translates aten's arguments onto one or a few of tritonad's primitives (the triton
backend's; see backend.py) and returns what aten returns: the same tuple layout, the saved
statistics in the dtypes and shapes aten's backward operator expects, and the memory format
PyTorch's CUDA kernels give (channels-last in, channels-last out). A case a primitive does not
cover raises Fallback, and PyTorch's own kernel runs (counted): 3-d convolutions, integer
pooling, scale_grad_by_freq, rows wider than the fused row norms hold, ...

A handler also falls back where tritonad's argument check refuses the call (ValueError or
TypeError from a primitive: an impossible window, a dtype mix): PyTorch then raises its own
error for it, with its own message and type, exactly as without the plugin.
"""
from __future__ import annotations

import functools
import math

import torch

from .. import backend as _backend
from ..kernels.norm import MAX_COLS
from .registry import Fallback, register

B = _backend._instance("triton")
_HALF = (torch.float16, torch.bfloat16)
_FLOATS = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def handler(*names):
    """register(*names), with tritonad's argument errors (ValueError, TypeError) turned into a
    fallback: PyTorch's kernel then raises its own error for the same call."""
    def wrap(fn):
        @functools.wraps(fn)
        def checked(*args, **kwargs):
            try:
                return fn(*args, **kwargs)
            except (ValueError, TypeError) as e:
                raise Fallback(f"tritonad refused the arguments: {e}") from None
        return register(*names)(checked)
    return wrap


# ------------------------------------------------------------------------------ layout helpers


def channels_last(t) -> bool:
    """Whether PyTorch's suggest_memory_format() of a 4-d tensor is channels-last (its
    is_channels_last_strides_2d rule: strides increasing in the order C, W, H, N)."""
    if t is None or t.dim() != 4:
        return False
    low = 0
    for d in (1, 3, 2, 0):
        size, stride = t.shape[d], t.stride(d)
        if size == 0 or stride < low or (d == 0 and low == t.stride(1)):
            return False
        low = stride * size if size > 1 else stride
    return True


def _channels_last_strides(shape):
    n, c, h, w = shape
    return (h * w * c, 1, w * c, c)


def in_format(y, last: bool):
    """y (contiguous NCHW) as PyTorch lays it out: copied into channels-last memory if `last`."""
    if not last or y.dim() != 4 or channels_last(y):
        return y
    out = torch.empty_strided(tuple(y.shape), _channels_last_strides(tuple(y.shape)),
                              dtype=y.dtype, device=y.device)
    return B.copy_(out, y)


def as_rows(x, rows, cols):
    """x as a [rows, cols] view (a contiguous copy where its strides do not allow one)."""
    try:
        return x.view(rows, cols)
    except RuntimeError:
        return B.contiguous(x).view(rows, cols)


def _float_args(op, *tensors):
    dtype = tensors[0].dtype
    for t in tensors:
        if t is not None and (t.dtype not in _FLOATS or t.dtype != dtype):
            raise Fallback(f"{op}: dtypes {[str(a.dtype) for a in tensors if a is not None]}")


def _pair(v, default=None):
    if v is None or (isinstance(v, (list, tuple)) and len(v) == 0):
        return default
    if isinstance(v, int):
        return (v, v)
    v = tuple(int(i) for i in v)
    return v * 2 if len(v) == 1 else v


# ---------------------------------------------------------------------------------- convolution
# Forward, input and weight gradients are tritonad's conv2d kernels (kernels/conv/); a 1-d
# convolution runs them on a height-1 view; a transposed convolution is conv2d's input gradient
# (and its own gradients conv2d and conv2d's weight gradient), as autodiff/tensor_ops.py's.


def _as_2d(x, w, stride, padding, dilation, output_padding):
    """(x, w, stride, padding, dilation, output_padding) of a 1-d or 2-d convolution as 2-d."""
    if x.dim() == 3:
        one = lambda v, pad: (pad, int(v[0]))  # noqa: E731
        return (x.unsqueeze(2), w.unsqueeze(2), one(stride, 1), one(padding, 0),
                one(dilation, 1), one(output_padding, 0))
    return x, w, _pair(stride), _pair(padding), _pair(dilation), _pair(output_padding, (0, 0))


def _conv_checks(x, w, bias):
    if x.dim() not in (3, 4) or w.dim() != x.dim():
        raise Fallback(f"convolution: {x.dim() - 2}-d (tritonad runs 1-d and 2-d)")
    _float_args("convolution", x, w, bias)


def _transposed_out_shape(x, w, stride, padding, dilation, output_padding, groups):
    return (x.shape[0], w.shape[1] * groups) + tuple(
        (size - 1) * s - 2 * p + d * (k - 1) + o + 1 for size, s, p, d, k, o in
        zip(x.shape[2:], stride, padding, dilation, w.shape[2:], output_padding))


@handler("aten::convolution.default")
def convolution(x, w, bias, stride, padding, dilation, transposed, output_padding, groups):
    _conv_checks(x, w, bias)
    last = channels_last(x) or channels_last(w)  # cuDNN's rule for the output's format
    x2, w2, stride, padding, dilation, output_padding = _as_2d(x, w, stride, padding, dilation,
                                                               output_padding)
    if transposed:
        shape = _transposed_out_shape(x2, w2, stride, padding, dilation, output_padding, groups)
        # conv2d_backward takes the input's geometry from an array: one element, expanded
        shape_only = torch.empty((1,), dtype=x.dtype, device=x.device).expand(shape)
        y = B.conv2d_backward(x2, shape_only, w2, stride, padding, dilation, groups, True,
                              False, False)[0]
        if bias is not None:
            y = B.add(y, bias.view(1, -1, 1, 1), out=y)
    else:
        y = B.conv2d(x2, w2, bias, stride, padding, dilation, groups)
    if x.dim() == 3:
        return y.view(y.shape[0], y.shape[1], y.shape[3])
    return in_format(y, last)


@handler("aten::convolution_backward.default")
def convolution_backward(dy, x, w, bias_sizes, stride, padding, dilation, transposed,
                         output_padding, groups, output_mask):
    _conv_checks(x, w, None)
    _float_args("convolution_backward", dy, x, w)
    last = channels_last(x) or channels_last(w)
    dy2 = dy.unsqueeze(2) if dy.dim() == 3 else dy
    x2, w2, stride, padding, dilation, output_padding = _as_2d(x, w, stride, padding, dilation,
                                                               output_padding)
    need_dx, need_dw, need_db = (bool(m) for m in output_mask)
    need_db = need_db and bias_sizes is not None
    if transposed:
        # y = conv2d_backward(x) (the input gradient of a conv2d with "dy" = x): its adjoints
        dx = B.conv2d(dy2, w2, None, stride, padding, dilation, groups) if need_dx else None
        dw = B.conv2d_backward(x2, dy2, w2, stride, padding, dilation, groups, False, True,
                               False)[1] if need_dw else None
        db = B.sum(dy2, (0, 2, 3)) if need_db else None
    else:
        dx, dw, db = B.conv2d_backward(dy2, x2, w2, stride, padding, dilation, groups, need_dx,
                                       need_dw, need_db)
    if x.dim() == 3:
        dx = dx.view(x.shape) if dx is not None else None
        dw = dw.view(w.shape) if dw is not None else None
    else:
        dx = in_format(dx, last) if dx is not None else None
        dw = in_format(dw, last) if dw is not None else None
    return dx, dw, db


# -------------------------------------------------------------------------------------- pooling


def _batched(x):
    """(x as [N, C, H, W], whether it was unbatched [C, H, W])."""
    if x.dim() == 3:
        return x.unsqueeze(0), True
    if x.dim() != 4:
        raise Fallback(f"pooling: input of {x.dim()} dims")
    return x, False


def _pool_float(op, x):
    if x.dtype not in _FLOATS:
        raise Fallback(f"{op}: {x.dtype} input (tritonad pools floating point)")


@handler("aten::max_pool2d_with_indices.default")
def max_pool2d_with_indices(x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    _pool_float("max_pool2d", x)
    x4, unbatched = _batched(x)
    kernel = _pair(kernel_size)
    y, index = B.max_pool2d(x4, kernel, _pair(stride, kernel), _pair(padding), _pair(dilation),
                            bool(ceil_mode), True)
    if unbatched:
        return y[0], index[0]
    last = channels_last(x4)
    return in_format(y, last), in_format(index, last)


@handler("aten::max_pool2d_with_indices_backward.default")
def max_pool2d_with_indices_backward(dy, x, kernel_size, stride, padding, dilation, ceil_mode,
                                     index):
    _pool_float("max_pool2d_backward", x)
    x4, unbatched = _batched(x)
    dy4, index4 = (dy.unsqueeze(0), index.unsqueeze(0)) if unbatched else (dy, index)
    kernel = _pair(kernel_size)
    dx = B.max_pool2d_backward(dy4, index4, tuple(x4.shape), kernel, _pair(stride, kernel),
                               _pair(padding), _pair(dilation), bool(ceil_mode))
    return dx[0] if unbatched else in_format(dx, channels_last(x4))


@handler("aten::avg_pool2d.default")
def avg_pool2d(x, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True,
               divisor_override=None):
    _pool_float("avg_pool2d", x)
    x4, unbatched = _batched(x)
    kernel = _pair(kernel_size)
    y = B.avg_pool2d(x4, kernel, _pair(stride, kernel), _pair(padding), bool(ceil_mode),
                     bool(count_include_pad), divisor_override)
    return y[0] if unbatched else in_format(y, channels_last(x4))


@handler("aten::avg_pool2d_backward.default")
def avg_pool2d_backward(dy, x, kernel_size, stride, padding, ceil_mode, count_include_pad,
                        divisor_override):
    _pool_float("avg_pool2d_backward", x)
    x4, unbatched = _batched(x)
    dy4 = dy.unsqueeze(0) if unbatched else dy
    kernel = _pair(kernel_size)
    dx = B.avg_pool2d_backward(dy4, tuple(x4.shape), kernel, _pair(stride, kernel),
                               _pair(padding), bool(ceil_mode), bool(count_include_pad),
                               divisor_override)
    return dx[0] if unbatched else in_format(dx, channels_last(x4))


def _adaptive_kernel(x4, output_size):
    """The window of an adaptive average pool whose bins are equal (the input plane a multiple
    of the output plane): kernel = stride = H / oh; None for unequal bins."""
    (h, w), (oh, ow) = x4.shape[2:], tuple(int(s) for s in output_size)
    if oh <= 0 or ow <= 0:
        raise Fallback(f"_adaptive_avg_pool2d: output plane {(oh, ow)}")
    return None if h % oh or w % ow else (h // oh, w // ow)


def composite(fn, arrays, grad_of=None, dy=None):
    """fn over tritonad Tensors wrapping `arrays` on the triton backend: the raw result, or,
    with grad_of (indices into arrays) and dy, the raw gradients of fn's result for dy (the
    forward recomputed; for the rare cases a primitive does not cover, written once as a
    tritonad composite)."""
    from ..autodiff import grad, no_grad
    from ..tensor import Tensor
    with _backend.use_backend("triton"):
        wrapped = [Tensor._wrap(a, requires_grad=grad_of is not None and i in grad_of)
                   if isinstance(a, torch.Tensor) else a for i, a in enumerate(arrays)]
        if grad_of is None:
            with no_grad():
                return fn(*wrapped)._data
        y = fn(*wrapped)
        grads = grad(y, [wrapped[i] for i in grad_of], Tensor._wrap(dy))
        return [g._data for g in grads]


def _adaptive_bins(x4, size):
    from ..autodiff.tensor_ops import adaptive_avg_pool2d as bins
    return composite(lambda x: bins(x, size), [x4])


@handler("aten::_adaptive_avg_pool2d.default")
def adaptive_avg_pool2d(x, output_size):
    # equal bins: avg_pool2d; unequal ones (5 from 8): tritonad's composite of window means
    _pool_float("adaptive_avg_pool2d", x)
    x4, unbatched = _batched(x)
    kernel = _adaptive_kernel(x4, output_size)
    if kernel is None:
        y = _adaptive_bins(x4, tuple(int(s) for s in output_size))
    else:
        y = B.avg_pool2d(x4, kernel, kernel)
    return y[0] if unbatched else in_format(y, channels_last(x4))


@handler("aten::_adaptive_avg_pool2d_backward.default")
def adaptive_avg_pool2d_backward(dy, x):
    _pool_float("adaptive_avg_pool2d_backward", x)
    x4, unbatched = _batched(x)
    dy4 = dy.unsqueeze(0) if unbatched else dy
    kernel = _adaptive_kernel(x4, dy4.shape[2:])
    if kernel is None:
        from ..autodiff.tensor_ops import adaptive_avg_pool2d as bins
        size = tuple(dy4.shape[2:])
        dx = composite(lambda t: bins(t, size), [x4], (0,), dy4)[0]
    else:
        dx = B.avg_pool2d_backward(dy4, tuple(x4.shape), kernel, kernel)
    return dx[0] if unbatched else in_format(dx, channels_last(x4))


# ---------------------------------------------------------------------------- row normalisation
# layer_norm (and rms_norm, and group_norm: one group a row) on kernels/norm.py's row kernels.
# aten keeps the statistics as [*lead, 1, ..., 1]: float32 for half inputs on CUDA, the input's
# dtype on CPU (PyTorch's CPU kernels), float64 for float64.


def _stats_out(stat, x, shape):
    if x.dtype in _HALF and x.device.type == "cpu":
        stat = B.cast(stat, _dtype(x.dtype))
    return stat.view(shape)


def _stats_in(stat, rows, x):
    """A saved statistic as the [rows] array the backward kernels read (float32 at least)."""
    stat = stat.view(rows) if stat.is_contiguous() else B.contiguous(stat).view(rows)
    want = torch.float64 if x.dtype == torch.float64 else torch.float32
    return stat if stat.dtype == want else B.cast(stat, _dtype(want))


def _dtype(torch_dtype):
    from ..dtypes import get_dtype
    return get_dtype(torch_dtype)


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
        y = B.cast(y, _dtype(x.dtype))
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
            g = B.cast(g, _dtype(x.dtype))
        dx = B.layer_norm_backward(g.view(rows.shape), rows, None, None, m, r, False, True,
                                   False, False)[0].view(x.shape)
    if output_mask[1] and weight is not None:
        xg = x3.view(n, group, -1)
        xhat = B.mul(B.sub(xg, m.view(n, group, 1)), r.view(n, group, 1)).view(n, c, hxw)
        dw = B.sum(B.mul(dy3, xhat), (0, 2))
        dw = dw if dw.dtype == weight.dtype else B.cast(dw, _dtype(weight.dtype))
    if output_mask[2]:
        db = B.sum(dy3, (0, 2), dtype=_dtype(torch.float32) if dy.dtype in _HALF else None)
        want = weight.dtype if weight is not None else dy.dtype
        db = db if db.dtype == want else B.cast(db, _dtype(want))
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
    c = x.shape[1]
    # the kernels read a bias only for a fused activation (none here): any [C] array flags db
    flag_bias = weight if weight is not None else mean
    need_dx, need_dw, need_db = (bool(m) for m in output_mask)
    dx, dw, db = B.batch_norm_backward(dy, x, weight, flag_bias if need_db else None, mean, rstd,
                                       bool(training or running_mean is None), None, need_dx,
                                       need_dw, need_db)
    if dx is not None and channels_last(x) != channels_last(dx):
        dx = in_format(dx if dx.is_contiguous() else B.contiguous(dx), channels_last(x))
    assert db is None or db.shape == (c,)
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


# ------------------------------------------------------------------------------------ embedding


@register("aten::embedding.default")
def embedding(weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    if weight.dim() != 2 or indices.dtype not in (torch.int64, torch.int32):
        raise Fallback(f"embedding: weight {tuple(weight.shape)}, indices {indices.dtype}")
    checked = B.index_check(indices, weight.shape[0], "embedding", False)
    if weight.device.type == "cpu":
        # IndexError now, as PyTorch's CPU kernel; on a GPU the error flag is read at the next
        # host read of the device (PyTorch's own check there is an asynchronous device assert)
        B.check_errors(weight.device)
    return B.gather_rows(weight, checked)


@register("aten::embedding_dense_backward.default")
def embedding_dense_backward(dy, indices, num_weights, padding_idx, scale_grad_by_freq):
    # the rows of dy summed by index, sorted and in a fixed order (deterministic, no atomics);
    # row padding_idx gets no gradient
    if scale_grad_by_freq:
        raise Fallback("embedding_dense_backward: scale_grad_by_freq")
    if indices.dtype not in (torch.int64, torch.int32):
        raise Fallback(f"embedding_dense_backward: indices {indices.dtype}")
    n = indices.numel()
    index = indices if indices.is_contiguous() else B.contiguous(indices)
    src = as_rows(dy, n, dy.shape[-1])
    return B.scatter_reduce_rows(src, index.view(n), None, int(num_weights), "sum", False,
                                 int(padding_idx), "embedding")


# ---------------------------------------------------------------------------------------- losses
# nll_loss: loss_i = -w[t_i] x[i, t_i] over the rows whose target is not ignore_index; mean
# divides by the sum of those weights (total_weight). Its gradient is that weight, negated,
# scattered into zeros at the targets.

_REDUCTIONS = {0: "none", 1: "mean", 2: "sum"}


def _nll_parts(op, x, target, weight, ignore_index):
    """(rows [N, C], safe target [N, 1], w_t [N] float: the class weight of each row's target,
    0 where ignored)."""
    if x.dtype not in _FLOATS or target.dtype not in (torch.int64, torch.int32):
        raise Fallback(f"{op}: {x.dtype} input, {target.dtype} target")
    if x.dim() == 1:
        x, target = x.unsqueeze(0), target.unsqueeze(0)
    if x.dim() != 2 or target.dim() != 1 or x.shape[0] == 0:
        raise Fallback(f"{op}: input {tuple(x.shape)}, target {tuple(target.shape)}")
    B.check_targets(target, x.shape[1], int(ignore_index), "nll_loss")
    kept = B.ne(target, int(ignore_index))
    safe = B.where(kept, target, 0)
    if weight is not None:
        w_t = B.mul(B.gather_rows(weight, safe), kept)
    else:
        w_t = B.cast(kept, _dtype(x.dtype))
    return x, safe.view(-1, 1), w_t


@handler("aten::nll_loss_forward.default")
def nll_loss_forward(x, target, weight, reduction, ignore_index):
    rows, safe, w_t = _nll_parts("nll_loss", x, target, weight, ignore_index)
    losses = B.neg(B.mul(B.gather_along(rows, safe, 1).view(-1), w_t))
    kind = _REDUCTIONS[int(reduction)]
    if kind == "none":
        out = losses if x.dim() == 2 else losses.view(())
        return out, torch.empty((), dtype=x.dtype, device=x.device)
    total = B.sum(w_t)
    out = B.sum(losses)
    if kind == "mean":
        out = B.div(out, total)
    return out, total


@handler("aten::nll_loss_backward.default")
def nll_loss_backward(dy, x, target, weight, reduction, ignore_index, total_weight):
    rows, safe, w_t = _nll_parts("nll_loss_backward", x, target, weight, ignore_index)
    kind = _REDUCTIONS[int(reduction)]
    g = dy.view(-1) if kind == "none" else dy.view(1)
    if kind == "mean":
        g = B.div(g, total_weight.view(1))
    src = B.neg(B.mul(w_t, g))
    if src.dtype != x.dtype:
        src = B.cast(src, _dtype(x.dtype))
    dx = B.scatter_add_along(src.view(-1, 1), safe, 1, rows.shape[1])
    return dx.view(x.shape)


def _nll2d_rows(x, target):
    """[N, C, H, W] scores and [N, H, W] targets as [N*H*W, C] rows and [N*H*W] targets."""
    if x.dim() != 4 or target.dim() != 3:
        raise Fallback(f"nll_loss2d: input {tuple(x.shape)}, target {tuple(target.shape)}")
    n, c, h, w = x.shape
    rows = B.contiguous(x.permute(0, 2, 3, 1)).view(n * h * w, c)
    t = target if target.is_contiguous() else B.contiguous(target)
    return rows, t.view(n * h * w)


@handler("aten::nll_loss2d_forward.default")
def nll_loss2d_forward(x, target, weight, reduction, ignore_index):
    rows, t = _nll2d_rows(x, target)
    out, total = nll_loss_forward(rows, t, weight, reduction, ignore_index)
    if _REDUCTIONS[int(reduction)] == "none":
        out = out.view(target.shape)
    return out, total


@handler("aten::nll_loss2d_backward.default")
def nll_loss2d_backward(dy, x, target, weight, reduction, ignore_index, total_weight):
    rows, t = _nll2d_rows(x, target)
    if _REDUCTIONS[int(reduction)] == "none":
        dy = B.contiguous(dy).view(-1) if not dy.is_contiguous() else dy.view(-1)
    d = nll_loss_backward(dy, rows, t, weight, reduction, ignore_index, total_weight)
    n, c, h, w = x.shape
    return B.contiguous(d.view(n, h, w, c).permute(0, 3, 1, 2))


def _same_shape(op, a, b):
    if tuple(a.shape) != tuple(b.shape) or a.dtype not in _FLOATS or a.dtype != b.dtype:
        raise Fallback(f"{op}: {tuple(a.shape)} {a.dtype} against {tuple(b.shape)} {b.dtype}")


def _reduce(op, losses, reduction):
    kind = _REDUCTIONS[int(reduction)]
    if kind == "none":
        return losses
    if losses.numel() == 0:
        raise Fallback(f"{op}: an empty input reduced")
    return B.mean(losses) if kind == "mean" else B.sum(losses)


def _seed(dy, x, reduction):
    """The incoming gradient per element: dy itself for "none", else dy (/ numel for mean)
    broadcast over x."""
    kind = _REDUCTIONS[int(reduction)]
    if kind == "none":
        return dy
    g = B.div(dy, x.numel()) if kind == "mean" else dy
    return g.view((1,) * x.dim()).expand(x.shape) if x.dim() else g


@handler("aten::mse_loss.default")
def mse_loss(x, target, reduction=1):
    _same_shape("mse_loss", x, target)
    d = B.sub(x, target)
    return _reduce("mse_loss", B.mul(d, d), reduction)


@handler("aten::mse_loss_backward.default")
def mse_loss_backward(dy, x, target, reduction):
    # d/dx (x - t)^2 = 2 (x - t)
    _same_shape("mse_loss_backward", x, target)
    return B.mul(B.mul(B.sub(x, target), 2.0), _seed(dy, x, reduction))


@handler("aten::binary_cross_entropy.default")
def binary_cross_entropy(x, target, weight=None, reduction=1):
    # loss = -w (t log x + (1 - t) log(1 - x)), each log clamped at -100 as PyTorch
    _same_shape("binary_cross_entropy", x, target)
    log_x = B.clamp(B.log(x), min=-100.0)
    log_1mx = B.clamp(B.log(B.sub(1.0, x)), min=-100.0)
    losses = B.neg(B.add(B.mul(target, log_x), B.mul(B.sub(1.0, target), log_1mx)))
    if weight is not None:
        losses = B.mul(losses, weight)
        losses = losses if losses.dtype == x.dtype else B.cast(losses, _dtype(x.dtype))
    return _reduce("binary_cross_entropy", losses, reduction)


@handler("aten::binary_cross_entropy_backward.default")
def binary_cross_entropy_backward(dy, x, target, weight=None, reduction=1):
    # d/dx = w (x - t) / max(x (1 - x), 1e-12), PyTorch's guard against a zero denominator
    _same_shape("binary_cross_entropy_backward", x, target)
    denom = B.clamp(B.mul(x, B.sub(1.0, x)), min=1e-12)
    g = B.div(B.sub(x, target), denom)
    if weight is not None:
        g = B.mul(g, weight)
    g = B.mul(g, _seed(dy, x, reduction))
    return g if g.dtype == x.dtype else B.cast(g, _dtype(x.dtype))


@handler("aten::binary_cross_entropy_with_logits.default")
def binary_cross_entropy_with_logits(x, target, weight=None, pos_weight=None, reduction=1):
    # loss = (1 - t) x + (1 + (pw - 1) t) (log(1 + exp(-|x|)) + max(-x, 0)), stable for any x
    _same_shape("binary_cross_entropy_with_logits", x, target)
    soft = B.add(B.log1p(B.exp(B.neg(B.abs(x)))), B.relu(B.neg(x)))
    scale = B.add(B.mul(B.sub(pos_weight, 1.0), target), 1.0) if pos_weight is not None else 1.0
    losses = B.add(B.mul(B.sub(1.0, target), x), B.mul(scale, soft))
    if weight is not None:
        losses = B.mul(losses, weight)
    if losses.dtype != x.dtype or tuple(losses.shape) != tuple(x.shape):
        raise Fallback("binary_cross_entropy_with_logits: broadcast weights")
    return _reduce("binary_cross_entropy_with_logits", losses, reduction)


# -------------------------------------------------------------------------------------- dropout
# kernels/random.py's Philox dropout, drawn from tritonad's own stream (td.manual_seed): the
# same probability law as PyTorch's, not the same bits.


@register("aten::native_dropout.default")
def native_dropout(x, p, train):
    from .. import generator
    if x.dtype not in _FLOATS:
        raise Fallback(f"native_dropout: {x.dtype} input")
    if train is False or x.numel() == 0:
        keep = torch.empty(tuple(x.shape), dtype=torch.bool, device=x.device)
        return B.contiguous(x), B.fill_(keep, True)
    seed, offset = generator.take(x.numel())
    return B.dropout(x, float(p), seed, offset)


@register("aten::native_dropout_backward.default")
def native_dropout_backward(dy, mask, scale):
    # dx = dy * mask * scale (scale = 1 / (1 - p))
    dx = B.where(mask, B.mul(dy, float(scale)), 0.0)
    return dx if dx.dtype == dy.dtype else B.cast(dx, _dtype(dy.dtype))
