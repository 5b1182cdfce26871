"""Differentiable network ops: matmul and linear, softmax, losses, convolution, pooling, dropout.

matmul, linear and softmax have backwards written in tritonad ops (differentiable again). The
fused ops whose backward is a dedicated kernel (cross-entropy, convolution, pooling) are
once-differentiable.
"""
from __future__ import annotations

import torch

from .. import dtypes, generator
from ..backend import _NO_CONTEXT, backend_of, conv_output_hw, get_backend
from ..tensor import Tensor, arange
from .composite import composite
from .elementwise import isfinite, where
from .function import Function
from .grad_mode import is_grad_enabled
from .dims import broadcast_shapes, normalize_dims
from .shape_ops import cat, expand, gather_rows, reshape, unsqueeze

__all__ = ["matmul", "linear", "softmax", "log_softmax", "logsumexp", "cross_entropy", "nll_loss", "mse_loss",
           "conv2d", "max_pool2d", "avg_pool2d", "dropout", "unfold", "fold", "pair"]


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
    return Softmax.apply1(x, _dim("softmax", x, dim))


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
    return LogSoftmax.apply1(x, _dim("log_softmax", x, dim))


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


# ---------------------------------------------------------------------------------- convolution


class Conv2d(Function):
    """Cross-correlation (NCHW), then relu in the same kernel if activation="relu"; backward by
    dedicated kernels (input, weight and bias grads), given the saved output as relu's gate
    (y > 0 exactly where the convolution is > 0)."""
    primitive = "conv2d"
    once_differentiable = True

    @staticmethod
    def forward(ctx, x, w, b, stride, padding, dilation, groups, activation=None):
        ctx.args = stride, padding, dilation, groups
        if activation is None:
            ctx.save_for_backward(x, w)
            return _b().conv2d(x, w, b, stride, padding, dilation, groups)
        y = _b().conv2d(x, w, b, stride, padding, dilation, groups, activation)
        ctx.save_for_backward(x, w, y)
        return y

    @staticmethod
    def backward(ctx, dy):
        x, w, *gate = ctx.saved
        return _conv_grads(ctx, dy._data, x._data, w._data, ctx.args,
                           gate[0]._data if gate else None)


def _conv_grads(ctx, dy, x, w, conv, gate=None):
    """The gradients a convolution's backward returns, from raw dy, x, w (and relu's gate).

    The weight and bias gradients go straight into the engine's buffers where it offers them
    (no copy after). Inside a side region (Backend.beside), when the input gradient continues
    the chain, they run beside it: dy is gated here, the weight gradients are queued on the
    side (the fork), then the input gradient in order. (A first layer, with no input gradient,
    keeps its weight gradient in order: nothing in the pass waits behind it, and the side
    stream may still be busy with the layers after it.)"""
    b, needs = _b(), ctx.needs_input_grad
    dw_out, db_out = _weight_grad_buffers(ctx, w)
    side = None
    if needs[0] and dw_out is not None and (db_out is not None or not needs[2]):
        side = b.beside(dy, x)
        if side is not None and gate is not None:
            dy = b.relu_backward(dy, gate)
            gate, side = None, b.beside(dy, x)
    if side is None:
        if gate is None and dw_out is None and db_out is None:  # (by position: the lean path)
            dx, dw, db = b.conv2d_backward(dy, x, w, *conv, needs[0], needs[1], needs[2])
        else:
            dx, dw, db = b.conv2d_backward(dy, x, w, *conv, needs[0], needs[1], needs[2], gate,
                                           dw_out, db_out)
    else:
        with side:
            _, dw, db = b.conv2d_backward(dy, x, w, *conv, False, needs[1], needs[2], None,
                                          dw_out, db_out)
        dx = b.conv2d_backward(dy, x, w, *conv, True, False, False)[0]
    wrap = lambda r: Tensor._wrap(r) if r is not None else None  # noqa: E731
    return (wrap(dx), wrap(dw), wrap(db)) + (None,) * (len(needs) - 3)


