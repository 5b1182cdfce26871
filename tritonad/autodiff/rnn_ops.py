"""Recurrent cells and layers: LSTM, GRU and Elman RNN (tanh or relu), PyTorch's gate order.

Each is a composite over Tensor ops (linear, sigmoid, tanh: the oracle, and what the numpy
backend runs); the triton backend runs one recurrent layer and direction over a whole sequence
as the fused primitive `rnn_sequence` (kernels/rnn.py: the input projection of all steps as
one matmul, then one launch per step fusing the small recurrent GEMM with the gate maths; its
backward one launch per step and the weight gradients as big matmuls). A cell is that with
one step.

    lstm_cell(x [B, I], h [B, H], c [B, H], w_ih [4H, I], w_hh [4H, H], b_ih, b_hh) -> (h', c')
    rnn_layer(x [T, B, I], h0, c0, w_ih, w_hh, b_ih, b_hh, mode, reverse) -> (y, h_n, c_n)
"""
from __future__ import annotations

from .. import dtypes
from ..backend import backend_of
from ..tensor import Tensor
from .autocast import low, state as _autocast
from .composite import composite
from .function import Function
from .nn_ops import linear
from .shape_ops import stack, unsqueeze

__all__ = ["lstm_cell", "gru_cell", "rnn_tanh_cell", "rnn_relu_cell", "rnn_layer", "MODES"]

MODES = ("LSTM", "GRU", "RNN_TANH", "RNN_RELU")


# ------------------------------------------------------------------------------ composites


def _state(x, h, w_hh):
    """h, or zeros [B, H] for None (as PyTorch: W_hh still gets its (zero) gradient)."""
    return h if h is not None else x.new_zeros((x.shape[0], w_hh.shape[1]))


@composite
def lstm_cell(x, h, c, w_ih, w_hh, b_ih=None, b_hh=None):
    """(h', c') of an LSTM cell: gates = x W_ih^T + b_ih + h W_hh^T + b_hh, split as
    (i, f, g, o); c' = sigmoid(f) c + sigmoid(i) tanh(g), h' = sigmoid(o) tanh(c').
    x: [B, I], h, c: [B, H] or None (zeros)."""
    if _autocast.dtype:
        x, h, c, w_ih, w_hh, b_ih, b_hh = low(x, h, c, w_ih, w_hh, b_ih, b_hh)
    h = _state(x, h, w_hh)
    gates = linear(x, w_ih, b_ih) + linear(h, w_hh, b_hh)
    i, f, g, o = gates.chunk(4, 1)
    i, f, g, o = i.sigmoid(), f.sigmoid(), g.tanh(), o.sigmoid()
    c = i * g if c is None else f * c + i * g
    return o * c.tanh(), c


@composite
def gru_cell(x, h, w_ih, w_hh, b_ih=None, b_hh=None):
    """h' of a GRU cell: r = sigmoid(W_ir x + b_ir + W_hr h + b_hr), z likewise,
    n = tanh(W_in x + b_in + r (W_hn h + b_hn)), h' = (1 - z) n + z h. h: [B, H] or None."""
    if _autocast.dtype:
        x, h, w_ih, w_hh, b_ih, b_hh = low(x, h, w_ih, w_hh, b_ih, b_hh)
    h = _state(x, h, w_hh)
    gi_r, gi_z, gi_n = linear(x, w_ih, b_ih).chunk(3, 1)
    gh_r, gh_z, gh_n = linear(h, w_hh, b_hh).chunk(3, 1)
    r = (gi_r + gh_r).sigmoid()
    z = (gi_z + gh_z).sigmoid()
    n = (gi_n + r * gh_n).tanh()
    return (1.0 - z) * n + z * h


def _elman(x, h, w_ih, w_hh, b_ih, b_hh):
    if _autocast.dtype:
        x, h, w_ih, w_hh, b_ih, b_hh = low(x, h, w_ih, w_hh, b_ih, b_hh)
    return linear(x, w_ih, b_ih) + linear(_state(x, h, w_hh), w_hh, b_hh)


@composite
def rnn_tanh_cell(x, h, w_ih, w_hh, b_ih=None, b_hh=None):
    """h' = tanh(x W_ih^T + b_ih + h W_hh^T + b_hh). h: [B, H] or None (zeros)."""
    return _elman(x, h, w_ih, w_hh, b_ih, b_hh).tanh()


@composite
def rnn_relu_cell(x, h, w_ih, w_hh, b_ih=None, b_hh=None):
    """h' = relu(x W_ih^T + b_ih + h W_hh^T + b_hh). h: [B, H] or None (zeros)."""
    return _elman(x, h, w_ih, w_hh, b_ih, b_hh).relu()


def _cell(mode, x, h, c, w_ih, w_hh, b_ih, b_hh):
    """(h', c') of one step of `mode` (c' None but for LSTM), composed."""
    if mode == "LSTM":
        return lstm_cell.composed(x, h, c, w_ih, w_hh, b_ih, b_hh)
    if mode == "GRU":
        return gru_cell.composed(x, h, w_ih, w_hh, b_ih, b_hh), None
    cell = rnn_tanh_cell if mode == "RNN_TANH" else rnn_relu_cell
    return cell.composed(x, h, w_ih, w_hh, b_ih, b_hh), None


