"""A ReLU MLP's cross-entropy gradients, forward and backward, in three kernels: the fused path
of a training step (Backend.mlp_cross_entropy_grads_).

A fusion for the pattern of the MNIST MLP recipes (models.mlp: Linear and ReLU layers trained
with cross-entropy, FusedMLP), apart from the general ops. Backend's default, the per-op path
(gather_rows, matmul, cross_entropy, relu_backward), is its specification and the numpy
backend's implementation.

A captured MNIST MLP step built from per-op kernels is ~16 kernels, and each costs 2-6 us
however small its product (launch, a chain of dependent loads, the epilogue), so the step is
latency-bound at ~49 us on an H200 while its arithmetic takes ~1 us. Here the dependency chain
of the step is cut to three launches, using the fact that everything between the first layer's
product and the weight gradients is row-local:

1. `_first_layer_kernel`: split-K partial products P[s] = x[rows] @ W1^T over a slice of the
   input features (the batch gathered from the dataset at the device cursor as it is read; with
   CONFIG["xt"] also x^T for the weight gradient). The long K (784 for MNIST) is what needs many
   programs.
2. `_tail_kernel`: one program per BLOCK_M rows does all the rest of the forward and backward
   for its rows: h1 = relu(sum_s P[s] + b1), the middle layer, logits, the cross-entropy with
   its loss total and correct count, dlogits, and dz = relu'(h) * (dz_next @ W) down to the
   first layer. Only the (small) tail weights are read, from L2.
3. `_weight_grads_kernel`: every layer's dW = dz^T @ h_prev and db = sum_rows(dz), one tile per
   program over all layers at once (a grouped GEMM, K = the batch), plus the metrics.

The activations are kept transposed ([features, batch]) between kernels, so that the weight
gradients read both operands K-major. Exact fp32 products run as 3xTF32 on tensor cores
("highest", error at fp32 level) or TF32 ("high"), as the matmul tuner found fastest for these
shapes; under the interpreter they are plain fp32.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..backend import check_mlp_cross_entropy, matmul_precision
from . import errors
from .elementwise import contiguous
from .errors import report
from .index import _cursor_row
from .launch import INTERPRET, PDL, cdiv, next_power_of_2
from .plans import empty, planned, run

PRIMITIVES = ("mlp_cross_entropy_grads_",)

# Tile settings, from benchmarks/sweep_mlp.py on an H200 (Triton 3.6) for the MNIST MLP: 33 us
# per call in a CUDA graph. x3: exact fp32 as 3xTF32 (else FMA, 1.6x slower there); xt: the
# first kernel also writes x^T for the weight gradient (else that kernel gathers x itself).
CONFIG = dict(M1=16, N1=32, K1=64, SPLIT_K=256, M2=16, H2=128, O3=64, I3=32, B3=64,
              warps1=4, warps2=8, warps3=4, x3=True, xt=False)


# ----------------------------------------------------------------------------------- kernels


@triton.jit
def _sample_rows(table_ptr, cursor_ptr, m, m_ok, n_table, batch, n_samples,
                 GATHER: tl.constexpr, CURSOR: tl.constexpr):
    """(sample index of batch row m, whether it was in range, the index as given):
    table[cursor % R, m] (CURSOR), table[0, m] or m itself; negative indices wrap, the rest are
    clamped into range."""
    if GATHER:
        base = tl.zeros([], tl.int64)
        if CURSOR:
            base = _cursor_row(tl.load(cursor_ptr), n_table) * batch
        given = tl.load(table_ptr + base + m, mask=m_ok, other=0).to(tl.int64)
        ok = (given >= -n_samples) & (given < n_samples)
        row = tl.where(given < 0, given + n_samples, given)
        row = tl.minimum(tl.maximum(row, 0), n_samples - 1)
    else:
        row = m.to(tl.int64)
        given = row
        ok = m >= 0
    return row, ok, given


@triton.jit
def _first_layer_kernel(part_ptr, xt_ptr, x_ptr, w_ptr, table_ptr, cursor_ptr,
                        batch, n_samples, n_table, D, H, k_per_split,
                        stride_xn, stride_xd, stride_wh, stride_wd,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                        GATHER: tl.constexpr, CURSOR: tl.constexpr, XT: tl.constexpr,
                        PRECISION: tl.constexpr, GDC: tl.constexpr):
    if GDC:  # programmatic dependent launch (launch.PDL): wait for the kernels before
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    # program (m, n, s): part[s, m-tile, n-tile] = x[rows of the m-tile, K slice s] @ W1^T; the
    # programs of the first column tile also write those x tiles transposed into xt [D, batch]
    # when XT (else the weight gradient gathers x itself)
    pid_n = tl.program_id(1)
    m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    m_ok = m < batch
    rows, _, _ = _sample_rows(table_ptr, cursor_ptr, m, m_ok, n_table, batch, n_samples,
                           GATHER, CURSOR)
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < H
    k_start = tl.program_id(2) * k_per_split
    k = k_start + tl.arange(0, BLOCK_K)
    x_ptrs = x_ptr + rows[:, None] * stride_xn + k[None, :].to(tl.int64) * stride_xd
    w_ptrs = w_ptr + n[None, :] * stride_wh + k[:, None] * stride_wd
    xt_ptrs = xt_ptr + k[None, :].to(tl.int64) * batch + m[:, None]
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for _ in range(k_start, tl.minimum(k_start + k_per_split, D), BLOCK_K):
        k_ok = k < D
        a = tl.load(x_ptrs, mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        b = tl.load(w_ptrs, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
        if XT:
            if pid_n == 0:
                tl.store(xt_ptrs, a, mask=m_ok[:, None] & k_ok[None, :])
        acc = tl.dot(a, b, acc, input_precision=PRECISION)
        k += BLOCK_K
        x_ptrs += BLOCK_K * stride_xd
        w_ptrs += BLOCK_K * stride_wd
        xt_ptrs += BLOCK_K * batch
    part_ptr += tl.program_id(2).to(tl.int64) * batch * H
    tl.store(part_ptr + m[:, None] * H + n[None, :], acc, mask=m_ok[:, None] & n_ok[None, :])


@triton.jit
def _first_hidden(part_ptr, b1_ptr, m, m_ok, h, batch, H, splits, SPLITS_P: tl.constexpr):
    """relu(sum_s part[s, m, h] + b1[h]) for a [rows, features] tile (0 outside the edges): the
    first layer's output, its split-K slices added in a fixed order. The loop is unrolled so
    that the slices' loads are independent (one memory round trip, not one per slice)."""
    h_ok = h < H
    mask = m_ok[:, None] & h_ok[None, :]
    ptrs = part_ptr + m[:, None] * H + h[None, :]
    z = tl.load(b1_ptr + h, mask=h_ok, other=0.0)[None, :]
    for s in tl.static_range(SPLITS_P):
        in_split = (tl.zeros_like(m) + s) < splits
        z += tl.load(ptrs + s * batch * H, mask=mask & in_split[:, None], other=0.0)
    return tl.where(mask & (z > 0), z, 0.0)


