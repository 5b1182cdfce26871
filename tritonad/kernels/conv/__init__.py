"""2-d convolution (NCHW, cross-correlation as torch): a package with one module per algorithm.

Notation: x [N, C, H, W], w [Co, C, kh, kw], y [N, Co, Ho, Wo]; stride s, padding pad, dilation d
per axis. Every direction is one matrix product over a gathered ("im2col") operand:

    forward  y[n, o, p, q]  = b[o] + sum_{c,i,j} w[o, c, i, j] * x[n, c, p*s - pad + i*d, ...]
             Y[o, (n,p,q)]  = W[o, (c,i,j)] @ X_col[(c,i,j), (n,p,q)]
    input    dx[n, c, h, v] = sum_{o,i,j} w[o, c, i, j] * dy[n, o, (h + pad - i*d) / s, ...]
             (only where the division is exact and lands inside dy: the transposed convolution
             written as a gather, so every dx element is owned by one program and nothing races)
    weight   dW[o, (c,i,j)] = sum_{(n,p,q)} dY[o, (n,p,q)] * X_col[(c,i,j), (n,p,q)]
    bias     db[o]          = sum_{(n,p,q)} dY[o, (n,p,q)]

The rooms (each module's docstring says when it applies; routing.py picks among them):
    im2col_path.py    the column buffer and our matmul; im2col / col2im
    implicit_gemm.py  implicit GEMM: the column tile built in the K loop (every convolution)
    window.py         the window GEMM: stride 1 on Hopper, TMA over a padded channels-last copy
    flat_shift.py     weight gradient of stride-1 "same" layers: a tap is one flat shift
    batch_inner.py    weight gradient of float32 stride-1 "same" layers: batch-inner copies
    winograd.py       F(4x4, 3x3) for 3x3 layers with many channels at float32 accuracy
    weight_grad.py    what the weight-gradient algorithms share: split-K, db, the fixed sums
    tf32.py (3xTF32 splitting), sums.py (fixed-order sums), layout.py (channels-last copies),
    common.py (geometry, tile sizes, the tuner), settings.py (the switches, the precision).

The entry points below read the current Settings and the precision once per call and pass
them down (settings.py); the launch plans are keyed on both.

NOTE: products accumulate in float32 (tl.dot); float32 inputs multiply in TF32 or, for float32
accuracy (conv_precision() "highest"), as 3xTF32, float16 / bfloat16 on their tensor cores;
results are rounded once.
"""
from __future__ import annotations

from ...backend import autotuning, check_weight_grad_outputs
from ..launch import dtype_of
from ..plans import empty, planned
from . import im2col_path, routing, sums
from .common import Geometry, block, check_float, dot_fp32, menu_kind, pair, sm_count, tuner
from .settings import Settings, call_precision, current_settings, dot_precision, set_settings, \
    using
from .sums import sum_splits
from .weight_grad import run_weight_grad

PRIMITIVES = ("conv2d", "conv2d_backward", "im2col", "col2im")

__all__ = ["PRIMITIVES", "Geometry", "Settings", "block", "call_precision", "check_float",
           "col2im", "conv2d", "conv2d_backward", "current_settings", "dot_fp32",
           "dot_precision", "im2col", "menu_kind", "plan_settings", "set_settings", "sm_count",
           "sum_splits", "tuner", "using"]


def plan_settings():
    """What the launch plans of a convolution are keyed on besides its arguments: the call's
    precision, the current Settings and whether tuning is on."""
    return call_precision(), current_settings(), autotuning()


