"""Losses, similarities and vector norms as composites of Tensor ops (their gradients come from
their parts), with PyTorch's arguments: binary cross-entropy (on probabilities and on logits),
L1, smooth L1, Huber, KL divergence, cross-entropy and NLL with class weights, probability
targets and k-dimensional inputs, cosine similarity, pairwise distance, vector norms.

Every formula here is elementwise work, gathers and sums, so each runs as several launches of
the elementwise table's kernel and the reduction kernel, each launch reading its operands and
writing its result once (a loss of k ops moves about k times the bytes of one fused pass);
`bench losses` measures them against PyTorch's. Logits [N, C] with class indices and no weight
go to the fused cross-entropy kernel (nn_ops.cross_entropy).

The one Function is binary cross-entropy, whose value is composed but whose derivative is
PyTorch's closed form: the composite's own derivative at a probability of exactly 0 or 1
would be 0 * inf through the clamped logarithm.
"""
from __future__ import annotations

import math
import numbers

import torch

from .. import dtypes
from ..backend import backend_of
from ..tensor import Tensor, arange
from . import nn_ops
from .autocast import float32_op
from .dims import broadcast_shapes, normalize_dims
from .elementwise import exp, log, logical_and, softplus, sqrt, where
from .function import Function
from .grad_mode import no_grad
from .shape_ops import gather_rows, permute, reshape, unsqueeze

__all__ = ["binary_cross_entropy", "binary_cross_entropy_with_logits", "l1_loss",
           "smooth_l1_loss", "huber_loss", "kl_div", "cross_entropy", "nll_loss",
           "cosine_similarity", "pairwise_distance", "vector_norm"]

_REDUCTIONS = ("none", "mean", "sum")
_INDEX_TYPES = (torch.int64, torch.int32)


def _reduction(op, size_average, reduce, reduction, allowed=_REDUCTIONS):
    """The reduction, from PyTorch's legacy size_average / reduce flags where either is given."""
    if size_average is not None or reduce is not None:
        size_average = True if size_average is None else size_average
        reduce = True if reduce is None else reduce
        return "none" if not reduce else ("mean" if size_average else "sum")
    if reduction not in allowed:
        raise ValueError(f"{op}: reduction must be one of {allowed}, got {reduction!r}")
    return reduction


def _reduce(losses, reduction):
    if reduction == "none":
        return losses
    return losses.sum() if reduction == "sum" else losses.mean()


def _tensors(op, *named):
    """Each (name, value) a floating point Tensor, or a clear TypeError."""
    for name, t in named:
        if not isinstance(t, Tensor):
            raise TypeError(f"{op}: {name} must be a Tensor, got {type(t).__name__}")
        if not t.dtype.is_floating_point:
            raise TypeError(f"{op}: {name} must be floating point, got {t.dtype.name} of shape "
                            f"{t.shape}")


def _fits(op, name, t, shape):
    """t: a floating point Tensor that broadcasts to `shape`, or a clear error naming it."""
    _tensors(op, (name, t))
    try:
        fits = broadcast_shapes(op, shape, t.shape) == tuple(shape)
    except ValueError:
        fits = False
    if not fits:
        raise ValueError(f"{op}: {name} of shape {t.shape} does not broadcast to input of "
                         f"shape {shape}")


def _pair(op, input, target):
    """input and target: floating point, broadcastable (as PyTorch's pointwise losses)."""
    _tensors(op, ("input", input), ("target", target))
    broadcast_shapes(op, input.shape, target.shape)


# ---------------------------------------------------------------------------- binary


