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


def _pdl_available() -> bool:
    """Programmatic dependent launch: compiled Triton on a Hopper-or-newer GPU, unless
    TRITONAD_PDL=0."""
    if INTERPRET or os.environ.get("TRITONAD_PDL", "1") in ("", "0"):
        return False
    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 9


# Programmatic dependent launch (PDL). A kernel launched with launch_pdl may be scheduled while
# the kernel before it in the stream still runs; its first statements must then be
#     if GDC:
#         tl.extra.cuda.gdc_wait()                # the kernels before have finished, memory visible
#         tl.extra.cuda.gdc_launch_dependents()   # the next kernel may be scheduled now
# before any load or store (a write could otherwise race a read of the kernel before). Inside a
# CUDA graph this hides most of the launch latency of each dependent kernel: a chain of tiny
# kernels took 0.70-0.95 us per kernel instead of 0.97-1.38 us on an H200
# (benchmarks/probe_pdl.py, 2026-11-21). Launch such kernels with `**PDL`.
PDL = {"GDC": True, "launch_pdl": True} if _pdl_available() else {"GDC": False}


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
