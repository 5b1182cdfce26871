"""Handlers: aten operators on tritonad's primitives. Each module below registers its handlers
when imported (one line per module)."""
import importlib

for _module in (
    "elementwise",
    "reductions",
    "linalg",
    "copies",
    "softmax",
    "indexing",
    # the network operators and the optimizers (convolution, pooling, norms, embedding,
    # losses, dropout, attention; fused and foreach optimizer steps)
    "nn_ops",
    "norm_ops",
    "loss_ops",
    "attention_ops",
    "optim_ops",
):
    importlib.import_module(f".{_module}", __package__)
