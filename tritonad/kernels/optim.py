"""Fused optimizer updates and the gradient-norm clip: one pass over flat parameter memory.

An optimizer keeps all parameters of a group in one flat float32 buffer (and the gradients and
the state in buffers of the same layout), so one launch of these kernels updates every
parameter. Per element, SGD with momentum reads param, grad, buf and writes param, buf (20
bytes); Adam reads param, grad, m, v and writes param, m, v (28 bytes); Adadelta likewise with
its two averages (28 bytes); RMSprop 20 bytes, plus 8 for momentum and 8 when centered; Adagrad
20 bytes. Unfused, the same update is 5-10 elementwise kernels, each reading and writing whole
arrays again.

Hyperparameters that change between steps (the learning rate, SGD's momentum that OneCycleLR
cycles, Adam's step count) may be 1-element float32 device arrays: the kernel then loads them
itself, so a step captured in a CUDA graph reads the current value at every replay. The step
counts that torch keeps for Adadelta, RMSprop and Adagrad (state["step"]) but their updates do
not read are incremented by the update's own launch (program 0), not by a launch of their own.
"""
from __future__ import annotations

import math

import torch

from .launch import INTERPRET, PDL, cdiv, num_warps_for, tl, triton
from .plans import empty, planned, run

PRIMITIVES = ("sgd_step_", "adam_step_", "adadelta_step_", "rmsprop_step_", "adagrad_step_",
              "total_norm", "clip_scale_", "amp_unscale_", "amp_update_scale_")

# one program updates BLOCK elements; under the interpreter few big programs run faster
BLOCK = 4096 if INTERPRET else 1024
# the norm: at most MAX_PROGRAMS programs per array, each summing a contiguous chunk
NORM_BLOCK = 4096 if INTERPRET else 1024
MAX_PROGRAMS = 2 if INTERPRET else 2048
NORM_KINDS = {2.0: 0, 1.0: 1, math.inf: 2}  # other finite p > 0: kind 3 (|x|^p via exp2/log2)


@triton.jit
def _hyper(ptr, value, ON_DEVICE: tl.constexpr):
    """A hyperparameter: loaded from device memory (read at replay), or the number passed."""
    if ON_DEVICE:
        value = tl.load(ptr).to(tl.float32)
    return value


@triton.jit
def _unskipped(mask, skip_ptr, SKIP: tl.constexpr):
    """mask, emptied where the device flag at skip_ptr is nonzero (a GradScaler's found-inf:
    the step is skipped without the host reading the flag)."""
    if SKIP:
        mask = tl.where(tl.load(skip_ptr) == 0.0, mask, False)
    return mask


@triton.jit
def _decayed_grad(param_ptr, grad_ptr, offs, mask, weight_decay, MAXIMIZE: tl.constexpr,
                  HAS_WEIGHT_DECAY: tl.constexpr):
    """(p, g): the parameters and the gradient torch's rules start from,
    g = (-grad if maximize else grad) + weight_decay * p."""
    p = tl.load(param_ptr + offs, mask=mask)
    g = tl.load(grad_ptr + offs, mask=mask)
    if MAXIMIZE:
        g = -g
    if HAS_WEIGHT_DECAY:
        g = g + weight_decay * p
    return p, g


@triton.jit
def _max_propagating_nan(a, b):
    # NOTE: max as torch's inf-norm: NaN wins (the GPU's max instruction would drop it)
    return tl.where(a != a, a, tl.where(b != b, b, tl.maximum(a, b)))


@triton.jit
def _reduce(acc, NORM: tl.constexpr):
    """Sum a block of partial terms, or take their max (NaN-propagating) for the inf-norm."""
    if NORM == 2:
        # adding the sum of the NaN lanes (0 when there are none) carries a NaN through
        total = tl.max(acc, axis=0) + tl.sum(tl.where(acc != acc, acc, 0.0), axis=0)
    else:
        total = tl.sum(acc, axis=0)
    return total


@triton.jit
def _one_minus_exp(y):
    # 1 - exp(y) for y <= 0, accurate near y = 0 where 1 - exp(y) cancels: the Taylor series of
    # -expm1(y) up to y^8 for |y| < 0.5 (truncation error below 1e-8 relative), 1 - exp(y) beyond.
    # NOTE: Adam's bias correction 1 - beta2^t has y = t * log(0.999) = -0.001 t; 1 - exp(y) in
    # float32 would lose 4 digits there.
    series = 1.0 + y / 8.0
    series = 1.0 + y / 7.0 * series
    series = 1.0 + y / 6.0 * series
    series = 1.0 + y / 5.0 * series
    series = 1.0 + y / 4.0 * series
    series = 1.0 + y / 3.0 * series
    series = 1.0 + y / 2.0 * series
    return tl.where(y > -0.5, -y * series, 1.0 - tl.exp(y))


