"""A classifier head, a linear layer and its softmax cross-entropy, in two kernels
(Backend.linear_cross_entropy).

A fusion for the pattern of the MNIST recipes (the last Linear of models.mlp or models.cnn and
its cross-entropy, train.loss_with_metrics), apart from the general ops. Backend's default
(matmul, cross_entropy, matmul) is its specification and the numpy backend's implementation.

A model that ends in Linear -> cross_entropy runs, each step, the product (and its split-K sum),
the cross-entropy and, in the backward, the product dx = dlogits @ W: four dependent kernels of
~2-4 us each on a chain that nothing overlaps (the MNIST cnn captured on an H200: ~14 us from
fc1's output to fc1's backward). All of it but dW and db is row-local, so here:

1. `_head_partials_kernel`, programs (row block, K slice): the split-K slices of the logits,
   P[s] = x[rows, slice s] @ W[:, slice s]^T, float32. The long K is what needs many programs.
2. `_head_kernel`, programs (row block, feature block): the logits of its rows (the slices added
   in a fixed order, the bias, x's rounding), each row's loss and dlogits = (softmax - q) * scale
   from registers (q the smoothed one-hot target, scale 1/count for "mean"), and dx = dlogits @ W
   for its features. The logits are never written. The programs of the first feature block
   write what is per row: the loss ("none"), dlogits, and the loss and metrics sums.

dW = dlogits^T @ x and db (sums over the rows) are the caller's: the autodiff node runs them in
the backward, beside the rest of the pass. Up to SINGLE_ROWS rows are one row block, whose
programs also count the rows not ignored (mean's divisor), report a bad target and write the
reduced loss and the metrics, in the order of cross_entropy's one-program kernel. More rows
take a count kernel first and a one-program kernel last that adds the row blocks' sums in a
fixed order (deterministic, no float atomics). The classes must fit one register tile
(MAX_CLASSES) and the dtype be float32 or a half type; anything else takes Backend's default
(matmul, cross_entropy, matmul), with the same results up to rounding. Exact float32 products
run as 3xTF32 on tensor cores (TF32 with td.set_matmul_precision("high")); under the
interpreter they are plain fp32.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..backend import Backend, check_metrics, matmul_precision
from . import errors
from .errors import report
from .launch import INTERPRET, PDL, cdiv, dtype_of, next_power_of_2
from .plans import empty, planned, run
from .matmul import matmul
from .softmax import (TARGET_BLOCK, _REDUCTIONS, _ce_count_kernel, _finite_or_zero,
                      check_loss_options)
from .softmax import cross_entropy as _cross_entropy

PRIMITIVES = ("linear_cross_entropy",)

MAX_CLASSES = 64     # widest logits row held in registers
# settings, from benchmarks/sweep_head.py on an H200 (read at call time: tests change them)
PART_M = 16          # rows of a partial-logits program
BLOCK_K = 64         # features a step of the partial products
PROGRAMS = 256       # partial products wanted: K splits up to this many programs ...
MAX_SPLITS = 16      # ... and at most this many slices
SINGLE_ROWS = 128    # the loss's kernel takes up to this many rows in one row block
BLOCK_M = 32         # its rows a program above that
DX_PROGRAMS = 256    # its dx features a program: the fewest of 32, 64, 128 that keep the
                     # programs at most this many (H100: 6.8 us at 32 for MNIST's 100x512
                     # -> 10, 28.6 us at 128 for 1024x2048 -> 64)
WARPS_ONE, WARPS_ROWS = 8, 4  # its warps for one row block, for more

_TL_TYPES = {torch.float32: tl.float32, torch.float16: tl.float16, torch.bfloat16: tl.bfloat16}


# ------------------------------------------------------------------------------------ kernels


@triton.jit
def _head_partials_kernel(part_ptr, x_ptr, w_ptr, n_rows, K, C, k_per_split,
                          stride_xn, stride_xk, stride_wc, stride_wk,
                          BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_C: tl.constexpr,
                          PRECISION: tl.constexpr, UPCAST: tl.constexpr, GDC: tl.constexpr):
    if GDC:  # programmatic dependent launch (launch.PDL): wait for the kernels before
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    # program (m, s): part[s, rows, :] = x[rows, K slice s] @ W[:, K slice s]^T, float32
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    split = tl.program_id(1)
    row_ok = rows < n_rows
    cols = tl.arange(0, BLOCK_C)
    c_ok = cols < C
    k_start = split * k_per_split
    k_end = tl.minimum(k_start + k_per_split, K)
    ks = k_start + tl.arange(0, BLOCK_K)
    a_ptrs = x_ptr + rows.to(tl.int64)[:, None] * stride_xn + ks.to(tl.int64)[None, :] * stride_xk
    b_ptrs = w_ptr + cols.to(tl.int64)[None, :] * stride_wc + ks.to(tl.int64)[:, None] * stride_wk
    acc = tl.zeros((BLOCK_M, BLOCK_C), tl.float32)
    for k0 in range(k_start, k_end, BLOCK_K):
        k_ok = (k0 - k_start + tl.arange(0, BLOCK_K)) < k_end - k_start
        a = tl.load(a_ptrs, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        b = tl.load(b_ptrs, mask=k_ok[:, None] & c_ok[None, :], other=0.0)
        if UPCAST:  # the interpreter computes half types wrongly: widen them first
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        acc = tl.dot(a, b, acc, input_precision=PRECISION)
        a_ptrs += BLOCK_K * stride_xk
        b_ptrs += BLOCK_K * stride_wk
    out = part_ptr + (split * n_rows + rows).to(tl.int64)[:, None] * BLOCK_C + cols[None, :]
    tl.store(out, acc, mask=row_ok[:, None])


@triton.jit
def _head_kernel(out_ptr, part_ptr, hits_ptr, info_ptr, dlogits_ptr, dx_ptr, flag_ptr,
                 logit_part_ptr, w_ptr, b_ptr, target_ptr, loss_total_ptr, correct_ptr,
                 n_rows, K, C, splits, stride_wc, stride_wk, stride_b, stride_t, ignore_index,
                 smoothing,
                 x_dtype: tl.constexpr, REDUCTION: tl.constexpr, ONE: tl.constexpr,
                 HAS_BIAS: tl.constexpr, SMOOTH: tl.constexpr, COMPUTE_GRAD: tl.constexpr,
                 INPUT_GRAD: tl.constexpr, METRICS: tl.constexpr, BLOCK_M: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_C: tl.constexpr, SPLITS_P: tl.constexpr,
                 PRECISION: tl.constexpr, UPCAST: tl.constexpr, GDC: tl.constexpr):
    if GDC:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    # program (m, j): the logits of BLOCK_M rows (their split-K slices added in a fixed order),
    # their loss and dlogits, and dx for those rows and the features of block j. Programs with
    # j = 0 write what is per row: the loss ("none"), dlogits, and either (ONE: the only row
    # block, BLOCK_M >= n_rows) the reduced loss and the metrics, after checking and counting
    # the targets (every program counts its rows: mean's divisor), or the block's loss sum and
    # hit count to part[m] and hits[m] (the count kernel ran before: it checked the targets
    # and left the divisor in info). REDUCTION: 0 none, 1 sum, 2 mean.
    pid_m = tl.program_id(0)
    first = tl.program_id(1) == 0
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < n_rows
    rows64 = rows.to(tl.int64)
    t_given = tl.load(target_ptr + rows64 * stride_t, mask=row_ok, other=ignore_index)
    t_given = t_given.to(tl.int64)
    kept = row_ok & (t_given != ignore_index)
    in_range = (t_given >= 0) & (t_given < C)
    grad_scale = 1.0
    if ONE:  # every row is here: count them, report the first bad target
        count = tl.sum(kept.to(tl.int32), 0)
        if first:
            report(flag_ptr, kept & ~in_range, rows, t_given, C)
    else:  # (the count kernel did both)
        count = tl.load(info_ptr).to(tl.int32)
    if REDUCTION == 2:
        grad_scale = 1.0 / count.to(tl.float32)
    # NOTE: out-of-range targets were reported; clamped here so that nothing faults
    t = tl.where(kept & in_range, t_given, 0)
    cols = tl.arange(0, BLOCK_C)
    c_ok = cols < C

    # ---- logits: the slices' sum (unrolled: independent loads), the bias, x's rounding
    ptrs = logit_part_ptr + rows64[:, None] * BLOCK_C + cols[None, :]
    acc = tl.zeros((BLOCK_M, BLOCK_C), tl.float32)
    for s in tl.static_range(SPLITS_P):
        in_split = (tl.zeros_like(rows) + s) < splits
        acc += tl.load(ptrs + s * n_rows * BLOCK_C, mask=(row_ok & in_split)[:, None], other=0.0)
    if HAS_BIAS:
        acc += tl.load(b_ptr + cols * stride_b, mask=c_ok, other=0.0).to(tl.float32)[None, :]
    logits = acc.to(x_dtype).to(tl.float32)  # (as the logits the three kernels would write)

    # ---- the loss of each row (cross_entropy's formulas, from registers)
    logits = tl.where(c_ok[None, :], logits, float("-inf"))
    shift = _finite_or_zero(tl.max(logits, 1))
    at_t = cols[None, :] == t[:, None]
    x_t = tl.sum(tl.where(at_t, logits, 0.0), 1)
    loss = (1.0 - smoothing) * (shift - x_t)
    if SMOOTH:
        loss += smoothing / C * tl.sum(tl.where(c_ok[None, :], shift[:, None] - logits, 0.0), 1)
    e = tl.exp(logits - shift[:, None])
    s = tl.sum(e, 1)
    loss += tl.log(s)
    loss = tl.where(kept, loss, 0.0)
    if REDUCTION == 0:
        if first:
            tl.store(out_ptr + rows, loss.to(out_ptr.dtype.element_ty), mask=row_ok)

    # ---- dlogits, and dx = dlogits @ W for this program's features
    if COMPUTE_GRAD:
        q = tl.where(at_t, 1.0 - smoothing, 0.0) + smoothing / C
        g = tl.where(kept[:, None] & c_ok[None, :],
                     (e * (1.0 / s)[:, None] - q) * grad_scale, 0.0)
        g = g.to(x_dtype)
        if first:
            tl.store(dlogits_ptr + rows64[:, None] * C + cols[None, :], g,
                     mask=row_ok[:, None] & c_ok[None, :])
        if INPUT_GRAD:
            if UPCAST:
                g = g.to(tl.float32)
            ks = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
            k_ok = ks < K
            wk = tl.load(w_ptr + cols.to(tl.int64)[:, None] * stride_wc
                         + ks.to(tl.int64)[None, :] * stride_wk,
                         mask=c_ok[:, None] & k_ok[None, :], other=0.0)
            if UPCAST:
                wk = wk.to(tl.float32)
            dx = tl.dot(g, wk, input_precision=PRECISION)
            tl.store(dx_ptr + rows64[:, None] * K + ks[None, :], dx.to(x_dtype),
                     mask=row_ok[:, None] & k_ok[None, :])

    # ---- the loss total and the correct count (first largest logit, NaN as +inf)
    if first:
        total = tl.sum(loss, 0)
        hits = tl.zeros([], tl.int64)
        if METRICS:
            v = tl.where(logits != logits, float("inf"), logits)
            best = tl.max(v, 1)
            top = tl.min(tl.where((v == best[:, None]) & c_ok[None, :], cols[None, :], BLOCK_C),
                         1)
            hits = tl.sum((row_ok & (top.to(tl.int64) == t_given)).to(tl.int64), 0)
        if ONE:
            if METRICS:
                running = tl.load(loss_total_ptr).to(tl.float32) + total
                tl.store(loss_total_ptr, running.to(loss_total_ptr.dtype.element_ty))
                tl.store(correct_ptr, tl.load(correct_ptr) + hits)
            if REDUCTION != 0:
                if REDUCTION == 2:  # NOTE: 0 / 0 = NaN when every row is ignored, as torch
                    total = total / count.to(tl.float32)
                tl.store(out_ptr, total.to(out_ptr.dtype.element_ty))
        else:
            tl.store(part_ptr + pid_m, total)
            tl.store(hits_ptr + pid_m, hits)


@triton.jit
def _head_reduce_kernel(out_ptr, part_ptr, hits_ptr, info_ptr, loss_total_ptr, correct_ptr,
                        n_parts, REDUCTION: tl.constexpr, METRICS: tl.constexpr,
                        BLOCK: tl.constexpr, GDC: tl.constexpr):
    if GDC:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    # one program: the row blocks' loss sums and hit counts, added in a fixed order
    total = tl.zeros([BLOCK], tl.float32)
    hits = tl.zeros([BLOCK], tl.int64)
    for start in range(0, n_parts, BLOCK):
        p = start + tl.arange(0, BLOCK)
        total += tl.load(part_ptr + p, mask=p < n_parts, other=0.0)
        if METRICS:
            hits += tl.load(hits_ptr + p, mask=p < n_parts, other=0)
    result = tl.sum(total, 0)
    if METRICS:
        running = tl.load(loss_total_ptr).to(tl.float32) + result
        tl.store(loss_total_ptr, running.to(loss_total_ptr.dtype.element_ty))
        tl.store(correct_ptr, tl.load(correct_ptr) + tl.sum(hits, 0))
    if REDUCTION != 0:
        if REDUCTION == 2:
            result = result / tl.load(info_ptr).to(tl.float32)
        tl.store(out_ptr, result.to(out_ptr.dtype.element_ty))


# ----------------------------------------------------------------------------------- launcher


class _Composed:
    """The triton primitives that the unfused path calls (Backend's default, unbound)."""
    matmul = staticmethod(matmul)
    cross_entropy = staticmethod(_cross_entropy)


def _check(x, w, bias, target, reduction, label_smoothing):
    op = "linear_cross_entropy"
    for name, a in (("input", x), ("weight", w), ("bias", bias)):
        if a is not None and not a.dtype.is_floating_point:
            raise TypeError(f"{op}: {name} must be floating point, got {dtype_of(a).name}")
    if x.dim() != 2 or w.dim() != 2 or x.shape[1] != w.shape[1]:
        raise ValueError(f"{op}: expected input [N, K] and weight [C, K], got input "
                         f"{tuple(x.shape)} and weight {tuple(w.shape)}")
    if bias is not None and tuple(bias.shape) != (w.shape[0],):
        raise ValueError(f"{op}: bias {tuple(bias.shape)} does not match weight "
                         f"{tuple(w.shape)}")
    if w.dtype != x.dtype or (bias is not None and bias.dtype != x.dtype):
        raise TypeError(f"{op}: input, weight and bias must have one dtype, got "
                        f"{dtype_of(x).name}, {dtype_of(w).name}"
                        + (f" and {dtype_of(bias).name}" if bias is not None else ""))
    for a in (w, bias, target):
        if a is not None and a.device != x.device:
            raise ValueError(f"{op}: input is on {x.device} but a {tuple(a.shape)} argument "
                             f"on {a.device}")
    if target.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"{op}: target must be int64 (or int32) class indices, got "
                        f"{dtype_of(target).name}")
    if tuple(target.shape) != (x.shape[0],):
        raise ValueError(f"{op}: expected input [N, K] and target [N], got input "
                         f"{tuple(x.shape)} and target {tuple(target.shape)}")
    check_loss_options(op, reduction, label_smoothing)
    if w.shape[0] == 0:
        raise ValueError(f"{op}: weight {tuple(w.shape)} has no classes")


