"""Functional forms of the layers: `import tritonad.nn.functional as F`."""
from ..autodiff.elementwise import (elu, gelu, hardswish, hardtanh, leaky_relu, mish, relu,
                                    relu6, sigmoid, silu, softplus, tanh)
from ..autodiff.nn_ops import (avg_pool2d, conv2d, cross_entropy, dropout, fold, linear,
                               linear_cross_entropy, log_softmax, max_pool2d, mse_loss, nll_loss,
                               softmax, unfold)

__all__ = ["relu", "sigmoid", "tanh", "gelu", "silu", "softplus", "mish", "leaky_relu", "elu",
           "hardtanh", "relu6", "hardswish", "linear", "conv2d", "max_pool2d", "avg_pool2d",
           "softmax", "log_softmax", "cross_entropy", "linear_cross_entropy", "nll_loss",
           "mse_loss", "dropout", "unfold", "fold"]


def __getattr__(name):  # a missing PyTorch name says what to use instead (see _hints.py)
    from .._hints import missing
    raise missing(__name__, name, globals())
