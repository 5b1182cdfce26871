"""Functional forms of the layers: `import tritonad.nn.functional as F`."""
from ..autodiff.elementwise import (elu, gelu, hardswish, hardtanh, leaky_relu, mish, relu,
                                    relu6, sigmoid, silu, softplus, tanh)
from ..autodiff.conv_ops import avg_pool2d, conv2d, dropout, fold, max_pool2d, unfold
from ..autodiff.nn_ops import (linear, linear_cross_entropy, log_softmax, mse_loss,
                               softmax)
# ---- losses, similarity and distance (autodiff/losses.py), channel dropout
from ..autodiff.losses import (binary_cross_entropy, binary_cross_entropy_with_logits,
                               cosine_similarity, cross_entropy, huber_loss, kl_div, l1_loss,
                               nll_loss, pairwise_distance, smooth_l1_loss)
from .dropout_shape import dropout1d, dropout2d
from ..autodiff.index_ops import embedding, one_hot  # embeddings and indexing

__all__ = ["relu", "sigmoid", "tanh", "gelu", "silu", "softplus", "mish", "leaky_relu", "elu",
           "hardtanh", "relu6", "hardswish", "linear", "conv2d", "max_pool2d", "avg_pool2d",
           "softmax", "log_softmax", "cross_entropy", "linear_cross_entropy", "nll_loss",
           "mse_loss", "dropout", "unfold", "fold",
           # ---- losses, similarity and distance, channel dropout
           "binary_cross_entropy", "binary_cross_entropy_with_logits", "l1_loss",
           "smooth_l1_loss", "huber_loss", "kl_div", "cosine_similarity", "pairwise_distance",
           "dropout1d", "dropout2d"]
__all__ += ["embedding", "one_hot"]  # embeddings and indexing


# normalisation (autodiff/norm_ops.py)
from ..autodiff.norm_ops import (batch_norm, batch_norm_act, group_norm,  # noqa: E402
                                 layer_norm, normalize, rms_norm)
__all__ += ["layer_norm", "rms_norm", "group_norm", "normalize", "batch_norm", "batch_norm_act"]

# attention: scaled dot-product attention (a composite, flash attention where the backend has it)
from ..autodiff.attention_ops import scaled_dot_product_attention  # noqa: E402
__all__ += ["scaled_dot_product_attention"]

# tensor ops models need (autodiff/tensor_ops.py)
from ..autodiff.tensor_ops import (adaptive_avg_pool2d, conv1d, conv_transpose2d,  # noqa: E402
                                    interpolate, pad)
__all__ += ["pad", "interpolate", "conv1d", "conv_transpose2d", "adaptive_avg_pool2d"]


def __getattr__(name):  # a missing PyTorch name says what to use instead (see _hints.py)
    from .._hints import missing
    raise missing(__name__, name, globals())
