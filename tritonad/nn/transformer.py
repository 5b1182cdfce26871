"""Attention layers: MultiheadAttention, TransformerEncoderLayer, TransformerEncoder, with torch's
arguments, parameter names and layouts (so that state dicts port both ways).

MultiheadAttention runs F.scaled_dot_product_attention (flash attention on the GPU) when no
weights are asked for (need_weights=False, as TransformerEncoderLayer asks); with weights it
computes them explicitly (an L x S matrix per head, as torch does).
"""
from __future__ import annotations

import math

from .. import dtypes
from ..autodiff import attention_ops, conv_ops, nn_ops
from ..autodiff.elementwise import gelu, logical_not, relu, where
from ..tensor import arange, empty
from . import init
from .layers import Dropout, Linear, ModuleList
from .module import Module
from .parameter import Parameter

__all__ = ["MultiheadAttention", "TransformerEncoderLayer", "TransformerEncoder",
           "generate_square_subsequent_mask"]


def generate_square_subsequent_mask(sz, device=None, dtype=None):
    """[sz, sz] float mask: 0 on and below the diagonal, -inf above (torch's
    nn.Transformer.generate_square_subsequent_mask)."""
    i = arange(sz, device=device)
    above = i.unsqueeze(0) > i.unsqueeze(1)
    return where(above, float("-inf"), 0.0).to(dtype or dtypes.float32)


def _is_bool(mask):
    return mask is not None and mask.dtype.name == "bool"


def _additive(mask, dtype):
    """A torch MHA mask (bool: True = not allowed; float: added) as an additive float mask."""
    if mask is None or not _is_bool(mask):
        return mask
    return where(mask, float("-inf"), 0.0).to(dtype)


