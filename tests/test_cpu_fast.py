"""The fast CPU path (tritonad/cpu_fast.py): float32 convolutions through the DFT, switched on
for these tests only, against the numpy backend's direct convolution (the oracle, which it is
off by default) and torch's float64 convolution.
"""
import importlib
import os

import numpy as np
import pytest
import torch
from helpers import assert_close, random_array

import tritonad as td
from tritonad import cpu_fast
from tritonad.reference import NumpyBackend
from tritonad.reference import from_numpy as raw_from_numpy
from tritonad.reference import to_numpy


def _torch_reference_grads(x, w, b, dy, stride, padding, dilation, groups):
    """torch's float64 convolution and its autograd gradients: an independent oracle."""
    xs, ws, bs = (torch.from_numpy(np.asarray(a, np.float64)).requires_grad_() for a in (x, w, b))
    y = torch.nn.functional.conv2d(xs, ws, bs, stride, padding, dilation, groups)
    y.backward(torch.from_numpy(np.asarray(dy, np.float64)))
    return y.detach(), xs.grad, ws.grad, bs.grad


def test_the_oracle_convolves_directly_by_default():
    """Off by default, so the numpy backend's convolution is the direct one: on integer data
    at the MNIST cnn's second layer (a shape the DFT's cost model takes) its float32 values
    and gradients are exact, zeros included (a relu after it sees no +-1e-6)."""
    if os.environ.get("TRITONAD_NUMPY_FFT_CONV", "0") not in ("", "0"):
        pytest.skip("the fast path is switched on in this environment")
    assert not cpu_fast.DFT_CONV
    rng = np.random.default_rng(10)
    x = np.maximum(rng.integers(-3, 4, (4, 32, 14, 14)), 0)  # relu'd: half zeros
    w, b = rng.integers(-2, 3, (64, 32, 5, 5)), rng.integers(-2, 3, 64)
    dy = rng.integers(-2, 3, (4, 64, 14, 14))
    raw = [raw_from_numpy(a, td.float32) for a in (x, w, b, dy)]
    assert cpu_fast._dft_conv_plan(to_numpy(raw[0]), to_numpy(raw[1]), (1, 1), (2, 2), (1, 1),
                                   1) is not None
    ref = NumpyBackend()
    got = (ref.conv2d(*raw[:3], (1, 1), (2, 2), (1, 1), 1),) + \
        ref.conv2d_backward(raw[3], raw[0], raw[1], (1, 1), (2, 2), (1, 1), 1)
    want = _torch_reference_grads(x, w, b, dy, (1, 1), (2, 2), (1, 1), 1)
    for name, g, e in zip(("y", "dx", "dw", "db"), got, want):
        np.testing.assert_array_equal(to_numpy(g), e.numpy(), err_msg=name)


# ----------------------------------------------------------------------------- the DFT path
# Switched on, float32 convolutions with many channels run through the DFT
# (cpu_fast._DftPlan). Its maths is checked in float64, exact to rounding; the float32 path
# as dispatched against torch's float64 convolution, norm-wise: the largest error of an output
# (y, dx, dw, db) within DFT_TOL of the largest sum of |terms| behind one of its elements. (A
# transform spreads each element's rounding over its plane, so an element whose own terms are
# small has no relative accuracy: the norm-wise bound is the DFT's, not the element-wise one
# of the direct product.)

DFT_TOL = 1e-6
_DFT_GEOMETRIES = [  # x, w, padding
    ((3, 2, 9, 8), (5, 2, 5, 5), (2, 2)),     # the MNIST layers' k5 p2, odd sizes
    ((1, 1, 7, 11), (1, 1, 3, 5), (1, 2)),    # batch 1, one channel in and out
    ((2, 3, 6, 5), (4, 3, 3, 2), (0, 1)),     # no padding along H, even kernel width
    ((2, 4, 5, 7), (3, 4, 4, 4), (3, 1)),     # padding as large as the kernel allows
    ((1, 2, 1, 9), (2, 2, 1, 3), (0, 4)),     # a 1-row image, padding wider than the kernel
    ((3, 5, 4, 4), (6, 5, 4, 4), (0, 0)),     # a 1-pixel output
]