@triton.jit
def _sgd_kernel(param_ptr, grad_ptr, buf_ptr, lr_ptr, momentum_ptr, skip_ptr, n,
                lr, momentum, dampening, weight_decay,
                LR_ON_DEVICE: tl.constexpr, MOMENTUM_ON_DEVICE: tl.constexpr,
                HAS_MOMENTUM: tl.constexpr, NESTEROV: tl.constexpr, MAXIMIZE: tl.constexpr,
                FIRST_STEP: tl.constexpr, HAS_WEIGHT_DECAY: tl.constexpr, SKIP: tl.constexpr,
                BLOCK: tl.constexpr, GDC: tl.constexpr):
    if GDC:  # programmatic dependent launch (launch.PDL): wait for the kernels before
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    # one program updates BLOCK consecutive elements:
    #   g = (-grad if maximize else grad) + weight_decay * p
    #   buf = g on the first step, else momentum * buf + (1 - dampening) * g
    #   g = g + momentum * buf (nesterov) or buf;   p = p - lr * g
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = _unskipped(offs < n, skip_ptr, SKIP)
    lr = _hyper(lr_ptr, lr, LR_ON_DEVICE)
    p, g = _decayed_grad(param_ptr, grad_ptr, offs, mask, weight_decay, MAXIMIZE,
                         HAS_WEIGHT_DECAY)
    if HAS_MOMENTUM:
        momentum = _hyper(momentum_ptr, momentum, MOMENTUM_ON_DEVICE)
        if FIRST_STEP:
            buf = g
        else:
            buf = momentum * tl.load(buf_ptr + offs, mask=mask) + (1.0 - dampening) * g
        tl.store(buf_ptr + offs, buf, mask=mask)
        if NESTEROV:
            g = g + momentum * buf
        else:
            g = buf
    tl.store(param_ptr + offs, p - lr * g, mask=mask)


@triton.jit
def _adam_kernel(param_ptr, grad_ptr, exp_avg_ptr, exp_avg_sq_ptr, lr_ptr, step_ptr, skip_ptr,
                 n, lr, bias1, bias2, beta1, beta2, log_beta1, log_beta2, eps, weight_decay,
                 LR_ON_DEVICE: tl.constexpr, STEP_ON_DEVICE: tl.constexpr,
                 WEIGHT_DECAY: tl.constexpr, MAXIMIZE: tl.constexpr, SKIP: tl.constexpr,
                 BLOCK: tl.constexpr, GDC: tl.constexpr):
    if GDC:  # programmatic dependent launch (launch.PDL): wait for the kernels before
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    # one program updates BLOCK consecutive elements (WEIGHT_DECAY: 0 none, 1 L2 (Adam) added to
    # g, 2 decoupled (AdamW) p *= 1 - lr * wd):
    #   m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
    #   p = p - lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)      (as torch.optim.Adam)
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = _unskipped(offs < n, skip_ptr, SKIP)
    lr = _hyper(lr_ptr, lr, LR_ON_DEVICE)
    if STEP_ON_DEVICE:
        # the bias corrections from the step count in device memory: 1 - b^t = 1 - exp(t log b)
        step = tl.load(step_ptr).to(tl.float32)
        bias1 = _one_minus_exp(step * log_beta1)
        bias2 = _one_minus_exp(step * log_beta2)
    p = tl.load(param_ptr + offs, mask=mask)
    g = tl.load(grad_ptr + offs, mask=mask)
    m = tl.load(exp_avg_ptr + offs, mask=mask)
    v = tl.load(exp_avg_sq_ptr + offs, mask=mask)
    if MAXIMIZE:
        g = -g
    if WEIGHT_DECAY == 1:
        g = g + weight_decay * p
    if WEIGHT_DECAY == 2:
        p = p * (1.0 - lr * weight_decay)
    m = beta1 * m + (1.0 - beta1) * g
    v = beta2 * v + (1.0 - beta2) * g * g
    denom = tl.sqrt(v) / tl.sqrt(bias2) + eps
    tl.store(exp_avg_ptr + offs, m, mask=mask)
    tl.store(exp_avg_sq_ptr + offs, v, mask=mask)
    tl.store(param_ptr + offs, p - (lr / bias1) * m / denom, mask=mask)


@triton.jit
def _count_step(count_ptr, COUNT: tl.constexpr):
    # program 0 adds 1 to the step counter (torch's state["step"]); no program of the launch
    # reads it, so there is no race with the others
    if COUNT:
        first = tl.program_id(0) == 0
        tl.store(count_ptr, tl.load(count_ptr, mask=first, other=0.0) + 1.0, mask=first)


