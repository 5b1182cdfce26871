"""Recurrent layers (LSTM, GRU, Elman RNN) over a whole sequence: the fused forms of the
composites in autodiff/rnn_ops.py.

One layer and direction over T steps, gates in PyTorch's order (G gates of H rows each):

    LSTM (G = 4: i, f, g, o)    gates = x_t W_ih^T + b_ih + h W_hh^T + b_hh
        c' = sigmoid(f) c + sigmoid(i) tanh(g),  h' = sigmoid(o) tanh(c')
    GRU (G = 3: r, z, n)        gi = x_t W_ih^T + b_ih,  gh = h W_hh^T + b_hh
        r = sigmoid(gi_r + gh_r),  z = sigmoid(gi_z + gh_z),  n = tanh(gi_n + r gh_n)
        h' = (1 - z) n + z h
    RNN (G = 1)                 h' = act(x_t W_ih^T + b_ih + h W_hh^T + b_hh), act tanh or relu

The plan of a call (a recorded plan, plans.py: a replay is T + 1 lean launches and no Python
per step):
- forward: the input projection of all steps at once, XP = X W_ih^T + b_ih, one matmul
  [T*B, I] @ [I, G*H] on tensor cores; then one launch per step of `_rnn_step_kernel`, which
  computes its [BLOCK_M, BLOCK_N] tile of each gate's h W_hh^T (the small GEMM, K = H, from
  h_{t-1} written by the previous launch) and applies the gate maths in registers. Per step it
  reads W_hh (G*H*H elements, from L2 after the first step: 4 MB at H = 512 fp32, too large
  for one SM's shared memory, so no persistent kernel keeps it resident), XP_t and h_{t-1}
  ([B, G*H] + [B, H]), and writes h_t, c_t and the G' activations backward needs
  ([B, (2 + G') H]); the pre-activations never reach memory.
- backward through time: one launch per step of `_rnn_step_bwd_kernel`: its tile of
  dh_t = dy_t + dGh_{t+1} W_hh (the small GEMM, K = G*H) followed by the gates' backward,
  writing dGi_t and dGh_t (the gradients of the pre-activations of the two GEMMs: equal but
  for GRU's n gate) and the carries (dc for LSTM, dh z for GRU); then the weight gradients
  as big matmuls over all steps: dW_ih = dGi^T X, dW_hh = dGh^T H_prev, dX = dGi W_ih, and
  the bias gradients as column sums.

Memory per step (elements, B rows): forward B (G H + H [+ H for c]) read + B (1 + [1] + G') H
written + W_hh (L2); backward B (G H + H + G' H + [2 H]) read + B (G H [+ G H] + H) written.
"""
from __future__ import annotations

import triton
import triton.language as tl

from ..backend import matmul_precision
from .launch import INTERPRET, cdiv, dtype_of, next_power_of_2
from .matmul import matmul
from .plans import empty, planned, run
from .reduce import sum as sum_dims
from .tlmath import sigmoid, tanh

PRIMITIVES = ("rnn_sequence", "rnn_sequence_backward")

LSTM, GRU, RNN_TANH, RNN_RELU = 0, 1, 2, 3
MODES = {"LSTM": LSTM, "GRU": GRU, "RNN_TANH": RNN_TANH, "RNN_RELU": RNN_RELU}
GATES = {LSTM: 4, GRU: 3, RNN_TANH: 1, RNN_RELU: 1}
SAVED = {LSTM: 4, GRU: 4, RNN_TANH: 0, RNN_RELU: 0}   # activations kept per step, x H


