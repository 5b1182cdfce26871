"""Handlers for the optimizer operators torch.optim calls: the fused steps (`_fused_adam_`,
`_fused_adamw_`, `_fused_sgd_`: one launch of kernels/optim.py's update per parameter) and the
`_foreach_*` operators of its foreach paths (one elementwise launch, or a few, per tensor).
A GradScaler's grad_scale and found_inf are read on the device: the gradients unscaled in
place, the update skipped where found_inf is set.

A foreach or fused operator updates a list of tensors in place, so every case a handler does not
cover is found before the first write (a fallback after a partial update would apply the update
twice): all tensors contiguous, of the parameter's dtype, on one device.
"""
from __future__ import annotations

import torch

from .nn_ops import B, dtype_of
from .registry import Fallback, register

_FLOATS = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def _check_lists(op, selfs, *others, dtypes=_FLOATS):
    """Fallback unless every self is a contiguous floating tensor and each other list (tensors
    or numbers) has one entry per self, a tensor of self's shape and dtype (or a 0-d or
    1-element tensor of self's dtype: a scalar on the device)."""
    for i, s in enumerate(selfs):
        if s.dtype not in dtypes or not s.is_contiguous():
            raise Fallback(f"{op}: tensor {i} is {s.dtype}, strides {s.stride()}")
        for other in others:
            if isinstance(other, (list, tuple)):
                if len(other) != len(selfs):
                    raise Fallback(f"{op}: lists of {len(selfs)} and {len(other)}")
                o = other[i]
            else:
                o = other
            if isinstance(o, torch.Tensor):
                scalar = o.numel() == 1 and o.dim() <= 1
                if o.dtype != s.dtype or (tuple(o.shape) != tuple(s.shape) and not scalar) or \
                        o.device != s.device:
                    raise Fallback(f"{op}: {tuple(o.shape)} {o.dtype} on {o.device} against "
                                   f"tensor {i} {tuple(s.shape)} {s.dtype}")
            elif not isinstance(o, (int, float, bool)):
                raise Fallback(f"{op}: a {type(o).__name__} argument")


def _at(values, i):
    """Entry i of a list argument; a single value (number or scalar tensor) for every i."""
    return values[i] if isinstance(values, (list, tuple)) else values


def _binary(op, kernel, scale_other=False):
    """A foreach binary operator, in place (`_foreach_add_`) or returning new tensors
    (`_foreach_add`): self[i] = kernel(self[i], other[i] (* alpha))."""
    def run(selfs, other, *, alpha=1, inplace):
        _check_lists(op, selfs, other)
        outs = []
        for i, s in enumerate(selfs):
            o = _at(other, i)
            if scale_other and alpha != 1:
                o = B.mul(o, alpha) if isinstance(o, torch.Tensor) else o * alpha
            outs.append(kernel(s, o, out=s if inplace else None))
        return None if inplace else outs
    return run


_add = _binary("_foreach_add", B.add, scale_other=True)
_sub = _binary("_foreach_sub", B.sub, scale_other=True)
_mul = _binary("_foreach_mul", B.mul)
_div = _binary("_foreach_div", B.div)
_maximum = _binary("_foreach_maximum", B.maximum)
_minimum = _binary("_foreach_minimum", B.minimum)

def _register_binary(name, run, overloads):
    def inplace(selfs, other, *, alpha=1):
        return run(selfs, other, alpha=alpha, inplace=True)

    def new(selfs, other, *, alpha=1):
        return run(selfs, other, alpha=alpha, inplace=False)
    register(*(f"aten::_foreach_{name}_.{o}" for o in overloads))(inplace)
    register(*(f"aten::_foreach_{name}.{o}" for o in overloads))(new)


for _name, _run, _overloads in (
        ("add", _add, ("List", "Scalar", "ScalarList", "Tensor")),
        ("sub", _sub, ("List", "Scalar", "ScalarList")),
        ("mul", _mul, ("List", "Scalar", "ScalarList", "Tensor")),
        ("div", _div, ("List", "Scalar", "ScalarList", "Tensor")),
        ("maximum", _maximum, ("List", "Scalar", "ScalarList")),
        ("minimum", _minimum, ("List", "Scalar", "ScalarList"))):
    _register_binary(_name, _run, _overloads)


