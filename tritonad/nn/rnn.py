"""Recurrent layers: RNNCell, LSTMCell, GRUCell and the multi-layer RNN, LSTM, GRU.

PyTorch's parameter names, shapes, gate order and initialisation (every weight and bias
~ U(-1/sqrt(hidden_size), 1/sqrt(hidden_size))), so that weights and checkpoints port over. The
maths is in autodiff/rnn_ops.py (composites, and the fused sequence kernels they run on the
triton backend).
"""
from __future__ import annotations

import math
import numbers
import warnings

from .. import dtypes
from ..autodiff import rnn_ops
from ..autodiff.conv_ops import dropout as _dropout
from ..autodiff.shape_ops import cat, stack, unsqueeze
from ..tensor import Tensor, empty
from . import init
from .module import Module
from .parameter import Parameter

__all__ = ["RNNCell", "LSTMCell", "GRUCell", "RNN", "LSTM", "GRU"]

_GATES = {"LSTM": 4, "GRU": 3, "RNN_TANH": 1, "RNN_RELU": 1}


def _size(op, name, value):
    if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"{op}: {name} must be a positive integer, got {value!r}")
    return int(value)


def _nonlinearity(op, nonlinearity):
    if nonlinearity not in ("tanh", "relu"):
        raise ValueError(f"{op}: unknown nonlinearity {nonlinearity!r} (expected 'tanh' or "
                         "'relu')")
    return "RNN_TANH" if nonlinearity == "tanh" else "RNN_RELU"


def _uniform_all(module, hidden_size):
    bound = 1.0 / math.sqrt(hidden_size)
    for p in module.parameters():
        init.uniform_(p, -bound, bound)


# ------------------------------------------------------------------------------ cells


class _CellBase(Module):
    def __init__(self, mode, input_size, hidden_size, bias, device, dtype):
        super().__init__()
        op = type(self).__name__
        self.input_size = _size(op, "input_size", input_size)
        self.hidden_size = _size(op, "hidden_size", hidden_size)
        self.bias = bool(bias)
        self._mode = mode
        rows = _GATES[mode] * self.hidden_size
        dtype = dtype or dtypes.float32
        self.weight_ih = Parameter(empty(rows, self.input_size, dtype=dtype, device=device))
        self.weight_hh = Parameter(empty(rows, self.hidden_size, dtype=dtype, device=device))
        if self.bias:
            self.bias_ih = Parameter(empty(rows, dtype=dtype, device=device))
            self.bias_hh = Parameter(empty(rows, dtype=dtype, device=device))
        else:
            self.bias_ih = self.bias_hh = None
        self.reset_parameters()

    def reset_parameters(self):
        _uniform_all(self, self.hidden_size)

    def extra_repr(self):
        s = f"{self.input_size}, {self.hidden_size}"
        if not self.bias:
            s += ", bias=False"
        if self._mode == "RNN_RELU":
            s += ", nonlinearity='relu'"
        return s

    def _input(self, x, states):
        """(x as [B, I], batched?), checking x and the states ([B, H] or [H] each)."""
        op = type(self).__name__
        if not isinstance(x, Tensor):
            raise TypeError(f"{op}: input must be a tensor, got {type(x).__name__}")
        if x.ndim not in (1, 2):
            raise ValueError(f"{op}: Expected input to be 1D or 2D, got {x.ndim}D instead")
        if x.shape[-1] != self.input_size:
            raise RuntimeError(f"{op}: input has inconsistent input_size: got {x.shape[-1]} "
                               f"expected {self.input_size}")
        batched = x.ndim == 2
        expected = (x.shape[0], self.hidden_size) if batched else (self.hidden_size,)
        for s in states:
            if s is not None and tuple(s.shape) != expected:
                raise RuntimeError(f"{op}: hidden state of shape {tuple(s.shape)} does not match "
                                   f"input of shape {tuple(x.shape)} (expected {expected})")
        if not batched:
            x = unsqueeze(x, 0)
        return x, batched

    def _weights(self):
        return self.weight_ih, self.weight_hh, self.bias_ih, self.bias_hh