@triton.jit
def _store_t(ptr, v, m, m_ok, f, f_ok, batch):
    """Store a [rows, features] tile transposed into a [features, batch] array."""
    tl.store(ptr + f[None, :] * batch + m[:, None], v, mask=m_ok[:, None] & f_ok[None, :])


@triton.jit
def _tail_kernel(part_ptr, b1_ptr, h1t_ptr, dz1t_ptr,
                 w2_ptr, b2_ptr, h2t_ptr, dz2t_ptr, w3_ptr, b3_ptr, dz3t_ptr,
                 target_ptr, table_ptr, cursor_ptr, rows_ptr, loss_ptr, hits_ptr,
                 sample_flag_ptr, target_flag_ptr,
                 batch, n_samples, n_table, splits, H1, H2, C, inv_batch,
                 stride_w2o, stride_w2i, stride_w3o, stride_w3i, stride_t,
                 BLOCK_M: tl.constexpr, BLOCK_H: tl.constexpr, H2_P: tl.constexpr,
                 C_P: tl.constexpr, SPLITS_P: tl.constexpr, MIDDLE: tl.constexpr,
                 GATHER: tl.constexpr,
                 CURSOR: tl.constexpr, PRECISION: tl.constexpr, GDC: tl.constexpr):
    if GDC:  # programmatic dependent launch (launch.PDL): wait for the kernels before
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    # one program: BLOCK_M rows of the batch through the rest of the forward and the backward.
    # MIDDLE: layers W2 [H2, H1] and W3 [C, H2] follow the first; otherwise only W2 [C, H1]
    # (then the w3/b3/h2t/dz2t arguments are unused). Outputs: h1 and every dz transposed,
    # this program's loss sum and correct count; a bad sample index or target is reported on
    # the error flags (kernels/errors.py).
    pid = tl.program_id(0)
    m = pid * BLOCK_M + tl.arange(0, BLOCK_M)
    m_ok = m < batch
    rows, row_ok, given = _sample_rows(table_ptr, cursor_ptr, m, m_ok, n_table, batch,
                                       n_samples, GATHER, CURSOR)
    tl.store(rows_ptr + m, rows, mask=m_ok)
    t = tl.load(target_ptr + rows * stride_t, mask=m_ok, other=0).to(tl.int64)
    t_ok = (t >= 0) & (t < C)
    report(sample_flag_ptr, m_ok & ~row_ok, m, given, n_samples)
    report(target_flag_ptr, m_ok & row_ok & ~t_ok, rows, t, C)
    t = tl.minimum(tl.maximum(t, 0), C - 1)  # NOTE: a bad target was reported; nothing faults
    hb = tl.arange(0, BLOCK_H)
    c = tl.arange(0, C_P)
    c_ok = c < C
    # NOTE: each dependent memory round trip costs ~0.5-1 us here, so everything that does not
    # depend on the loop (the last layer's weights, the biases) is loaded before it
    out_b_ptr = b2_ptr  # the last layer's bias
    if MIDDLE:
        out_b_ptr = b3_ptr
        g = tl.arange(0, H2_P)
        g_ok = g < H2
        b2 = tl.load(b2_ptr + g, mask=g_ok, other=0.0)
        w3t = tl.load(w3_ptr + c[None, :] * stride_w3o + g[:, None] * stride_w3i,
                      mask=c_ok[None, :] & g_ok[:, None], other=0.0)
        w3 = tl.load(w3_ptr + c[:, None] * stride_w3o + g[None, :] * stride_w3i,
                     mask=c_ok[:, None] & g_ok[None, :], other=0.0)
        acc = tl.zeros((BLOCK_M, H2_P), tl.float32)
    else:
        acc = tl.zeros((BLOCK_M, C_P), tl.float32)
    b_out = tl.load(out_b_ptr + c, mask=c_ok, other=0.0)

    # ---- forward: h1 (stored), then the middle layer or the logits straight from h1 chunks
    for h0 in range(0, H1, BLOCK_H):
        h = h0 + hb
        h1 = _first_hidden(part_ptr, b1_ptr, m, m_ok, h, batch, H1, splits, SPLITS_P)
        _store_t(h1t_ptr, h1, m, m_ok, h, h < H1, batch)
        if MIDDLE:  # W2^T chunk [BLOCK_H, H2_P]
            w = tl.load(w2_ptr + g[None, :] * stride_w2o + h[:, None] * stride_w2i,
                        mask=g_ok[None, :] & (h < H1)[:, None], other=0.0)
        else:       # W2^T chunk [BLOCK_H, C_P]
            w = tl.load(w2_ptr + c[None, :] * stride_w2o + h[:, None] * stride_w2i,
                        mask=c_ok[None, :] & (h < H1)[:, None], other=0.0)
        acc = tl.dot(h1, w, acc, input_precision=PRECISION)
    if MIDDLE:
        z2 = acc + b2[None, :]
        h2 = tl.where(m_ok[:, None] & g_ok[None, :] & (z2 > 0), z2, 0.0)
        _store_t(h2t_ptr, h2, m, m_ok, g, g_ok, batch)
        acc = tl.dot(h2, w3t, input_precision=PRECISION)
    logits = acc + b_out[None, :]

    # ---- cross-entropy: loss, correct count, dlogits = (softmax - onehot) / batch
    logits = tl.where(c_ok[None, :], logits, float("-inf"))
    top = tl.max(logits, 1)
    e = tl.exp(logits - top[:, None])
    total = tl.sum(e, 1)
    at_t = c[None, :] == t[:, None]
    loss = top + tl.log(total) - tl.sum(tl.where(at_t, logits, 0.0), 1)
    tl.store(loss_ptr + pid, tl.sum(tl.where(m_ok, loss, 0.0), 0))
    v = tl.where(logits != logits, float("inf"), logits)  # NaN counts as +inf (count_correct_)
    best = tl.max(v, 1)
    first = tl.min(tl.where((v == best[:, None]) & c_ok[None, :], c[None, :], C_P), 1)
    tl.store(hits_ptr + pid, tl.sum((m_ok & (first.to(tl.int64) == t)).to(tl.int64), 0))
    dlogits = (e / total[:, None] - at_t.to(tl.float32)) * inv_batch
    dlogits = tl.where(m_ok[:, None] & c_ok[None, :], dlogits, 0.0)

    # ---- backward: dz of each layer, gated by relu' of its output (h1 read back from h1t:
    # other threads of this program stored it, hence the barrier)
    tl.debug_barrier()
    if MIDDLE:
        _store_t(dz3t_ptr, dlogits, m, m_ok, c, c_ok, batch)
        dz = tl.dot(dlogits, w3, input_precision=PRECISION)
        dz = tl.where(h2 > 0, dz, 0.0)
        _store_t(dz2t_ptr, dz, m, m_ok, g, g_ok, batch)
        k = g
        k_ok = g_ok
    else:
        _store_t(dz2t_ptr, dlogits, m, m_ok, c, c_ok, batch)
        dz = dlogits
        k = c
        k_ok = c_ok
    for h0 in range(0, H1, BLOCK_H):
        h = h0 + hb
        w = tl.load(w2_ptr + k[:, None] * stride_w2o + h[None, :] * stride_w2i,
                    mask=k_ok[:, None] & (h < H1)[None, :], other=0.0)
        h1 = tl.load(h1t_ptr + h[None, :] * batch + m[:, None],
                     mask=m_ok[:, None] & (h < H1)[None, :], other=0.0)
        dh = tl.dot(dz, w, input_precision=PRECISION)
        _store_t(dz1t_ptr, tl.where(h1 > 0, dh, 0.0), m, m_ok, h, h < H1, batch)