def linear_cross_entropy(x, w, bias, target, reduction="mean", ignore_index=-100,
                         label_smoothing=0.0, compute_grad=True, input_grad=True, metrics=None):
    """Backend.linear_cross_entropy: one kernel where the classes fit a register tile (module
    docstring), else matmul, cross_entropy and matmul. A bad target is raised at the next read
    of the device (kernels/errors.py)."""
    if x.dtype not in _TL_TYPES or not 0 < w.shape[0] <= MAX_CLASSES or x.dim() != 2 or \
            w.dim() != 2 or x.shape[0] == 0:
        _check(x, w, bias, target, reduction, label_smoothing)
        return Backend.linear_cross_entropy(_Composed, x, w, bias, target, reduction,
                                            ignore_index, label_smoothing, compute_grad,
                                            input_grad, metrics)
    result = _fused(x, w, bias, target, reduction, ignore_index, label_smoothing, compute_grad,
                    input_grad, metrics)
    errors.after(x.device)
    return result


def _settings():
    return (matmul_precision(), PART_M, BLOCK_K, PROGRAMS, MAX_SPLITS, SINGLE_ROWS, BLOCK_M,
            DX_PROGRAMS, WARPS_ONE, WARPS_ROWS)


def _precision(dtype):
    if INTERPRET:
        return "ieee"
    if dtype == torch.float32 and matmul_precision() == "high":
        return "tf32"
    return "tf32x3"  # (fp32 accuracy; ignored for half types)


