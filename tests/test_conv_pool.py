"""Convolution, relu and max pool as one kernel each way (tritonad/kernels/conv_pool.py),
against the numpy reference backend, which runs conv2d and max_pool2d one after the other
(Backend's default), and against the triton backend's own two primitives.

Integer-valued inputs make every sum exact at every precision (TF32 holds these integers), so
values, indices (ties included: relu's zeros tie often) and gradients are compared to the bit;
random floats are compared within the precision's tolerance.
"""
import dataclasses

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from helpers import assert_close, random_array

import tritonad as td
import tritonad.nn as nn
from tritonad.kernels import conv, conv_pool
from tritonad.reference import NumpyBackend


@pytest.fixture(autouse=True)
def _triton_backend():
    with td.use_backend("triton"):
        yield


def _use(monkeypatch, **changes):
    """conv.Settings with `changes` for the test (restored after it)."""
    from tritonad.kernels.conv import settings
    monkeypatch.setattr(settings, "_current", dataclasses.replace(settings._current, **changes))


def _ints(shape, seed, low=-2, high=3, dtype=td.float32):
    return random_array(shape, td.int64, low=low, high=high, seed=seed).to(dtype.torch)


@pytest.fixture
def launches(monkeypatch):
    """The names of the kernels conv_pool launches itself (not those of the composed path)."""
    names = []
    original = conv_pool.run

    def run(kernel, *args, **kwargs):
        names.append(kernel.__name__ if hasattr(kernel, "__name__") else kernel.fn.__name__)
        return original(kernel, *args, **kwargs)

    monkeypatch.setattr(conv_pool, "run", run)
    return names


# (x shape, weight shape, conv stride, padding, dilation, pool kernel, stride, padding,
# dilation, ceil_mode): MNIST-like, a pool that leaves a ragged edge (ceil_mode), a padded pool,
# strided and dilated convolutions, windows that skip pixels, a 1x1 kernel, a K of two steps
GEOMETRIES = [
    ((2, 1, 12, 12), (8, 1, 5, 5), 1, 2, 1, 2, 2, 0, 1, False),
    ((3, 2, 9, 11), (5, 2, 3, 3), 1, 1, 1, 2, 2, 0, 1, True),
    ((2, 3, 10, 9), (4, 3, 3, 3), 2, 0, 1, 3, 3, 1, 1, False),
    ((1, 1, 7, 8), (3, 1, 2, 2), 1, 1, 2, 2, 3, 1, 1, True),
    ((2, 2, 6, 7), (6, 2, 1, 1), 1, 0, 1, 2, 2, 0, 1, False),
    ((1, 3, 8, 8), (2, 3, 5, 5), 1, 2, 1, 2, 2, 0, 1, False),
    ((2, 1, 9, 9), (3, 1, 3, 3), 1, 1, 1, 2, 3, 0, 2, False),
]


def _args(geometry):
    _, _, s, p, d, pk, ps, pp, pd, ceil = geometry
    pair = lambda v: (v, v)  # noqa: E731
    return pair(s), pair(p), pair(d), 1, pair(pk), pair(ps), pair(pp), pair(pd), ceil


@pytest.mark.parametrize("geometry", GEOMETRIES)
@pytest.mark.parametrize("bias", [True, False])
def test_forward_is_conv_relu_pool_to_the_bit(geometry, bias, launches):
    """Values and indices (first maximum; relu's zeros tie) equal the reference's and the two
    triton primitives', and the fused kernel is what ran."""
    xs, ws = geometry[:2]
    x, w = _ints(xs, 1), _ints(ws, 2)
    b = _ints((ws[0],), 3) if bias else None
    args = _args(geometry)
    p, idx = conv_pool.conv2d_relu_max_pool2d(x, w, b, *args)
    assert launches == ["_conv_relu_pool_kernel"]
    ref = NumpyBackend().conv2d_relu_max_pool2d(
        x.double(), w.double(), None if b is None else b.double(), *args)
    assert p.dtype == x.dtype and idx.dtype == torch.int64
    assert torch.equal(p.double(), ref[0]) and torch.equal(idx, ref[1])
    assert (p == 0).any() and (p > 0).any()
    composed = conv_pool._Composed
    y = composed.conv2d(x, w, b, *args[:4], "relu")
    want = composed.max_pool2d(y, *args[4:])
    assert torch.equal(p, want[0]) and torch.equal(idx, want[1])
    p_only, none = conv_pool.conv2d_relu_max_pool2d(x, w, b, *args, False)
    assert none is None and torch.equal(p_only, p)


