"""Layers over the ops of autodiff/tensor_ops.py: Conv1d, ConvTranspose2d, AdaptiveAvgPool2d,
Upsample."""
from __future__ import annotations

import math

from .. import dtypes
from ..autodiff import tensor_ops
from ..tensor import empty
from . import init
from .module import Module
from .parameter import Parameter


class Conv1d(Module):
    """1-d convolution on [N, C, L] input; weight [out, in / groups, k]. Initialised as torch.
    `nn.Conv1d(16, 32, 3, padding=1)`."""

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1,
                 groups=1, bias=True, device=None, dtype=None):
        super().__init__()
        if in_channels % groups or out_channels % groups:
            raise ValueError(f"Conv1d: in_channels ({in_channels}) and out_channels "
                             f"({out_channels}) must be divisible by groups ({groups})")
        single = [v[0] if isinstance(v, (tuple, list)) and len(v) == 1 else v
                  for v in (kernel_size, stride, padding, dilation)]
        self.kernel_size, self.stride, self.padding, self.dilation = single
        for name, v, low in (("in_channels", in_channels, 1), ("out_channels", out_channels, 1),
                             ("kernel_size", self.kernel_size, 1), ("stride", self.stride, 1),
                             ("dilation", self.dilation, 1)):
            if not isinstance(v, int) or v < low:
                raise ValueError(f"Conv1d: {name} must be an int >= {low}, got {v!r}")
        if not isinstance(self.padding, str) and \
                (not isinstance(self.padding, int) or self.padding < 0):
            raise ValueError(f"Conv1d: padding must be an int >= 0, 'same' or 'valid', got "
                             f"{padding!r}")
        self.in_channels, self.out_channels, self.groups = in_channels, out_channels, groups
        dtype = dtype or dtypes.float32
        self.weight = Parameter(empty(out_channels, in_channels // groups, self.kernel_size,
                                      dtype=dtype, device=device))
        self.bias = Parameter(empty(out_channels, dtype=dtype, device=device)) if bias else None
        self.reset_parameters()

    def reset_parameters(self):
        init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            bound = 1 / math.sqrt(self.weight.shape[1] * self.kernel_size)
            init.uniform_(self.bias, -bound, bound)

    def forward(self, x):
        return tensor_ops.conv1d(x, self.weight, self.bias, self.stride, self.padding,
                                 self.dilation, self.groups)

    def extra_repr(self):
        return f"{self.in_channels}, {self.out_channels}, kernel_size=({self.kernel_size},), " \
               f"stride=({self.stride},)" + ("" if self.bias is not None else ", bias=False")


class AdaptiveAvgPool2d(Module):
    """Average pooling to a fixed output plane: `nn.AdaptiveAvgPool2d(1)` (global pooling)."""

    def __init__(self, output_size):
        super().__init__()
        self.output_size = output_size

    def forward(self, x):
        return tensor_ops.adaptive_avg_pool2d(x, self.output_size)

    def extra_repr(self):
        return f"output_size={self.output_size}"


class ConvTranspose2d(Module):
    """Transposed 2-d convolution on NCHW input; weight [in, out / groups, kh, kw], initialised
    as torch. `nn.ConvTranspose2d(64, 32, 2, stride=2)` (an upsampling step)."""

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0,
                 output_padding=0, groups=1, bias=True, dilation=1, device=None, dtype=None):
        super().__init__()
        if in_channels % groups or out_channels % groups:
            raise ValueError(f"ConvTranspose2d: in_channels ({in_channels}) and out_channels "
                             f"({out_channels}) must be divisible by groups ({groups})")
        pair = lambda v: (v, v) if isinstance(v, int) else tuple(v)  # noqa: E731
        self.in_channels, self.out_channels, self.groups = in_channels, out_channels, groups
        self.kernel_size, self.stride, self.padding = pair(kernel_size), pair(stride), \
            pair(padding)
        self.output_padding, self.dilation = pair(output_padding), pair(dilation)
        dtype = dtype or dtypes.float32
        self.weight = Parameter(empty(in_channels, out_channels // groups, *self.kernel_size,
                                      dtype=dtype, device=device))
        self.bias = Parameter(empty(out_channels, dtype=dtype, device=device)) if bias else None
        self.reset_parameters()

    def reset_parameters(self):
        init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            # torch's fan_in of a transposed weight: its dim 1 times the window
            fan_in = self.weight.shape[1] * self.kernel_size[0] * self.kernel_size[1]
            bound = 1 / math.sqrt(fan_in)
            init.uniform_(self.bias, -bound, bound)

    def forward(self, x):
        return tensor_ops.conv_transpose2d(x, self.weight, self.bias, self.stride, self.padding,
                                           self.output_padding, self.groups, self.dilation)

    def extra_repr(self):
        return f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, " \
               f"stride={self.stride}" + ("" if self.bias is not None else ", bias=False")


class Upsample(Module):
    """F.interpolate as a layer: `nn.Upsample(scale_factor=2, mode="bilinear")`."""

    def __init__(self, size=None, scale_factor=None, mode="nearest", align_corners=None,
                 recompute_scale_factor=None):
        super().__init__()
        self.size, self.scale_factor, self.mode = size, scale_factor, mode
        self.align_corners, self.recompute_scale_factor = align_corners, recompute_scale_factor

    def forward(self, x):
        return tensor_ops.interpolate(x, self.size, self.scale_factor, self.mode,
                                      self.align_corners, self.recompute_scale_factor)

    def extra_repr(self):
        what = f"size={self.size}" if self.size is not None else \
            f"scale_factor={self.scale_factor}"
        return f"{what}, mode={self.mode!r}"
