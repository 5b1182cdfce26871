"""Scaled dot-product attention: a composite over Tensor ops (the oracle, which the numpy
backend runs) and its fused form, flash attention (kernels/attention.py), where the backend has
it.

    weights = softmax(scale * q @ k^T + bias, -1)      (bias: -inf where masked out)
    out = dropout(weights, dropout_p) @ v

q: [..., Hq, L, E], k: [..., Hk, S, E], v: [..., Hk, S, Ev] -> out [..., Hq, L, Ev], as torch's
F.scaled_dot_product_attention: attn_mask bool (True = take part) or additive, broadcast to
[..., Hq, L, S]; is_causal the top-left aligned lower triangle (query i sees keys j <= i);
scale defaults to 1 / sqrt(E); enable_gqa lets Hq be a multiple of Hk (query head h reads key
head h // (Hq / Hk)). A query row with every key masked out gives 0, as torch's CPU
implementation does (its "safe softmax").
"""
from __future__ import annotations

import math

from .. import generator
from ..tensor import Tensor, arange
from .autocast import low, state as _autocast
from .composite import composite
from .conv_ops import dropout
from .dims import broadcast_shapes
from .elementwise import isfinite, where
from .function import Function
from .nn_ops import _b, _same_float, matmul
from .shape_ops import expand, reshape, unsqueeze

__all__ = ["scaled_dot_product_attention"]

OP = "scaled_dot_product_attention"