@planned(settings=_settings)
def _fused(x, w, bias, target, reduction, ignore_index, label_smoothing, compute_grad,
           input_grad, metrics):
    _check(x, w, bias, target, reduction, label_smoothing)
    if metrics is not None:
        check_metrics("linear_cross_entropy", x, metrics)
    n, k = x.shape
    c = w.shape[0]
    device = x.device
    out = empty((n,) if reduction == "none" else (), x.dtype, device)
    dlogits = empty((n, c), x.dtype, device) if compute_grad else None
    dx = empty((n, k), x.dtype, device) if compute_grad and input_grad else None
    block_c = max(16, next_power_of_2(c))
    precision, upcast = _precision(x.dtype), INTERPRET and x.dtype != torch.float32

    # 1. the logits' split-K slices
    row_blocks = cdiv(n, PART_M)
    steps = cdiv(k, BLOCK_K)
    splits = max(1, min(steps, MAX_SPLITS, cdiv(PROGRAMS, row_blocks)))
    k_per_split = cdiv(steps, splits) * BLOCK_K
    splits = cdiv(k, k_per_split) if k else 1
    part = empty((splits, n, block_c), torch.float32, device)
    run(_head_partials_kernel, (row_blocks, splits), part, x, w, n, k, c, k_per_split,
        *x.stride(), *w.stride(), BLOCK_M=PART_M, BLOCK_K=BLOCK_K, BLOCK_C=block_c,
        PRECISION=precision, UPCAST=upcast, num_warps=4, **PDL)

    # 2. the loss, dlogits and dx
    one = n <= SINGLE_ROWS
    block_m = max(16, next_power_of_2(n)) if one else BLOCK_M
    programs = 1 if one else cdiv(n, block_m)
    flag = errors.flag(device, "cross_entropy")  # (the op the user knows)
    info = sums = hits = out  # (unused pointers when one row block does it all)
    if not one:
        info = empty((1,), torch.int64, device)
        run(_ce_count_kernel, (1,), info, flag, target, n, c, target.stride(0), ignore_index,
            BLOCK_T=TARGET_BLOCK, num_warps=4)
        sums = empty((programs,), torch.float32, device)
        hits = empty((programs,), torch.int64, device)
    loss_total, correct = metrics if metrics is not None else (out, out)
    smoothing = float(label_smoothing)
    block_n = next((b for b in (32, 64) if programs * cdiv(k, b) <= DX_PROGRAMS), 128)
    features = max(cdiv(k, block_n), 1) if dx is not None else 1
    run(_head_kernel, (programs, features), out, sums, hits, info,
        dlogits if dlogits is not None else out, dx if dx is not None else out, flag,
        part, w, bias if bias is not None else w, target, loss_total, correct,
        n, k, c, splits, *w.stride(), bias.stride(0) if bias is not None else 0,
        target.stride(0), ignore_index, smoothing,
        x_dtype=_TL_TYPES[x.dtype], REDUCTION=_REDUCTIONS[reduction], ONE=one,
        HAS_BIAS=bias is not None, SMOOTH=smoothing > 0.0, COMPUTE_GRAD=compute_grad,
        INPUT_GRAD=dx is not None, METRICS=metrics is not None, BLOCK_M=block_m,
        BLOCK_N=block_n, BLOCK_C=block_c, SPLITS_P=next_power_of_2(splits),
        PRECISION=precision, UPCAST=upcast, num_warps=WARPS_ONE if one else WARPS_ROWS, **PDL)
    if not one and (reduction != "none" or metrics is not None):
        run(_head_reduce_kernel, (1,), out, sums, hits, info, loss_total, correct, programs,
            REDUCTION=_REDUCTIONS[reduction], METRICS=metrics is not None, BLOCK=128,
            num_warps=4, **PDL)
    return out, dlogits, dx