class BinaryCrossEntropy(Function):
    """l = -w [t log(x) + (1 - t) log(1 - x)], each log clamped at -100 (as PyTorch), so that a
    probability of exactly 0 or 1 gives a finite loss. x, t, w broadcast; w may be None.

    Backward (PyTorch's closed forms, in Tensor ops: differentiable again):
    dl/dx = w (x - t) / max(x (1 - x), 1e-12);  dl/dt = w [log(1 - x) - log(x)] (NOTE: logs
    not clamped there, as PyTorch: +-inf at a probability of 0 or 1);  dl/dw = l / w.
    """

    @staticmethod
    def _logs(x):
        return log(x).clamp(min=-100.0), log(1.0 - x).clamp(min=-100.0)

    @staticmethod
    def forward(ctx, x, t, w):
        with no_grad():
            X, T = Tensor._wrap(x), Tensor._wrap(t)
            log_x, log_1mx = BinaryCrossEntropy._logs(X)
            loss = -(T * log_x + (1.0 - T) * log_1mx)
            if w is not None:
                loss = loss * Tensor._wrap(w)
        ctx.save_for_backward(x, t, w)
        return loss._data

    @staticmethod
    def backward(ctx, dy):
        x, t, w = ctx.saved
        needs = ctx.needs_input_grad
        scale = dy if w is None else dy * w
        dx = dt = dw = None
        if needs[0]:
            dx = scale * (x - t) / (x * (1.0 - x)).clamp(min=1e-12)
        if needs[1]:
            dt = scale * (log(1.0 - x) - log(x))
        if needs[2]:
            log_x, log_1mx = BinaryCrossEntropy._logs(x)
            dw = -dy * (t * log_x + (1.0 - t) * log_1mx)
        return dx, dt, dw


def binary_cross_entropy(input, target, weight=None, size_average=None, reduce=None,
                         reduction="mean"):
    """-w [t log(x) + (1 - t) log(1 - x)] of probabilities x, logs clamped at -100, reduced.
    input, target: same shape; weight: broadcasts to it.
    `F.binary_cross_entropy(td.sigmoid(z), t)`"""
    op = "binary_cross_entropy"
    reduction = _reduction(op, size_average, reduce, reduction)
    _tensors(op, ("input", input), ("target", target))
    if target.shape != input.shape:
        raise ValueError(f"{op}: target of shape {target.shape} differs from input of shape "
                         f"{input.shape}; they must have the same shape")
    if weight is not None:
        _fits(op, "weight", weight, input.shape)
        weight = weight.expand(*input.shape)
    if input.device.type == "cpu" and input.numel():  # (reading back is free here; on a GPU
        # it would cost a sync per call, and a probability outside [0, 1] gives a NaN loss)
        inside = logical_and(input >= 0, input <= 1).all()
        if not inside.item():
            raise ValueError(f"{op}: every element of input (shape {input.shape}) must be a "
                             "probability in [0, 1]")
    return _reduce(BinaryCrossEntropy.apply(input, target.to(input.dtype), weight), reduction)


def binary_cross_entropy_with_logits(input, target, weight=None, size_average=None, reduce=None,
                                     reduction="mean", pos_weight=None):
    """Binary cross-entropy of sigmoid(x), computed stably from the logits x:
    l = w [(1 - t) x + (1 + (p - 1) t) softplus(-x)], p = pos_weight (broadcast along the last
    dim, the classes). softplus(-x) = log(1 + exp(-x)) never overflows; its derivative is
    -sigmoid(-x), so dl/dx = w [(1 - t) - (1 + (p - 1) t) sigmoid(-x)] (= w (sigmoid(x) - t)
    without pos_weight). input, target: same shape."""
    op = "binary_cross_entropy_with_logits"
    reduction = _reduction(op, size_average, reduce, reduction)
    _tensors(op, ("input", input), ("target", target))
    if target.shape != input.shape:
        raise ValueError(f"{op}: target size {target.shape} must be the same as input size "
                         f"{input.shape}")
    for name, t in (("weight", weight), ("pos_weight", pos_weight)):
        if t is not None:
            _fits(op, name, t, input.shape)
    log_weight = 1.0 if pos_weight is None else 1.0 + (pos_weight - 1.0) * target
    losses = (1.0 - target) * input + log_weight * softplus(-input)
    if weight is not None:
        losses = losses * weight
    return _reduce(losses, reduction)


