"""The primitive set every backend implements, and backend selection.

Autodiff, nn and optim call only these primitives. A primitive takes *raw arrays* (torch tensors
used as strided memory: any strides, stride 0 for broadcast dimensions, any storage offset) and
Python numbers, and returns new contiguous raw arrays unless it says otherwise. A primitive never
records autodiff history; the Function that calls it does.

Conventions shared by all primitives:
- `dims` is a sorted tuple of non-negative axes (already normalised by the caller), or None for all.
- Binary elementwise ops broadcast by numpy's rules; either operand may be a Python number;
  the result has `dtypes.result_type(a, b)` (comparisons give bool).
- `out=`, where offered, is an existing array of the result's shape and dtype to write into
  (it may be one of the inputs: elementwise ops read each element before writing it).
- Half-precision inputs are computed in float32 and rounded once on output.

Two backends plug in: `numpy` (tritonad/reference/, the executable spec) and `triton`
(tritonad/kernels/, the product). The core primitives (Backend) are what a backend implements;
the fused and training-specific ones (FusedPrimitives, some of them fusions for the MNIST
recipes' patterns) default to compositions of the core ones. `set_backend`, `get_backend` and
`use_backend` choose between them; the default is `triton` where a CUDA GPU is present and
`numpy` otherwise (override with the environment variable TRITONAD_BACKEND).
"""
from __future__ import annotations

import contextlib
import os
import threading

import torch

from . import dtypes
from . import elementwise as _table
from .checks import (MLP_MAX_CLASSES, MLP_MAX_WIDTH, check_gather_rows_at,  # noqa: F401
                     check_metrics, check_mlp_cross_entropy, check_random_warp, check_take_row,
                     check_weight_grad_outputs)
from .dtypes import DType
from .settings import (autotune, autotuning, conv_output_hw, conv_precision,  # noqa: F401
                       matmul_precision, set_conv_precision, set_matmul_precision,
                       set_sync_checks, sync_checks)


_NO_CONTEXT = contextlib.nullcontext()