@planned(settings=plan_settings, arrays=3)
def conv2d(x, w, bias=None, stride=(1, 1), padding=(0, 0), dilation=(1, 1), groups=1,
           activation=None):
    """y = conv(x, w) + bias, cross-correlation as torch (then relu in the same kernel if
    activation="relu"). x: [N, C, H, W], w: [Co, C // groups, kh, kw], bias: [Co] or None ->
    y: [N, Co, Ho, Wo]."""
    precision, s = call_precision(), current_settings()
    g = Geometry("conv2d", x.shape, w.shape, stride, padding, dilation, groups)
    check_float("conv2d", x, w, bias)
    if activation not in (None, "relu"):
        raise ValueError(f"conv2d: unknown activation {activation!r} (None or 'relu')")
    if bias is not None and tuple(bias.shape) != (g.co,):
        raise ValueError(f"conv2d: bias {tuple(bias.shape)} does not match weight "
                         f"{tuple(w.shape)} ({g.co} output channels)")
    y = empty((g.n, g.co, g.oh, g.ow), x.dtype, x.device)
    if y.numel() == 0:
        return y
    cg, cog = g.c // g.groups, g.co // g.groups
    for k in range(g.groups):
        xk, wk = x[:, k * cg:(k + 1) * cg], w[k * cog:(k + 1) * cog]
        algo = routing.gemm_algorithm("forward", g, xk, cog, precision, s)
        if algo == "im2col":  # (groups = 1: the whole layer)
            return im2col_path.forward(x, w, bias, g, activation, precision)
        routing.run_gemm(algo, xk, wk, None if bias is None else bias[k * cog:(k + 1) * cog],
                         y[:, k * cog:(k + 1) * cog], g, False, activation == "relu",
                         precision, s)
    return y


@planned(settings=plan_settings, arrays=3)
def conv2d_backward(dy, x, w, stride=(1, 1), padding=(0, 0), dilation=(1, 1), groups=1,
                    input_grad=True, weight_grad=True, bias_grad=True, gate=None, dw_out=None,
                    db_out=None):
    """(dx [N, C, H, W], dw [Co, C // groups, kh, kw], db [Co]) of conv2d for dy [N, Co, Ho, Wo];
    an entry is None when not asked for. gate (dy's shape; the output of a conv2d with
    activation="relu"): dy is taken as where(gate > 0, dy, 0), relu's backward. dw_out, db_out:
    contiguous arrays of w's dtype to write dw and db into (an optimizer's gradient buffer)."""
    precision, s = call_precision(), current_settings()
    g = Geometry("conv2d_backward", x.shape, w.shape, stride, padding, dilation, groups)
    check_float("conv2d_backward", dy, x, w)
    if tuple(dy.shape) != (g.n, g.co, g.oh, g.ow):
        raise ValueError(f"conv2d_backward: dy {tuple(dy.shape)} does not match the output "
                         f"{(g.n, g.co, g.oh, g.ow)} of input {tuple(x.shape)} and weight "
                         f"{tuple(w.shape)}")
    if gate is not None:
        if tuple(gate.shape) != tuple(dy.shape) or gate.dtype != dy.dtype:
            raise ValueError(f"conv2d_backward: gate {tuple(gate.shape)} {dtype_of(gate).name} "
                             f"does not match dy {tuple(dy.shape)} {dtype_of(dy).name}")
        # NOTE: one pass, read by every kernel after. Applied as the kernels read dy, the
        # gate's loads cost more than this pass in these gather-bound kernels (conv1's
        # implicit weight gradient on an H200: 44 us with the gate in its reads against
        # 26 + 7 us; a direct FMA kernel that read dy once as plain tiles: 34 + 10 us)
        # (H200, 2026-11-24, notes/PERF.md)
        from ..elementwise import relu_backward
        dy = relu_backward(dy, gate)
    dx = empty(x.shape, x.dtype, x.device) if input_grad else None
    dw, db = _weight_grad_outputs(w, g.co, weight_grad, bias_grad, dw_out, db_out)
    cg, cog = g.c // g.groups, g.co // g.groups
    dys = [dy[:, k * cog:(k + 1) * cog] for k in range(g.groups)]
    xs = [x[:, k * cg:(k + 1) * cg] for k in range(g.groups)]
    # what the input gradient leaves the weight gradient (its copy of dy: window.gemm)
    kept = [{} if dw is not None and dw.numel() else None for _ in range(g.groups)]
    if dx is not None and dx.numel():
        for k in range(g.groups):
            algo = routing.gemm_algorithm("input", g, dys[k], cg, precision, s)
            if algo == "im2col":  # (groups = 1: the whole layer)
                im2col_path.input_grad(dy, w, dx, g, precision)
                break
            routing.run_gemm(algo, dys[k], w[k * cog:(k + 1) * cog], None,
                             dx[:, k * cg:(k + 1) * cg], g, True, False, precision, s, kept[k])
    if (dw is None or dw.numel() == 0) and (db is None or db.numel() == 0):
        return dx, dw, db
    if dw is None or dw.numel() == 0:
        if db is not None:
            sums.bias_grad(dy, db, s)  # (bias_grad: the argument)
        return dx, dw, db
    for k in range(g.groups):
        algo = routing.weight_grad_algorithm(g, dys[k], xs[k], precision, s)
        if algo == "im2col":  # (groups = 1: the whole layer)
            im2col_path.weight_grad(dy, x, dw, db, g, precision)
            break
        run_weight_grad(algo, dys[k], xs[k], dw[k * cog:(k + 1) * cog],
                        None if db is None else db[k * cog:(k + 1) * cog], g, precision, s,
                        kept[k].get("dy"))
    return dx, dw, db