# ---------------------------------------------------------------------------- regression


def l1_loss(input, target, size_average=None, reduce=None, reduction="mean"):
    """|input - target| (broadcast), reduced. NOTE: the gradient at input == target is 0, as
    PyTorch's sign(0)."""
    reduction = _reduction("l1_loss", size_average, reduce, reduction)
    _pair("l1_loss", input, target)
    return _reduce((input - target).abs(), reduction)


def smooth_l1_loss(input, target, size_average=None, reduce=None, reduction="mean", beta=1.0):
    """0.5 d^2 / beta where d = |input - target| < beta, d - 0.5 beta elsewhere (L1 for
    beta = 0), reduced."""
    op = "smooth_l1_loss"
    reduction = _reduction(op, size_average, reduce, reduction)
    _pair(op, input, target)
    if beta < 0:
        raise ValueError(f"{op}: beta must be non-negative, got {beta}")
    d = (input - target).abs()
    if beta == 0:
        return _reduce(d, reduction)
    return _reduce(where(d < beta, (0.5 / beta) * d * d, d - 0.5 * beta), reduction)


def huber_loss(input, target, reduction="mean", delta=1.0, weight=None):
    """0.5 d^2 where d = |input - target| < delta, delta (d - 0.5 delta) elsewhere, reduced
    (weight, where given, multiplies each element's loss first)."""
    op = "huber_loss"
    reduction = _reduction(op, None, None, reduction)
    _pair(op, input, target)
    if not delta > 0:
        raise ValueError(f"{op}: delta must be positive, got {delta}")
    d = (input - target).abs()
    losses = where(d < delta, 0.5 * d * d, delta * (d - 0.5 * delta))
    if weight is not None:
        _fits(op, "weight", weight, losses.shape)
        losses = losses * weight
    return _reduce(losses, reduction)


def kl_div(input, target, size_average=None, reduce=None, reduction="mean", log_target=False):
    """KL(target || exp(input)) pointwise, input given as log-probabilities:
    t (log t - input) (0 where t = 0), or exp(t) (t - input) with log_target. reduction
    "batchmean" divides the sum by the batch size input.shape[0] (the true KL divergence);
    "mean" averages over every element, as PyTorch."""
    op = "kl_div"
    reduction = _reduction(op, size_average, reduce, reduction, _REDUCTIONS + ("batchmean",))
    _pair(op, input, target)
    if log_target:
        losses = exp(target) * (target - input)
    else:
        # xlogy(t, t): the logarithm of 1 where t = 0, so no 0 * -inf reaches either pass
        zero = target == 0
        losses = where(zero, 0.0, target * log(where(zero, 1.0, target))) - target * input
    if reduction == "batchmean":
        total = losses.sum()
        return total / input.shape[0] if input.ndim else total
    return _reduce(losses, reduction)


# ---------------------------------------------------------------------------- classes


def _class_weight(op, weight, classes):
    if weight is None:
        return None
    _tensors(op, ("weight", weight))
    if weight.shape != (classes,):
        raise ValueError(f"{op}: weight of shape {weight.shape} must have one entry per class "
                         f"({classes})")
    return weight


def _rows_last(op, input, target):
    """input [N, C, d1, ...] and target [N, d1, ...] as [M, C] rows and [M] targets, classes
    last (a copy where the input is k-dimensional)."""
    if input.ndim < 2:
        raise ValueError(f"{op}: expected input [N, C, ...] or [C], got {input.shape}")
    want = input.shape[:1] + input.shape[2:]
    if target.shape != want:
        raise ValueError(f"{op}: expected target of shape {want} for input of shape "
                         f"{input.shape}, got {target.shape}")
    if input.ndim > 2:
        input = permute(input, (0,) + tuple(range(2, input.ndim)) + (1,))
    return reshape(input, (-1, input.shape[-1])), reshape(target, (-1,))


