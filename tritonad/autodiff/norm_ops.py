"""Normalisation: layer_norm, rms_norm, group_norm, normalize, batch_norm (and batch_norm
followed by relu or gelu, batch_norm_act).

Each is a composite over Tensor ops (its gradient comes from its parts; the numpy backend runs
it; it is the tests' oracle). Half inputs are normalised in float32 and rounded once, as
PyTorch's kernels do. Fused forms, one Triton kernel per pass (kernels/norm.py), are registered
beside them and are once-differentiable:

- layer_norm / rms_norm: one forward kernel (saves the row mean and 1/std in float32) and one
  backward kernel that writes dx and per-program partial sums of dweight and dbias, summed by
  a second small kernel in a fixed order (deterministic);
- group_norm: the layer_norm kernels over rows of one group (no affine), then the per-channel
  affine as Tensor ops;
- batch_norm: statistics, running-statistics update (on the device, no host read: a CUDA graph
  may capture it), normalise and the activation; backward in two passes over dy.
"""
from __future__ import annotations

import math
import numbers

from .. import dtypes
from ..tensor import Tensor
from .composite import composite
from .elementwise import gelu, maximum, relu, rsqrt
from .function import Function
from .grad_mode import no_grad
from .nn_ops import _b

__all__ = ["layer_norm", "rms_norm", "group_norm", "normalize", "batch_norm", "batch_norm_act"]

# widest row the fused layer_norm / rms_norm kernels hold in registers; wider rows compose
FUSED_MAX_COLS = 16384

_HALF = (dtypes.float16, dtypes.bfloat16)
_ACTIVATIONS = (None, "relu", "gelu")
# eps=None of rms_norm: the machine epsilon of the arithmetic's dtype (float32 for half inputs),
# as torch's kernels use
_MACHINE_EPS = {dtypes.float16: 2.0 ** -23, dtypes.bfloat16: 2.0 ** -23, dtypes.float32: 2.0 ** -23,
                dtypes.float64: 2.0 ** -52}


def _compute_dtype(x):
    """float32 arithmetic for half inputs (rounded once at the end), the input's own otherwise."""
    return dtypes.float32 if x.dtype in _HALF else x.dtype


def _up(t, dtype):
    return t if t is None or t.dtype == dtype else t.to(dtype)


def _check_float(op, *tensors):
    for t in tensors:
        if t is not None and not t.dtype.is_floating_point:
            shapes = ", ".join(f"{tuple(a.shape)} {a.dtype.name}" for a in tensors if a is not None)
            raise TypeError(f"{op}: expected floating point tensors, got {shapes}")


# ------------------------------------------------------------------- layer_norm and rms_norm


def _normalized_shape(op, x, normalized_shape, weight, bias=None):
    """normalized_shape as a tuple, checked against x's trailing dims, weight and bias."""
    if isinstance(normalized_shape, numbers.Integral):
        shape = (int(normalized_shape),)
    else:
        shape = tuple(int(n) for n in normalized_shape)
    if not shape:
        raise ValueError(f"{op}: normalized_shape must have at least one dimension, got ()")
    if x.ndim < len(shape) or tuple(x.shape[x.ndim - len(shape):]) != shape:
        raise ValueError(f"{op}: input of shape {tuple(x.shape)} does not end with "
                         f"normalized_shape {shape}")
    for name, t in (("weight", weight), ("bias", bias)):
        if t is not None and tuple(t.shape) != shape:
            raise ValueError(f"{op}: {name} of shape {tuple(t.shape)} does not match "
                             f"normalized_shape {shape}")
        if t is not None and t.dtype != x.dtype and x.dtype not in _HALF:
            # (half inputs may take float32 parameters, as under autocast)
            raise TypeError(f"{op}: input is {x.dtype.name} but {name} is {t.dtype.name}")
    _check_float(op, x, weight, bias)
    return shape


def _rms_eps(x, eps):
    return _MACHINE_EPS[x.dtype] if eps is None else float(eps)


@composite
def layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-5):
    """(x - mean) / sqrt(var + eps) * weight + bias over the trailing `normalized_shape` dims
    (biased variance). input: [*, *normalized_shape]; weight, bias: normalized_shape.
    F.layer_norm(x, (768,), w, b)"""
    shape = _normalized_shape("layer_norm", input, normalized_shape, weight, bias)
    dims = tuple(range(input.ndim - len(shape), input.ndim))
    acc = _compute_dtype(input)
    x = _up(input, acc)
    xc = x - x.mean(dims, keepdim=True)
    y = xc * rsqrt((xc * xc).mean(dims, keepdim=True) + eps)
    if weight is not None:
        y = y * _up(weight, acc)
    if bias is not None:
        y = y + _up(bias, acc)
    return _up(y, input.dtype)