def _weight_grad_outputs(w, co, weight_grad, bias_grad, dw_out, db_out):
    """(dw, db) for conv2d_backward: the given outputs (checked) or new arrays; None where not
    asked for."""
    check_weight_grad_outputs("conv2d_backward", w, dw_out, db_out)
    dw = (dw_out if dw_out is not None else empty(w.shape, w.dtype, w.device)) \
        if weight_grad else None
    db = (db_out if db_out is not None else empty((co,), w.dtype, w.device)) \
        if bias_grad else None
    return dw, db


@planned()
def im2col(x, kernel_size, stride=(1, 1), padding=(0, 0), dilation=(1, 1)):
    """Sliding windows as columns (torch's unfold).
    x: [N, C, H, W] -> [N, C*kh*kw, Ho*Wo], rows ordered (c, i, j)."""
    if x.dim() != 4:
        raise ValueError(f"im2col: expected x [N, C, H, W], got {tuple(x.shape)}")
    kh, kw = pair("im2col", "kernel_size", kernel_size, 1)
    g = Geometry("im2col", x.shape, (1, x.shape[1], kh, kw), stride, padding, dilation, 1)
    if x.numel() == 0:
        return empty((g.n, g.c * kh * kw, g.oh * g.ow), x.dtype, x.device)
    return im2col_path.im2col_buffer(x, g, ones_row=False)


@planned()
def col2im(cols, output_size, kernel_size, stride=(1, 1), padding=(0, 0), dilation=(1, 1)):
    """The adjoint of im2col (torch's fold): overlapping windows are summed.
    cols: [N, C*kh*kw, L] -> [N, C, H, W], (H, W) = output_size."""
    kh, kw = pair("col2im", "kernel_size", kernel_size, 1)
    h, w = pair("col2im", "output_size", output_size, 1)
    if cols.dim() != 3 or cols.shape[1] % (kh * kw):
        raise ValueError(f"col2im: columns {tuple(cols.shape)} are not [N, C*{kh}*{kw}, L]")
    check_float("col2im", cols, allow_f64=True)
    n, c = cols.shape[0], cols.shape[1] // (kh * kw)
    g = Geometry("col2im", (n, c, h, w), (1, c, kh, kw), stride, padding, dilation, 1)
    if cols.shape[2] != g.oh * g.ow:
        raise ValueError(f"col2im: columns {tuple(cols.shape)} need L = {g.oh}*{g.ow} windows for "
                         f"output_size {(h, w)}, kernel {(kh, kw)}, stride {(g.sh, g.sw)}, "
                         f"padding {(g.ph, g.pw)}, dilation {(g.dh, g.dw)}")
    out = empty((n, c, h, w), cols.dtype, cols.device)
    return im2col_path.col2im_into(cols, out, g) if out.numel() else out
