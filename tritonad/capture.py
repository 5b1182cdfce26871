"""Capture a whole training step as a CUDA graph and replay it.

On MNIST-sized models the GPU sits idle between kernel launches: a Triton launch from Python
costs ~9 us of host time while each kernel runs for a few. Capturing the step once (batch
gather, forward, backward, optimizer update, metric accumulation) and replaying the graph costs
under 1 us per kernel, with the data resident on the GPU.

    step = CapturedStep(train_step)      # train_step(batch_indices) -> loss tensor
    for idx in batches:
        loss = step(idx)                  # eager for the first `warmup` calls, then replays

What a replay reuses from the capture (frozen), so keep it fixed or re-capture:
- the shapes, dtypes and devices of the inputs (checked: a mismatch raises CaptureError) and the
  values of non-tensor arguments (checked too);
- every Python-level decision the step made: branches taken, Python numbers baked into kernel
  arguments, the batch size, which parameters had gradients;
- the memory of parameters, gradients and optimizer state (do not re-create the optimizer or move
  the model after capture);
- random numbers: a draw inside the step would repeat at every replay, so drawing one while
  capturing raises (use dropout in eager steps, or p=0 under capture);
- optimizer hyper-parameters, except the learning rate, which tritonad's optimizers keep in
  device memory: call `optimizer.sync()` (done by `tritonad.train`) after a scheduler changes it
  and before the next replay;
- outputs are the same tensors at every replay, overwritten in place: copy what you keep.
Gradient accumulation works under capture when gradients are zeroed inside the captured step
(zero_grad(set_to_none=True) at its start) or with zero_grad(set_to_none=False) outside it; a
`set_to_none=True` outside a captured step has no effect on the replayed kernels.
"""
from __future__ import annotations

import time

import torch

from .backend import get_backend
from .kernels.launch import gc_paused
from .tensor import Tensor


class CaptureError(RuntimeError):
    pass


def _signature(args):
    sig = []
    for a in args:
        if isinstance(a, Tensor):
            sig.append(("tensor", a.shape, a.dtype.name, str(a.device)))
        else:
            sig.append(("value", repr(a)))
    return tuple(sig)


class CapturedStep:
    """Run `fn` eagerly `warmup` times (kernels compile and autotune there), capture it as a CUDA
    graph on the next call, and replay the graph from then on."""

    capture_seconds = 0.0  # spent capturing, all captured steps together (start-up reports)

    def __init__(self, fn, warmup=2):
        if not torch.cuda.is_available():
            raise CaptureError("CapturedStep needs a CUDA GPU (graphs are a CUDA feature)")
        self.fn = fn
        self.warmup = max(1, int(warmup))
        self.calls = 0
        self.graph = None
        self._signature = None
        self._static_inputs = None
        self._outputs = None

    @property
    def captured(self) -> bool:
        return self.graph is not None

    def __call__(self, *args):
        self.calls += 1
        if self.calls <= self.warmup:
            return self.fn(*args)
        if self.graph is None:
            return self._capture(args)
        self._check(args)
        backend = get_backend()
        for static, new in zip(self._static_inputs, args):
            if isinstance(new, Tensor) and new._data is not static._data:
                backend.copy_(static._data, new._data)
        self.graph.replay()
        return self._outputs

    def _check(self, args):
        sig = _signature(args)
        if sig != self._signature:
            raise CaptureError(
                "captured step called with other arguments than at capture:\n"
                f"  captured: {self._signature}\n  now:      {sig}\n"
                "shapes, dtypes, devices and non-tensor values are frozen at capture; run this "
                "call eagerly or capture another step for it")

    def _capture(self, args):
        start = time.perf_counter()
        try:
            return self._capture_now(args)
        finally:
            CapturedStep.capture_seconds += time.perf_counter() - start

    def _capture_now(self, args):
        self._signature = _signature(args)
        # inputs live in static buffers that replays refill
        self._static_inputs = [Tensor._wrap(get_backend().contiguous(a._data))
                               if isinstance(a, Tensor) else a for a in args]
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        try:
            with gc_paused(), torch.cuda.graph(graph):
                self._outputs = self.fn(*self._static_inputs)
        except BaseException:
            # NOTE: free the failed graph now: left to the garbage collector, it may be
            # destroyed while another capture runs, which invalidates that capture
            graph.reset()
            raise
        self.graph = graph
        self.graph.replay()  # capturing recorded the step without running it
        return self._outputs