@composite
def rms_norm(input, normalized_shape, weight=None, eps=None):
    """x / sqrt(mean(x^2) + eps) * weight over the trailing `normalized_shape` dims; eps=None is
    the dtype's machine epsilon. input: [*, *normalized_shape]. F.rms_norm(x, (768,), w)"""
    shape = _normalized_shape("rms_norm", input, normalized_shape, weight)
    dims = tuple(range(input.ndim - len(shape), input.ndim))
    eps = _rms_eps(input, eps)
    acc = _compute_dtype(input)
    x = _up(input, acc)
    y = x * rsqrt((x * x).mean(dims, keepdim=True) + eps)
    if weight is not None:
        y = y * _up(weight, acc)
    return _up(y, input.dtype)


class LayerNorm(Function):
    """Fused layer_norm / rms_norm over the last dim of x: [rows, cols]. Forward saves the row
    mean and 1/std (float32); backward is one kernel for dx and the partial weight and bias
    sums, then one to sum those (once-differentiable)."""
    once_differentiable = True

    @staticmethod
    def forward(ctx, x, weight, bias, eps, rms):
        y, mean, rstd = _b().layer_norm(x, weight, bias, eps, rms)
        ctx.rms = rms
        ctx.save_for_backward(x, weight, bias, mean, rstd)
        return y

    @staticmethod
    def backward(ctx, dy):
        x, weight, bias, mean, rstd = ctx.saved
        needs = ctx.needs_input_grad
        raw = (lambda t: t._data if t is not None else None)
        dx, dw, db = _b().layer_norm_backward(
            dy._data, x._data, raw(weight), raw(bias), mean._data, rstd._data, ctx.rms,
            bool(needs[0]), bool(needs[1]), bool(needs[2]))
        wrap = Tensor._wrap
        return (wrap(dx) if dx is not None else None, wrap(dw) if dw is not None else None,
                wrap(db) if db is not None else None, None, None)


def _fused_rows(op, input, shape, weight, bias, eps, rms):
    cols = math.prod(shape)
    rows = math.prod(input.shape[:input.ndim - len(shape)])
    x = input.reshape((rows, cols))
    w = weight.reshape((cols,)) if weight is not None else None
    b = bias.reshape((cols,)) if bias is not None else None
    return LayerNorm.apply(x, w, b, float(eps), rms).reshape(input.shape)


@layer_norm.fused("layer_norm")
def _(input, normalized_shape, weight=None, bias=None, eps=1e-5):
    shape = _normalized_shape("layer_norm", input, normalized_shape, weight, bias)
    if math.prod(shape) > FUSED_MAX_COLS or input.numel() == 0:
        return layer_norm.composed(input, normalized_shape, weight, bias, eps)
    return _fused_rows("layer_norm", input, shape, weight, bias, eps, False)


@rms_norm.fused("layer_norm")
def _(input, normalized_shape, weight=None, eps=None):
    shape = _normalized_shape("rms_norm", input, normalized_shape, weight)
    if math.prod(shape) > FUSED_MAX_COLS or input.numel() == 0:
        return rms_norm.composed(input, normalized_shape, weight, eps)
    return _fused_rows("rms_norm", input, shape, weight, None, _rms_eps(input, eps), True)


# ---------------------------------------------------------------------------------- group_norm


def _check_group_norm(input, num_groups, weight, bias):
    op = "group_norm"
    if input.ndim < 2:
        raise ValueError(f"{op}: expected an input of at least 2 dims [N, C, *], got shape "
                         f"{tuple(input.shape)}")
    channels = input.shape[1]
    if num_groups <= 0 or channels % num_groups:
        raise ValueError(f"{op}: num_groups={num_groups} must be positive and divide the "
                         f"{channels} channels of input {tuple(input.shape)}")
    for name, t in (("weight", weight), ("bias", bias)):
        if t is not None and tuple(t.shape) != (channels,):
            raise ValueError(f"{op}: {name} of shape {tuple(t.shape)} does not match the "
                             f"{channels} channels of input {tuple(input.shape)}")
    _check_float(op, input, weight, bias)


def _channel_affine(y, weight, bias, ndim, acc):
    shape = (1, -1) + (1,) * (ndim - 2)
    if weight is not None:
        y = y * _up(weight, acc).reshape(shape)
    if bias is not None:
        y = y + _up(bias, acc).reshape(shape)
    return y