def test_forward_nan_and_channel_blocks():
    """A NaN in x reaches the windows that read it (relu keeps NaN; the first NaN of a window
    wins, as max_pool2d's); 130 output channels take two channel blocks."""
    x = _ints((2, 1, 6, 6), 4)
    x[0, 0, 2, 3] = float("nan")
    w, b = _ints((130, 1, 3, 3), 5), _ints((130,), 6)
    args = ((1, 1), (1, 1), (1, 1), 1, (2, 2), (2, 2), (0, 0), (1, 1), False)
    p, idx = conv_pool.conv2d_relu_max_pool2d(x, w, b, *args)
    ref = NumpyBackend().conv2d_relu_max_pool2d(x.double(), w.double(), b.double(), *args)
    assert torch.isnan(p).any()
    np.testing.assert_array_equal(p.double().numpy(), ref[0].numpy())
    assert torch.equal(idx, ref[1])


@pytest.mark.parametrize("dtype", [td.float32, td.float16, td.bfloat16])
def test_forward_random_values(dtype):
    """Random values within the precision's tolerance of the float64 reference, and every
    index names a maximum of its window (near-ties may pick another one)."""
    x = random_array((3, 2, 11, 10), dtype, low=-1, high=1, seed=7)
    w = random_array((6, 2, 3, 3), dtype, low=-1, high=1, seed=8)
    b = random_array((6,), dtype, low=-0.5, high=0.5, seed=9)
    args = ((1, 1), (1, 1), (1, 1), 1, (2, 2), (2, 2), (0, 0), (1, 1), True)
    p, idx = conv_pool.conv2d_relu_max_pool2d(x, w, b, *args)
    ref = NumpyBackend()
    y = ref.conv2d(x.double(), w.double(), b.double(), *args[:4], "relu")
    want, _ = ref.max_pool2d(y, *args[4:])
    tol = {td.float32: (2e-3, 2e-3), td.float16: (4e-3, 4e-3), td.bfloat16: (3e-2, 3e-2)}[dtype]
    assert p.dtype == dtype.torch
    assert_close(p, want, *tol)
    at = y.flatten(2).gather(2, idx.flatten(2)).view(want.shape)
    assert_close(at, want, *tol, name="the value at the index")


@pytest.mark.parametrize("geometry", GEOMETRIES)
@pytest.mark.parametrize("split", [None, 3])
def test_weight_grad_from_the_pool_to_the_bit(geometry, split, monkeypatch, launches):
    """A first layer's weight and bias gradients straight from the pool's gradient, in one or
    three chunks: the reference's (pool backward with the gate, then conv2d_backward), bit for
    bit, each asked for alone or both."""
    _use(monkeypatch, pool_split=split)
    xs, ws = geometry[:2]
    x, w, b = _ints(xs, 1), _ints(ws, 2), _ints((ws[0],), 3)
    args = _args(geometry)
    p, idx = conv_pool.conv2d_relu_max_pool2d(x, w, b, *args)
    dp = _ints(tuple(p.shape), 4, low=-3, high=4)
    ref = NumpyBackend()
    for grads in ((True, True), (True, False), (False, True)):
        launches.clear()
        got = conv_pool.conv2d_relu_max_pool2d_backward(dp, idx, p, x, w, *args, False, *grads)
        assert launches == ["_pooled_wgrad_kernel"]
        want = ref.conv2d_relu_max_pool2d_backward(dp.double(), idx, p.double(), x.double(),
                                                   w.double(), *args, False, *grads)
        assert got[0] is None
        for g, e, asked in zip(got[1:], want[1:], grads):
            assert (g is None) == (not asked) and (e is None) == (not asked)
            if asked:
                assert g.dtype == w.dtype
                assert torch.equal(g.double(), e)


def test_weight_grad_reads_strided_operands_and_writes_into_given_buffers(monkeypatch):
    """Transposed x, a stride-0 (expanded) dp: read in place; dw_out / db_out (an optimizer's
    flat buffer) are written and returned; two runs agree to the bit; the split count does not
    change a bit of these exact sums."""
    x = _ints((2, 13, 12, 1), 5).permute(0, 3, 1, 2)  # [2, 1, 13, 12]
    w, b = _ints((7, 1, 5, 5), 6), _ints((7,), 7)
    args = ((1, 1), (2, 2), (1, 1), 1, (2, 2), (2, 2), (0, 0), (1, 1), False)
    p, idx = conv_pool.conv2d_relu_max_pool2d(x, w, b, *args)
    dp = _ints((1, 7, 1, 1), 8, low=1, high=4).expand(*p.shape)
    want = NumpyBackend().conv2d_relu_max_pool2d_backward(
        dp.double(), idx, p.double(), x.double(), w.double(), *args, False)
    for split in (1, 2, 5):
        _use(monkeypatch, pool_split=split)
        flat = torch.full((w.numel() + 3 + 7,), float("nan"))
        dw_out, db_out = flat[:w.numel()].view(w.shape), flat[w.numel() + 3:]
        got = conv_pool.conv2d_relu_max_pool2d_backward(dp, idx, p, x, w, *args, False, True,
                                                         True, dw_out, db_out)
        assert got[1] is dw_out and got[2] is db_out
        assert torch.isnan(flat[w.numel():w.numel() + 3]).all()
        assert torch.equal(dw_out.double(), want[1]) and torch.equal(db_out.double(), want[2])