def _normwise_error(got, want, scale):
    return float(np.abs(got.numpy() - want.numpy()).max() / max(float(scale.max()), 1e-30))


def _abs_conv_grads(x, w, b, dy, padding):
    """The sums of |terms| behind y, dx, dw and db: the norm-wise scale of their errors."""
    return _torch_reference_grads(*(np.abs(np.asarray(a, np.float64)) for a in (x, w, b, dy)),
                                  (1, 1), padding, (1, 1), 1)


@pytest.mark.parametrize("xs, ws, padding", _DFT_GEOMETRIES)
def test_dft_maths_in_float64(xs, ws, padding):
    """The DFT plan's forward and its transposes (the gradients) are the padded correlation
    and its gradients exactly (float64: to 1e-12), on every circle _dft_period picks."""
    rng = np.random.default_rng(6)
    x, w, b = rng.standard_normal(xs), rng.standard_normal(ws), rng.standard_normal(ws[0])
    plan = cpu_fast._DftPlan(xs[2:], ws[2:], padding, np.float64)
    y = cpu_fast.conv2d(plan, x, w, b[:, None])
    dy = rng.standard_normal(y.shape)
    dx, dw = cpu_fast.conv2d_backward(plan, dy, x, w, True, True)
    want = _torch_reference_grads(x, w, b, dy, (1, 1), padding, (1, 1), 1)
    for name, g, e in zip(("y", "dx", "dw"), (y, dx, dw), want):
        assert_close(g, e, 1e-12, 1e-12, name=name)


@pytest.fixture
def dft_calls(monkeypatch):
    """The DFT path forced on (any size pays) and its forward and backward calls counted."""
    monkeypatch.setattr(cpu_fast, "DFT_CONV", True)
    monkeypatch.setattr(cpu_fast, "DFT_CONV_GAIN", 0.0)
    calls = []
    for name in ("conv2d", "conv2d_backward"):
        real = getattr(cpu_fast, name)
        monkeypatch.setattr(cpu_fast, name,
                            lambda *a, _real=real, _name=name: calls.append(_name) or _real(*a))
    return calls


def _check_dft_conv(x, w, b, dy, padding, name=""):
    """The numpy backend's float32 conv2d and conv2d_backward (raw float32 arrays, any
    strides) against torch in float64, norm-wise."""
    ref = NumpyBackend()
    got = (ref.conv2d(x, w, b, (1, 1), padding, (1, 1), 1),) + \
        ref.conv2d_backward(dy, x, w, (1, 1), padding, (1, 1), 1)
    exact = [to_numpy(a).astype(np.float64) for a in (x, w, b, dy)]
    want = _torch_reference_grads(*exact, (1, 1), padding, (1, 1), 1)
    scale = _abs_conv_grads(*exact, padding)
    for part, g, e, s in zip(("y", "dx", "dw", "db"), got, want, scale):
        assert g.dtype == torch.float32 and g.shape == e.shape, (name, part)
        assert _normwise_error(g, e, s) < DFT_TOL, (name, part, _normwise_error(g, e, s))


@pytest.mark.parametrize("chunk_bytes", [1, 16 << 20])  # one sample per chunk; all at once
@pytest.mark.parametrize("xs, ws, padding", _DFT_GEOMETRIES)
def test_dft_conv_float32_against_torch(xs, ws, padding, chunk_bytes, dft_calls,
                                                  monkeypatch):
    monkeypatch.setattr(cpu_fast, "DFT_CHUNK_BYTES", chunk_bytes)
    rng = np.random.default_rng(7)
    x, w, b = (raw_from_numpy(rng.standard_normal(s), td.float32) for s in (xs, ws, ws[:1]))
    dy = raw_from_numpy(rng.standard_normal(
        (xs[0], ws[0], xs[2] + 2 * padding[0] - ws[2] + 1, xs[3] + 2 * padding[1] - ws[3] + 1)),
        td.float32)
    _check_dft_conv(x, w, b, dy, padding)
    assert dft_calls == ["conv2d", "conv2d_backward"]