def _check_index_target(op, target):
    if not isinstance(target, Tensor) or target.dtype not in (dtypes.int64, dtypes.int32):
        got = target.dtype.name if isinstance(target, Tensor) else type(target).__name__
        raise TypeError(f"{op}: target must be an int64 tensor of class indices, got {got}")


def _picked(op, log_probs, target, weight, ignore_index):
    """For each row i of log_probs [M, C]: -w[t_i] log_probs[i, t_i], and w[t_i] (1 without a
    weight), both 0 where t_i is ignore_index. A class index out of range is reported as
    nll_loss's (at the next read of the device on the triton backend)."""
    m, c = log_probs.shape
    backend_of(target._data).check_targets(target._data, c, ignore_index, op)
    kept = (target != ignore_index) * (target >= 0) * (target < c)
    safe = where(kept, target, 0)
    picked = gather_rows(reshape(log_probs, (-1,)), arange(m, device=log_probs.device) * c + safe)
    if weight is None:
        w = kept.to(log_probs.dtype)
    else:
        w = where(kept, gather_rows(weight.to(log_probs.dtype), safe), 0.0)
    return where(kept, -picked * w, 0.0), w


def nll_loss(input, target, weight=None, size_average=None, ignore_index=-100, reduce=None,
             reduction="mean"):
    """-w[t] input[t] for log-probabilities input [N, C, d1, ...] (or [C]) and class indices
    target [N, d1, ...] (or []), reduced; "mean" divides by the sum of the weights of the
    targets counted. Targets equal to ignore_index count as absent."""
    if weight is None and size_average is None and reduce is None and \
            isinstance(input, Tensor) and input._data.dim() == 2:
        return nn_ops.nll_loss(input, target, reduction, ignore_index)  # (checks the rest)
    op = "nll_loss"
    reduction = _reduction(op, size_average, reduce, reduction)
    _tensors(op, ("input", input))
    _check_index_target(op, target)
    if weight is None and input.ndim == 2:
        return nn_ops.nll_loss(input, target, reduction, ignore_index)
    if input.ndim == 1:
        out = nll_loss(unsqueeze(input, 0), unsqueeze(target, 0), weight, None, ignore_index,
                       None, reduction)
        return reshape(out, ()) if reduction == "none" else out
    rows, flat = _rows_last(op, input, target)
    losses, w = _picked(op, rows, flat, _class_weight(op, weight, input.shape[1]), ignore_index)
    if reduction == "none":
        return reshape(losses, target.shape)
    return losses.sum() if reduction == "sum" else losses.sum() / w.sum()