class FusedPrimitives:
    """The fused and training-specific primitives: each has a default written over the core
    primitives of the same backend (raw arrays in, raw arrays out), so a backend need not
    implement any of them; the triton backend replaces them with its fused kernels.

    Some are fusions for the patterns of the MNIST recipes (models.py, train.py), apart from
    the general ops: the fused MLP training step (mlp_cross_entropy_grads_, kernels/mlp.py),
    the classifier head (linear_cross_entropy, kernels/head.py) and a first convolution with
    relu and max pooling (conv2d_relu_max_pool2d and its backward, kernels/conv_pool.py). The
    others read a training step's values on the device, without a host sync (count_correct_,
    take_row_, gather_rows_at_: kernels/reduce.py and kernels/index.py). The defaults are
    their specification: the tests compare the fused kernels with them.
    """

    # ---------------------------------------------------------------- device-side step values
    def count_correct_(self, logits, target, counter):
        """counter += the number of rows i where the first largest logits[i] sits at target[i].
        logits: [N, C] float, target: [N] int, counter: a 1-element int64 array (in place, on
        the device, so that a training loop counts its accuracy without a host sync).
        Default: argmax, eq, sum and add."""
        hits = self.eq(self.argmax(logits, dim=1), target)
        return self.add(counter, self.sum(hits), out=counter)

    def take_row_(self, table, cursor, out, advance=False):
        """out[...] = table[cursor % R] with cursor read on the device, then cursor += 1 if
        `advance`. table: [R, *out.shape] of out's dtype (contiguous), cursor: a 1-element int64
        array, out: contiguous, written in place. No host synchronisation: this is how a captured
        training step reads the values of its step (the batch's sample indices, the learning
        rate) from a table filled ahead of time. On a GPU the table may also live in pinned host
        memory (read through its mapped address); returns out.

        Default: i = cursor - R * trunc(cursor / R) (in float64: exact below 2**53), in (-R, R),
        which gather_rows wraps to cursor % R; then copy_ and add."""
        check_take_row(table, cursor, out)
        at = cursor.reshape(1)
        quotient = self.cast(self.div(self.cast(at, dtypes.float64), table.shape[0]),
                             dtypes.int64)
        index = self.sub(at, self.mul(quotient, table.shape[0]))
        self.copy_(out, self.gather_rows(table, index)[0])
        if advance:
            self.add(cursor, 1, out=cursor)
        return out

    def gather_rows_at_(self, sources, outs, table, cursor):
        """outs[j][i] = sources[j][table[cursor % R, i]] for each source j (one or two, e.g. a
        dataset's images and labels), with cursor read on the device: a captured training
        step's batch, cut from the device-resident dataset by the row of sample indices that
        the cursor points at. sources[j]: [N, *rest_j] (any strides), outs[j]: contiguous
        [B, *rest_j] of the source's dtype, table: int64 [R, B]. An index outside [-N, N)
        raises IndexError (checked by reading back, except during CUDA graph capture, where it
        is clamped into range). The cursor is not advanced. Returns outs.

        Default: take_row_ of the table's row, then gather_rows and copy_ per source."""
        check_gather_rows_at(sources, outs, table, cursor)
        row = self.empty(table.shape[1:], dtypes.int64, table.device)
        self.take_row_(table if table.is_contiguous() else self.contiguous(table), cursor, row)
        for x, out in zip(sources, outs):
            self.copy_(out, self.gather_rows(x, row))
        return outs

    # ---------------------------------------------------------------- MNIST recipe fusions
    def linear_cross_entropy(self, x, w, bias, target, reduction="mean", ignore_index=-100,
                             label_smoothing=0.0, compute_grad=True, input_grad=True,
                             metrics=None):
        """A classifier head: cross_entropy(x @ w^T + bias, target, ...) without handing the
        logits back; returns (loss, dlogits or None, dx or None).

        x: [N, K], w: [C, K], bias: [C] or None, one floating dtype; target, reduction,
        ignore_index, label_smoothing and metrics as cross_entropy. The product follows
        matmul's rules (float32 accumulation, `matmul_precision()`). With compute_grad, dlogits
        = d(loss)/d(logits) [N, C] (x's dtype, as cross_entropy returns it: dw = dlogits^T @ x
        and db = its column sums are the caller's), and with input_grad also dx = dlogits @ w
        [N, K]. Default: those three steps (matmul, cross_entropy, matmul); a backend may do
        them in fewer kernels, since everything but dw and db is row-local."""
        logits = self.matmul(x, w.t(), bias=bias)
        loss, dlogits = self.cross_entropy(logits, target, reduction, ignore_index,
                                           label_smoothing, compute_grad=compute_grad,
                                           metrics=metrics)
        dx = self.matmul(dlogits, w) if compute_grad and input_grad else None
        return loss, dlogits, dx

    def mlp_cross_entropy_grads_(self, x, target, weights, biases, weight_grads, bias_grads,
                                 metrics, rows=None, cursor=None, advance=False):
        """The gradients of a ReLU MLP's mean cross-entropy on one batch, forward and backward in
        one call (three kernels on the GPU): the fused path of a training step.

        The network, 2 or 3 linear layers with relu between them (torch's Linear layout):
            h0 = x[batch rows], h_l = relu(h_{l-1} @ W_l^T + b_l), logits = h_{L-1} @ W_L^T + b_L,
            loss = mean over the batch of cross_entropy(logits_i, target[batch row i]).
        The batch rows: all N rows of x when rows is None; rows[i] for an int64 [B] array of
        sample indices; or the row at `cursor` of an int64 table [R, B], as gather_rows_at_
        (cursor += 1 at the end when `advance`). Negative indices count from the end.
        x: [N, D] float32 (any strides); target: [N] int64 or int32 class indices in [0, C);
        weights: W_l [H_l, H_{l-1}], biases: b_l [H_l], float32 on x's device;
        weight_grads, bias_grads: contiguous arrays of the same shapes, overwritten with
        d(loss)/dW_l and d(loss)/db_l; metrics: (loss_total, correct) as in cross_entropy
        (the summed row losses and the correct count are added). The widths after the first
        layer are at most MLP_MAX_WIDTH, the classes at most MLP_MAX_CLASSES (register-sized
        tiles). A bad sample index raises IndexError, a bad target ValueError (checked by
        reading back, except during CUDA graph capture, where both are clamped into range; the
        outputs are then undefined). Returns the batch's mean loss, 0-d float32.

        Default: the per-op path (gather_rows, matmul with bias and relu, cross_entropy with
        the metrics, then matmul, sum and relu_backward layer by layer), whose errors name
        gather_rows and cross_entropy; the triton backend runs it as three kernels
        (kernels/mlp.py), a fusion for the MNIST MLP recipe.
        """
        batch = check_mlp_cross_entropy(x, target, weights, biases, weight_grads, bias_grads,
                                        metrics, rows, cursor, advance)
        h, t = x, target
        if rows is not None:
            index = rows
            if rows.dim() == 2:
                index = self.empty((batch,), dtypes.int64, rows.device)
                self.take_row_(rows if rows.is_contiguous() else self.contiguous(rows), cursor,
                               index)
            h, t = self.gather_rows(x, index), self.gather_rows(target, index)
        hs = [h]  # each layer's input
        for w, b in zip(weights[:-1], biases[:-1]):
            hs.append(self.matmul(hs[-1], w.t(), bias=b, activation="relu"))
        logits = self.matmul(hs[-1], weights[-1].t(), bias=biases[-1])
        loss, dz = self.cross_entropy(logits, t, "mean", metrics=metrics)
        for layer in reversed(range(len(weights))):  # dz: d(loss)/d(layer's output)
            self.matmul(dz.t(), hs[layer], out=weight_grads[layer])
            self.sum(dz, (0,), out=bias_grads[layer])
            if layer:
                dz = self.relu_backward(self.matmul(dz, weights[layer]), hs[layer])
        if advance:
            self.add(cursor, 1, out=cursor)
        return loss

    def conv2d_relu_max_pool2d(self, x, w, bias=None, stride=(1, 1), padding=(0, 0),
                               dilation=(1, 1), groups=1, kernel_size=(2, 2), pool_stride=(2, 2),
                               pool_padding=(0, 0), pool_dilation=(1, 1), ceil_mode=False,
                               with_indices=True):
        """(p, indices) = max_pool2d(relu(conv2d(x, w, bias, stride, padding, dilation,
        groups)), kernel_size, pool_stride, pool_padding, pool_dilation, ceil_mode): the values
        and indices of the two primitives (indices into the convolution's output planes). A
        backend may compute it without writing the convolution's output; by default it runs
        the two."""
        y = self.conv2d(x, w, bias, stride, padding, dilation, groups, "relu")
        return self.max_pool2d(y, kernel_size, pool_stride, pool_padding, pool_dilation,
                               ceil_mode, with_indices)

    def conv2d_relu_max_pool2d_backward(self, dp, indices, p, x, w, stride=(1, 1),
                                        padding=(0, 0), dilation=(1, 1), groups=1,
                                        kernel_size=(2, 2), pool_stride=(2, 2),
                                        pool_padding=(0, 0), pool_dilation=(1, 1),
                                        ceil_mode=False, input_grad=True, weight_grad=True,
                                        bias_grad=True, dw_out=None, db_out=None):
        """(dx, dw, db) of conv2d_relu_max_pool2d for dp (p's shape), given its indices and
        its output p (relu's gate: relu' at a window's argmax is p > 0); None where not asked
        for; dw_out, db_out as conv2d_backward's. A backend may compute the weight and bias
        gradients from dp directly (a first layer: no input gradient); by default the pool's
        backward gathers the convolution's gradient, which conv2d_backward then reads."""
        shape = (x.shape[0], w.shape[0]) + conv_output_hw(x.shape, w.shape, stride, padding,
                                                          dilation)
        dy = self.max_pool2d_backward(dp, indices, shape, kernel_size, pool_stride,
                                      pool_padding, pool_dilation, ceil_mode, p)
        return self.conv2d_backward(dy, x, w, stride, padding, dilation, groups, input_grad,
                                    weight_grad, bias_grad, None, dw_out, db_out)


