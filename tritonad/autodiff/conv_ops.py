"""Differentiable convolution, pooling and dropout: conv2d (with the fused relu and the fused
conv + relu + max-pool node of the MNIST cnn), unfold / fold, max and average pooling, dropout.
Their backwards are dedicated kernels (once-differentiable), except unfold and fold, each the
other's adjoint."""
from __future__ import annotations

from .. import generator
from ..backend import conv_output_hw
from ..tensor import Tensor
from .autocast import low, state as _autocast
from .elementwise import where
from .function import Function
from .grad_mode import is_grad_enabled
from .nn_ops import _b, _same_float, pair
from .shape_ops import cat, unsqueeze

__all__ = ["conv2d", "max_pool2d", "avg_pool2d", "dropout", "unfold", "fold"]


# ---------------------------------------------------------------------------------- convolution


class Conv2d(Function):
    """Cross-correlation (NCHW), then relu in the same kernel if activation="relu"; backward by
    dedicated kernels (input, weight and bias grads), given the saved output as relu's gate
    (y > 0 exactly where the convolution is > 0)."""
    primitive = "conv2d"
    once_differentiable = True

    @staticmethod
    def forward(ctx, x, w, b, stride, padding, dilation, groups, activation=None):
        ctx.args = stride, padding, dilation, groups
        if activation is None:
            ctx.save_for_backward(x, w)
            return _b().conv2d(x, w, b, stride, padding, dilation, groups)
        y = _b().conv2d(x, w, b, stride, padding, dilation, groups, activation)
        ctx.save_for_backward(x, w, y)
        return y

    @staticmethod
    def backward(ctx, dy):
        x, w, *gate = ctx.saved
        return _conv_grads(ctx, dy._data, x._data, w._data, ctx.args,
                           gate[0]._data if gate else None)


def _conv_grads(ctx, dy, x, w, conv, gate=None):
    """The gradients a convolution's backward returns, from raw dy, x, w (and relu's gate).

    The weight and bias gradients go straight into the engine's buffers where it offers them
    (no copy after). Inside a side region (Backend.beside), when the input gradient continues
    the chain, they run beside it: dy is gated here, the weight gradients are queued on the
    side (the fork), then the input gradient in order. (A first layer, with no input gradient,
    keeps its weight gradient in order: nothing in the pass waits behind it, and the side
    stream may still be busy with the layers after it.)"""
    b, needs = _b(), ctx.needs_input_grad
    dw_out, db_out = _weight_grad_buffers(ctx, w)
    side = None
    if needs[0] and dw_out is not None and (db_out is not None or not needs[2]):
        side = b.beside(dy, x)
        if side is not None and gate is not None:
            dy = b.relu_backward(dy, gate)
            gate, side = None, b.beside(dy, x)
    if side is None:
        if gate is None and dw_out is None and db_out is None:  # (by position: the lean path)
            dx, dw, db = b.conv2d_backward(dy, x, w, *conv, needs[0], needs[1], needs[2])
        else:
            dx, dw, db = b.conv2d_backward(dy, x, w, *conv, needs[0], needs[1], needs[2], gate,
                                           dw_out, db_out)
    else:
        with side:
            _, dw, db = b.conv2d_backward(dy, x, w, *conv, False, needs[1], needs[2], None,
                                          dw_out, db_out)
        dx = b.conv2d_backward(dy, x, w, *conv, True, False, False)[0]
    wrap = lambda r: Tensor._wrap(r) if r is not None else None  # noqa: E731
    return (wrap(dx), wrap(dw), wrap(db)) + (None,) * (len(needs) - 3)


def _weight_grad_buffers(ctx, w):
    """(dw_out, db_out): the engine's buffers for the weight's and bias's gradients, where it
    offers them in w's dtype (else None: the engine converts)."""
    needs = ctx.needs_input_grad
    dw_out = ctx.gradient_buffer(1) if needs[1] else None
    db_out = ctx.gradient_buffer(2) if needs[2] else None
    if (dw_out is not None and dw_out.dtype != w.dtype) or \
            (db_out is not None and db_out.dtype != w.dtype):
        return None, None
    return dw_out, db_out


