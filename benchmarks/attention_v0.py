"""The flash attention kernels as they were before the sm_90 rework (tritonad/kernels/attention.py
at commit 4c7e705), kept only for `bench attention --variant old`: the same launcher
interface (_forward, _backward), which the benchmark swaps into tritonad's module to time both
versions in one run on one GPU. Not imported by tritonad.

Flash attention (FlashAttention-2: Dao 2023, https://arxiv.org/abs/2307.08691), forward and
backward, the fused form of `F.scaled_dot_product_attention` (autodiff/attention_ops.py).

Operands are 4-d strided views: q [B, H, L, E], k [B, Hk, S, E], v [B, Hk, S, Ev], H a multiple
of Hk (grouped-query heads: query head h reads key/value head h // (H / Hk)); an optional mask
[B, H, L, S] (broadcast dims have stride 0), boolean (True = take part) or additive. Nothing of
size L x S is ever written: the forward keeps, per query row, a running max m and sum l of the
exponentials in float32 (the online softmax) and writes O and the log-sum-exp; the backward
recomputes each tile of P from Q, K and the log-sum-exp.

Scores are kept in base 2: s = log2(e) * (scale * q.k + bias), so that exp(x) is one exp2.
A query row whose keys are all masked out gives 0 (output and gradients), as torch's CPU
implementation does; its log-sum-exp is stored as +inf so that the backward's P is 0 there.

Dropout (on the attention weights, after the softmax, as torch) draws its keep mask from the
Philox stream of kernels/random.py: weight (row r = b * H * L + h * L + i, key j) uses counter
offset + r * S + j, the weights' element order, so the fused kernels drop exactly what the
composite's dropout over the [B, H, L, S] weights drops for the same (seed, offset), and the
backward regenerates the mask instead of storing it.

Causal is torch's top-left aligned lower triangle (query i sees keys j <= i); the key blocks
that lie wholly above it are skipped (forward and dQ stop at the diagonal block, dK/dV start
there).
"""
from __future__ import annotations

import torch

from tritonad.backend import matmul_precision  # (first: tritonad decides how Triton runs)
import triton  # noqa: E402,I001
import triton.language as tl  # noqa: E402
from tritonad.kernels.launch import INTERPRET, cdiv, dtype_of, next_power_of_2
from tritonad.kernels.plans import empty, planned, run
from tritonad.kernels.random import _philox, _uniform01

PRIMITIVES = ("flash_attention", "flash_attention_backward")

LOG2E = 1.4426950408889634
MAX_HEAD_DIM = 128          # head dims above it run the composite (autodiff/attention_ops.py)
MASK_NONE, MASK_BOOL, MASK_ADD = 0, 1, 2
MASK_WIDE = 4   # added to MASK_KIND where a head's mask offsets need int64 (_scores reads 4)
MASK_INT32_LIMIT = 2 ** 31   # (tests lower it to take the int64 path on small masks)
# the interpreter's (BLOCK_M, BLOCK_N, warps, stages) of the forward, dK/dV and dQ kernels: the
# smallest tiles tl.dot takes (tests set others; plans do not see this: clear them after)
INTERPRET_BLOCKS = ((16, 16, 1, 1), (16, 16, 1, 1), (16, 16, 1, 1))
# None, or the three block choices for every call on the GPU (bench attention --sweep tries
# candidates through it; plans do not see it either)
GPU_BLOCKS = None


# ------------------------------------------------------------------------------------ helpers


@triton.jit
def _dot(a, b, DOT: tl.constexpr, UPCAST: tl.constexpr):
    """a @ b accumulated in float32. NOTE: the interpreter's half-type dot is wrong, so there
    (UPCAST) the operands are widened first, which keeps the products exact."""
    if UPCAST:
        return tl.dot(a.to(tl.float32), b.to(tl.float32))
    return tl.dot(a, b, input_precision=DOT)


@triton.jit
def _dot_acc(a, b, acc, DOT: tl.constexpr, UPCAST: tl.constexpr):
    """acc + a @ b, the sum in the product's own accumulator."""
    if UPCAST:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc)
    return tl.dot(a, b, acc, input_precision=DOT)


@triton.jit
def _scores(qk, qi, kj, L, S, mask_base, stride_ml, stride_ms, qk_scale,
            BOUND: tl.constexpr, CAUSAL: tl.constexpr, MASK_KIND: tl.constexpr):
    """A tile of base-2 scores from the raw dot products qk, -inf where masked out, where key
    j is past S (BOUND) or above the causal diagonal (CAUSAL). qi, kj: the query and key
    indices, broadcast to the tile's orientation ([M, 1] and [1, N], or transposed). The
    loops leave BOUND and CAUSAL off on the blocks that need neither."""
    s = qk * qk_scale
    if MASK_KIND != 0:
        inside = (kj < S) & (qi < L)
        if MASK_KIND >= 4:  # MASK_WIDE: offsets within a head's L x S past 2**31
            at = mask_base + qi.to(tl.int64) * stride_ml + kj.to(tl.int64) * stride_ms
        else:
            at = mask_base + qi * stride_ml + kj * stride_ms
        if MASK_KIND % 4 == 1:  # MASK_BOOL
            s = tl.where(tl.load(at, mask=inside, other=0) != 0, s, float("-inf"))
        else:
            s += tl.load(at, mask=inside, other=0).to(tl.float32) * 1.4426950408889634
    if BOUND:
        s = tl.where(kj < S, s, float("-inf"))
    if CAUSAL:
        s = tl.where(kj <= qi, s, float("-inf"))
    return s


