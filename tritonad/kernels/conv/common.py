"""What every convolution algorithm shares: the validated geometry, the tile-size rules, the
GPU queries, the tuner (its keys name the shipped table's rows: plans.json, "conv") and the
index helpers of the kernels."""
from __future__ import annotations

import functools
import hashlib
import pathlib

import torch
import triton
import triton.language as tl

from ..launch import INTERPRET, cdiv, dtype_of, next_power_of_2
from ..plans import run
from ..tuning import Tuner


@triton.jit
def source_coord(base, shift, DIV, SIZE, TRANSPOSED: tl.constexpr):
    """Coordinate in the source of tap `shift` for a pixel whose window starts at `base`, and
    whether it exists: forward t = base + shift inside [0, SIZE); transposed (t / DIV) exact and
    inside. NOTE: t is clamped at 0 before dividing so no negative number is ever divided; with
    DIV = 1 (specialised to a constant) the division folds away."""
    t = base + shift
    if TRANSPOSED:
        coord = tl.maximum(t, 0) // DIV
        ok = (t >= 0) & (coord * DIV == t) & (coord < SIZE)
    else:
        coord = t
        ok = (t >= 0) & (t < SIZE)
    return coord, ok


@triton.jit
def split_share(units):
    """[lo, hi): split program_id(1)'s even share of `units` in order (of num_programs(1)
    splits; the last ones may be empty): the split-K weight gradients' K ranges."""
    return even_share(units, tl.program_id(1), tl.num_programs(1))


@triton.jit
def even_share(units, part, parts):
    """[lo, hi): part `part`'s even share of `units` in order, of `parts` (the last ones may
    be empty)."""
    share = tl.cdiv(units, parts)
    lo = part * share
    return lo, tl.minimum(lo + share, units)


class Geometry:
    """Sizes of one convolution, validated: n, c, h, w, co, kh, kw, oh, ow, groups and the
    per-axis stride (sh, sw), padding (ph, pw), dilation (dh, dw)."""

    def __init__(self, op, x_shape, w_shape, stride, padding, dilation, groups):
        if len(x_shape) != 4 or len(w_shape) != 4:
            raise ValueError(f"{op}: expected x [N, C, H, W] and weight [Co, C/groups, kh, kw], "
                             f"got x {tuple(x_shape)} and weight {tuple(w_shape)}")
        self.n, self.c, self.h, self.w = x_shape
        self.co, cg, self.kh, self.kw = w_shape
        self.groups = int(groups)
        if self.groups < 1 or self.co % self.groups or self.c != cg * self.groups:
            raise ValueError(f"{op}: input {tuple(x_shape)} does not match weight {tuple(w_shape)} "
                             f"with groups={groups} (C must equal weight.shape[1] * groups and "
                             f"Co must be divisible by groups)")
        (self.sh, self.sw), (self.ph, self.pw), (self.dh, self.dw) = \
            pair(op, "stride", stride, 1), pair(op, "padding", padding, 0), \
            pair(op, "dilation", dilation, 1)
        self.oh = (self.h + 2 * self.ph - self.dh * (self.kh - 1) - 1) // self.sh + 1
        self.ow = (self.w + 2 * self.pw - self.dw * (self.kw - 1) - 1) // self.sw + 1
        if self.kh < 1 or self.kw < 1 or self.oh < 1 or self.ow < 1:
            raise ValueError(f"{op}: kernel {(self.kh, self.kw)} (dilation {(self.dh, self.dw)}) "
                             f"does not fit the input {(self.h, self.w)} padded by "
                             f"{(self.ph, self.pw)} (input {tuple(x_shape)}, weight "
                             f"{tuple(w_shape)})")

    @property
    def args(self):
        return self.sh, self.sw, self.ph, self.pw, self.dh, self.dw


def pair(op, name, v, low):
    v = (int(v), int(v)) if isinstance(v, int) else tuple(int(i) for i in v)
    if len(v) != 2 or min(v) < low:
        raise ValueError(f"{op}: {name} must be a pair of ints >= {low}, got {v}")
    return v


def check_float(op, *arrays, allow_f64=False):
    arrays = [a for a in arrays if a is not None]
    allowed = ("float32", "float16", "bfloat16") + (("float64",) if allow_f64 else ())
    if len({a.dtype for a in arrays}) != 1 or dtype_of(arrays[0]).name not in allowed:
        names = ", ".join(f"{tuple(a.shape)} {dtype_of(a).name}" for a in arrays)
        raise TypeError(f"{op}: expected arrays of one dtype among {allowed}, got {names}")
    if len({a.device for a in arrays}) != 1:
        raise ValueError(f"{op}: arrays on different devices: "
                         f"{', '.join(str(a.device) for a in arrays)}")



def dot_fp32(dtype):
    """Whether a kernel casts its operands to float32 before tl.dot: under the interpreter, for
    half types (NOTE: the interpreter's bfloat16 dot is wrong; the products are exact in
    float32)."""
    return INTERPRET and dtype != torch.float32


def menu_kind(dot_precision, dtype):
    """The config menu a launcher takes: "half" for 16-bit types, else the dot precision."""
    return "half" if dtype in (torch.float16, torch.bfloat16) else dot_precision


def block(n, cap=128):
    """The smallest power of two >= 16 covering n, at most cap: a tile's channel block."""
    return max(16, min(cap, next_power_of_2(max(int(n), 1))))


def round_up(n, m):
    return cdiv(n, m) * m


@functools.lru_cache(maxsize=None)
def sm_count(device):
    return 1 if INTERPRET else torch.cuda.get_device_properties(device).multi_processor_count


@functools.lru_cache(maxsize=None)
def tma_capable(device):
    """Whether TMA reads any row on this GPU (Hopper: compute capability 9+)."""
    return torch.cuda.get_device_capability(device)[0] >= 9


def _source_hash():
    """The package's kernels and launchers, hashed: a tuning cache of other sources is stale."""
    digest = hashlib.sha256()
    for path in sorted(pathlib.Path(__file__).parent.glob("*.py")):
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


tuner = Tuner("conv", _source_hash())


def _plans(configs):
    """triton.Config menus as plain plans: the kernel's block constexprs, warps and stages."""
    return [{**c.kwargs, "num_warps": c.num_warps, "num_stages": c.num_stages} for c in configs]


def run_tuned(kernel, configs, key, grid, args, meta, device):
    """Launch `kernel` with the plan chosen for `key` among `configs` (kernels/tuning.py: this
    machine's cache, the shipped table, timing when autotuning, else the menu's first entry),
    through run() so that a plan being recorded sees the launch."""
    plans = _plans(configs)

    def launch(plan):
        run(kernel, grid(plan), *args, **meta, **plan)

    plan = plans[0] if INTERPRET else tuner.choose(key, lambda: plans, launch, device)
    launch(plan)
