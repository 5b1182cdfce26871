"""Shared launch helpers for the kernel families.

Importing this module decides how Triton runs: compiled on a CUDA GPU, or under Triton's
interpreter on CPU tensors when no GPU is present (TRITON_INTERPRET=1 must be set before triton
is imported, so tritonad imports this first).
"""
from __future__ import annotations

import contextlib
import gc
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402,F401

from .. import dtypes  # noqa: E402

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
TRITON_VERSION = tuple(int(p) for p in triton.__version__.split(".")[:2])

cdiv = triton.cdiv
next_power_of_2 = triton.next_power_of_2


@contextlib.contextmanager
def gc_paused(collect=True):
    """Around a CUDA graph capture: collect garbage first (unless collect=False), then keep the
    collector off until the capture ends. A CUDA graph that is garbage in a reference cycle
    (say a dropped Trainer's captured step) would otherwise be destroyed whenever the collector
    runs, possibly in the middle of this capture, which invalidates it (torch's `graph` context
    no longer collects before capturing)."""
    if collect:
        gc.collect()
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def empty(shape, dtype, device) -> torch.Tensor:
    """Uninitialised contiguous output memory; dtype may be a tritonad DType or a torch dtype."""
    torch_dtype = dtype.torch if isinstance(dtype, dtypes.DType) else dtype
    return torch.empty(tuple(shape), dtype=torch_dtype, device=device)


def dtype_of(x) -> dtypes.DType:
    return dtypes.get_dtype(x.dtype)


def check_same_shape(op, *arrays):
    shapes = {tuple(a.shape) for a in arrays}
    if len(shapes) > 1:
        raise ValueError(f"{op}: shapes differ: {' vs '.join(str(tuple(a.shape)) for a in arrays)}")


def check_same_dtype(op, *arrays):
    kinds = {a.dtype for a in arrays}
    if len(kinds) > 1:
        raise TypeError(f"{op}: dtypes differ: {', '.join(dtype_of(a).name for a in arrays)}")


def num_warps_for(block: int) -> int:
    """A deterministic warp count for a 1-d block of `block` elements."""
    if block >= 8192:
        return 16 if not INTERPRET else 1
    if block >= 2048:
        return 8
    if block >= 1024:
        return 4
    return 4 if block >= 512 else 2
