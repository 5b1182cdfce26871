"""TF32 a @ b on Hopper with an N-major b, written in Gluon (Triton's lower-level dialect).

wgmma reads 32-bit operands from shared memory K-major only, and in a @ b with a row-major b
(stored [K, N]: N-major) that b is not. Triton's tl.dot then copies each b tile through
registers into a transposed shared tile (0.2x cuBLAS), so the tl path stages b K-major first
(one copy pass, 0.72-0.82x). This kernel computes each output tile transposed instead:

    c^T [n, m] = b^T [n, k] @ a^T [k, m]

a's tiles (K-major, by TMA) are wgmma's shared-memory operand, and b's tiles (by TMA, N-major)
are loaded into registers as wgmma's register operand, which may be any layout. The wgmma
of one K step runs while the next step's registers load. ptxas must not reuse a register
that a wgmma in flight still reads: the loop runs two K steps a trip, each into its own
registers, and waits for the step before the one it issues (wait(1)) before that step's
registers are loaded again. The first step runs before the loop (use_acc=False) so that no
instruction writes the accumulator while a wgmma may run (else ptxas serializes every wgmma:
its warning C7515). The epilogue adds the bias and applies relu, and stores the tile
transposed: one store instruction writes 8 adjacent n at each of 4 m, whole 32-byte sectors.

Gluon kernels do not run under Triton's interpreter: AVAILABLE is False there, and on other
GPUs than Hopper (sm_90) the matmul menu never offers this path (rs_available).
"""
from __future__ import annotations

import functools

import torch

from .launch import INTERPRET, cdiv

try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        mbarrier, tma, warpgroup_mma, warpgroup_mma_wait)
    # (Triton 3.9 names the TMA load async_load; 3.6 async_copy_global_to_shared)
    _tma_load = tma.async_load if hasattr(tma, "async_load") else tma.async_copy_global_to_shared
    GLUON = True
except ImportError:  # a Triton without Gluon's Hopper dialect
    GLUON = False
AVAILABLE = GLUON and not INTERPRET

# The plan: a 128 (n) x 256 (m) output tile, K steps of 32, 4 stages of 48 kB, two warpgroups
# (8 warps) of 64 n-rows each. 256 x 128, 128 x 128 at 4 warps and 64 x 256 tiles ran at
# 0.62-0.77 of cuBLAS at 4096^3 against this tile's 0.83-0.85 (scratch kernels, H200, Triton
# 3.6, 2026-11-25; the table in notes/PERF.md, matmul).
TILE_N, TILE_M, TILE_K, STAGES, WARPS = 128, 256, 32, 4, 8


@functools.lru_cache(maxsize=None)
def rs_available(device_index: int) -> bool:
    """Whether device `device_index` runs this path: Gluon is there and the GPU is a Hopper
    (wgmma is sm_90's; other architectures keep the tl kernels)."""
    return AVAILABLE and torch.cuda.get_device_capability(device_index)[0] == 9