@triton.jit
def _tile_product(a_ptr, stride_am, stride_ak, b_ptr, stride_bk, stride_bn, rows, cols,
                  n_rows, n_cols, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  BLOCK_K: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    # acc[m, n] = sum_k A[rows[m], k] B[k, cols[n]] in float32 (UPCAST: half operands widened
    # first, for the interpreter, whose dot of half types is not a float product)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    row_ok = rows < n_rows
    col_ok = cols < n_cols
    a_rows = a_ptr + rows.to(tl.int64)[:, None] * stride_am
    b_cols = b_ptr + cols.to(tl.int64)[None, :] * stride_bn
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_ok = ks < K
        a = tl.load(a_rows + ks[None, :] * stride_ak, mask=row_ok[:, None] & k_ok[None, :],
                    other=0.0)
        b = tl.load(b_cols + ks.to(tl.int64)[:, None] * stride_bk,
                    mask=k_ok[:, None] & col_ok[None, :], other=0.0)
        if UPCAST:
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        acc = tl.dot(a, b, acc, input_precision=PRECISION)
    return acc


@triton.jit
def _gate_products(hp_ptr, stride_hpb, stride_hph, w_ptr, stride_wr, stride_wk, stride_gate,
                   rows, cols, n_batch, hidden, G: tl.constexpr, BLOCK_M: tl.constexpr,
                   BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PRECISION: tl.constexpr,
                   UPCAST: tl.constexpr):
    # acc_q[m, n] = sum_k h[rows[m], k] W_hh[q H + cols[n], k] for each gate q < G, one pass
    # over k: each tile of h is loaded once for all gates (stride_gate = H * stride_wr)
    acc0 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc1 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc2 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc3 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    row_ok = rows < n_batch
    col_ok = cols < hidden
    h_rows = hp_ptr + rows.to(tl.int64)[:, None] * stride_hpb
    w_cols = w_ptr + cols.to(tl.int64)[None, :] * stride_wr
    for k0 in range(0, hidden, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_ok = ks < hidden
        a = tl.load(h_rows + ks[None, :] * stride_hph, mask=row_ok[:, None] & k_ok[None, :],
                    other=0.0)
        w_at = w_cols + ks.to(tl.int64)[:, None] * stride_wk
        w_ok = k_ok[:, None] & col_ok[None, :]
        b0 = tl.load(w_at, mask=w_ok, other=0.0)
        if UPCAST:
            a = a.to(tl.float32)
            b0 = b0.to(tl.float32)
        acc0 = tl.dot(a, b0, acc0, input_precision=PRECISION)
        if G > 1:
            b1 = tl.load(w_at + stride_gate, mask=w_ok, other=0.0)
            b2 = tl.load(w_at + 2 * stride_gate, mask=w_ok, other=0.0)
            if UPCAST:
                b1 = b1.to(tl.float32)
                b2 = b2.to(tl.float32)
            acc1 = tl.dot(a, b1, acc1, input_precision=PRECISION)
            acc2 = tl.dot(a, b2, acc2, input_precision=PRECISION)
        if G > 3:
            b3 = tl.load(w_at + 3 * stride_gate, mask=w_ok, other=0.0)
            if UPCAST:
                b3 = b3.to(tl.float32)
            acc3 = tl.dot(a, b3, acc3, input_precision=PRECISION)
    return acc0, acc1, acc2, acc3


@triton.jit
def _rnn_step_kernel(xp_ptr, hp_ptr, cp_ptr, w_ptr, b_ptr, h_ptr, c_ptr, h0_ptr, c0_ptr,
                     act_ptr, n_batch, hidden, stride_hpb, stride_hph, stride_cpb, stride_cph,
                     stride_wr, stride_wk, stride_gate, MODE: tl.constexpr, G: tl.constexpr,
                     HAS_BIAS: tl.constexpr, ZERO_PREV: tl.constexpr, FIRST: tl.constexpr,
                     SAVE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                     BLOCK_K: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    # One program: rows [BLOCK_M] of the batch x columns [BLOCK_N] of the hidden state, all
    # gates. xp: this step's [B, G*H] input projection (contiguous rows); hp, cp: h_{t-1},
    # c_{t-1} (any strides; ZERO_PREV: zeros, unread); h, c: h_t, c_t ([B, H] contiguous);
    # FIRST: also copy h_{t-1}, c_{t-1} to h0, c0 (the sequence buffers' first slot);
    # act: [B, 4H] the activations backward reads (LSTM: i f g o; GRU: r z n gh_n).
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < hidden
    ok = (rows < n_batch)[:, None] & col_ok[None, :]
    rows64 = rows.to(tl.int64)[:, None]
    xp_at = xp_ptr + rows64 * (G * hidden) + cols[None, :]
    out_at = rows64 * hidden + cols[None, :]
    if ZERO_PREV:
        h_prev = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        gh0 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        gh1 = gh0
        gh2 = gh0
        gh3 = gh0
    else:
        h_prev = tl.load(hp_ptr + rows64 * stride_hpb + cols[None, :] * stride_hph, mask=ok,
                         other=0.0).to(tl.float32)
        gh0, gh1, gh2, gh3 = _gate_products(hp_ptr, stride_hpb, stride_hph, w_ptr, stride_wr,
                                            stride_wk, stride_gate, rows, cols, n_batch, hidden,
                                            G, BLOCK_M, BLOCK_N, BLOCK_K, PRECISION, UPCAST)
    if FIRST:
        tl.store(h0_ptr + out_at, h_prev.to(h0_ptr.dtype.element_ty), mask=ok)
    # gh_q = (h_{t-1} W_hh^T + b_hh)[:, qH + n]; gate q's pre-activation adds xp[:, qH + n]
    if HAS_BIAS:
        gh0 += tl.load(b_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
        if G > 1:
            gh1 += tl.load(b_ptr + hidden + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
            gh2 += tl.load(b_ptr + 2 * hidden + cols, mask=col_ok,
                           other=0.0).to(tl.float32)[None, :]
        if G > 3:
            gh3 += tl.load(b_ptr + 3 * hidden + cols, mask=col_ok,
                           other=0.0).to(tl.float32)[None, :]
    pre0 = gh0 + tl.load(xp_at, mask=ok, other=0.0).to(tl.float32)
    if MODE == 0:  # LSTM
        pre1 = gh1 + tl.load(xp_at + hidden, mask=ok, other=0.0).to(tl.float32)
        pre2 = gh2 + tl.load(xp_at + 2 * hidden, mask=ok, other=0.0).to(tl.float32)
        pre3 = gh3 + tl.load(xp_at + 3 * hidden, mask=ok, other=0.0).to(tl.float32)
        if ZERO_PREV:
            c_prev = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        else:
            c_prev = tl.load(cp_ptr + rows64 * stride_cpb + cols[None, :] * stride_cph,
                             mask=ok, other=0.0).to(tl.float32)
        if FIRST:
            tl.store(c0_ptr + out_at, c_prev.to(c0_ptr.dtype.element_ty), mask=ok)
        i = sigmoid(pre0)
        f = sigmoid(pre1)
        g = tanh(pre2)
        o = sigmoid(pre3)
        c = f * c_prev + i * g
        h = o * tanh(c)
        tl.store(c_ptr + out_at, c.to(c_ptr.dtype.element_ty), mask=ok)
        if SAVE:
            act_at = act_ptr + rows64 * (4 * hidden) + cols[None, :]
            tl.store(act_at, i.to(act_ptr.dtype.element_ty), mask=ok)
            tl.store(act_at + hidden, f.to(act_ptr.dtype.element_ty), mask=ok)
            tl.store(act_at + 2 * hidden, g.to(act_ptr.dtype.element_ty), mask=ok)
            tl.store(act_at + 3 * hidden, o.to(act_ptr.dtype.element_ty), mask=ok)
    elif MODE == 1:  # GRU: gh2 = W_hn h + b_hn stays apart from the input's part
        r = sigmoid(pre0)
        z = sigmoid(gh1 + tl.load(xp_at + hidden, mask=ok, other=0.0).to(tl.float32))
        n = tanh(tl.load(xp_at + 2 * hidden, mask=ok, other=0.0).to(tl.float32) + r * gh2)
        h = (1.0 - z) * n + z * h_prev
        if SAVE:
            act_at = act_ptr + rows64 * (4 * hidden) + cols[None, :]
            tl.store(act_at, r.to(act_ptr.dtype.element_ty), mask=ok)
            tl.store(act_at + hidden, z.to(act_ptr.dtype.element_ty), mask=ok)
            tl.store(act_at + 2 * hidden, n.to(act_ptr.dtype.element_ty), mask=ok)
            tl.store(act_at + 3 * hidden, gh2.to(act_ptr.dtype.element_ty), mask=ok)
    elif MODE == 2:
        h = tanh(pre0)
    else:
        h = tl.maximum(pre0, 0.0)
    tl.store(h_ptr + out_at, h.to(h_ptr.dtype.element_ty), mask=ok)


# Backward of one step (t), in float32 from the saved activations; dh is the whole gradient of
# h_t: dy_t + dGh_{t+1} W_hh (+ GRU's carry dh_{t+1} z_{t+1}; + dh_n at the last step).
#   LSTM: tc = tanh(c_t); dc = dc_carry + dh o (1 - tc^2); carry' = dc f
#         d(i, f, g, o pre) = (dc g i (1 - i), dc c_{t-1} f (1 - f), dc i (1 - g^2),
#                              dh tc o (1 - o));   dGh = dGi
#   GRU:  dn = dh (1 - z) (1 - n^2); dr = dn gh_n r (1 - r); dz = dh (h_{t-1} - n) z (1 - z)
#         dGi = (dr, dz, dn), dGh = (dr, dz, dn r); carry' = dh z
#   RNN:  dGi = dGh = dh (1 - h_t^2) (tanh) or dh [h_t > 0] (relu)
@triton.jit
def _rnn_step_bwd_kernel(dgn_ptr, w_ptr, dy_ptr, ex_ptr, dci_ptr, act_ptr, hp_ptr, h_ptr,
                         cp_ptr, c_ptr, dgi_ptr, dgh_ptr, dco_ptr, dho_ptr, n_batch, hidden,
                         stride_wr, stride_wk, stride_dyb, stride_dyh, stride_exb, stride_exh,
                         stride_dcb, stride_dch, MODE: tl.constexpr, G: tl.constexpr,
                         HAS_NEXT: tl.constexpr,
                         HAS_DY: tl.constexpr, HAS_EXTRA: tl.constexpr, HAS_DC: tl.constexpr,
                         DH_ONLY: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                         BLOCK_K: tl.constexpr, PRECISION: tl.constexpr,
                         UPCAST: tl.constexpr):
    # One program: rows [BLOCK_M] x hidden columns [BLOCK_N], all gates. dgn: dGh_{t+1}
    # [B, G*H] contiguous; dy, ex (dh_n or GRU's carry), dci (dc_n or the carry): [B, H] any
    # strides; act, hp, h, cp, c: step t's saved values ([B, 4H] and [B, H], contiguous);
    # out: dgi, dgh [B, G*H], dco (LSTM's dc carry), dho (GRU's carry, or dh with DH_ONLY).
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    ok = (rows < n_batch)[:, None] & (cols < hidden)[None, :]
    rows64 = rows.to(tl.int64)[:, None]
    GH = G * hidden
    at = rows64 * hidden + cols[None, :]
    dh = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if HAS_NEXT:  # dGh_{t+1} [B, GH] @ W_hh [GH, H]
        dh += _tile_product(dgn_ptr, GH, 1, w_ptr, stride_wr, stride_wk, rows, cols, n_batch,
                            hidden, GH, BLOCK_M, BLOCK_N, BLOCK_K, PRECISION, UPCAST)
    if HAS_DY:
        dh += tl.load(dy_ptr + rows64 * stride_dyb + cols[None, :] * stride_dyh, mask=ok,
                      other=0.0).to(tl.float32)
    if HAS_EXTRA:
        dh += tl.load(ex_ptr + rows64 * stride_exb + cols[None, :] * stride_exh, mask=ok,
                      other=0.0).to(tl.float32)
    if DH_ONLY:
        tl.store(dho_ptr + at, dh.to(dho_ptr.dtype.element_ty), mask=ok)
    else:
        g_at = rows64 * GH + cols[None, :]
        if MODE == 0:
            act_at = act_ptr + rows64 * (4 * hidden) + cols[None, :]
            i = tl.load(act_at, mask=ok, other=0.0).to(tl.float32)
            f = tl.load(act_at + hidden, mask=ok, other=0.0).to(tl.float32)
            g = tl.load(act_at + 2 * hidden, mask=ok, other=0.0).to(tl.float32)
            o = tl.load(act_at + 3 * hidden, mask=ok, other=0.0).to(tl.float32)
            c = tl.load(c_ptr + at, mask=ok, other=0.0).to(tl.float32)
            c_prev = tl.load(cp_ptr + at, mask=ok, other=0.0).to(tl.float32)
            tc = tanh(c)
            dc = dh * o * (1.0 - tc * tc)
            if HAS_DC:
                dc += tl.load(dci_ptr + rows64 * stride_dcb + cols[None, :] * stride_dch,
                              mask=ok, other=0.0).to(tl.float32)
            tl.store(dco_ptr + at, (dc * f).to(dco_ptr.dtype.element_ty), mask=ok)
            ty = dgi_ptr.dtype.element_ty
            tl.store(dgi_ptr + g_at, (dc * g * i * (1.0 - i)).to(ty), mask=ok)
            tl.store(dgi_ptr + g_at + hidden, (dc * c_prev * f * (1.0 - f)).to(ty), mask=ok)
            tl.store(dgi_ptr + g_at + 2 * hidden, (dc * i * (1.0 - g * g)).to(ty), mask=ok)
            tl.store(dgi_ptr + g_at + 3 * hidden, (dh * tc * o * (1.0 - o)).to(ty), mask=ok)
        elif MODE == 1:
            act_at = act_ptr + rows64 * (4 * hidden) + cols[None, :]
            r = tl.load(act_at, mask=ok, other=0.0).to(tl.float32)
            z = tl.load(act_at + hidden, mask=ok, other=0.0).to(tl.float32)
            n = tl.load(act_at + 2 * hidden, mask=ok, other=0.0).to(tl.float32)
            ghn = tl.load(act_at + 3 * hidden, mask=ok, other=0.0).to(tl.float32)
            h_prev = tl.load(hp_ptr + at, mask=ok, other=0.0).to(tl.float32)
            dn = dh * (1.0 - z) * (1.0 - n * n)
            dr = dn * ghn * r * (1.0 - r)
            dz = dh * (h_prev - n) * z * (1.0 - z)
            tl.store(dho_ptr + at, (dh * z).to(dho_ptr.dtype.element_ty), mask=ok)
            ty = dgi_ptr.dtype.element_ty
            tl.store(dgi_ptr + g_at, dr.to(ty), mask=ok)
            tl.store(dgi_ptr + g_at + hidden, dz.to(ty), mask=ok)
            tl.store(dgi_ptr + g_at + 2 * hidden, dn.to(ty), mask=ok)
            tl.store(dgh_ptr + g_at, dr.to(ty), mask=ok)
            tl.store(dgh_ptr + g_at + hidden, dz.to(ty), mask=ok)
            tl.store(dgh_ptr + g_at + 2 * hidden, (dn * r).to(ty), mask=ok)
        else:
            h = tl.load(h_ptr + at, mask=ok, other=0.0).to(tl.float32)
            if MODE == 2:
                d = dh * (1.0 - h * h)
            else:
                d = tl.where(h > 0, dh, 0.0)
            tl.store(dgi_ptr + g_at, d.to(dgi_ptr.dtype.element_ty), mask=ok)


# ----------------------------------------------------------------------------- launchers


def _tiles(batch, hidden):
    """(BLOCK_M, BLOCK_N, BLOCK_K, num_warps): batch rows and hidden columns per program. A step
    is a small GEMM whose time is its programs' reads of W_hh and h (from L2), so the tiles
    shrink (columns first, to 16 x 16) until the grid has some 128 programs: at batch 64,
    hidden 512 that is 4 x 32 programs, each reading 4 x 16 rows of W_hh. (A first guess, not
    yet timed: `python -m tritonad bench rnn` measures it.)"""
    if INTERPRET:
        return 16, 16, 16, 1
    block_m, block_n = min(64, max(16, next_power_of_2(batch))), 64
    while block_n > 16 and cdiv(batch, block_m) * cdiv(hidden, block_n) < 128:
        block_n //= 2
    while block_m > 16 and cdiv(batch, block_m) * cdiv(hidden, block_n) < 128:
        block_m //= 2
    return block_m, block_n, 64, 4


def _precision(x):
    """tl.dot's input_precision: float32 follows td.set_matmul_precision ("highest": 3xTF32,
    "high": TF32); ignored for half inputs."""
    if dtype_of(x).name != "float32":
        return "tf32"  # (tl.dot's default; ignored for half inputs)
    return "tf32" if matmul_precision() == "high" else ("ieee" if INTERPRET else "tf32x3")


def _upcast(x):
    return INTERPRET and dtype_of(x).name in ("float16", "bfloat16")


def _check(op, x, w_ih, w_hh, b_ih, b_hh, mode, states=()):
    if mode not in MODES:
        raise ValueError(f"{op}: mode must be one of {sorted(MODES)}, got {mode!r}")
    G = GATES[MODES[mode]]
    if x.dim() != 3 or w_ih.dim() != 2 or w_hh.dim() != 2:
        raise ValueError(f"{op}: expected x [T, B, I], w_ih [G*H, I], w_hh [G*H, H], got "
                         f"{tuple(x.shape)}, {tuple(w_ih.shape)}, {tuple(w_hh.shape)}")
    T, B, I = x.shape
    H = w_hh.shape[1]
    if tuple(w_ih.shape) != (G * H, I) or tuple(w_hh.shape) != (G * H, H):
        raise ValueError(f"{op}: {mode} with input size {I} and hidden size {H} needs w_ih "
                         f"{(G * H, I)} and w_hh {(G * H, H)}, got {tuple(w_ih.shape)} and "
                         f"{tuple(w_hh.shape)}")
    for b in (b_ih, b_hh):
        if b is not None and tuple(b.shape) != (G * H,):
            raise ValueError(f"{op}: biases must be [{G * H}], got {tuple(b.shape)}")
    for s in states:
        if s is not None and (tuple(s.shape) != (B, H) or s.dtype != x.dtype):
            raise ValueError(f"{op}: states must be [{B}, {H}] {dtype_of(x).name}, got "
                             f"{tuple(s.shape)} {dtype_of(s).name}")
    if T == 0:
        raise ValueError(f"{op}: expected a sequence length larger than 0, got x "
                         f"{tuple(x.shape)}")
    if not x.dtype.is_floating_point or any(a is not None and a.dtype != x.dtype
                                            for a in (w_ih, w_hh, b_ih, b_hh)):
        raise TypeError(f"{op}: x and the weights must share one floating dtype, got "
                        f"{dtype_of(x).name} and {dtype_of(w_ih).name}")
    return T, B, I, H, G


def _time(step, T, reverse):
    return T - 1 - step if reverse else step


@planned(settings=matmul_precision, arrays=7)
def rnn_sequence(x, h0, c0, w_ih, w_hh, b_ih, b_hh, mode, reverse=False, save=True):
    """One recurrent layer in one direction over a sequence.

    x: [T, B, I] (contiguous), h0, c0: [B, H] or None (zeros; c0 for LSTM only), w_ih: [G*H, I],
    w_hh: [G*H, H], b_ih, b_hh: [G*H] or None; mode "LSTM" | "GRU" | "RNN_TANH" | "RNN_RELU";
    reverse: run from t = T-1 down to 0. Returns (hs, cs, acts): hs [T+1, B, H] holds the states
    in time order with h0 at slot 0 (forward) or slot T (reverse), so that the outputs are
    hs[1:] (hs[:T]) and the previous states hs[:T] (hs[1:]); cs the same for LSTM's cells (else
    None); acts [T, B, 4H] the activations backward reads (LSTM and GRU, with `save`; else
    None)."""
    T, B, I, H, G = _check("rnn_sequence", x, w_ih, w_hh, b_ih, b_hh, mode, (h0, c0))
    if not x.is_contiguous():
        raise ValueError("rnn_sequence: x must be contiguous")
    code = MODES[mode]
    if code == LSTM and (h0 is None) != (c0 is None):
        raise ValueError("rnn_sequence: LSTM needs both h0 and c0, or neither")
    hs = empty((T + 1, B, H), x.dtype, x.device)
    cs = empty((T + 1, B, H), x.dtype, x.device) if code == LSTM else None
    keep = save and SAVED[code] > 0
    acts = empty((T, B, SAVED[code] * H), x.dtype, x.device) if keep else None
    if B == 0 or H == 0:
        return hs, cs, acts
    xp = matmul(x.view(T * B, I), w_ih.t(), bias=b_ih).view(T, B, G * H)
    block_m, block_n, block_k, warps = _tiles(B, H)
    grid = (cdiv(B, block_m), cdiv(H, block_n))
    first_slot = T if reverse else 0
    for step in range(T):
        t = _time(step, T, reverse)
        h_slot, prev_slot = (t, t + 1) if reverse else (t + 1, t)
        hp = h0 if step == 0 and h0 is not None else hs[prev_slot]
        cp = cs[prev_slot] if cs is not None else hp
        if step == 0 and c0 is not None:
            cp = c0
        c_out = cs[h_slot] if cs is not None else hs[h_slot]
        c_first = cs[first_slot] if cs is not None else hs[first_slot]
        zero = step == 0 and h0 is None
        run(_rnn_step_kernel, grid, xp[t], hp, cp, w_hh,
            b_hh if b_hh is not None else w_hh, hs[h_slot], c_out, hs[first_slot], c_first,
            acts[t] if acts is not None else hs[h_slot], B, H, hp.stride(0), hp.stride(1),
            cp.stride(0), cp.stride(1), w_hh.stride(0), w_hh.stride(1), H * w_hh.stride(0),
            MODE=code, G=G, HAS_BIAS=b_hh is not None, ZERO_PREV=zero, FIRST=step == 0,
            SAVE=acts is not None, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
            PRECISION=_precision(x), UPCAST=_upcast(x), num_warps=warps)
    return hs, cs, acts


@planned(settings=matmul_precision, arrays=9)
def rnn_sequence_backward(dy, dh_n, dc_n, x, w_ih, w_hh, hs, cs, acts, mode,
                          reverse=False, needs=(True,) * 7):
    """The gradients of rnn_sequence: dy [T, B, H] (any strides), dh_n, dc_n: [B, H] or None
    (zeros); x, w_ih, w_hh, hs, cs, acts: as given to / returned by the forward (b_hh: only its
    presence matters). needs: which of (dx, dh0, dc0, dw_ih, dw_hh, db_ih, db_hh) to compute.
    Returns those seven arrays (None where not needed, or not applicable: dc0 but for LSTM)."""
    T, B, I, H, G = _check("rnn_sequence_backward", x, w_ih, w_hh, None, None, mode,
                           (dh_n, dc_n))
    code = MODES[mode]
    if SAVED[code] and acts is None:
        raise ValueError("rnn_sequence_backward: the forward did not save its activations")
    dgi = empty((T, B, G * H), x.dtype, x.device)
    dgh = empty((T, B, G * H), x.dtype, x.device) if code == GRU else dgi
    carry = empty((B, H), x.dtype, x.device)      # LSTM: dc; GRU: dh z
    dh0 = empty((B, H), x.dtype, x.device)
    block_m, block_n, block_k, warps = _tiles(B, H)
    block_k = block_k if INTERPRET else 128  # (K = G*H here: fewer, longer steps)
    grid = (cdiv(B, block_m), cdiv(H, block_n))
    precision = _precision(x)
    if B and H:
        for step in range(T - 1, -1, -1):
            t = _time(step, T, reverse)
            h_slot, prev_slot = (t, t + 1) if reverse else (t + 1, t)
            last = step == T - 1
            nxt = dgh[_time(step + 1, T, reverse)] if not last else dgi[t]
            if code == GRU:
                extra = dh_n if last else carry
            else:
                extra = dh_n if last else None
            dci = dc_n if last else carry
            cp = cs[prev_slot] if cs is not None else hs[prev_slot]
            c = cs[h_slot] if cs is not None else hs[h_slot]
            run(_rnn_step_bwd_kernel, grid, nxt, w_hh, dy[t] if dy is not None else hs[0],
                extra if extra is not None else hs[0], dci if dci is not None else hs[0],
                acts[t] if acts is not None else hs[0], hs[prev_slot], hs[h_slot], cp, c,
                dgi[t], dgh[t], carry, carry, B, H, w_hh.stride(0), w_hh.stride(1),
                *(dy.stride()[1:] if dy is not None else (0, 0)),
                *(extra.stride() if extra is not None else (0, 0)),
                *(dci.stride() if dci is not None else (0, 0)),
                MODE=code, G=G, HAS_NEXT=not last, HAS_DY=dy is not None,
                HAS_EXTRA=extra is not None, HAS_DC=code == LSTM and dci is not None,
                DH_ONLY=False, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
                PRECISION=precision, UPCAST=_upcast(x), num_warps=warps)
        if needs[1]:  # dh0 = dGh_first W_hh (+ GRU's carry)
            t0 = _time(0, T, reverse)
            run(_rnn_step_bwd_kernel, grid, dgh[t0], w_hh, hs[0], carry, carry, hs[0], hs[0],
                hs[0], hs[0], hs[0], dgi[t0], dgh[t0], carry, dh0, B, H, w_hh.stride(0),
                w_hh.stride(1), 0, 0, *carry.stride(), *carry.stride(),
                MODE=code, G=G, HAS_NEXT=True, HAS_DY=False, HAS_EXTRA=code == GRU, HAS_DC=False,
                DH_ONLY=True, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
                PRECISION=precision, UPCAST=_upcast(x), num_warps=warps)
    dgi2, dgh2 = dgi.view(T * B, G * H), dgh.view(T * B, G * H)
    h_prev = (hs[1:] if reverse else hs[:T]).view(T * B, H)
    dx = matmul(dgi2, w_ih).view(T, B, I) if needs[0] else None
    dw_ih = matmul(dgi2.t(), x.view(T * B, I)) if needs[3] else None
    dw_hh = matmul(dgh2.t(), h_prev) if needs[4] else None
    db_ih = sum_dims(dgi2, (0,)) if needs[5] else None
    db_hh = sum_dims(dgh2, (0,)) if needs[6] else None
    dc0 = carry if code == LSTM and needs[2] else None
    return dx, dh0 if needs[1] else None, dc0, dw_ih, dw_hh, db_ih, db_hh
