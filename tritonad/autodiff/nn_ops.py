"""Differentiable network ops: matmul and linear, softmax and logsumexp, losses (convolution,
pooling and dropout are in conv_ops.py).

matmul, linear and softmax have backwards written in tritonad ops (differentiable again). The
fused ops whose backward is a dedicated kernel (cross-entropy, convolution, pooling) are
once-differentiable.
"""
from __future__ import annotations

import torch

from .. import dtypes
from ..backend import _NO_CONTEXT, backend_of, get_backend
from ..tensor import Tensor, arange
from .autocast import float32_op, low, state as _autocast
from .composite import composite
from .elementwise import isfinite, where
from .function import Function
from .grad_mode import is_grad_enabled
from .dims import broadcast_shapes, normalize_dims
from .shape_ops import expand, gather_rows, reshape, unsqueeze

__all__ = ["matmul", "linear", "softmax", "log_softmax", "logsumexp", "cross_entropy", "nll_loss",
           "mse_loss", "pair"]


def _b():
    return get_backend()


def pair(v, name="argument"):
    if isinstance(v, int):
        return (v, v)
    v = tuple(int(i) for i in v)
    if len(v) != 2:
        raise ValueError(f"{name} must be an int or a pair of ints, got {v}")
    return v


def _same_float(op, *tensors):
    """All floating point and of one dtype, or a clear error."""
    first = None
    for t in tensors:  # (a plain loop: this runs on every eager call of the nn ops)
        if t is not None:
            dtype = t._data.dtype
            if first is None:
                first = dtype
            elif dtype != first:
                break
    else:
        if first is None or first.is_floating_point:
            return
    names = [f"{tuple(t.shape)} {t.dtype.name}" for t in tensors if t is not None]
    for t in tensors:
        if t is not None and not t.dtype.is_floating_point:
            raise TypeError(f"{op}: expected floating point tensors, got {', '.join(names)}")
    if len({t.dtype for t in tensors if t is not None}) > 1:
        raise TypeError(f"{op}: dtypes differ ({', '.join(names)}); cast with .to(dtype)")


# ---------------------------------------------------------------------------------- matmul


class Matmul(Function):
    """y = a @ b over [*batch, M, K] @ [*batch, K, N]: da = dy @ b^T, db = a^T @ dy (strided
    views, no copies); broadcast batch dims are summed back by the engine."""
    primitive = "matmul"
    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return _b().matmul(a, b)

    @staticmethod
    def backward(ctx, dy):
        a, b = ctx.saved
        da = matmul(dy, b.transpose(-1, -2)) if ctx.needs_input_grad[0] else None
        db = matmul(a.transpose(-1, -2), dy) if ctx.needs_input_grad[1] else None
        return da, db


def matmul(a, b):
    """Matrix product with torch's rules for 1-d operands and batch broadcasting."""
    if not isinstance(a, Tensor) or not isinstance(b, Tensor):
        raise TypeError("matmul: both operands must be tensors")
    if _autocast.dtype:
        a, b = low(a, b)
    ra, rb = a._data, b._data
    if ra.dim() == 2 and rb.dim() == 2 and ra.shape[1] == rb.shape[0] and \
            ra.dtype == rb.dtype and ra.dtype.is_floating_point:  # the common case, checked
        return Matmul.apply(a, b)
    if a.ndim == 0 or b.ndim == 0:
        raise ValueError(f"matmul: both operands need at least 1 dimension, got shapes {a.shape} "
                         f"and {b.shape}")
    _same_float("matmul", a, b)
    if a.shape[-1] != b.shape[-2 if b.ndim > 1 else -1]:
        raise ValueError(f"matmul: inner dimensions differ: {a.shape} @ {b.shape}")
    if a.ndim == 1:
        return matmul(unsqueeze(a, 0), b).squeeze(-2 if b.ndim > 1 else -1)
    if b.ndim == 1:
        return matmul(a, unsqueeze(b, -1)).squeeze(-1)
    batch = broadcast_shapes("matmul", a.shape[:-2], b.shape[:-2])
    a = expand(a, batch + a.shape[-2:])
    b = expand(b, batch + b.shape[-2:])
    return Matmul.apply(a, b)


