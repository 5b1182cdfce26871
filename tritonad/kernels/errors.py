"""Errors that depend on data (a class index out of range, a row index out of bounds), found by
the kernels on the device and reported at the next point where the host reads the device.

Reading a kernel's verdict right after the launch would make the host wait for the GPU at every
op that checks data (every cross-entropy of a training step), so no step could run ahead of the
GPU. Instead a checking kernel writes what it found into a small device array of flags, one row
per kind of error:

    row = [claimed, position, value, limit]     (int64; claimed is 0 until a kernel reports)

The first report since the last read claims the row (an atomic compare-and-swap) and writes
where the bad value was, the value and the bound it broke. The host reads the flags where it
reads the device anyway (Tensor.item/numpy/tolist/printing, which the Trainer does at the end of
an epoch and a checkpoint does when it saves) and raises the error there, naming the op, the
value and its position, then clears them. The outputs of an op that reported are undefined (the
kernels clamp bad indices so that nothing faults). `td.set_sync_checks(True)` (or
TRITONAD_SYNC_CHECKS=1) reads the flags right after every checking op instead, for debugging.
"""
from __future__ import annotations

import threading

import numpy as np
import torch
import triton
import triton.language as tl

from ..backend import sync_checks
from .plans import launching, not_recording, persistent

WORDS = 4
_ROWS: dict[str, int] = {}                      # check -> its row of the flags
_FLAGS: dict[torch.device, torch.Tensor] = {}   # device -> int64 [ROWS, WORDS]
_LOCK = threading.Lock()
ROWS = 32

_TARGET = "{op}: target {value} is outside [0, {limit}) (at row {position})"
_INDEX = ("{op}: index {value} is out of bounds for dimension 0 with size {limit} (at position "
          "{position})")
# the checks kernels make: name -> (op, exception, message with position, value and limit)
CHECKS = {
    "cross_entropy": ("cross_entropy", ValueError, _TARGET),
    "nll_loss": ("nll_loss", ValueError, _TARGET),
    "gather_rows": ("gather_rows", IndexError, _INDEX),
    "scatter_add_rows": ("scatter_add_rows", IndexError, _INDEX),
    "gather_rows_at_": ("gather_rows_at_", IndexError, _INDEX),
    "mlp_sample": ("mlp_cross_entropy_grads_", IndexError,
                   "{op}: sample index {value} (batch row {position}) is out of bounds for "
                   "dimension 0 with size {limit}"),
    "mlp_target": ("mlp_cross_entropy_grads_", ValueError,
                   "{op}: target {value} (sample {position}) is outside [0, {limit})"),
}
# embeddings and indexing: one row per op that checks its indices
CHECKS.update({op: (op, IndexError, "{op}: index {value} is out of bounds for size {limit} (at "
                    "position {position})")
               for op in ("embedding", "gather", "scatter", "scatter_add", "scatter_reduce",
                          "index_select", "index_add", "index_put", "take_along_dim", "one_hot",
                          "indexing")})


@triton.jit
def report(flag_ptr, bad, position, value, limit):
    """Report the first failing lane of a check: `bad` a boolean block, `position` and `value`
    int blocks of its shape, `limit` a number. A report made since the last read of the flags
    wins (atomic claim of the row); the host raises it later."""
    big = tl.full(position.shape, 2**62, tl.int64)
    first = tl.min(tl.where(bad, position.to(tl.int64), big))
    if first < 2**62:
        at = bad & (position.to(tl.int64) == first)
        bad_value = tl.max(tl.where(at, value.to(tl.int64), -2**62))
        if tl.atomic_cas(flag_ptr, tl.full([], 0, tl.int64), tl.full([], 1, tl.int64)) == 0:
            tl.store(flag_ptr + 1, first)
            tl.store(flag_ptr + 2, bad_value)
            tl.store(flag_ptr + 3, tl.zeros([], tl.int64) + limit)


@triton.jit
def report_at(flag_ptr, position, value, limit):
    """Report one failure already found (scalars): the first report since the last read wins."""
    if tl.atomic_cas(flag_ptr, tl.full([], 0, tl.int64), tl.full([], 1, tl.int64)) == 0:
        # (zeros + x: an int the launch specialised to a constant, 1, becomes an int64 too)
        tl.store(flag_ptr + 1, tl.zeros([], tl.int64) + position)
        tl.store(flag_ptr + 2, tl.zeros([], tl.int64) + value)
        tl.store(flag_ptr + 3, tl.zeros([], tl.int64) + limit)


def _row(check):
    with _LOCK:
        if check not in _ROWS:
            if check not in CHECKS:
                raise KeyError(f"errors: unknown check {check!r}")
            _ROWS[check] = len(_ROWS)
    return _ROWS[check]


def _flags(device):
    flags = _FLAGS.get(device)
    if flags is None:
        from .elementwise import fill_

        # allocated once, outside any plan, and zeroed for real even when first used inside a
        # compile_ahead block (train's precompile): there fill_ would only be compiled, and the
        # flags would hold the allocator's leftovers, read later as errors that never happened
        with not_recording(), launching():
            flags = torch.empty((ROWS, WORDS), dtype=torch.int64, device=device)
            fill_(flags, 0)
        _FLAGS[device] = persistent(flags)
    return flags


def flag(device, check):
    """The flag row (an int64 [WORDS] view of persistent memory) where a kernel on `device`
    reports a failure of `check` (a name in CHECKS)."""
    return _flags(device)[_row(check)]


def check(device=None):
    """Raise the first error reported on `device` (every device if None) since the last check,
    and clear the flags. A no-op while a CUDA graph is being captured."""
    for dev, flags in list(_FLAGS.items()):
        if device is not None and dev != device:
            continue
        if dev.type == "cuda" and torch.cuda.is_current_stream_capturing():
            continue
        host = flags.cpu().numpy().copy()  # (a CPU tensor's .cpu() is itself)
        if not np.any(host[:, 0]):
            continue
        from .elementwise import fill_

        with not_recording():
            fill_(flags, 0)
        for name, row in sorted(_ROWS.items(), key=lambda item: item[1]):
            if host[row, 0]:
                op, exc, message = CHECKS[name]
                _, position, value, limit = (int(v) for v in host[row])
                raise exc(message.format(op=op, position=position, value=value, limit=limit)
                          + "; found on the device and reported at this read of it (set "
                          "td.set_sync_checks(True) or TRITONAD_SYNC_CHECKS=1 to raise it at "
                          "the op itself)")


def clear():
    """Forget every error reported and not yet raised (tests start from clean flags)."""
    from .elementwise import fill_

    with not_recording():
        for flags in _FLAGS.values():
            fill_(flags, 0)


def after(device):
    """Call after a checking op: with synchronous checks on, read the flags now."""
    if sync_checks():
        check(device)