class RNNCell(_CellBase):
    """h' = tanh(x W_ih^T + b_ih + h W_hh^T + b_hh) (or relu). x: [B, I] or [I]; hx: [B, H]
    or [H] or None (zeros). weight_ih [H, I], weight_hh [H, H]."""

    def __init__(self, input_size, hidden_size, bias=True, nonlinearity="tanh", device=None,
                 dtype=None):
        super().__init__(_nonlinearity("RNNCell", nonlinearity), input_size, hidden_size, bias,
                         device, dtype)
        self.nonlinearity = nonlinearity

    def forward(self, input, hx=None):
        x, batched = self._input(input, (hx,))
        h = hx if hx is None or batched else unsqueeze(hx, 0)
        cell = rnn_ops.rnn_tanh_cell if self._mode == "RNN_TANH" else rnn_ops.rnn_relu_cell
        h = cell(x, h, *self._weights())
        return h if batched else h.squeeze(0)


class GRUCell(_CellBase):
    """A GRU cell (gates r, z, n; n = tanh(W_in x + b_in + r (W_hn h + b_hn))). x: [B, I] or
    [I]; hx: [B, H] or [H] or None. weight_ih [3H, I], weight_hh [3H, H]."""

    def __init__(self, input_size, hidden_size, bias=True, device=None, dtype=None):
        super().__init__("GRU", input_size, hidden_size, bias, device, dtype)

    def forward(self, input, hx=None):
        x, batched = self._input(input, (hx,))
        h = hx if hx is None or batched else unsqueeze(hx, 0)
        h = rnn_ops.gru_cell(x, h, *self._weights())
        return h if batched else h.squeeze(0)


class LSTMCell(_CellBase):
    """An LSTM cell (gates i, f, g, o). x: [B, I] or [I]; hx: (h, c) each [B, H] or [H], or
    None (zeros). Returns (h', c'). weight_ih [4H, I], weight_hh [4H, H]."""

    def __init__(self, input_size, hidden_size, bias=True, device=None, dtype=None):
        super().__init__("LSTM", input_size, hidden_size, bias, device, dtype)

    def forward(self, input, hx=None):
        if hx is not None and (not isinstance(hx, (tuple, list)) or len(hx) != 2):
            raise TypeError("LSTMCell: hx must be a tuple (h, c) of two tensors, or None")
        h, c = hx if hx is not None else (None, None)
        x, batched = self._input(input, (h, c))
        if not batched and hx is not None:
            h, c = unsqueeze(h, 0), unsqueeze(c, 0)
        h, c = rnn_ops.lstm_cell(x, h, c, *self._weights())
        return (h, c) if batched else (h.squeeze(0), c.squeeze(0))


# ------------------------------------------------------------------------------ layers


