"""Optimizers whose step() updates every parameter of a group in one fused Triton launch.

    opt = optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loss.backward(); opt.step(); opt.zero_grad()

Fused, with torch.optim's constructor arguments, defaults and update rules: SGD (momentum,
dampening, nesterov), Adam, AdamW, Adadelta, RMSprop (momentum, centered) and Adagrad; each
takes weight_decay and maximize. The lr schedulers are in tritonad.optim.lr_scheduler (StepLR,
MultiStepLR, ExponentialLR, LinearLR, ConstantLR, LambdaLR, CosineAnnealingLR, OneCycleLR,
SequentialLR).

Writing your own optimizer: subclass Optimizer, pass the defaults to its constructor and write
the rule for one parameter in `update(param, grad, state, group)` with tritonad's in-place ops.
step() calls it under no_grad for every parameter that has a gradient; `state` is the
parameter's own dict (empty at its first step) and goes into state_dict(); read the
hyperparameters from `group`, where param_groups and the schedulers change them:

    class MomentumSGD(optim.Optimizer):
        def __init__(self, params, lr=0.01, momentum=0.9):
            super().__init__(params, dict(lr=lr, momentum=momentum))

        def update(self, param, grad, state, group):
            if "momentum_buffer" not in state:
                state["momentum_buffer"] = grad.clone()
            else:
                state["momentum_buffer"].mul_(group["momentum"]).add_(grad)
            param.sub_(state["momentum_buffer"], alpha=group["lr"])

Overriding step() itself, as torch's optimizers do (`for group in self.param_groups: for p in
group["params"]: ... self.state[p] ...` under `td.no_grad()`), works too. Such an optimizer runs
a few kernels per parameter instead of one launch for all: slower than the fused ones, but any
rule works, on parameters of any dtype, with param_groups, state_dict / load_state_dict and the
schedulers. In a captured step (CUDA graph) its hyperparameters are frozen at capture.

How the fused ones work: at construction the optimizer copies the parameters of each group (per
device) into one flat float32 buffer and re-points every parameter at its slice (`p.data`
becomes a view: the parameter keeps its identity). A flat gradient buffer of the same layout is
lent to the autodiff engine as each parameter's `_grad_buffer`, so backward writes every `.grad`
into it; momentum and Adam state are flat buffers too. One kernel (backend.sgd_step_,
adam_step_, ...) then updates all of it. Parameters whose size is a multiple of 4 come first in
a buffer, so their slices stay 16-byte aligned for the other kernels.

Capturing a step in a CUDA graph: step() never synchronises with the host and reads every value
that changes between steps from device memory: the learning rate (and SGD's and RMSprop's
momentum) from 1-element device scalars, Adam's step count from a device counter that step()
increments with a kernel. A captured step never refills those scalars: a scheduler's step()
copies the new lr (and OneCycleLR's momentum) into them itself, outside the graph; after setting
`param_groups[i]["lr"]` by hand between replays, call `opt.sync()`. (tritonad.train.Trainer
saves even that launch: inside `opt.fed_hyperparameters()` its captured step copies each step's
values from a row of a pinned host table the loop fills.) A tensor lr
(`SGD(params, lr=td.tensor([0.1]))`) is read in place. Frozen at capture (re-capture after
changing them): the structure of the update (which parameters have a gradient, momentum zero or not, nesterov,
centered, maximize, the number of launches), weight_decay, dampening, eps, Adam's betas,
Adadelta's rho, RMSprop's alpha and Adagrad's lr_decay. Run one step() eagerly before capturing
(as torch's recipe does): the first step creates the state and the device scalars, and creating
them during a capture raises.
clip_grad_norm_ is capture-friendly too: the norm and the clip coefficient stay on the device.
"""

from __future__ import annotations

import math

from .. import dtypes
from ..backend import get_backend
from ..tensor import Tensor, tensor
from .optimizer import Optimizer, torch_only_flags
from .adaptive import Adadelta, Adagrad, RMSprop
from .lr_scheduler import (ConstantLR, CosineAnnealingLR, ExponentialLR, LambdaLR, LinearLR,
                           LRScheduler, MultiStepLR, OneCycleLR, SequentialLR, StepLR)


