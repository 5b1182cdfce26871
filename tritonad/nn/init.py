"""Weight initialisation, in place and without history (as torch.nn.init).

fan_in / fan_out of a weight [out, in, *kernel]: in * prod(kernel) and out * prod(kernel).
Kaiming (He et al. 2015): std = gain / sqrt(fan), uniform bound = sqrt(3) * std.
Xavier (Glorot & Bengio 2010): std = gain * sqrt(2 / (fan_in + fan_out)).
"""
from __future__ import annotations

import math

from ..autodiff.grad_mode import no_grad
from ..tensor import normal as _normal
from ..tensor import uniform as _uniform


def calculate_gain(nonlinearity, param=None):
    """The recommended gain for a nonlinearity (torch's table)."""
    linear = ("linear", "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d",
              "conv_transpose3d", "sigmoid")
    if nonlinearity in linear:
        return 1.0
    if nonlinearity == "tanh":
        return 5.0 / 3
    if nonlinearity == "relu":
        return math.sqrt(2.0)
    if nonlinearity == "leaky_relu":
        slope = 0.01 if param is None else float(param)
        return math.sqrt(2.0 / (1 + slope ** 2))
    if nonlinearity == "selu":
        return 3.0 / 4
    raise ValueError(f"calculate_gain: unsupported nonlinearity {nonlinearity!r}")


def _calculate_fan_in_and_fan_out(tensor):
    if tensor.ndim < 2:
        raise ValueError(f"fan in/out need a tensor of at least 2 dims, got shape {tensor.shape}")
    receptive = math.prod(tensor.shape[2:])
    return tensor.shape[1] * receptive, tensor.shape[0] * receptive


def _fan(tensor, mode):
    fan_in, fan_out = _calculate_fan_in_and_fan_out(tensor)
    if mode not in ("fan_in", "fan_out"):
        raise ValueError(f"mode must be 'fan_in' or 'fan_out', got {mode!r}")
    return fan_in if mode == "fan_in" else fan_out


@no_grad()
def uniform_(tensor, a=0.0, b=1.0):
    """Fill with U(a, b)."""
    return tensor.copy_(_uniform(tensor.shape, a, b, dtype=tensor.dtype, device=tensor.device))


@no_grad()
def normal_(tensor, mean=0.0, std=1.0):
    """Fill with N(mean, std^2)."""
    return tensor.copy_(_normal(tensor.shape, mean, std, dtype=tensor.dtype, device=tensor.device))


@no_grad()
def constant_(tensor, val):
    return tensor.fill_(val)


def zeros_(tensor):
    return constant_(tensor, 0.0)


def ones_(tensor):
    return constant_(tensor, 1.0)


def kaiming_uniform_(tensor, a=0.0, mode="fan_in", nonlinearity="leaky_relu"):
    std = calculate_gain(nonlinearity, a) / math.sqrt(_fan(tensor, mode))
    bound = math.sqrt(3.0) * std
    return uniform_(tensor, -bound, bound)


def kaiming_normal_(tensor, a=0.0, mode="fan_in", nonlinearity="leaky_relu"):
    std = calculate_gain(nonlinearity, a) / math.sqrt(_fan(tensor, mode))
    return normal_(tensor, 0.0, std)


def xavier_uniform_(tensor, gain=1.0):
    fan_in, fan_out = _calculate_fan_in_and_fan_out(tensor)
    bound = gain * math.sqrt(6.0 / (fan_in + fan_out))
    return uniform_(tensor, -bound, bound)


def xavier_normal_(tensor, gain=1.0):
    fan_in, fan_out = _calculate_fan_in_and_fan_out(tensor)
    return normal_(tensor, 0.0, gain * math.sqrt(2.0 / (fan_in + fan_out)))
