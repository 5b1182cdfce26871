"""Loss modules (thin wrappers over the functional losses)."""
from __future__ import annotations

from ..autodiff import losses, nn_ops
from .module import Module


class CrossEntropyLoss(Module):
    """Softmax cross-entropy of logits [N, C, ...] against class indices [N, ...] or class
    probabilities (F.cross_entropy); logits [N, C] with indices and no weight run one fused
    kernel."""

    def __init__(self, weight=None, size_average=None, ignore_index=-100, reduce=None,
                 reduction="mean", label_smoothing=0.0):
        super().__init__()
        self.register_buffer("weight", weight)
        self.ignore_index = ignore_index
        self.reduction = losses._reduction("CrossEntropyLoss", size_average, reduce, reduction)
        self.label_smoothing = label_smoothing

    def forward(self, logits, target):
        if self.weight is None and logits.ndim == 2 and target.ndim == 1:  # the fused kernel
            return nn_ops.cross_entropy(logits, target, self.reduction, self.ignore_index,
                                        self.label_smoothing)
        return losses.cross_entropy(logits, target, self.weight, None, self.ignore_index, None,
                                    self.reduction, self.label_smoothing)


class NLLLoss(Module):
    def __init__(self, weight=None, size_average=None, ignore_index=-100, reduce=None,
                 reduction="mean"):
        super().__init__()
        self.register_buffer("weight", weight)
        self.ignore_index = ignore_index
        self.reduction = losses._reduction("NLLLoss", size_average, reduce, reduction)

    def forward(self, log_probs, target):
        return losses.nll_loss(log_probs, target, self.weight, None, self.ignore_index, None,
                               self.reduction)


class MSELoss(Module):
    def __init__(self, reduction="mean"):
        super().__init__()
        self.reduction = reduction

    def forward(self, input, target):
        return nn_ops.mse_loss(input, target, self.reduction)


# ---- losses, similarity and distance (autodiff/losses.py), PyTorch's arguments


class _Loss(Module):
    def __init__(self, size_average=None, reduce=None, reduction="mean"):
        super().__init__()
        self.reduction = losses._reduction(type(self).__name__, size_average, reduce, reduction,
                                           self._allowed)

    _allowed = losses._REDUCTIONS

    def extra_repr(self):
        return f"reduction={self.reduction!r}"


class _WeightedLoss(_Loss):
    def __init__(self, weight=None, size_average=None, reduce=None, reduction="mean"):
        super().__init__(size_average, reduce, reduction)
        self.register_buffer("weight", weight)


class BCELoss(_WeightedLoss):
    """Binary cross-entropy of probabilities (F.binary_cross_entropy)."""

    def forward(self, input, target):
        return losses.binary_cross_entropy(input, target, self.weight, reduction=self.reduction)


class BCEWithLogitsLoss(_WeightedLoss):
    """Binary cross-entropy of logits, computed stably (F.binary_cross_entropy_with_logits)."""

    def __init__(self, weight=None, size_average=None, reduce=None, reduction="mean",
                 pos_weight=None):
        super().__init__(weight, size_average, reduce, reduction)
        self.register_buffer("pos_weight", pos_weight)

    def forward(self, input, target):
        return losses.binary_cross_entropy_with_logits(input, target, self.weight,
                                                       reduction=self.reduction,
                                                       pos_weight=self.pos_weight)


class L1Loss(_Loss):
    def forward(self, input, target):
        return losses.l1_loss(input, target, reduction=self.reduction)


class SmoothL1Loss(_Loss):
    def __init__(self, size_average=None, reduce=None, reduction="mean", beta=1.0):
        super().__init__(size_average, reduce, reduction)
        self.beta = beta

    def forward(self, input, target):
        return losses.smooth_l1_loss(input, target, reduction=self.reduction, beta=self.beta)


class HuberLoss(_Loss):
    def __init__(self, reduction="mean", delta=1.0):
        super().__init__(reduction=reduction)
        self.delta = delta

    def forward(self, input, target):
        return losses.huber_loss(input, target, reduction=self.reduction, delta=self.delta)


class KLDivLoss(_Loss):
    """KL divergence of log-probabilities input from target (F.kl_div)."""
    _allowed = losses._REDUCTIONS + ("batchmean",)

    def __init__(self, size_average=None, reduce=None, reduction="mean", log_target=False):
        super().__init__(size_average, reduce, reduction)
        self.log_target = log_target

    def forward(self, input, target):
        return losses.kl_div(input, target, reduction=self.reduction, log_target=self.log_target)


class CosineSimilarity(Module):
    def __init__(self, dim=1, eps=1e-8):
        super().__init__()
        self.dim, self.eps = dim, eps

    def forward(self, x1, x2):
        return losses.cosine_similarity(x1, x2, self.dim, self.eps)


class PairwiseDistance(Module):
    def __init__(self, p=2.0, eps=1e-6, keepdim=False):
        super().__init__()
        self.norm, self.eps, self.keepdim = p, eps, keepdim

    def forward(self, x1, x2):
        return losses.pairwise_distance(x1, x2, self.norm, self.eps, self.keepdim)