@triton.jit
def _dropout_keep(row0, qi, kj, S, seed_lo, seed_hi, offset, p):
    """The keep mask of a tile: weight (row0 + i, j) is kept when the uniform of Philox word 0
    at counter offset + (row0 + i) * S + j is >= p (kernels/random.py's dropout, bit for bit)."""
    counter = offset + (row0 + qi.to(tl.int64)) * S + kj.to(tl.int64)
    zero = tl.zeros_like(counter).to(tl.uint32)
    w0, _, _, _ = _philox(counter.to(tl.uint32), (counter >> 32).to(tl.uint32), zero, zero,
                          seed_lo.to(tl.uint32), seed_hi.to(tl.uint32))
    return _uniform01(w0) >= p


# ------------------------------------------------------------------------------------ forward
# Per query row i, over key blocks j (online softmax, base 2):
#   m' = max(m, max_j s_ij);  l' = l * 2^(m - m') + sum_j 2^(s_ij - m')
#   acc' = acc * 2^(m - m') + sum_j drop_ij 2^(s_ij - m') v_j       (drop = keep / (1 - p))
#   O_i = acc / l,  lse_i = m + log2(l)
# Memory traffic: Q and O once, K and V once per query block (L / BLOCK_M times), the
# log-sum-exp 4 bytes a row; nothing of L x S (a mask, when given, is read once).