def _check(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa):
    """Validate as torch does; returns (scale, heads ratio)."""
    for name, t in (("query", query), ("key", key), ("value", value)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{OP}: {name} must be a tensor, got {type(t).__name__}")
        if t.ndim < 2:
            raise ValueError(f"{OP}: {name} needs at least 2 dims [..., length, dim], got shape "
                             f"{t.shape}")
    _same_float(OP, query, key, value)
    if query.shape[-1] != key.shape[-1] or key.shape[-2] != value.shape[-2] or \
            key.shape[:-2] != value.shape[:-2]:
        raise ValueError(f"{OP}: shapes do not fit: query {query.shape} [..., L, E], key "
                         f"{key.shape} [..., S, E], value {value.shape} [..., S, Ev]")
    group = 1
    if enable_gqa and query.ndim >= 3 and key.ndim >= 3:
        hq, hk = query.shape[-3], key.shape[-3]
        if hk == 0 or hq % hk:
            raise ValueError(f"{OP}: with enable_gqa the query heads ({hq}) must be a multiple "
                             f"of the key/value heads ({hk}): query {query.shape}, key "
                             f"{key.shape}")
        group = hq // hk
    if not 0.0 <= dropout_p <= 1.0:
        raise ValueError(f"{OP}: dropout_p must be in [0, 1], got {dropout_p}")
    if attn_mask is not None:
        if not isinstance(attn_mask, Tensor):
            raise TypeError(f"{OP}: attn_mask must be a tensor, got {type(attn_mask).__name__}")
        if attn_mask.dtype.name != "bool" and attn_mask.dtype != query.dtype:
            raise TypeError(f"{OP}: attn_mask must be bool or of the query's dtype "
                            f"({query.dtype.name}), got {attn_mask.dtype.name}")
        if is_causal:
            raise ValueError(f"{OP}: an explicit attn_mask should not be set when "
                             "is_causal=True")
    if scale is None:
        scale = 1.0 / math.sqrt(query.shape[-1]) if query.shape[-1] else 1.0
    return float(scale), group


def _autocast_args(query, key, value, attn_mask):
    """Under autocast, attention is a LOW op (as PyTorch's): its float32 tensors, an additive
    mask too, in the autocast dtype."""
    if attn_mask is not None and attn_mask.dtype.is_floating_point:
        query, key, value, attn_mask = low(query, key, value, attn_mask)
    else:
        query, key, value = low(query, key, value)
    return query, key, value, attn_mask


def _repeat_heads(x, group):
    """[..., Hk, S, E] -> [..., Hk * group, S, E], each head repeated group times in place."""
    if group == 1:
        return x
    shape = x.shape
    x = expand(unsqueeze(x, -3), shape[:-2] + (group,) + shape[-2:])
    return reshape(x, shape[:-3] + (shape[-3] * group,) + shape[-2:])


@composite
def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0,
                                 is_causal=False, scale=None, enable_gqa=False):
    """softmax(q @ k^T * scale + mask) @ v with torch's arguments (see the module docstring).

    >>> out = F.scaled_dot_product_attention(q, k, v, is_causal=True)   # [B, H, L, Ev]
    """
    if _autocast.dtype:
        query, key, value, attn_mask = _autocast_args(query, key, value, attn_mask)
    scale, group = _check(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    key, value = _repeat_heads(key, group), _repeat_heads(value, group)
    scores = matmul(query, key.transpose(-2, -1)) * scale
    L, S = query.shape[-2], key.shape[-2]
    keep = None
    if is_causal:
        keep = unsqueeze(arange(L, device=query.device), 1) >= \
            unsqueeze(arange(S, device=query.device), 0)
    elif attn_mask is not None:
        if attn_mask.dtype.name == "bool":
            keep = attn_mask
        else:
            scores = scores + attn_mask
    if keep is not None:
        scores = where(keep, scores, float("-inf"))
    # softmax over keys, 0 for a row with nothing to attend to (torch's safe softmax)
    m = scores.detach().amax(-1, keepdim=True)
    e = (scores - where(isfinite(m), m, 0.0)).exp()
    total = e.sum(-1, keepdim=True)
    weights = e / where(total == 0.0, 1.0, total)
    if dropout_p > 0.0:
        weights = dropout(weights, dropout_p)
    return matmul(weights, value)


class FlashAttention(Function):
    """out = flash attention of q [B, H, L, E], k [B, Hk, S, E], v [B, Hk, S, Ev] (mask: a raw
    [B, H, L, S] view or None, never differentiated). Saves q, k, v, out and the per-row
    log-sum-exp; the backward recomputes the weights tile by tile (three kernels).
    Once-differentiable."""
    once_differentiable = True

    @staticmethod
    def forward(ctx, q, k, v, mask, scale, causal, dropout_p):
        seed = offset = 0
        if dropout_p > 0.0:  # the weights' counters, in their element order
            B, H, L = q.shape[:3]
            seed, offset = generator.take(B * H * L * k.shape[2])
        out, lse = _b().flash_attention(q, k, v, mask, scale, causal, dropout_p, seed, offset)
        ctx.args = (mask, scale, causal, dropout_p, seed, offset)
        ctx.save_for_backward(q, k, v, out, lse)
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved
        dq, dk, dv = _b().flash_attention_backward(dout._data, q._data, k._data, v._data,
                                                   out._data, lse._data, *ctx.args)
        needs = ctx.needs_input_grad
        return (Tensor._wrap(dq) if needs[0] else None, Tensor._wrap(dk) if needs[1] else None,
                Tensor._wrap(dv) if needs[2] else None, None, None, None, None)


FUSED_DTYPES = ("float32", "float16", "bfloat16")
FUSED_MAX_HEAD_DIM = 128   # (kernels/attention.py's MAX_HEAD_DIM)


def _fused_mask(attn_mask, batch, H, L, S):
    """attn_mask as a raw [B, H, L, S] view (broadcast dims of stride 0), or False where the
    batch dims cannot be merged into one without a copy."""
    if attn_mask is None:
        return None
    raw = attn_mask._data
    try:
        raw = raw.expand(batch + (H, L, S))
        return raw.view((-1, H, L, S)) if len(batch) != 1 else raw
    except RuntimeError:  # not broadcastable (torch's message names the shapes), or unmergeable
        if broadcast_shapes(OP, tuple(raw.shape), batch + (H, L, S)) != batch + (H, L, S):
            raise ValueError(f"{OP}: attn_mask of shape {attn_mask.shape} does not broadcast "
                             f"to the weights' shape {batch + (H, L, S)}") from None
        return False


@scaled_dot_product_attention.fused("flash_attention")
def _(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
      enable_gqa=False):
    # flash attention where it applies: q, k, v of one batch shape (heads apart, with GQA),
    # float32 / float16 / bfloat16, head dims up to 128, dropout below 1, nothing empty, and a
    # mask that takes no gradient (a differentiated mask is an L x S input anyway: the
    # composite gives its gradient)
    if _autocast.dtype:
        query, key, value, attn_mask = _autocast_args(query, key, value, attn_mask)
    scale, group = _check(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    q, k, v = query, key, value
    L, S, E, Ev = q.shape[-2], k.shape[-2], q.shape[-1], v.shape[-1]
    batch = q.shape[:-3] if q.ndim >= 3 else ()
    H = q.shape[-3] if q.ndim >= 3 else 1
    kv_batch = k.shape[:-3] if k.ndim >= 3 else ()
    Hk = k.shape[-3] if k.ndim >= 3 else 1
    mask = _fused_mask(attn_mask, batch, H, L, S) if attn_mask is not None and \
        not attn_mask.requires_grad else None
    if q.dtype.name not in FUSED_DTYPES or max(E, Ev) > FUSED_MAX_HEAD_DIM or \
            dropout_p >= 1.0 or 0 in (L, S, E, Ev, H) or q.numel() == 0 or \
            kv_batch != batch or q.ndim != k.ndim or Hk * group != H or mask is False or \
            (attn_mask is not None and attn_mask.requires_grad):
        return scaled_dot_product_attention.composed(query, key, value, attn_mask, dropout_p,
                                                     is_causal, scale, enable_gqa)
    q4 = reshape(q, (-1, H, L, E))
    k4 = reshape(k, (-1, Hk, S, E))
    v4 = reshape(v, (-1, Hk, S, Ev))
    out = FlashAttention.apply(q4, k4, v4, mask, scale, bool(is_causal), float(dropout_p))
    return reshape(out, q.shape[:-1] + (Ev,))