def _unary(op, kernel):
    def inplace(selfs):
        _check_lists(op, selfs)
        for s in selfs:
            kernel(s, out=s)

    def new(selfs):
        _check_lists(op, selfs)
        return [kernel(s) for s in selfs]
    register(f"aten::{op}_.default")(inplace)
    register(f"aten::{op}.default")(new)


for _name in ("sqrt", "neg", "exp", "reciprocal", "abs", "sign", "sigmoid"):
    _unary(f"_foreach_{_name}", getattr(B, _name))


@register("aten::_foreach_zero_.default")
def foreach_zero_(selfs):
    _check_lists("_foreach_zero_", selfs)
    for s in selfs:
        B.fill_(s, 0)


@register("aten::_foreach_copy_.default")
def foreach_copy_(selfs, src, non_blocking=False):
    _check_lists("_foreach_copy_", selfs, src)
    for s, o in zip(selfs, src):
        B.copy_(s, o)


def _lerp(selfs, ends, weight, inplace):
    # self + w (end - self), from the nearer end as torch
    _check_lists("_foreach_lerp", selfs, ends, weight)
    outs = [B.lerp(s, e, _at(weight, i), out=s if inplace else None)
            for i, (s, e) in enumerate(zip(selfs, ends))]
    return None if inplace else outs


register("aten::_foreach_lerp_.Scalar", "aten::_foreach_lerp_.List",
         "aten::_foreach_lerp_.ScalarList")(
    lambda selfs, ends, weight: _lerp(selfs, ends, weight, True))
register("aten::_foreach_lerp.Scalar", "aten::_foreach_lerp.List",
         "aten::_foreach_lerp.ScalarList")(
    lambda selfs, ends, weight: _lerp(selfs, ends, weight, False))


def _addc(op, entry):
    """_foreach_addcmul / addcdiv: self + value * t1 * t2 (or / t2), the table's entry: one
    kernel a tensor, rounded once."""
    def run(selfs, t1, t2, value, inplace):
        if isinstance(value, torch.Tensor):  # (the .Tensor overload: a 1-d tensor of values)
            raise Fallback(f"{op}: values in a tensor (read on the host)")
        _check_lists(op, selfs, t1, t2, value)
        fn = getattr(B, entry)
        outs = [fn(s, t1[i], t2[i], _at(value, i), out=s if inplace else None)
                for i, s in enumerate(selfs)]
        return None if inplace else outs
    names = [f"aten::{op}_.Scalar", f"aten::{op}_.ScalarList", f"aten::{op}_.Tensor"]
    register(*names)(lambda selfs, t1, t2, value=1: run(selfs, t1, t2, value, True))
    register(*(n.replace("_.", ".") for n in names))(
        lambda selfs, t1, t2, value=1: run(selfs, t1, t2, value, False))


_addc("_foreach_addcmul", "addcmul")
_addc("_foreach_addcdiv", "addcdiv")


@register("aten::_foreach_norm.Scalar")
def foreach_norm(selfs, ord=2, dtype=None):
    # one deterministic reduction per tensor (kernels/optim.py's total_norm), 0-d float32
    _check_lists("_foreach_norm", selfs)
    if dtype is not None:
        raise Fallback("_foreach_norm: dtype=")
    outs = []
    for s in selfs:
        n = B.total_norm([s], float(ord)) if s.numel() else None
        if n is None:
            raise Fallback("_foreach_norm: an empty tensor")
        outs.append(n if s.dtype == torch.float32 else B.cast(n, dtype_of(s.dtype)))
    return outs


# ------------------------------------------------------------------------ fused optimizer steps


def _device_scalar(value, device):
    """A hyperparameter the kernel may read: a number, or a 1-element float32 tensor on the
    update's device (else Fallback)."""
    if isinstance(value, torch.Tensor):
        if value.numel() != 1 or value.dtype != torch.float32 or value.device != device:
            raise Fallback(f"a {value.dtype} hyperparameter tensor on {value.device}")
        return value.view(1)
    return float(value)