def test_weight_grad_skips_the_gradient_where_relu_is_off():
    """Where p <= 0 (relu' = 0), dp is not read: a NaN or inf there does not reach dw or db,
    as in the pool's gated backward."""
    x, w, b = _ints((2, 1, 8, 8), 1), _ints((4, 1, 3, 3), 2), _ints((4,), 3)
    args = ((1, 1), (1, 1), (1, 1), 1, (2, 2), (2, 2), (0, 0), (1, 1), False)
    p, idx = conv_pool.conv2d_relu_max_pool2d(x, w, b, *args)
    dp = _ints(tuple(p.shape), 4)
    assert (p == 0).any()
    poisoned = torch.where(p > 0, dp, torch.full_like(dp, float("nan")))
    got = conv_pool.conv2d_relu_max_pool2d_backward(poisoned, idx, p, x, w, *args, False)
    want = conv_pool.conv2d_relu_max_pool2d_backward(dp, idx, p, x, w, *args, False)
    assert torch.equal(got[1], want[1]) and torch.equal(got[2], want[2])
    assert torch.isfinite(got[1]).all()


@pytest.mark.parametrize("dtype", [td.float16, td.bfloat16])
def test_weight_grad_half_precision(dtype):
    """Half inputs: float32 sums, rounded once into the half-precision gradients."""
    x = random_array((3, 1, 10, 10), dtype, low=-1, high=1, seed=1)
    w = random_array((5, 1, 5, 5), dtype, low=-1, high=1, seed=2)
    b = random_array((5,), dtype, low=-0.5, high=0.5, seed=3)
    args = ((1, 1), (2, 2), (1, 1), 1, (2, 2), (2, 2), (0, 0), (1, 1), False)
    p, idx = conv_pool.conv2d_relu_max_pool2d(x, w, b, *args)
    dp = random_array(tuple(p.shape), dtype, low=-1, high=1, seed=4)
    got = conv_pool.conv2d_relu_max_pool2d_backward(dp, idx, p, x, w, *args, False)
    want = NumpyBackend().conv2d_relu_max_pool2d_backward(
        dp.double(), idx, p.double(), x.double(), w.double(), *args, False)
    tol = 1e-2 if dtype is td.float16 else 3e-2
    for g, e in zip(got[1:], want[1:]):
        assert g.dtype == dtype.torch
        assert_close(g, e, tol, tol * float(e.abs().max()))


@pytest.mark.parametrize("case", ["input grad", "16 channels", "overlapping windows",
                                  "groups", "switched off"])