class SGD(Optimizer):
    """Stochastic gradient descent with momentum, as torch.optim.SGD; one launch per step.

    g = grad + weight_decay * p;  buf = momentum * buf + (1 - dampening) * g (buf = g at first);
    g = g + momentum * buf (nesterov) or buf;  p -= lr * g  (+= with maximize).
    `optim.SGD(model.parameters(), lr=0.05, momentum=0.9)`
    """

    _device_hyperparameters = ("lr", "momentum")
    _state_names = ("momentum_buffer",)
    _fused_dtypes = (dtypes.float32, dtypes.float64)
    _reads_skip = True

    def __init__(self, params, lr=1e-3, momentum=0.0, dampening=0.0, weight_decay=0.0,
                 nesterov=False, maximize=False, *, foreach=None, differentiable=False,
                 fused=None):
        torch_only_flags("SGD", differentiable)
        super().__init__(params, dict(lr=lr, momentum=momentum, dampening=dampening,
                                      weight_decay=weight_decay, nesterov=nesterov,
                                      maximize=maximize))

    def _check_group(self, group):
        super()._check_group(group)
        for key in ("momentum", "weight_decay", "dampening"):
            self._check_range(group, key)
        if group["nesterov"] and (group["momentum"] <= 0 or group["dampening"] != 0):
            raise ValueError("SGD: nesterov momentum requires a momentum and zero dampening")

    def _update(self, group, bucket, present):
        lr = bucket.scalar("lr", group["lr"])
        momentum, buf, dampening = 0.0, None, group["dampening"]
        if group["momentum"] != 0:
            momentum, buf = bucket.scalar("momentum", group["momentum"]), \
                bucket.buffer("momentum_buffer")
        # NOTE: a zero buffer gives buf = g on the first step by itself when dampening is 0;
        # only a dampened first step (buf = g, undamped) needs the first_step flag
        first = buf is not None and dampening != 0
        key = [not done for done in bucket.initialized] if first else None
        skip = self._skip[0] if self._skip is not None else None
        if skip is not None and first:
            raise ValueError("SGD: a GradScaler cannot skip the first step of dampened momentum "
                             "on the device; use dampening=0 or no GradScaler")
        for start, end, first_step in bucket.runs(present, key):
            get_backend().sgd_step_(
                bucket.span(bucket.flat, start, end), bucket.span(bucket.grad_flat, start, end),
                None if buf is None else bucket.span(buf, start, end), lr, momentum, dampening,
                group["weight_decay"], group["nesterov"], group["maximize"], bool(first_step),
                skip)

    def _slot_state(self, bucket, i):
        return super()._slot_state(bucket, i) if "momentum_buffer" in bucket.buffers else {}


class Adam(Optimizer):
    """Adam (Kingma & Ba), as torch.optim.Adam; per step one launch plus one that counts steps.

    m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2;
    p -= lr / (1 - b1^t) * m / (sqrt(v / (1 - b2^t)) + eps);  weight_decay adds wd * p to g.
    `optim.Adam(model.parameters(), lr=1e-3)`
    """

    _decoupled = False
    _state_names = ("exp_avg", "exp_avg_sq")
    _keeps_steps = True
    _reads_skip = True

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0,
                 amsgrad=False, maximize=False, *, foreach=None, capturable=False,
                 differentiable=False, fused=None):
        torch_only_flags(type(self).__name__, differentiable)
        if amsgrad:
            raise NotImplementedError(f"{type(self).__name__}: amsgrad is not supported")
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps,
                                      weight_decay=weight_decay, amsgrad=False,
                                      maximize=maximize))

    def _check_group(self, group):
        super()._check_group(group)
        beta1, beta2 = group["betas"]
        if not (0 <= beta1 < 1 and 0 <= beta2 < 1):
            raise ValueError(f"{type(self).__name__}: invalid betas {group['betas']}")
        self._check_range(group, "eps")
        self._check_range(group, "weight_decay")

    def _update(self, group, bucket, present):
        lr = bucket.scalar("lr", group["lr"])
        exp_avg, exp_avg_sq = bucket.buffer("exp_avg"), bucket.buffer("exp_avg_sq")
        skip, keep = self._skip if self._skip is not None else (None, None)
        bucket.advance_steps(present, keep)
        beta1, beta2 = group["betas"]
        for start, end, cohort in bucket.runs(present, bucket.cohort):
            get_backend().adam_step_(
                bucket.span(bucket.flat, start, end), bucket.span(bucket.grad_flat, start, end),
                bucket.span(exp_avg, start, end), bucket.span(exp_avg_sq, start, end),
                bucket.counter(cohort), lr, float(beta1), float(beta2), group["eps"],
                group["weight_decay"], self._decoupled, group["maximize"], skip)


