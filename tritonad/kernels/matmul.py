"""Matrix multiplication: one tiled Triton kernel with a fused epilogue, split-K for skinny
problems, and an autotuner whose choices persist across runs.

    out[i] = act(a[i] @ b[i] + bias)     a: [*batch, M, K], b: [*batch, K, N], bias: [N]

Design (the numbers are for Hopper, H100/H200):
- Tiles. One program computes a BLOCK_M x BLOCK_N tile of one matrix of the batch, walking K in
  BLOCK_K steps with `tl.dot` (tensor cores for fp16/bf16/TF32, FMA or 3xTF32 tensor-core
  products for exact fp32) into a float32 accumulator. Programs are numbered batch-major and,
  inside a matrix, in groups of GROUP_M row-tiles, so neighbouring programs share rows of a and
  columns of b in L2.
- Strides. Operands are read in place through their strides: the transposes of the backward
  pass (w.t(), dy.transpose(-1, -2)) and stride-0 broadcast batch dims cost no copy. Batch dims
  are merged where the strides of a, b and out allow; two remain at most per launch.
- Epilogue. bias row, relu and the cast to the output dtype happen on the accumulator in
  registers: `act(x @ w.T + b)` reads x and w once and writes y once (addmm + relu writes and
  re-reads the [M, N] product).
- Split-K. Tall-skinny products with a long K (100x3136 @ 3136x512, 784x128 @ 128x256, ...)
  have too few output tiles to fill the GPU. Each of SPLIT programs then sums a slice of K into
  a float32 workspace [SPLIT, batch, M, N]; a second small kernel adds the slices in a fixed
  order (deterministic, no atomics) and applies bias, relu and the cast.
- TF32 operand staging. Hopper's wgmma reads 32-bit operands only K-major from shared memory;
  an operand whose K stride is not 1 (b of a row-major a @ b, both operands of dW = dY^T @ X)
  makes Triton fall back to a slow path. A plan may therefore first copy such an operand into a
  K-major workspace (one memory-bound pass) when the tuner measures that this pays off.
- Plans. The launcher keys each problem on (batch, M, N, K, dtype/precision, operand layouts)
  and builds candidate plans (tile, warps, stages, split, staging) with a function, best guess
  first. The plan comes from kernels/tuning.py: this machine's tuning cache, the table shipped
  for this GPU and Triton version, or the best guess; with td.autotune(True) a new problem
  times every candidate end to end (measure_ms: from a CUDA graph for the microsecond
  problems, as a captured training step runs them) and keeps the fastest. Under the
  interpreter there is one small plan.
  NOTE: a tuner of our own rather than @triton.autotune: a plan is up to three kernels
  (staging, the matmul, the split-K reduction) and must be timed as a whole.
"""
from __future__ import annotations

import hashlib

import torch
import triton
import triton.language as tl

from ..backend import autotuning, matmul_precision
from . import hopper
from .launch import INTERPRET, PDL, cdiv, dtype_of
from .matmul_menu import __file__ as _MENU_FILE
from .matmul_menu import (  # noqa: F401  (the menu: tests and sweeps read it from here)
    MEDIUM_MACS, TMA_MIN_MACS, TMA_TRY_MACS, TMA_WS_MACS, _LARGE_TILES, _SMALL_BK, _SMALL_TILES,
    _SMALL_X3_TILES, _TMA_TILES, _kind, _plan, _rs_plan, _tma_plan, candidate_plans, describe,
    rs_problem, split_k_heuristic, tma_first, tma_problem)
from .plans import empty, planned, run
from .tuning import Tuner, measure_ms  # noqa: F401  (measure_ms: the sweeps use it from here)

PRIMITIVES = ("matmul",)

_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_INT32_LIMIT = 2**31 - 1


# ============================================================================== kernels


