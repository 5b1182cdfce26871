"""Layers: each validates its arguments, owns its Parameters and calls a functional op.

Layouts and initialisation follow torch, so models and checkpoints port over.
"""
from __future__ import annotations

import math

from .. import dtypes
from ..autodiff import conv_ops, nn_ops
from ..tensor import empty
from . import init
from .activation import ReLU, Sigmoid, Tanh  # noqa: F401  (made from the table)
from .module import Module
from .normalization import fused_activation  # normalisation: BatchNorm + activation
from .parameter import Parameter


def _positive(name, value):
    if value <= 0:
        raise ValueError(f"{name} must be positive, got {value}")
    return value


class Linear(Module):
    """y = x @ W.T + b.  x: [*, in_features] -> [*, out_features]; W: [out, in].

    Initialised as torch: W and b ~ U(-1/sqrt(in), 1/sqrt(in)).
    """

    def __init__(self, in_features, out_features, bias=True, device=None, dtype=None):
        super().__init__()
        self.in_features = _positive("in_features", int(in_features))
        self.out_features = _positive("out_features", int(out_features))
        dtype = dtype or dtypes.float32
        self.weight = Parameter(empty(out_features, in_features, dtype=dtype, device=device))
        self.bias = Parameter(empty(out_features, dtype=dtype, device=device)) if bias else None
        self.reset_parameters()

    def reset_parameters(self):
        # kaiming_uniform_(a=sqrt(5)) is U(-1/sqrt(fan_in), 1/sqrt(fan_in)), torch's default
        init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            bound = 1 / math.sqrt(self.in_features)
            init.uniform_(self.bias, -bound, bound)

    def forward(self, x, activation=None):
        return nn_ops.linear(x, self.weight, self.bias, activation)

    def extra_repr(self):
        return f"in_features={self.in_features}, out_features={self.out_features}, " \
               f"bias={self.bias is not None}"


class Conv2d(Module):
    """2-d convolution on NCHW input; weight [out, in / groups, kh, kw]. Initialised as torch."""

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1,
                 groups=1, bias=True, device=None, dtype=None):
        super().__init__()
        if in_channels % groups or out_channels % groups:
            raise ValueError(f"Conv2d: in_channels ({in_channels}) and out_channels "
                             f"({out_channels}) must be divisible by groups ({groups})")
        self.in_channels = _positive("in_channels", int(in_channels))
        self.out_channels = _positive("out_channels", int(out_channels))
        self.kernel_size = nn_ops.pair(kernel_size, "kernel_size")
        self.stride = nn_ops.pair(stride, "stride")
        self.dilation = nn_ops.pair(dilation, "dilation")
        self.groups = groups
        if isinstance(padding, str):  # 'valid' or 'same', resolved per input as torch
            conv_ops.check_string_padding("Conv2d", padding, self.stride)
            self.padding = padding
        else:
            self.padding = nn_ops.pair(padding, "padding")
        for name, v, low in (("kernel_size", self.kernel_size, 1), ("stride", self.stride, 1),
                             ("padding", (0, 0) if isinstance(padding, str) else self.padding, 0),
                             ("dilation", self.dilation, 1)):
            if min(v) < low:
                raise ValueError(f"Conv2d: {name} must be >= {low}, got {v}")
        dtype = dtype or dtypes.float32
        self.weight = Parameter(empty(out_channels, in_channels // groups, *self.kernel_size,
                                      dtype=dtype, device=device))
        self.bias = Parameter(empty(out_channels, dtype=dtype, device=device)) if bias else None
        self.reset_parameters()

    def reset_parameters(self):
        init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            fan_in = self.weight.shape[1] * self.kernel_size[0] * self.kernel_size[1]
            bound = 1 / math.sqrt(fan_in)
            init.uniform_(self.bias, -bound, bound)

    def forward(self, x, activation=None):
        return conv_ops.conv2d(x, self.weight, self.bias, self.stride, self.padding, self.dilation,
                             self.groups, activation)

    def extra_repr(self):
        s = f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, " \
            f"stride={self.stride}"
        if self.padding != (0, 0):
            s += f", padding={self.padding}"
        if self.dilation != (1, 1):
            s += f", dilation={self.dilation}"
        if self.groups != 1:
            s += f", groups={self.groups}"
        return s + ("" if self.bias is not None else ", bias=False")