class Backend(FusedPrimitives):
    """The core primitives. Subclasses implement every method that raises NotImplementedError;
    the fused ones (FusedPrimitives) have defaults."""

    name = "abstract"

    device_types = ("cpu",)  # the torch device types whose tensors this backend computes on

    @property
    def default_device(self) -> torch.device:
        return torch.device("cpu")

    def check_device(self, op: str, device: torch.device) -> None:
        """Raise a clear error if this backend cannot run `op` on `device`."""

    def check_errors(self, device: torch.device) -> None:
        """Raise an error that a kernel found in the data on `device` since the last call
        (backends that check asynchronously; see set_sync_checks). Called where the host reads
        the device anyway."""

    def side_region(self):
        """The context the engine runs a backward pass in (see `beside`); none by default."""
        return _NO_CONTEXT

    def beside(self, *reads):
        """Inside a backward pass: a context to write a weight gradient in beside the rest of
        the pass (a second stream), given the arrays it reads; None to write it in order (the
        default, and outside a side region). The backend joins what it ran beside before the
        pass ends."""
        return None

    # ---------------------------------------------------------------- memory, fills, casts
    def empty(self, shape, dtype: DType, device) -> torch.Tensor:
        """Uninitialised contiguous memory (allocation is the one thing torch does for us)."""
        return torch.empty(tuple(shape), dtype=dtype.torch, device=device)

    def full(self, shape, value, dtype: DType, device) -> torch.Tensor:
        """A new array of `shape` filled with `value`."""
        out = self.empty(shape, dtype, device)
        self.fill_(out, value)
        return out

    def fill_(self, x, value) -> torch.Tensor:
        """Write `value` into every element of `x` (any strides), in place; returns x."""
        raise NotImplementedError

    def copy_(self, dst, src) -> torch.Tensor:
        """dst[...] = src, in place: src (array or number) broadcast to dst's shape and cast to
        its dtype; dst may have any strides (not overlapping itself). Returns dst."""
        raise NotImplementedError

    def contiguous(self, x) -> torch.Tensor:
        """A contiguous copy of x."""
        out = self.empty(x.shape, dtypes.get_dtype(x.dtype), x.device)
        return self.copy_(out, x)

    def cast(self, x, dtype: DType) -> torch.Tensor:
        """x converted to dtype (floats to ints truncate towards zero; nonzero -> True)."""
        out = self.empty(x.shape, dtype, x.device)
        return self.copy_(out, x)

    def arange(self, start, end, step, dtype: DType, device) -> torch.Tensor:
        """[start, start + step, ...) up to but excluding end, as numpy.arange."""
        raise NotImplementedError

    # ---------------------------------------------------------------- the elementwise table
    def elementwise(self, formula, *operands, out=None):
        """out = formula(*operands) for an entry of tritonad/elementwise.py or one of its
        derivatives: arrays (broadcast together) or numbers, then the entry's number
        parameters; the result typed as the entry says. Every entry is also a primitive of its
        own name (`backend.gelu(x)`, `backend.leaky_relu(x, 0.01)`), bound below."""
        raise NotImplementedError

    def relu_backward(self, dy, x, out=None):
        """dx = dy where x > 0, else 0 (relu's derivative, the gate of fused backwards)."""
        return self.elementwise(_table.relu.derivatives["x"], x, dy, out=out)

    def pow(self, a, b, out=None):
        """a ** b with numpy's special cases; integers wrap."""
        raise NotImplementedError

    def pow_scalar(self, x, exponent, out=None):
        """x ** exponent for a Python number exponent (float result for float x)."""
        raise NotImplementedError

    def clamp(self, x, min=None, max=None, out=None):
        """Elementwise min(max(x, min), max) for number bounds; either may be None."""
        raise NotImplementedError

    # ---------------------------------------------------------------- reductions
    def sum(self, x, dims=None, keepdim=False, dtype: DType | None = None, out=None):
        """Sum over dims. Bool and integer inputs sum to int64 (as torch) unless dtype is given;
        floats keep their dtype, accumulating in float32 at least. out: an existing contiguous
        array of the result's shape and dtype to write into (the result is returned)."""
        raise NotImplementedError

    def mean(self, x, dims=None, keepdim=False):
        """Mean over dims (floating point x)."""
        raise NotImplementedError

    def max(self, x, dims=None, keepdim=False):
        """Largest value over dims (NaN propagates)."""
        raise NotImplementedError

    def min(self, x, dims=None, keepdim=False):
        raise NotImplementedError

    def argmax(self, x, dim=None, keepdim=False):
        """int64 index of the first largest value along dim (over the flattened x if None)."""
        raise NotImplementedError

    def argmin(self, x, dim=None, keepdim=False):
        raise NotImplementedError

    def var(self, x, dims=None, correction=1, keepdim=False):
        """Variance over dims: sum((x - mean)^2) / (n - correction)."""
        raise NotImplementedError

    def sum_to(self, x, shape):
        """Sum a broadcast gradient back to `shape` (the engine's un-broadcasting).

        shape must broadcast to x.shape: leading extra dims and dims where shape has 1 are summed.
        """
        shape = tuple(shape)
        if tuple(x.shape) == shape:
            return x
        lead = x.dim() - len(shape)
        dims = tuple(range(lead)) + tuple(
            lead + i for i, n in enumerate(shape) if n == 1 and x.shape[lead + i] != 1)
        out = self.sum(x, dims, keepdim=True) if dims else x
        return out.reshape(shape) if lead or tuple(out.shape) != shape else out

    # ---------------------------------------------------------------- matmul
    def matmul(self, a, b, bias=None, activation=None, out=None, a_gate=None, a_row_sums=None):
        """a @ b (+ bias) (then activation), one fused kernel where the backend can.

        a: [*batch, M, K], b: [*batch, K, N] with identical batch shapes (broadcast batch dims
        come as stride-0), bias: [N] or None, activation: None or "relu". Same floating dtype for
        all; float32 accumulation; float32 inputs follow `matmul_precision()`. Out: [*batch, M, N]
        (written into `out` when given: an existing contiguous array of that shape and dtype).
        The backward of linear + relu, 2-d operands only: `a_gate` (a's shape) makes the product
        read a as where(a_gate > 0, a, 0); `a_row_sums` (a contiguous [M] array) receives the
        sums of those rows of a over K: dz = relu'(y) * dy, dW = dz^T @ x and db = sum_rows(dz^T)
        in one call.
        """
        raise NotImplementedError

    # ---------------------------------------------------------------- softmax and loss
    # softmax and log_softmax are composites (autodiff/nn_ops.py); these primitives are their
    # fused forms, and the defaults compose them from the primitives above, in float32 at least
    # (half inputs are widened first and the result rounded once), as the composites do.
    def _softmax_shift(self, x, dim):
        dtype = dtypes.get_dtype(x.dtype)
        wide = dtypes.float32 if dtype in (dtypes.float16, dtypes.bfloat16) else dtype
        v = x if wide is dtype else self.cast(x, wide)
        if v.numel() == 0:
            return dtype, v, v
        m = self.max(v, (dim,), keepdim=True)
        m = self.where(self.isfinite(m), m, 0.0)  # rows of -inf: exp(-inf - 0) = 0, not NaN
        z = self.sub(v, m)
        return dtype, z, self.sum(self.exp(z), (dim,), keepdim=True)

    def _narrow(self, values, dtype):
        return values if values.dtype == dtype.torch else self.cast(values, dtype)

    def softmax(self, x, dim):
        """exp(x - max) / sum(exp(x - max)) along dim."""
        dtype, z, s = self._softmax_shift(x, dim)
        return self._narrow(self.div(self.exp(z), s), dtype)

    def log_softmax(self, x, dim):
        """(x - max) - log(sum(exp(x - max))) along dim."""
        dtype, z, s = self._softmax_shift(x, dim)
        return self._narrow(self.sub(z, self.log(s)), dtype)

    def softmax_backward(self, dy, y, dim):
        """dx = y * (dy - sum(dy * y, dim)), y = softmax(x)."""
        dtype = dtypes.get_dtype(y.dtype)
        g, s = (self.cast(v, dtypes.float32) if dtype.itemsize < 4 else v for v in (dy, y))
        inner = self.sum(self.mul(g, s), (dim,), keepdim=True)
        return self._narrow(self.mul(s, self.sub(g, inner)), dtype)

    def log_softmax_backward(self, dy, y, dim):
        """dx = dy - exp(y) * sum(dy, dim), y = log_softmax(x)."""
        dtype = dtypes.get_dtype(y.dtype)
        g, ls = (self.cast(v, dtypes.float32) if dtype.itemsize < 4 else v for v in (dy, y))
        total = self.sum(g, (dim,), keepdim=True)
        return self._narrow(self.sub(g, self.mul(self.exp(ls), total)), dtype)

    def cross_entropy(self, logits, target, reduction="mean", ignore_index=-100,
                      label_smoothing=0.0, compute_grad=True, metrics=None):
        """Fused softmax cross-entropy over classes: returns (loss, dlogits or None).

        logits: [N, C] float; target: [N] int64/int32 class indices in [0, C) or ignore_index.
        Per row with eps = label_smoothing, lse = logsumexp(x):
            loss = lse - (1 - eps) * x[t] - eps / C * sum(x),  dlogits = softmax(x) - q,
            q = (1 - eps) * onehot(t) + eps / C;  ignored rows give 0 and 0.
        reduction "none": loss [N]; "sum": 0-d; "mean": 0-d divided by the count of rows not
        ignored (dlogits divided likewise, so it is d(loss)/d(logits)). dlogits has logits' dtype;
        loss has logits' dtype. A target outside [0, C) other than ignore_index raises ValueError.
        metrics: None or (loss_total, correct), a training loop's running totals on the device
        (1-element float and int64 arrays, see check_metrics): loss_total += the sum of the row
        losses (whatever the reduction), correct += count_correct_ of the rows; in the same
        kernel where the backend can.
        """
        raise NotImplementedError

    def check_targets(self, target, n_classes, ignore_index=-100, op="nll_loss"):
        """Check class indices: a value of target ([N] int64/int32) outside [0, n_classes),
        other than ignore_index, raises ValueError naming `op` (at the next read of the device
        on backends that check asynchronously)."""
        raise NotImplementedError

    # ---------------------------------------------------------------- convolution and pooling
    def conv2d(self, x, w, bias=None, stride=(1, 1), padding=(0, 0), dilation=(1, 1), groups=1,
               activation=None):
        """Cross-correlation as torch. x: [N, C, H, W], w: [Co, C // groups, kh, kw], bias: [Co].
        Out: [N, Co, Ho, Wo], Ho = (H + 2 ph - dh (kh - 1) - 1) // sh + 1. activation: None or
        "relu" (applied to the output in the same kernel where the backend can)."""
        raise NotImplementedError

    def conv2d_backward(self, dy, x, w, stride=(1, 1), padding=(0, 0), dilation=(1, 1),
                        groups=1, input_grad=True, weight_grad=True, bias_grad=True, gate=None,
                        dw_out=None, db_out=None):
        """(dx, dw, db) of conv2d for dy: [N, Co, Ho, Wo]; an entry is None when not asked for.
        gate (dy's shape and dtype: the output of conv2d with activation="relu"): dy is taken as
        where(gate > 0, dy, 0), relu's backward, applied as dy is read where the backend can.
        dw_out, db_out: contiguous arrays of w's shape (and [Co]) and dtype that dw and db are
        written into and returned as (an optimizer's gradient buffer)."""
        raise NotImplementedError

    def im2col(self, x, kernel_size, stride=(1, 1), padding=(0, 0), dilation=(1, 1)):
        """Sliding windows as columns (torch.nn.functional.unfold).
        x: [N, C, H, W] -> [N, C * kh * kw, Ho * Wo], rows ordered (c, i, j)."""
        raise NotImplementedError

    def col2im(self, cols, output_size, kernel_size, stride=(1, 1), padding=(0, 0),
               dilation=(1, 1)):
        """The adjoint of im2col (torch's fold): overlapping windows are summed.
        cols: [N, C * kh * kw, L] -> [N, C, H, W] with (H, W) = output_size."""
        raise NotImplementedError

    def max_pool2d(self, x, kernel_size, stride, padding=(0, 0), dilation=(1, 1),
                   ceil_mode=False, with_indices=True):
        """(y, indices): y: [N, C, Ho, Wo]; indices int64, the flat index h * W + w in each
        input plane of the first maximum in each window (padding counts as -inf), or None
        when not with_indices (no backward to come: evaluation)."""
        raise NotImplementedError

    def max_pool2d_backward(self, dy, indices, input_shape, kernel_size, stride, padding=(0, 0),
                            dilation=(1, 1), ceil_mode=False, gate=None):
        """dx: [N, C, H, W] of max_pool2d with this geometry, for dy and the forward's indices
        [N, C, Ho, Wo]: each input position gets the sum of dy over the windows that hold it
        and whose index names it (overlapping windows add up), gathered in a fixed order, so
        the same input gives the same bits on every run. gate [N, C, Ho, Wo] or None: only
        the windows where gate > 0 count (the pool's output as relu's gate, where the pool
        follows a relu: relu' at a window's argmax is its maximum > 0)."""
        raise NotImplementedError

    def avg_pool2d(self, x, kernel_size, stride, padding=(0, 0), ceil_mode=False,
                   count_include_pad=True, divisor_override=None):
        """Window means with torch's padding and divisor rules."""
        raise NotImplementedError

    def avg_pool2d_backward(self, dy, input_shape, kernel_size, stride, padding=(0, 0),
                            ceil_mode=False, count_include_pad=True, divisor_override=None):
        raise NotImplementedError

    # ---------------------------------------------------------------- indexing
    def gather_rows(self, x, index):
        """x[index] along dim 0. x: [R, *rest], index: int64/int32 [*I] -> [*I, *rest].
        An index outside [-R, R) raises IndexError; negative indices count from the end."""
        raise NotImplementedError

    def scatter_add_rows(self, src, index, num_rows):
        """The adjoint of gather_rows: out [num_rows, *rest] zeros, out[index[i]] += src[i];
        duplicate indices accumulate."""
        raise NotImplementedError

    # ---------------------------------------------------------------- scans and sorting
    def cumulative(self, x, dim, op, reverse=False, dtype: DType | None = None):
        """Inclusive scan along dim: op "sum", "prod" or "logsumexp" (y[j] = log(sum of
        exp(x[i]) for i <= j)); from the last element back when reverse. Integers and bools
        give int64 for sum and prod unless dtype is given (the result's type)."""
        raise NotImplementedError

    def cumulative_extreme(self, x, dim, largest=True):
        """(values, int64 indices) of the running max (largest) or min along dim, the index of
        its last occurrence so far; NaN propagates (torch.cummax, cummin)."""
        raise NotImplementedError

    def sort(self, x, dim, descending=False, stable=False):
        """(values, int64 indices) sorted along dim, stable (ties keep their order), NaN the
        largest."""
        raise NotImplementedError

    def topk(self, x, k, dim, largest=True, sorted=True):
        """(values, int64 indices) of the first k of sort(x, dim, descending=largest)."""
        raise NotImplementedError

    def gather_along(self, x, index, dim):
        """x[..., index[..., j, ...], ...] along dim (torch.gather, index of x's shape outside
        dim, in range)."""
        raise NotImplementedError

    def scatter_add_along(self, src, index, dim, size):
        """The adjoint of gather_along: zeros with `size` along dim, src added at index."""
    # embeddings and indexing: the index check and the deterministic row scatter
    def index_check(self, index, size, op, wrap):
        """index (int64/int32/uint8, any shape) as a new contiguous int64 array, every value
        checked against a dim of `size`:
        [-size, size) with wrap (negative ones wrapped to value + size), else [0, size). A value
        outside raises IndexError naming `op` (a name in kernels/errors.CHECKS)."""
        raise NotImplementedError

    def scatter_reduce_rows(self, src, index, base, num_rows, reduce, include_self=True,
                            zero_row=-1, op="scatter_reduce"):
        """out[index[i]] = reduce over the src[i] with that index, deterministically (in
        increasing i, no float atomics). src: [*I, *rest], index: int64/int32 [*I] with values in
        [0, num_rows) (else IndexError naming `op`), base: None or [num_rows, *rest] of src's
        dtype -> out [num_rows, *rest]. reduce: "sum", "prod", "mean", "amax", "amin" (NaN
        propagates) or "last" (the largest i wins). A row no index names is base's row (zero
        without a base); include_self folds base's row into a named row's reduction (mean
        counts it once). Row zero_row (if in range) is zero. Integer mean floors."""
        raise NotImplementedError

    # ---------------------------------------------------------------- random numbers
    # Counter-based: element i of a draw uses Philox4x32-10 with key `seed` and counter
    # `offset + i`; both backends compute the same stream, so the same seed gives the same
    # numbers on either (up to float rounding of the transforms).
    def uniform(self, shape, low, high, seed, offset, dtype: DType, device):
        """U[low, high)."""
        raise NotImplementedError

    def normal(self, shape, mean, std, seed, offset, dtype: DType, device):
        """N(mean, std^2) by Box-Muller."""
        raise NotImplementedError

    def dropout(self, x, p, seed, offset):
        """(y, mask): mask bool, True with probability 1 - p; y = x * mask / (1 - p)."""
        raise NotImplementedError

    def randperm(self, n, seed, offset, device):
        """A uniformly drawn permutation of range(n) as int64 [n], computed on the device."""
        raise NotImplementedError

    # ---------------------------------------------------------------- image augmentation
    def random_warp(self, x, out_size, crop, ranges, fill, bilinear, seed, offset):
        """Each image of a batch warped by its own random affine map or crop (the transforms
        RandomAffine, RandomRotation, RandomCrop), all in one pass.

        x: [N, C, H, W] float32/float16/bfloat16 (any strides) -> [N, C, Ho, Wo], x's dtype.
        Sample n draws u0..u3, the uniforms of the four Philox words of counter offset + n, and
        each output pixel (x, y) reads the input at (sx, sy):
        - crop=False, out_size = (H, W), ranges = (deg_lo, deg_hi, max_dx, max_dy, scale_lo,
          scale_hi): angle = deg_lo + (deg_hi - deg_lo) u0 degrees (counter-clockwise as
          seen), whole-pixel shifts tx = floor(max_dx (2 u1 - 1) + 0.5) and ty (from u2),
          scale s = scale_lo + (scale_hi - scale_lo) u3, about the centre c = ((W-1)/2, (H-1)/2):
          (sx, sy) = R(-angle) ((x, y) - c - (tx, ty)) / s + c;
        - crop=True, ranges = (pad_top, pad_left, span_y, span_x): the window of out_size at
          top = floor(u0 (span_y + 1)), left = floor(u1 (span_x + 1)) of the padded image:
          (sx, sy) = (x + left - pad_left, y + top - pad_top).
        bilinear=False reads the nearest pixel (floor(s + 0.5)), True blends the four around
        (sx, sy); positions outside the image read `fill`. Computed in float32
        (reference/augment.py gives the exact order of operations).
        """
        raise NotImplementedError

    # ---------------------------------------------------------------- fused optimizer updates
    # Each updates flat 1-d float32 arrays in place, in one pass. lr (and step for Adam) may be
    # Python numbers or 1-element float32 device arrays (so that a captured step reads the
    # current value at replay).
    def sgd_step_(self, param, grad, momentum_buf, lr, momentum=0.0, dampening=0.0,
                  weight_decay=0.0, nesterov=False, maximize=False, first_step=False,
                  skip=None):
        """g = grad (+ weight_decay * param); with momentum: buf = momentum * buf +
        (1 - dampening) * g (buf = g on the first step); g = g + momentum * buf if nesterov
        else buf; param -= lr * g (+= if maximize). momentum may also be a 1-element device
        array (OneCycleLR cycles it). skip: None, or a 1-element float32 device array: nonzero
        leaves every array as it is (a GradScaler's found-inf, never read by the host)."""
        raise NotImplementedError

    def adam_step_(self, param, grad, exp_avg, exp_avg_sq, step, lr, beta1=0.9, beta2=0.999,
                   eps=1e-8, weight_decay=0.0, decoupled_weight_decay=False, maximize=False,
                   skip=None):
        """Adam (decoupled_weight_decay=False: L2 added to g) or AdamW (param *= 1 - lr * wd):
        m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
        param -= lr * (m / (1 - b1^step)) / (sqrt(v / (1 - b2^step)) + eps). skip as in
        sgd_step_."""
        raise NotImplementedError

    def amp_unscale_(self, arrays, scale, found_inf):
        """Each array (contiguous, floating) *= 1 / scale in place; found_inf (1-element
        float32) is set to 1 if any element was inf or NaN before, else left as it is."""
        raise NotImplementedError

    def amp_update_scale_(self, scale, growth_tracker, found_inf, growth_factor, backoff_factor,
                          growth_interval):
        """GradScaler's update (1-element float32 arrays): after an inf/NaN scale *=
        backoff_factor and growth_tracker = 0; else growth_tracker += 1, and at growth_interval
        scale *= growth_factor (if finite) and growth_tracker = 0. found_inf is cleared."""
        raise NotImplementedError

    # The three below start from g = (-grad if maximize else grad) + weight_decay * param, as
    # torch.optim. `count`: None, or a 1-element float32 device array to which the update adds
    # 1 (the step count torch keeps in state["step"]; the update itself does not read it).
    def adadelta_step_(self, param, grad, square_avg, acc_delta, lr, rho=0.9, eps=1e-6,
                       weight_decay=0.0, maximize=False, count=None):
        """square_avg = rho sa + (1 - rho) g^2; delta = sqrt(acc_delta + eps) /
        sqrt(square_avg + eps) * g; acc_delta = rho ad + (1 - rho) delta^2; param -= lr delta."""
        raise NotImplementedError

    def rmsprop_step_(self, param, grad, square_avg, grad_avg, momentum_buf, lr, alpha=0.99,
                      eps=1e-8, weight_decay=0.0, momentum=0.0, centered=False, maximize=False,
                      count=None):
        """square_avg = alpha sa + (1 - alpha) g^2; centered: grad_avg = lerp(grad_avg, g,
        1 - alpha) and avg = sqrt(square_avg - grad_avg^2) + eps, else avg = sqrt(square_avg)
        + eps; with momentum: buf = momentum buf + g / avg, param -= lr buf; else param -= lr g /
        avg. grad_avg / momentum_buf may be None when not centered / momentum is 0; momentum may
        be a 1-element device array (OneCycleLR cycles it)."""
        raise NotImplementedError

    def adagrad_step_(self, param, grad, state_sum, step, lr, lr_decay=0.0, eps=1e-10,
                      weight_decay=0.0, maximize=False, count=None):
        """clr = lr / (1 + (step - 1) lr_decay); state_sum += g^2;
        param -= clr g / (sqrt(state_sum) + eps). step (this step's 1-based count) is read only
        when lr_decay != 0; count must then be None (count the step before)."""
        raise NotImplementedError

    def total_norm(self, arrays, norm_type=2.0):
        """L_p norm of all elements of all arrays together -> 0-d float32 array. arrays: a
        non-empty sequence of contiguous float arrays on one device; p = 2, 1, inf (max |x|, NaN
        propagates) or any finite p > 0. Deterministic, no host sync."""
        raise NotImplementedError

    def clip_scale_(self, arrays, total_norm, max_norm, eps=1e-6):
        """x *= min(1, max_norm / (total_norm + eps)) in place for each array; total_norm is a
        1-element float32 array read on the device. Returns arrays."""
        raise NotImplementedError


