"""Functional forms of the layers: `import tritonad.nn.functional as F`."""
from ..autodiff.elementwise import (elu, gelu, hardswish, hardtanh, leaky_relu, mish, relu,
                                    relu6, sigmoid, silu, softplus, tanh)
from ..autodiff.conv_ops import avg_pool2d, conv2d, dropout, fold, max_pool2d, unfold
from ..autodiff.nn_ops import (cross_entropy, linear, linear_cross_entropy, log_softmax, mse_loss,
                               nll_loss, softmax)

__all__ = ["relu", "sigmoid", "tanh", "gelu", "silu", "softplus", "mish", "leaky_relu", "elu",
           "hardtanh", "relu6", "hardswish", "linear", "conv2d", "max_pool2d", "avg_pool2d",
           "softmax", "log_softmax", "cross_entropy", "linear_cross_entropy", "nll_loss",
           "mse_loss", "dropout", "unfold", "fold"]

# tensor ops models need (autodiff/tensor_ops.py)
from ..autodiff.tensor_ops import (adaptive_avg_pool2d, conv1d, conv_transpose2d,  # noqa: E402
                                    interpolate, pad)
__all__ += ["pad", "interpolate", "conv1d", "conv_transpose2d", "adaptive_avg_pool2d"]


def __getattr__(name):  # a missing PyTorch name says what to use instead (see _hints.py)
    from .._hints import missing
    raise missing(__name__, name, globals())