class MaxPool2d(Module):
    def __init__(self, kernel_size, stride=None, padding=0, dilation=1, return_indices=False,
                 ceil_mode=False):
        super().__init__()
        self.kernel_size, self.stride, self.padding = kernel_size, stride or kernel_size, padding
        self.dilation, self.return_indices, self.ceil_mode = dilation, return_indices, ceil_mode

    def forward(self, x):
        return conv_ops.max_pool2d(x, self.kernel_size, self.stride, self.padding, self.dilation,
                                 self.ceil_mode, self.return_indices)

    def extra_repr(self):
        return f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}"


class AvgPool2d(Module):
    def __init__(self, kernel_size, stride=None, padding=0, ceil_mode=False,
                 count_include_pad=True, divisor_override=None):
        super().__init__()
        self.kernel_size, self.stride, self.padding = kernel_size, stride or kernel_size, padding
        self.ceil_mode, self.count_include_pad = ceil_mode, count_include_pad
        self.divisor_override = divisor_override

    def forward(self, x):
        return conv_ops.avg_pool2d(x, self.kernel_size, self.stride, self.padding, self.ceil_mode,
                                 self.count_include_pad, self.divisor_override)

    def extra_repr(self):
        return f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}"


class Softmax(Module):
    def __init__(self, dim=-1):
        super().__init__()
        self.dim = dim

    def forward(self, x):
        return nn_ops.softmax(x, self.dim)


class LogSoftmax(Softmax):
    def forward(self, x):
        return nn_ops.log_softmax(x, self.dim)


class Identity(Module):
    def forward(self, x):
        return x


class Flatten(Module):
    """[N, C, H, W] -> [N, C * H * W] (dims start_dim..end_dim merged)."""

    def __init__(self, start_dim=1, end_dim=-1):
        super().__init__()
        self.start_dim, self.end_dim = start_dim, end_dim

    def forward(self, x):
        return x.flatten(self.start_dim, self.end_dim)

    def extra_repr(self):
        return f"start_dim={self.start_dim}, end_dim={self.end_dim}"


class Dropout(Module):
    """Zeroes elements with probability p in training mode; identity in eval mode."""

    def __init__(self, p=0.5):
        super().__init__()
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"Dropout: p must be in [0, 1], got {p}")
        self.p = p

    def forward(self, x):
        return conv_ops.dropout(x, self.p, self.training)

    def extra_repr(self):
        return f"p={self.p}"


class Sequential(Module):
    """Modules applied in order. A Linear or Conv2d followed by a ReLU runs as one fused kernel
    (the product, bias and relu; relu' applied as the backward reads the gradient), and a
    Conv2d, ReLU, MaxPool2d as one node whose pool backward applies relu'
    (conv_ops.conv2d_relu_max_pool2d), with the same results."""

    def __init__(self, *modules):
        super().__init__()
        for i, m in enumerate(modules):
            if not isinstance(m, Module):
                raise TypeError(f"Sequential: item {i} is a {type(m).__name__}, not a Module")
            self.add_module(str(i), m)

    def __getitem__(self, i):
        items = list(self._modules.values())
        return Sequential(*items[i]) if isinstance(i, slice) else items[i]

    def __len__(self):
        return len(self._modules)

    def __iter__(self):
        return iter(self._modules.values())

    def append(self, module):
        self.add_module(str(len(self)), module)
        return self

    def forward(self, x):
        return self._forward_items(x, len(self._modules))

    def _forward_items(self, x, stop):
        """x through the first `stop` modules (the Trainer runs a last Linear with its loss)."""
        items = list(self._modules.values())[:stop]
        i = 0
        while i < len(items):
            module = items[i]
            fuse = type(module) in (Linear, Conv2d) and i + 1 < len(items) and \
                type(items[i + 1]) is ReLU
            pool = items[i + 2] if fuse and i + 2 < len(items) else None
            if type(module) is Conv2d and type(pool) is MaxPool2d and not pool.return_indices:
                x = conv_ops.conv2d_relu_max_pool2d(
                    x, module.weight, module.bias, module.stride, module.padding,
                    module.dilation, module.groups, pool.kernel_size, pool.stride, pool.padding,
                    pool.dilation, pool.ceil_mode)
                i += 3
                continue
            # normalisation: a BatchNorm then ReLU / GELU runs as one node (normalization.py)
            norm_act = fused_activation(module, items[i + 1] if i + 1 < len(items) else None)
            if norm_act is not None:
                x = module(x, activation=norm_act)
                i += 2
                continue
            x = module(x, activation="relu") if fuse else module(x)
            i += 2 if fuse else 1
        return x


