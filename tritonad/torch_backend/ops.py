"""Handlers: aten operators on tritonad's primitives. One module per family is imported here."""

# the network operators and the optimizers (convolution, pooling, norms, embedding, losses,
# dropout, attention; fused and foreach optimizer steps)
from . import attention_ops, loss_ops, nn_ops, norm_ops, optim_ops  # noqa: E402

NETWORK_MODULES = (nn_ops, norm_ops, loss_ops, attention_ops, optim_ops)