@triton.jit
def _fwd_blocks(acc, l_i, m_i, q, kt_ptrs, v_ptrs, mask_base, offs_m, offs_n, offs_d, offs_dv,
                start, end, L, S, bh, stride_ks, stride_vs, stride_ml, stride_ms, qk_scale,
                dropout_p, seed_lo, seed_hi, offset, HEAD_DIM: tl.constexpr,
                HEAD_DIM_V: tl.constexpr, BLOCK_N: tl.constexpr, BOUND: tl.constexpr,
                CAUSAL: tl.constexpr, MASK_KIND: tl.constexpr, DROPOUT: tl.constexpr,
                DOT: tl.constexpr, UPCAST: tl.constexpr):
    """The online softmax over key blocks [start, end) (K^T and V pointers at start; returned
    advanced to end)."""
    inv_keep = 1.0 / (1.0 - dropout_p)
    for start_n in range(start, end, BLOCK_N):
        kj = start_n + offs_n
        if BOUND:
            kt = tl.load(kt_ptrs, mask=(offs_d[:, None] < HEAD_DIM) & (kj[None, :] < S), other=0)
            v = tl.load(v_ptrs, mask=(kj[:, None] < S) & (offs_dv[None, :] < HEAD_DIM_V),
                        other=0)
        else:
            kt = tl.load(kt_ptrs, mask=offs_d[:, None] < HEAD_DIM, other=0)
            v = tl.load(v_ptrs, mask=offs_dv[None, :] < HEAD_DIM_V, other=0)
        qk = _dot(q, kt, DOT, UPCAST)
        s = _scores(qk, offs_m[:, None], kj[None, :], L, S, mask_base, stride_ml, stride_ms,
                    qk_scale, BOUND, CAUSAL, MASK_KIND)
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)   # a row with nothing seen yet
        alpha = tl.exp2(m_i - m_safe)
        p = tl.exp2(s - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        if DROPOUT:
            keep = _dropout_keep(bh * L, offs_m[:, None], kj[None, :], S, seed_lo, seed_hi,
                                 offset, dropout_p)
            p = tl.where(keep, p * inv_keep, 0.0)
        acc = _dot_acc(p.to(v.dtype), v, acc * alpha[:, None], DOT, UPCAST)
        m_i = m_new
        kt_ptrs += BLOCK_N * stride_ks
        v_ptrs += BLOCK_N * stride_vs
    return acc, l_i, m_i, kt_ptrs, v_ptrs


@triton.jit(do_not_specialize=["qk_scale", "dropout_p", "seed_lo", "seed_hi", "offset"])
def _attn_fwd_kernel(o_ptr, lse_ptr, q_ptr, k_ptr, v_ptr, mask_ptr,
                     L, S, H, GROUP,
                     stride_qb, stride_qh, stride_ql, stride_qd,
                     stride_kb, stride_kh, stride_ks, stride_kd,
                     stride_vb, stride_vh, stride_vs, stride_vd,
                     stride_ob, stride_oh, stride_ol, stride_od,
                     stride_mb, stride_mh, stride_ml, stride_ms,
                     qk_scale: tl.float32, dropout_p: tl.float32, seed_lo: tl.int64,
                     seed_hi: tl.int64, offset: tl.int64,
                     HEAD_DIM: tl.constexpr, HEAD_DIM_V: tl.constexpr, D_PAD: tl.constexpr,
                     DV_PAD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                     CAUSAL: tl.constexpr, MASK_KIND: tl.constexpr, DROPOUT: tl.constexpr,
                     DOT: tl.constexpr, UPCAST: tl.constexpr):
    # One program: BLOCK_M query rows of one (batch, head), every key block they see.
    pid_m = tl.program_id(0)
    if CAUSAL:  # the longest rows (the last query blocks) first: a shorter tail of programs
        pid_m = tl.num_programs(0) - 1 - pid_m
    bh = tl.program_id(1).to(tl.int64)
    b = bh // H
    h = bh % H
    hk = h // GROUP
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D_PAD)
    offs_dv = tl.arange(0, DV_PAD)
    row_ok = offs_m < L

    q_base = q_ptr + b * stride_qb + h * stride_qh
    q = tl.load(q_base + offs_m[:, None].to(tl.int64) * stride_ql + offs_d[None, :] * stride_qd,
                mask=row_ok[:, None] & (offs_d[None, :] < HEAD_DIM), other=0)
    # K read as K^T tiles [D_PAD, BLOCK_N], V as [BLOCK_N, DV_PAD]; pointers step by a block
    kt_ptrs = k_ptr + b * stride_kb + hk * stride_kh + offs_d[:, None] * stride_kd + \
        offs_n[None, :].to(tl.int64) * stride_ks
    v_ptrs = v_ptr + b * stride_vb + hk * stride_vh + offs_n[:, None].to(tl.int64) * stride_vs + \
        offs_dv[None, :] * stride_vd
    mask_base = mask_ptr + b * stride_mb + h * stride_mh

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, DV_PAD], tl.float32)
    # key blocks wholly inside [0, S) and below the diagonal need no bound or causal test:
    # [0, full) without, [full, hi) with
    hi = S
    full = S
    if CAUSAL:
        hi = tl.minimum(S, (pid_m + 1) * BLOCK_M)
        full = tl.minimum(S, pid_m * BLOCK_M)
    full = full // BLOCK_N * BLOCK_N
    acc, l_i, m_i, kt_ptrs, v_ptrs = _fwd_blocks(
        acc, l_i, m_i, q, kt_ptrs, v_ptrs, mask_base, offs_m, offs_n, offs_d, offs_dv, 0, full,
        L, S, bh, stride_ks, stride_vs, stride_ml, stride_ms, qk_scale, dropout_p, seed_lo,
        seed_hi, offset, HEAD_DIM, HEAD_DIM_V, BLOCK_N, False, False, MASK_KIND, DROPOUT, DOT,
        UPCAST)
    acc, l_i, m_i, kt_ptrs, v_ptrs = _fwd_blocks(
        acc, l_i, m_i, q, kt_ptrs, v_ptrs, mask_base, offs_m, offs_n, offs_d, offs_dv, full, hi,
        L, S, bh, stride_ks, stride_vs, stride_ml, stride_ms, qk_scale, dropout_p, seed_lo,
        seed_hi, offset, HEAD_DIM, HEAD_DIM_V, BLOCK_N, True, CAUSAL, MASK_KIND, DROPOUT, DOT,
        UPCAST)

    seen = l_i > 0.0   # NOTE: a row with every key masked out gives 0, as torch's CPU SDPA
    o = tl.where(seen[:, None], acc / tl.where(seen, l_i, 1.0)[:, None], 0.0)
    o_base = o_ptr + b * stride_ob + h * stride_oh
    tl.store(o_base + offs_m[:, None].to(tl.int64) * stride_ol + offs_dv[None, :] * stride_od,
             o.to(o_ptr.dtype.element_ty),
             mask=row_ok[:, None] & (offs_dv[None, :] < HEAD_DIM_V))
    lse = tl.where(seen, m_i + tl.log2(tl.where(seen, l_i, 1.0)), float("inf"))
    tl.store(lse_ptr + bh * L + offs_m, lse, mask=row_ok)


# ----------------------------------------------------------------------------------- backward
# With P = softmax, dP_ij = drop_ij (dO_i . v_j) and delta_i = sum_j P_ij dP_ij = dO_i . O_i:
#   dS_ij = P_ij (dP_ij - delta_i)
#   dV_j = sum_i drop_ij P_ij dO_i,  dK_j = scale sum_i dS_ij q_i,  dQ_i = scale sum_j dS_ij k_j
# Three kernels, no atomics (deterministic): delta (reads dO and O once), dK/dV (a program
# owns a key block of one key head and loops over its query heads and query blocks: Q and dO
# read S / BLOCK_N1 times), dQ (a program owns a query block: K and V read L / BLOCK_M2
# times).

@triton.jit
def _attn_delta_kernel(delta_ptr, o_ptr, do_ptr, L, H,
                       stride_ob, stride_oh, stride_ol, stride_od,
                       stride_gb, stride_gh, stride_gl, stride_gd,
                       HEAD_DIM_V: tl.constexpr, DV_PAD: tl.constexpr, BLOCK_M: tl.constexpr):
    # One program: delta_i = sum_d dO_id O_id for BLOCK_M rows of one (batch, head), float32.
    bh = tl.program_id(1).to(tl.int64)
    b = bh // H
    h = bh % H
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_dv = tl.arange(0, DV_PAD)
    ok = (offs_m[:, None] < L) & (offs_dv[None, :] < HEAD_DIM_V)
    rows = offs_m[:, None].to(tl.int64)
    o = tl.load(o_ptr + b * stride_ob + h * stride_oh + rows * stride_ol +
                offs_dv[None, :] * stride_od, mask=ok, other=0).to(tl.float32)
    do = tl.load(do_ptr + b * stride_gb + h * stride_gh + rows * stride_gl +
                 offs_dv[None, :] * stride_gd, mask=ok, other=0).to(tl.float32)
    tl.store(delta_ptr + bh * L + offs_m, tl.sum(o * do, 1), mask=offs_m < L)