class MultiheadAttention(Module):
    """torch.nn.MultiheadAttention: out = out_proj(attention(q W_q^T, k W_k^T, v W_v^T)) with
    num_heads heads of embed_dim / num_heads each.

    query: [L, N, E] ([N, L, E] with batch_first, [L, E] unbatched); key, value: [S, N, kdim /
    vdim]. key_padding_mask: [N, S] (bool: True = ignore that key; or float, added);
    attn_mask: [L, S] or [N * num_heads, L, S] (bool: True = not allowed; or float, added).
    Returns (out [L, N, E], weights [N, L, S] averaged over heads ([N, H, L, S] with
    average_attn_weights=False), or None when need_weights=False).

    >>> mha = nn.MultiheadAttention(64, 4, batch_first=True)
    >>> out, _ = mha(x, x, x, need_weights=False)
    """

    def __init__(self, embed_dim, num_heads, dropout=0.0, bias=True, add_bias_kv=False,
                 add_zero_attn=False, kdim=None, vdim=None, batch_first=False, device=None,
                 dtype=None):
        super().__init__()
        if embed_dim <= 0 or num_heads <= 0:
            raise ValueError(f"MultiheadAttention: embed_dim and num_heads must be positive, got "
                             f"{embed_dim} and {num_heads}")
        if embed_dim % num_heads:
            raise ValueError(f"MultiheadAttention: embed_dim ({embed_dim}) must be divisible by "
                             f"num_heads ({num_heads})")
        if add_bias_kv or add_zero_attn:
            raise ValueError("MultiheadAttention: add_bias_kv and add_zero_attn are not "
                             "supported")
        if not 0.0 <= dropout <= 1.0:
            raise ValueError(f"MultiheadAttention: dropout must be in [0, 1], got {dropout}")
        self.embed_dim, self.num_heads = int(embed_dim), int(num_heads)
        self.kdim = int(kdim) if kdim is not None else self.embed_dim
        self.vdim = int(vdim) if vdim is not None else self.embed_dim
        self._qkv_same_embed_dim = self.kdim == self.embed_dim and self.vdim == self.embed_dim
        self.dropout, self.batch_first = float(dropout), bool(batch_first)
        self.head_dim = self.embed_dim // self.num_heads
        dtype = dtype or dtypes.float32
        E = self.embed_dim
        if self._qkv_same_embed_dim:
            self.in_proj_weight = Parameter(empty(3 * E, E, dtype=dtype, device=device))
            self.q_proj_weight = self.k_proj_weight = self.v_proj_weight = None
        else:
            self.q_proj_weight = Parameter(empty(E, E, dtype=dtype, device=device))
            self.k_proj_weight = Parameter(empty(E, self.kdim, dtype=dtype, device=device))
            self.v_proj_weight = Parameter(empty(E, self.vdim, dtype=dtype, device=device))
            self.in_proj_weight = None
        self.in_proj_bias = Parameter(empty(3 * E, dtype=dtype, device=device)) if bias else None
        self.out_proj = Linear(E, E, bias=bias, device=device, dtype=dtype)
        self.bias_k = self.bias_v = None
        self.add_zero_attn = False
        self._reset_parameters()

    def _reset_parameters(self):
        # as torch: xavier-uniform projections, zero biases (out_proj.weight keeps Linear's)
        if self._qkv_same_embed_dim:
            init.xavier_uniform_(self.in_proj_weight)
        else:
            for w in (self.q_proj_weight, self.k_proj_weight, self.v_proj_weight):
                init.xavier_uniform_(w)
        if self.in_proj_bias is not None:
            init.constant_(self.in_proj_bias, 0.0)
            init.constant_(self.out_proj.bias, 0.0)

    def _projections(self, query, key, value):
        E = self.embed_dim
        b = self.in_proj_bias
        bq, bk, bv = (None, None, None) if b is None else (b[:E], b[E:2 * E], b[2 * E:])
        if self._qkv_same_embed_dim:
            w = self.in_proj_weight
            wq, wk, wv = w[:E], w[E:2 * E], w[2 * E:]
        else:
            wq, wk, wv = self.q_proj_weight, self.k_proj_weight, self.v_proj_weight
        return (nn_ops.linear(query, wq, bq), nn_ops.linear(key, wk, bk),
                nn_ops.linear(value, wv, bv))

    def forward(self, query, key, value, key_padding_mask=None, need_weights=True,
                attn_mask=None, average_attn_weights=True, is_causal=False):
        batched = query.ndim == 3
        if query.ndim not in (2, 3) or key.ndim != query.ndim or value.ndim != query.ndim:
            raise ValueError(f"MultiheadAttention: expected query, key and value all 3-d "
                             f"(batched) or all 2-d (unbatched), got {query.shape}, {key.shape}, "
                             f"{value.shape}")
        if is_causal and attn_mask is None:
            raise ValueError("MultiheadAttention: is_causal is a hint that attn_mask is the "
                             "causal mask; pass attn_mask too")
        if not batched:  # [L, E] -> [1, L, E]
            query, key, value = query.unsqueeze(0), key.unsqueeze(0), value.unsqueeze(0)
            if key_padding_mask is not None:
                key_padding_mask = key_padding_mask.unsqueeze(0)
        elif not self.batch_first:  # [L, N, E] -> [N, L, E]
            query, key, value = (t.transpose(0, 1) for t in (query, key, value))
        N, L, E = query.shape
        S = key.shape[1]
        if E != self.embed_dim or key.shape[-1] != self.kdim or value.shape[-1] != self.vdim \
                or key.shape[:2] != value.shape[:2] or key.shape[0] != N:
            raise ValueError(f"MultiheadAttention: shapes do not fit embed_dim={self.embed_dim}, "
                             f"kdim={self.kdim}, vdim={self.vdim}: query {query.shape}, key "
                             f"{key.shape}, value {value.shape} (as [N, L, E])")
        H, D = self.num_heads, self.head_dim
        q, k, v = self._projections(query, key, value)
        # [N, L, E] -> [N, H, L, D]: strided views, read in place by the attention kernels
        q = q.reshape(N, L, H, D).transpose(1, 2)
        k = k.reshape(N, S, H, D).transpose(1, 2)
        v = v.reshape(N, S, H, D).transpose(1, 2)
        mask = self._mask(key_padding_mask, attn_mask, N, L, S, q.dtype)
        dropout_p = self.dropout if self.training else 0.0
        weights = None
        if need_weights:
            scores = nn_ops.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(D))
            if mask is not None:
                scores = where(mask, scores, float("-inf")) if _is_bool(mask) else scores + mask
            weights = nn_ops.softmax(scores, -1)
            weights = conv_ops.dropout(weights, dropout_p, dropout_p > 0.0)
            out = nn_ops.matmul(weights, v)
            if average_attn_weights:
                weights = weights.mean(1)
            if not batched:
                weights = weights.squeeze(0)
        else:
            causal = is_causal and key_padding_mask is None
            out = attention_ops.scaled_dot_product_attention(
                q, k, v, attn_mask=None if causal else mask, dropout_p=dropout_p,
                is_causal=causal)
        out = self.out_proj(out.transpose(1, 2).reshape(N, L, E))
        if not batched:
            out = out.squeeze(0)
        elif not self.batch_first:
            out = out.transpose(0, 1)
        return out, weights

    def _mask(self, key_padding_mask, attn_mask, N, L, S, dtype):
        """The two torch masks as one SDPA mask broadcastable to [N, H, L, S]: bool (True =
        take part) when both are bool, else additive."""
        H = self.num_heads
        if key_padding_mask is not None and tuple(key_padding_mask.shape) != (N, S):
            raise ValueError(f"MultiheadAttention: key_padding_mask must be [N, S] = {(N, S)}, "
                             f"got {key_padding_mask.shape}")
        if attn_mask is not None:
            if attn_mask.ndim == 2 and tuple(attn_mask.shape) == (L, S):
                pass
            elif attn_mask.ndim == 3 and tuple(attn_mask.shape) == (N * H, L, S):
                attn_mask = attn_mask.reshape(N, H, L, S)
            else:
                raise ValueError(f"MultiheadAttention: attn_mask must be [L, S] = {(L, S)} or "
                                 f"[N * num_heads, L, S] = {(N * H, L, S)}, got "
                                 f"{attn_mask.shape}")
        if key_padding_mask is not None:
            key_padding_mask = key_padding_mask.reshape(N, 1, 1, S)
        masks = [m for m in (attn_mask, key_padding_mask) if m is not None]
        if not masks:
            return None
        if all(_is_bool(m) for m in masks):
            keep = logical_not(masks[0])
            for m in masks[1:]:
                keep = keep & logical_not(m)
            return keep
        total = _additive(masks[0], dtype)
        for m in masks[1:]:
            total = total + _additive(m, dtype)
        return total

    def extra_repr(self):
        return f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, dropout={self.dropout}, " \
               f"batch_first={self.batch_first}"


