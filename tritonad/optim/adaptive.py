"""Adadelta, RMSprop and Adagrad: per-coordinate step sizes from running averages of squared
gradients, as torch.optim's, each one fused launch per step over a group's flat buffers.

Every rule starts from g = grad + weight_decay * p (-grad with maximize). Like torch, each keeps
a per-parameter step count in its state; here program 0 of the update's own launch increments
it (the updates never read it, except Adagrad's with lr_decay, which counts first in a launch of
its own). lr, and RMSprop's momentum (which OneCycleLR cycles), are device scalars as for SGD,
so a captured step reads the current value at every replay.
"""
from __future__ import annotations

from ..backend import get_backend
from .optimizer import Optimizer, torch_only_flags


class Adadelta(Optimizer):
    """Adadelta (Zeiler, 2012), as torch.optim.Adadelta; one launch per step.

    v = rho v + (1 - rho) g^2;  delta = sqrt(u + eps) / sqrt(v + eps) * g;
    u = rho u + (1 - rho) delta^2;  p -= lr * delta   (v: square_avg, u: acc_delta).
    `optim.Adadelta(model.parameters(), lr=1.0)`
    """

    _state_names = ("square_avg", "acc_delta")
    _keeps_steps = True

    def __init__(self, params, lr=1.0, rho=0.9, eps=1e-6, weight_decay=0.0, foreach=None, *,
                 capturable=False, maximize=False, differentiable=False):
        torch_only_flags("Adadelta", differentiable)
        super().__init__(params, dict(lr=lr, rho=rho, eps=eps, weight_decay=weight_decay,
                                      maximize=maximize))

    def _check_group(self, group):
        super()._check_group(group)
        self._check_range(group, "rho", 0.0, 1.0)
        self._check_range(group, "eps")
        self._check_range(group, "weight_decay")

    def _update(self, group, bucket, present):
        lr = bucket.scalar("lr", group["lr"])
        square_avg, acc_delta = bucket.buffer("square_avg"), bucket.buffer("acc_delta")
        for start, end, count in bucket.counted_runs(present):
            get_backend().adadelta_step_(
                *bucket.spans(start, end, bucket.flat, bucket.grad_flat, square_avg, acc_delta),
                lr, group["rho"], group["eps"], group["weight_decay"], group["maximize"],
                count=count)


class RMSprop(Optimizer):
    """RMSprop (Hinton), as torch.optim.RMSprop, with momentum and centered; one launch per
    step.

    v = alpha v + (1 - alpha) g^2;  avg = sqrt(v) + eps, or centered: a = lerp(a, g, 1 - alpha),
    avg = sqrt(v - a^2) + eps;  p -= lr * g / avg, or with momentum: buf = momentum buf + g / avg,
    p -= lr * buf   (v: square_avg, a: grad_avg, buf: momentum_buffer).
    `optim.RMSprop(model.parameters(), lr=0.01, momentum=0.9, centered=True)`
    """

    _device_hyperparameters = ("lr", "momentum")
    _state_names = ("square_avg", "momentum_buffer", "grad_avg")
    _keeps_steps = True

    def __init__(self, params, lr=1e-2, alpha=0.99, eps=1e-8, weight_decay=0.0, momentum=0.0,
                 centered=False, capturable=False, foreach=None, maximize=False,
                 differentiable=False):
        torch_only_flags("RMSprop", differentiable)
        super().__init__(params, dict(lr=lr, alpha=alpha, eps=eps, weight_decay=weight_decay,
                                      momentum=momentum, centered=centered, maximize=maximize))

    def _check_group(self, group):
        super()._check_group(group)
        # NOTE: torch accepts alpha > 1, which makes square_avg negative and the update NaN
        self._check_range(group, "alpha", 0.0, 1.0)
        for key in ("eps", "weight_decay", "momentum"):
            self._check_range(group, key)

    def _update(self, group, bucket, present):
        lr = bucket.scalar("lr", group["lr"])
        momentum, buf = 0.0, None
        if group["momentum"] != 0:
            momentum, buf = bucket.scalar("momentum", group["momentum"]), \
                bucket.buffer("momentum_buffer")
        square_avg = bucket.buffer("square_avg")
        grad_avg = bucket.buffer("grad_avg") if group["centered"] else None
        for start, end, count in bucket.counted_runs(present):
            get_backend().rmsprop_step_(
                *bucket.spans(start, end, bucket.flat, bucket.grad_flat, square_avg, grad_avg,
                              buf),
                lr, group["alpha"], group["eps"], group["weight_decay"], momentum,
                bool(group["centered"]), group["maximize"], count=count)


class Adagrad(Optimizer):
    """Adagrad (Duchi et al., 2011), as torch.optim.Adagrad; one launch per step (two with
    lr_decay: the step count is read, so it is counted first).

    clr = lr / (1 + (step - 1) lr_decay);  s += g^2;  p -= clr * g / (sqrt(s) + eps)
    (s: sum, initial_accumulator_value before the first step; as torch, the state of every
    parameter exists from construction on).
    `optim.Adagrad(model.parameters(), lr=0.01)`
    """

    _state_names = ("sum",)
    _keeps_steps = True

    def __init__(self, params, lr=1e-2, lr_decay=0.0, weight_decay=0.0,
                 initial_accumulator_value=0.0, eps=1e-10, foreach=None, *, maximize=False,
                 differentiable=False, fused=None):
        torch_only_flags("Adagrad", differentiable)
        super().__init__(params, dict(lr=lr, lr_decay=lr_decay, eps=eps,
                                      weight_decay=weight_decay,
                                      initial_accumulator_value=initial_accumulator_value,
                                      maximize=maximize))

    def _check_group(self, group):
        super()._check_group(group)
        for key in ("lr_decay", "weight_decay", "initial_accumulator_value", "eps"):
            self._check_range(group, key)

    def _init_state(self, group, bucket):
        backend = get_backend()
        value = float(group["initial_accumulator_value"])
        if "sum" not in bucket.buffers:  # a new bucket: the padding too
            backend.fill_(bucket.buffer("sum"), value)
            bucket.initialized = [True] * len(bucket.params)
            return
        for i, done in enumerate(bucket.initialized):  # after load_state_dict: the slots not in it
            if not done:
                backend.fill_(bucket.slot(bucket.buffers["sum"], i), value)
                bucket.initialized[i] = True

    def _update(self, group, bucket, present):
        lr = bucket.scalar("lr", group["lr"])
        state_sum, decay = bucket.buffer("sum"), group["lr_decay"]
        if decay:
            bucket.advance_steps(present)  # every program reads the step: count it first
            runs = [(start, end, bucket.counter(cohort), None)
                    for start, end, cohort in bucket.runs(present, bucket.cohort)]
        else:
            runs = [(start, end, 1.0, count) for start, end, count in bucket.counted_runs(present)]
        for start, end, step, count in runs:
            get_backend().adagrad_step_(
                *bucket.spans(start, end, bucket.flat, bucket.grad_flat, state_sum), step, lr,
                decay, group["eps"], group["weight_decay"], group["maximize"], count=count)