@triton.jit
def _dkdv_blocks(dk, dv, k, v, qt_base, do_base, mask_base, lse_ptr, delta_ptr, offs_n, offs_m0,
                 offs_d, offs_dv, start, end, L, S, bh, stride_ql, stride_gl, stride_ml,
                 stride_ms, qk_scale, dropout_p, seed_lo, seed_hi, offset,
                 HEAD_DIM: tl.constexpr, HEAD_DIM_V: tl.constexpr, BLOCK_M: tl.constexpr,
                 CAUSAL: tl.constexpr, MASK_KIND: tl.constexpr, DROPOUT: tl.constexpr,
                 DOT: tl.constexpr, UPCAST: tl.constexpr):
    """dK and dV of one key block summed over the query blocks [start, end) of head bh.
    Keys past S need no test: their rows of dK and dV are never stored. Rows past L load
    lse = +inf, so that their P is 0."""
    inv_keep = 1.0 / (1.0 - dropout_p)
    for start_m in range(start, end, BLOCK_M):
        qi = start_m + offs_m0
        q_ok = qi < L
        rows = qi.to(tl.int64)
        qt = tl.load(qt_base + rows[None, :] * stride_ql,
                     mask=(offs_d[:, None] < HEAD_DIM) & q_ok[None, :], other=0)
        do = tl.load(do_base + rows[:, None] * stride_gl,
                     mask=q_ok[:, None] & (offs_dv[None, :] < HEAD_DIM_V), other=0)
        lse = tl.load(lse_ptr + bh * L + qi, mask=q_ok, other=float("inf"))
        delta = tl.load(delta_ptr + bh * L + qi, mask=q_ok, other=0)
        qkt = _dot(k, qt, DOT, UPCAST)
        st = _scores(qkt, qi[None, :], offs_n[:, None], L, S, mask_base, stride_ml, stride_ms,
                     qk_scale, False, CAUSAL, MASK_KIND)
        pt = tl.exp2(st - lse[None, :])                                  # P^T [keys, queries]
        dpt = _dot(v, tl.trans(do), DOT, UPCAST).to(tl.float32)  # (dO V^T)^T
        if DROPOUT:
            keep = _dropout_keep(bh * L, qi[None, :], offs_n[:, None], S, seed_lo, seed_hi,
                                 offset, dropout_p)
            dv = _dot_acc(tl.where(keep, pt * inv_keep, 0.0).to(do.dtype), do, dv, DOT,
                          UPCAST)
            dpt = tl.where(keep, dpt * inv_keep, 0.0)
        else:
            dv = _dot_acc(pt.to(do.dtype), do, dv, DOT, UPCAST)
        dst = pt * (dpt - delta[None, :])
        dk = _dot_acc(dst.to(qt.dtype), tl.trans(qt), dk, DOT, UPCAST)
    return dk, dv


@triton.jit(do_not_specialize=["qk_scale", "sm_scale", "dropout_p", "seed_lo", "seed_hi",
                               "offset"])