@triton.jit
def _adadelta_kernel(param_ptr, grad_ptr, square_avg_ptr, acc_delta_ptr, lr_ptr, count_ptr, n,
                     lr, rho, one_minus_rho, eps, weight_decay,
                     LR_ON_DEVICE: tl.constexpr, COUNT: tl.constexpr, MAXIMIZE: tl.constexpr,
                     HAS_WEIGHT_DECAY: tl.constexpr, BLOCK: tl.constexpr, GDC: tl.constexpr):
    if GDC:  # programmatic dependent launch (launch.PDL): wait for the kernels before
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    # one program updates BLOCK consecutive elements (as torch.optim.Adadelta; v: square_avg,
    # u: acc_delta):
    #   v = rho v + (1 - rho) g^2;   delta = sqrt(u + eps) / sqrt(v + eps) * g
    #   u = rho u + (1 - rho) delta^2;   p = p - lr * delta
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    lr = _hyper(lr_ptr, lr, LR_ON_DEVICE)
    p, g = _decayed_grad(param_ptr, grad_ptr, offs, mask, weight_decay, MAXIMIZE,
                         HAS_WEIGHT_DECAY)
    v = tl.load(square_avg_ptr + offs, mask=mask)
    u = tl.load(acc_delta_ptr + offs, mask=mask)
    v = rho * v + one_minus_rho * g * g
    # NOTE: sqrt_rn (correctly rounded) as torch, not the approximate tl.sqrt: 200 steps must
    # agree to float32 rounding
    delta = tl.sqrt_rn(u + eps) / tl.sqrt_rn(v + eps) * g
    u = rho * u + one_minus_rho * delta * delta
    tl.store(square_avg_ptr + offs, v, mask=mask)
    tl.store(acc_delta_ptr + offs, u, mask=mask)
    tl.store(param_ptr + offs, p - lr * delta, mask=mask)
    _count_step(count_ptr, COUNT)


@triton.jit
def _rmsprop_kernel(param_ptr, grad_ptr, square_avg_ptr, grad_avg_ptr, buf_ptr, lr_ptr,
                    momentum_ptr, count_ptr, n,
                    lr, alpha, one_minus_alpha, eps, weight_decay, momentum,
                    LR_ON_DEVICE: tl.constexpr, MOMENTUM_ON_DEVICE: tl.constexpr,
                    HAS_MOMENTUM: tl.constexpr, CENTERED: tl.constexpr, COUNT: tl.constexpr,
                    MAXIMIZE: tl.constexpr, HAS_WEIGHT_DECAY: tl.constexpr, BLOCK: tl.constexpr,
                    GDC: tl.constexpr):
    if GDC:  # programmatic dependent launch (launch.PDL): wait for the kernels before
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    # one program updates BLOCK consecutive elements (as torch.optim.RMSprop; v: square_avg,
    # a: grad_avg):
    #   v = alpha v + (1 - alpha) g^2
    #   centered: a = lerp(a, g, 1 - alpha), avg = sqrt(v - a^2) + eps; else avg = sqrt(v) + eps
    #   momentum: buf = momentum buf + g / avg, p = p - lr buf;  else p = p - lr g / avg
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    lr = _hyper(lr_ptr, lr, LR_ON_DEVICE)
    p, g = _decayed_grad(param_ptr, grad_ptr, offs, mask, weight_decay, MAXIMIZE,
                         HAS_WEIGHT_DECAY)
    v = tl.load(square_avg_ptr + offs, mask=mask)
    v = alpha * v + one_minus_alpha * g * g
    tl.store(square_avg_ptr + offs, v, mask=mask)
    if CENTERED:
        a = tl.load(grad_avg_ptr + offs, mask=mask)
        # NOTE: torch's lerp: start + w (end - start) for w < 0.5, else end - (end - start)(1 - w)
        w = one_minus_alpha
        a = tl.where(w < 0.5, a + w * (g - a), g - (g - a) * (1.0 - w))
        tl.store(grad_avg_ptr + offs, a, mask=mask)
        v = v - a * a
    avg = tl.sqrt_rn(v) + eps
    if HAS_MOMENTUM:
        momentum = _hyper(momentum_ptr, momentum, MOMENTUM_ON_DEVICE)
        buf = momentum * tl.load(buf_ptr + offs, mask=mask) + g / avg
        tl.store(buf_ptr + offs, buf, mask=mask)
        p = p - lr * buf
    else:
        p = p - lr * (g / avg)
    tl.store(param_ptr + offs, p, mask=mask)
    _count_step(count_ptr, COUNT)