if GLUON:  # (defined under the interpreter too: tests compile it for sm_90)
    @gluon.jit
    def _load_step(kt, k_tiles, a_desc, b_desc, a_bufs, b_bufs, bars, off_m, off_n,
                   STAGES: gl.constexpr, BK: gl.constexpr):
        """Start loading K step kt's tiles into its stage (nothing past the last step)."""
        if kt < k_tiles:
            s = kt % STAGES
            mbarrier.expect(bars.index(s), a_desc.block_type.nbytes + b_desc.block_type.nbytes)
            _tma_load(a_desc, [off_m, kt * BK], bars.index(s), a_bufs.index(s))
            _tma_load(b_desc, [kt * BK, off_n], bars.index(s), b_bufs.index(s))

    @gluon.jit
    def _mma_step(kt, k_tiles, acc, a_desc, b_desc, a_bufs, b_bufs, bars, off_m, off_n,
                  b_layout: gl.constexpr, STAGES: gl.constexpr, BK: gl.constexpr):
        """K step kt: b's tile into registers, its wgmma issued; then, the step before it done
        (its stage free: this warpgroup's wgmma finished, and bar.sync, which Gluon puts before
        the TMA issue, waits for the other's), that stage loads step kt + STAGES - 1."""
        s = kt % STAGES
        mbarrier.wait(bars.index(s), (kt // STAGES) & 1)
        b = b_bufs.index(s).permute((1, 0)).load(b_layout)
        acc = warpgroup_mma(b, a_bufs.index(s).permute((1, 0)), acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))
        _load_step(kt + STAGES - 1, k_tiles, a_desc, b_desc, a_bufs, b_bufs, bars, off_m,
                   off_n, STAGES, BK)
        return acc

    @gluon.jit
    def _tf32_nmajor_kernel(a_ptr, b_ptr, c_ptr, bias_ptr, M, N, K, stride_a, stride_b,
                            stride_c, stride_bias,
                            BN: gl.constexpr, BM: gl.constexpr, BK: gl.constexpr,
                            STAGES: gl.constexpr, GROUP_M: gl.constexpr,
                            HAS_BIAS: gl.constexpr, RELU: gl.constexpr,
                            num_warps: gl.constexpr):
        # grouped ordering, as the tl kernels: GROUP_M row-tiles sweep the columns together
        pid = gl.program_id(0)
        grid_m = gl.cdiv(M, BM)
        grid_n = gl.cdiv(N, BN)
        group_width = GROUP_M * grid_n
        first_m = (pid // group_width) * GROUP_M
        group_m = gl.minimum(grid_m - first_m, GROUP_M)
        off_m = (first_m + (pid % group_width) % group_m) * BM
        off_n = ((pid % group_width) // group_m) * BN

        a_shared: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BM, BK], gl.float32)
        b_shared: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BK, BN], gl.float32)
        a_desc = tma.make_tensor_descriptor(a_ptr, [M, K], [stride_a, 1], [BM, BK], a_shared)
        b_desc = tma.make_tensor_descriptor(b_ptr, [K, N], [stride_b, 1], [BK, BN], b_shared)
        a_bufs = gl.allocate_shared_memory(gl.float32, [STAGES, BM, BK], a_shared)
        b_bufs = gl.allocate_shared_memory(gl.float32, [STAGES, BK, BN], b_shared)
        bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(STAGES):
            mbarrier.init(bars.index(i), count=1)

        # the accumulator: BN rows (n) by BM columns (m), 16 rows a warp
        acc_layout: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, BM, 8])
        b_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout,
                                                     k_width=1)
        k_tiles = gl.cdiv(K, BK)
        for i in gl.static_range(STAGES - 1):
            _load_step(i, k_tiles, a_desc, b_desc, a_bufs, b_bufs, bars, off_m, off_n,
                       STAGES, BK)
        acc = gl.zeros([BN, BM], gl.float32, acc_layout)
        if k_tiles > 0:
            mbarrier.wait(bars.index(0), 0)
            b = b_bufs.index(0).permute((1, 0)).load(b_layout)
            acc = warpgroup_mma(b, a_bufs.index(0).permute((1, 0)), acc, use_acc=False,
                                is_async=True)
            acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))
            _load_step(STAGES - 1, k_tiles, a_desc, b_desc, a_bufs, b_bufs, bars, off_m,
                       off_n, STAGES, BK)
            for kt in range(1, k_tiles - 1, 2):  # two steps, two sets of registers, a trip
                acc = _mma_step(kt, k_tiles, acc, a_desc, b_desc, a_bufs, b_bufs, bars,
                                off_m, off_n, b_layout, STAGES, BK)
                acc = _mma_step(kt + 1, k_tiles, acc, a_desc, b_desc, a_bufs, b_bufs, bars,
                                off_m, off_n, b_layout, STAGES, BK)
            if k_tiles % 2 == 0:
                acc = _mma_step(k_tiles - 1, k_tiles, acc, a_desc, b_desc, a_bufs, b_bufs,
                                bars, off_m, off_n, b_layout, STAGES, BK)
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        for i in gl.static_range(STAGES):
            mbarrier.invalidate(bars.index(i))

        offs_n = off_n + gl.arange(0, BN, layout=gl.SliceLayout(1, acc_layout))
        offs_m = off_m + gl.arange(0, BM, layout=gl.SliceLayout(0, acc_layout))
        if HAS_BIAS:
            bias = gl.load(bias_ptr + offs_n * stride_bias, mask=offs_n < N, other=0.0)
            acc = acc + bias.to(gl.float32)[:, None]
        if RELU:
            acc = gl.where(acc < 0, 0.0, acc)  # NOTE: NaN stays NaN, as torch.relu
        ptrs = c_ptr + offs_m.to(gl.int64)[None, :] * stride_c + offs_n[:, None]
        gl.store(ptrs, acc, mask=(offs_m[None, :] < M) & (offs_n[:, None] < N))


def launch(run, M, N, K, a, b, out, stride_a, stride_b, stride_c, bias, relu, group_m):
    """out [M, N] = a [M, K] (K-major, row stride stride_a) @ b [K, N] (N-major, row stride
    stride_b), TF32, bias added and relu applied per `bias` / `relu`; `run` launches."""
    grid = (cdiv(M, TILE_M) * cdiv(N, TILE_N),)
    run(_tf32_nmajor_kernel, grid, a, b, out, bias if bias is not None else out, M, N, K,
        stride_a, stride_b, stride_c, bias.stride(0) if bias is not None else 0,
        BN=TILE_N, BM=TILE_M, BK=TILE_K, STAGES=STAGES, GROUP_M=group_m,
        HAS_BIAS=bias is not None, RELU=relu, num_warps=WARPS)
