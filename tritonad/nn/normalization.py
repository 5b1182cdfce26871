"""Normalisation layers with PyTorch's arguments, parameters, buffers and state_dict keys:
LayerNorm, RMSNorm, GroupNorm, BatchNorm1d, BatchNorm2d. The maths is in autodiff/norm_ops.py.
"""
from __future__ import annotations

import numbers

from .. import dtypes
from ..autodiff import norm_ops
from ..tensor import ones, tensor, zeros
from . import init
from .module import Module
from .parameter import Parameter


def _shape(normalized_shape):
    if isinstance(normalized_shape, numbers.Integral):
        return (int(normalized_shape),)
    return tuple(int(n) for n in normalized_shape)


class LayerNorm(Module):
    """layer_norm over the trailing `normalized_shape` dims; weight = 1, bias = 0 to start.
    nn.LayerNorm(768)(x)  # x: [*, 768]"""

    def __init__(self, normalized_shape, eps=1e-5, elementwise_affine=True, bias=True,
                 device=None, dtype=None):
        super().__init__()
        self.normalized_shape = _shape(normalized_shape)
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        dtype = dtype or dtypes.float32
        shape = self.normalized_shape
        self.weight = Parameter(ones(*shape, dtype=dtype, device=device)) \
            if elementwise_affine else None
        self.bias = Parameter(zeros(*shape, dtype=dtype, device=device)) \
            if elementwise_affine and bias else None

    def forward(self, x):
        return norm_ops.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)

    def extra_repr(self):
        return f"{self.normalized_shape}, eps={self.eps}, " \
               f"elementwise_affine={self.elementwise_affine}"


class RMSNorm(Module):
    """rms_norm over the trailing `normalized_shape` dims (eps=None: the machine epsilon).
    nn.RMSNorm(768)(x)"""

    def __init__(self, normalized_shape, eps=None, elementwise_affine=True, device=None,
                 dtype=None):
        super().__init__()
        self.normalized_shape = _shape(normalized_shape)
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        self.weight = Parameter(ones(*self.normalized_shape, dtype=dtype or dtypes.float32,
                                     device=device)) if elementwise_affine else None

    def forward(self, x):
        return norm_ops.rms_norm(x, self.normalized_shape, self.weight, self.eps)

    def extra_repr(self):
        return f"{self.normalized_shape}, eps={self.eps}, " \
               f"elementwise_affine={self.elementwise_affine}"


class GroupNorm(Module):
    """group_norm of num_channels channels in num_groups groups; per-channel affine.
    nn.GroupNorm(8, 64)(x)  # x: [N, 64, *]"""

    def __init__(self, num_groups, num_channels, eps=1e-5, affine=True, device=None, dtype=None):
        super().__init__()
        if num_groups <= 0 or num_channels % num_groups:
            raise ValueError(f"GroupNorm: num_channels ({num_channels}) must be divisible by "
                             f"num_groups ({num_groups})")
        self.num_groups, self.num_channels = int(num_groups), int(num_channels)
        self.eps = eps
        self.affine = affine
        dtype = dtype or dtypes.float32
        self.weight = Parameter(ones(num_channels, dtype=dtype, device=device)) if affine else None
        self.bias = Parameter(zeros(num_channels, dtype=dtype, device=device)) if affine else None

    def forward(self, x):
        return norm_ops.group_norm(x, self.num_groups, self.weight, self.bias, self.eps)

    def extra_repr(self):
        return f"{self.num_groups}, {self.num_channels}, eps={self.eps}, affine={self.affine}"


class _BatchNorm(Module):
    """batch_norm with running statistics, as torch's _BatchNorm: in training (or without
    running statistics) the batch's statistics normalise and, when tracked, update running_mean
    and running_var in place (momentum=None: the cumulative average); in eval the running
    statistics normalise. forward(x, activation="relu" | "gelu") fuses the activation."""

    _dims = ()

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True,
                 track_running_stats=True, device=None, dtype=None):
        super().__init__()
        self.num_features = int(num_features)
        self.eps = eps
        self.momentum = momentum
        self.affine = affine
        self.track_running_stats = track_running_stats
        dtype = dtype or dtypes.float32
        n = self.num_features
        self.weight = Parameter(ones(n, dtype=dtype, device=device)) if affine else None
        self.bias = Parameter(zeros(n, dtype=dtype, device=device)) if affine else None
        if track_running_stats:
            self.register_buffer("running_mean", zeros(n, dtype=dtype, device=device))
            self.register_buffer("running_var", ones(n, dtype=dtype, device=device))
            self.register_buffer("num_batches_tracked",
                                 tensor(0, dtype=dtypes.int64, device=device))
        else:
            self.register_buffer("running_mean", None)
            self.register_buffer("running_var", None)
            self.register_buffer("num_batches_tracked", None)

    def reset_running_stats(self):
        if self.track_running_stats:
            self.running_mean.zero_()
            self.running_var.fill_(1)
            self.num_batches_tracked.zero_()

    def reset_parameters(self):
        self.reset_running_stats()
        if self.affine:
            init.ones_(self.weight)
            init.zeros_(self.bias)

    def forward(self, x, activation=None):
        if x.ndim not in self._dims:
            raise ValueError(f"{type(self).__name__}: expected a {' or '.join(map(str, self._dims))}"
                             f"-d input, got shape {tuple(x.shape)}")
        if x.shape[1] != self.num_features:
            raise ValueError(f"{type(self).__name__}: expected {self.num_features} channels "
                             f"(dim 1), got input of shape {tuple(x.shape)}")
        use_batch = self.training or self.running_mean is None
        track = self.training and self.track_running_stats
        return norm_ops._batch_norm(
            x, self.running_mean if track or not self.training else None,
            self.running_var if track or not self.training else None, self.weight, self.bias,
            use_batch, self.momentum, self.eps, activation,
            self.num_batches_tracked if track else None)

    def extra_repr(self):
        return f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, " \
               f"affine={self.affine}, track_running_stats={self.track_running_stats}"


class BatchNorm1d(_BatchNorm):
    """BatchNorm over [N, C] or [N, C, L] inputs. nn.BatchNorm1d(64)(x)"""
    _dims = (2, 3)


class BatchNorm2d(_BatchNorm):
    """BatchNorm over [N, C, H, W] inputs (NCHW or channels-last memory).
    nn.BatchNorm2d(64)(x)"""
    _dims = (4,)


def fused_activation(module, following):
    """"relu" or "gelu" when `module` is a BatchNorm that `following` (a ReLU or an exact GELU)
    comes right after in a Sequential, so that both run in the batch norm's kernels; else None."""
    if not isinstance(module, _BatchNorm) or following is None:
        return None
    from .activation import GELU, ReLU
    if type(following) is ReLU:
        return "relu"
    if type(following) is GELU and following.approximate == "none":
        return "gelu"
    return None
