"""The argument checks of primitives, shared by the backends: each raises a one-line error
naming the op and what it got. backend.py re-exports them."""
from __future__ import annotations

import torch

from . import dtypes


def check_metrics(op, logits, metrics):
    """The argument checks of cross_entropy's `metrics`, shared by the backends."""
    try:
        loss_total, correct = metrics
    except (TypeError, ValueError):
        raise TypeError(f"{op}: metrics must be a pair (loss_total, correct), got "
                        f"{type(metrics).__name__}") from None
    for name, x, floating in (("loss_total", loss_total, True), ("correct", correct, False)):
        ok = isinstance(x, torch.Tensor) and x.numel() == 1 and x.device == logits.device and (
            x.dtype.is_floating_point if floating else x.dtype == torch.int64)
        if not ok:
            got = f"{tuple(x.shape)} {x.dtype} on {x.device}" if isinstance(x, torch.Tensor) \
                else type(x).__name__
            kind = "floating point" if floating else "int64"
            raise ValueError(f"{op}: metrics {name} must be one {kind} element on "
                             f"{logits.device}, got {got}")


def check_gather_rows_at(sources, outs, table, cursor):
    """The argument checks of Backend.gather_rows_at_, shared by the backends."""
    op = "gather_rows_at_"
    if not 1 <= len(sources) <= 2 or len(outs) != len(sources):
        raise ValueError(f"{op}: one or two sources, each with its out; got {len(sources)} "
                         f"sources and {len(outs)} outs")
    if table.dim() != 2 or table.dtype != torch.int64 or table.shape[0] == 0:
        raise ValueError(f"{op}: table must be int64 [R >= 1, B], got {tuple(table.shape)} "
                         f"{table.dtype}")
    if cursor.numel() != 1 or cursor.dtype != torch.int64:
        raise ValueError(f"{op}: cursor must be one int64 element, got {tuple(cursor.shape)} "
                         f"{cursor.dtype}")
    for x, out in zip(sources, outs):
        want = (table.shape[1],) + tuple(x.shape[1:])
        if x.dim() < 1 or tuple(out.shape) != want or out.dtype != x.dtype or \
                not out.is_contiguous():
            raise ValueError(f"{op}: out for a source of shape {tuple(x.shape)} {x.dtype} must "
                             f"be a contiguous {want} array of that dtype, got "
                             f"{tuple(out.shape)} {out.dtype}")
        if len({x.device, out.device, table.device, cursor.device}) != 1:
            raise RuntimeError(f"{op}: source on {x.device}, out on {out.device}, table on "
                               f"{table.device}, cursor on {cursor.device}: all on one device")


MLP_MAX_WIDTH, MLP_MAX_CLASSES = 256, 64


def check_mlp_cross_entropy(x, target, weights, biases, weight_grads, bias_grads, metrics,
                            rows, cursor, advance):
    """The argument checks of Backend.mlp_cross_entropy_grads_, shared by the backends; returns
    the batch size."""
    op = "mlp_cross_entropy_grads_"
    n_layers = len(weights)
    if n_layers not in (2, 3) or not (len(biases) == len(weight_grads) == len(bias_grads) ==
                                      n_layers):
        raise ValueError(f"{op}: 2 or 3 layers, each with a weight, a bias and their gradients; "
                         f"got {len(weights)} weights, {len(biases)} biases, "
                         f"{len(weight_grads)} and {len(bias_grads)} gradients")
    if x.dim() != 2 or x.shape[0] == 0:
        raise ValueError(f"{op}: x must be [N >= 1, D], got {tuple(x.shape)}")
    arrays = [x, *weights, *biases, *weight_grads, *bias_grads]
    if any(a.dtype != torch.float32 for a in arrays):
        raise TypeError(f"{op}: x, the weights, biases and gradients must be float32, got "
                        f"{sorted({str(a.dtype) for a in arrays})}")
    width = x.shape[1]
    for i, (w, b, gw, gb) in enumerate(zip(weights, biases, weight_grads, bias_grads)):
        if w.dim() != 2 or w.shape[1] != width or tuple(b.shape) != (w.shape[0],):
            raise ValueError(f"{op}: layer {i + 1} takes {width} features: weight must be "
                             f"[out, {width}] and bias [out], got {tuple(w.shape)} and "
                             f"{tuple(b.shape)}")
        for g, p in ((gw, w), (gb, b)):
            if tuple(g.shape) != tuple(p.shape) or not g.is_contiguous():
                raise ValueError(f"{op}: the gradients of layer {i + 1} must be contiguous "
                                 f"arrays of shapes {tuple(w.shape)} and {tuple(b.shape)}, got "
                                 f"{tuple(gw.shape)} and {tuple(gb.shape)}")
        width = w.shape[0]
        if i and i < n_layers - 1 and width > MLP_MAX_WIDTH:
            raise ValueError(f"{op}: layer {i + 1} is {width} wide; the fused path takes at "
                             f"most {MLP_MAX_WIDTH} after the first layer")
    if width > MLP_MAX_CLASSES:
        raise ValueError(f"{op}: {width} classes; the fused path takes at most "
                         f"{MLP_MAX_CLASSES}")
    if target.dtype not in (torch.int64, torch.int32) or tuple(target.shape) != x.shape[:1]:
        raise ValueError(f"{op}: target must be int64 (or int32) [{x.shape[0]}], got "
                         f"{tuple(target.shape)} {target.dtype}")
    check_metrics(op, x, metrics)
    batch = x.shape[0]
    if rows is not None:
        if rows.dtype != torch.int64 or rows.dim() not in (1, 2) or rows.numel() == 0:
            raise ValueError(f"{op}: rows must be int64 sample indices [B >= 1] or a table "
                             f"[R, B], got {tuple(rows.shape)} {rows.dtype}")
        if (rows.dim() == 2) != (cursor is not None):
            raise ValueError(f"{op}: a 2-d rows table needs a cursor, and a cursor a 2-d table "
                             f"(got rows {tuple(rows.shape)}, cursor "
                             f"{'None' if cursor is None else tuple(cursor.shape)})")
        batch = rows.shape[-1]
    elif cursor is not None:
        raise ValueError(f"{op}: a cursor needs a rows table")
    if cursor is not None and (cursor.numel() != 1 or cursor.dtype != torch.int64):
        raise ValueError(f"{op}: cursor must be one int64 element, got {tuple(cursor.shape)} "
                         f"{cursor.dtype}")
    if advance and cursor is None:
        raise ValueError(f"{op}: advance=True needs a cursor")
    devices = {a.device for a in arrays + [target] + [a for a in (rows, cursor)
                                                      if a is not None]}
    if len(devices) != 1:
        raise RuntimeError(f"{op}: arrays on {sorted(str(d) for d in devices)}: all on one "
                           "device")
    return batch