# -------------------------------------------------------------------- the table's primitives
def _table_primitive(op):
    def primitive(self, *operands, out=None):
        return self.elementwise(op, *operands, out=out)
    primitive.__name__ = primitive.__qualname__ = op.name
    primitive.__doc__ = op.doc
    return primitive


for _op in _table.OPS.values():  # backend.exp(x), backend.add(a, b), ... for every entry
    setattr(Backend, _op.name, _table_primitive(_op))


# -------------------------------------------------------------------- registry and selection
# The device of an op's operands picks the backend that runs it: cuda tensors run on the triton
# backend, cpu tensors on the numpy backend, or on the triton backend under Triton's interpreter
# when that is the selected backend on a machine without a GPU (tests). `set_backend` selects the
# backend of the default device (where factory functions put new tensors) and forces the cpu one.
_registry: dict[str, object] = {}
_instances: dict[str, Backend] = {}


class _ThreadState(threading.local):
    """Per-thread settings read on every op: the selected backend, the backends of cpu and cuda
    tensors, and the backend of the op in flight (the selected one outside ops). (Whether
    autodiff records is autodiff's: autodiff/grad_mode.py.)"""

    def __init__(self):
        self.name = self.current = self.cpu = self.cuda = None


_state = _ThreadState()


def register_backend(name: str, factory) -> None:
    """Make `factory()` (a Backend subclass or a callable returning one) selectable as `name`."""
    _registry[name] = factory


