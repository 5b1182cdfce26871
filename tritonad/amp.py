"""Mixed precision, as torch.amp: `autocast` (also `td.autocast`; its per-op policy lives in
autodiff/autocast.py) and `GradScaler`, dynamic loss scaling for float16 training.

    scaler = td.amp.GradScaler()
    with td.autocast("cuda", dtype=td.float16):
        loss = F.cross_entropy(model(x), y)
    scaler.scale(loss).backward()
    scaler.unscale_(opt)                    # optional: before clipping
    td.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    scaler.step(opt)                        # skipped if a gradient is inf or NaN
    scaler.update()

The scale, the count of good steps and the found-inf flag are 1-element float32 arrays on the
device. unscale_ is one kernel over each contiguous run of gradients (an optimizer's flat
buffer: one launch); SGD, Adam and AdamW read the found-inf flag in their fused kernels and
leave everything as it is when it is set (Adam's step count too), and update() is one kernel,
so a step takes no host read. Other optimizers (hand-written ones, Adadelta, RMSprop, Adagrad)
read the flag on the host before stepping, as PyTorch's GradScaler does for every optimizer.
"""
from __future__ import annotations

from .autodiff.autocast import (FLOAT32_OPS, autocast, get_autocast_dtype,  # noqa: F401
                                is_autocast_enabled)
from .backend import get_backend
from .tensor import Tensor

__all__ = ["autocast", "is_autocast_enabled", "get_autocast_dtype", "FLOAT32_OPS", "GradScaler",
           "PRECISIONS", "for_precision"]

# a training recipe's --precision
PRECISIONS = ("fp32", "bf16", "fp16")