def _conv_geometry(op, shape, kernel, stride, padding, dilation):
    """The output plane (Ho, Wo) of a window op on an input of `shape` [N, C, H, W]."""
    if len(shape) != 4:
        raise ValueError(f"{op}: expected input [N, C, H, W], got shape {tuple(shape)}")
    for name, v, low in (("stride", stride, 1), ("padding", padding, 0), ("dilation", dilation, 1)):
        if min(v) < low:
            raise ValueError(f"{op}: {name} must be >= {low}, got {v}")
    out = []
    for size, k, s, p, d in zip(shape[2:], kernel, stride, padding, dilation):
        span = size + 2 * p - d * (k - 1) - 1
        if span < 0:
            raise ValueError(f"{op}: kernel {tuple(kernel)} (dilation {tuple(dilation)}) is larger "
                             f"than the padded input {tuple(shape[2:])} + 2 * {tuple(padding)}")
        out.append(span // s + 1)
    return tuple(out)


def conv2d(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1, activation=None):
    """2-d convolution: x [N, C_in, H, W] (or unbatched [C_in, H, W]), weight [C_out, C_in /
    groups, kh, kw], bias [C_out]; padding: ints, or 'valid' / 'same' as torch; activation="relu"
    applies relu in the same kernel (nn.Sequential fuses Conv2d + ReLU so)."""
    if x.ndim == 3:
        return conv2d(unsqueeze(x, 0), weight, bias, stride, padding, dilation, groups,
                      activation).squeeze(0)
    if _autocast.dtype:
        x, weight, bias = low(x, weight, bias)
    if isinstance(padding, str):
        x, padding = string_padding("conv2d", x, weight.shape[2:], stride, padding, dilation)
    stride, padding, dilation, _ = _conv_args(x, weight, bias, stride, padding, dilation, groups,
                                              activation)
    if activation is None:
        return Conv2d.apply(x, weight, bias, stride, padding, dilation, groups)
    return Conv2d.apply(x, weight, bias, stride, padding, dilation, groups, activation)


def string_padding(op, x, kernel, stride, padding, dilation):
    """(x, padding) for padding 'valid' (none) or 'same' (the output keeps x's plane; refused
    with a stride > 1), as torch: each dim's total padding dilation * (k - 1) splits evenly,
    an odd one leaving its extra row or column at the end, where x gets a zero row or column
    (by cat: our copy kernels) and the convolution pads the rest on both sides."""
    check_string_padding(op, padding, stride)
    if padding == "valid":
        return x, 0

    totals = [d * (k - 1) for d, k in zip(pair(dilation, "dilation"), kernel)]
    for axis, total in zip((-2, -1), totals):
        if total % 2:
            shape = list(x.shape)
            shape[axis] = 1
            x = cat([x, x.new_zeros(shape)], axis)
    return x, (totals[0] // 2, totals[1] // 2)


def check_string_padding(op, padding, stride):
    """padding 'valid', or 'same' with stride 1, or a clear error."""
    if padding not in ("valid", "same"):
        raise ValueError(f"{op}: padding must be ints, 'valid' or 'same', got {padding!r}")
    if padding == "same" and max(pair(stride, "stride")) > 1:
        raise ValueError(f"{op}: padding='same' is not supported for strided convolutions "
                         f"(stride {stride})")


def _conv_args(x, weight, bias, stride, padding, dilation, groups, activation):
    """conv2d's checks: (stride, padding, dilation) as pairs and the output plane (Ho, Wo)."""
    stride, padding, dilation = pair(stride, "stride"), pair(padding, "padding"), \
        pair(dilation, "dilation")
    if weight.ndim != 4:
        raise ValueError(f"conv2d: weight must be [C_out, C_in, kh, kw], got shape {weight.shape}")
    if groups < 1 or weight.shape[0] % groups or x.ndim != 4 or \
            x.shape[1] != weight.shape[1] * groups:
        raise ValueError(f"conv2d: input of shape {x.shape} does not match weight of shape "
                         f"{weight.shape} with groups={groups} (input channels must equal "
                         f"weight.shape[1] * groups)")
    if bias is not None and bias.shape != (weight.shape[0],):
        raise ValueError(f"conv2d: bias of shape {bias.shape} does not match {weight.shape[0]} "
                         "output channels")
    if activation not in (None, "relu"):
        raise ValueError(f"conv2d: unknown activation {activation!r} (None or 'relu')")
    _same_float("conv2d", x, weight, bias)
    out_hw = _conv_geometry("conv2d", x.shape, weight.shape[2:], stride, padding, dilation)
    return stride, padding, dilation, out_hw


class Conv2dReluMaxPool2d(Function):
    """max_pool2d(relu(conv2d(x, w, b))) as one node, by the backend's conv2d_relu_max_pool2d
    (which may compute it without writing the convolution's output). Backward: relu' is applied
    as the pool's backward reads its gradient, with the pool's output as the gate (relu' at a
    window's argmax is the window's maximum > 0), so the convolution's backward receives the
    gradient gated and makes no pass of its own; where x needs no gradient (a first layer) the
    backend may compute the weight and bias gradients from the pool's gradient directly. It
    keeps the pool's output and indices rather than the convolution's output."""
    once_differentiable = True

    @staticmethod
    def forward(ctx, x, w, b, stride, padding, dilation, groups, kernel, pool_stride,
                pool_padding, pool_dilation, ceil_mode):
        ctx.conv = stride, padding, dilation, groups
        ctx.pool = kernel, pool_stride, pool_padding, pool_dilation, ceil_mode
        record = bool(ctx.needs_input_grad)  # (no indices when nothing is recorded)
        p, indices = _b().conv2d_relu_max_pool2d(x, w, b, *ctx.conv, *ctx.pool, record)
        ctx.save_for_backward(x, w, p, indices)
        return p

    @staticmethod
    def backward(ctx, dp):
        x, w, p, indices = ctx.saved
        be, needs = _b(), ctx.needs_input_grad
        if not needs[0]:
            dw_out, db_out = _weight_grad_buffers(ctx, w._data)
            _, dw, db = be.conv2d_relu_max_pool2d_backward(
                dp._data, indices._data, p._data, x._data, w._data, *ctx.conv, *ctx.pool,
                False, needs[1], needs[2], dw_out, db_out)
            wrap = lambda r: Tensor._wrap(r) if r is not None else None  # noqa: E731
            return (None, wrap(dw), wrap(db)) + (None,) * (len(needs) - 3)
        shape = (x.shape[0], w.shape[0]) + conv_output_hw(x.shape, w.shape, *ctx.conv[:3])
        dy = be.max_pool2d_backward(dp._data, indices._data, shape, *ctx.pool, p._data)
        return _conv_grads(ctx, dy, x._data, w._data, ctx.conv)


def conv2d_relu_max_pool2d(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1,
                           kernel_size=2, pool_stride=None, pool_padding=0, pool_dilation=1,
                           ceil_mode=False):
    """max_pool2d(relu(conv2d(x, weight, bias, ...)), kernel_size, pool_stride, ...), the same
    values and gradients, with relu' folded into the pool's backward where a gradient is
    recorded (Conv2dReluMaxPool2d). nn.Sequential runs Conv2d, ReLU, MaxPool2d so."""
    if x.ndim == 3:
        return conv2d_relu_max_pool2d(unsqueeze(x, 0), weight, bias, stride, padding, dilation,
                                      groups, kernel_size, pool_stride, pool_padding,
                                      pool_dilation, ceil_mode).squeeze(0)
    if _autocast.dtype:
        x, weight, bias = low(x, weight, bias)
    if isinstance(padding, str):
        x, padding = string_padding("conv2d", x, weight.shape[2:], stride, padding, dilation)
    stride, padding, dilation, out_hw = _conv_args(x, weight, bias, stride, padding, dilation,
                                                   groups, "relu")
    pool = _pool_args("max_pool2d", (x.shape[0], weight.shape[0]) + out_hw, kernel_size,
                      pool_stride, pool_padding, pool_dilation)
    return Conv2dReluMaxPool2d.apply(x, weight, bias, stride, padding, dilation, groups, *pool,
                                     ceil_mode)


class Unfold(Function):
    """im2col: [N, C, H, W] -> [N, C*kh*kw, L]; its adjoint is fold (col2im)."""
    @staticmethod
    def forward(ctx, x, kernel, stride, padding, dilation):
        ctx.args = kernel, stride, padding, dilation
        ctx.size = tuple(x.shape[2:])
        return _b().im2col(x, kernel, stride, padding, dilation)

    @staticmethod
    def backward(ctx, dy):
        return Fold.apply(dy, ctx.size, *ctx.args), None, None, None, None


class Fold(Function):
    """col2im: overlapping windows summed; its adjoint is unfold."""
    @staticmethod
    def forward(ctx, cols, size, kernel, stride, padding, dilation):
        ctx.args = kernel, stride, padding, dilation
        return _b().col2im(cols, size, kernel, stride, padding, dilation)

    @staticmethod
    def backward(ctx, dy):
        return Unfold.apply(dy, *ctx.args), None, None, None, None, None


def unfold(x, kernel_size, dilation=1, padding=0, stride=1):
    """Sliding local blocks as columns (torch.nn.functional.unfold)."""
    args = pair(kernel_size), pair(stride), pair(padding), pair(dilation)
    _conv_geometry("unfold", x.shape, args[0], args[1], args[2], args[3])
    return Unfold.apply(x, *args)


def fold(cols, output_size, kernel_size, dilation=1, padding=0, stride=1):
    """Sum sliding local blocks back into an image (torch.nn.functional.fold)."""
    size = pair(output_size)
    kernel, stride, padding, dilation = pair(kernel_size), pair(stride), pair(padding), \
        pair(dilation)
    hw = [(s + 2 * p - d * (k - 1) - 1) // st + 1
          for s, k, st, p, d in zip(size, kernel, stride, padding, dilation)]
    if cols.ndim != 3 or cols.shape[1] % (kernel[0] * kernel[1]) or cols.shape[2] != hw[0] * hw[1]:
        raise ValueError(f"fold: columns of shape {cols.shape} do not match output_size {size} "
                         f"with kernel {kernel}, stride {stride}, padding {padding}")
    return Fold.apply(cols, size, kernel, stride, padding, dilation)


# ---------------------------------------------------------------------------------- pooling


_POOL_ARGS = {}  # (op, shape, arguments) -> normalised arguments: checked once per signature


def _pool_args(op, shape, kernel_size, stride, padding, dilation):
    key = (op, shape, kernel_size, stride, padding, dilation)
    try:
        known = _POOL_ARGS.get(key)
    except TypeError:  # unhashable arguments (lists): check every time
        known, key = None, None
    if known is not None:
        return known
    kernel = pair(kernel_size, "kernel_size")
    stride = kernel if stride is None or stride == () else pair(stride, "stride")
    padding, dilation = pair(padding, "padding"), pair(dilation, "dilation")
    if min(kernel) < 1:
        raise ValueError(f"{op}: kernel_size must be positive, got {kernel}")
    for k, p, d in zip(kernel, padding, dilation):
        if p > (d * (k - 1) + 1) // 2:
            raise ValueError(f"{op}: padding {padding} must be at most half the kernel size "
                             f"{kernel}")
    _conv_geometry(op, shape, kernel, stride, padding, dilation)
    result = kernel, stride, padding, dilation
    if key is not None:
        if len(_POOL_ARGS) > 4096:
            _POOL_ARGS.clear()
        _POOL_ARGS[key] = result
    return result


class MaxPool2d(Function):
    """Window maxima; the argmax of each window is kept, and the backward gathers into each
    input position the dy of the windows whose argmax it is (deterministic, no atomics)."""
    once_differentiable = True

    @staticmethod
    def forward(ctx, x, kernel, stride, padding, dilation, ceil_mode, with_indices=True):
        y, indices = _b().max_pool2d(x, kernel, stride, padding, dilation, ceil_mode,
                                     with_indices)
        if indices is None:  # (no backward to come)
            return y, None
        ctx.shape = tuple(x.shape)
        ctx.args = kernel, stride, padding, dilation, ceil_mode
        ctx.save_for_backward(indices)
        ctx.mark_non_differentiable(indices)
        return y, indices

    @staticmethod
    def backward(ctx, dy, _):
        (indices,) = ctx.saved
        dx = _b().max_pool2d_backward(dy._data, indices._data, ctx.shape, *ctx.args)
        return Tensor._wrap(dx), None, None, None, None, None, None


def max_pool2d(x, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False,
               return_indices=False):
    """Max over windows; gradient to the first maximum of each window (as torch). x: [N, C, H, W]
    or unbatched [C, H, W]."""
    if x.ndim == 3:
        out = max_pool2d(unsqueeze(x, 0), kernel_size, stride, padding, dilation, ceil_mode,
                         return_indices)
        return (out[0].squeeze(0), out[1].squeeze(0)) if return_indices else out.squeeze(0)
    args = _pool_args("max_pool2d", x.shape, kernel_size, stride, padding, dilation)
    _same_float("max_pool2d", x)
    # the indices are only for a backward, or for a caller who asks: evaluation skips them
    with_indices = return_indices or (is_grad_enabled() and x.requires_grad)
    y, indices = MaxPool2d.apply(x, *args, ceil_mode, with_indices)
    return (y, indices) if return_indices else y


class AvgPool2d(Function):
    """Window means with torch's padding rules; the backward spreads dy / divisor over windows."""
    primitive = "avg_pool2d"
    once_differentiable = True

    @staticmethod
    def forward(ctx, x, kernel, stride, padding, ceil_mode, count_include_pad, divisor_override):
        ctx.shape = tuple(x.shape)
        ctx.args = kernel, stride, padding, ceil_mode, count_include_pad, divisor_override
        return _b().avg_pool2d(x, *ctx.args)

    @staticmethod
    def backward(ctx, dy):
        dx = _b().avg_pool2d_backward(dy._data, ctx.shape, *ctx.args)
        return Tensor._wrap(dx), None, None, None, None, None, None


def avg_pool2d(x, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True,
               divisor_override=None):
    if x.ndim == 3:  # unbatched [C, H, W]
        return avg_pool2d(unsqueeze(x, 0), kernel_size, stride, padding, ceil_mode,
                          count_include_pad, divisor_override).squeeze(0)
    kernel, stride, padding, _ = _pool_args("avg_pool2d", x.shape, kernel_size, stride, padding,
                                            1)
    _same_float("avg_pool2d", x)
    if divisor_override is not None and divisor_override <= 0:
        raise ValueError(f"avg_pool2d: divisor_override must be positive, got {divisor_override}")
    return AvgPool2d.apply(x, kernel, stride, padding, ceil_mode, count_include_pad,
                           divisor_override)


# ---------------------------------------------------------------------------------- dropout


class Dropout(Function):
    """y = x * mask / (1 - p) with a counter-based random mask: dx = dy * mask / (1 - p)."""
    @staticmethod
    def forward(ctx, x, p):
        seed, offset = generator.take(x.numel())
        y, mask = _b().dropout(x, p, seed, offset)
        ctx.p = p
        ctx.save_for_backward(mask)
        return y

    @staticmethod
    def backward(ctx, dy):
        (mask,) = ctx.saved
        return where(mask, dy * (1.0 / (1.0 - ctx.p)), 0.0), None


def dropout(x, p=0.5, training=True):
    """Zero each element with probability p during training and scale the rest by 1 / (1 - p)."""
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout: p must be in [0, 1], got {p}")
    if not training or p == 0.0:
        return x
    if p == 1.0:
        return x * 0.0
    _same_float("dropout", x)
    return Dropout.apply(x, float(p))