def _instance(name: str) -> Backend:
    if name not in _registry:
        raise ValueError(f"unknown backend {name!r}; available: {sorted(_registry)}")
    if name not in _instances:
        _instances[name] = _registry[name]()
    return _instances[name]


def default_backend_name() -> str:
    chosen = os.environ.get("TRITONAD_BACKEND")
    if chosen:
        return chosen
    return "triton" if torch.cuda.is_available() else "numpy"


def _for_type(selected: Backend, device_type: str):
    if device_type in selected.device_types:
        return selected
    for other in ("numpy", "triton") if device_type == "cpu" else ("triton",):
        if other in _registry and device_type in _instance(other).device_types:
            return _instance(other)
    return None


def _select(name: str) -> None:
    selected = _instance(name)
    _state.name, _state.current = name, selected
    _state.cpu, _state.cuda = _for_type(selected, "cpu"), _for_type(selected, "cuda")


def set_backend(name: str) -> None:
    """Select the backend of the default device: "triton" (the GPU, or Triton's interpreter on
    CPU tensors where there is no GPU) or "numpy" (CPU tensors). Ops still run where their
    operands are: cuda tensors on the triton backend, cpu tensors on the numpy backend unless
    the triton interpreter is selected."""
    _select(name)


def get_backend() -> Backend:
    """The backend ops run on now: inside an op, the one its operands' device picked; outside,
    the selected one."""
    current = _state.current
    if current is None:
        _select(default_backend_name())
        current = _state.current
    return current


