"""A sum scan of long rows in one launch: decoupled look-back (Merrill and Garland, "Single-pass
Parallel Prefix Scan with Decoupled Look-back", NVIDIA 2016), for cumsum in float32 (float32,
float16 and bfloat16 inputs; the accumulation is float32 either way).

Applies where scan.py would otherwise split long rows into chunks and launch three kernels
(chunk totals, their scan, the chunks again): few rows, each longer than one chunk. Every
program takes a ticket (an atomic counter, so that tickets go out in the order programs start:
a program only ever waits on programs that are already running, which is what makes spinning
safe on a GPU), scans its chunk in registers, publishes the chunk's total, looks back over the
chunks before it in its row for their published totals until it meets one that has published
its inclusive prefix, publishes its own inclusive prefix and writes its chunk. x is read once
and y written once: the traffic of a scan, in one launch.

The workspace is persistent and cleans itself: the last program to finish (a second counter)
zeroes the statuses and both counters, so the next launch finds it as the first did, and plan
replay and CUDA graphs need no fill launch in between.
"""
from __future__ import annotations

import threading

import torch
import triton
import triton.language as tl

from .launch import cdiv, num_warps_for
from .plans import launching, not_recording, persistent, run

WORKSPACE_TILES = 1 << 16  # chunks one launch may have (rows x chunks per row)
WINDOW = 32                # statuses read at once while looking back

_WORKSPACES = {}
_LOCK = threading.Lock()


# y[j] = x[0] + ... + x[j] along each row, the row in chunks of BLOCK columns, one chunk a
# program. Memory per element: one read of x, one write of y; per chunk: one 8-byte status
# written twice and about one window of statuses read (an L2 round trip or a few per chunk).
@triton.jit
def _lookback_cumsum_kernel(y_ptr, x_ptr, ws_ptr, n_cols, n_inner, n_chunks, n_tiles,
                            REVERSE: tl.constexpr, BLOCK: tl.constexpr, WINDOW: tl.constexpr):
    # ws: int64 [2 + tiles]: ws[0] the ticket counter, ws[1] the finished counter, ws[2 + t]
    # the status of chunk t (0 nothing yet; flag 1: the chunk's total; flag 2: the inclusive
    # prefix of the row up to the chunk's end), t = row * n_chunks + chunk.
    ticket = tl.atomic_add(ws_ptr, 1).to(tl.int64)
    row = ticket // n_chunks
    c = ticket % n_chunks
    base = (row // n_inner) * n_cols * n_inner + row % n_inner
    j = c * BLOCK + tl.arange(0, BLOCK).to(tl.int64)
    ok = j < n_cols
    if REVERSE:
        phys = n_cols - 1 - j
    else:
        phys = j
    x = tl.load(x_ptr + base + phys * n_inner, mask=ok, other=0).to(tl.float32)
    y = tl.cumsum(x, 0)
    total = tl.sum(x, 0)
    status = ws_ptr + 2 + row * n_chunks
    bits = total.to(tl.int32, bitcast=True).to(tl.int64) & 0xFFFFFFFF
    first = c == 0
    tl.atomic_xchg(status + c, tl.where(first, 2 << 32, 1 << 32) | bits)
    # look back: statuses [hi - WINDOW, hi) at a time, from the nearest chunk down
    prefix = tl.sum(tl.zeros([WINDOW], tl.float32), 0)
    done = first.to(tl.int32)
    hi = c
    while done == 0:
        k = hi - WINDOW + tl.arange(0, WINDOW).to(tl.int64)
        valid = k >= 0
        s = tl.atomic_add(status + k, tl.zeros([WINDOW], tl.int64), mask=valid, sem="relaxed")
        s = tl.where(valid, s, -1)             # before the row's start: nothing to wait for
        flag = s >> 32
        val = (s & 0xFFFFFFFF).to(tl.int32).to(tl.float32, bitcast=True)
        waiting = tl.max(tl.where(flag == 0, k, -1), 0)   # the nearest chunk not published
        inclusive = tl.max(tl.where(flag == 2, k, -1), 0)  # the nearest inclusive prefix
        # use what is published above the nearest gap; an inclusive prefix there ends it
        start = tl.where(inclusive > waiting, inclusive, waiting + 1)
        start = tl.maximum(start, hi - WINDOW)
        prefix += tl.sum(tl.where(valid & (k >= start), val, 0.0), 0)
        done = (inclusive > waiting).to(tl.int32)
        hi = start
    inc = (prefix + total).to(tl.int32, bitcast=True).to(tl.int64) & 0xFFFFFFFF
    tl.atomic_xchg(status + c, (2 << 32) | inc)
    tl.store(y_ptr + base + phys * n_inner, (y + prefix).to(y_ptr.dtype.element_ty), mask=ok)
    # the last program out leaves the workspace zeroed for the next launch. The barrier: every
    # warp of this program is past its look-back (no status left to read) before it counts as
    # finished, or the zeroing could strand a lagging warp waiting on a status that is gone
    tl.debug_barrier()
    finished = tl.atomic_add(ws_ptr + 1, 1)
    if finished == n_tiles - 1:
        zeros = tl.zeros([BLOCK], tl.int64)
        for s0 in range(0, n_tiles, BLOCK):
            at = s0 + tl.arange(0, BLOCK)
            tl.store(ws_ptr + 2 + at, zeros, mask=at < n_tiles)
        tl.store(ws_ptr + tl.arange(0, 2), tl.zeros([2], tl.int64))


def _workspace(device):
    ws = _WORKSPACES.get(device)
    if ws is None:
        from .elementwise import fill_

        # allocated once, outside any plan, and zeroed for real (also inside compile_ahead)
        with _LOCK, not_recording(), launching():
            ws = torch.empty(2 + WORKSPACE_TILES, dtype=torch.int64, device=device)
            fill_(ws, 0)
        _WORKSPACES[device] = persistent(ws)
    return ws


def applies(n_rows, n, chunk, acc, op):
    """Whether the single-pass scan takes this sum (float32 accumulation, at most
    WORKSPACE_TILES chunks)."""
    return op == "sum" and acc == tl.float32 and n_rows * cdiv(n, chunk) <= WORKSPACE_TILES


def cumsum_lookback(y, x, n_rows, n, inner, chunk, reverse):
    """y = the sum scan of x's rows (scan.py's row rule), chunk (a power of two) columns a
    program, in one launch."""
    chunks = cdiv(n, chunk)
    tiles = n_rows * chunks
    run(_lookback_cumsum_kernel, (tiles,), y, x, _workspace(x.device), n, inner, chunks, tiles,
        REVERSE=bool(reverse), BLOCK=chunk, WINDOW=WINDOW, num_warps=num_warps_for(chunk))
    return y
