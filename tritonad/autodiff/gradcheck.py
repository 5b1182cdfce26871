"""Check analytic gradients against float64 central differences under a random cotangent.

For f: inputs -> output and a random cotangent u, the analytic vector-Jacobian product
u^T J is compared with the numerical one, element by element of each input:
    (u . f(x + eps e_i) - u . f(x - eps e_i)) / (2 eps).
A random u (rather than summing the output) catches gradients that are right only in sum.
"""
from __future__ import annotations

import numpy as np

from .. import dtypes
from ..tensor import Tensor, tensor
from .function import run_backward
from .grad_mode import enable_grad, no_grad


class GradcheckError(AssertionError):
    pass


def _as_tuple(out):
    return out if isinstance(out, tuple) else (out,)


def _dot(outputs, cotangents):
    return sum(float(np.sum(o.numpy().astype(np.float64) * u)) for o, u in zip(outputs, cotangents))


def vjp(fn, inputs, cotangents, create_graph=False):
    """u^T J for each input that requires grad (zeros where the output does not depend on it)."""
    outputs = _as_tuple(fn(*inputs))
    pairs = [(o, tensor(u, dtype=o.dtype, device=o.device)) for o, u in zip(outputs, cotangents)
             if o.requires_grad]
    wanted = [t for t in inputs if isinstance(t, Tensor) and t.requires_grad]
    grads = run_backward([o for o, _ in pairs], [u for _, u in pairs], create_graph=create_graph,
                         retain_graph=create_graph, inputs=wanted) if pairs else [None] * len(wanted)
    return [g if g is not None else None for g in grads], wanted


def numerical_vjp(fn, inputs, cotangents, eps=1e-6):
    """Central differences of u . f with respect to each input that requires grad."""
    result = []
    for k, x in enumerate(inputs):
        if not (isinstance(x, Tensor) and x.requires_grad):
            continue
        base = x.numpy().astype(np.float64).copy()
        grad = np.zeros_like(base)
        for i in np.ndindex(*base.shape):
            values = []
            for sign in (1, -1):
                moved = base.copy()
                moved[i] += sign * eps
                args = list(inputs)
                args[k] = tensor(moved, dtype=x.dtype, device=x.device)
                with no_grad():
                    values.append(_dot(_as_tuple(fn(*args)), cotangents))
            grad[i] = (values[0] - values[1]) / (2 * eps)
        result.append(grad)
    return result


def gradcheck(fn, inputs, eps=1e-6, atol=1e-5, rtol=1e-4, seed=0, raise_exception=True):
    """True if fn's analytic gradients match finite differences (inputs should be float64).

    fn takes the inputs and returns a Tensor or a tuple of Tensors.
    """
    inputs = tuple(inputs)
    for x in inputs:
        if isinstance(x, Tensor) and x.requires_grad and x.dtype is not dtypes.float64:
            raise GradcheckError(f"gradcheck: inputs should be float64 for finite differences to be "
                                 f"meaningful, got {x.dtype}")
    rng = np.random.default_rng(seed)
    with no_grad():
        outputs = _as_tuple(fn(*inputs))
    cotangents = [rng.standard_normal(o.shape) for o in outputs]
    analytic, wanted = vjp(fn, inputs, cotangents)
    numeric = numerical_vjp(fn, inputs, cotangents, eps)
    for position, (a, n, x) in enumerate(zip(analytic, numeric, wanted)):
        a = np.zeros(x.shape) if a is None else a.numpy().astype(np.float64)
        if a.shape != n.shape:
            raise GradcheckError(f"gradcheck: gradient {position} has shape {a.shape}, input has "
                                 f"{n.shape}")
        bad = ~np.isclose(a, n, atol=atol, rtol=rtol)
        if bad.any():
            if not raise_exception:
                return False
            where = list(zip(*np.nonzero(bad)))[:5]
            detail = ", ".join(f"{tuple(int(j) for j in i)}: analytic {a[i]:.6g} numeric "
                               f"{n[i]:.6g}" for i in where)
            raise GradcheckError(f"gradcheck: input {position} (shape {x.shape}): {bad.sum()} of "
                                 f"{bad.size} gradient entries differ; first: {detail}")
    return True


def gradgradcheck(fn, inputs, eps=1e-6, atol=1e-5, rtol=1e-4, seed=1):
    """gradcheck of the gradient itself: the backward, built with create_graph, is
    differentiated again against finite differences."""
    inputs = tuple(inputs)
    rng = np.random.default_rng(seed)
    with no_grad():
        outputs = _as_tuple(fn(*inputs))
    cotangents = [rng.standard_normal(o.shape) for o in outputs]

    differentiable = [isinstance(x, Tensor) and x.requires_grad for x in inputs]

    def first_grads(*args):
        # finite differences call this under no_grad with plain tensors: rebuild the leaves
        with enable_grad():
            args = [a.detach().requires_grad_() if d and not a.requires_grad else a
                    for a, d in zip(args, differentiable)]
            grads, wanted = vjp(fn, args, cotangents, create_graph=True)
            return tuple(g if g is not None else (w * 0.0) for g, w in zip(grads, wanted))

    return gradcheck(first_grads, inputs, eps, atol, rtol, seed)
