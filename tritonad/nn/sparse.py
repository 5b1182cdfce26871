"""Lookup tables: nn.Embedding, as torch.nn.Embedding (same arguments, layout and state_dict)."""
from __future__ import annotations

from .. import dtypes
from ..autodiff import index_ops
from ..autodiff.grad_mode import no_grad
from ..tensor import Tensor, empty
from . import init
from .module import Module
from .parameter import Parameter


class Embedding(Module):
    """weight [num_embeddings, embedding_dim] ~ N(0, 1), looked up by index: input int64 [*] ->
    [*, embedding_dim]. padding_idx's row starts at zero and gets no gradient; max_norm
    renormalises looked-up rows in place (as torch). The weight gradient is deterministic.
    `nn.Embedding(1000, 64)(td.tensor([[1, 5]]))`"""

    def __init__(self, num_embeddings, embedding_dim, padding_idx=None, max_norm=None,
                 norm_type=2.0, scale_grad_by_freq=False, sparse=False, _weight=None,
                 _freeze=False, device=None, dtype=None):
        super().__init__()
        self.num_embeddings, self.embedding_dim = int(num_embeddings), int(embedding_dim)
        if padding_idx is not None:
            if not -self.num_embeddings <= padding_idx < self.num_embeddings:
                raise ValueError(f"Embedding: padding_idx {padding_idx} must be within "
                                 f"[-{self.num_embeddings}, {self.num_embeddings})")
            padding_idx %= self.num_embeddings
        self.padding_idx, self.max_norm, self.norm_type = padding_idx, max_norm, norm_type
        self.scale_grad_by_freq, self.sparse = scale_grad_by_freq, sparse
        if _weight is None:
            self.weight = Parameter(empty(self.num_embeddings, self.embedding_dim,
                                          dtype=dtype or dtypes.float32, device=device),
                                    requires_grad=not _freeze)
            self.reset_parameters()
        else:
            if tuple(_weight.shape) != (self.num_embeddings, self.embedding_dim):
                raise ValueError(f"Embedding: _weight has shape {tuple(_weight.shape)}, expected "
                                 f"{(self.num_embeddings, self.embedding_dim)}")
            self.weight = Parameter(_weight, requires_grad=not _freeze)

    def reset_parameters(self):
        init.normal_(self.weight)
        self._fill_padding_idx_with_zero()

    def _fill_padding_idx_with_zero(self):
        if self.padding_idx is not None:
            with no_grad():
                self.weight[self.padding_idx] = 0.0

    def forward(self, input):
        return index_ops.embedding(input, self.weight, self.padding_idx, self.max_norm,
                                   self.norm_type, self.scale_grad_by_freq, self.sparse)

    def extra_repr(self):
        text = f"{self.num_embeddings}, {self.embedding_dim}"
        if self.padding_idx is not None:
            text += f", padding_idx={self.padding_idx}"
        if self.max_norm is not None:
            text += f", max_norm={self.max_norm}"
        return text

    @classmethod
    def from_pretrained(cls, embeddings, freeze=True, padding_idx=None, max_norm=None,
                        norm_type=2.0, scale_grad_by_freq=False, sparse=False):
        """An Embedding whose weight is `embeddings` [num, dim] (its memory, as torch), frozen
        unless freeze=False."""
        if not isinstance(embeddings, Tensor) or embeddings.ndim != 2:
            raise ValueError("Embedding.from_pretrained: embeddings must be a 2-d tensor")
        rows, cols = embeddings.shape
        return cls(rows, cols, padding_idx, max_norm, norm_type, scale_grad_by_freq, sparse,
                   _weight=embeddings, _freeze=freeze)