@triton.jit
def _adagrad_kernel(param_ptr, grad_ptr, sum_ptr, lr_ptr, step_ptr, count_ptr, n,
                    lr, step, lr_decay, eps, weight_decay,
                    LR_ON_DEVICE: tl.constexpr, STEP_ON_DEVICE: tl.constexpr,
                    COUNT: tl.constexpr, MAXIMIZE: tl.constexpr, HAS_WEIGHT_DECAY: tl.constexpr,
                    BLOCK: tl.constexpr, GDC: tl.constexpr):
    if GDC:  # programmatic dependent launch (launch.PDL): wait for the kernels before
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    # one program updates BLOCK consecutive elements (as torch.optim.Adagrad; s: sum):
    #   clr = lr / (1 + (step - 1) lr_decay);   s = s + g^2;   p = p - clr * g / (sqrt(s) + eps)
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    lr = _hyper(lr_ptr, lr, LR_ON_DEVICE)
    step = _hyper(step_ptr, step, STEP_ON_DEVICE)
    clr = lr / (1.0 + (step - 1.0) * lr_decay)
    p, g = _decayed_grad(param_ptr, grad_ptr, offs, mask, weight_decay, MAXIMIZE,
                         HAS_WEIGHT_DECAY)
    s = tl.load(sum_ptr + offs, mask=mask) + g * g
    tl.store(sum_ptr + offs, s, mask=mask)
    tl.store(param_ptr + offs, p - clr * (g / (tl.sqrt_rn(s) + eps)), mask=mask)
    _count_step(count_ptr, COUNT)


@triton.jit
def _norm_term(x, p, NORM: tl.constexpr):
    # the per-element term of an L_p norm: x^2, |x|, |x| (for the max) or |x|^p
    term = tl.abs(x.to(tl.float32))
    if NORM == 0:
        term = term * term
    if NORM == 3:
        term = tl.where(term > 0, tl.exp2(p * tl.log2(tl.where(term > 0, term, 1.0))), term)
    return term


@triton.jit
def _norm_partials_kernel(x_ptr, partials_ptr, n, chunk, p, NORM: tl.constexpr,
                          BLOCK: tl.constexpr):
    # one program reduces `chunk` consecutive elements (a multiple of BLOCK) to one partial:
    # the sum of the terms, or their max for the inf-norm. Masked lanes add 0 (|x| >= 0, so 0 is
    # also the identity of the max).
    start = tl.program_id(0).to(tl.int64) * chunk
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for i in range(0, chunk, BLOCK):
        offs = start + i + tl.arange(0, BLOCK)
        term = _norm_term(tl.load(x_ptr + offs, mask=offs < n, other=0.0), p, NORM)
        if NORM == 2:
            acc = _max_propagating_nan(acc, term)
        else:
            acc = acc + term
    tl.store(partials_ptr + tl.program_id(0), _reduce(acc, NORM))


@triton.jit
def _norm_finish_kernel(partials_ptr, out_ptr, n_partials, p, NORM: tl.constexpr,
                        BLOCK: tl.constexpr):
    # one program combines every partial in a fixed order (so the norm is deterministic) and
    # takes the root: sqrt for p = 2, the p-th root exp2(log2(s) / p) for other p
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for i in range(0, n_partials, BLOCK):
        offs = i + tl.arange(0, BLOCK)
        part = tl.load(partials_ptr + offs, mask=offs < n_partials, other=0.0)
        if NORM == 2:
            acc = _max_propagating_nan(acc, part)
        else:
            acc = acc + part
    total = _reduce(acc, NORM)
    if NORM == 0:
        total = tl.sqrt(total)
    if NORM == 3:
        total = tl.where(total > 0, tl.exp2(tl.log2(tl.where(total > 0, total, 1.0)) / p), total)
    tl.store(out_ptr, total)


@triton.jit
def _clip_scale_kernel(x_ptr, norm_ptr, n, max_norm, eps, BLOCK: tl.constexpr):
    # one program scales BLOCK elements by min(1, max_norm / (norm + eps)), norm read on device
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    coef = tl.minimum(max_norm / (tl.load(norm_ptr).to(tl.float32) + eps), 1.0)
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(x_ptr + offs, (x.to(tl.float32) * coef).to(x.dtype), mask=mask)


# ------------------------------------------------------------------------------------ launchers


def _check_flat(op, arrays, names, dtypes=(torch.float32,)):
    """Every array of one of dtypes (the first array's), contiguous, of one length and on one
    device; returns the length."""
    first = arrays[0]
    for a, name in zip(arrays, names):
        if not isinstance(a, torch.Tensor):
            raise TypeError(f"{op}: {name} must be an array, got {type(a).__name__}")
        if a.dtype not in dtypes or a.dtype != first.dtype:
            raise TypeError(f"{op}: {name} must be {' or '.join(str(d)[6:] for d in dtypes)} as "
                            f"{names[0]} ({first.dtype}), got {a.dtype} (shape {tuple(a.shape)})")
        if not a.is_contiguous():
            raise ValueError(f"{op}: {name} must be contiguous (shape {tuple(a.shape)}, strides "
                             f"{a.stride()})")
        if a.numel() != first.numel() or a.device != first.device:
            raise ValueError(f"{op}: {names[0]} has {first.numel()} elements on {first.device} "
                             f"but {name} has {a.numel()} on {a.device}")
    return first.numel()


