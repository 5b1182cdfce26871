"""Settings every backend reads: matmul and convolution precision, autotuning, synchronous
error checks (`td.set_matmul_precision`, ...), and the convolution's output size rule. Plain
values with no dependency on the rest of tritonad; backend.py re-exports them."""
from __future__ import annotations

import os

_MATMUL_PRECISIONS = ("highest", "high")
_settings = {"matmul_precision": "highest", "conv_precision": "high",
             "autotune": os.environ.get("TRITONAD_AUTOTUNE", "0") not in ("", "0"),
             "sync_checks": os.environ.get("TRITONAD_SYNC_CHECKS", "0") not in ("", "0")}


def conv_output_hw(x_shape, w_shape, stride, padding, dilation):
    """The output plane (Ho, Wo) of a convolution of an x [N, C, H, W] by a w [Co, C', kh, kw]
    (stride, padding, dilation: pairs), by torch's rule."""
    return tuple((size + 2 * p - d * (k - 1) - 1) // s + 1 for size, k, s, p, d in
                 zip(x_shape[2:], w_shape[2:], stride, padding, dilation))


def set_matmul_precision(precision: str) -> None:
    """"highest" (default): float32 matmul at float32 accuracy, as torch's default: IEEE fp32
    FMA, or 3xTF32 on tensor cores (three TF32 products of split operands, error at the same
    level) where the GPU's tuner measures it faster; "high": TF32 tensor cores for float32
    inputs (about 1e-3 relative error, much faster)."""
    if precision not in _MATMUL_PRECISIONS:
        raise ValueError(f"matmul precision must be one of {_MATMUL_PRECISIONS}, got {precision!r}")
    _settings["matmul_precision"] = precision


def matmul_precision() -> str:
    return _settings["matmul_precision"]


def autotune(enabled: bool = True) -> None:
    """Time the candidate plans of each new matmul and convolution shape and keep the fastest
    (cached on disk for later runs), instead of taking the plan shipped for this GPU or the
    shape heuristic. Off by default: tuning costs seconds per new shape. Also
    TRITONAD_AUTOTUNE=1, or `train --tune`."""
    _settings["autotune"] = bool(enabled)


def autotuning() -> bool:
    return _settings["autotune"]


def set_sync_checks(enabled: bool = True) -> None:
    """Data-dependent errors (a class index out of range in cross_entropy, a row index out of
    bounds) are found by the kernels on the device and raised at the next read of the device
    (.item(), .numpy(), printing, the end of an epoch), so that a training step never waits for
    the GPU. True raises them at the op itself, synchronously (slower; for debugging). Also
    TRITONAD_SYNC_CHECKS=1."""
    _settings["sync_checks"] = bool(enabled)


def sync_checks() -> bool:
    return _settings["sync_checks"]


def set_conv_precision(precision: str) -> None:
    """Float32 convolutions, set apart from matmul as PyTorch does: "high" (default) runs them
    on TF32 tensor cores, like PyTorch's cuDNN default (torch.backends.cudnn.allow_tf32 = True);
    "highest" keeps float32 accuracy, as three TF32 tensor-core products per step (3xTF32;
    TRITONAD_CONV_IEEE=1 computes in IEEE float32 FMA instead, several times slower)."""
    if precision not in _MATMUL_PRECISIONS:
        raise ValueError(f"conv precision must be one of {_MATMUL_PRECISIONS}, got {precision!r}")
    _settings["conv_precision"] = precision


def conv_precision() -> str:
    return _settings["conv_precision"]
