"""Reverse-mode autodiff: Function, the backward engine, grad modes and gradcheck."""
from .function import Context, Function, run_backward
from .grad_mode import enable_grad, is_grad_enabled, no_grad, set_grad_enabled
from .gradcheck import GradcheckError, gradcheck, gradgradcheck
from . import methods  # noqa: F401,E402  (Tensor's operators and methods)


def grad(outputs, inputs, grad_outputs=None, retain_graph=None, create_graph=False,
         allow_unused=False):
    """d(outputs)/d(inputs) contracted with grad_outputs, returned (no .grad is touched).

    `td.grad(y, x)` for a scalar y; pass grad_outputs (one per output) otherwise.
    """
    from ..tensor import Tensor, full

    single_out = isinstance(outputs, Tensor)
    outputs = [outputs] if single_out else list(outputs)
    single_in = isinstance(inputs, Tensor)
    inputs = [inputs] if single_in else list(inputs)
    if grad_outputs is None:
        grad_outputs = [None] * len(outputs)
    elif isinstance(grad_outputs, Tensor):
        grad_outputs = [grad_outputs]
    seeds = []
    for out, g in zip(outputs, grad_outputs):
        if g is None:
            if out.numel() != 1:
                raise RuntimeError(f"grad: grad_outputs must be given for an output of shape "
                                   f"{out.shape} (only scalar outputs get an implicit 1)")
            g = full(out.shape, 1.0, dtype=out.dtype, device=out.device)
        if g.shape != out.shape:
            raise RuntimeError(f"grad: grad_output of shape {g.shape} does not match output of "
                               f"shape {out.shape}")
        seeds.append(g)
    for t in inputs:
        if not t.requires_grad:
            raise RuntimeError(f"grad: an input of shape {t.shape} does not require grad")
    retain = create_graph if retain_graph is None else retain_graph
    grads = run_backward(outputs, seeds, retain, create_graph, inputs=inputs)
    if not allow_unused and any(g is None for g in grads):
        raise RuntimeError("grad: one of the inputs was not used to compute the outputs; pass "
                           "allow_unused=True to get None for it")
    return tuple(grads)


__all__ = ["Context", "Function", "run_backward", "enable_grad", "is_grad_enabled", "no_grad",
           "set_grad_enabled", "gradcheck", "gradgradcheck", "GradcheckError", "grad"]
