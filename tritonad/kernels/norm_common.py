"""What the normalisation kernels share: the settings that size them, the program count of a
pass over the whole tensor, and the @triton.jit helpers for tile offsets and the fused
activations. kernels/norm.py (launchers, the row forward) and kernels/norm_stream.py (the
streaming backward and batch-norm passes) import it.

Settings come from TRITONAD_NORM, e.g. TRITONAD_NORM=row_tile=8192,bn_programs_per_sm=4 (read
at import; tests and benchmarks call use()), so that one GPU run can time several
(bench norms --variant default,row_tile=8192).
"""
from __future__ import annotations

import contextlib
import dataclasses
import os

import torch
import triton
import triton.language as tl

from .launch import INTERPRET
from .tlmath import erf

programs_override = None  # tests set this to exercise many partial sums on the CPU
_sm_count = {}


@dataclasses.dataclass(frozen=True)
class NormSettings:
    """How the norm kernels run. *_tile: elements of one input a program takes a step, 8 a
    thread (the registers a thread needs follow from it, whatever the dtype): row_tile for the
    row backward, bn_reduce_tile for the batch-norm statistics and gradient sums, bn_tile for
    its normalise and dx passes (one tile a program) unless bn_l2_order (1: those passes take
    the reduction's tiles, the last read first; 0: bn_tile tiles in order); depth, half_depth:
    steps of loads in flight ahead of the one being reduced (1 or 2) for 4- and 8-byte dtypes,
    and for 2-byte ones (2: bf16 keeps as many bytes in flight as float32 for a few registers
    more); *_programs_per_sm: programs of a pass over the whole tensor per SM (the stripes of
    the row backward, the splits of the batch-norm reductions)."""
    row_tile: int = 4096
    row_programs_per_sm: int = 1
    bn_reduce_tile: int = 2048
    bn_tile: int = 4096
    bn_l2_order: int = 1
    bn_programs_per_sm: int = 3
    bn_grad_programs_per_sm: int = 2
    depth: int = 1
    half_depth: int = 2

    @classmethod
    def parse(cls, text):
        """NormSettings from "key=value,key=value" (TRITONAD_NORM's form)."""
        fields = {f.name: f.type for f in dataclasses.fields(cls)}
        values = {}
        for item in filter(None, (p.strip() for p in (text or "").split(","))):
            key, _, value = item.partition("=")
            if key not in fields:
                raise ValueError(f"TRITONAD_NORM: unknown setting {key!r} (known: "
                                 f"{', '.join(fields)})")
            values[key] = int(value)
        settings = cls(**values)
        if {settings.depth, settings.half_depth} - {1, 2}:
            raise ValueError(f"TRITONAD_NORM: depth and half_depth must be 1 or 2, got "
                             f"{settings.depth}, {settings.half_depth}")
        return settings


SETTINGS = NormSettings.parse(os.environ.get("TRITONAD_NORM", ""))


def settings():
    """The settings now in force (part of the launch plans' keys)."""
    return SETTINGS


def use(**changes):
    """Change the settings (row_tile=8192, ...); returns the previous ones."""
    global SETTINGS
    previous = SETTINGS
    SETTINGS = NormSettings.parse(",".join(f"{k}={v}" for k, v in
                                           {**dataclasses.asdict(SETTINGS), **changes}.items()))
    return previous


@contextlib.contextmanager
def using(**changes):
    """use(**changes) for the block, the previous settings after it."""
    global SETTINGS
    previous = use(**changes)
    try:
        yield SETTINGS
    finally:
        SETTINGS = previous


def acc_type(dtype):
    """The accumulator of a kernel over `dtype` data: float64 for float64, float32 otherwise."""
    return tl.float64 if dtype == torch.float64 else tl.float32


def stat_dtype(dtype):
    return torch.float64 if dtype == torch.float64 else torch.float32


def program_count(device, per_sm):
    """How many programs a pass over the whole tensor should spread over: per_sm a multiprocessor
    (2 under the interpreter, where there are none)."""
    if programs_override is not None:
        return programs_override
    if INTERPRET:
        return 2
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _sm_count:
        _sm_count[index] = torch.cuda.get_device_properties(index).multi_processor_count
    return per_sm * _sm_count[index]


@triton.jit
def col_offsets(cols, stride, COL64: tl.constexpr):
    # int32 unless n_cols * stride reaches 2**31
    offs = cols * stride
    if COL64:
        offs = cols.to(tl.int64) * stride
    return offs


@triton.jit
def tile_offsets(k, n_sblocks, S, cols, s_n, s_s, s_c, BLOCK_S: tl.constexpr,
                 OFF64: tl.constexpr):
    """(sample offset (int64 scalar), offsets in the sample, position mask) of tile
    k = (n, spatial block) of an [N, S, C] array; the offsets in a sample are int32 unless
    OFF64."""
    n = k // n_sblocks
    s = (k % n_sblocks) * BLOCK_S + tl.arange(0, BLOCK_S)
    if OFF64:
        offs = s.to(tl.int64)[:, None] * s_s + cols.to(tl.int64)[None, :] * s_c
    else:
        offs = s[:, None] * s_s + cols[None, :] * s_c
    return n.to(tl.int64) * s_n, offs, s < S


@triton.jit
def activate(z, ACT: tl.constexpr):
    # ACT 0: identity, 1: relu, 2: gelu (erf form)
    if ACT == 1:
        z = tl.maximum(z, 0.0)
    elif ACT == 2:
        z = 0.5 * z * (1.0 + erf(z * 0.7071067811865476))
    return z


@triton.jit
def activation_grad(dy, z, ACT: tl.constexpr):
    # NOTE: relu'(0) = 0, as torch; gelu' = Phi(z) + z phi(z)
    if ACT == 1:
        dy = tl.where(z > 0.0, dy, 0.0)
    elif ACT == 2:
        dy = dy * (0.5 * (1.0 + erf(z * 0.7071067811865476))
                   + z * tl.exp(-0.5 * z * z) * 0.3989422804014327)
    return dy