def test_other_cases_take_the_two_primitives(case, monkeypatch, launches):
    """Where the fused kernels do not apply, the results are the composition's, and no fused
    kernel runs: an input gradient asked for, channel-inner inputs, windows that overlap,
    groups, and conv.Settings.pool_fuse = False."""
    c, pool_geometry, groups, input_grad = 2, ((2, 2), (2, 2)), 1, False
    if case == "input grad":
        input_grad = True
    elif case == "16 channels":
        c = conv.current_settings().channel_inner_min
    elif case == "overlapping windows":
        pool_geometry = ((3, 3), (2, 2))
    elif case == "groups":
        c, groups = 4, 2
    else:
        _use(monkeypatch, pool_fuse=False)
    x, w, b = _ints((2, c, 7, 6), 1), _ints((4, c // groups, 3, 3), 2), _ints((4,), 3)
    args = ((1, 1), (1, 1), (1, 1), groups) + pool_geometry + ((0, 0), (1, 1), False)
    p, idx = conv_pool.conv2d_relu_max_pool2d(x, w, b, *args)
    dp = _ints(tuple(p.shape), 4)
    got = conv_pool.conv2d_relu_max_pool2d_backward(dp, idx, p, x, w, *args, input_grad)
    ref = NumpyBackend()
    want_p, want_idx = ref.conv2d_relu_max_pool2d(x.double(), w.double(), b.double(), *args)
    want = ref.conv2d_relu_max_pool2d_backward(dp.double(), want_idx, want_p, x.double(),
                                               w.double(), *args, input_grad)
    assert torch.equal(p.double(), want_p) and torch.equal(idx, want_idx)
    for g, e in zip(got, want):
        assert (g is None) == (e is None)
        if g is not None:
            assert torch.equal(g.double(), e)
    fused = [n for n in launches if n in ("_conv_relu_pool_kernel", "_pooled_wgrad_kernel")]
    expect = {"input grad": ["_conv_relu_pool_kernel"]}.get(case, [])
    assert fused == expect


def test_an_empty_batch_gives_zero_gradients():
    x, w, b = torch.zeros(0, 1, 8, 8), _ints((4, 1, 3, 3), 2), _ints((4,), 3)
    x = x.to(w.device)
    args = ((1, 1), (1, 1), (1, 1), 1, (2, 2), (2, 2), (0, 0), (1, 1), False)
    p, idx = conv_pool.conv2d_relu_max_pool2d(x, w, b, *args)
    assert p.shape == (0, 4, 4, 4) and idx.shape == (0, 4, 4, 4)
    _, dw, db = conv_pool.conv2d_relu_max_pool2d_backward(p, idx, p, x, w, *args, False)
    assert torch.equal(dw, torch.zeros_like(w)) and torch.equal(db, torch.zeros_like(b))


def test_bad_arguments_are_named_errors():
    x, w = _ints((2, 1, 8, 8), 1), _ints((4, 1, 3, 3), 2)
    args = ((1, 1), (1, 1), (1, 1), 1, (2, 2), (2, 2), (0, 0), (1, 1), False)
    p, idx = conv_pool.conv2d_relu_max_pool2d(x, w, None, *args)
    op = "conv2d_relu_max_pool2d_backward"
    with pytest.raises(ValueError, match=f"{op}: dp \\(2, 4, 3, 3\\) does not match"):
        conv_pool.conv2d_relu_max_pool2d_backward(p[:, :, :3, :3], idx, p, x, w, *args, False)
    with pytest.raises(TypeError, match=f"{op}: indices must be int64"):
        conv_pool.conv2d_relu_max_pool2d_backward(p, idx.float(), p, x, w, *args, False)
    with pytest.raises(ValueError, match="conv2d_relu_max_pool2d: bias \\(3,\\) does not match"):
        conv_pool.conv2d_relu_max_pool2d(x, w, torch.zeros(3), *args)
    with pytest.raises(TypeError, match="conv2d_relu_max_pool2d: expected arrays of one dtype"):
        conv_pool.conv2d_relu_max_pool2d(x, w.double(), None, *args)


@given(data=st.data())
@settings(max_examples=15, deadline=None)
def test_fused_layer_matches_the_reference(data):
    """Random geometry through the autodiff node (nn.Sequential's fusion), with x not
    requiring a gradient (a first layer: the fused backward too): the pooled values and the
    weight and bias gradients of the two triton primitives and of the numpy backend (the
    composed default over its direct convolution) to the bit on integer data."""
    k = data.draw(st.sampled_from([1, 2, 3, 5]), "k")
    pad = data.draw(st.integers(0, k // 2), "padding")
    stride = data.draw(st.sampled_from([1, 2]), "stride")
    pk = data.draw(st.sampled_from([1, 2, 3]), "pool")
    ps = data.draw(st.integers(pk, pk + 1), "pool stride")
    ceil = data.draw(st.booleans(), "ceil_mode")
    size = data.draw(st.integers(max(k, pk * stride + k - 1 - 2 * pad), 11), "size")
    c, co = data.draw(st.sampled_from([1, 3]), "c"), data.draw(st.sampled_from([1, 5]), "co")
    x = _ints((2, c, size, size + 1), 11).numpy()
    w, b = _ints((co, c, k, k), 12).numpy(), _ints((co,), 13).numpy()
    results = []
    for backend, fuse in (("triton", True), ("triton", False), ("numpy", True)):
        with td.use_backend(backend), conv.using(pool_fuse=fuse):
            layer = nn.Sequential(nn.Conv2d(c, co, k, stride=stride, padding=pad),
                                  nn.ReLU(), nn.MaxPool2d(pk, ps, ceil_mode=ceil))
            with td.no_grad():
                layer[0].weight.copy_(td.tensor(w))
                layer[0].bias.copy_(td.tensor(b))
            out = layer(td.tensor(x))
            assert out.grad_fn.name == "Conv2dReluMaxPool2dBackward"
            cot = td.tensor(_ints(tuple(out.shape), 14).numpy())
            (out * cot).sum().backward()
            results.append([out.numpy(), layer[0].weight.grad.numpy(),
                            layer[0].bias.grad.numpy()])
    for fused, two, ref in zip(*results):
        np.testing.assert_array_equal(fused, two)
        np.testing.assert_array_equal(fused, ref)


# ----------------------------------------------------------------------------- GPU


def _torch_reference(x, w, b, dp, args):
    """float64 torch: conv2d, relu, max_pool2d with indices, and the weight and bias gradients
    for dp."""
    xs, ws, bs = (t.detach().double().requires_grad_() for t in (x, w, b))
    stride, padding, dilation, _, kernel, pstride, ppad, pdil, ceil = args
    y = torch.relu(torch.nn.functional.conv2d(xs, ws, bs, stride, padding, dilation))
    p, idx = torch.nn.functional.max_pool2d(y, kernel, pstride, ppad, pdil, ceil, True)
    p.backward(dp.double())
    return y.detach(), p.detach(), idx, ws.grad, bs.grad


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [
    ((100, 1, 28, 28), (32, 1, 5, 5), 2),     # MNIST conv1
    ((256, 3, 32, 32), (64, 3, 5, 5), 2),     # a CIFAR-sized first layer: K of 75
    ((64, 1, 28, 28), (150, 1, 3, 3), 1),     # two channel blocks
])
@pytest.mark.parametrize("dtype, precision", [(torch.float32, "high"), (torch.float32, "highest"),
                                              (torch.bfloat16, "high"), (torch.float16, "high")])
def test_gpu_fused_first_layer(shape, dtype, precision):
    """At real sizes on the GPU, against float64 torch: the pooled values within the
    precision's error; every index names its window's maximum; the weight and bias gradients
    from dp (relative error, norm-wise: 1e-5 at float32 accuracy, else 1e-2), and the same
    values as the pool's backward followed by conv2d_backward given the same indices."""
    xs, ws, pad = shape
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = (torch.rand(xs, device="cuda", generator=gen) * 2 - 1).to(dtype)
    w = ((torch.rand(ws, device="cuda", generator=gen) * 2 - 1) / (ws[1] * 25) ** 0.5).to(dtype)
    b = (torch.rand(ws[0], device="cuda", generator=gen) - 0.5).to(dtype)
    args = ((1, 1), (pad, pad), (1, 1), 1, (2, 2), (2, 2), (0, 0), (1, 1), False)
    td.set_conv_precision(precision)
    try:
        p, idx = conv_pool.conv2d_relu_max_pool2d(x, w, b, *args)
        dp = (torch.rand(p.shape, device="cuda", generator=gen) * 2 - 1).to(dtype)
        got = conv_pool.conv2d_relu_max_pool2d_backward(dp, idx, p, x, w, *args, False)
        composed = conv_pool._Composed
        dy = composed.max_pool2d_backward(dp, idx, (xs[0], ws[0]) + xs[2:], *args[4:], p)
        alone = composed.conv2d_backward(dy, x, w, *args[:4], False)
    finally:
        td.set_conv_precision("high")
    y, want_p, _, dw, db = _torch_reference(x, w, b, dp, args)
    limit = 1e-5 if precision == "highest" else 1e-2
    assert (p == 0).any() and (p > 0).any()
    assert _relative_error(p, want_p) < limit
    at = y.flatten(2).gather(2, idx.flatten(2)).view(p.shape)
    assert _relative_error(p, at) < limit  # (the value at each index is its window's max)
    ours = torch.zeros_like(y).flatten(2).scatter_(2, idx.flatten(2),
                                                   torch.where(p > 0, dp, 0).double().flatten(2))
    xs64, ws64 = x.double().requires_grad_(), w.double().requires_grad_()
    torch.nn.functional.conv2d(xs64, ws64, None, 1, pad).backward(ours.view(y.shape))
    for name, g, e in (("dw", got[1], ws64.grad), ("db", got[2], ours.sum((0, 2))),
                       ("dw composed", alone[1], ws64.grad)):
        assert g.dtype == dtype
        assert _relative_error(g, e) < limit, (name, _relative_error(g, e))
    loose = 0.05 if dtype == torch.float32 else 0.2  # (torch's argmax of float64 values:
    assert _relative_error(got[1], dw) < loose      # near-ties may differ, most in half types)
    assert _relative_error(got[2], db) < loose


def _relative_error(got, want):
    return float((got.double() - want.double()).norm() / want.double().norm().clamp_min(1e-30))