def _scalar(op, name, value, device):
    """(pointer, number, on_device) for a hyperparameter given as a number or a 1-element
    float32 array on the update's device."""
    if isinstance(value, torch.Tensor):
        if value.numel() != 1 or value.dtype != torch.float32 or value.device != device:
            raise ValueError(f"{op}: {name} must be a number or a 1-element float32 array on "
                             f"{device}, got shape {tuple(value.shape)}, {value.dtype}, "
                             f"{value.device}")
        return value, 0.0, True
    return None, float(value), False


@planned()
def sgd_step_(param, grad, momentum_buf, lr, momentum=0.0, dampening=0.0, weight_decay=0.0,
              nesterov=False, maximize=False, first_step=False, skip=None):
    """SGD update of flat float32 (or float64) arrays in place (see Backend.sgd_step_); one
    launch.

    param, grad, momentum_buf: [n] (momentum_buf may be None when momentum == 0); lr, momentum:
    numbers or 1-element float32 device arrays (read by the kernel: capture-friendly); skip:
    None or a 1-element float32 device array, nonzero to leave everything as it is.
    """
    has_momentum = isinstance(momentum, torch.Tensor) or momentum != 0
    arrays, names = [param, grad], ["param", "grad"]
    if has_momentum:
        if momentum_buf is None:
            raise ValueError("sgd_step_: momentum is nonzero but momentum_buf is None")
        arrays, names = arrays + [momentum_buf], names + ["momentum_buf"]
    n = _check_flat("sgd_step_", arrays, names, (torch.float32, torch.float64))
    lr_ptr, lr_value, lr_on_device = _scalar("sgd_step_", "lr", lr, param.device)
    mom_ptr, mom_value, mom_on_device = _scalar("sgd_step_", "momentum", momentum, param.device)
    skip_ptr, skipping = _flag("sgd_step_", skip, param.device)
    if n == 0:
        return param
    # unused pointers point at param; the kernel never reads them
    run(_sgd_kernel, (cdiv(n, BLOCK),),
        param, grad, momentum_buf if has_momentum else param,
        lr_ptr if lr_on_device else param, mom_ptr if mom_on_device else param,
        skip_ptr if skipping else param, n,
        lr_value, mom_value, float(dampening), float(weight_decay),
        LR_ON_DEVICE=lr_on_device, MOMENTUM_ON_DEVICE=mom_on_device,
        HAS_MOMENTUM=has_momentum, NESTEROV=bool(nesterov), MAXIMIZE=bool(maximize),
        FIRST_STEP=bool(first_step), HAS_WEIGHT_DECAY=weight_decay != 0, SKIP=skipping,
        BLOCK=BLOCK, num_warps=num_warps_for(BLOCK), **PDL)
    return param


@planned()
def adam_step_(param, grad, exp_avg, exp_avg_sq, step, lr, beta1=0.9, beta2=0.999, eps=1e-8,
               weight_decay=0.0, decoupled_weight_decay=False, maximize=False, skip=None):
    """Adam / AdamW update of flat float32 arrays in place (see Backend.adam_step_); one launch.

    param, grad, exp_avg, exp_avg_sq: [n]; step (the 1-based count including this step) and lr:
    numbers or 1-element float32 device arrays (read by the kernel: capture-friendly); skip as
    in sgd_step_.
    """
    n = _check_flat("adam_step_", [param, grad, exp_avg, exp_avg_sq],
                    ["param", "grad", "exp_avg", "exp_avg_sq"])
    if not (0.0 <= beta1 < 1.0 and 0.0 <= beta2 < 1.0):
        raise ValueError(f"adam_step_: betas must lie in [0, 1), got ({beta1}, {beta2})")
    lr_ptr, lr_value, lr_on_device = _scalar("adam_step_", "lr", lr, param.device)
    step_ptr, step_value, step_on_device = _scalar("adam_step_", "step", step, param.device)
    skip_ptr, skipping = _flag("adam_step_", skip, param.device)
    if n == 0:
        return param
    # NOTE: bias corrections of a host step in float64, as torch; log(beta) for a device step is
    # taken here in float64 too (-inf for beta = 0 gives 1 - exp(-inf) = 1 on the device)
    bias1 = bias2 = 1.0
    if not step_on_device:
        bias1, bias2 = 1.0 - beta1 ** step_value, 1.0 - beta2 ** step_value
    log_beta1 = math.log(beta1) if beta1 > 0 else -math.inf
    log_beta2 = math.log(beta2) if beta2 > 0 else -math.inf
    decay_kind = 0 if weight_decay == 0 else (2 if decoupled_weight_decay else 1)
    run(_adam_kernel, (cdiv(n, BLOCK),),
        param, grad, exp_avg, exp_avg_sq, lr_ptr if lr_on_device else param,
        step_ptr if step_on_device else param, skip_ptr if skipping else param, n,
        lr_value, bias1, bias2, float(beta1), float(beta2), log_beta1, log_beta2, float(eps),
        float(weight_decay),
        LR_ON_DEVICE=lr_on_device, STEP_ON_DEVICE=step_on_device, WEIGHT_DECAY=decay_kind,
        MAXIMIZE=bool(maximize), SKIP=skipping, BLOCK=BLOCK, num_warps=num_warps_for(BLOCK),
        **PDL)
    return param