@composite
def rnn_layer(x, h0, c0, w_ih, w_hh, b_ih, b_hh, mode, reverse=False):
    """One recurrent layer in one direction over a sequence: (y [T, B, H], h_n [B, H], c_n
    [B, H] for LSTM, else None). x: [T, B, I]; h0, c0: [B, H] or None (zeros); reverse: run
    from the last step to the first (y stays in time order). Under autocast, in its lower
    precision, as PyTorch's recurrent layers."""
    if _autocast.dtype:
        x, h0, c0, w_ih, w_hh, b_ih, b_hh = low(x, h0, c0, w_ih, w_hh, b_ih, b_hh)
    T = x.shape[0]
    h, c = h0, c0
    outputs = [None] * T
    for step in range(T):
        t = T - 1 - step if reverse else step
        h, c = _cell(mode, x[t], h, c, w_ih, w_hh, b_ih, b_hh)
        outputs[t] = h
    return stack(outputs, 0), h, c


# ------------------------------------------------------------------------------ fused


def _distinct(*arrays):
    """The arrays, each object at most once (a repeat becomes a new view of it): a recorded
    plan tells its arrays apart by identity, so one replayed for (h, h) would read h for both
    in a later call with (h, c)."""
    seen = set()
    out = []
    for a in arrays:
        if a is not None and id(a) in seen:
            a = a.view(a.shape)
        elif a is not None:
            seen.add(id(a))
        out.append(a)
    return out


class RNNSequence(Function):
    """rnn_layer as the backend's fused primitive: forward rnn_sequence, backward
    rnn_sequence_backward (dedicated kernels: once differentiable). Saves the input, the
    weights, the state sequences and the gate activations."""
    once_differentiable = True

    @staticmethod
    def forward(ctx, x, h0, c0, w_ih, w_hh, b_ih, b_hh, mode, reverse):
        backend = backend_of(x)
        save = any(ctx.needs_input_grad)
        hs, cs, acts = backend.rnn_sequence(*_distinct(x, h0, c0, w_ih, w_hh, b_ih, b_hh),
                                            mode, reverse, save)
        T = x.shape[0]
        last = 0 if reverse else T
        y = hs[1:] if not reverse else hs[:T]
        ctx.mode, ctx.reverse = mode, reverse
        ctx.save_for_backward(x, w_ih, w_hh, hs, cs, acts)
        return y, hs[last], cs[last] if cs is not None else None

    @staticmethod
    def backward(ctx, dy, dh_n, dc_n):
        x, w_ih, w_hh, hs, cs, acts = ctx.saved
        raw = [None if g is None or g._constant() == 0 else g._data for g in (dy, dh_n, dc_n)]
        needs = tuple(ctx.needs_input_grad[:7])
        arrays = _distinct(*raw, x._data, w_ih._data, w_hh._data, hs._data,
                           cs._data if cs is not None else None,
                           acts._data if acts is not None else None)
        grads = backend_of(x._data).rnn_sequence_backward(*arrays, ctx.mode, ctx.reverse, needs)
        return tuple(Tensor._wrap(g) if g is not None and need else None
                     for g, need in zip(grads, needs)) + (None, None)


@rnn_layer.fused("rnn_sequence")
def _(x, h0, c0, w_ih, w_hh, b_ih, b_hh, mode, reverse=False):
    if _autocast.dtype:
        x, h0, c0, w_ih, w_hh, b_ih, b_hh = low(x, h0, c0, w_ih, w_hh, b_ih, b_hh)
    if x.dtype == dtypes.float64:  # (the kernels compute in float32)
        return rnn_layer.composed(x, h0, c0, w_ih, w_hh, b_ih, b_hh, mode, reverse)
    return RNNSequence.apply(x.contiguous(), h0, c0, w_ih, w_hh, b_ih, b_hh, mode, reverse)


@lstm_cell.fused("rnn_sequence")
def _(x, h, c, w_ih, w_hh, b_ih=None, b_hh=None):
    if _autocast.dtype:
        x, h, c, w_ih, w_hh, b_ih, b_hh = low(x, h, c, w_ih, w_hh, b_ih, b_hh)
    if x.dtype == dtypes.float64:
        return lstm_cell.composed(x, h, c, w_ih, w_hh, b_ih, b_hh)
    _, h, c = RNNSequence.apply(unsqueeze(x, 0).contiguous(), h, c, w_ih, w_hh, b_ih, b_hh,
                                "LSTM", False)
    return h, c


def _fused_cell(mode, cell):
    def fused(x, h, w_ih, w_hh, b_ih=None, b_hh=None):
        if _autocast.dtype:
            x, h, w_ih, w_hh, b_ih, b_hh = low(x, h, w_ih, w_hh, b_ih, b_hh)
        if x.dtype == dtypes.float64:
            return cell.composed(x, h, w_ih, w_hh, b_ih, b_hh)
        return RNNSequence.apply(unsqueeze(x, 0).contiguous(), h, None, w_ih, w_hh, b_ih, b_hh,
                                 mode, False)[1]
    return fused


gru_cell.fused("rnn_sequence")(_fused_cell("GRU", gru_cell))
rnn_tanh_cell.fused("rnn_sequence")(_fused_cell("RNN_TANH", rnn_tanh_cell))
rnn_relu_cell.fused("rnn_sequence")(_fused_cell("RNN_RELU", rnn_relu_cell))