@triton.jit
def _weight_grad_tile(tile, dzt_ptr, h_ptr, rows_ptr, gw_ptr, gb_ptr, batch, n_out, n_in,
                      stride_hb, stride_hi, stride_go, stride_gi,
                      BLOCK_O: tl.constexpr, BLOCK_I: tl.constexpr, BLOCK_B: tl.constexpr,
                      GATHER: tl.constexpr, PRECISION: tl.constexpr):
    """One [BLOCK_O, BLOCK_I] tile of dW = dz^T @ h over the batch, and db = the row sums of
    dz^T from the first column tile. dzt: [n_out, batch]; h[b, i] at h_ptr + b * stride_hb +
    i * stride_hi, where b is the batch row or (GATHER) the sample index rows[b]."""
    tiles_i = (n_in + BLOCK_I - 1) // BLOCK_I
    o = (tile // tiles_i) * BLOCK_O + tl.arange(0, BLOCK_O)
    i = (tile % tiles_i) * BLOCK_I + tl.arange(0, BLOCK_I)
    o_ok = o < n_out
    i_ok = i < n_in
    b = tl.arange(0, BLOCK_B)
    acc = tl.zeros((BLOCK_O, BLOCK_I), tl.float32)
    db = tl.zeros((BLOCK_O,), tl.float32)
    for _ in range(0, batch, BLOCK_B):
        b_ok = b < batch
        dz = tl.load(dzt_ptr + o[:, None] * batch + b[None, :], mask=o_ok[:, None] & b_ok[None, :],
                     other=0.0)
        if GATHER:
            hb = tl.load(rows_ptr + b, mask=b_ok, other=0)
        else:
            hb = b.to(tl.int64)
        h = tl.load(h_ptr + hb[None, :] * stride_hb + i[:, None] * stride_hi,
                    mask=i_ok[:, None] & b_ok[None, :], other=0.0)
        acc = tl.dot(dz, tl.trans(h), acc, input_precision=PRECISION)
        db += tl.sum(dz, 1)
        b += BLOCK_B
    tl.store(gw_ptr + o[:, None] * stride_go + i[None, :] * stride_gi, acc,
             mask=o_ok[:, None] & i_ok[None, :])
    if tile % tiles_i == 0:
        tl.store(gb_ptr + o, db, mask=o_ok)


@triton.jit
def _weight_grads_kernel(dz1t_ptr, x_ptr, rows_ptr, gw1_ptr, gb1_ptr, dz2t_ptr, h1t_ptr, gw2_ptr,
                         gb2_ptr, dz3t_ptr, h2t_ptr, gw3_ptr, gb3_ptr,
                         loss_ptr, hits_ptr, loss_total_ptr, correct_ptr, mean_ptr, cursor_ptr,
                         batch, D, H1, H2, C, tiles1, tiles2, tail_programs, inv_batch,
                         stride_xb, stride_xi, s_g1o, s_g1i, s_g2o, s_g2i, s_g3o, s_g3i,
                         BLOCK_O: tl.constexpr, BLOCK_I: tl.constexpr, BLOCK_B: tl.constexpr,
                         BLOCK_P: tl.constexpr, MIDDLE: tl.constexpr, GATHER_X: tl.constexpr,
                         ADVANCE: tl.constexpr,
                         PRECISION: tl.constexpr, GDC: tl.constexpr):
    if GDC:  # programmatic dependent launch (launch.PDL): wait for the kernels before
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    # the tiles of dW1 [H1, D], then of dW2 ([H2, H1] or [C, H1]), then of dW3 [C, H2]; the
    # last program also adds the tail kernel's loss and count slices (in a fixed order) to the
    # running metrics, writes the batch's mean loss and advances the cursor
    pid = tl.program_id(0)
    if pid < tiles1:
        _weight_grad_tile(pid, dz1t_ptr, x_ptr, rows_ptr, gw1_ptr, gb1_ptr, batch, H1, D,
                          stride_xb, stride_xi, s_g1o, s_g1i, BLOCK_O, BLOCK_I, BLOCK_B, GATHER_X,
                          PRECISION)
    elif pid < tiles1 + tiles2:
        n_out = C
        if MIDDLE:
            n_out = H2
        _weight_grad_tile(pid - tiles1, dz2t_ptr, h1t_ptr, rows_ptr, gw2_ptr, gb2_ptr, batch,
                          n_out, H1, 1, batch, s_g2o, s_g2i, BLOCK_O, BLOCK_I, BLOCK_B, False,
                          PRECISION)
    elif MIDDLE:
        _weight_grad_tile(pid - tiles1 - tiles2, dz3t_ptr, h2t_ptr, rows_ptr, gw3_ptr, gb3_ptr,
                          batch, C, H2, 1, batch, s_g3o, s_g3i, BLOCK_O, BLOCK_I, BLOCK_B, False,
                          PRECISION)
    if pid == tl.num_programs(0) - 1:
        p = tl.arange(0, BLOCK_P)
        loss = tl.sum(tl.load(loss_ptr + p, mask=p < tail_programs, other=0.0), 0)
        hits = tl.sum(tl.load(hits_ptr + p, mask=p < tail_programs, other=0), 0)
        tl.store(loss_total_ptr, (tl.load(loss_total_ptr).to(tl.float32) + loss).to(
            loss_total_ptr.dtype.element_ty))
        tl.store(correct_ptr, tl.load(correct_ptr) + hits)
        tl.store(mean_ptr, loss * inv_batch)
        if ADVANCE:
            tl.store(cursor_ptr, tl.load(cursor_ptr) + 1)


# ----------------------------------------------------------------------------------- launcher


def _precision():
    if INTERPRET:
        return "ieee"
    if matmul_precision() == "high":
        return "tf32"
    return "tf32x3" if CONFIG["x3"] else "ieee"


def mlp_cross_entropy_grads_(x, target, weights, biases, weight_grads, bias_grads, metrics,
                             rows=None, cursor=None, advance=False):
    """Backend.mlp_cross_entropy_grads_ in three launches (see the module docstring); a bad
    sample index or target is raised at the next read of the device (kernels/errors.py)."""
    mean = _mlp_cross_entropy_grads_(x, target, weights, biases, weight_grads, bias_grads,
                                     metrics, rows, cursor, advance)
    errors.after(x.device)
    return mean


def _settings():
    return matmul_precision(), tuple(sorted(CONFIG.items()))


@planned(settings=_settings)
def _mlp_cross_entropy_grads_(x, target, weights, biases, weight_grads, bias_grads, metrics,
                              rows=None, cursor=None, advance=False):
    batch = check_mlp_cross_entropy(x, target, weights, biases, weight_grads, bias_grads,
                                    metrics, rows, cursor, advance)
    cfg = CONFIG
    device, middle = x.device, len(weights) == 3
    D, H1 = weights[0].shape[1], weights[0].shape[0]
    C = weights[-1].shape[0]
    H2 = weights[1].shape[0] if middle else C
    n_samples = x.shape[0]
    loss_total, correct = metrics
    mean = empty((), torch.float32, device)
    gather = rows is not None
    table = rows if rows is None or rows.is_contiguous() else contiguous(rows)
    table = table.view(1, -1) if gather and table.dim() == 1 else table
    has_cursor = cursor is not None
    dummy = mean  # an unused pointer argument
    table_arg = table if gather else x
    cursor_arg = cursor if has_cursor else dummy
    n_table = table.shape[0] if gather else 1
    precision = _precision()

    # 1. the first layer's split-K partial products, and x^T
    k_split = max(cfg["K1"], min(cfg["SPLIT_K"], cdiv(D, cfg["K1"]) * cfg["K1"]))
    splits = cdiv(D, k_split)
    part = empty((splits, batch, H1), torch.float32, device)
    xt = empty((D, batch), torch.float32, device) if cfg["xt"] else part
    grid1 = (cdiv(batch, cfg["M1"]), cdiv(H1, cfg["N1"]), splits)
    run(_first_layer_kernel, grid1, part, xt, x, weights[0], table_arg, cursor_arg,
                               batch, n_samples, n_table, D, H1, k_split,
                               x.stride(0), x.stride(1), weights[0].stride(0),
                               weights[0].stride(1),
                               BLOCK_M=cfg["M1"], BLOCK_N=cfg["N1"], BLOCK_K=cfg["K1"],
                               GATHER=gather, CURSOR=has_cursor, XT=cfg["xt"],
                               PRECISION=precision, num_warps=cfg["warps1"], **PDL)

    # 2. the rest of the forward and the backward, row-local
    tail = cdiv(batch, cfg["M2"])
    h1t, dz1t = (empty((H1, batch), torch.float32, device) for _ in range(2))
    h2t, dz2t = (empty((H2, batch), torch.float32, device) for _ in range(2))
    dz3t = empty((C, batch), torch.float32, device) if middle else dz2t
    losses = empty(tail, torch.float32, device)
    hits = empty(tail, torch.int64, device)
    samples = empty(batch, torch.int64, device)  # the batch's sample rows
    w3, b3 = (weights[2], biases[2]) if middle else (weights[1], biases[1])
    run(_tail_kernel, (tail,), part, biases[0], h1t, dz1t, weights[1], biases[1], h2t, dz2t, w3, b3,
                          dz3t, target, table_arg, cursor_arg, samples, losses, hits,
                          errors.flag(device, "mlp_sample"), errors.flag(device, "mlp_target"),
                          batch, n_samples, n_table, splits, H1, H2, C, 1.0 / batch,
                          weights[1].stride(0), weights[1].stride(1), w3.stride(0), w3.stride(1),
                          target.stride(0),
                          BLOCK_M=cfg["M2"], BLOCK_H=cfg["H2"],
                          H2_P=max(16, next_power_of_2(H2)), C_P=max(16, next_power_of_2(C)),
                          SPLITS_P=next_power_of_2(splits),
                          MIDDLE=middle, GATHER=gather, CURSOR=has_cursor, PRECISION=precision,
                          num_warps=cfg["warps2"], **PDL)

    # 3. every weight gradient, the metrics and the cursor
    bo, bi = cfg["O3"], cfg["I3"]
    tiles = [cdiv(w.shape[0], bo) * cdiv(w.shape[1], bi) for w in weights]
    gw3, gb3 = (weight_grads[2], bias_grads[2]) if middle else (weight_grads[1], bias_grads[1])
    run(_weight_grads_kernel, (sum(tiles),),
        dz1t, xt if cfg["xt"] else x, samples, weight_grads[0], bias_grads[0], dz2t, h1t,
        weight_grads[1], bias_grads[1], dz3t, h2t, gw3, gb3, losses, hits, loss_total, correct,
        mean, cursor_arg, batch, D, H1, H2, C, tiles[0], tiles[1], tail, 1.0 / batch,
        *((1, batch) if cfg["xt"] else x.stride()),
        weight_grads[0].stride(0), weight_grads[0].stride(1), weight_grads[1].stride(0),
        weight_grads[1].stride(1), gw3.stride(0), gw3.stride(1),
        BLOCK_O=bo, BLOCK_I=bi, BLOCK_B=cfg["B3"], BLOCK_P=max(16, next_power_of_2(tail)),
        MIDDLE=middle, GATHER_X=not cfg["xt"], ADVANCE=bool(advance), PRECISION=precision,
        num_warps=cfg["warps3"], **PDL)

    return mean