def test_dft_conv_strided_operands(dft_calls):
    """Transposed x, a sliced weight, a strided bias and a stride-0 (expanded) dy."""
    x = random_array((2, 6, 5, 3), low=-1, high=1).permute(0, 3, 1, 2)  # [2, 3, 6, 5]
    w = random_array((4, 3, 3, 5), low=-1, high=1, seed=1)[:, :, :, 1:4]
    b = random_array((8,), seed=2)[::2]
    dy = random_array((1, 4, 1, 1), low=-1, high=1, seed=3).expand(2, 4, 6, 5)
    _check_dft_conv(x, w, b, dy, (1, 1))
    assert dft_calls == ["conv2d", "conv2d_backward"]


def test_dft_conv_empty_batch(dft_calls):
    ref = NumpyBackend()
    x = random_array((0, 3, 6, 5))
    w = random_array((4, 3, 3, 3), seed=1)
    y = ref.conv2d(x, w, None, (1, 1), (1, 1), (1, 1), 1)
    assert tuple(y.shape) == (0, 4, 6, 5)
    dx, dw, db = ref.conv2d_backward(random_array((0, 4, 6, 5)), x, w, (1, 1), (1, 1), (1, 1))
    assert tuple(dx.shape) == (0, 3, 6, 5) and not to_numpy(dw).any() and not to_numpy(db).any()


def test_dft_conv_at_the_mnist_shape_and_on_mnist_like_data(monkeypatch):
    """The cost model sends the MNIST cnn's second layer through the DFT, its first direct.
    On its data (non-negative, half zeros: relu then pooling) and on random data the DFT
    path's norm-wise error stays within DFT_TOL and within 3x the direct path's."""
    rng = np.random.default_rng(8)
    conv1 = np.zeros((100, 1, 28, 28), np.float32), np.zeros((32, 1, 5, 5), np.float32)
    conv2 = np.zeros((100, 32, 14, 14), np.float32), np.zeros((64, 32, 5, 5), np.float32)
    assert cpu_fast._dft_conv_plan(*conv1, (1, 1), (2, 2), (1, 1), 1) is None
    assert cpu_fast._dft_conv_plan(*conv2, (1, 1), (2, 2), (1, 1), 1) is not None
    mnist_like = np.maximum(rng.standard_normal((10, 32, 14, 14)), 0) * 2
    random = rng.uniform(-1, 1, (10, 32, 14, 14))
    w = raw_from_numpy(rng.uniform(-1, 1, (64, 32, 5, 5)) / 28, td.float32)
    b = raw_from_numpy(rng.uniform(-0.1, 0.1, 64), td.float32)
    dy = raw_from_numpy(rng.standard_normal((10, 64, 14, 14)) * 1e-3, td.float32)
    for values in (mnist_like, random):
        x = raw_from_numpy(values, td.float32)
        exact = [to_numpy(a).astype(np.float64) for a in (x, w, b, dy)]
        want, scale = (f(*exact, (1, 1), (2, 2), (1, 1), 1) for f in (
            _torch_reference_grads, lambda *a: _abs_conv_grads(*a[:4], (2, 2))))
        errors = {}
        for on in (True, False):
            monkeypatch.setattr(cpu_fast, "DFT_CONV", on)
            ref = NumpyBackend()
            got = (ref.conv2d(x, w, b, (1, 1), (2, 2), (1, 1), 1),) + \
                ref.conv2d_backward(dy, x, w, (1, 1), (2, 2), (1, 1), 1)
            errors[on] = [_normwise_error(g, e, s) for g, e, s in zip(got[:3], want, scale)]
        for dft, direct in zip(errors[True], errors[False]):
            assert dft < DFT_TOL and dft < 3 * max(direct, 1e-7), errors


