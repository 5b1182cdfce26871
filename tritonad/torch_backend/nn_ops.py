"""Handlers for the network operators, and what all the handler modules share: convolution and
pooling here; normalisation in norm_ops.py, embedding, losses and dropout in loss_ops.py,
attention in attention_ops.py, the optimizers in optim_ops.py.

Each handler translates aten's arguments onto one or a few of tritonad's primitives (the triton
backend's; see backend.py) and returns what aten returns: the same tuple layout, the saved
statistics in the dtypes and shapes aten's backward operator expects, and the memory format
PyTorch's CUDA kernels give (channels-last in, channels-last out). A case a primitive does not
cover raises Fallback, and PyTorch's own kernel runs (counted): 3-d convolutions, integer
pooling, scale_grad_by_freq, rows wider than the fused row norms hold, ...

A handler also falls back where tritonad's argument check refuses the call (ValueError or
TypeError from a primitive: an impossible window, a dtype mix): PyTorch then raises its own
error for it, with its own message and type, exactly as without the plugin.

A channels-last output costs one copy here: the convolution and pooling kernels write NCHW
(a launcher that wrote the output's strides directly would save that pass). Float32
convolutions run at the precision PyTorch's torch.backends.cudnn.allow_tf32 asks.
"""
from __future__ import annotations

import functools

import torch

from .. import backend as _backend
from .. import settings as _settings
from ..dtypes import get_dtype
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


def dtype_of(torch_dtype):
    """tritonad's DType of a torch dtype (what the primitives' dtype arguments take)."""
    return get_dtype(torch_dtype)


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


def _at_pytorch_precision(fn, x, *args):
    """fn(x, *args), a float32 convolution at the precision PyTorch's flag asks of cuDNN: TF32
    where torch.backends.cudnn.allow_tf32 (its default), float32 accuracy (3xTF32) where not;
    tritonad's own setting is restored after."""
    want = "high" if torch.backends.cudnn.allow_tf32 else "highest"
    saved = _settings.conv_precision()
    if x.dtype != torch.float32 or saved == want:
        return fn(x, *args)
    _settings.set_conv_precision(want)
    try:
        return fn(x, *args)
    finally:
        _settings.set_conv_precision(saved)


@handler("aten::convolution.default")
def convolution(x, w, bias, stride, padding, dilation, transposed, output_padding, groups):
    return _at_pytorch_precision(_convolution, x, w, bias, stride, padding, dilation,
                                 transposed, output_padding, groups)


def _convolution(x, w, bias, stride, padding, dilation, transposed, output_padding, groups):
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
    return _at_pytorch_precision(_convolution_backward, x, dy, w, bias_sizes, stride, padding,
                                 dilation, transposed, output_padding, groups, output_mask)


def _convolution_backward(x, dy, w, bias_sizes, stride, padding, dilation, transposed,
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