def _layer_norm(d_model, eps, bias, device, dtype):
    from .normalization import LayerNorm  # nn.LayerNorm, looked up when a layer is made
    return LayerNorm(d_model, eps=eps, bias=bias, device=device, dtype=dtype)


_ACTIVATIONS = {"relu": relu, "gelu": gelu}


class TransformerEncoderLayer(Module):
    """torch.nn.TransformerEncoderLayer: self-attention and a feed-forward block, each with a
    residual connection and a LayerNorm (after each block, or before with norm_first).

    src: [S, N, d_model] ([N, S, d_model] with batch_first, [S, d_model] unbatched).

    >>> layer = nn.TransformerEncoderLayer(64, 4, 256, batch_first=True)
    >>> y = layer(x, src_mask=mask, is_causal=True)
    """

    def __init__(self, d_model, nhead, dim_feedforward=2048, dropout=0.1, activation="relu",
                 layer_norm_eps=1e-5, batch_first=False, norm_first=False, bias=True,
                 device=None, dtype=None):
        super().__init__()
        self._config = dict(d_model=d_model, nhead=nhead, dim_feedforward=dim_feedforward,
                            dropout=dropout, activation=activation,
                            layer_norm_eps=layer_norm_eps, batch_first=batch_first,
                            norm_first=norm_first, bias=bias, device=device, dtype=dtype)
        self.self_attn = MultiheadAttention(d_model, nhead, dropout=dropout, bias=bias,
                                            batch_first=batch_first, device=device, dtype=dtype)
        self.linear1 = Linear(d_model, dim_feedforward, bias=bias, device=device, dtype=dtype)
        self.dropout = Dropout(dropout)
        self.linear2 = Linear(dim_feedforward, d_model, bias=bias, device=device, dtype=dtype)
        self.norm_first = bool(norm_first)
        self.norm1 = _layer_norm(d_model, layer_norm_eps, bias, device, dtype)
        self.norm2 = _layer_norm(d_model, layer_norm_eps, bias, device, dtype)
        self.dropout1 = Dropout(dropout)
        self.dropout2 = Dropout(dropout)
        if isinstance(activation, str):
            if activation not in _ACTIVATIONS:
                raise ValueError(f"TransformerEncoderLayer: activation should be relu or gelu, "
                                 f"not {activation!r}")
            activation = _ACTIVATIONS[activation]
        elif not callable(activation):
            raise TypeError(f"TransformerEncoderLayer: activation must be 'relu', 'gelu' or a "
                            f"callable, got {type(activation).__name__}")
        self.activation = activation

    def forward(self, src, src_mask=None, src_key_padding_mask=None, is_causal=False):
        x = src
        if self.norm_first:
            x = x + self._sa_block(self.norm1(x), src_mask, src_key_padding_mask, is_causal)
            x = x + self._ff_block(self.norm2(x))
        else:
            x = self.norm1(x + self._sa_block(x, src_mask, src_key_padding_mask, is_causal))
            x = self.norm2(x + self._ff_block(x))
        return x

    def _sa_block(self, x, attn_mask, key_padding_mask, is_causal):
        x = self.self_attn(x, x, x, attn_mask=attn_mask, key_padding_mask=key_padding_mask,
                           need_weights=False, is_causal=is_causal)[0]
        return self.dropout1(x)

    def _ff_block(self, x):
        return self.dropout2(self.linear2(self.dropout(self.activation(self.linear1(x)))))