@triton.jit
def _matmul_kernel(a_ptr, b_ptr, c_ptr, bias_ptr, gate_ptr, rows_ptr,
                   M, N, K, batch_inner, tiles_per_split,
                   stride_a0, stride_a1, stride_am, stride_ak,
                   stride_b0, stride_b1, stride_bk, stride_bn,
                   stride_c0, stride_c1, stride_cm, stride_cn, stride_csplit,
                   stride_bias, stride_gm, stride_gk, stride_rsplit,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                   GROUP_M: tl.constexpr, SPLIT: tl.constexpr, EVEN_K: tl.constexpr,
                   HAS_BIAS: tl.constexpr, RELU: tl.constexpr, PRECISION: tl.constexpr,
                   FP64: tl.constexpr, UPCAST: tl.constexpr, INT64: tl.constexpr,
                   GATE: tl.constexpr, ROW_SUMS: tl.constexpr, GDC: tl.constexpr):
    if GDC:  # programmatic dependent launch (launch.PDL): wait for the kernels before
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    # program (pid, split): the BLOCK_M x BLOCK_N tile `pid` of the batch (batch-major order),
    # over all of K, or over the K tiles of `split` when SPLIT (then c is the fp32 workspace).
    # GATE: a is read as where(gate > 0, a, 0) (relu's backward on the fly; 2-d problems).
    # ROW_SUMS: the programs of the first tile column also write the sums of those gated rows
    # of a over their K range (a linear layer's bias gradient, from its dW product).
    pid = tl.program_id(0)
    if INT64:  # NOTE: also under the interpreter, where int32 arithmetic is overflow-checked
        pid = pid.to(tl.int64)
        M = tl.cast(M, tl.int64)  # tl.cast: a size of 1 arrives as a constexpr
        N = tl.cast(N, tl.int64)
        K = tl.cast(K, tl.int64)
    # NOTE: (x + B - 1) // B rather than tl.cdiv: a jit helper costs ~10 ms per call interpreted
    grid_m = (M + BLOCK_M - 1) // BLOCK_M
    grid_n = (N + BLOCK_N - 1) // BLOCK_N
    tiles = grid_m * grid_n
    batch = pid // tiles
    tile = pid % tiles
    # grouped ordering: GROUP_M consecutive row-tiles sweep the columns together (L2 reuse)
    group_width = GROUP_M * grid_n
    first_m = (tile // group_width) * GROUP_M
    group_m = tl.minimum(grid_m - first_m, GROUP_M)
    pid_m = first_m + (tile % group_width) % group_m
    pid_n = (tile % group_width) // group_m

    # batch offsets in int64: batch * stride passes 2**31 on large batches
    outer = (batch // batch_inner).to(tl.int64)
    inner = (batch % batch_inner).to(tl.int64)
    a_ptr += outer * stride_a0 + inner * stride_a1
    b_ptr += outer * stride_b0 + inner * stride_b1
    c_ptr += outer * stride_c0 + inner * stride_c1

    # rows and columns past the edge wrap around (modulo) instead of being masked: their loads
    # stay in bounds and their results are never stored
    offs_m = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)) % M
    offs_n = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N
    offs_k = tl.arange(0, BLOCK_K)
    if INT64:
        offs_k = offs_k.to(tl.int64)
    k_tiles = (K + BLOCK_K - 1) // BLOCK_K
    first_tile = 0
    last_tile = k_tiles
    if SPLIT:
        first_tile = tl.program_id(1) * tiles_per_split
        last_tile = tl.minimum(first_tile + tiles_per_split, k_tiles)
    if SPLIT:
        offs_k += first_tile * BLOCK_K
    a_ptrs = a_ptr + offs_m[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_n[None, :] * stride_bn
    g_ptrs = gate_ptr + offs_m[:, None] * stride_gm + offs_k[None, :] * stride_gk
    a_step = BLOCK_K * stride_ak
    b_step = BLOCK_K * stride_bk
    g_step = BLOCK_K * stride_gk

    if FP64:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float64)
        row_sums = tl.zeros((BLOCK_M,), dtype=tl.float64)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        row_sums = tl.zeros((BLOCK_M,), dtype=tl.float32)
    for _ in range(first_tile, last_tile):
        if EVEN_K:
            a = tl.load(a_ptrs)
            b = tl.load(b_ptrs)
            if GATE:
                g = tl.load(g_ptrs)
        else:
            a = tl.load(a_ptrs, mask=offs_k[None, :] < K, other=0.0)
            b = tl.load(b_ptrs, mask=offs_k[:, None] < K, other=0.0)
            if GATE:
                g = tl.load(g_ptrs, mask=offs_k[None, :] < K, other=0.0)
            offs_k += BLOCK_K
        if UPCAST:  # the interpreter computes half types wrongly: widen them first
            a = a.to(tl.float32)
            b = b.to(tl.float32)
            if GATE:
                g = g.to(tl.float32)
        if GATE:
            a = tl.where(g > 0, a, 0.0).to(a.dtype)
        if ROW_SUMS:
            row_sums += tl.sum(a.to(row_sums.dtype), axis=1)
        if FP64:  # a broadcast product summed over k (tl.dot has no float64 path everywhere)
            acc += tl.sum(a[:, :, None] * b[None, :, :], axis=1)
        else:
            # NOTE: PRECISION "ieee" is exact fp32 (FMA), "tf32x3" fp32-accurate on tensor cores,
            # "tf32" tensor cores with 10-bit mantissas; fp16/bf16 products are exact and
            # accumulate in fp32 either way
            acc = tl.dot(a, b, acc, input_precision=PRECISION)
        a_ptrs += a_step
        b_ptrs += b_step
        g_ptrs += g_step

    offs_cm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_cn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    c_mask = (offs_cm[:, None] < M) & (offs_cn[None, :] < N)
    if SPLIT:
        c_ptr += tl.program_id(1).to(tl.int64) * stride_csplit
    else:
        # fused epilogue on the accumulator: bias row, relu, then one rounding to c's dtype
        if HAS_BIAS:
            bias = tl.load(bias_ptr + offs_cn * stride_bias, mask=offs_cn < N, other=0.0)
            acc += bias.to(acc.dtype)[None, :]
        if RELU:
            acc = tl.where(acc < 0, 0.0, acc)  # NOTE: NaN stays NaN, as torch.relu
    c_ptrs = c_ptr + offs_cm[:, None] * stride_cm + offs_cn[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=c_mask)
    if ROW_SUMS:  # rows_ptr: [M] of the output dtype, or the fp32 slices [SPLIT, M]
        if pid_n == 0:
            if SPLIT:
                rows_ptr += tl.program_id(1).to(tl.int64) * stride_rsplit
            tl.store(rows_ptr + offs_cm, row_sums.to(rows_ptr.dtype.element_ty),
                     mask=offs_cm < M)