@pytest.mark.parametrize("where", ["x", "w", "dy"])
def test_dft_conv_non_finite_values_take_the_direct_path(where, dft_calls,
                                                                   monkeypatch):
    """A NaN or inf would spread over a whole plane in a transform: such calls give the
    direct path's values, NaN and inf where its windows put them."""
    rng = np.random.default_rng(9)
    arrays = {"x": rng.standard_normal((2, 3, 6, 5)), "w": rng.standard_normal((4, 3, 3, 3)),
              "dy": rng.standard_normal((2, 4, 6, 5))}
    arrays[where][(1, 2, 3, 2) if where != "w" else (1, 2, 0, 1)] = np.inf
    arrays[where][(0, 1, 0, 0)] = np.nan
    x, w, dy = (raw_from_numpy(arrays[k], td.float32) for k in ("x", "w", "dy"))
    results = {}
    for on in (True, False):
        monkeypatch.setattr(cpu_fast, "DFT_CONV", on)
        ref = NumpyBackend()
        results[on] = [to_numpy(a) for a in (ref.conv2d(x, w, None, (1, 1), (1, 1), (1, 1), 1),)
                       + ref.conv2d_backward(dy, x, w, (1, 1), (1, 1), (1, 1), 1)]
    first = 1 if where == "dy" else 0  # (with a finite x and w, the forward is the DFT's)
    for got, want in zip(results[True][first:], results[False][first:]):
        np.testing.assert_array_equal(got, want)


def test_dft_conv_backward_reads_the_kernel_it_is_given(dft_calls):
    """The forward keeps its kernel's spectra for the backward, found only by the kernel's
    exact bits: a kernel changed in place since the forward gets its own spectra."""
    ref = NumpyBackend()
    x, w = random_array((2, 3, 6, 5), low=-1, high=1), random_array((4, 3, 3, 3), seed=1)
    dy = random_array((2, 4, 6, 5), low=-1, high=1, seed=2)
    ref.conv2d(x, w, None, (1, 1), (1, 1), (1, 1), 1)
    to_numpy(w)[1, 2, 0, 1] += 1
    got = ref.conv2d_backward(dy, x, w, (1, 1), (1, 1), (1, 1), 1)
    td.reference._WORK.kernel_spectra = None
    want = ref.conv2d_backward(dy, x, w, (1, 1), (1, 1), (1, 1), 1)
    assert all(torch.equal(g, e) for g, e in zip(got, want))


def test_dft_conv_environment_switch(monkeypatch):
    """Off unless TRITONAD_NUMPY_FFT_CONV=1 when the module is imported (re-read here by a
    reload under each value: a subprocess importing tritonad costs ~10 s of CI a value)."""
    try:
        for value, want in (("", False), ("0", False), ("1", True)):
            monkeypatch.setenv("TRITONAD_NUMPY_FFT_CONV", value)
            assert importlib.reload(cpu_fast).DFT_CONV is want
    finally:
        monkeypatch.undo()
        importlib.reload(cpu_fast)


def test_dft_conv_against_the_oracle(dft_calls, monkeypatch):
    """The fast path against the numpy backend's direct convolution on float32 data: the same
    values to DFT_TOL of the largest sum of |terms| (norm-wise; the direct path's own error is
    of that size too)."""
    rng = np.random.default_rng(11)
    x, w, b = (raw_from_numpy(rng.uniform(-1, 1, s), td.float32)
               for s in ((3, 8, 10, 9), (6, 8, 3, 3), (6,)))
    dy = raw_from_numpy(rng.uniform(-1, 1, (3, 6, 10, 9)), td.float32)
    results = {}
    for on in (True, False):
        monkeypatch.setattr(cpu_fast, "DFT_CONV", on)
        ref = NumpyBackend()
        results[on] = (ref.conv2d(x, w, b, (1, 1), (1, 1), (1, 1), 1),) + \
            ref.conv2d_backward(dy, x, w, (1, 1), (1, 1), (1, 1), 1)
    assert dft_calls == ["conv2d", "conv2d_backward"]  # (the oracle's calls did not go there)
    scale = _abs_conv_grads(*(to_numpy(a).astype(np.float64) for a in (x, w, b, dy)), (1, 1))
    for part, fast, oracle, s in zip(("y", "dx", "dw", "db"), results[True], results[False],
                                     scale):
        assert _normwise_error(fast, oracle, s) < DFT_TOL, part