def _device_scalar(op, name, value, device):
    """(value, True) for a 1-element float32 array on `device`, (None, False) for None: an
    optional step counter a launch increments (count) or a flag it reads (skip)."""
    if value is None:
        return None, False
    if not isinstance(value, torch.Tensor) or value.numel() != 1 or \
            value.dtype != torch.float32 or value.device != device:
        got = f"{tuple(value.shape)} {value.dtype} on {value.device}" \
            if isinstance(value, torch.Tensor) else type(value).__name__
        raise ValueError(f"{op}: {name} must be None or a 1-element float32 array on {device}, "
                         f"got {got}")
    return value, True


def _flag(op, flag, device):
    return _device_scalar(op, "skip", flag, device)


def _counter(op, count, device):
    return _device_scalar(op, "count", count, device)


def _check_unit_interval(op, name, value):
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{op}: {name} must lie in [0, 1], got {value}")


def _grid(n, counting):
    # a counting launch runs at least one program, so that an empty update still counts its step
    return (max(cdiv(n, BLOCK), 1 if counting else 0),)


@planned()
def adadelta_step_(param, grad, square_avg, acc_delta, lr, rho=0.9, eps=1e-6, weight_decay=0.0,
                   maximize=False, count=None):
    """Adadelta update of flat float32 arrays in place (see Backend.adadelta_step_); one launch.

    param, grad, square_avg, acc_delta: [n]; lr: a number or a 1-element float32 device array
    (read by the kernel: capture-friendly); count: None or a 1-element float32 device array
    the launch adds 1 to (torch's state["step"]).
    """
    op = "adadelta_step_"
    n = _check_flat(op, [param, grad, square_avg, acc_delta],
                    ["param", "grad", "square_avg", "acc_delta"])
    _check_unit_interval(op, "rho", rho)
    lr_ptr, lr_value, lr_on_device = _scalar(op, "lr", lr, param.device)
    count_ptr, counting = _counter(op, count, param.device)
    if n == 0 and not counting:
        return param
    # unused pointers point at param; the kernel never reads them
    run(_adadelta_kernel, _grid(n, counting),
        param, grad, square_avg, acc_delta, lr_ptr if lr_on_device else param,
        count_ptr if counting else param, n,
        lr_value, float(rho), 1.0 - float(rho), float(eps), float(weight_decay),
        LR_ON_DEVICE=lr_on_device, COUNT=counting, MAXIMIZE=bool(maximize),
        HAS_WEIGHT_DECAY=weight_decay != 0, BLOCK=BLOCK, num_warps=num_warps_for(BLOCK), **PDL)
    return param


@planned()
def rmsprop_step_(param, grad, square_avg, grad_avg, momentum_buf, lr, alpha=0.99, eps=1e-8,
                  weight_decay=0.0, momentum=0.0, centered=False, maximize=False, count=None):
    """RMSprop update of flat float32 arrays in place (see Backend.rmsprop_step_); one launch.

    param, grad, square_avg: [n]; grad_avg: [n] when centered, else None; momentum_buf: [n]
    when momentum is nonzero, else None; lr, momentum: numbers or 1-element float32 device
    arrays (read by the kernel: capture-friendly); count as in adadelta_step_.
    """
    op = "rmsprop_step_"
    has_momentum = isinstance(momentum, torch.Tensor) or momentum != 0
    arrays, names = [param, grad, square_avg], ["param", "grad", "square_avg"]
    for wanted, array, name, why in ((centered, grad_avg, "grad_avg", "centered is set"),
                                     (has_momentum, momentum_buf, "momentum_buf",
                                      "momentum is nonzero")):
        if wanted and array is None:
            raise ValueError(f"{op}: {why} but {name} is None")
        if wanted:
            arrays, names = arrays + [array], names + [name]
    n = _check_flat(op, arrays, names)
    _check_unit_interval(op, "alpha", alpha)
    lr_ptr, lr_value, lr_on_device = _scalar(op, "lr", lr, param.device)
    mom_ptr, mom_value, mom_on_device = _scalar(op, "momentum", momentum, param.device)
    count_ptr, counting = _counter(op, count, param.device)
    if n == 0 and not counting:
        return param
    # unused pointers point at param; the kernel never reads them
    run(_rmsprop_kernel, _grid(n, counting),
        param, grad, square_avg, grad_avg if centered else param,
        momentum_buf if has_momentum else param, lr_ptr if lr_on_device else param,
        mom_ptr if mom_on_device else param, count_ptr if counting else param, n,
        lr_value, float(alpha), 1.0 - float(alpha), float(eps), float(weight_decay), mom_value,
        LR_ON_DEVICE=lr_on_device, MOMENTUM_ON_DEVICE=mom_on_device, HAS_MOMENTUM=has_momentum,
        CENTERED=bool(centered), COUNT=counting, MAXIMIZE=bool(maximize),
        HAS_WEIGHT_DECAY=weight_decay != 0, BLOCK=BLOCK, num_warps=num_warps_for(BLOCK), **PDL)
    return param