@triton.jit
def _matmul_tma_kernel(a_ptr, b_ptr, c_ptr, bias_ptr, M, N, K, stride_a, stride_b, stride_c,
                       stride_bias, programs,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                       GROUP_M: tl.constexpr, A_KMAJOR: tl.constexpr, B_KMAJOR: tl.constexpr,
                       HAS_BIAS: tl.constexpr, RELU: tl.constexpr, PRECISION: tl.constexpr,
                       UPCAST: tl.constexpr, FLATTEN: tl.constexpr, WARP_SPECIALIZE: tl.constexpr,
                       GDC: tl.constexpr):
    if GDC:  # programmatic dependent launch: wait before any memory access, the descriptors'
        tl.extra.cuda.gdc_wait()  # scratch included (it may be memory the kernel before used)
        tl.extra.cuda.gdc_launch_dependents()
    # program p: output tiles p, p + programs, p + 2 * programs, ... (one tile when the grid
    # has a program per tile; persistent when programs = the SM count). Operands are read by
    # the TMA engine through descriptors built here from raw pointers (the scratch of one
    # tensormap each comes from triton.set_allocator: launch.ensure_allocator); a [M, K] is
    # K-major (A_KMAJOR) or stored as [K, M]; b [K, N] is K-major (stored as [N, K]) or N-major.
    # Loads past an edge read zeros and stores past an edge are dropped by the hardware.
    if A_KMAJOR:
        a_desc = tl.make_tensor_descriptor(a_ptr, shape=[M, K], strides=[stride_a, 1],
                                           block_shape=[BLOCK_M, BLOCK_K])
    else:
        a_desc = tl.make_tensor_descriptor(a_ptr, shape=[K, M], strides=[stride_a, 1],
                                           block_shape=[BLOCK_K, BLOCK_M])
    if B_KMAJOR:
        b_desc = tl.make_tensor_descriptor(b_ptr, shape=[N, K], strides=[stride_b, 1],
                                           block_shape=[BLOCK_N, BLOCK_K])
    else:
        b_desc = tl.make_tensor_descriptor(b_ptr, shape=[K, N], strides=[stride_b, 1],
                                           block_shape=[BLOCK_K, BLOCK_N])
    c_desc = tl.make_tensor_descriptor(c_ptr, shape=[M, N], strides=[stride_c, 1],
                                       block_shape=[BLOCK_M, BLOCK_N])
    grid_m = (M + BLOCK_M - 1) // BLOCK_M
    grid_n = (N + BLOCK_N - 1) // BLOCK_N
    k_tiles = (K + BLOCK_K - 1) // BLOCK_K
    group_width = GROUP_M * grid_n
    for tile in tl.range(tl.program_id(0), grid_m * grid_n, programs, flatten=FLATTEN,
                         warp_specialize=WARP_SPECIALIZE):
        # grouped ordering, as _matmul_kernel: GROUP_M row-tiles sweep the columns together
        first_m = (tile // group_width) * GROUP_M
        group_m = tl.minimum(grid_m - first_m, GROUP_M)
        off_m = (first_m + (tile % group_width) % group_m) * BLOCK_M
        off_n = ((tile % group_width) // group_m) * BLOCK_N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k in range(k_tiles):
            off_k = k * BLOCK_K
            if A_KMAJOR:
                a = a_desc.load([off_m, off_k])
            else:
                a = a_desc.load([off_k, off_m]).T
            if B_KMAJOR:
                b = b_desc.load([off_n, off_k]).T
            else:
                b = b_desc.load([off_k, off_n])
            if UPCAST:  # the interpreter computes half types wrongly: widen them first
                a = a.to(tl.float32)
                b = b.to(tl.float32)
            # NOTE: as _matmul_kernel: "tf32" (10-bit mantissas) or "tf32x3" for fp32 inputs;
            # fp16/bf16 products are exact; all accumulate in fp32
            acc = tl.dot(a, b, acc, input_precision=PRECISION)
        if HAS_BIAS:
            offs_n = off_n + tl.arange(0, BLOCK_N)
            bias = tl.load(bias_ptr + offs_n * stride_bias, mask=offs_n < N, other=0.0)
            acc += bias.to(tl.float32)[None, :]
        if RELU:
            acc = tl.where(acc < 0, 0.0, acc)  # NOTE: NaN stays NaN, as torch.relu
        c_desc.store([off_m, off_n], acc.to(c_ptr.dtype.element_ty))


@triton.jit
def _splitk_reduce_kernel(ws_ptr, c_ptr, bias_ptr, rows_ws_ptr, rows_ptr, n_elements, N, M,
                          split, stride_bias, output_programs,
                          HAS_BIAS: tl.constexpr, RELU: tl.constexpr, ROW_SUMS: tl.constexpr,
                          BLOCK: tl.constexpr, GDC: tl.constexpr):
    if GDC:  # programmatic dependent launch (launch.PDL): wait for the kernels before
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    # one program: BLOCK consecutive outputs, each the sum of its `split` partial products in
    # split order (the same order every run: deterministic), then bias, relu and the cast.
    # With ROW_SUMS, the programs after the first `output_programs` sum the row-sum slices.
    pid = tl.program_id(0)
    if ROW_SUMS and pid >= output_programs:
        offs = (pid - output_programs).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < M
        ptrs = rows_ws_ptr + offs
        acc = tl.load(ptrs, mask=mask, other=0.0)
        for _ in range(1, split):
            ptrs += M
            acc += tl.load(ptrs, mask=mask, other=0.0)
        tl.store(rows_ptr + offs, acc.to(rows_ptr.dtype.element_ty), mask=mask)
    else:
        offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n_elements
        ws_ptrs = ws_ptr + offs
        acc = tl.load(ws_ptrs, mask=mask, other=0.0)
        for _ in range(1, split):
            ws_ptrs += n_elements
            acc += tl.load(ws_ptrs, mask=mask, other=0.0)
        if HAS_BIAS:
            acc += tl.load(bias_ptr + (offs % N) * stride_bias, mask=mask,
                           other=0.0).to(acc.dtype)
        if RELU:
            acc = tl.where(acc < 0, 0.0, acc)
        tl.store(c_ptr + offs, acc.to(c_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _stage_kernel(src_ptr, dst_ptr, R, C, batch_inner,
                  stride_s0, stride_s1, stride_sr, stride_sc,
                  BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, GDC: tl.constexpr):
    if GDC:  # programmatic dependent launch (launch.PDL): wait for the kernels before
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    # one program: a BLOCK_R x BLOCK_C tile of matrix `batch` of src [B0, B1, R, C] (any
    # strides) copied into the contiguous dst [B0, B1, R, C]; Triton transposes through shared
    # memory so that both the reads and the writes are coalesced
    pid = tl.program_id(0)
    tiles_c = (C + BLOCK_C - 1) // BLOCK_C
    tiles = (R + BLOCK_R - 1) // BLOCK_R * tiles_c
    batch = pid // tiles
    tile = pid % tiles
    offs_r = ((tile // tiles_c) * BLOCK_R + tl.arange(0, BLOCK_R)).to(tl.int64)
    offs_c = ((tile % tiles_c) * BLOCK_C + tl.arange(0, BLOCK_C)).to(tl.int64)
    mask = (offs_r[:, None] < R) & (offs_c[None, :] < C)
    src = (src_ptr + (batch // batch_inner).to(tl.int64) * stride_s0
           + (batch % batch_inner).to(tl.int64) * stride_s1)
    x = tl.load(src + offs_r[:, None] * stride_sr + offs_c[None, :] * stride_sc, mask=mask)
    dst = dst_ptr + batch.to(tl.int64) * R * C
    tl.store(dst + offs_r[:, None] * C + offs_c[None, :], x, mask=mask)


# ============================================================================== plans
# A plan says how to compute one problem: the tile (BM, BN, BK), GROUP_M, num_warps, num_stages,
# the number of K splits, and whether to stage a or b K-major first (TF32 only).

INTERPRET_PLAN = dict(BM=64, BN=64, BK=64, GM=8, warps=4, stages=1, split=1,
                      stage_a=False, stage_b=False, x3=False)

# Tests set FORCE_PLAN = {"split": 3, "BK": 16, ...} to force a path on any device.
FORCE_PLAN: dict | None = None

def _source_hash():
    digest = hashlib.sha256()
    for path in (__file__, _MENU_FILE):  # the kernels and their menu
        with open(path, "rb") as f:
            digest.update(f.read())
    return digest.hexdigest()[:16]


_SOURCE_HASH = _source_hash()
tuner = Tuner("matmul", _SOURCE_HASH)
_sm_counts: dict[int, int] = {}


def _sm_count(device) -> int:
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _sm_counts:
        _sm_counts[index] = torch.cuda.get_device_properties(index).multi_processor_count
    return _sm_counts[index]


# ============================================================================== launchers


def _layout(x, k_dim):
    """'k' if the K axis (k_dim of the last two) is contiguous, 'mn' if the other one is, else
    's' (general strides): the part of an operand's layout that changes the best plan."""
    if x.stride(k_dim) == 1 or x.shape[k_dim] <= 1:
        return "k"
    other = -1 if k_dim == -2 else -2
    return "mn" if x.stride(other) == 1 else "s"


class _Operand:
    """One operand of a launch: a tensor whose data_ptr is the first matrix, two batch dims
    (sizes B0, B1 with strides s0, s1) and the matrix dims (rows, cols, their strides)."""

    __slots__ = ("t", "s0", "s1", "rows", "cols", "sr", "sc")

    def __init__(self, t, s0, s1, rows, cols, sr, sc):
        self.t, self.s0, self.s1 = t, s0, s1
        self.rows, self.cols, self.sr, self.sc = rows, cols, sr, sc

    @classmethod
    def of(cls, x, s0, s1, offset=0):
        if offset:  # a view of the first matrix of this group (data_ptr is what counts)
            x = x.as_strided(x.shape[-2:], x.stride()[-2:], x.storage_offset() + offset)
        return cls(x, s0, s1, x.shape[-2], x.shape[-1], x.stride(-2), x.stride(-1))

    def strides(self):
        return self.s0, self.s1, self.sr, self.sc

    def span(self):
        """Largest element offset inside one matrix."""
        return (self.rows - 1) * abs(self.sr) + (self.cols - 1) * abs(self.sc)

    def transposed(self):
        return _Operand(self.t, self.s0, self.s1, self.cols, self.rows, self.sc, self.sr)


def _batch_groups(a, b, out):
    """(B0, B1, a, b, out) per launch: batch dims of size 1 dropped, neighbours merged where the
    strides of a, b and out all allow, dims beyond the last two merged ones looped over here
    (no copies)."""
    dims = []  # (size, stride in a, in b, in out) of the batch dims, outermost first
    for i in range(out.dim() - 2):
        d = (out.shape[i], a.stride(i), b.stride(i), out.stride(i))
        if d[0] == 1:
            continue
        if dims and all(dims[-1][j] == d[j] * d[0] for j in (1, 2, 3)):
            dims[-1] = (dims[-1][0] * d[0], d[1], d[2], d[3])
        else:
            dims.append(d)
    dims = [(1, 0, 0, 0)] * max(0, 2 - len(dims)) + dims
    lead, (d0, d1) = dims[:-2], dims[-2:]
    count = 1
    for d in lead:
        count *= d[0]
    groups = []
    for index in range(count):
        offsets = [0, 0, 0]
        for d in reversed(lead):
            index, i = divmod(index, d[0])
            offsets = [o + i * s for o, s in zip(offsets, d[1:])]
        groups.append((d0[0], d1[0]) + tuple(
            _Operand.of(x, d0[1 + j], d1[1 + j], offsets[j]) for j, x in enumerate((a, b, out))))
    return groups


def _stage(x: _Operand, B0, B1) -> _Operand:
    """A copy of x with contiguous rows (cols stride 1). Batch dims of stride 0 stay
    broadcast, so a weight shared by the batch is copied once."""
    keep0, keep1 = (B0 if x.s0 else 1), (B1 if x.s1 else 1)
    dst = empty((keep0, keep1, x.rows, x.cols), x.t.dtype, x.t.device)
    BLOCK = 32 if INTERPRET else 64
    grid = (keep0 * keep1 * cdiv(x.rows, BLOCK) * cdiv(x.cols, BLOCK),)
    run(_stage_kernel, grid, x.t, dst, x.rows, x.cols, keep1, *x.strides(),
                        BLOCK_R=BLOCK, BLOCK_C=BLOCK, **PDL)
    s0, s1 = dst.stride(0) if keep0 > 1 else 0, dst.stride(1) if keep1 > 1 else 0
    return _Operand(dst, s0, s1, x.rows, x.cols, x.cols, 1)


# Programmatic dependent launch (launch.PDL) for products below MEDIUM_MACS only. A kernel
# launched early lands its programs in whatever slots the kernel before it leaves free, so a
# product of heavy tiles sized to about one wave runs some SMs two programs deep and leaves
# others idle: the gpt recipe's captured bf16 step took 14.64 ms with PDL on every kernel and
# 11.69 ms with none (H200, benchmarks/profile_gpt.py, 2026-12-02); notes/PERF.md's "PDL for
# the conv and pool kernels" lost the same way. The MNIST products, bound by launch latency,
# keep it.
_NO_PDL = {"GDC": False}


def _pdl(macs):
    return PDL if macs < MEDIUM_MACS else _NO_PDL


def _input_precision(plan, kind):
    """tl.dot's input_precision for a plan: "ieee" (FMA) or "tf32x3" for exact fp32, "tf32"
    otherwise (ignored for half and fp64)."""
    if kind == "ieee":
        return "tf32x3" if plan.get("x3") else "ieee"
    return "tf32"


# TMA operands. The kernel builds its descriptors on the device (tl.make_tensor_descriptor) from
# raw pointers, shapes and strides, rather than taking host-side TensorDescriptor arguments:
# - a recorded plan (launch.planned) replays a launch with each call's own pointers, found
#   among the call's arrays by identity; a host descriptor made from one call's array would be
#   replayed pointing at that first call's memory (silently wrong results);
# - a host descriptor is a parameter type the lean launcher (fastlaunch.c) cannot pack.
# Device-side descriptors need 128 bytes of global scratch per descriptor and program, which
# Triton's launcher allocates at every launch through the allocator of triton.set_allocator
# (launch.ensure_allocator sets one in each launching thread): memory of that one launch, never
# an argument, so a replay gets its own as the first call did (and a CUDA graph capture takes
# it from the graph's pool). The lean launcher (launch.KernelLaunch._direct) takes it from
# torch's caching allocator the same way, per launch (launch.FAST_SCRATCH).


def _tma_matrix(x: _Operand, rows):
    """(row-major?, leading stride) of a matrix [rows, x.cols] that TMA can address: one axis of
    stride 1, the other's stride a positive multiple of 16 bytes, the data 16-byte aligned;
    None otherwise."""
    unit = 16 // x.t.element_size()
    if x.t.data_ptr() % 16 or max(rows, x.cols) > _INT32_LIMIT:
        return None
    if x.sc == 1 and x.sr > 0 and x.sr % unit == 0:
        return True, x.sr
    if x.sr == 1 and x.sc > 0 and x.sc % unit == 0:
        return False, x.sc
    return None


def _tma_operands(B0, B1, a, b, out, kind, gate=None, rows=None):
    """How _matmul_tma_kernel reads one batch group, or None where it cannot: (M, a K-major?,
    a's leading stride, b K-major?, b's leading stride, out's row stride). fp16, bf16 or fp32
    (any precision but fp64); no fused backward options (a_gate, a_row_sums); 2-d problems,
    or batches of a K-major a whose matrices follow each other row after row (so are out's)
    times one shared b, merged into one [B0 * B1 * M, K] @ [K, N] product."""
    if kind == "fp64" or gate is not None or rows is not None:
        return None
    M = a.rows
    if B0 * B1 > 1:
        def rows_follow(x):
            return (B1 == 1 or x.s1 == x.rows * x.sr) and \
                (B0 == 1 or x.s0 == B1 * x.rows * x.sr)

        if b.s0 or b.s1 or a.sc != 1 or not (rows_follow(a) and rows_follow(out)):
            return None
        M = B0 * B1 * a.rows
    sides = _tma_matrix(a, M), _tma_matrix(b.transposed(), b.cols), _tma_matrix(out, M)
    if None in sides or not sides[2][0]:
        return None
    (a_kmajor, stride_a), (b_kmajor, stride_b), (_, stride_c) = sides
    return M, a_kmajor, stride_a, b_kmajor, stride_b, stride_c


def _launch_tma(plan, M, N, K, a, b, out, layout, bias, relu, kind):
    """Run TMA plan `plan` on a [M, K] @ b [K, N] -> out (layout: _tma_operands' answer)."""
    _, a_kmajor, stride_a, b_kmajor, stride_b, stride_c = layout
    BM, BN = plan["BM"], plan["BN"]
    tiles = cdiv(M, BM) * cdiv(N, BN)
    persistent = bool(plan.get("persistent"))
    if persistent:  # (the interpreter: 3 programs, so that each loops over several tiles)
        programs = min(tiles, 3 if INTERPRET else _sm_count(out.t.device))
    else:
        programs = tiles
    run(_matmul_tma_kernel, (programs,), a.t, b.t, out.t,
        bias if bias is not None else out.t, M, N, K, stride_a, stride_b, stride_c,
        bias.stride(0) if bias is not None else 0, programs,
        BLOCK_M=BM, BLOCK_N=BN, BLOCK_K=plan["BK"], GROUP_M=plan["GM"], A_KMAJOR=a_kmajor,
        B_KMAJOR=b_kmajor, HAS_BIAS=bias is not None, RELU=relu,
        PRECISION=_input_precision(plan, kind), UPCAST=INTERPRET and kind == "half",
        FLATTEN=persistent, WARP_SPECIALIZE=bool(plan.get("ws")),
        num_warps=plan["warps"], num_stages=plan["stages"], **_pdl(M * N * K))


def _launch(plan, B0, B1, a, b, out, bias, relu, kind, gate=None, rows=None):
    """Run `plan` on one batch group: a [B0, B1, M, K] @ b [B0, B1, K, N] -> out; a gated by
    `gate` and its row sums into `rows` (2-d problems only: B0 = B1 = 1)."""
    M, K, N = a.rows, a.cols, b.cols
    if plan.get("rs"):
        layout = _tma_operands(B0, B1, a, b, out, kind, gate, rows) if K > 0 else None
        if layout is not None and hopper.AVAILABLE and rs_problem(kind, layout[1], layout[3]):
            M, _, stride_a, _, stride_b, stride_c = layout
            return hopper.launch(run, M, N, K, a.t, b.t, out.t, stride_a, stride_b, stride_c,
                                 bias, relu, plan["GM"])
        # (a forced or stale plan elsewhere: the classic kernel, b staged K-major)
        plan = {**_plan(*_LARGE_TILES["tf32"][0]), "stage_b": True}
    if plan["stage_a"] and a.sc != 1 and K > 1:
        a = _stage(a, B0, B1)
    if plan["stage_b"] and b.sr != 1 and K > 1:
        b = _stage(b.transposed(), B0, B1).transposed()
    if plan.get("tma") and K > 0:
        # a TMA plan where TMA can read the operands (else the classic kernel, same tiles)
        layout = _tma_operands(B0, B1, a, b, out, kind, gate, rows)
        if layout is not None:
            return _launch_tma(plan, layout[0], N, K, a, b, out, layout, bias, relu, kind)
    BM, BN, BK = plan["BM"], plan["BN"], plan["BK"]
    k_tiles = cdiv(K, BK)
    split = max(1, min(plan["split"], k_tiles))
    tiles_per_split = cdiv(k_tiles, split) if k_tiles else 0
    split = cdiv(k_tiles, tiles_per_split) if k_tiles else 1  # no empty slices
    batch = B0 * B1
    acc_dtype = torch.float64 if kind == "fp64" else torch.float32
    if split > 1:
        target = empty((split, batch, M, N), acc_dtype, out.t.device)
        c_strides = (B1 * M * N, M * N, N, 1, target.stride(0))
    else:
        target = out.t
        c_strides = out.strides() + (0,)
    rows_target = rows
    if rows is not None and split > 1:
        rows_target = empty((split, M), acc_dtype, out.t.device)
    bias_arg = bias if bias is not None else out.t
    bias_stride = bias.stride(0) if bias is not None else 0
    gate_strides = (gate.stride(0), gate.stride(1)) if gate is not None else (0, 0)
    grid = (batch * cdiv(M, BM) * cdiv(N, BN), split)
    run(_matmul_kernel, grid,
        a.t, b.t, target, bias_arg, gate if gate is not None else a.t,
        rows_target if rows is not None else out.t, M, N, K, B1, tiles_per_split,
        *a.strides(), *b.strides(), *c_strides, bias_stride, *gate_strides, M,
        BLOCK_M=BM, BLOCK_N=BN, BLOCK_K=BK, GROUP_M=plan["GM"], SPLIT=split > 1,
        EVEN_K=K % BK == 0, HAS_BIAS=bias is not None and split == 1,
        RELU=relu and split == 1, PRECISION=_input_precision(plan, kind),
        FP64=kind == "fp64", UPCAST=INTERPRET and kind == "half",
        INT64=INTERPRET or max(a.span(), b.span(), M * N) > _INT32_LIMIT,
        GATE=gate is not None, ROW_SUMS=rows is not None,
        num_warps=plan["warps"], num_stages=plan["stages"], **_pdl(batch * M * N * K))
    if split > 1:
        # out of one group is one contiguous block [B0, B1, M, N] (out is contiguous)
        n = batch * M * N
        BLOCK = 1024
        programs = cdiv(n, BLOCK)
        row_programs = cdiv(M, BLOCK) if rows is not None else 0
        run(_splitk_reduce_kernel, (programs + row_programs,),
            target, out.t, bias_arg, rows_target if rows is not None else target,
            rows if rows is not None else out.t, n, N, M, split, bias_stride, programs,
            HAS_BIAS=bias is not None, RELU=relu, ROW_SUMS=rows is not None, BLOCK=BLOCK,
            num_warps=4, **PDL)


def _check(a, b, bias, activation):
    """Validate the operands; returns a, b with equal (broadcast) batch dims."""
    def spell(x):
        return f"{tuple(x.shape)} {dtype_of(x).name}"

    for name, x in (("a", a), ("b", b)):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"matmul: {name} must be an array, got {type(x).__name__}")
        if x.dim() < 2:
            raise ValueError(f"matmul: operands need at least 2 dims (vectors go through "
                             f"td.matmul), got a {tuple(a.shape)} @ b {tuple(b.shape)}")
    if a.dtype not in _FLOATS or b.dtype not in _FLOATS:
        raise TypeError(f"matmul: expected floating point operands, got a {spell(a)}, "
                        f"b {spell(b)}")
    if a.dtype != b.dtype:
        raise TypeError(f"matmul: dtypes differ: a {spell(a)}, b {spell(b)}; cast one")
    if a.shape[-1] != b.shape[-2]:
        raise ValueError(f"matmul: inner dimensions differ: a {tuple(a.shape)} @ "
                         f"b {tuple(b.shape)} ({a.shape[-1]} != {b.shape[-2]})")
    if a.device != b.device:
        raise ValueError(f"matmul: operands on different devices: {a.device} and {b.device}")
    if bias is not None:
        if tuple(bias.shape) != (b.shape[-1],):
            raise ValueError(f"matmul: bias must have shape ({b.shape[-1]},) for a "
                             f"{tuple(a.shape)} @ b {tuple(b.shape)}, got {tuple(bias.shape)}")
        if bias.dtype != a.dtype:
            raise TypeError(f"matmul: bias dtype {dtype_of(bias).name} differs from the "
                            f"operands' {dtype_of(a).name}")
        if bias.device != a.device:
            raise ValueError(f"matmul: bias on {bias.device}, operands on {a.device}")
    if activation not in (None, "relu"):
        raise ValueError(f"matmul: unknown activation {activation!r} (None or 'relu')")
    if a.shape[:-2] != b.shape[:-2]:  # numpy's rules: align right, 1 stretches
        nb = max(a.dim(), b.dim()) - 2
        sa = (1,) * (nb + 2 - a.dim()) + tuple(a.shape[:-2])
        sb = (1,) * (nb + 2 - b.dim()) + tuple(b.shape[:-2])
        if any(x != y and 1 not in (x, y) for x, y in zip(sa, sb)):
            raise ValueError(f"matmul: batch dims do not broadcast: a {tuple(a.shape)} @ "
                             f"b {tuple(b.shape)}")
        batch = tuple(max(x, y) if 0 not in (x, y) else 0 for x, y in zip(sa, sb))
        a = a.expand(batch + tuple(a.shape[-2:]))
        b = b.expand(batch + tuple(b.shape[-2:]))
    return a, b


def _check_fused(a, b, a_gate, a_row_sums):
    """The operands of the fused backward options: 2-d problems, a gate shaped as a, row sums a
    contiguous [M] array, all of a's dtype and device."""
    if a_gate is None and a_row_sums is None:
        return
    if a.dim() != 2 or b.dim() != 2:
        raise ValueError(f"matmul: a_gate and a_row_sums need 2-d operands, got a "
                         f"{tuple(a.shape)} @ b {tuple(b.shape)}")
    for name, x, shape in (("a_gate", a_gate, tuple(a.shape)), ("a_row_sums", a_row_sums,
                                                                (a.shape[0],))):
        if x is None:
            continue
        if not isinstance(x, torch.Tensor) or tuple(x.shape) != shape or x.dtype != a.dtype \
                or x.device != a.device:
            got = f"{tuple(x.shape)} {dtype_of(x).name} on {x.device}" \
                if isinstance(x, torch.Tensor) else type(x).__name__
            raise ValueError(f"matmul: {name} must be a {shape} {dtype_of(a).name} array on "
                             f"{a.device} for a {tuple(a.shape)} @ b {tuple(b.shape)}, got {got}")
    if a_row_sums is not None and not a_row_sums.is_contiguous():
        raise ValueError("matmul: a_row_sums must be contiguous")


def _settings():
    return matmul_precision(), autotuning(), \
        tuple(sorted(FORCE_PLAN.items())) if FORCE_PLAN else None


@planned(settings=_settings, arrays=2)
def matmul(a, b, bias=None, activation=None, out=None, precision=None, a_gate=None,
           a_row_sums=None):
    """act(a @ b + bias) in one kernel (two with split-K).

    a: [*batch, M, K], b: [*batch, K, N] (any strides; broadcast batch dims as stride 0),
    bias: [N] or None, activation: None or "relu"; one floating dtype for all. float32 inputs
    follow td.set_matmul_precision ("highest": fp32 accuracy, "high": TF32); fp16/bf16
    multiply on tensor cores; everything accumulates in float32 (float64 in float64).
    Returns a new contiguous [*batch, M, N] array of the inputs' dtype, or `out` filled in.
    `precision` overrides matmul_precision() (convolution's im2col path passes its own).
    For a linear layer's backward (2-d operands): `a_gate` (shaped as a) reads a as
    where(a_gate > 0, a, 0), relu's backward on the fly; `a_row_sums` ([M]) receives the row
    sums of that a, the bias gradient of dW = dz^T @ x, from the same kernel.
    """
    a, b = _check(a, b, bias, activation)
    _check_fused(a, b, a_gate, a_row_sums)
    M, K, N = a.shape[-2], a.shape[-1], b.shape[-1]
    shape = tuple(a.shape[:-2]) + (M, N)
    if out is None:
        out = empty(shape, a.dtype, a.device)
    elif tuple(out.shape) != shape or out.dtype != a.dtype or not out.is_contiguous() \
            or out.device != a.device:
        raise ValueError(f"matmul: out must be a contiguous {shape} {dtype_of(a).name} array on "
                         f"{a.device}, got {tuple(out.shape)} {dtype_of(out).name}")
    if out.numel() == 0:
        if a_row_sums is not None:  # no product to fuse them into (N = 0)
            from .elementwise import relu_backward
            from .reduce import sum as sum_dims

            sum_dims(a if a_gate is None else relu_backward(a, a_gate), (1,), out=a_row_sums)
        return out
    kind = _kind(a.dtype, precision or matmul_precision())  # (read once, at the entry)
    relu = activation == "relu"
    groups = _batch_groups(a, b, out)

    def run_plan(plan):
        for B0, B1, a_g, b_g, out_g in groups:
            _launch(plan, B0, B1, a_g, b_g, out_g, bias, relu, kind, a_gate, a_row_sums)

    if INTERPRET:
        plan = INTERPRET_PLAN
    else:
        batch = out.numel() // (M * N)
        a_layout, b_layout = _layout(a, -1), _layout(b, -2)
        key = f"{batch}x{M}x{N}x{K}:{dtype_of(a).name}:{kind}:{a_layout}{b_layout}"
        key += ":gate" * (a_gate is not None) + ":rows" * (a_row_sums is not None)
        sms = _sm_count(a.device)
        # readable: TMA can read the operands of a problem whose menu offers TMA plans; tma:
        # one where they may come first (the key's suffixes follow that, so that tables
        # shipped before the menu offered them at TMA_TRY_MACS stay valid)
        readable = tma_problem(batch, M, N, K, kind, sms, TMA_TRY_MACS) and all(
            _tma_operands(*g, kind, a_gate, a_row_sums) is not None for g in groups)
        tma = readable and tma_problem(batch, M, N, K, kind, sms)
        # ":tma": a TMA plan is this problem's best guess, so a plan cached or shipped for the
        # key before TMA plans existed is stale (where the classic plans stay first, it stands)
        key += ":tma" * (tma and tma_first(batch, M, N, K, kind, a_layout == "k",
                                           b_layout == "k"))
        # ":rs": hopper.py's kernel goes first, so plans cached or shipped before it are stale
        rs = tma and hopper.rs_available(a.device.index if a.device.index is not None
                                         else torch.cuda.current_device())
        key += ":rs" * (rs and rs_problem(kind, a_layout == "k", b_layout == "k"))
        plan = tuner.choose(key, lambda: candidate_plans(
            batch, M, N, K, kind, a_layout == "k", b_layout == "k", sms, readable, rs),
            run_plan, a.device)
    if FORCE_PLAN:
        plan = {**plan, **FORCE_PLAN}
    run_plan(plan)
    return out
