"""Handlers for the attention operators `F.scaled_dot_product_attention` dispatches to: on CUDA
the flash, memory-efficient and cuDNN forms (whichever PyTorch's selection picks), on a CPU the
flash form for CPU; each forward and backward on tritonad's flash attention
(kernels/attention.py: FlashAttention-2, O and the log-sum-exp written, P recomputed per tile in
the backward).

Each returns aten's tuple: the output in the memory layout PyTorch's kernel gives it
([B, L, H, Ev] underneath a [B, H, L, Ev] view; the flash forms: q's layout), and the
log-sum-exp in natural log, in the shape the form keeps ([B, H, L]; the memory-efficient form
pads L to a multiple of 32, cuDNN's is [B, H, L, 1]), so PyTorch's backward formula (ours, or
its own kernel after a fallback) reads what it expects. tritonad keeps the log-sum-exp in base
2; the handlers convert it (one multiply each way).

Dropout on the attention weights draws its keep mask from tritonad's Philox stream
(td.manual_seed; the same law as PyTorch's, not the same bits). aten hands the forward's random
state to the backward as the tensors the forward returned (flash: rng_state; memory-efficient
and cuDNN: philox_seed), so a forward with dropout returns a small device tensor of its own there and keeps
(seed, offset) in a table under that tensor's address; the backward reads the table, not the
device (no host synchronisation). The CPU flash form has no such tensor (PyTorch runs dropout on
a CPU through its math path) and falls back with dropout, as do a bias that needs a gradient and
a head dimension above kernels/attention.py's MAX_HEAD_DIM.
"""
from __future__ import annotations

import collections
import math

import torch

from ..kernels.attention import MAX_HEAD_DIM
from .nn_ops import B, handler
from .registry import Fallback

LN2 = math.log(2.0)
_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


# (seed, offset) of the forwards with dropout, under (device, address) of the tensor they
# returned for it; the oldest entries go first (a step's forwards outlive their backwards)
_DRAWS: collections.OrderedDict = collections.OrderedDict()
_DRAWS_KEPT = 4096


def _draw(q, k, dropout_p):
    """(seed, offset, rng tensor) for a forward's dropout: the weights' B * H * L * S draws
    taken from tritonad's stream, remembered under a new 2-element device tensor."""
    from .. import generator
    if not dropout_p:
        return 0, 0, torch.empty((2,), dtype=torch.int64, device=q.device)
    b, h, l_q = q.shape[:3]
    seed, offset = generator.take(b * h * l_q * k.shape[2])
    rng = torch.empty((2,), dtype=torch.int64, device=q.device)
    _DRAWS[(rng.device, rng.data_ptr())] = (seed, offset)
    while len(_DRAWS) > _DRAWS_KEPT:
        _DRAWS.popitem(last=False)
    return seed, offset, rng


def _drawn(op, rng, dropout_p):
    """(seed, offset) a forward with dropout kept under its rng tensor."""
    if not dropout_p:
        return 0, 0
    found = _DRAWS.get((rng.device, rng.data_ptr())) if rng is not None and rng.numel() else None
    if found is None:
        raise Fallback(f"{op}: dropout from a forward tritonad did not run")
    return found


def _check(op, q, k, v, mask, dropout_p, dropout_ok=True):
    if dropout_p and not dropout_ok:
        raise Fallback(f"{op}: dropout_p={dropout_p} (PyTorch runs it through its math path)")
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise Fallback(f"{op}: {q.dim()}-d operands")
    if q.dtype not in _DTYPES or k.dtype != q.dtype or v.dtype != q.dtype:
        raise Fallback(f"{op}: dtypes {q.dtype}, {k.dtype}, {v.dtype}")
    if max(q.shape[-1], v.shape[-1]) > MAX_HEAD_DIM or q.shape[1] % k.shape[1]:
        raise Fallback(f"{op}: head dims {q.shape[-1]}, {v.shape[-1]}, heads {q.shape[1]} over "
                       f"{k.shape[1]}")
    if mask is None:
        return None
    if mask.dtype != torch.bool and mask.dtype != q.dtype:
        raise Fallback(f"{op}: a {mask.dtype} mask on {q.dtype} operands")
    b, h, l_q = q.shape[:3]
    return mask.expand(b, h, l_q, k.shape[2])