class _RNNBase(Module):
    def __init__(self, mode, input_size, hidden_size, num_layers=1, bias=True,
                 batch_first=False, dropout=0.0, bidirectional=False, proj_size=0,
                 device=None, dtype=None):
        super().__init__()
        op = type(self).__name__
        self.mode = mode
        self.input_size = _size(op, "input_size", input_size)
        self.hidden_size = _size(op, "hidden_size", hidden_size)
        self.num_layers = _size(op, "num_layers", num_layers)
        if isinstance(dropout, bool) or not isinstance(dropout, numbers.Number) or \
                not 0 <= dropout <= 1:
            raise ValueError(f"{op}: dropout should be a number in range [0, 1] representing "
                             f"the probability of an element being zeroed, got {dropout!r}")
        if dropout > 0 and self.num_layers == 1:
            warnings.warn(f"{op}: dropout option adds dropout after all but last recurrent "
                          f"layer, so non-zero dropout expects num_layers greater than 1, but "
                          f"got dropout={dropout} and num_layers=1", stacklevel=2)
        if proj_size:
            raise ValueError(f"{op}: proj_size={proj_size} is not supported (LSTM with "
                             "projections); use proj_size=0")
        self.bias = bool(bias)
        self.batch_first = bool(batch_first)
        self.dropout = float(dropout)
        self.bidirectional = bool(bidirectional)
        self.proj_size = 0
        rows = _GATES[mode] * self.hidden_size
        dtype = dtype or dtypes.float32
        directions = 2 if self.bidirectional else 1
        self._names = []
        for layer in range(self.num_layers):
            width = self.input_size if layer == 0 else self.hidden_size * directions
            for direction in range(directions):
                suffix = f"_l{layer}" + ("_reverse" if direction else "")
                names = [f"weight_ih{suffix}", f"weight_hh{suffix}"]
                setattr(self, names[0], Parameter(empty(rows, width, dtype=dtype, device=device)))
                setattr(self, names[1], Parameter(empty(rows, self.hidden_size, dtype=dtype,
                                                        device=device)))
                if self.bias:
                    names += [f"bias_ih{suffix}", f"bias_hh{suffix}"]
                    for name in names[2:]:
                        setattr(self, name, Parameter(empty(rows, dtype=dtype, device=device)))
                self._names.append(names)
        self.reset_parameters()

    def reset_parameters(self):
        _uniform_all(self, self.hidden_size)

    def flatten_parameters(self):
        """Nothing to do (PyTorch's cuDNN weight packing); kept so that ported code runs."""

    @property
    def _flat_weights_names(self):
        return [n for names in self._names for n in names]

    @property
    def all_weights(self):
        return [[getattr(self, n) for n in names] for names in self._names]

    def extra_repr(self):
        s = f"{self.input_size}, {self.hidden_size}"
        if self.num_layers != 1:
            s += f", num_layers={self.num_layers}"
        if self.mode == "RNN_RELU":
            s += ", nonlinearity='relu'"
        if not self.bias:
            s += ", bias=False"
        if self.batch_first:
            s += ", batch_first=True"
        if self.dropout:
            s += f", dropout={self.dropout}"
        if self.bidirectional:
            s += ", bidirectional=True"
        return s

    def _check_input(self, x):
        op = type(self).__name__
        if not isinstance(x, Tensor):
            raise TypeError(f"{op}: input must be a tensor, got {type(x).__name__}")
        if x.ndim not in (2, 3):
            raise ValueError(f"{op}: Expected input to be 2D or 3D, got {x.ndim}D instead")
        if x.shape[-1] != self.input_size:
            raise RuntimeError(f"{op}: input.size(-1) must be equal to input_size. Expected "
                               f"{self.input_size}, got {x.shape[-1]}")
        if x.shape[1 if x.ndim == 3 and self.batch_first else 0] == 0:
            raise ValueError(f"{op}: Expected sequence length to be larger than 0, got input "
                             f"of shape {tuple(x.shape)}")

    def _check_state(self, name, s, batch, batched):
        directions = 2 if self.bidirectional else 1
        expected = (self.num_layers * directions,) + ((batch,) if batched else ()) + \
            (self.hidden_size,)
        if not isinstance(s, Tensor):
            raise TypeError(f"{type(self).__name__}: {name} must be a tensor, got "
                            f"{type(s).__name__}")
        if tuple(s.shape) != expected:
            raise RuntimeError(f"{type(self).__name__}: Expected hidden size {expected}, got "
                               f"{list(s.shape)} ({name}, input "
                               f"{'batched' if batched else 'unbatched'})")
        return s if batched else unsqueeze(s, 1)

    def _run(self, input, h0, c0):
        """(output, h_n, c_n) with the states checked and the layout undone."""
        self._check_input(input)
        batched = input.ndim == 3
        x = input if batched else unsqueeze(input, 1)
        if batched and self.batch_first:
            x = x.transpose(0, 1)
        batch = x.shape[1]
        if h0 is not None:
            h0 = self._check_state("hx" if c0 is None else "h_0", h0, batch, batched)
        if c0 is not None:
            c0 = self._check_state("c_0", c0, batch, batched)
        directions = 2 if self.bidirectional else 1
        hs, cs = [], []
        for layer in range(self.num_layers):
            outputs = []
            for direction in range(directions):
                k = layer * directions + direction
                weights = [getattr(self, n) for n in self._names[k]]
                if not self.bias:
                    weights += [None, None]
                y, h, c = rnn_ops.rnn_layer(x, h0[k] if h0 is not None else None,
                                            c0[k] if c0 is not None else None, *weights,
                                            self.mode, direction == 1)
                outputs.append(y)
                hs.append(h)
                cs.append(c)
            x = cat(outputs, 2) if directions == 2 else outputs[0]
            if self.dropout and self.training and layer < self.num_layers - 1:
                x = _dropout(x, self.dropout, True)
        h_n = stack(hs, 0)
        c_n = stack(cs, 0) if self.mode == "LSTM" else None
        if not batched:
            x, h_n = x.squeeze(1), h_n.squeeze(1)
            c_n = c_n.squeeze(1) if c_n is not None else None
        elif self.batch_first:
            x = x.transpose(0, 1)
        return x, h_n, c_n