@planned()
def adagrad_step_(param, grad, state_sum, step, lr, lr_decay=0.0, eps=1e-10, weight_decay=0.0,
                  maximize=False, count=None):
    """Adagrad update of flat float32 arrays in place (see Backend.adagrad_step_); one launch.

    param, grad, state_sum: [n]; step (the 1-based count including this step, read only when
    lr_decay is nonzero) and lr: numbers or 1-element float32 device arrays (read by the kernel:
    capture-friendly); count as in adadelta_step_ (not together with a device step: the
    launch would read the counter it increments).
    """
    op = "adagrad_step_"
    n = _check_flat(op, [param, grad, state_sum], ["param", "grad", "state_sum"])
    lr_ptr, lr_value, lr_on_device = _scalar(op, "lr", lr, param.device)
    step_ptr, step_value, step_on_device = _scalar(op, "step", step, param.device)
    count_ptr, counting = _counter(op, count, param.device)
    step_on_device = step_on_device and lr_decay != 0
    if counting and step_on_device:
        raise ValueError(f"{op}: a device step is read by every program; count it before the "
                         "launch instead of passing count")
    if n == 0 and not counting:
        return param
    # unused pointers point at param; the kernel never reads them
    run(_adagrad_kernel, _grid(n, counting),
        param, grad, state_sum, lr_ptr if lr_on_device else param,
        step_ptr if step_on_device else param, count_ptr if counting else param, n,
        lr_value, step_value if lr_decay != 0 else 1.0, float(lr_decay), float(eps),
        float(weight_decay),
        LR_ON_DEVICE=lr_on_device, STEP_ON_DEVICE=step_on_device, COUNT=counting,
        MAXIMIZE=bool(maximize), HAS_WEIGHT_DECAY=weight_decay != 0, BLOCK=BLOCK,
        num_warps=num_warps_for(BLOCK), **PDL)
    return param


def _norm_kind(op, norm_type):
    norm_type = float(norm_type)
    if norm_type in NORM_KINDS:
        return NORM_KINDS[norm_type], norm_type
    if not (0 < norm_type < math.inf):
        raise ValueError(f"{op}: norm_type must be a positive number or inf, got {norm_type}")
    return 3, norm_type


def _check_norm_arrays(op, arrays):
    arrays = list(arrays)
    for i, a in enumerate(arrays):
        if not a.dtype.is_floating_point or a.dtype == torch.float64:
            raise TypeError(f"{op}: array {i} must be float32/16 or bfloat16, got {a.dtype}")
        if not a.is_contiguous():
            raise ValueError(f"{op}: array {i} (shape {tuple(a.shape)}) must be contiguous")
        if a.device != arrays[0].device:
            raise ValueError(f"{op}: arrays on different devices ({arrays[0].device}, {a.device})")
    return arrays


@planned()
def total_norm(arrays, norm_type=2.0):
    """The L_p norm of all elements of all arrays together, as a 0-d float32 array.

    arrays: contiguous float arrays (any shapes) on one device; p = 2 (default), 1, inf (max |x|)
    or any finite p > 0. One partial-sum launch per array, then one launch that adds the
    partials in a fixed order (deterministic, no atomics). No host synchronisation.
    """
    kind, p = _norm_kind("total_norm", norm_type)
    arrays = _check_norm_arrays("total_norm", arrays)
    if not arrays:
        raise ValueError("total_norm: no arrays given")
    device = arrays[0].device
    arrays = [a for a in arrays if a.numel() > 0]
    plans, count = [], 0
    for a in arrays:
        n = a.numel()
        chunk = cdiv(cdiv(n, min(cdiv(n, NORM_BLOCK), MAX_PROGRAMS)), NORM_BLOCK) * NORM_BLOCK
        plans.append((a, n, chunk, count))
        count += cdiv(n, chunk)
    partials = empty([max(count, 1)], torch.float32, device)
    for a, n, chunk, offset in plans:
        run(_norm_partials_kernel, (cdiv(n, chunk),),
            a, partials[offset:], n, chunk, p, NORM=kind, BLOCK=NORM_BLOCK,
            num_warps=num_warps_for(NORM_BLOCK))
    out = empty([], torch.float32, device)
    run(_norm_finish_kernel, (1,), partials, out, count, p, NORM=kind, BLOCK=NORM_BLOCK,
                              num_warps=num_warps_for(NORM_BLOCK))
    return out


