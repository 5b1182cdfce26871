"""Utilities over parameters (torch.nn.utils names)."""
from ..optim import clip_grad_norm_  # noqa: F401