def _attn_dkdv_kernel(dk_ptr, dv_ptr, q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, mask_ptr,
                      L, S, H, HK, GROUP, stride_dks, stride_dvs,
                      stride_qb, stride_qh, stride_ql, stride_qd,
                      stride_kb, stride_kh, stride_ks, stride_kd,
                      stride_vb, stride_vh, stride_vs, stride_vd,
                      stride_gb, stride_gh, stride_gl, stride_gd,
                      stride_mb, stride_mh, stride_ml, stride_ms,
                      qk_scale: tl.float32, sm_scale: tl.float32, dropout_p: tl.float32,
                      seed_lo: tl.int64, seed_hi: tl.int64, offset: tl.int64,
                      HEAD_DIM: tl.constexpr, HEAD_DIM_V: tl.constexpr, D_PAD: tl.constexpr,
                      DV_PAD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                      CAUSAL: tl.constexpr, MASK_KIND: tl.constexpr, DROPOUT: tl.constexpr,
                      DOT: tl.constexpr, UPCAST: tl.constexpr):
    # One program: dK, dV of BLOCK_N keys of one (batch, key head), summed over the GROUP query
    # heads that share it and every query block that sees them. Tiles are transposed
    # ([keys, queries]) so that no product needs a transpose of P.
    pid_n = tl.program_id(0)
    bhk = tl.program_id(1).to(tl.int64)
    b = bhk // HK
    hk = bhk % HK
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m0 = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D_PAD)
    offs_dv = tl.arange(0, DV_PAD)
    key_ok = offs_n < S
    keys = offs_n[:, None].to(tl.int64)
    k = tl.load(k_ptr + b * stride_kb + hk * stride_kh + keys * stride_ks +
                offs_d[None, :] * stride_kd,
                mask=key_ok[:, None] & (offs_d[None, :] < HEAD_DIM), other=0)
    v = tl.load(v_ptr + b * stride_vb + hk * stride_vh + keys * stride_vs +
                offs_dv[None, :] * stride_vd,
                mask=key_ok[:, None] & (offs_dv[None, :] < HEAD_DIM_V), other=0)
    dk = tl.zeros([BLOCK_N, D_PAD], tl.float32)
    dv = tl.zeros([BLOCK_N, DV_PAD], tl.float32)
    for g in range(0, GROUP):
        h = hk * GROUP + g
        bh = b * H + h
        qt_base = q_ptr + b * stride_qb + h * stride_qh + offs_d[:, None] * stride_qd
        do_base = do_ptr + b * stride_gb + h * stride_gh + offs_dv[None, :] * stride_gd
        mask_base = mask_ptr + b * stride_mb + h * stride_mh
        if CAUSAL:
            # queries before this key block's first key see none of it; the query blocks
            # before its last key meet the diagonal, the later ones see every key
            lo = (pid_n * BLOCK_N // BLOCK_M) * BLOCK_M
            diag = tl.minimum(L, tl.cdiv((pid_n + 1) * BLOCK_N, BLOCK_M) * BLOCK_M)
            dk, dv = _dkdv_blocks(
                dk, dv, k, v, qt_base, do_base, mask_base, lse_ptr, delta_ptr, offs_n, offs_m0,
                offs_d, offs_dv, lo, diag, L, S, bh, stride_ql, stride_gl, stride_ml, stride_ms,
                qk_scale, dropout_p, seed_lo, seed_hi, offset, HEAD_DIM, HEAD_DIM_V, BLOCK_M,
                True, MASK_KIND, DROPOUT, DOT, UPCAST)
        else:
            diag = 0
        dk, dv = _dkdv_blocks(
            dk, dv, k, v, qt_base, do_base, mask_base, lse_ptr, delta_ptr, offs_n, offs_m0,
            offs_d, offs_dv, diag, L, L, S, bh, stride_ql, stride_gl, stride_ml, stride_ms,
            qk_scale, dropout_p, seed_lo, seed_hi, offset, HEAD_DIM, HEAD_DIM_V, BLOCK_M,
            False, MASK_KIND, DROPOUT, DOT, UPCAST)
    dk *= sm_scale
    # dK, dV: contiguous [B, HK, S, E] and [B, HK, S, Ev]
    tl.store(dk_ptr + (bhk * S + keys) * stride_dks + offs_d[None, :],
             dk.to(dk_ptr.dtype.element_ty),
             mask=key_ok[:, None] & (offs_d[None, :] < HEAD_DIM))
    tl.store(dv_ptr + (bhk * S + keys) * stride_dvs + offs_dv[None, :],
             dv.to(dv_ptr.dtype.element_ty),
             mask=key_ok[:, None] & (offs_dv[None, :] < HEAD_DIM_V))


@triton.jit
def _dq_blocks(dq, q, do, lse, delta, kt_ptrs, vt_ptrs, mask_base, offs_m, offs_n, offs_d,
               offs_dv, start, end, L, S, bh, stride_ks, stride_vs, stride_ml, stride_ms,
               qk_scale, dropout_p, seed_lo, seed_hi, offset, HEAD_DIM: tl.constexpr,
               HEAD_DIM_V: tl.constexpr, BLOCK_N: tl.constexpr, BOUND: tl.constexpr,
               CAUSAL: tl.constexpr, MASK_KIND: tl.constexpr, DROPOUT: tl.constexpr,
               DOT: tl.constexpr, UPCAST: tl.constexpr):
    """dQ of one query block summed over the key blocks [start, end) (K^T and V^T pointers
    at start; returned advanced to end). NOTE: keys past S must be masked here (BOUND): their
    zero rows give scores 0, and 2^(0 - lse) may overflow, whose infinity times a zero key
    would be NaN."""
    inv_keep = 1.0 / (1.0 - dropout_p)
    for start_n in range(start, end, BLOCK_N):
        kj = start_n + offs_n
        if BOUND:
            kt = tl.load(kt_ptrs, mask=(offs_d[:, None] < HEAD_DIM) & (kj[None, :] < S), other=0)
            vt = tl.load(vt_ptrs, mask=(offs_dv[:, None] < HEAD_DIM_V) & (kj[None, :] < S),
                         other=0)
        else:
            kt = tl.load(kt_ptrs, mask=offs_d[:, None] < HEAD_DIM, other=0)
            vt = tl.load(vt_ptrs, mask=offs_dv[:, None] < HEAD_DIM_V, other=0)
        qk = _dot(q, kt, DOT, UPCAST)
        s = _scores(qk, offs_m[:, None], kj[None, :], L, S, mask_base, stride_ml, stride_ms,
                    qk_scale, BOUND, CAUSAL, MASK_KIND)
        p = tl.exp2(s - lse[:, None])
        dp = _dot(do, vt, DOT, UPCAST).to(tl.float32)
        if DROPOUT:
            keep = _dropout_keep(bh * L, offs_m[:, None], kj[None, :], S, seed_lo, seed_hi,
                                 offset, dropout_p)
            dp = tl.where(keep, dp * inv_keep, 0.0)
        ds = p * (dp - delta[:, None])
        dq = _dot_acc(ds.to(kt.dtype), tl.trans(kt), dq, DOT, UPCAST)
        kt_ptrs += BLOCK_N * stride_ks
        vt_ptrs += BLOCK_N * stride_vs
    return dq, kt_ptrs, vt_ptrs


@triton.jit(do_not_specialize=["qk_scale", "sm_scale", "dropout_p", "seed_lo", "seed_hi",
                               "offset"])
def _attn_dq_kernel(dq_ptr, q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, mask_ptr,
                    L, S, H, GROUP, stride_dql,
                    stride_qb, stride_qh, stride_ql, stride_qd,
                    stride_kb, stride_kh, stride_ks, stride_kd,
                    stride_vb, stride_vh, stride_vs, stride_vd,
                    stride_gb, stride_gh, stride_gl, stride_gd,
                    stride_mb, stride_mh, stride_ml, stride_ms,
                    qk_scale: tl.float32, sm_scale: tl.float32, dropout_p: tl.float32,
                    seed_lo: tl.int64, seed_hi: tl.int64, offset: tl.int64,
                    HEAD_DIM: tl.constexpr, HEAD_DIM_V: tl.constexpr, D_PAD: tl.constexpr,
                    DV_PAD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                    CAUSAL: tl.constexpr, MASK_KIND: tl.constexpr, DROPOUT: tl.constexpr,
                    DOT: tl.constexpr, UPCAST: tl.constexpr):
    # One program: dQ of BLOCK_M query rows of one (batch, head), over the key blocks they see.
    pid_m = tl.program_id(0)
    if CAUSAL:  # the longest rows (the last query blocks) first: a shorter tail of programs
        pid_m = tl.num_programs(0) - 1 - pid_m
    bh = tl.program_id(1).to(tl.int64)
    b = bh // H
    h = bh % H
    hk = h // GROUP
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D_PAD)
    offs_dv = tl.arange(0, DV_PAD)
    row_ok = offs_m < L
    rows = offs_m[:, None].to(tl.int64)
    q = tl.load(q_ptr + b * stride_qb + h * stride_qh + rows * stride_ql +
                offs_d[None, :] * stride_qd,
                mask=row_ok[:, None] & (offs_d[None, :] < HEAD_DIM), other=0)
    do = tl.load(do_ptr + b * stride_gb + h * stride_gh + rows * stride_gl +
                 offs_dv[None, :] * stride_gd,
                 mask=row_ok[:, None] & (offs_dv[None, :] < HEAD_DIM_V), other=0)
    lse = tl.load(lse_ptr + bh * L + offs_m, mask=row_ok, other=float("inf"))
    delta = tl.load(delta_ptr + bh * L + offs_m, mask=row_ok, other=0)
    kt_ptrs = k_ptr + b * stride_kb + hk * stride_kh + offs_d[:, None] * stride_kd + \
        offs_n[None, :].to(tl.int64) * stride_ks
    vt_ptrs = v_ptr + b * stride_vb + hk * stride_vh + offs_dv[:, None] * stride_vd + \
        offs_n[None, :].to(tl.int64) * stride_vs
    mask_base = mask_ptr + b * stride_mb + h * stride_mh
    dq = tl.zeros([BLOCK_M, D_PAD], tl.float32)
    # as the forward: [0, full) needs no bound or causal test, [full, hi) does
    hi = S
    full = S
    if CAUSAL:
        hi = tl.minimum(S, (pid_m + 1) * BLOCK_M)
        full = tl.minimum(S, pid_m * BLOCK_M)
    full = full // BLOCK_N * BLOCK_N
    dq, kt_ptrs, vt_ptrs = _dq_blocks(
        dq, q, do, lse, delta, kt_ptrs, vt_ptrs, mask_base, offs_m, offs_n, offs_d, offs_dv, 0,
        full, L, S, bh, stride_ks, stride_vs, stride_ml, stride_ms, qk_scale, dropout_p,
        seed_lo, seed_hi, offset, HEAD_DIM, HEAD_DIM_V, BLOCK_N, False, False, MASK_KIND,
        DROPOUT, DOT, UPCAST)
    dq, kt_ptrs, vt_ptrs = _dq_blocks(
        dq, q, do, lse, delta, kt_ptrs, vt_ptrs, mask_base, offs_m, offs_n, offs_d, offs_dv,
        full, hi, L, S, bh, stride_ks, stride_vs, stride_ml, stride_ms, qk_scale, dropout_p,
        seed_lo, seed_hi, offset, HEAD_DIM, HEAD_DIM_V, BLOCK_N, True, CAUSAL, MASK_KIND,
        DROPOUT, DOT, UPCAST)
    dq *= sm_scale
    # dQ: contiguous [B, H, L, E]
    tl.store(dq_ptr + (bh * L + rows) * stride_dql + offs_d[None, :],
             dq.to(dq_ptr.dtype.element_ty),
             mask=row_ok[:, None] & (offs_d[None, :] < HEAD_DIM))