class Linear(Function):
    """y = act(x @ w^T + b) in one kernel; x: [M, K], w: [N, K], b: [N].

    Backward (act = relu uses the saved output: y > 0 exactly where x @ w^T + b > 0):
    dz = dy * act'(y); dx = dz @ w; dw = dz^T @ x; db = sum_rows(dz).
    Without create_graph that is two kernels: dx with relu' applied to dy as it is read, and dw
    with db from the same reads (matmul's a_gate and a_row_sums), each written straight into
    an optimizer's flat gradient buffer when the engine offers one. With create_graph, the
    same formulas in differentiable ops.
    """
    @staticmethod
    def forward(ctx, x, w, b, activation):
        y = _b().matmul(x, w.t(), bias=b, activation=activation)
        ctx.activation = activation
        ctx.save_for_backward(x, w, y if activation else None)
        return y

    @staticmethod
    def backward(ctx, dy):
        x, w, y = ctx.saved
        if is_grad_enabled():
            return Linear._differentiable_backward(ctx, dy, x, w, y)
        backend, needs = _b(), ctx.needs_input_grad
        gate = y._data if ctx.activation == "relu" else None
        # (queued first: it may run beside the pass while dx continues the chain)
        dw, db = _weight_grads(ctx, dy._data, x._data, gate, beside=needs[0])
        dx = Tensor._wrap(backend.matmul(dy._data, w._data, a_gate=gate)) if needs[0] else None
        return dx, dw, db, None

    @staticmethod
    def _differentiable_backward(ctx, dy, x, w, y):
        # relu's derivative in Tensor ops (differentiable again), gated by the output y
        dz = where(y <= 0, 0.0, dy) if ctx.activation == "relu" else dy
        needs = ctx.needs_input_grad
        dx = matmul(dz, w) if needs[0] else None
        dw = matmul(dz.transpose(0, 1), x) if needs[1] else None
        db = dz.sum(0) if needs[2] else None
        return dx, dw, db, None


def _weight_grads(ctx, dy, x, gate=None, beside=False):
    """A linear layer's (dw, db) Tensors (None where not needed, inputs 1 and 2 of ctx):
    dw = dz^T @ x and db = sum_rows(dz) for dz = where(gate > 0, dy, 0) (dy if gate is None), in
    one matmul, straight into the engine's gradient buffers where it offers them. `beside`: the
    input gradient continues the chain, so the product may run beside the pass
    (Backend.beside) when both gradients go to the buffers. dy, x, gate: raw arrays."""
    backend, needs = _b(), ctx.needs_input_grad
    dw = db = db_out = None
    if needs[2]:
        db_out = ctx.gradient_buffer(2)
        if db_out is None:
            db_out = backend.empty((dy.shape[1],), dtypes.get_dtype(dy.dtype), dy.device)
        db = Tensor._wrap(db_out)
    if needs[1]:
        dw_out = ctx.gradient_buffer(1)
        side = backend.beside(dy, x, gate) if beside and dw_out is not None \
            and (not needs[2] or db_out is ctx.gradient_buffer(2)) else None
        with side or _NO_CONTEXT:
            dw = Tensor._wrap(backend.matmul(dy.t(), x, out=dw_out, a_row_sums=db_out,
                                             a_gate=gate.t() if gate is not None else None))
    elif needs[2]:
        dz = dy if gate is None else backend.relu_backward(dy, gate)
        backend.sum(dz, (0,), out=db_out)
    return dw, db


def linear(x, weight, bias=None, activation=None):
    """x @ weight.T + bias (then relu if activation="relu"). x: [*, in], weight: [out, in]."""
    if weight.ndim != 2:
        raise ValueError(f"linear: weight must be 2-d [out, in], got shape {weight.shape}")
    if x.ndim == 0 or x.shape[-1] != weight.shape[1]:
        raise ValueError(f"linear: input of shape {x.shape} does not match weight of shape "
                         f"{weight.shape} (expected last dim {weight.shape[1]})")
    if bias is not None and bias.shape != (weight.shape[0],):
        raise ValueError(f"linear: bias of shape {bias.shape} does not match weight of shape "
                         f"{weight.shape}")
    if activation not in (None, "relu"):
        raise ValueError(f"linear: unknown activation {activation!r}")
    if _autocast.dtype:
        x, weight, bias = low(x, weight, bias)
    _same_float("linear", x, weight, bias)
    lead = x.shape[:-1]
    rows = 1
    for n in lead:  # not -1: with no input features the row count is not implied
        rows *= n
    y = Linear.apply(reshape(x, (rows, x.shape[-1])), weight, bias, activation)
    return reshape(y, lead + (weight.shape[0],))


