"""Loss modules (thin wrappers over the functional losses)."""
from __future__ import annotations

from ..autodiff import nn_ops
from .module import Module


class CrossEntropyLoss(Module):
    """Softmax cross-entropy of logits [N, C] against class indices [N], in one fused kernel."""

    def __init__(self, ignore_index=-100, reduction="mean", label_smoothing=0.0):
        super().__init__()
        self.ignore_index, self.reduction = ignore_index, reduction
        self.label_smoothing = label_smoothing

    def forward(self, logits, target):
        return nn_ops.cross_entropy(logits, target, self.reduction, self.ignore_index,
                                    self.label_smoothing)


class NLLLoss(Module):
    def __init__(self, ignore_index=-100, reduction="mean"):
        super().__init__()
        self.ignore_index, self.reduction = ignore_index, reduction

    def forward(self, log_probs, target):
        return nn_ops.nll_loss(log_probs, target, self.reduction, self.ignore_index)


class MSELoss(Module):
    def __init__(self, reduction="mean"):
        super().__init__()
        self.reduction = reduction

    def forward(self, input, target):
        return nn_ops.mse_loss(input, target, self.reduction)