class ModuleList(Module):
    """Modules in a list, registered (their parameters are the container's), as
    torch.nn.ModuleList: index, iterate, append, extend, insert. It has no forward: call its
    items from yours."""

    def __init__(self, modules=None):
        super().__init__()
        if modules is not None:
            self.extend(modules)

    def _checked(self, module, where):
        if not isinstance(module, Module):
            raise TypeError(f"ModuleList: {where} is a {type(module).__name__}, not a Module")
        return module

    def _index(self, i):
        if not isinstance(i, int) or isinstance(i, bool):
            raise TypeError(f"ModuleList indices must be ints or slices, got {type(i).__name__}")
        if not -len(self) <= i < len(self):
            raise IndexError(f"ModuleList: index {i} is out of range for {len(self)} modules")
        return i % len(self)

    def __getitem__(self, i):
        items = list(self._modules.values())
        return ModuleList(items[i]) if isinstance(i, slice) else items[self._index(i)]

    def __setitem__(self, i, module):
        self._modules[str(self._index(i))] = self._checked(module, f"item {i}")

    def __delitem__(self, i):
        items = list(self._modules.values())
        del items[i if isinstance(i, slice) else self._index(i)]
        self._modules.clear()
        for k, m in enumerate(items):  # keys stay 0..n-1, as torch renumbers them
            self.add_module(str(k), m)

    def __len__(self):
        return len(self._modules)

    def __iter__(self):
        return iter(self._modules.values())

    def append(self, module):
        self.add_module(str(len(self)), self._checked(module, f"item {len(self)}"))
        return self

    def extend(self, modules):
        for m in modules:
            self.append(m)
        return self

    def insert(self, index, module):
        items = list(self._modules.values())
        items.insert(index, self._checked(module, f"item {index}"))
        self._modules.clear()
        for k, m in enumerate(items):
            self.add_module(str(k), m)


class ModuleDict(Module):
    """Modules by name, registered, in insertion order, as torch.nn.ModuleDict."""

    def __init__(self, modules=None):
        super().__init__()
        if modules is not None:
            self.update(modules)

    def __getitem__(self, key):
        return self._modules[key]

    def __setitem__(self, key, module):
        if not isinstance(key, str):
            raise TypeError(f"ModuleDict keys must be strings, got {type(key).__name__}")
        if not isinstance(module, Module):
            raise TypeError(f"ModuleDict: {key!r} is a {type(module).__name__}, not a Module")
        self.add_module(key, module)

    def __delitem__(self, key):
        del self._modules[key]

    def __contains__(self, key):
        return key in self._modules

    def __len__(self):
        return len(self._modules)

    def __iter__(self):
        return iter(self._modules)

    def keys(self):
        return self._modules.keys()

    def values(self):
        return self._modules.values()

    def items(self):
        return self._modules.items()

    def update(self, modules):
        pairs = modules.items() if hasattr(modules, "items") else modules
        for key, module in pairs:
            self[key] = module
