"""Neural-network building blocks: `from tritonad import nn`."""
from . import functional, fused, init, utils  # noqa: F401
from .activation import *  # noqa: F401,F403  (GELU, SiLU, ... from the elementwise table)
from .activation import MODULES as _ACTIVATIONS
from .layers import (AvgPool2d, Conv2d, Dropout, Flatten, Identity, Linear, LogSoftmax,
                     MaxPool2d, ModuleDict, ModuleList, Sequential, Softmax)
from .loss import CrossEntropyLoss, MSELoss, NLLLoss
# ---- losses, similarity and distance; ParameterList/Dict; channel dropout; Unflatten
from .loss import (BCELoss, BCEWithLogitsLoss, CosineSimilarity, HuberLoss, KLDivLoss, L1Loss,
                   PairwiseDistance, SmoothL1Loss)
from .container import ParameterDict, ParameterList
from .dropout_shape import Dropout1d, Dropout2d, Unflatten
from .fused import FusedMLP
from .module import Module
from .parameter import Parameter
from .sparse import Embedding  # embeddings and indexing

__all__ = sorted(_ACTIVATIONS) + ["Module", "Parameter", "Linear", "Conv2d", "MaxPool2d",
           "AvgPool2d", "Softmax", "LogSoftmax", "Identity", "Flatten", "Dropout", "Sequential",
           "ModuleList", "ModuleDict", "FusedMLP",
           "CrossEntropyLoss", "NLLLoss", "MSELoss", "init", "functional",
           # ---- losses, similarity and distance; containers; channel dropout; Unflatten
           "BCELoss", "BCEWithLogitsLoss", "L1Loss", "SmoothL1Loss", "HuberLoss", "KLDivLoss",
           "CosineSimilarity", "PairwiseDistance", "ParameterList", "ParameterDict", "Dropout1d",
           "Dropout2d", "Unflatten"]
__all__ += ["Embedding"]  # embeddings and indexing

# recurrent layers (nn/rnn.py)
from .rnn import GRU, LSTM, RNN, GRUCell, LSTMCell, RNNCell  # noqa: E402
__all__ += ["RNNCell", "LSTMCell", "GRUCell", "RNN", "LSTM", "GRU"]

# attention: multi-head attention and the transformer encoder
from .transformer import MultiheadAttention, TransformerEncoder, TransformerEncoderLayer  # noqa: E402
__all__ += ["MultiheadAttention", "TransformerEncoderLayer", "TransformerEncoder"]


# normalisation layers (normalization.py)
from .normalization import (BatchNorm1d, BatchNorm2d, GroupNorm, LayerNorm,  # noqa: E402
                            RMSNorm)
__all__ += ["LayerNorm", "RMSNorm", "GroupNorm", "BatchNorm1d", "BatchNorm2d"]

# layers over the tensor ops models need (model_layers.py)
from .model_layers import AdaptiveAvgPool2d, Conv1d, ConvTranspose2d, Upsample  # noqa: E402
__all__ += ["Conv1d", "ConvTranspose2d", "AdaptiveAvgPool2d", "Upsample"]


def __getattr__(name):  # a missing PyTorch name says what to use instead (see _hints.py)
    from .._hints import missing
    raise missing(__name__, name, globals())