def check_weight_grad_outputs(op, w, dw_out, db_out):
    """The checks of a backward's `dw_out` / `db_out` (conv2d_backward), shared by the
    backends: contiguous, w's dtype, w's shape and [w.shape[0]]."""
    for name, out, shape in (("dw_out", dw_out, tuple(w.shape)), ("db_out", db_out,
                                                                   (w.shape[0],))):
        if out is not None and (tuple(out.shape) != shape or out.dtype != w.dtype or
                                not out.is_contiguous()):
            raise ValueError(f"{op}: {name} must be a contiguous {shape} "
                             f"{dtypes.get_dtype(w.dtype).name} array, got "
                             f"{tuple(out.shape)} {dtypes.get_dtype(out.dtype).name}")


def check_take_row(table, cursor, out):
    """The argument checks of Backend.take_row_, shared by the backends."""
    if table.dim() < 1 or table.shape[0] == 0 or tuple(table.shape[1:]) != tuple(out.shape):
        raise ValueError(f"take_row_: table must be [R >= 1, *{tuple(out.shape)}] (out's shape), "
                         f"got {tuple(table.shape)}")
    if table.dtype != out.dtype:
        raise TypeError(f"take_row_: table dtype {dtypes.get_dtype(table.dtype).name} differs from "
                        f"out's {dtypes.get_dtype(out.dtype).name}")
    if cursor.numel() != 1 or cursor.dtype != torch.int64:
        raise TypeError(f"take_row_: cursor must be one int64 value, got shape "
                        f"{tuple(cursor.shape)} {dtypes.get_dtype(cursor.dtype).name}")
    if not (table.is_contiguous() and out.is_contiguous()):
        raise ValueError("take_row_: table and out must be contiguous")
    if cursor.device != out.device or (table.device != out.device and not table.is_pinned()):
        raise RuntimeError(f"take_row_: table on {table.device}, cursor on {cursor.device}, out "
                           f"on {out.device}: all on one device (or a pinned host table)")


def check_random_warp(x, out_size, crop, ranges):
    """The argument checks of Backend.random_warp, shared by the backends; returns (Ho, Wo)."""
    op = "random_warp"
    if x.dim() != 4:
        raise ValueError(f"{op}: images must be [N, C, H, W], got shape {tuple(x.shape)}")
    if x.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise TypeError(f"{op}: images must be float32, float16 or bfloat16, got "
                        f"{dtypes.get_dtype(x.dtype).name}")
    out_h, out_w = (int(s) for s in out_size)
    if out_h < 1 or out_w < 1:
        raise ValueError(f"{op}: the output size must be positive, got {tuple(out_size)}")
    if len(ranges) != (4 if crop else 6):
        raise ValueError(f"{op}: {'crop' if crop else 'affine'} takes "
                         f"{4 if crop else 6} ranges, got {len(ranges)}")
    if not crop and (out_h, out_w) != tuple(x.shape[2:]):
        raise ValueError(f"{op}: an affine warp keeps the image size {tuple(x.shape[2:])}, got "
                         f"an output size of {(out_h, out_w)}")
    return out_h, out_w