def _check_fused(op, lists, grad_scale, found_inf):
    """The skip flag of the update (found_inf as a [1] view, or None), once every array is
    checked; Fallback for a case the update kernels do not take."""
    params = lists[0]
    for i, p in enumerate(params):
        for group in lists:
            t = group[i]
            if t.dtype != p.dtype or not t.is_contiguous() or t.device != p.device or \
                    t.numel() != p.numel():
                raise Fallback(f"{op}: {t.dtype} {tuple(t.shape)} against parameter "
                               f"{p.dtype} {tuple(p.shape)}")
    for name, flag in (("grad_scale", grad_scale), ("found_inf", found_inf)):
        if flag is not None and (flag.numel() != 1 or flag.dtype != torch.float32 or
                                 (params and flag.device != params[0].device)):
            raise Fallback(f"{op}: {name} {flag.dtype} {tuple(flag.shape)} on {flag.device}")
    return found_inf.view(1) if found_inf is not None else None


def _unscale(grads, grad_scale, skip):
    """A GradScaler's step: the gradients divided by its scale in place (kernels/optim.py's
    amp_unscale_, as PyTorch's fused kernels read them), before the update. found_inf, computed
    by the scaler from the same gradients, already says whether any is inf or NaN."""
    if grad_scale is None or not grads:
        return
    flag = skip if skip is not None else B.fill_(
        torch.empty((1,), dtype=torch.float32, device=grads[0].device), 0.0)
    B.amp_unscale_([g.view(-1) for g in grads], grad_scale.view(1), flag)


def _fused_adam(op, decoupled):
    def step(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, *, lr, beta1,
             beta2, weight_decay, eps, amsgrad, maximize, grad_scale=None, found_inf=None):
        if amsgrad:
            raise Fallback(f"{op}: amsgrad")
        if any(p.dtype != torch.float32 for p in params):
            raise Fallback(f"{op}: {params[0].dtype} parameters (the update is float32)")
        skip = _check_fused(op, (params, grads, exp_avgs, exp_avg_sqs), grad_scale, found_inf)
        rate = _device_scalar(lr, params[0].device) if params else lr
        counts = [_device_scalar(s, p.device) for s, p in zip(state_steps, params)]
        _unscale(grads, grad_scale, skip)
        for p, g, m, v, count in zip(params, grads, exp_avgs, exp_avg_sqs, counts):
            B.adam_step_(p.view(-1), g.view(-1), m.view(-1), v.view(-1), count, rate, beta1,
                         beta2, eps, weight_decay, decoupled, maximize, skip)
    register(f"aten::{op}.default", f"aten::{op}.tensor_lr")(step)


_fused_adam("_fused_adam_", False)
_fused_adam("_fused_adamw_", True)


@register("aten::_fused_sgd_.default", "aten::_fused_sgd_.tensor_lr")
def fused_sgd_(params, grads, momentum_buffer_list, *, weight_decay, momentum, lr, dampening,
               nesterov, maximize, is_first_step, grad_scale=None, found_inf=None):
    if any(p.dtype not in (torch.float32, torch.float64) for p in params):
        raise Fallback(f"_fused_sgd_: {params[0].dtype} parameters")
    lists = (params, grads) + ((momentum_buffer_list,) if momentum else ())
    skip = _check_fused("_fused_sgd_", lists, grad_scale, found_inf)
    if skip is not None and any(p.dtype != torch.float32 for p in params):
        raise Fallback("_fused_sgd_: found_inf with float64 parameters")
    rate = _device_scalar(lr, params[0].device) if params else lr
    _unscale(grads, grad_scale, skip)
    for i, (p, g) in enumerate(zip(params, grads)):
        buf = momentum_buffer_list[i].view(-1) if momentum else None
        B.sgd_step_(p.view(-1), g.view(-1), buf, rate, momentum, dampening, weight_decay,
                    nesterov, maximize, is_first_step, skip)