# ------------------------------------------------------------------------------------ launchers


def _blocks(head_dim, dtype):
    """(forward (BLOCK_M, BLOCK_N, warps, stages), dK/dV (BLOCK_M, BLOCK_N, ...), dQ (...)).
    Under the interpreter INTERPRET_BLOCKS. On the GPU the tiles of Triton's fused-attention
    tutorial (forward 128 x 64, dK/dV 32 queries x 128 keys, dQ 128 x 32), float32 tiles half
    as large, and the warps and queries a dK/dV step that keep its accumulators in registers
    at sm_90 (no spills in ptxas's resource usage, Triton 3.9, 2026-12-02); not yet timed:
    `bench attention --sweep` times the alternatives on a GPU."""
    if INTERPRET:
        return INTERPRET_BLOCKS
    if GPU_BLOCKS is not None:
        return GPU_BLOCKS
    wide = head_dim > 64
    if dtype == torch.float32:
        return ((64, 32, 4, 2), (32, 64, 4 if not wide else 8, 2),
                (64, 32, 4 if not wide else 8, 2))
    return ((128, 64, 8 if wide else 4, 3), (16 if wide else 32, 128, 8, 2),
            (128, 32, 8 if wide else 4, 2 if wide else 3))


def _dot_precision(dtype):
    """tl.dot's input precision: for float32 operands, float32 accuracy (3xTF32) under the
    default matmul precision "highest", TF32 under "high" (td.set_matmul_precision); half
    operands multiply exactly on tensor cores either way."""
    if dtype == torch.float32 and matmul_precision() == "highest":
        return "tf32x3"
    return "tf32"


