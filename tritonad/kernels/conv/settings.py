"""The convolution's tuning switches, one frozen value, and its precision as a value.

A launcher never reads a module global: the triton backend's entry points (conv2d,
conv2d_backward in __init__.py; conv_pool's) take the current `Settings` and the precision
once per call and pass them down, and the recorded launch plans are keyed on both. Change them
for a block of code with `using(dw_split=3)` (tests, benchmarks), or for the process with
`set_settings(dataclasses.replace(current_settings(), ...))`.

Precision: "high" (TF32 for float32), "highest" (float32 accuracy as 3xTF32 on tensor cores) or
"ieee" (float32 accuracy as IEEE FMA on the CUDA cores: "highest" where TRITONAD_CONV_IEEE=1,
read here once). Half types use their own tensor cores whatever it says.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os

import torch

from ...backend import conv_precision

ALGOS = ("auto", "im2col", "implicit")
# conv_precision() "highest" runs as 3xTF32 on tensor cores; TRITONAD_CONV_IEEE=1: IEEE FMA
IEEE = os.environ.get("TRITONAD_CONV_IEEE", "0") not in ("", "0")


@dataclasses.dataclass(frozen=True)
class Settings:
    """Every switch of the convolution's routing and launchers (hashable: a plan key part)."""
    algo: str = "auto"           # "auto" | "im2col" | "implicit" (routing.layer_algorithm)
    dw_split: int | None = None  # split-K count of the implicit weight gradient; None: by the GPU
    channel_inner_min: int = 16  # source channels from which gathered tiles walk K channel-inner
    pack_weights: bool = True    # channel-inner implicit GEMM: weights copied K-major first
    channels_last: bool = False  # channel-inner implicit GEMM: gathered source copied to NHWC
    dw_presplit: bool = True     # 3xTF32 weight gradient: operands split into TF32 head + tail
    flat_shift: bool = True      # stride-1 "same" convolutions: the flat-shift weight gradient
    shift_tma: bool = True       # flat-shift weight gradient: dy through TMA (Hopper)
    shift_taps_below: int = 16   # ... a tile's columns span several taps below this many channels
    shift_min_channels: int = 1  # ... from this many input channels
    shift_planes: bool = True    # ... float32: x read as one shifted plane per kernel column
    shift_planes_max_pixels: int = 256     # ... for planes of at most this many pixels
    shift_planes_min_channels: int = 128   # ... and this many channels (any at float32 accuracy)
    shift_planes_max_bytes: int = 1 << 30  # ... taking at most this much memory
    batch_inner: bool = True     # float32 stride-1 "same" weight gradients: batch-inner copies
    batch_inner_min_channels: int = 16     # ... from this many input channels
    batch_inner_max_pixels: int = 1024     # ... for planes of at most this many pixels
    batch_inner_max_bytes: int = 1 << 30   # ... the copies taking at most this much memory
    window_gemm: bool = True     # stride-1 forward / input gradient: the padded channels-last TMA
    window_waste: float = 3.0    # ... where the padded plane is at most this many times the output
    window_tail_tile: int = 128 * 256  # ... tiles this large (one an SM) split a short last wave
    window_wgrad: bool = True    # half-precision weight gradient of those layers: the window form
    window_db_bytes: int = 2 << 20  # ... its launch sums the bias gradient too: a program this
    window_db_min: int = 16         # ... much dy, in at least this many programs, at most one
    window_db_programs: int | None = None  # ... for two SMs; or this many (None: by the two)
    # window GEMM at float32 accuracy from this many reduced channels (below, the implicit GEMM
    # was as fast or faster: H100 sweep; H200, 256x64x56x56: forward 1024 -> 986 us, input
    # gradient 1069 -> 975)
    window_x3_min: int = 64
    # ... its weights split into TF32 head + tail beforehand, the source in the kernel (else
    # tl.dot's own split of both, in the kernel)
    window_presplit: bool = True
    channel_sum_tile: int = 4096  # the bias gradient's partial sums: elements a program loads
    channel_sum_run: int = 512    # ... channels a program while their planes' run is this short
    channel_sum_programs: int = 16  # ... programs an SM
    channel_sum_loads: int = 2    # ... and loads a program
    winograd: bool = True        # 3x3, stride 1, padding 1 at float32 accuracy: F(4x4, 3x3)
    # ... from this many input and output channels (at 64 the direct kernels stayed ahead in
    # every direction: bench conv, H200, 2026-11-24, notes/PERF.md)
    winograd_min_channels: int = 128
    # ... its two transformed operands taking at most this much (larger batches run in chunks
    # of images that fit)
    winograd_max_bytes: int = 1 << 30
    # ... weight gradient: from this many 4x4 tiles (H200, 512 channels at 7x7: 4 tiles 143 us
    # against the direct 71, 16 tiles 89 against 109)
    winograd_wgrad_min_tiles: int = 16
    winograd_wgrad_fill: bool = True  # ... and where its products fill the SMs
    winograd_split_programs: int = 2    # ... the tiles in slices: this many product tiles an SM
    winograd_min_slice_tiles: int = 512  # ... each slice at least this many tiles (a product's K)
    # conv + relu + max pool as one kernel each way (conv_pool.py)
    pool_fuse: bool = True       # False: always the two primitives (tests and benchmarks compare)
    pool_max_window: int = 16    # ... pool windows of at most this many taps
    pool_split: int | None = None  # ... the weight gradient's split over pooled pixels; None: by
    # the GPU. Its plan: (pooled pixels a step, warps, stages, steps a program at least) ...
    pool_wgrad_plan: tuple = (16, 4, 1, 2)
    pool_wgrad_per_sm: int = 2   # ... and programs an SM at most (the split sum grows with them)
    # ... forward plans: (pooled pixels a program, warps, stages), best first by the H200 sweep
    # (benchmarks/sweep_conv_pool.py)
    pool_menu: tuple = ((16, 2, 1), (16, 4, 1), (32, 4, 1), (32, 2, 1))

    def __post_init__(self):
        if self.algo not in ALGOS:
            raise ValueError(f"conv2d: algo must be one of {ALGOS}, got {self.algo!r}")
        # the launch plans hash the settings on every call: hashed once here, not 40 fields a
        # call (timeit, hash(Settings()): 9.4 us against 0.9, a shared 2-core CPU, 2026-12-01)
        fields = tuple(getattr(self, f.name) for f in dataclasses.fields(self))
        object.__setattr__(self, "_hash", hash(fields))

    def __hash__(self):
        return self._hash