class AdamW(Adam):
    """Adam with decoupled weight decay (Loshchilov & Hutter): p *= 1 - lr * weight_decay
    before the Adam update, as torch.optim.AdamW. `optim.AdamW(params, lr=1e-3)`"""

    _decoupled = True

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2,
                 amsgrad=False, maximize=False, *, foreach=None, capturable=False,
                 differentiable=False, fused=None):
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad, maximize,
                         differentiable=differentiable)


# ------------------------------------------------------------------------------ gradient clipping


def _contiguous_spans(grads):
    """The grads' memory as few contiguous 1-d arrays: neighbours in one storage (the slices of
    an optimizer's flat gradient buffer) merge into one span. Returns (spans, copies): a
    non-contiguous grad is given as a contiguous copy, listed in copies to write back.
    The spans come in an order that depends on the grads' order and layout only, not on
    addresses: the same on every process of a data-parallel group (tritonad.distributed
    all-reduces them one by one, and a norm adds them up in that order)."""
    backend = get_backend()
    pieces, copies, storages = [], [], {}
    for g in grads:
        if g.numel() == 0:
            continue
        if not g.is_contiguous():
            c = backend.contiguous(g)
            copies.append((g, c))
            g = c
        storage = storages.setdefault(g.untyped_storage().data_ptr(), len(storages))
        pieces.append((storage, g.dtype, g.storage_offset(), g))
    pieces.sort(key=lambda t: (t[0], str(t[1]), t[2]))
    spans = []  # [storage, dtype, start, end, first array]
    for storage, dtype, start, g in pieces:
        last = spans[-1] if spans else None
        if last and last[0] == storage and last[1] == dtype and last[3] == start:
            last[3] = start + g.numel()
        else:
            spans.append([storage, dtype, start, start + g.numel(), g])
    out = [g.view(-1) if g.numel() == end - start else g.as_strided((end - start,), (1,), start)
           for _, _, start, end, g in spans]
    return out, copies


def clip_grad_norm_(parameters, max_norm, norm_type=2.0, error_if_nonfinite=False, foreach=None):
    """Scale the gradients in place so that their total norm is at most max_norm, as
    torch.nn.utils.clip_grad_norm_: coef = min(1, max_norm / (norm + 1e-6)).

    The norm (over all gradients together, one vector) and the coefficient stay on the device,
    so no host synchronisation happens (unless error_if_nonfinite). Gradients that lie side by
    side in an optimizer's flat buffer take one launch in all. Returns the norm, a 0-d Tensor.
    `optim.clip_grad_norm_(model.parameters(), max_norm=1.0)`
    """
    if isinstance(parameters, Tensor):
        parameters = [parameters]
    grads = [p.grad for p in parameters if p.grad is not None]
    max_norm, norm_type = float(max_norm), float(norm_type)
    if not grads:
        return tensor(0.0)
    devices = {g.device for g in grads}
    if len(devices) > 1:
        raise RuntimeError(f"clip_grad_norm_: gradients on several devices "
                           f"{sorted(map(str, devices))}")
    backend = get_backend()
    spans, copies = _contiguous_spans([g._data for g in grads])
    if not spans:
        return Tensor._wrap(backend.full([], 0.0, dtypes.float32, next(iter(devices))))
    norm = backend.total_norm(spans, norm_type)
    if error_if_nonfinite and not math.isfinite(float(Tensor._wrap(norm).item())):
        raise RuntimeError(f"clip_grad_norm_: the total norm of order {norm_type} of the "
                           "gradients is non-finite, so it cannot be clipped; pass "
                           "error_if_nonfinite=False to scale them anyway")
    backend.clip_scale_(spans, norm.reshape(1), max_norm)
    for g, c in copies:
        backend.copy_(g, c)
    for g in grads:
        g._bump_version()
    return Tensor._wrap(norm)


__all__ = ["Optimizer", "SGD", "Adam", "AdamW", "Adadelta", "Adagrad", "RMSprop",
           "clip_grad_norm_", "LRScheduler", "StepLR", "MultiStepLR", "ExponentialLR",
           "LinearLR", "ConstantLR", "LambdaLR", "CosineAnnealingLR", "OneCycleLR",
           "SequentialLR"]


def __getattr__(name):  # a missing PyTorch name says what to use instead (see _hints.py)
    from .._hints import missing
    raise missing(__name__, name, globals())