def _pad(n):
    return max(16, next_power_of_2(n))


def _check(op, q, k, v, mask):
    for name, a in (("query", q), ("key", k), ("value", v)):
        if a.dim() != 4:
            raise ValueError(f"{op}: {name} must be a 4-d [batch, heads, length, dim] array, got "
                             f"shape {tuple(a.shape)}")
    if not (q.dtype == k.dtype == v.dtype) or q.dtype not in (torch.float32, torch.float16,
                                                              torch.bfloat16):
        raise TypeError(f"{op}: query, key and value must share one of float32, float16, "
                        f"bfloat16, got {dtype_of(q).name}, {dtype_of(k).name}, "
                        f"{dtype_of(v).name}")
    (B, H, L, E), (Bk, Hk, S, Ek), (Bv, Hv, Sv, Ev) = q.shape, k.shape, v.shape
    if not (B == Bk == Bv and Hk == Hv and S == Sv and E == Ek) or Hk == 0 or H % Hk:
        raise ValueError(f"{op}: shapes do not fit: query {tuple(q.shape)}, key "
                         f"{tuple(k.shape)}, value {tuple(v.shape)}")
    if max(E, Ev) > MAX_HEAD_DIM:
        raise ValueError(f"{op}: head dims up to {MAX_HEAD_DIM}, got {E} and {Ev}")
    if mask is not None and tuple(mask.shape) != (B, H, L, S):
        raise ValueError(f"{op}: the mask must be expanded to {(B, H, L, S)}, got "
                         f"{tuple(mask.shape)}")


def _mask_args(mask, q):
    """(mask array or q as a stand-in, its 4 strides, MASK_KIND)."""
    if mask is None:
        return q, (0, 0, 0, 0), MASK_NONE
    kind = MASK_BOOL if mask.dtype == torch.bool else MASK_ADD
    L, S = mask.shape[2], mask.shape[3]
    if (L - 1) * abs(mask.stride(2)) + (S - 1) * abs(mask.stride(3)) >= MASK_INT32_LIMIT:
        kind += MASK_WIDE
    return mask, tuple(mask.stride()), kind


def _forward(q, k, v, mask, scale, causal, dropout_p, seed, offset):
    _check("flash_attention", q, k, v, mask)
    B, H, L, E = q.shape
    Hk, S, Ev = k.shape[1], k.shape[2], v.shape[3]
    o = empty((B, H, L, Ev), q.dtype, q.device)
    lse = empty((B, H, L), torch.float32, q.device)
    if o.numel() == 0:
        return o, lse
    m, m_strides, kind = _mask_args(mask, q)
    (bm, bn, warps, stages), _, _ = _blocks(max(E, Ev), q.dtype)
    seed = int(seed) & 0xFFFFFFFFFFFFFFFF
    run(_attn_fwd_kernel, (cdiv(L, bm), B * H),
        o, lse, q, k, v, m, L, S, H, H // Hk, *q.stride(), *k.stride(), *v.stride(), *o.stride(),
        *m_strides, float(scale) * LOG2E, float(dropout_p), seed & 0xFFFFFFFF, seed >> 32,
        int(offset), HEAD_DIM=E, HEAD_DIM_V=Ev, D_PAD=_pad(E), DV_PAD=_pad(Ev), BLOCK_M=bm,
        BLOCK_N=bn, CAUSAL=bool(causal), MASK_KIND=kind, DROPOUT=dropout_p > 0,
        DOT=_dot_precision(q.dtype), UPCAST=INTERPRET and q.dtype != torch.float32,
        num_warps=warps, num_stages=stages)
    return o, lse