_current = Settings()


def current_settings() -> Settings:
    """The settings that the next convolution call takes."""
    return _current


def set_settings(settings: Settings) -> Settings:
    """Make `settings` current; returns the previous ones."""
    global _current
    if not isinstance(settings, Settings):
        raise TypeError(f"conv settings must be a conv.Settings, got {type(settings).__name__}")
    previous, _current = _current, settings
    return previous


@contextlib.contextmanager
def using(**changes):
    """The current settings with `changes` (field=value) inside the block: `with using(algo=
    "implicit"): ...`. Yields the settings in force."""
    previous = set_settings(dataclasses.replace(_current, **changes))
    try:
        yield _current
    finally:
        set_settings(previous)


def call_precision() -> str:
    """The precision of a convolution called now: conv_precision() ("high" or "highest"), or
    "ieee" for "highest" under TRITONAD_CONV_IEEE=1. Read once per call, by the entry points."""
    precision = conv_precision()
    return "ieee" if precision == "highest" and IEEE else precision


def dot_precision(dtype, precision):
    """tl.dot input precision of operands of `dtype` at the call's `precision`: TF32 unless it
    asks for float32 accuracy; half types use their tensor cores whatever it says (it only
    concerns float32). Float32 accuracy runs as 3xTF32 ("tf32x3": each operand split into a
    TF32 head and tail, three tensor-core products, tail x tail dropped), as the matmul does:
    relative error at float32's level, on tensor cores rather than the CUDA cores' FMA
    ("ieee": the FMA path)."""
    if dtype == torch.float32 and precision in ("highest", "ieee"):
        return "ieee" if precision == "ieee" else "tf32x3"
    return "tf32"


def matmul_precision(precision):
    """The matmul precision of the im2col path and Winograd's products at `precision`."""
    return "high" if precision == "high" else "highest"