# ---------------------------------------------------------------------------------- softmax


def _dim(op, x, dim):
    n = max(x.ndim, 1)
    if not -n <= dim < n:
        raise IndexError(f"{op}: dimension {dim} is out of range for shape {x.shape}")
    return dim % n


class Softmax(Function):
    """y = exp(x - max) / sum(exp(x - max)): dx = y * (dy - sum(dy * y))."""
    primitive = "softmax"
    @staticmethod
    def forward(ctx, x, dim):
        y = _b().softmax(x, dim)
        ctx.dim = dim
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, dy):
        (y,) = ctx.saved
        if is_grad_enabled():  # create_graph: compose, so the gradient is differentiable
            return y * (dy - (dy * y).sum(ctx.dim, keepdim=True)), None
        return Tensor._wrap(_b().softmax_backward(dy._data, y._data, ctx.dim)), None


class LogSoftmax(Function):
    """y = x - logsumexp(x): dx = dy - exp(y) * sum(dy)."""
    primitive = "log_softmax"
    @staticmethod
    def forward(ctx, x, dim):
        y = _b().log_softmax(x, dim)
        ctx.dim = dim
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, dy):
        (y,) = ctx.saved
        if is_grad_enabled():
            return dy - y.exp() * dy.sum(ctx.dim, keepdim=True), None
        return Tensor._wrap(_b().log_softmax_backward(dy._data, y._data, ctx.dim)), None


def _softmax_input(op, x, dtype):
    if dtype is not None:
        x = x.to(dtype)
    _same_float(op, x)
    return x


@composite
def softmax(x, dim, dtype=None):
    """exp(x) / sum(exp(x)) along dim, computed stably; dtype: cast x to it first."""
    x = _softmax_input("softmax", x, dtype)
    if x.ndim == 0:
        return reshape(softmax(reshape(x, (1,)), 0), ())
    dim = _dim("softmax", x, dim)
    if x.numel() == 0:
        return x * 1.0
    m = x.detach().amax(dim, keepdim=True)  # (the shift cancels: no gradient flows through it)
    e = (x - where(isfinite(m), m, 0.0)).exp()
    return e / e.sum(dim, keepdim=True)


@softmax.fused("softmax")
def _(x, dim, dtype=None):
    # one kernel each way: y in one pass over the row, dx = y * (dy - sum(dy * y)) in one more
    x = _softmax_input("softmax", x, dtype)
    if x.ndim == 0:
        return reshape(Softmax.apply(reshape(x, (1,)), 0), ())
    return Softmax.apply(x, _dim("softmax", x, dim))


@composite
def log_softmax(x, dim, dtype=None):
    """x - logsumexp(x) along dim; dtype: cast x to it first."""
    x = _softmax_input("log_softmax", x, dtype)
    if x.ndim == 0:
        return reshape(log_softmax(reshape(x, (1,)), 0), ())
    dim = _dim("log_softmax", x, dim)
    if x.numel() == 0:
        return x * 1.0
    m = x.detach().amax(dim, keepdim=True)
    z = x - where(isfinite(m), m, 0.0)
    return z - z.exp().sum(dim, keepdim=True).log()


@log_softmax.fused("log_softmax")
def _(x, dim, dtype=None):
    x = _softmax_input("log_softmax", x, dtype)
    if x.ndim == 0:
        return reshape(LogSoftmax.apply(reshape(x, (1,)), 0), ())
    return LogSoftmax.apply(x, _dim("log_softmax", x, dim))


@composite
def logsumexp(x, dim, keepdim=False):
    """log(sum(exp(x))) over dim (an int or a tuple), computed stably: m + log(sum(exp(x - m)))
    with m the maximum (0 where it is infinite, so that rows of -inf give -inf, not NaN)."""
    if not x.dtype.is_floating_point:
        x = x.to(dtypes.default_float)
    m = x.detach().amax(dim, keepdim=True)
    m = where(isfinite(m), m, 0.0)
    s = (x - m).exp().sum(dim, keepdim=True).log() + m
    if keepdim:
        return s
    dims = normalize_dims("logsumexp", dim, x.ndim)
    return s.reshape(tuple(n for i, n in enumerate(x.shape) if dims is not None and i not in dims))


