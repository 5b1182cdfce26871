"""The numpy backend's fused optimizer updates (in place on flat float32 buffers), total_norm
and clip_scale_."""
from __future__ import annotations

import math

import numpy as np
import torch

from .. import dtypes
from .arrays import _workspace, to_numpy, write


class OptimOps:
    """Mixed into NumpyBackend."""

    # optimizers -------------------------------------------------------------------------------
    @staticmethod
    def _number(v):
        return float(to_numpy(v).reshape(-1)[0]) if isinstance(v, torch.Tensor) else float(v)

    @staticmethod
    def _decayed_grad(param, grad, weight_decay, maximize):
        """(p, g): the parameters (a view) and g = (-grad if maximize else grad) + wd * p, the
        gradient itself (a view: the updates only read it) when that is all."""
        p, g = to_numpy(param), to_numpy(grad).astype(np.float32, copy=False)
        if maximize:
            g = -g
        if weight_decay:
            g = g + np.float32(weight_decay) * p
        return p, g

    @staticmethod
    def _count(count):
        if count is not None:
            c = to_numpy(count)
            c[...] = c + np.float32(1)

    def sgd_step_(self, param, grad, momentum_buf, lr, momentum=0.0, dampening=0.0,
                  weight_decay=0.0, nesterov=False, maximize=False, first_step=False,
                  skip=None):
        if skip is not None and self._number(skip) != 0:
            return param
        p, g = self._decayed_grad(param, grad, weight_decay, maximize)
        lr, momentum = np.float32(self._number(lr)), np.float32(self._number(momentum))
        # in place, each product and sum rounded once as written (a flat buffer of a whole
        # model: temporaries of its size cost as much as the arithmetic)
        if momentum:
            buf = to_numpy(momentum_buf)
            if first_step:
                buf[...] = g
            else:
                np.multiply(buf, momentum, out=buf)
                damped = g if dampening == 0 else g * np.float32(1 - dampening)  # (1 * g = g)
                np.add(buf, damped, out=buf)
            g = g + momentum * buf if nesterov else buf
        step = _workspace("sgd_step", g.shape, np.result_type(lr, g))
        np.multiply(g, lr, out=step)
        np.subtract(p, step, out=p)
        return param

    def adam_step_(self, param, grad, exp_avg, exp_avg_sq, step, lr, beta1=0.9, beta2=0.999,
                   eps=1e-8, weight_decay=0.0, decoupled_weight_decay=False, maximize=False,
                   skip=None):
        if skip is not None and self._number(skip) != 0:
            return param
        p, g = to_numpy(param), to_numpy(grad).astype(np.float32)
        m, v = to_numpy(exp_avg), to_numpy(exp_avg_sq)
        lr, step = np.float32(self._number(lr)), self._number(step)
        if maximize:
            g = -g
        if weight_decay:
            if decoupled_weight_decay:
                p *= np.float32(1 - lr * weight_decay)
            else:
                g = g + np.float32(weight_decay) * p
        m[...] = beta1 * m + (1 - beta1) * g
        v[...] = beta2 * v + (1 - beta2) * g * g
        bias1 = np.float32(1 - beta1 ** step)
        bias2 = np.float32(1 - beta2 ** step)
        p -= lr * (m / bias1) / (np.sqrt(v / bias2) + np.float32(eps))
        return param

    # NOTE: the three below compute in float32 in torch's order of operations (1 - rho and
    # 1 - alpha rounded once from float64, as torch's scalar arguments), so that hundreds of
    # steps agree with torch.optim to float32 rounding
    def adadelta_step_(self, param, grad, square_avg, acc_delta, lr, rho=0.9, eps=1e-6,
                       weight_decay=0.0, maximize=False, count=None):
        p, g = self._decayed_grad(param, grad, weight_decay, maximize)
        v, u = to_numpy(square_avg), to_numpy(acc_delta)
        f = np.float32
        lr, eps, keep, take = f(self._number(lr)), f(eps), f(rho), f(1 - rho)
        v[...] = keep * v + take * g * g
        delta = np.sqrt(u + eps) / np.sqrt(v + eps) * g
        u[...] = keep * u + take * delta * delta
        p -= lr * delta
        self._count(count)
        return param

    def rmsprop_step_(self, param, grad, square_avg, grad_avg, momentum_buf, lr, alpha=0.99,
                      eps=1e-8, weight_decay=0.0, momentum=0.0, centered=False, maximize=False,
                      count=None):
        p, g = self._decayed_grad(param, grad, weight_decay, maximize)
        v = to_numpy(square_avg)
        f = np.float32
        lr, momentum, eps = f(self._number(lr)), f(self._number(momentum)), f(eps)
        w = f(1 - alpha)
        v[...] = f(alpha) * v + w * g * g
        square = v
        if centered:
            a = to_numpy(grad_avg)
            a[...] = a + w * (g - a) if w < 0.5 else g - (g - a) * (f(1) - w)  # torch's lerp
            square = v - a * a
        avg = np.sqrt(square) + eps
        if momentum:
            buf = to_numpy(momentum_buf)
            buf[...] = momentum * buf + g / avg
            p -= lr * buf
        else:
            p -= lr * (g / avg)
        self._count(count)
        return param

    def adagrad_step_(self, param, grad, state_sum, step, lr, lr_decay=0.0, eps=1e-10,
                      weight_decay=0.0, maximize=False, count=None):
        p, g = self._decayed_grad(param, grad, weight_decay, maximize)
        s = to_numpy(state_sum)
        f = np.float32
        lr = f(self._number(lr))
        clr = lr / (f(1) + (f(self._number(step)) - f(1)) * f(lr_decay)) if lr_decay else lr
        s[...] = s + g * g
        p -= clr * (g / (np.sqrt(s) + f(eps)))
        self._count(count)
        return param

    def total_norm(self, arrays, norm_type=2.0):
        """The L_p norm of all elements of all arrays together (0-d float32): p = 2, 1, inf
        (max |x|) or any finite p > 0."""
        arrays = list(arrays)
        if not arrays:
            raise ValueError("total_norm: no arrays given")
        p = float(norm_type)
        if not p > 0:
            raise ValueError(f"total_norm: norm_type must be a positive number or inf, got {p}")
        values = np.concatenate([np.abs(to_numpy(a).astype(np.float64)).reshape(-1)
                                 for a in arrays])
        if p == math.inf:
            norm = values.max() if values.size else 0.0
        else:
            norm = np.sum(values ** p) ** (1.0 / p)
        return self._new(np.float32(norm), dtypes.float32)

    def clip_scale_(self, arrays, total_norm, max_norm, eps=1e-6):
        """x *= min(1, max_norm / (total_norm + eps)) for each array, in place."""
        coef = np.minimum(np.float32(max_norm) / (np.float32(self._number(total_norm))
                                                  + np.float32(eps)), np.float32(1.0))
        for a in arrays:
            write(a, self._float_in(a, dtypes.get_dtype(a.dtype)) * coef)
        return list(arrays)

    # loss scaling (amp.GradScaler), as torch's _amp_foreach_non_finite_check_and_unscale_ and
    # _amp_update_scale_
    def amp_unscale_(self, arrays, scale, found_inf):
        inv = np.float32(1.0) / np.float32(self._number(scale))
        for a in arrays:
            x = to_numpy(a).astype(np.float32)  # (a copy for bfloat16: written back below)
            if x.size and not np.isfinite(x).all():
                to_numpy(found_inf)[...] = 1.0
            write(a, x * inv)
        return found_inf

    def amp_update_scale_(self, scale, growth_tracker, found_inf, growth_factor, backoff_factor,
                          growth_interval):
        s, t, f = to_numpy(scale), to_numpy(growth_tracker), to_numpy(found_inf)
        if f.reshape(-1)[0] != 0:
            s[...] = s * np.float32(backoff_factor)
            t[...] = 0.0
        else:
            good = t + np.float32(1.0)
            grown = s * np.float32(growth_factor)
            if good.reshape(-1)[0] >= growth_interval:
                if np.isfinite(grown).all():
                    s[...] = grown
                t[...] = 0.0
            else:
                t[...] = good
        f[...] = 0.0
        return scale

