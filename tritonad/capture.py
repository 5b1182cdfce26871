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
  capturing raises, unless the step is given `random_base` (an int64 [1] device array that the
  step itself fills with the stream's offset at each call, as ScheduledStep does): its draws
  (dropout, random batches, augmentation) then count from that device value
  (generator.counted_from), in the warm-up calls too, and each replay draws the numbers an
  eager step would have;
- optimizer hyper-parameters, except the learning rate, which tritonad's optimizers keep in
  device memory: call `optimizer.sync()` (done by `tritonad.train`) after a scheduler changes it
  and before the next replay;
- outputs are the same tensors at every replay, overwritten in place: copy what you keep.
Gradient accumulation works under capture when gradients are zeroed inside the captured step
(zero_grad(set_to_none=True) at its start) or with zero_grad(set_to_none=False) outside it; a
`set_to_none=True` outside a captured step has no effect on the replayed kernels.
"""
from __future__ import annotations

import contextlib
import time

import torch

from . import generator
from .backend import get_backend
from .kernels.launch import gc_paused
from .tensor import Tensor


class CaptureError(RuntimeError):
    pass


def capture_default(device) -> bool:
    """Whether a training recipe captures its step by default: on a CUDA device with the
    triton backend, not on the CPU or the numpy backend."""
    return str(device).startswith("cuda") and getattr(get_backend(), "name", "") == "triton"


def synchronize(device):
    """Wait for the device (start-up measurements; nothing to wait for on the CPU)."""
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


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

    def __init__(self, fn, warmup=2, random_base=None):
        if not torch.cuda.is_available():
            raise CaptureError("CapturedStep needs a CUDA GPU (graphs are a CUDA feature)")
        self.fn = fn
        self.random_base = random_base
        self.random_draws = 0  # counters a replay takes from the global stream
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
            if self.random_base is None:
                return self.fn(*args)
            # the warm-up steps count from the device base too: the kernels that read it
            # compile here, not while capturing
            with generator.counted_from(self.random_base) as drawn:
                out = self.fn(*args)
            generator.advance(drawn["used"])
            return out
        if self.graph is None:
            return self._capture(args)
        self._check(args)
        backend = get_backend()
        for static, new in zip(self._static_inputs, args):
            if isinstance(new, Tensor) and new._data is not static._data:
                backend.copy_(static._data, new._data)
        self.graph.replay()
        generator.advance(self.random_draws)
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
        counting = contextlib.nullcontext({"used": 0}) if self.random_base is None else \
            generator.counted_from(self.random_base)
        try:
            with gc_paused(), counting as drawn, torch.cuda.graph(graph):
                self._outputs = self.fn(*self._static_inputs)
            self.random_draws = drawn["used"]
        except BaseException:
            # NOTE: free the failed graph now: left to the garbage collector, it may be
            # destroyed while another capture runs, which invalidates that capture
            graph.reset()
            raise
        self.graph = graph
        self.graph.replay()  # capturing recorded the step without running it
        generator.advance(self.random_draws)
        return self._outputs



class ScheduledStep:
    """A training step without arguments, eager or captured, whose per-step values the host
    writes ahead into pinned tables that the step reads on the device at its own cursor (the
    machinery of train.Trainer's captured step, for recipes that draw their batches inside the
    step: tritonad.gpt, tritonad.resnet):
    - the optimizer's device hyperparameters (a scheduled learning rate), held by the step for
      its lifetime (Optimizer.fed_hyperparameters; close() gives them back);
    - the random stream's offset, copied into the device base that the step's draws count from
      (dropout, random windows, augmentation: generator.counted_from), so that every replay
      draws new numbers, the ones an eager run would have.

        step = ScheduledStep(train_step, optimizer, steps, device, graph=True)
        for s in range(steps):
            loss = step()          # eager for the first `warmup` calls, then graph replays
            scheduler.step()       # the next call's learning rate goes into its table row
        step.close()

    graph=False runs train_step eagerly every call (the optimizer reads its hyperparameters as
    usual). Row s of the tables belongs to call s (taken modulo `rows`): the host never waits
    for the GPU, and never rewrites a row that a queued replay may still read while fewer than
    `rows` calls are queued."""

    def __init__(self, fn, optimizer, rows, device, graph=True, warmup=2):
        self.fn, self.optimizer, self.calls = fn, optimizer, 0
        self.captured = None
        if not graph:
            return
        from . import dtypes
        from .tensor import zeros

        rows = max(1, int(rows))
        self._cursor = zeros((), dtype="int64", device=device)
        self._base = get_backend().full([1], 0, dtypes.int64, device)
        self._feeding = optimizer.fed_hyperparameters()
        self._hyper = self._feeding.__enter__()
        self._tables = [torch.empty((rows, a.numel()), dtype=torch.float32, pin_memory=True)
                        for a in self._hyper]
        self._table_rows = [t.numpy() for t in self._tables]
        self._offsets = torch.empty((rows, 1), dtype=torch.int64, pin_memory=True)
        self._offset_rows = self._offsets.numpy()
        self.captured = CapturedStep(self._fed_step, warmup=warmup, random_base=self._base)

    def _fed_step(self):
        backend, cursor = get_backend(), self._cursor._data
        for table, array in zip(self._tables, self._hyper):
            backend.take_row_(table, cursor, array)
        backend.take_row_(self._offsets, cursor, self._base, advance=True)
        self._cursor._bump_version()
        return self.fn()

    def __call__(self):
        if self.captured is None:
            self.calls += 1
            return self.fn()
        row = self.calls % len(self._offset_rows)
        values, start = self.optimizer.hyperparameter_values(), 0
        for table in self._table_rows:
            table[row] = values[start:start + table.shape[1]]
            start += table.shape[1]
        self._offset_rows[row, 0] = generator.get_rng_state()["offset"]
        self.calls += 1
        return self.captured()

    def close(self):
        """Give the optimizer its hyperparameters back (the next sync() writes them all)."""
        if self.captured is not None and self._feeding is not None:
            self._feeding.__exit__(None, None, None)
            self._feeding = None
            self.optimizer.sync()
