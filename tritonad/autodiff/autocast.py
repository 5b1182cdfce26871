"""Autocast: ops pick their own precision inside a block, as torch.autocast does.

    with td.autocast(device_type="cuda", dtype=td.bfloat16):
        loss = F.cross_entropy(model(x), y)     # matmuls and convolutions in bf16,
    loss.backward()                             # the loss and softmax in float32

Inside the block, on tensors of the block's device type:
- LOW ops (matmul, linear, convolution, attention) cast their float32 operands to the block's
  dtype and run on the tensor cores in it; their outputs are of that dtype.
- FLOAT32 ops (reductions that sum many terms, softmax, log-softmax, norms, losses, exp, log,
  pow and the other ops PyTorch lists as autocasting to float32) cast half operands to float32.
- Everything else runs in its inputs' promoted type (an add of a bf16 and a float32 tensor is
  float32, as in PyTorch).

Casts are recorded ops: the gradient of a weight cast to bf16 comes back to it in float32. A
leaf that requires a gradient (a weight) is cast once per block and the cast reused (the cache
empties when the outermost block exits), so a weight used by several ops, or by every step of a
recurrent loop, is converted once. Weights stay float32 throughout.
"""
from __future__ import annotations

import functools
import threading

from .. import dtypes
from ..tensor import Tensor

# the table's entries and composites that run in float32 under autocast (PyTorch's list of
# CUDA ops that autocast to float32, where tritonad has them)
FLOAT32_OPS = frozenset({
    "exp", "expm1", "log", "log1p", "log2", "log10", "pow", "reciprocal", "rsqrt", "softplus",
    "sinh", "cosh", "tan", "acos", "asin", "erfinv",
    "sum", "prod", "cumsum", "cumprod", "softmax", "log_softmax", "logsumexp", "norm",
    "layer_norm", "group_norm", "rms_norm", "normalize", "cross_entropy",
    "nll_loss", "mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss", "kl_div",
    "binary_cross_entropy_with_logits", "cosine_similarity",
})
_LOW_TYPES = ("float16", "bfloat16")
_DEFAULT_DTYPE = {"cuda": dtypes.float16, "cpu": dtypes.bfloat16}


class _State(threading.local):
    """Per thread: the autocast in force for each device type ({type: dtype}), how deep the
    blocks nest, and the casts of weights made in the outermost block."""

    def __init__(self):
        self.dtype = {}
        self.depth = 0
        self.cache = {}


state = _State()


class autocast:
    """Autocast for a block (`with`) or a function (decorator); see the module docstring.

    device_type: "cuda" or "cpu" (the type of the tensors it applies to); dtype: td.float16 or
    td.bfloat16 (default: float16 on "cuda", bfloat16 on "cpu", as PyTorch); enabled=False runs
    the block at full precision (and turns off an enclosing autocast of that device type);
    cache_enabled: reuse each weight's cast within the block."""

    def __init__(self, device_type="cuda", dtype=None, enabled=True, cache_enabled=True):
        if device_type not in _DEFAULT_DTYPE:
            raise ValueError(f"autocast: device_type must be 'cuda' or 'cpu', got {device_type!r}")
        dtype = _DEFAULT_DTYPE[device_type] if dtype is None else dtypes.get_dtype(dtype)
        if dtype.name not in _LOW_TYPES:
            raise ValueError(f"autocast: dtype must be td.float16 or td.bfloat16, got {dtype}")
        self.device_type, self.dtype = device_type, dtype
        self.enabled, self.cache_enabled = bool(enabled), bool(cache_enabled)
        self._previous = []

    def __enter__(self):
        self._previous.append(state.dtype)
        changed = dict(state.dtype)
        if self.enabled:
            changed[self.device_type] = self.dtype
        else:
            changed.pop(self.device_type, None)
        state.dtype = changed
        state.depth += 1
        return self

    def __exit__(self, *exc):
        state.dtype = self._previous.pop()
        state.depth -= 1
        if state.depth == 0:
            state.cache = {}

    def __call__(self, fn):
        @functools.wraps(fn)
        def wrapped(*args, **kwargs):
            with autocast(self.device_type, self.dtype, self.enabled, self.cache_enabled):
                return fn(*args, **kwargs)
        return wrapped


def is_autocast_enabled(device_type="cuda") -> bool:
    return device_type in state.dtype


def get_autocast_dtype(device_type="cuda"):
    return state.dtype.get(device_type, _DEFAULT_DTYPE[device_type])


def _target(x):
    """The dtype autocast lowers tensor x to, or None (no autocast for its device, or not a
    float32 tensor)."""
    if not isinstance(x, Tensor) or x.dtype.name != "float32":
        return None
    return state.dtype.get(x._data.device.type)


def low(*tensors):
    """The operands of a LOW op (matmul, linear, convolution, attention): float32 tensors cast to
    the autocast dtype of their device; anything else as given. Call only while
    `state.dtype` is non-empty (the ops check that first: it costs one attribute read)."""
    out = []
    for x in tensors:
        dtype = _target(x)
        if dtype is None:
            out.append(x)
        elif x._requires_grad and x.grad_fn is None:  # a weight: cast once per block
            key = id(x)
            hit = state.cache.get(key)
            if hit is not None and hit[0] is x and hit[1] == x._version and hit[2].dtype == dtype:
                out.append(hit[2])
            else:
                cast = x.to(dtype)
                state.cache[key] = (x, x._version, cast)
                out.append(cast)
        else:
            out.append(x.to(dtype))
    return out[0] if len(out) == 1 else out


def float32(*tensors):
    """The operands of a FLOAT32 op: half tensors on a device under autocast cast to float32."""
    out = []
    for x in tensors:
        if isinstance(x, Tensor) and x.dtype.name in _LOW_TYPES and \
                x._data.device.type in state.dtype:
            out.append(x.to(dtypes.float32))
        else:
            out.append(x)
    return out[0] if len(out) == 1 else out


def float32_op(fn):
    """fn with its tensor arguments cast to float32 under autocast (a FLOAT32 op's public form);
    outside autocast the one check is an attribute read."""
    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        if state.dtype:
            args = [float32(a) if isinstance(a, Tensor) else a for a in args]
        return fn(*args, **kwargs)
    return wrapped