backend = get_backend


def side_region():
    """The context the engine runs a backward pass in: the GPU backend's (Backend.side_region),
    where there is one."""
    cuda = _state.cuda
    return cuda.side_region() if cuda is not None else _NO_CONTEXT


def backend_for(device) -> Backend:
    """The backend that runs ops on `device` (a torch.device)."""
    if _state.current is None:
        _select(default_backend_name())
    found = _state.cuda if device.type == "cuda" else _state.cpu if device.type == "cpu" \
        else None
    if found is None:
        raise RuntimeError(f"no tritonad backend runs on {device} here (backends: "
                           f"{sorted(_registry)}; cuda tensors need a GPU and the triton "
                           "backend, cpu tensors the numpy backend)")
    return found


def backend_of(raw) -> Backend:
    """The backend that runs ops on a raw array's device (the hot path of Function.apply)."""
    found = _state.cuda if raw.is_cuda else _state.cpu
    return found if found is not None else backend_for(raw.device)


@contextlib.contextmanager
def use_backend(name: str):
    """Run a block on another backend: `with td.use_backend("numpy"): ...`."""
    get_backend()
    saved = _state.name, _state.current, _state.cpu, _state.cuda
    _select(name)
    try:
        yield _instance(name)
    finally:
        _state.name, _state.current, _state.cpu, _state.cuda = saved