@planned()
def clip_scale_(arrays, total_norm, max_norm, eps=1e-6):
    """x *= min(1, max_norm / (total_norm + eps)) for each array, in place (one launch each).

    total_norm: a 1-element float32 array on the arrays' device, read by the kernels (no host
    synchronisation); arrays: contiguous float arrays. Returns the arrays.
    """
    arrays = _check_norm_arrays("clip_scale_", arrays)
    for a in arrays:
        if total_norm.numel() != 1 or total_norm.dtype != torch.float32 or \
                total_norm.device != a.device:
            raise ValueError(f"clip_scale_: total_norm must be a 1-element float32 array on "
                             f"{a.device}, got {tuple(total_norm.shape)} {total_norm.dtype} on "
                             f"{total_norm.device}")
        if a.numel() == 0:
            continue
        run(_clip_scale_kernel, (cdiv(a.numel(), BLOCK),), a, total_norm, a.numel(),
            float(max_norm), float(eps), BLOCK=BLOCK, num_warps=num_warps_for(BLOCK))
    return arrays


# ------------------------------------------------------------------ loss scaling (amp.GradScaler)


@triton.jit
def _unscale_kernel(x_ptr, scale_ptr, found_ptr, n, BLOCK: tl.constexpr):
    # x = x * (1 / scale) in place; found = 1 when any x was inf or NaN (checked before the
    # multiply, as torch's _amp_foreach_non_finite_check_and_unscale_). Traffic: x read and
    # written once (8 bytes an element for float32); the flag is a plain store of 1 by every
    # program that saw one (all write the same value: no atomics, same result on every run).
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    inv = 1.0 / tl.load(scale_ptr)
    bad = (x != x) | (tl.abs(x) == float("inf"))
    tl.store(x_ptr + offs, (x * inv).to(x_ptr.dtype.element_ty), mask=mask)
    seen = tl.max(bad.to(tl.int32), axis=0)
    tl.store(found_ptr, 1.0, mask=seen > 0)


@triton.jit
def _update_scale_kernel(scale_ptr, tracker_ptr, found_ptr, growth, backoff, interval):
    # torch's _amp_update_scale_: after an inf/NaN, scale *= backoff and the count of good
    # steps restarts; after `interval` good steps in a row, scale *= growth (if that stays
    # finite). Then the found-inf flag is cleared for the next step.
    found = tl.load(found_ptr) != 0.0
    scale = tl.load(scale_ptr)
    good = tl.load(tracker_ptr) + 1.0
    grown = scale * growth
    grow = (good >= interval) & (grown == grown) & (tl.abs(grown) != float("inf"))
    tl.store(scale_ptr, tl.where(found, scale * backoff, tl.where(grow, grown, scale)))
    tl.store(tracker_ptr, tl.where(found | (good >= interval), 0.0, good))
    tl.store(found_ptr, 0.0)


def _check_amp_scalars(op, device, **arrays):
    for name, a in arrays.items():
        if not isinstance(a, torch.Tensor) or a.numel() != 1 or a.dtype != torch.float32 or \
                a.device != device:
            raise ValueError(f"{op}: {name} must be a 1-element float32 array on {device}")


def amp_unscale_(arrays, scale, found_inf):
    """Each array (contiguous, floating) *= 1 / scale in place; found_inf (a 1-element float32
    device array) is set to 1 if any element was inf or NaN, else left as it is. One launch an
    array; nothing is read back to the host."""
    for a in arrays:
        if not a.is_contiguous() or not a.dtype.is_floating_point:
            raise ValueError("amp_unscale_: arrays must be contiguous floating arrays, got "
                             f"{tuple(a.shape)} {a.dtype} with strides {a.stride()}")
        _check_amp_scalars("amp_unscale_", a.device, scale=scale, found_inf=found_inf)
        if a.numel():
            run(_unscale_kernel, (cdiv(a.numel(), BLOCK),), a, scale, found_inf, a.numel(),
                BLOCK=BLOCK, num_warps=num_warps_for(BLOCK))
    return found_inf


def amp_update_scale_(scale, growth_tracker, found_inf, growth_factor, backoff_factor,
                      growth_interval):
    """GradScaler's scale update on the device (see _update_scale_kernel); all three arrays are
    1-element float32; found_inf is cleared. One launch of one program."""
    _check_amp_scalars("amp_update_scale_", scale.device, scale=scale,
                       growth_tracker=growth_tracker, found_inf=found_inf)
    run(_update_scale_kernel, (1,), scale, growth_tracker, found_inf, float(growth_factor),
        float(backoff_factor), float(growth_interval), num_warps=1)
    return scale