def cross_entropy(input, target, weight=None, size_average=None, ignore_index=-100, reduce=None,
                  reduction="mean", label_smoothing=0.0):
    """Softmax cross-entropy of logits input [N, C, d1, ...] (or [C]) against class indices
    [N, d1, ...] or class probabilities of input's shape, as PyTorch:

    indices: l_i = -(1 - e) w[t_i] logp[i, t_i] - (e / C) sum_c w_c logp[i, c], where e is
      label_smoothing; "mean" divides each part by the sum of w[t_i] over the rows counted
      (rows whose target is ignore_index give 0 and count as absent).
    probabilities: l_i = -sum_c w_c q[i, c] logp[i, c] with q = (1 - e) target + e / C;
      "mean" divides by the number of rows.

    Logits [N, C] with class indices and no weight run the fused kernel (one pass each way);
    the rest is composed of log_softmax, a gather and sums."""
    if weight is None and size_average is None and reduce is None and \
            isinstance(input, Tensor) and isinstance(target, Tensor):
        x, t = input._data, target._data  # (the common case, straight to the fused kernel,
        if x.dim() == 2 and t.dim() == 1 and t.dtype in _INDEX_TYPES:  # which checks the rest)
            return nn_ops.cross_entropy(input, target, reduction, ignore_index, label_smoothing)
    op = "cross_entropy"
    reduction = _reduction(op, size_average, reduce, reduction)
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"{op}: label_smoothing must be in [0, 1], got {label_smoothing}")
    _tensors(op, ("input", input))
    if not isinstance(target, Tensor):
        raise TypeError(f"{op}: target must be a Tensor, got {type(target).__name__}")
    probabilities = target.dtype.is_floating_point
    if probabilities and target.shape != input.shape:
        raise TypeError(f"{op}: target must be an int64 tensor of class indices, or class "
                        f"probabilities of input's shape {input.shape}; got {target.dtype.name} "
                        f"of shape {target.shape}")
    if weight is None and not probabilities and input.ndim <= 2:
        return nn_ops.cross_entropy(input, target, reduction, ignore_index, label_smoothing)
    if input.ndim == 0:
        raise ValueError(f"{op}: expected input [N, C, ...] or [C], got a 0-d tensor")
    class_dim = 0 if input.ndim == 1 else 1
    classes = input.shape[class_dim]
    weight = _class_weight(op, weight, classes)
    log_probs = nn_ops.log_softmax(input, class_dim)
    w_bcast = None if weight is None else \
        reshape(weight.to(input.dtype), (classes,) + (1,) * (input.ndim - class_dim - 1))
    if probabilities:
        q = target.to(input.dtype)
        if label_smoothing > 0:
            q = q * (1.0 - label_smoothing) + label_smoothing / classes
        terms = log_probs * q if w_bcast is None else log_probs * q * w_bcast
        losses = -terms.sum(class_dim)
        if reduction == "mean":
            return losses.sum() / (input.numel() // classes if classes else 0)
        return _reduce(losses, reduction)
    _check_index_target(op, target)
    if input.ndim == 1:
        out = cross_entropy(unsqueeze(input, 0), unsqueeze(target, 0), weight, None,
                            ignore_index, None, reduction, label_smoothing)
        return reshape(out, ()) if reduction == "none" else out
    rows, flat = _rows_last(op, log_probs, target)
    nll, w = _picked(op, rows, flat, weight, ignore_index)
    if label_smoothing > 0:
        kept = w != 0 if weight is None else (flat != ignore_index)
        spread = rows if weight is None else rows * weight.to(input.dtype)
        smooth = where(kept, -spread.sum(1), 0.0)
        if reduction == "none":
            losses = nll * (1.0 - label_smoothing) + smooth * (label_smoothing / classes)
            return reshape(losses, target.shape)
        nll, smooth = nll.sum(), smooth.sum()
        if reduction == "mean":
            total = w.sum()
            nll, smooth = nll / total, smooth / total
        return nll * (1.0 - label_smoothing) + smooth * (label_smoothing / classes)
    if reduction == "none":
        return reshape(nll, target.shape)
    return nll.sum() if reduction == "sum" else nll.sum() / w.sum()


# ---------------------------------------------------------------------------- norms, similarity


def _safe_root(s, root):
    """s ** (1 / root) with 0 (and a gradient of 0, not 0 * inf) where s == 0."""
    zero = s == 0
    safe = where(zero, 1.0, s)
    r = sqrt(safe) if root == 2 else safe ** (1.0 / root)
    return where(zero, 0.0, r)


def vector_norm(x, ord=2, dim=None, keepdim=False, *, dtype=None):
    """The vector ord-norm of x over dim (every element by default), as torch.linalg.
    vector_norm: ord 2 (sqrt of the sum of squares), 1, inf (max |x|), -inf (min |x|), 0 (the
    count of nonzeros) or any other real p (sum |x|^p)^(1/p). NOTE: the gradient of a norm
    of all zeros is 0, as PyTorch's.  `td.linalg.vector_norm(x, dim=-1)`"""
    op = "linalg.vector_norm"
    if not isinstance(x, Tensor):
        raise TypeError(f"{op}: expected a Tensor, got {type(x).__name__}")
    if dtype is not None:
        x = x.to(dtype)
    if not x.dtype.is_floating_point:
        raise TypeError(f"{op}: expected a floating point tensor, got {x.dtype.name} of shape "
                        f"{x.shape}")
    if isinstance(ord, bool) or not isinstance(ord, numbers.Real):
        raise TypeError(f"{op}: ord must be a number, got {ord!r}")
    if x.dtype.itemsize == 2:  # half types: powers and sums in float32, as PyTorch (a float16
        # square overflows from 256 on, and |x|^6 underflows below 0.2)
        return vector_norm(x.float(), ord, dim, keepdim).to(x.dtype)
    dims = normalize_dims(op, dim, x.ndim)
    if math.isinf(ord):
        empty = x.numel() == 0 if dims is None else any(x.shape[d] == 0 for d in dims)
        if empty:
            raise ValueError(f"{op}: cannot compute the {ord} norm over an empty dimension of "
                             f"a tensor of shape {x.shape}")
        a = x.abs()
        return a.amax(dims, keepdim) if ord > 0 else a.amin(dims, keepdim)
    if ord == 0:
        return (x != 0).to(x.dtype).sum(dims, keepdim)
    if ord == 1:
        return x.abs().sum(dims, keepdim)
    if ord == 2:
        return _safe_root((x * x).sum(dims, keepdim), 2)
    a = x.abs()
    if ord < 0:
        return (a ** float(ord)).sum(dims, keepdim) ** (1.0 / ord)
    zero = a == 0  # (|x|^p for p < 1 has an infinite slope at 0; PyTorch's gradient there is 0)
    powers = where(zero, 0.0, where(zero, 1.0, a) ** float(ord))
    return _safe_root(powers.sum(dims, keepdim), float(ord))


def cosine_similarity(x1, x2, dim=1, eps=1e-8):
    """sum(x1 / max(|x1|, eps) * x2 / max(|x2|, eps)) along dim (x1, x2 broadcast), as
    PyTorch: each operand divided by its own norm first (the result stays in [-1, 1]), the
    clamp at eps taken outside the gradient (the gradient flows as through the norm)."""
    op = "cosine_similarity"
    _tensors(op, ("x1", x1), ("x2", x2))
    shape = broadcast_shapes(op, x1.shape, x2.shape)
    if x1.shape != shape:
        x1 = x1.expand(*shape)
    if x2.shape != shape:
        x2 = x2.expand(*shape)
    normalize_dims(op, dim, len(shape))

    def unit(x):
        n = vector_norm(x, 2, dim, keepdim=True)
        floor = n.detach()
        return x / (n + (floor.clamp(min=eps) - floor))  # the value max(n, eps), n's gradient

    return (unit(x1) * unit(x2)).sum(dim)


def pairwise_distance(x1, x2, p=2.0, eps=1e-6, keepdim=False):
    """The p-norm of x1 - x2 + eps along the last dim (x1, x2 broadcast), as PyTorch."""
    op = "pairwise_distance"
    _tensors(op, ("x1", x1), ("x2", x2))
    broadcast_shapes(op, x1.shape, x2.shape)
    if max(x1.ndim, x2.ndim) == 0:
        raise ValueError(f"{op}: expected inputs of at least 1 dimension, got {x1.shape} and "
                         f"{x2.shape}")
    return vector_norm(x1 - x2 + eps, p, -1, keepdim)


# under autocast these run in float32 (autocast.FLOAT32_OPS; cross_entropy's fused path is
# nn_ops.cross_entropy, itself a float32 op, and its composed path goes through log_softmax)
(binary_cross_entropy_with_logits, l1_loss, smooth_l1_loss, huber_loss, kl_div, nll_loss,
 cosine_similarity) = (float32_op(f) for f in (
    binary_cross_entropy_with_logits, l1_loss, smooth_l1_loss, huber_loss, kl_div, nll_loss,
    cosine_similarity))