class RNN(_RNNBase):
    """Elman RNN: h_t = tanh(x_t W_ih^T + b_ih + h_{t-1} W_hh^T + b_hh) (or relu), layer by
    layer. input: [T, B, I] ([B, T, I] with batch_first, or unbatched [T, I]); hx: [L*D, B, H]
    or None. Returns (output [T, B, D*H], h_n [L*D, B, H])."""

    def __init__(self, input_size, hidden_size, num_layers=1, nonlinearity="tanh", bias=True,
                 batch_first=False, dropout=0.0, bidirectional=False, device=None, dtype=None):
        super().__init__(_nonlinearity("RNN", nonlinearity), input_size, hidden_size,
                         num_layers, bias, batch_first, dropout, bidirectional, 0, device, dtype)
        self.nonlinearity = nonlinearity

    def forward(self, input, hx=None):
        output, h_n, _ = self._run(input, hx, None)
        return output, h_n


class GRU(_RNNBase):
    """Multi-layer GRU (gates r, z, n). input: [T, B, I] ([B, T, I] with batch_first, or
    unbatched [T, I]); hx: [L*D, B, H] or None. Returns (output [T, B, D*H], h_n)."""

    def __init__(self, input_size, hidden_size, num_layers=1, bias=True, batch_first=False,
                 dropout=0.0, bidirectional=False, device=None, dtype=None):
        super().__init__("GRU", input_size, hidden_size, num_layers, bias, batch_first, dropout,
                         bidirectional, 0, device, dtype)

    def forward(self, input, hx=None):
        output, h_n, _ = self._run(input, hx, None)
        return output, h_n


class LSTM(_RNNBase):
    """Multi-layer LSTM (gates i, f, g, o). input: [T, B, I] ([B, T, I] with batch_first, or
    unbatched [T, I]); hx: (h_0, c_0) each [L*D, B, H], or None. Returns
    (output [T, B, D*H], (h_n, c_n)). proj_size > 0 is refused."""

    def __init__(self, input_size, hidden_size, num_layers=1, bias=True, batch_first=False,
                 dropout=0.0, bidirectional=False, proj_size=0, device=None, dtype=None):
        super().__init__("LSTM", input_size, hidden_size, num_layers, bias, batch_first,
                         dropout, bidirectional, proj_size, device, dtype)

    def forward(self, input, hx=None):
        if hx is not None and (not isinstance(hx, (tuple, list)) or len(hx) != 2):
            raise TypeError("LSTM: hx must be a tuple (h_0, c_0) of two tensors, or None")
        h0, c0 = hx if hx is not None else (None, None)
        output, h_n, c_n = self._run(input, h0, c0)
        return output, (h_n, c_n)