# ---------------------------------------------------------------------------------- losses

_REDUCTIONS = ("none", "mean", "sum")


class CrossEntropy(Function):
    """Fused softmax cross-entropy. The forward kernel writes d(loss)/d(logits) in the same pass,
    so the backward only scales it by the incoming gradient (and skips that when it is 1)."""
    once_differentiable = True
    skips_unit_gradient = True  # (Function.skips_unit_gradient)

    @staticmethod
    def forward(ctx, logits, target, reduction, ignore_index, label_smoothing, metrics=None):
        loss, grad = _b().cross_entropy(logits, target, reduction, ignore_index, label_smoothing,
                                        compute_grad=bool(ctx.needs_input_grad
                                                          and ctx.needs_input_grad[0]),
                                        metrics=metrics)
        ctx.reduction = reduction
        ctx.save_for_backward(grad)
        return loss

    @staticmethod
    def backward(ctx, dloss):
        (grad,) = ctx.saved
        if dloss._constant() == 1:  # (not read: it may be an unfilled seed, see Tensor.backward)
            return grad, None, None, None, None
        if ctx.reduction == "none":
            return grad * dloss.reshape((-1, 1)), None, None, None, None
        return grad * dloss, None, None, None, None


class LinearCrossEntropy(Function):
    """cross_entropy(x @ w^T + b, target) as one node: a classifier head (Backend.linear_
    cross_entropy). Its forward writes dlogits and, when x needs a gradient, dx = dlogits @ w in
    the loss's kernel (everything but dw and db is row-local), so that the backward of a unit
    gradient only writes dw = dlogits^T @ x and db, beside the rest of the pass as Linear's."""
    once_differentiable = True
    skips_unit_gradient = True  # (Function.skips_unit_gradient)

    @staticmethod
    def forward(ctx, x, w, b, target, reduction, ignore_index, label_smoothing, metrics=None):
        needs = ctx.needs_input_grad or (False, False, False)
        loss, dlogits, dx = _b().linear_cross_entropy(
            x, w, b, target, reduction, ignore_index, label_smoothing,
            compute_grad=needs[0] or needs[1] or needs[2], input_grad=needs[0], metrics=metrics)
        ctx.reduction = reduction
        ctx.save_for_backward(x if needs[1] else None, w if needs[0] else None, dlogits, dx)
        return loss

    @staticmethod
    def backward(ctx, dloss):
        x, w, dlogits, dx = ctx.saved
        backend, needs = _b(), ctx.needs_input_grad
        if dloss._constant() != 1:  # (not read when 1: it may be an unfilled seed)
            dlogits = dlogits * (dloss.reshape((-1, 1)) if ctx.reduction == "none" else dloss)
            dx = Tensor._wrap(backend.matmul(dlogits._data, w._data)) if needs[0] else None
        # (beside the pass, as Linear's: dx is already written, the chain goes on)
        dw, db = _weight_grads(ctx, dlogits._data, x._data if x is not None else None,
                               beside=needs[0])
        return dx, dw, db, None, None, None, None


def _check_head(op, x, weight, bias, target, reduction, label_smoothing):
    if reduction not in _REDUCTIONS:
        raise ValueError(f"{op}: reduction must be one of {_REDUCTIONS}, got {reduction!r}")
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"{op}: label_smoothing must be in [0, 1], got {label_smoothing}")
    if not isinstance(x, Tensor) or not isinstance(weight, Tensor) or \
            (bias is not None and not isinstance(bias, Tensor)):
        raise TypeError(f"{op}: input, weight and bias must be tensors")
    if weight.ndim != 2 or x.ndim != 2 or x.shape[1] != weight.shape[1]:
        raise ValueError(f"{op}: expected input [N, in] and weight [classes, in], got input "
                         f"{x.shape} and weight {weight.shape}")
    if bias is not None and bias.shape != (weight.shape[0],):
        raise ValueError(f"{op}: bias of shape {bias.shape} does not match weight of shape "
                         f"{weight.shape}")
    _same_float(op, x, weight, bias)
    if not isinstance(target, Tensor) or target.dtype not in (dtypes.int64, dtypes.int32):
        got = target.dtype if isinstance(target, Tensor) else type(target).__name__
        raise TypeError(f"{op}: target must be an int64 (or int32) tensor of class indices, "
                        f"got {got}")
    if target.shape != x.shape[:1]:
        raise ValueError(f"{op}: expected input [N, in] and target [N], got input {x.shape} "
                         f"and target {target.shape}")


