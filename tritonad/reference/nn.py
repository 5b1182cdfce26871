"""The numpy backend's matmul, softmax family and fused softmax cross-entropy."""
from __future__ import annotations

import numpy as np
import torch

from .. import dtypes
from ..backend import check_metrics
from .arrays import _select, compute_dtype, to_numpy, write


class NnOps:
    """Mixed into NumpyBackend."""

    # matmul -------------------------------------------------------------------------------------
    def matmul(self, a, b, bias=None, activation=None, out=None, a_gate=None, a_row_sums=None):
        dtype = dtypes.get_dtype(a.dtype)
        ct = compute_dtype(dtype)
        av = to_numpy(a).astype(ct, copy=False)
        if (a_gate is not None or a_row_sums is not None) and (av.ndim != 2 or b.ndim != 2):
            raise ValueError(f"matmul: a_gate and a_row_sums need 2-d operands, got a "
                             f"{tuple(a.shape)} @ b {tuple(b.shape)}")
        if a_gate is not None:
            if tuple(a_gate.shape) != av.shape:
                raise ValueError(f"matmul: a_gate must have a's shape {av.shape}, got "
                                 f"{tuple(a_gate.shape)}")
            av = _select(to_numpy(a_gate) > 0, av)
        if a_row_sums is not None:
            if tuple(a_row_sums.shape) != av.shape[:1]:
                raise ValueError(f"matmul: a_row_sums must have shape {av.shape[:1]}, got "
                                 f"{tuple(a_row_sums.shape)}")
            write(a_row_sums, av.sum(axis=1))
        if activation not in (None, "relu"):
            raise ValueError(f"matmul: unknown activation {activation!r}")
        bv = to_numpy(b).astype(ct, copy=False)
        # the product straight into out where it can be (a weight gradient into the optimizer's
        # flat buffer: one copy of the weight's size less), else into a new array; the bias
        # and relu in place on it
        target = None
        if out is not None and out.dtype != torch.bfloat16 and av.ndim == 2 and bv.ndim == 2:
            target = out.numpy()
            if target.dtype != ct or target.shape != (av.shape[0], bv.shape[1]):
                target = None
        y = np.asarray(np.matmul(av, bv, out=target))  # (1-d @ 1-d: a 0-d array, not a scalar)
        if bias is not None:
            bias_v = to_numpy(bias).astype(ct, copy=False)
            y = np.add(y, bias_v, out=y if np.broadcast_shapes(y.shape, bias_v.shape) == y.shape
                       else None)
        if activation == "relu":
            np.maximum(y, np.zeros((), ct), out=y)
        if target is not None:
            return out
        return self._fresh(y, dtype) if out is None else write(out, y)

    # softmax and cross-entropy ------------------------------------------------------------------
    def check_targets(self, target, n_classes, ignore_index=-100, op="nll_loss"):
        t = to_numpy(target).astype(np.int64).reshape(-1)
        bad = (t != ignore_index) & ((t < 0) | (t >= n_classes))
        if bad.any():
            row = int(np.argmax(bad))
            raise ValueError(f"{op}: target {int(t[row])} is outside [0, {n_classes}) (at row "
                             f"{row})")

    def cross_entropy(self, logits, target, reduction="mean", ignore_index=-100,
                      label_smoothing=0.0, compute_grad=True, metrics=None):
        if metrics is not None:
            check_metrics("cross_entropy", logits, metrics)
        dtype = dtypes.get_dtype(logits.dtype)
        x = self._float_in(logits, dtype)
        t = to_numpy(target).astype(np.int64)
        n, c = x.shape
        kept = t != ignore_index
        bad = kept & ((t < 0) | (t >= c))
        if bad.any():
            row = int(np.argmax(bad))
            raise ValueError(f"cross_entropy: target {int(t[row])} is outside [0, {c}) (at row "
                             f"{row}; ignore_index={ignore_index}); logits shape "
                             f"{tuple(x.shape)}")
        safe_t = np.where(kept, t, 0)
        m = np.max(x, axis=1, keepdims=True) if c else np.zeros((n, 1), x.dtype)
        m = np.where(np.isfinite(m), m, 0)
        with np.errstate(all="ignore"):
            # NOTE: everything relative to the row max m, so that logits like 1e4 lose no digits:
            # loss = log(sum(exp(z))) - (1 - eps) z_t - eps / C sum(z),  z = x - m
            z = x - m
            e = np.exp(z)
            s = e.sum(axis=1, keepdims=True)
            eps = label_smoothing
            z_t = z[np.arange(n), safe_t]
            smooth = z.sum(axis=1) * (eps / c) if eps else 0.0
            loss = np.where(kept, np.log(s[:, 0]) - (1 - eps) * z_t - smooth, 0).astype(x.dtype)
        count = kept.sum()
        scale = {"none": 1.0, "sum": 1.0, "mean": None}[reduction]
        with np.errstate(all="ignore"):
            if reduction == "none":
                out_loss = loss
            else:
                out_loss = loss.sum()
                if reduction == "mean":
                    out_loss = out_loss / x.dtype.type(count)  # NOTE: 0/0 = nan when all ignored
                    scale = 1.0 / count if count else 0.0
        grad = None
        if compute_grad:
            q = np.zeros_like(x)
            q[np.arange(n), safe_t] = 1 - eps
            q += eps / c
            with np.errstate(all="ignore"):  # NOTE: ignored rows are 0 even where e / s is NaN
                grad = np.where(kept[:, None], (e / s - q) * x.dtype.type(scale), 0)
            grad = self._new(grad, dtype)
        if metrics is not None:
            loss_total, correct = metrics
            write(loss_total, to_numpy(loss_total) + loss.sum())
            self.count_correct_(logits, target, correct)
        return self._new(out_loss, dtype), grad
