"""Channel dropout (Dropout1d, Dropout2d and their functional forms) and Unflatten.

Channel dropout zeroes whole channels: one Philox draw per (sample, channel), the existing
dropout kernel run on a [N, C, 1, ...] tensor of ones (a mask scaled by 1 / (1 - p)), then
one broadcast multiply; the gradient is that mask times dy, from the multiply's own rule.
Bytes moved: the mask is N * C elements, the multiply reads x and writes y once.
"""
from __future__ import annotations

from ..autodiff.conv_ops import dropout
from ..tensor import ones
from .module import Module


def _channel_dropout(op, x, p, training, channel_dims):
    """x * mask / (1 - p) with one mask value per leading (sample, channel) pair: the first
    channel_dims dims of x keep their sizes in the mask, the rest are 1."""
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"{op}: p must be in [0, 1], got {p}")
    if not training or p == 0.0:
        return x
    if not x.dtype.is_floating_point:
        raise TypeError(f"{op}: expected a floating point input, got {x.dtype.name}")
    shape = tuple(x.shape[:channel_dims]) + (1,) * (x.ndim - channel_dims)
    mask = dropout(ones(shape, dtype=x.dtype, device=x.device), p, True)
    return x * mask


def dropout1d(input, p=0.5, training=True, inplace=False):
    """Zero whole channels of input [N, C, L] (or [C, L]) with probability p in training, the
    rest scaled by 1 / (1 - p). inplace is accepted and the result returned as a new tensor."""
    if input.ndim not in (2, 3):
        raise ValueError(f"dropout1d: expected input [N, C, L] or [C, L], got {input.shape}")
    return _channel_dropout("dropout1d", input, p, training, input.ndim - 1)


def dropout2d(input, p=0.5, training=True, inplace=False):
    """Zero whole channels of input [N, C, H, W] (or [C, H, W]) with probability p in
    training, the rest scaled by 1 / (1 - p). NOTE: a 3-d input is read as [N, C, L] (channel
    dropout of 1-d maps), as PyTorch does today."""
    if input.ndim not in (3, 4):
        raise ValueError(f"dropout2d: expected input [N, C, H, W] or [C, H, W], got "
                         f"{input.shape}")
    return _channel_dropout("dropout2d", input, p, training, 2)


class _ChannelDropout(Module):
    def __init__(self, p=0.5, inplace=False):
        super().__init__()
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"{type(self).__name__}: p must be in [0, 1], got {p}")
        self.p, self.inplace = p, inplace

    def extra_repr(self):
        return f"p={self.p}, inplace={self.inplace}"


class Dropout1d(_ChannelDropout):
    """Zeroes whole channels of [N, C, L] (or [C, L]) with probability p in training mode."""

    def forward(self, x):
        return dropout1d(x, self.p, self.training)


class Dropout2d(_ChannelDropout):
    """Zeroes whole channels of [N, C, H, W] (or [C, H, W]) with probability p in training
    mode."""

    def forward(self, x):
        return dropout2d(x, self.p, self.training)


class Unflatten(Module):
    """Splits dimension dim into unflattened_size: [N, 12] -> [N, 3, 4] for Unflatten(1, (3, 4))."""

    def __init__(self, dim, unflattened_size):
        super().__init__()
        self.dim, self.unflattened_size = dim, tuple(unflattened_size)

    def forward(self, x):
        return x.unflatten(self.dim, self.unflattened_size)

    def extra_repr(self):
        return f"dim={self.dim}, unflattened_size={self.unflattened_size}"