def linear_cross_entropy(input, weight, bias, target, reduction="mean", ignore_index=-100,
                         label_smoothing=0.0):
    """cross_entropy(linear(input, weight, bias), target, ...) without the logits: a classifier
    head as one node (two kernels where the classes fit the backend's fused path). input [N, in],
    weight [classes, in], bias [classes] or None, target [N] class indices."""
    _check_head("linear_cross_entropy", input, weight, bias, target, reduction, label_smoothing)
    return LinearCrossEntropy.apply(input, weight, bias, target, reduction, ignore_index,
                                    float(label_smoothing))


def linear_cross_entropy_with_metrics(input, weight, bias, target, loss_total, correct,
                                      reduction="mean"):
    """linear_cross_entropy(input, weight, bias, target), adding a training loop's running
    totals on the device as cross_entropy_with_metrics does."""
    op = "linear_cross_entropy"
    _check_head(op, input, weight, bias, target, reduction, 0.0)
    for name, t in (("loss_total", loss_total), ("correct", correct)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{op}: {name} must be a tensor, got {type(t).__name__}")
    loss = LinearCrossEntropy.apply(input, weight, bias, target, reduction, -100, 0.0,
                                    metrics=(loss_total._data, correct._data))
    loss_total._bump_version()
    correct._bump_version()
    return loss


def _check_target(op, logits, target):
    if not isinstance(target, Tensor) or target.dtype not in (dtypes.int64, dtypes.int32):
        got = target.dtype if isinstance(target, Tensor) else type(target).__name__
        raise TypeError(f"{op}: target must be an int64 (or int32) tensor of class indices, "
                        f"got {got}")
    if logits.ndim != 2 or target.shape != logits.shape[:1]:
        raise ValueError(f"{op}: expected logits [N, C] and target [N], got logits {logits.shape} "
                         f"and target {target.shape}")


_TARGET_TYPES = (torch.int64, torch.int32)


def cross_entropy(logits, target, reduction="mean", ignore_index=-100, label_smoothing=0.0):
    """Softmax cross-entropy of logits [N, C] (or [C]) against class indices [N] (or [])."""
    if isinstance(logits, Tensor) and isinstance(target, Tensor) and reduction in _REDUCTIONS \
            and 0.0 <= label_smoothing <= 1.0:  # the common case, checked cheaply
        x, t = logits._data, target._data
        if x.dim() == 2 and x.dtype.is_floating_point and t.dim() == 1 and \
                t.dtype in _TARGET_TYPES and t.shape[0] == x.shape[0]:
            return CrossEntropy.apply(logits, target, reduction, ignore_index,
                                      float(label_smoothing))
    if reduction not in _REDUCTIONS:
        raise ValueError(f"cross_entropy: reduction must be one of {_REDUCTIONS}, got {reduction!r}")
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"cross_entropy: label_smoothing must be in [0, 1], got {label_smoothing}")
    _same_float("cross_entropy", logits)
    if logits.ndim == 1 and isinstance(target, Tensor) and target.ndim == 0:
        out = cross_entropy(unsqueeze(logits, 0), unsqueeze(target, 0), reduction, ignore_index,
                            label_smoothing)
        return reshape(out, ()) if reduction == "none" else out
    _check_target("cross_entropy", logits, target)
    return CrossEntropy.apply(logits, target, reduction, ignore_index, float(label_smoothing))