def for_precision(precision, device):
    """(autocast, GradScaler) for a training recipe's precision on device: "fp32" (autocast
    off, scaler disabled), "bf16" (autocast to bfloat16, scaler disabled) or "fp16" (autocast
    to float16 and dynamic loss scaling: the optimizer step skipped on the device when a
    gradient is inf or NaN). Use both in every step:
    `with cast: loss = ...; scaler.scale(loss).backward(); scaler.step(opt); scaler.update()`."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    kind = str(device).split(":")[0]
    cast = autocast(device_type=kind, dtype="float16" if precision == "fp16" else "bfloat16",
                    enabled=precision != "fp32")
    return cast, GradScaler(kind, enabled=precision == "fp16")


class GradScaler:
    """Dynamic loss scaling, as torch.amp.GradScaler (same arguments, defaults and rules)."""

    def __init__(self, device="cuda", init_scale=2.0 ** 16, growth_factor=2.0,
                 backoff_factor=0.5, growth_interval=2000, enabled=True):
        if growth_factor <= 1.0:
            raise ValueError(f"GradScaler: growth_factor must be > 1, got {growth_factor}")
        if not 0.0 < backoff_factor < 1.0:
            raise ValueError(f"GradScaler: backoff_factor must lie in (0, 1), got "
                             f"{backoff_factor}")
        if int(growth_interval) != growth_interval or growth_interval < 1:
            raise ValueError(f"GradScaler: growth_interval must be a positive integer, got "
                             f"{growth_interval}")
        self.device, self._enabled = device, bool(enabled)
        self._init_scale, self._growth_factor = float(init_scale), float(growth_factor)
        self._backoff_factor, self._growth_interval = float(backoff_factor), int(growth_interval)
        self._scale = self._tracker = self._found = None  # made at the first scale()
        self._unscaled = set()  # ids of the optimizers unscaled since the last update()
        self._pending_tracker = 0.0  # (a loaded state's count, until the arrays exist)
        self._stepped = False

    def is_enabled(self):
        return self._enabled

    def _lazy_init(self, device):
        if self._scale is None:
            backend = get_backend()
            self._scale = Tensor._wrap(backend.full([1], self._init_scale, _f32(), device))
            self._tracker = Tensor._wrap(backend.full([1], self._pending_tracker, _f32(),
                                                      device))
            self._found = Tensor._wrap(backend.full([1], 0.0, _f32(), device))

    def scale(self, outputs):
        """outputs * scale (a tensor, or tensors in lists and tuples); as given when disabled."""
        if not self._enabled:
            return outputs
        if isinstance(outputs, Tensor):
            self._lazy_init(outputs.device)
            return outputs * self._scale.to(outputs.dtype).reshape(())
        if isinstance(outputs, (list, tuple)):
            return type(outputs)(self.scale(o) for o in outputs)
        raise TypeError(f"GradScaler.scale: expected a tensor or a list/tuple of tensors, got "
                        f"{type(outputs).__name__}")

    def _grads(self, optimizer):
        return [p.grad for group in optimizer.param_groups for p in group["params"]
                if p.grad is not None]

    def unscale_(self, optimizer):
        """Divide the optimizer's gradients by the scale in place, noting any inf or NaN."""
        if not self._enabled:
            return
        if id(optimizer) in self._unscaled:
            raise RuntimeError("GradScaler.unscale_: unscale_() has already been called on this "
                               "optimizer since the last update()")
        if self._scale is None:
            raise RuntimeError("GradScaler.unscale_: no loss was scaled yet (call scale() "
                               "first)")
        from .optim import _contiguous_spans
        grads = self._grads(optimizer)
        backend = get_backend()
        spans, copies = _contiguous_spans([g._data for g in grads])
        backend.amp_unscale_(spans, self._scale._data, self._found._data)
        for g, c in copies:
            backend.copy_(g, c)
        for g in grads:
            g._bump_version()
        self._unscaled.add(id(optimizer))

    def step(self, optimizer, *args, **kwargs):
        """unscale_ (if not done), then optimizer.step(*args) unless a gradient was inf or NaN.
        Returns what step returned (None when it was skipped on the host)."""
        if not self._enabled:
            return optimizer.step(*args, **kwargs)
        if "closure" in kwargs or args:
            raise RuntimeError("GradScaler.step: closures are not supported (as PyTorch)")
        if id(optimizer) not in self._unscaled:
            self.unscale_(optimizer)
        self._stepped = True
        if getattr(optimizer, "_fused", False) and optimizer._reads_skip:
            keep = 1.0 - self._found  # (Adam's step count advances by this)
            optimizer._skip = (self._found._data, keep._data)
            try:
                return optimizer.step()
            finally:
                optimizer._skip = None
        if float(self._found.item()) == 0.0:  # (a host read, as PyTorch's GradScaler)
            return optimizer.step()
        return None

    def update(self, new_scale=None):
        """Grow or back off the scale from this step's found-inf flag (on the device), or set
        it to new_scale (a number or a 1-element tensor)."""
        if not self._enabled:
            return
        if self._scale is None:
            raise RuntimeError("GradScaler.update: no loss was scaled yet")
        backend = get_backend()
        if new_scale is not None:
            value = new_scale._data.reshape(1) if isinstance(new_scale, Tensor) else None
            if value is None:
                backend.fill_(self._scale._data, float(new_scale))
            else:
                backend.copy_(self._scale._data, value)
            backend.fill_(self._found._data, 0.0)
        else:
            backend.amp_update_scale_(self._scale._data, self._tracker._data, self._found._data,
                                      self._growth_factor, self._backoff_factor,
                                      self._growth_interval)
        for t in (self._scale, self._tracker, self._found):
            t._bump_version()
        self._unscaled.clear()
        self._stepped = False

    def get_scale(self):
        """The current scale as a Python float (a host read); 1.0 when disabled."""
        if not self._enabled:
            return 1.0
        return self._init_scale if self._scale is None else float(self._scale.item())

    def get_growth_factor(self):
        return self._growth_factor

    def get_backoff_factor(self):
        return self._backoff_factor

    def get_growth_interval(self):
        return self._growth_interval

    def state_dict(self):
        if not self._enabled:
            return {}
        return {"scale": self.get_scale(), "growth_factor": self._growth_factor,
                "backoff_factor": self._backoff_factor, "growth_interval": self._growth_interval,
                "_growth_tracker": 0 if self._tracker is None else int(self._tracker.item())}

    def load_state_dict(self, state):
        if not self._enabled:
            return
        if not state:
            raise RuntimeError("GradScaler.load_state_dict: the state is empty (saved from a "
                               "disabled scaler?)")
        self._init_scale = float(state["scale"])
        self._growth_factor = float(state["growth_factor"])
        self._backoff_factor = float(state["backoff_factor"])
        self._growth_interval = int(state["growth_interval"])
        if self._scale is not None:
            backend = get_backend()
            backend.fill_(self._scale._data, self._init_scale)
            backend.fill_(self._tracker._data, float(state["_growth_tracker"]))
        else:
            self._pending_tracker = float(state["_growth_tracker"])


def _f32():
    from . import dtypes
    return dtypes.float32
