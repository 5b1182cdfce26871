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

# attention: scaled dot-product attention (a composite, flash attention where the backend has it)
from ..autodiff.attention_ops import scaled_dot_product_attention  # noqa: E402
__all__ += ["scaled_dot_product_attention"]


def __getattr__(name):  # a missing PyTorch name says what to use instead (see _hints.py)
    from .._hints import missing
    raise missing(__name__, name, globals())