@composite
def group_norm(input, num_groups, weight=None, bias=None, eps=1e-5):
    """Normalise each group of C / num_groups channels of each sample (over the channels and
    all spatial positions), then the per-channel affine. input: [N, C, *]; weight, bias: [C].
    F.group_norm(x, 8, w, b)"""
    _check_group_norm(input, num_groups, weight, bias)
    acc = _compute_dtype(input)
    n = input.shape[0]
    x = _up(input, acc).reshape((n, num_groups, -1)) if input.numel() else _up(input, acc)
    if input.numel():
        xc = x - x.mean(2, keepdim=True)
        x = (xc * rsqrt((xc * xc).mean(2, keepdim=True) + eps)).reshape(input.shape)
    return _up(_channel_affine(x, weight, bias, input.ndim, acc), input.dtype)


@group_norm.fused("layer_norm")
def _(input, num_groups, weight=None, bias=None, eps=1e-5):
    _check_group_norm(input, num_groups, weight, bias)
    n = input.shape[0]
    cols = input.numel() // max(n * num_groups, 1)
    if cols > FUSED_MAX_COLS or input.numel() == 0:
        return group_norm.composed(input, num_groups, weight, bias, eps)
    y = LayerNorm.apply(input.reshape((n * num_groups, cols)), None, None, float(eps), False)
    y = y.reshape(input.shape)
    if weight is None and bias is None:
        return y
    acc = _compute_dtype(input)
    return _up(_channel_affine(_up(y, acc), weight, bias, input.ndim, acc), input.dtype)


# ---------------------------------------------------------------------------------- normalize


@composite
def normalize(input, p=2.0, dim=1, eps=1e-12):
    """x / max(||x||_p, eps) along dim. F.normalize(x, dim=-1)"""
    _check_float("normalize", input)
    ndim = max(input.ndim, 1)
    if not -ndim <= dim < ndim:
        raise IndexError(f"normalize: dim {dim} is out of range for shape {tuple(input.shape)}")
    acc = _compute_dtype(input)
    x = _up(input, acc)
    p = float(p)
    # NOTE: max(||x||, eps) is formed as max(sum |x|^p, eps^p)^(1/p) where that is the same
    # number, so that a zero vector gets a zero gradient (not 0 * inf) as torch's does.
    if p == 2.0:
        denom = maximum((x * x).sum(dim, keepdim=True), eps * eps).sqrt()
    elif p == 1.0:
        denom = maximum(x.abs().sum(dim, keepdim=True), eps)
    elif p == math.inf:
        denom = maximum(x.abs().amax(dim, keepdim=True), eps)
    elif p == -math.inf:
        denom = maximum(x.abs().amin(dim, keepdim=True), eps)
    elif p > 0:
        denom = maximum((x.abs() ** p).sum(dim, keepdim=True), eps ** p) ** (1.0 / p)
    else:
        raise ValueError(f"normalize: p={p} is not supported (p > 0 or +-inf)")
    return _up(x / denom, input.dtype)


# ---------------------------------------------------------------------------------- batch_norm


def _check_batch_norm(input, running_mean, running_var, weight, bias, training, activation,
                      momentum=0.1, num_batches_tracked=None):
    op = "batch_norm"
    if momentum is None and training and running_mean is not None and \
            num_batches_tracked is None:
        raise ValueError(f"{op}: momentum=None (the cumulative average) needs "
                         f"num_batches_tracked; nn.BatchNorm2d(momentum=None) keeps it")
    if input.ndim < 2:
        raise ValueError(f"{op}: expected an input of at least 2 dims [N, C, *], got shape "
                         f"{tuple(input.shape)}")
    channels = input.shape[1]
    for name, t in (("running_mean", running_mean), ("running_var", running_var),
                    ("weight", weight), ("bias", bias)):
        if t is not None and tuple(t.shape) != (channels,):
            raise ValueError(f"{op}: {name} of shape {tuple(t.shape)} does not match the "
                             f"{channels} channels of input {tuple(input.shape)}")
    _check_float(op, input, weight, bias, running_mean, running_var)
    if not training and (running_mean is None or running_var is None):
        raise ValueError(f"{op}: running_mean and running_var are needed when training=False "
                         f"(input {tuple(input.shape)})")
    if (running_mean is None) != (running_var is None):
        raise ValueError(f"{op}: give both running_mean and running_var, or neither")
    if training and input.numel() // max(channels, 1) <= 1:
        raise ValueError(f"{op}: expected more than 1 value per channel when training, got "
                         f"input of shape {tuple(input.shape)}")
    if activation not in _ACTIVATIONS:
        raise ValueError(f"{op}: activation must be one of {_ACTIVATIONS}, got {activation!r}")


def _activate(y, activation):
    if activation == "relu":
        return relu(y)
    if activation == "gelu":
        return gelu(y)
    return y