class TransformerEncoder(Module):
    """torch.nn.TransformerEncoder: num_layers copies of encoder_layer (same initial weights),
    then `norm` if given. forward(src, mask=None, src_key_padding_mask=None, is_causal=None)."""

    def __init__(self, encoder_layer, num_layers, norm=None, enable_nested_tensor=True,
                 mask_check=True):
        super().__init__()
        config = getattr(encoder_layer, "_config", None)
        if config is None:
            raise TypeError(f"TransformerEncoder: encoder_layer must be a "
                            f"TransformerEncoderLayer, got {type(encoder_layer).__name__}")
        if num_layers < 1:
            raise ValueError(f"TransformerEncoder: num_layers must be positive, got {num_layers}")
        layers = []
        for _ in range(num_layers):  # copies (tritonad tensors are not deep-copied)
            layer = type(encoder_layer)(**config)
            layer.load_state_dict(encoder_layer.state_dict())
            layer.train(encoder_layer.training)
            layers.append(layer)
        self.layers = ModuleList(layers)
        self.num_layers = num_layers
        self.norm = norm

    def forward(self, src, mask=None, src_key_padding_mask=None, is_causal=None):
        x = src
        for layer in self.layers:
            x = layer(x, src_mask=mask, src_key_padding_mask=src_key_padding_mask,
                      is_causal=bool(is_causal))
        return self.norm(x) if self.norm is not None else x