def cross_entropy_with_metrics(logits, target, loss_total, correct, reduction="mean"):
    """cross_entropy(logits [N, C], target [N]), and in the same kernel (where the backend
    can) a training loop's running totals on the device: loss_total (a float scalar tensor)
    += the sum of the N row losses, correct (an int64 scalar tensor) += the rows whose first
    largest logit is at the target. No host sync; the totals are not differentiable."""
    if reduction not in _REDUCTIONS:
        raise ValueError(f"cross_entropy: reduction must be one of {_REDUCTIONS}, "
                         f"got {reduction!r}")
    _same_float("cross_entropy", logits)
    _check_target("cross_entropy", logits, target)
    for name, t in (("loss_total", loss_total), ("correct", correct)):
        if not isinstance(t, Tensor):
            raise TypeError(f"cross_entropy: {name} must be a tensor, got {type(t).__name__}")
    loss = CrossEntropy.apply(logits, target, reduction, -100, 0.0,
                              metrics=(loss_total._data, correct._data))
    loss_total._bump_version()
    correct._bump_version()
    return loss


def mlp_cross_entropy_grads(linears, x, target, loss_total, correct, rows=None, cursor=None,
                            advance=False):
    """The fused training step of a ReLU MLP (Backend.mlp_cross_entropy_grads_): the mean
    cross-entropy of linears[-1](relu(...relu(linears[0](x[rows])))) against target[rows],
    forward and backward in one backend call, with each parameter's gradient accumulated into
    its .grad as backward() would (written straight into the optimizer's gradient buffer when
    .grad is None). linears: 2 or 3 Linear modules with biases; x: [N, in_features];
    rows: None, sample indices [B], or a table [R, B] read at `cursor` (see the primitive);
    loss_total and correct: running totals as in cross_entropy_with_metrics. Returns the
    batch's mean loss (a 0-d tensor, no autodiff history)."""
    params = [p for layer in linears for p in (layer.weight, layer.bias)]
    if any(p is None for p in params):
        raise ValueError("mlp_cross_entropy_grads: every layer needs a bias")
    backend = get_backend()
    raw = [p._data for p in params]
    grads = []
    for p in params:
        if p.grad is None and p._grad_buffer is not None:
            grads.append(p._grad_buffer)
        else:
            grads.append(backend.empty(p.shape, p.dtype, p.device))

    def unwrap(t):
        return t._data if isinstance(t, Tensor) else t

    loss = backend.mlp_cross_entropy_grads_(
        unwrap(x), unwrap(target), raw[0::2], raw[1::2], grads[0::2], grads[1::2],
        (loss_total._data, correct._data), rows=unwrap(rows), cursor=unwrap(cursor),
        advance=advance)
    for p, g in zip(params, grads):
        if p.grad is None:
            p.grad = Tensor._wrap(g)
        else:
            backend.add(p.grad._data, g, out=p.grad._data)
            p.grad._bump_version()
    for t in (loss_total, correct, cursor):
        if isinstance(t, Tensor):
            t._bump_version()
    return Tensor._wrap(loss)


def nll_loss(log_probs, target, reduction="mean", ignore_index=-100):
    """-log_probs[i, target[i]], reduced; rows with ignore_index count as absent."""
    if reduction not in _REDUCTIONS:
        raise ValueError(f"nll_loss: reduction must be one of {_REDUCTIONS}, got {reduction!r}")
    _check_target("nll_loss", log_probs, target)

    n, c = log_probs.shape
    backend_of(target._data).check_targets(target._data, c, ignore_index, "nll_loss")
    # rows to count: not ignored, and in range (a bad target is reported by the check above;
    # its row is left out here rather than read out of bounds)
    kept = (target != ignore_index) * (target >= 0) * (target < c)
    flat_index = arange(n, device=log_probs.device) * c + where(kept, target, 0)
    picked = gather_rows(reshape(log_probs, (-1,)), flat_index)
    losses = -where(kept, picked, 0.0)
    if reduction == "none":
        return losses
    if reduction == "sum":
        return losses.sum()
    return losses.sum() / kept.sum().to(losses.dtype)


def mse_loss(input, target, reduction="mean"):
    """(input - target)^2, reduced."""
    if reduction not in _REDUCTIONS:
        raise ValueError(f"mse_loss: reduction must be one of {_REDUCTIONS}, got {reduction!r}")
    if input.shape != target.shape:
        raise ValueError(f"mse_loss: input {input.shape} and target {target.shape} differ in shape")
    sq = (input - target) ** 2
    return sq if reduction == "none" else (sq.sum() if reduction == "sum" else sq.mean())


# losses run in float32 under autocast (autocast.FLOAT32_OPS)
cross_entropy, nll_loss, mse_loss = (float32_op(f) for f in (cross_entropy, nll_loss, mse_loss))