def _scale(q, scale):
    return float(scale) if scale is not None else 1.0 / math.sqrt(q.shape[-1])


def _blhe(shape, dtype, device):
    """Empty [B, H, L, E] memory laid out as [B, L, H, E] (PyTorch's attention outputs)."""
    b, h, l_q, e = shape
    return torch.empty_strided(shape, (l_q * h * e, e, h * e, 1), dtype=dtype, device=device)


def _forward(q, k, v, mask, scale, causal, out, dropout=(0.0, 0, 0)):
    o, lse2 = B.flash_attention(q, k, v, mask, _scale(q, scale), bool(causal), *dropout)
    if out is not None:
        o = B.copy_(out, o)
    return o, B.mul(lse2, LN2)  # base 2 -> natural log


def _backward(do, q, k, v, o, lse, mask, scale, causal, dropout=(0.0, 0, 0)):
    b, h, l_q = q.shape[:3]
    lse = lse[..., 0] if lse.dim() == 4 else lse[:, :, :l_q]  # (cuDNN's; the padded one)
    lse2 = B.mul(lse, 1.0 / LN2)
    # (the gradients contiguous: autograd takes any layout)
    return B.flash_attention_backward(do, q, k, v, o, lse2, mask, _scale(q, scale),
                                      bool(causal), *dropout)


def _out_shape(q, v):
    return tuple(q.shape[:3]) + (v.shape[-1],)


def _like_q(q, v):
    """The flash forms' output: PyTorch's empty_like of q as [B, L, H, E] (q's own layout where
    that is dense, [B, L, H, E] underneath otherwise), where the head dims agree."""
    if q.shape[-1] == v.shape[-1]:
        return torch.empty_like(q.transpose(1, 2)).transpose(1, 2)
    return _blhe(_out_shape(q, v), q.dtype, q.device)


@handler("aten::_scaled_dot_product_flash_attention_for_cpu.default")
def flash_for_cpu(q, k, v, dropout_p=0.0, is_causal=False, *, attn_mask=None, scale=None):
    mask = _check("sdpa_flash_cpu", q, k, v, attn_mask, dropout_p, dropout_ok=False)
    o, lse = _forward(q, k, v, mask, scale, is_causal, _like_q(q, v))
    b, h, l_q = lse.shape
    lse_out = torch.empty_strided((b, h, l_q), (l_q * h, 1, h), dtype=lse.dtype, device=q.device)
    return o, B.copy_(lse_out, lse)


@handler("aten::_scaled_dot_product_flash_attention_for_cpu_backward.default")
def flash_for_cpu_backward(do, q, k, v, out, lse, dropout_p, is_causal, *, attn_mask=None,
                           scale=None):
    mask = _check("sdpa_flash_cpu_backward", q, k, v, attn_mask, dropout_p, dropout_ok=False)
    return _backward(do, q, k, v, out, lse, mask, scale, is_causal)


def _empty(device, dtype=torch.int64):
    return torch.empty((0,), dtype=dtype, device=device)


@handler("aten::_scaled_dot_product_flash_attention.default")
def flash(q, k, v, dropout_p=0.0, is_causal=False, return_debug_mask=False, *, scale=None):
    _check("sdpa_flash", q, k, v, None, dropout_p)
    if return_debug_mask:
        raise Fallback("sdpa_flash: return_debug_mask")
    seed, offset, rng = _draw(q, k, dropout_p)
    o, lse = _forward(q, k, v, None, scale, is_causal, _like_q(q, v),
                      (float(dropout_p), seed, offset))
    return (o, lse, _empty(q.device, torch.int32), _empty(q.device, torch.int32), q.shape[2],
            k.shape[2], rng, _empty(q.device), _empty(q.device, q.dtype))