def _backward(do, q, k, v, o, lse, mask, scale, causal, dropout_p, seed, offset):
    _check("flash_attention_backward", q, k, v, mask)
    B, H, L, E = q.shape
    Hk, S, Ev = k.shape[1], k.shape[2], v.shape[3]
    if tuple(do.shape) != tuple(o.shape) or do.dtype != o.dtype:
        raise ValueError(f"flash_attention_backward: dO {tuple(do.shape)} "
                         f"{dtype_of(do).name} does not match O {tuple(o.shape)} "
                         f"{dtype_of(o).name}")
    dq = empty(q.shape, q.dtype, q.device)
    dk = empty(k.shape, k.dtype, k.device)
    dv = empty(v.shape, v.dtype, v.device)
    if q.numel() == 0 and k.numel() == 0:
        return dq, dk, dv
    m, m_strides, kind = _mask_args(mask, q)
    _, (bm1, bn1, w1, s1), (bm2, bn2, w2, s2) = _blocks(max(E, Ev), q.dtype)
    seed = int(seed) & 0xFFFFFFFFFFFFFFFF
    numbers = (float(scale) * LOG2E, float(scale), float(dropout_p), seed & 0xFFFFFFFF,
               seed >> 32, int(offset))
    meta = dict(HEAD_DIM=E, HEAD_DIM_V=Ev, D_PAD=_pad(E), DV_PAD=_pad(Ev), CAUSAL=bool(causal),
                MASK_KIND=kind, DROPOUT=dropout_p > 0, DOT=_dot_precision(q.dtype),
                UPCAST=INTERPRET and q.dtype != torch.float32)
    delta = empty((B, H, L), torch.float32, q.device)
    block = 16 if INTERPRET else 64
    run(_attn_delta_kernel, (cdiv(L, block), B * H), delta, o, do, L, H, *o.stride(),
        *do.stride(), HEAD_DIM_V=Ev, DV_PAD=_pad(Ev), BLOCK_M=block,
        num_warps=1 if INTERPRET else 4)
    strides = (*q.stride(), *k.stride(), *v.stride(), *do.stride(), *m_strides)
    run(_attn_dkdv_kernel, (cdiv(S, bn1), B * Hk),
        dk, dv, q, k, v, do, lse, delta, m, L, S, H, Hk, H // Hk, E, Ev, *strides, *numbers,
        BLOCK_M=bm1, BLOCK_N=bn1, num_warps=w1, num_stages=s1, **meta)
    run(_attn_dq_kernel, (cdiv(L, bm2), B * H),
        dq, q, k, v, do, lse, delta, m, L, S, H, H // Hk, E, *strides, *numbers,
        BLOCK_M=bm2, BLOCK_N=bn2, num_warps=w2, num_stages=s2, **meta)
    return dq, dk, dv


# Without dropout a call's launches follow from its shapes, strides, dtypes and flags, so they
# are planned (replayed per signature); with dropout the seed and counter offset change every
# call, so those calls launch directly.
@planned(settings=matmul_precision, arrays=4)
def _forward_planned(q, k, v, mask, scale, causal):
    return _forward(q, k, v, mask, scale, causal, 0.0, 0, 0)


@planned(settings=matmul_precision, arrays=7)
def _backward_planned(do, q, k, v, o, lse, mask, scale, causal):
    return _backward(do, q, k, v, o, lse, mask, scale, causal, 0.0, 0, 0)


def flash_attention(q, k, v, mask=None, scale=1.0, causal=False, dropout_p=0.0, seed=0,
                    offset=0):
    """(O, lse) of softmax(scale * Q K^T + mask) V with dropout on the weights.
    q: [B, H, L, E], k: [B, Hk, S, E], v: [B, Hk, S, Ev] (H a multiple of Hk), any strides;
    mask: None, bool (True = take part) or of q's dtype (added), expanded to [B, H, L, S];
    O: [B, H, L, Ev] contiguous; lse: [B, H, L] float32, base 2 (+inf for a row with every key
    masked). Dropout keeps weight (b, h, i, j) as kernels/random.py's dropout keeps element
    ((b * H + h) * L + i) * S + j of a draw at (seed, offset)."""
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"flash_attention: dropout_p must be in [0, 1), got {dropout_p}")
    if dropout_p == 0.0:
        return _forward_planned(q, k, v, mask, float(scale), bool(causal))
    return _forward(q, k, v, mask, scale, causal, dropout_p, seed, offset)


def flash_attention_backward(do, q, k, v, o, lse, mask=None, scale=1.0, causal=False,
                             dropout_p=0.0, seed=0, offset=0):
    """(dQ, dK, dV) of flash_attention's O for the incoming dO [B, H, L, Ev], from the forward's
    arguments, O and lse (P recomputed tile by tile); contiguous, the shapes of q, k, v."""
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"flash_attention_backward: dropout_p must be in [0, 1), got "
                         f"{dropout_p}")
    if dropout_p == 0.0:
        return _backward_planned(do, q, k, v, o, lse, mask, float(scale), bool(causal))
    return _backward(do, q, k, v, o, lse, mask, scale, causal, dropout_p, seed, offset)