@composite
def _batch_norm(input, running_mean, running_var, weight, bias, training, momentum, eps,
                activation, num_batches_tracked):
    """batch_norm (below), then `activation`; num_batches_tracked (an int64 [] or [1] tensor,
    or None) is incremented when the running statistics update, and momentum=None then takes
    the cumulative average 1 / num_batches_tracked, as nn.BatchNorm does."""
    _check_batch_norm(input, running_mean, running_var, weight, bias, training, activation,
                      momentum, num_batches_tracked)
    acc = _compute_dtype(input)
    x = _up(input, acc)
    dims = (0,) + tuple(range(2, input.ndim))
    shape = (1, -1) + (1,) * (input.ndim - 2)
    if training:
        mean = x.mean(dims, keepdim=True)
        xc = x - mean
        var = (xc * xc).mean(dims, keepdim=True)
        if running_mean is not None:
            count = input.numel() // input.shape[1]
            with no_grad():
                if num_batches_tracked is not None:
                    num_batches_tracked.add_(1)
                if momentum is None:
                    factor = 1.0 / num_batches_tracked.to(acc).reshape(())
                else:
                    factor = float(momentum)
                unbiased = var.detach().reshape((-1,)) * (count / (count - 1))
                for run, value in ((running_mean, mean.detach().reshape((-1,))),
                                   (running_var, unbiased)):
                    run.copy_(_up(run, acc) * (1.0 - factor) + value * factor)
    else:
        xc = x - _up(running_mean, acc).reshape(shape)
        var = _up(running_var, acc).reshape(shape)
    y = _channel_affine(xc * rsqrt(var + eps), weight, bias, input.ndim, acc)
    return _up(_activate(y, activation), input.dtype)


class BatchNorm(Function):
    """Fused batch_norm (+ activation): statistics, running-statistics update and the
    normalisation in three launches; backward in three (dy sums, their finish, dx)."""
    once_differentiable = True

    @staticmethod
    def forward(ctx, x, weight, bias, running_mean, running_var, num_batches_tracked, training,
                momentum, eps, activation):
        y, mean, rstd = _b().batch_norm(x, weight, bias, running_mean, running_var,
                                        num_batches_tracked, training, momentum, eps,
                                        activation)
        ctx.flags = training, activation
        ctx.save_for_backward(x, weight, bias, mean, rstd)
        return y

    @staticmethod
    def backward(ctx, dy):
        x, weight, bias, mean, rstd = ctx.saved
        training, activation = ctx.flags
        needs = ctx.needs_input_grad
        raw = (lambda t: t._data if t is not None else None)
        dx, dw, db = _b().batch_norm_backward(
            dy._data, x._data, raw(weight), raw(bias), mean._data, rstd._data, training,
            activation, bool(needs[0]), bool(needs[1]), bool(needs[2]))
        wrap = (lambda a: Tensor._wrap(a) if a is not None else None)
        return (wrap(dx), wrap(dw), wrap(db)) + (None,) * 7


@_batch_norm.fused("batch_norm")
def _(input, running_mean, running_var, weight, bias, training, momentum, eps, activation,
      num_batches_tracked):
    _check_batch_norm(input, running_mean, running_var, weight, bias, training, activation,
                      momentum, num_batches_tracked)
    if input.numel() == 0:
        return _batch_norm.composed(input, running_mean, running_var, weight, bias, training,
                                    momentum, eps, activation, num_batches_tracked)
    y = BatchNorm.apply(input, weight, bias, running_mean, running_var, num_batches_tracked,
                        bool(training), None if momentum is None else float(momentum),
                        float(eps), activation)
    if training and running_mean is not None:  # changed in place by the kernel
        for t in (running_mean, running_var, num_batches_tracked):
            if t is not None:
                t._bump_version()
    return y


def batch_norm(input, running_mean, running_var, weight=None, bias=None, training=False,
               momentum=0.1, eps=1e-5):
    """Normalise each channel over the batch and spatial dims, then the per-channel affine.
    training: batch statistics (biased variance), and the running statistics, when given, are
    updated in place: running = (1 - momentum) * running + momentum * batch (the unbiased
    variance); otherwise the running statistics normalise. input: [N, C, *]; the rest: [C].
    F.batch_norm(x, rm, rv, w, b, training=True)"""
    return _batch_norm(input, running_mean, running_var, weight, bias, training, momentum, eps,
                       None, None)


def batch_norm_act(input, running_mean, running_var, weight=None, bias=None, training=False,
                   momentum=0.1, eps=1e-5, activation="relu", num_batches_tracked=None):
    """batch_norm then relu or gelu (activation="relu" | "gelu" | None), fused into the same
    kernels each way on the triton backend. F.batch_norm_act(x, rm, rv, w, b, True)"""
    return _batch_norm(input, running_mean, running_var, weight, bias, training, momentum, eps,
                       activation, num_batches_tracked)