@handler("aten::_scaled_dot_product_flash_attention_backward.default")
def flash_backward(do, q, k, v, out, lse, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p,
                   is_causal, philox_seed, philox_offset, *, scale=None):
    _check("sdpa_flash_backward", q, k, v, None, dropout_p)
    seed, offset = _drawn("sdpa_flash_backward", philox_seed, dropout_p)
    return _backward(do, q, k, v, out, lse, None, scale, is_causal,
                     (float(dropout_p), seed, offset))


@handler("aten::_scaled_dot_product_efficient_attention.default")
def efficient(q, k, v, attn_bias, compute_log_sumexp, dropout_p=0.0, is_causal=False, *,
              scale=None):
    mask = _check("sdpa_efficient", q, k, v, attn_bias, dropout_p)
    if attn_bias is not None and attn_bias.requires_grad:  # (its backward would fall back)
        raise Fallback("sdpa_efficient: a bias that needs a gradient")
    seed, offset, rng = _draw(q, k, dropout_p)
    out = _blhe(_out_shape(q, v), q.dtype, q.device)
    o, lse = _forward(q, k, v, mask, scale, is_causal, out, (float(dropout_p), seed, offset))
    b, h, l_q = lse.shape
    if compute_log_sumexp:  # the memory-efficient kernel's [B, H, L rounded up to 32]
        padded = torch.empty((b, h, -(-l_q // 32) * 32), dtype=lse.dtype, device=q.device)
        B.copy_(padded[:, :, :l_q], lse)
        lse = padded
    else:
        lse = torch.empty((b, h, 0), dtype=lse.dtype, device=q.device)
    return o, lse, rng[0], rng[1]  # (philox_seed: the draw's key)


@handler("aten::_scaled_dot_product_efficient_attention_backward.default")
def efficient_backward(do, q, k, v, attn_bias, out, lse, philox_seed, philox_offset, dropout_p,
                       grad_input_mask, is_causal=False, *, scale=None):
    mask = _check("sdpa_efficient_backward", q, k, v, attn_bias, dropout_p)
    if len(grad_input_mask) > 3 and grad_input_mask[3]:
        raise Fallback("sdpa_efficient_backward: the bias's gradient")
    if lse.shape[-1] < q.shape[2]:
        raise Fallback("sdpa_efficient_backward: no log-sum-exp saved")
    seed, offset = _drawn("sdpa_efficient_backward", philox_seed, dropout_p)
    return _backward(do, q, k, v, out, lse, mask, scale, is_causal,
                     (float(dropout_p), seed, offset)) + (None,)


@handler("aten::_scaled_dot_product_cudnn_attention.default")
def cudnn(q, k, v, attn_bias, compute_log_sumexp, dropout_p=0.0, is_causal=False,
          return_debug_mask=False, *, scale=None):
    mask = _check("sdpa_cudnn", q, k, v, attn_bias, dropout_p)
    if attn_bias is not None and attn_bias.requires_grad:
        raise Fallback("sdpa_cudnn: a bias that needs a gradient")
    if return_debug_mask:
        raise Fallback("sdpa_cudnn: return_debug_mask")
    seed, offset, rng = _draw(q, k, dropout_p)
    o, lse = _forward(q, k, v, mask, scale, is_causal,
                      _blhe(_out_shape(q, v), q.dtype, q.device), (float(dropout_p), seed, offset))
    lse = lse.unsqueeze(-1)  # cuDNN's softmax statistics: [B, H, L, 1]
    return (o, lse, _empty(q.device, torch.int32), _empty(q.device, torch.int32), q.shape[2],
            k.shape[2], rng, _empty(q.device), _empty(q.device, q.dtype))


@handler("aten::_scaled_dot_product_cudnn_attention_backward.default")
def cudnn_backward(do, q, k, v, out, lse, philox_seed, philox_offset, attn_bias, cum_seq_q,
                   cum_seq_k, max_q, max_k, dropout_p, is_causal, *, scale=None):
    mask = _check("sdpa_cudnn_backward", q, k, v,
                  attn_bias if attn_bias is not None and attn_bias.numel() else None, dropout_p)
    seed, offset = _drawn("sdpa_cudnn_backward", philox_seed, dropout_p)
    return _backward(do, q, k, v, out, lse, mask, scale, is_causal,
                     (float(dropout_p), seed, offset))
