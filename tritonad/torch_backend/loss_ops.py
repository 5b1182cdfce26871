"""Handlers for embedding (its dense backward deterministic: sorted segment sums), the losses
(nll_loss and nll_loss2d, mse_loss, binary_cross_entropy with and without logits) and dropout.
See nn_ops.py for the conventions.
"""
from __future__ import annotations

import torch

from .nn_ops import _FLOATS, B, as_rows, dtype_of, handler
from .registry import Fallback, register


# ------------------------------------------------------------------------------------ embedding


@register("aten::embedding.default")
def embedding(weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    if weight.dim() != 2 or indices.dtype not in (torch.int64, torch.int32):
        raise Fallback(f"embedding: weight {tuple(weight.shape)}, indices {indices.dtype}")
    checked = B.index_check(indices, weight.shape[0], "embedding", False)
    if weight.device.type == "cpu":
        # IndexError now, as PyTorch's CPU kernel; on a GPU the error flag is read at the next
        # host read of the device (PyTorch's own check there is an asynchronous device assert)
        B.check_errors(weight.device)
    return B.gather_rows(weight, checked)


@register("aten::embedding_dense_backward.default")
def embedding_dense_backward(dy, indices, num_weights, padding_idx, scale_grad_by_freq):
    # the rows of dy summed by index, sorted and in a fixed order (deterministic, no atomics);
    # row padding_idx gets no gradient
    if scale_grad_by_freq:
        raise Fallback("embedding_dense_backward: scale_grad_by_freq")
    if indices.dtype not in (torch.int64, torch.int32):
        raise Fallback(f"embedding_dense_backward: indices {indices.dtype}")
    n = indices.numel()
    index = indices if indices.is_contiguous() else B.contiguous(indices)
    src = as_rows(dy, n, dy.shape[-1])
    return B.scatter_reduce_rows(src, index.view(n), None, int(num_weights), "sum", False,
                                 int(padding_idx), "embedding")


# ---------------------------------------------------------------------------------------- losses
# nll_loss: loss_i = -w[t_i] x[i, t_i] over the rows whose target is not ignore_index; mean
# divides by the sum of those weights (total_weight). Its gradient is that weight, negated,
# scattered into zeros at the targets.

_REDUCTIONS = {0: "none", 1: "mean", 2: "sum"}


def _nll_parts(op, x, target, weight, ignore_index):
    """(rows [N, C], safe target [N, 1], w_t [N] float: the class weight of each row's target,
    0 where ignored)."""
    if x.dtype not in _FLOATS or target.dtype not in (torch.int64, torch.int32):
        raise Fallback(f"{op}: {x.dtype} input, {target.dtype} target")
    if x.dim() == 1:
        x, target = x.unsqueeze(0), target.unsqueeze(0)
    if x.dim() != 2 or target.dim() != 1 or x.shape[0] == 0:
        raise Fallback(f"{op}: input {tuple(x.shape)}, target {tuple(target.shape)}")
    B.check_targets(target, x.shape[1], int(ignore_index), "nll_loss")
    if x.device.type == "cpu":  # a bad target now (PyTorch then raises its own IndexError)
        B.check_errors(x.device)
    kept = B.ne(target, int(ignore_index))
    # (clamped: a bad target on a GPU is reported by the error flags at the next host read,
    # and never reads outside the row meanwhile)
    safe = B.clamp(B.where(kept, target, 0), 0, x.shape[1] - 1)
    if weight is not None:
        w_t = B.mul(B.gather_rows(weight, safe), kept)
    else:
        w_t = B.cast(kept, dtype_of(x.dtype))
    return x, safe.view(-1, 1), w_t


@handler("aten::nll_loss_forward.default")
def nll_loss_forward(x, target, weight, reduction, ignore_index):
    rows, safe, w_t = _nll_parts("nll_loss", x, target, weight, ignore_index)
    losses = B.neg(B.mul(B.gather_along(rows, safe, 1).view(-1), w_t))
    kind = _REDUCTIONS[int(reduction)]
    if kind == "none":
        out = losses if x.dim() == 2 else losses.view(())
        return out, torch.empty((), dtype=x.dtype, device=x.device)
    total = B.sum(w_t)
    out = B.sum(losses)
    if kind == "mean":
        out = B.div(out, total)
    return out, total


@handler("aten::nll_loss_backward.default")
def nll_loss_backward(dy, x, target, weight, reduction, ignore_index, total_weight):
    rows, safe, w_t = _nll_parts("nll_loss_backward", x, target, weight, ignore_index)
    kind = _REDUCTIONS[int(reduction)]
    g = dy.view(-1) if kind == "none" else dy.view(1)
    if kind == "mean":
        g = B.div(g, total_weight.view(1))
    src = B.neg(B.mul(w_t, g))
    if src.dtype != x.dtype:
        src = B.cast(src, dtype_of(x.dtype))
    dx = B.scatter_add_along(src.view(-1, 1), safe, 1, rows.shape[1])
    return dx.view(x.shape)


def _nll2d_rows(x, target):
    """[N, C, H, W] scores and [N, H, W] targets as [N*H*W, C] rows and [N*H*W] targets."""
    if x.dim() != 4 or target.dim() != 3:
        raise Fallback(f"nll_loss2d: input {tuple(x.shape)}, target {tuple(target.shape)}")
    n, c, h, w = x.shape
    rows = B.contiguous(x.permute(0, 2, 3, 1)).view(n * h * w, c)
    t = target if target.is_contiguous() else B.contiguous(target)
    return rows, t.view(n * h * w)


@handler("aten::nll_loss2d_forward.default")
def nll_loss2d_forward(x, target, weight, reduction, ignore_index):
    rows, t = _nll2d_rows(x, target)
    out, total = nll_loss_forward(rows, t, weight, reduction, ignore_index)
    if _REDUCTIONS[int(reduction)] == "none":
        out = out.view(target.shape)
    return out, total


@handler("aten::nll_loss2d_backward.default")
def nll_loss2d_backward(dy, x, target, weight, reduction, ignore_index, total_weight):
    rows, t = _nll2d_rows(x, target)
    if _REDUCTIONS[int(reduction)] == "none":
        dy = B.contiguous(dy).view(-1) if not dy.is_contiguous() else dy.view(-1)
    d = nll_loss_backward(dy, rows, t, weight, reduction, ignore_index, total_weight)
    n, c, h, w = x.shape
    return B.contiguous(d.view(n, h, w, c).permute(0, 3, 1, 2))


def _same_shape(op, a, b):
    if tuple(a.shape) != tuple(b.shape) or a.dtype not in _FLOATS or a.dtype != b.dtype:
        raise Fallback(f"{op}: {tuple(a.shape)} {a.dtype} against {tuple(b.shape)} {b.dtype}")


def _reduce(op, losses, reduction):
    kind = _REDUCTIONS[int(reduction)]
    if kind == "none":
        return losses
    if losses.numel() == 0:
        raise Fallback(f"{op}: an empty input reduced")
    return B.mean(losses) if kind == "mean" else B.sum(losses)


def _seed(dy, x, reduction):
    """The incoming gradient per element: dy itself for "none", else dy (/ numel for mean)
    broadcast over x."""
    kind = _REDUCTIONS[int(reduction)]
    if kind == "none":
        return dy
    g = B.div(dy, x.numel()) if kind == "mean" else dy
    return g.view((1,) * x.dim()).expand(x.shape) if x.dim() else g


@handler("aten::mse_loss.default")
def mse_loss(x, target, reduction=1):
    _same_shape("mse_loss", x, target)
    d = B.sub(x, target)
    return _reduce("mse_loss", B.mul(d, d), reduction)


@handler("aten::mse_loss_backward.default")
def mse_loss_backward(dy, x, target, reduction):
    # d/dx (x - t)^2 = 2 (x - t)
    _same_shape("mse_loss_backward", x, target)
    return B.mul(B.mul(B.sub(x, target), 2.0), _seed(dy, x, reduction))


@handler("aten::binary_cross_entropy.default")
def binary_cross_entropy(x, target, weight=None, reduction=1):
    # loss = -w (t log x + (1 - t) log(1 - x)), each log clamped at -100 as PyTorch
    _same_shape("binary_cross_entropy", x, target)
    log_x = B.clamp(B.log(x), min=-100.0)
    log_1mx = B.clamp(B.log(B.sub(1.0, x)), min=-100.0)
    losses = B.neg(B.add(B.mul(target, log_x), B.mul(B.sub(1.0, target), log_1mx)))
    if weight is not None:
        losses = B.mul(losses, weight)
        losses = losses if losses.dtype == x.dtype else B.cast(losses, dtype_of(x.dtype))
    return _reduce("binary_cross_entropy", losses, reduction)


@handler("aten::binary_cross_entropy_backward.default")
def binary_cross_entropy_backward(dy, x, target, weight=None, reduction=1):
    # d/dx = w (x - t) / max(x (1 - x), 1e-12), PyTorch's guard against a zero denominator
    _same_shape("binary_cross_entropy_backward", x, target)
    denom = B.clamp(B.mul(x, B.sub(1.0, x)), min=1e-12)
    g = B.div(B.sub(x, target), denom)
    if weight is not None:
        g = B.mul(g, weight)
    g = B.mul(g, _seed(dy, x, reduction))
    return g if g.dtype == x.dtype else B.cast(g, dtype_of(x.dtype))


@handler("aten::binary_cross_entropy_with_logits.default")
def binary_cross_entropy_with_logits(x, target, weight=None, pos_weight=None, reduction=1):
    # loss = (1 - t) x + (1 + (pw - 1) t) (log(1 + exp(-|x|)) + max(-x, 0)), stable for any x
    _same_shape("binary_cross_entropy_with_logits", x, target)
    soft = B.add(B.log1p(B.exp(B.neg(B.abs(x)))), B.relu(B.neg(x)))
    scale = B.add(B.mul(B.sub(pos_weight, 1.0), target), 1.0) if pos_weight is not None else 1.0
    losses = B.add(B.mul(B.sub(1.0, target), x), B.mul(scale, soft))
    if weight is not None:
        losses = B.mul(losses, weight)
    if losses.dtype != x.dtype or tuple(losses.shape) != tuple(x.shape):
        raise Fallback("binary_cross_entropy_with_logits: broadcast weights")
    return _reduce("binary_cross_entropy_with_logits", losses, reduction)


# -------------------------------------------------------------------------------------- dropout
# kernels/random.py's Philox dropout, drawn from tritonad's own stream (td.manual_seed): the
# same probability law as PyTorch's, not the same bits.


@register("aten::native_dropout.default")
def native_dropout(x, p, train):
    from .. import generator
    if x.dtype not in _FLOATS:
        raise Fallback(f"native_dropout: {x.dtype} input")
    if train is False or x.numel() == 0:
        keep = torch.empty(tuple(x.shape), dtype=torch.bool, device=x.device)
        return B.contiguous(x), B.fill_(keep, True)
    seed, offset = generator.take(x.numel())
    return B.dropout(x, float(p), seed, offset)


@register("aten::native_dropout_backward.default")
def native_dropout_backward(dy, mask, scale):
    # dx = dy * mask * scale (scale = 1 / (1 - p))
    if not dy.dtype.is_floating_point:  # (PyTorch promotes an integer dy to float here)
        raise Fallback(f"native_dropout_backward: a {dy.dtype} gradient")
    dx = B.where(mask, B.mul(dy, float(scale)), 0.0)
    return dx if dx.dtype == dy.dtype else B.cast(dx, dtype_of(dy.dtype))