def _weight_grad_buffers(ctx, w):
    """(dw_out, db_out): the engine's buffers for the weight's and bias's gradients, where it
    offers them in w's dtype (else None: the engine converts)."""
    needs = ctx.needs_input_grad
    dw_out = ctx.gradient_buffer(1) if needs[1] else None
    db_out = ctx.gradient_buffer(2) if needs[2] else None
    if (dw_out is not None and dw_out.dtype != w.dtype) or \
            (db_out is not None and db_out.dtype != w.dtype):
        return None, None
    return dw_out, db_out


def _conv_geometry(op, shape, kernel, stride, padding, dilation):
    """The output plane (Ho, Wo) of a window op on an input of `shape` [N, C, H, W]."""
    if len(shape) != 4:
        raise ValueError(f"{op}: expected input [N, C, H, W], got shape {tuple(shape)}")
    for name, v, low in (("stride", stride, 1), ("padding", padding, 0), ("dilation", dilation, 1)):
        if min(v) < low:
            raise ValueError(f"{op}: {name} must be >= {low}, got {v}")
    out = []
    for size, k, s, p, d in zip(shape[2:], kernel, stride, padding, dilation):
        span = size + 2 * p - d * (k - 1) - 1
        if span < 0:
            raise ValueError(f"{op}: kernel {tuple(kernel)} (dilation {tuple(dilation)}) is larger "
                             f"than the padded input {tuple(shape[2:])} + 2 * {tuple(padding)}")
        out.append(span // s + 1)
    return tuple(out)


def conv2d(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1, activation=None):
    """2-d convolution: x [N, C_in, H, W] (or unbatched [C_in, H, W]), weight [C_out, C_in /
    groups, kh, kw], bias [C_out]; padding: ints, or 'valid' / 'same' as torch; activation="relu"
    applies relu in the same kernel (nn.Sequential fuses Conv2d + ReLU so)."""
    if x.ndim == 3:
        return conv2d(unsqueeze(x, 0), weight, bias, stride, padding, dilation, groups,
                      activation).squeeze(0)
    if isinstance(padding, str):
        x, padding = string_padding("conv2d", x, weight.shape[2:], stride, padding, dilation)
    stride, padding, dilation, _ = _conv_args(x, weight, bias, stride, padding, dilation, groups,
                                              activation)
    if activation is None:
        return Conv2d.apply(x, weight, bias, stride, padding, dilation, groups)
    return Conv2d.apply(x, weight, bias, stride, padding, dilation, groups, activation)


def string_padding(op, x, kernel, stride, padding, dilation):
    """(x, padding) for padding 'valid' (none) or 'same' (the output keeps x's plane; refused
    with a stride > 1), as torch: each dim's total padding dilation * (k - 1) splits evenly,
    an odd one leaving its extra row or column at the end, where x gets a zero row or column
    (by cat: our copy kernels) and the convolution pads the rest on both sides."""
    check_string_padding(op, padding, stride)
    if padding == "valid":
        return x, 0

    totals = [d * (k - 1) for d, k in zip(pair(dilation, "dilation"), kernel)]
    for axis, total in zip((-2, -1), totals):
        if total % 2:
            shape = list(x.shape)
            shape[axis] = 1
            x = cat([x, x.new_zeros(shape)], axis)
    return x, (totals[0] // 2, totals[1] // 2)


def check_string_padding(op, padding, stride):
    """padding 'valid', or 'same' with stride 1, or a clear error."""
    if padding not in ("valid", "same"):
        raise ValueError(f"{op}: padding must be ints, 'valid' or 'same', got {padding!r}")
    if padding == "same" and max(pair(stride, "stride")) > 1:
        raise ValueError(f"{op}: padding='same' is not supported for strided convolutions "
                         f"(stride {stride})")


def _conv_args(x, weight, bias, stride, padding, dilation, groups, activation):
    """conv2d's checks: (stride, padding, dilation) as pairs and the output plane (Ho, Wo)."""
    stride, padding, dilation = pair(stride, "stride"), pair(padding, "padding"), \
        pair(dilation, "dilation")
    if weight.ndim != 4:
        raise ValueError(f"conv2d: weight must be [C_out, C_in, kh, kw], got shape {weight.shape}")
    if groups < 1 or weight.shape[0] % groups or x.ndim != 4 or \
            x.shape[1] != weight.shape[1] * groups:
        raise ValueError(f"conv2d: input of shape {x.shape} does not match weight of shape "
                         f"{weight.shape} with groups={groups} (input channels must equal "
                         f"weight.shape[1] * groups)")
    if bias is not None and bias.shape != (weight.shape[0],):
        raise ValueError(f"conv2d: bias of shape {bias.shape} does not match {weight.shape[0]} "
                         "output channels")
    if activation not in (None, "relu"):
        raise ValueError(f"conv2d: unknown activation {activation!r} (None or 'relu')")
    _same_float("conv2d", x, weight, bias)
    out_hw = _conv_geometry("conv2d", x.shape, weight.shape[2:], stride, padding, dilation)
    return stride, padding, dilation, out_hw


class Conv2dReluMaxPool2d(Function):
    """max_pool2d(relu(conv2d(x, w, b))) as one node, by the backend's conv2d_relu_max_pool2d
    (which may compute it without writing the convolution's output). Backward: relu' is applied
    as the pool's backward reads its gradient, with the pool's output as the gate (relu' at a
    window's argmax is the window's maximum > 0), so the convolution's backward receives the
    gradient gated and makes no pass of its own; where x needs no gradient (a first layer) the
    backend may compute the weight and bias gradients from the pool's gradient directly. It
    keeps the pool's output and indices rather than the convolution's output."""
    once_differentiable = True

    @staticmethod
    def forward(ctx, x, w, b, stride, padding, dilation, groups, kernel, pool_stride,
                pool_padding, pool_dilation, ceil_mode):
        ctx.conv = stride, padding, dilation, groups
        ctx.pool = kernel, pool_stride, pool_padding, pool_dilation, ceil_mode
        record = bool(ctx.needs_input_grad)  # (no indices when nothing is recorded)
        p, indices = _b().conv2d_relu_max_pool2d(x, w, b, *ctx.conv, *ctx.pool, record)
        ctx.save_for_backward(x, w, p, indices)
        return p

    @staticmethod
    def backward(ctx, dp):
        x, w, p, indices = ctx.saved
        be, needs = _b(), ctx.needs_input_grad
        if not needs[0]:
            dw_out, db_out = _weight_grad_buffers(ctx, w._data)
            _, dw, db = be.conv2d_relu_max_pool2d_backward(
                dp._data, indices._data, p._data, x._data, w._data, *ctx.conv, *ctx.pool,
                False, needs[1], needs[2], dw_out, db_out)
            wrap = lambda r: Tensor._wrap(r) if r is not None else None  # noqa: E731
            return (None, wrap(dw), wrap(db)) + (None,) * (len(needs) - 3)
        shape = (x.shape[0], w.shape[0]) + conv_output_hw(x.shape, w.shape, *ctx.conv[:3])
        dy = be.max_pool2d_backward(dp._data, indices._data, shape, *ctx.pool, p._data)
        return _conv_grads(ctx, dy, x._data, w._data, ctx.conv)


def conv2d_relu_max_pool2d(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1,
                           kernel_size=2, pool_stride=None, pool_padding=0, pool_dilation=1,
                           ceil_mode=False):
    """max_pool2d(relu(conv2d(x, weight, bias, ...)), kernel_size, pool_stride, ...), the same
    values and gradients, with relu' folded into the pool's backward where a gradient is
    recorded (Conv2dReluMaxPool2d). nn.Sequential runs Conv2d, ReLU, MaxPool2d so."""
    if x.ndim == 3:
        return conv2d_relu_max_pool2d(unsqueeze(x, 0), weight, bias, stride, padding, dilation,
                                      groups, kernel_size, pool_stride, pool_padding,
                                      pool_dilation, ceil_mode).squeeze(0)
    if isinstance(padding, str):
        x, padding = string_padding("conv2d", x, weight.shape[2:], stride, padding, dilation)
    stride, padding, dilation, out_hw = _conv_args(x, weight, bias, stride, padding, dilation,
                                                   groups, "relu")
    pool = _pool_args("max_pool2d", (x.shape[0], weight.shape[0]) + out_hw, kernel_size,
                      pool_stride, pool_padding, pool_dilation)
    return Conv2dReluMaxPool2d.apply(x, weight, bias, stride, padding, dilation, groups, *pool,
                                     ceil_mode)


class Unfold(Function):
    """im2col: [N, C, H, W] -> [N, C*kh*kw, L]; its adjoint is fold (col2im)."""
    @staticmethod
    def forward(ctx, x, kernel, stride, padding, dilation):
        ctx.args = kernel, stride, padding, dilation
        ctx.size = tuple(x.shape[2:])
        return _b().im2col(x, kernel, stride, padding, dilation)

    @staticmethod
    def backward(ctx, dy):
        return Fold.apply(dy, ctx.size, *ctx.args), None, None, None, None


class Fold(Function):
    """col2im: overlapping windows summed; its adjoint is unfold."""
    @staticmethod
    def forward(ctx, cols, size, kernel, stride, padding, dilation):
        ctx.args = kernel, stride, padding, dilation
        return _b().col2im(cols, size, kernel, stride, padding, dilation)

    @staticmethod
    def backward(ctx, dy):
        return Unfold.apply(dy, *ctx.args), None, None, None, None, None


def unfold(x, kernel_size, dilation=1, padding=0, stride=1):
    """Sliding local blocks as columns (torch.nn.functional.unfold)."""
    args = pair(kernel_size), pair(stride), pair(padding), pair(dilation)
    _conv_geometry("unfold", x.shape, args[0], args[1], args[2], args[3])
    return Unfold.apply(x, *args)


def fold(cols, output_size, kernel_size, dilation=1, padding=0, stride=1):
    """Sum sliding local blocks back into an image (torch.nn.functional.fold)."""
    size = pair(output_size)
    kernel, stride, padding, dilation = pair(kernel_size), pair(stride), pair(padding), \
        pair(dilation)
    hw = [(s + 2 * p - d * (k - 1) - 1) // st + 1
          for s, k, st, p, d in zip(size, kernel, stride, padding, dilation)]
    if cols.ndim != 3 or cols.shape[1] % (kernel[0] * kernel[1]) or cols.shape[2] != hw[0] * hw[1]:
        raise ValueError(f"fold: columns of shape {cols.shape} do not match output_size {size} "
                         f"with kernel {kernel}, stride {stride}, padding {padding}")
    return Fold.apply(cols, size, kernel, stride, padding, dilation)


# ---------------------------------------------------------------------------------- pooling


_POOL_ARGS = {}  # (op, shape, arguments) -> normalised arguments: checked once per signature


def _pool_args(op, shape, kernel_size, stride, padding, dilation):
    key = (op, shape, kernel_size, stride, padding, dilation)
    try:
        known = _POOL_ARGS.get(key)
    except TypeError:  # unhashable arguments (lists): check every time
        known, key = None, None
    if known is not None:
        return known
    kernel = pair(kernel_size, "kernel_size")
    stride = kernel if stride is None or stride == () else pair(stride, "stride")
    padding, dilation = pair(padding, "padding"), pair(dilation, "dilation")
    if min(kernel) < 1:
        raise ValueError(f"{op}: kernel_size must be positive, got {kernel}")
    for k, p, d in zip(kernel, padding, dilation):
        if p > (d * (k - 1) + 1) // 2:
            raise ValueError(f"{op}: padding {padding} must be at most half the kernel size "
                             f"{kernel}")
    _conv_geometry(op, shape, kernel, stride, padding, dilation)
    result = kernel, stride, padding, dilation
    if key is not None:
        if len(_POOL_ARGS) > 4096:
            _POOL_ARGS.clear()
        _POOL_ARGS[key] = result
    return result


class MaxPool2d(Function):
    """Window maxima; the argmax of each window is kept, and the backward gathers into each
    input position the dy of the windows whose argmax it is (deterministic, no atomics)."""
    once_differentiable = True

    @staticmethod
    def forward(ctx, x, kernel, stride, padding, dilation, ceil_mode, with_indices=True):
        y, indices = _b().max_pool2d(x, kernel, stride, padding, dilation, ceil_mode,
                                     with_indices)
        if indices is None:  # (no backward to come)
            return y, None
        ctx.shape = tuple(x.shape)
        ctx.args = kernel, stride, padding, dilation, ceil_mode
        ctx.save_for_backward(indices)
        ctx.mark_non_differentiable(indices)
        return y, indices

    @staticmethod
    def backward(ctx, dy, _):
        (indices,) = ctx.saved
        dx = _b().max_pool2d_backward(dy._data, indices._data, ctx.shape, *ctx.args)
        return Tensor._wrap(dx), None, None, None, None, None, None


def max_pool2d(x, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False,
               return_indices=False):
    """Max over windows; gradient to the first maximum of each window (as torch). x: [N, C, H, W]
    or unbatched [C, H, W]."""
    if x.ndim == 3:
        out = max_pool2d(unsqueeze(x, 0), kernel_size, stride, padding, dilation, ceil_mode,
                         return_indices)
        return (out[0].squeeze(0), out[1].squeeze(0)) if return_indices else out.squeeze(0)
    args = _pool_args("max_pool2d", x.shape, kernel_size, stride, padding, dilation)
    _same_float("max_pool2d", x)
    # the indices are only for a backward, or for a caller who asks: evaluation skips them
    with_indices = return_indices or (is_grad_enabled() and x.requires_grad)
    y, indices = MaxPool2d.apply(x, *args, ceil_mode, with_indices)
    return (y, indices) if return_indices else y


class AvgPool2d(Function):
    """Window means with torch's padding rules; the backward spreads dy / divisor over windows."""
    primitive = "avg_pool2d"
    once_differentiable = True

    @staticmethod
    def forward(ctx, x, kernel, stride, padding, ceil_mode, count_include_pad, divisor_override):
        ctx.shape = tuple(x.shape)
        ctx.args = kernel, stride, padding, ceil_mode, count_include_pad, divisor_override
        return _b().avg_pool2d(x, *ctx.args)

    @staticmethod
    def backward(ctx, dy):
        dx = _b().avg_pool2d_backward(dy._data, ctx.shape, *ctx.args)
        return Tensor._wrap(dx), None, None, None, None, None, None


def avg_pool2d(x, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True,
               divisor_override=None):
    if x.ndim == 3:  # unbatched [C, H, W]
        return avg_pool2d(unsqueeze(x, 0), kernel_size, stride, padding, ceil_mode,
                          count_include_pad, divisor_override).squeeze(0)
    kernel, stride, padding, _ = _pool_args("avg_pool2d", x.shape, kernel_size, stride, padding,
                                            1)
    _same_float("avg_pool2d", x)
    if divisor_override is not None and divisor_override <= 0:
        raise ValueError(f"avg_pool2d: divisor_override must be positive, got {divisor_override}")
    return AvgPool2d.apply(x, kernel, stride, padding, ceil_mode, count_include_pad,
                           divisor_override)


# ---------------------------------------------------------------------------------- dropout


class Dropout(Function):
    """y = x * mask / (1 - p) with a counter-based random mask: dx = dy * mask / (1 - p)."""
    @staticmethod
    def forward(ctx, x, p):
        seed, offset = generator.take(x.numel())
        y, mask = _b().dropout(x, p, seed, offset)
        ctx.p = p
        ctx.save_for_backward(mask)
        return y

    @staticmethod
    def backward(ctx, dy):
        (mask,) = ctx.saved
    
        return where(mask, dy * (1.0 / (1.0 - ctx.p)), 0.0), None


def dropout(x, p=0.5, training=True):
    """Zero each element with probability p during training and scale the rest by 1 / (1 - p)."""
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout: p must be in [0, 1], got {p}")
    if not training or p == 0.0:
        return x
    if p == 1.0:
        return x * 0.0
    _same_float("dropout", x)
    return Dropout.apply(x, float(p))
