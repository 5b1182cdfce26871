"""Pooling kernels (tritonad/kernels/pool.py): max and average pooling, forward and backward,
against the numpy reference backend; the reference itself checked against torch's CPU pooling.
"""
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from helpers import assert_close, check_op, check_primitive, random_array

import tritonad as td
import tritonad.nn.functional as F
from tritonad.kernels import launch, plans, pool
from tritonad.reference import NumpyBackend, to_numpy

# ----------------------------------------------------------------------------- references
# The numpy reference backend is the oracle; torch's CPU pooling (an independent
# implementation) checks it here, including its divisor and ceil_mode rules.


def torch_max_pool(x, kernel, stride, padding, dilation, ceil_mode):
    return torch.nn.functional.max_pool2d(x, kernel, stride, padding, dilation, ceil_mode,
                                          return_indices=True)


def torch_avg_pool(x, kernel, stride, padding, ceil_mode, count_include_pad, divisor_override):
    return torch.nn.functional.avg_pool2d(x, kernel, stride, padding, ceil_mode,
                                          count_include_pad, divisor_override)


@pytest.fixture(autouse=True)
def _triton_backend():
    with td.use_backend("triton"):
        yield


@st.composite
def pool_geometry(draw, dilation=True):
    """Kernel 1..4, stride 1..3, padding up to half the kernel (torch's rule), dilation 1..2,
    sizes 1..13."""
    kernel = (draw(st.sampled_from([1, 2, 3, 4])), draw(st.sampled_from([1, 2, 3])))
    stride = (draw(st.sampled_from([1, 2, 3])), draw(st.sampled_from([1, 2])))
    dil = (draw(st.sampled_from([1, 2])), 1) if dilation else (1, 1)
    padding = tuple(draw(st.sampled_from(list(range(k // 2 + 1)))) for k in kernel)
    size = tuple(max(draw(st.sampled_from([1, 2, 5, 8, 13])), d * (k - 1) + 1 - 2 * p)
                 for k, d, p in zip(kernel, dil, padding))
    return kernel, stride, padding, dil, size, draw(st.booleans())


# ----------------------------------------------------------------------------- the oracle


@given(geo=pool_geometry())
@settings(max_examples=25)
def test_reference_pooling_agrees_with_torch(geo):
    kernel, stride, padding, dilation, size, ceil_mode = geo
    rng = np.random.default_rng(0)
    x = torch.from_numpy(rng.integers(-2, 3, (2, 2) + size).astype(np.float64))  # many ties
    ref = NumpyBackend()
    y, idx = ref.max_pool2d(x, kernel, stride, padding, dilation, ceil_mode)
    ty, tidx = torch_max_pool(x, kernel, stride, padding, dilation, ceil_mode)
    assert_close(y, ty, 0, 0)
    real = idx >= 0  # a dilated window can lie wholly in the padding: -1 here, junk in torch
    assert torch.equal(idx[real], tidx[real])
    tidx = torch.where(real, tidx, 0)
    dy = torch.from_numpy(rng.standard_normal(tuple(y.shape))) * real
    assert_close(ref.max_pool2d_backward(dy, idx, x.shape, kernel, stride, padding, dilation,
                                         ceil_mode),
                 torch.ops.aten.max_pool2d_with_indices_backward(
                     dy, x, kernel, stride, padding, dilation, ceil_mode, tidx), 1e-12, 1e-12)
    for include, override in ((True, None), (False, None), (True, 3)):
        ya = ref.avg_pool2d(x, kernel, stride, padding, ceil_mode, include, override)
        assert_close(ya, torch_avg_pool(x, kernel, stride, padding, ceil_mode, include, override),
                     1e-12, 1e-12)


def test_reference_avg_pool_gradient_matches_finite_differences():
    from tritonad.autodiff import gradcheck

    rng = np.random.default_rng(1)
    with td.use_backend("numpy"):
        x = td.tensor(rng.standard_normal((1, 2, 5, 4)), dtype=td.float64, requires_grad=True)
        gradcheck(lambda x: F.avg_pool2d(x, 3, 2, 1, ceil_mode=True, count_include_pad=False),
                  (x,))
        gradcheck(lambda x: F.max_pool2d(x, (2, 3), (1, 2), (1, 1)), (x,))


# ----------------------------------------------------------------------------- max pooling


@given(geo=pool_geometry(), batch=st.sampled_from([(1, 1), (2, 3)]))
def test_max_pool_matches_reference(geo, batch):
    """Values drawn from {-2..2} so windows are full of ties: the first maximum must win."""
    kernel, stride, padding, dilation, size, ceil_mode = geo
    x = random_array(batch + size, low=-2, high=3, seed=1)
    x = x.round()
    y, idx = check_primitive("max_pool2d", x, kernel, stride, padding, dilation, ceil_mode)
    dy = random_array(tuple(y.shape), seed=2)
    check_primitive("max_pool2d_backward", dy, idx, tuple(x.shape), kernel, stride, padding,
                    dilation, ceil_mode)


# Windows that tile the plane (kernel = stride, no dilation) take the backward's one-window
# path: padding, ceil_mode's partial last window, rows and columns in no window, and ties.
@pytest.mark.parametrize("kernel, padding, size, ceil_mode", [
    ((2, 2), (0, 0), (28, 28), False), ((2, 2), (1, 1), (7, 9), True),
    ((3, 2), (1, 0), (8, 5), False), ((3, 3), (0, 1), (10, 11), True),
    ((1, 1), (0, 0), (3, 4), False)])
def test_max_pool_backward_of_tiling_windows(kernel, padding, size, ceil_mode):
    x = random_array((2, 3) + size, low=-2, high=3, seed=6).round()
    args = (kernel, kernel, padding, (1, 1), ceil_mode)
    y, idx = check_primitive("max_pool2d", x, *args)
    dx = check_primitive("max_pool2d_backward", random_array(tuple(y.shape), seed=7), idx,
                         tuple(x.shape), *args)
    assert int((dx != 0).sum()) == int((idx >= 0).sum())  # one position per window, no more


def test_max_pool_nan_and_infinities():
    """A NaN is the maximum of its window (the first NaN); an all -inf window points at its
    first real element, never at padding."""
    x = torch.full((1, 1, 4, 5), float("-inf"))
    x[0, 0, 1, 3] = float("nan")
    x[0, 0, 1, 4] = float("nan")
    x[0, 0, 3, 0] = 2.0
    for args in (((2, 2), (2, 2), (1, 1), (1, 1), True), ((3, 3), (1, 1), (1, 1), (1, 1), False)):
        y, idx = check_primitive("max_pool2d", x, *args)
        assert (idx >= 0).all() and (idx < 20).all()
        check_primitive("max_pool2d_backward", random_array(tuple(y.shape)), idx, tuple(x.shape),
                        *args)


def test_max_pool_window_wholly_in_padding():
    """Dilation 2 over a 1-row input with padding 1: the window holds padding only."""
    x = random_array((1, 2, 1, 3), seed=3)
    y, idx = check_primitive("max_pool2d", x, (2, 1), (1, 1), (1, 0), (2, 1), False)
    assert (idx == -1).all() and (y == float("-inf")).all()
    dx = check_primitive("max_pool2d_backward", random_array(tuple(y.shape)), idx, (1, 2, 1, 3),
                         (2, 1), (1, 1), (1, 0), (2, 1), False)
    assert (dx == 0).all()


def test_max_pool_overlapping_windows_accumulate():
    x = random_array((2, 3, 7, 6), low=-1, high=2, seed=4).round()
    y, idx = pool.max_pool2d(x, (3, 3), (1, 1), (1, 1))
    dy = random_array(tuple(y.shape), seed=5)
    dx = check_primitive("max_pool2d_backward", dy, idx, tuple(x.shape), (3, 3), (1, 1), (1, 1))
    assert_close(dx.double().sum(), dy.double().sum(), 1e-6, 1e-6, name="total gradient")


@pytest.mark.parametrize("dtype", [td.float16, td.bfloat16, td.float64])
def test_max_pool_dtypes(dtype):
    x = random_array((2, 3, 6, 6), dtype, seed=6)
    y, idx = check_primitive("max_pool2d", x, (2, 2), (2, 2), (0, 0), (1, 1), False)
    assert y.dtype == x.dtype and idx.dtype == torch.int64
    check_primitive("max_pool2d_backward", random_array(tuple(y.shape), dtype), idx, (2, 3, 6, 6),
                    (2, 2), (2, 2))


def test_max_pool_strided_operands():
    x = random_array((5, 6, 2, 3), seed=7).permute(2, 3, 1, 0)  # [2, 3, 6, 5]
    y, idx = check_primitive("max_pool2d", x, (2, 2), (2, 1), (1, 0), (1, 1), False)
    dy = random_array((1, 3, 1, 1), seed=8).expand(*y.shape)
    check_primitive("max_pool2d_backward", dy, idx, tuple(x.shape), (2, 2), (2, 1), (1, 0))


# Overlapping windows (kernel larger than the stride, dilation, padding, ceil_mode): several
# windows can pick the same input position, whose gradient is then their dy summed in the order
# of the kernel offsets (a gather: no atomics, the same bits on every run).
OVERLAPPING = [
    ((3, 3), (2, 2), (1, 1), (1, 1), False),
    ((3, 3), (2, 2), (1, 1), (1, 1), True),
    ((3, 2), (1, 1), (1, 0), (2, 1), False),
    ((2, 3), (1, 2), (0, 1), (1, 2), True),
    ((3, 3), (1, 1), (1, 1), (1, 1), False),
]


def _spiky(shape, seed):
    """Integer values (ties in most windows) with a few large spikes that many overlapping
    windows pick at once."""
    rng = np.random.default_rng(seed)
    x = rng.integers(-1, 2, shape).astype(np.float32)
    x.reshape(-1)[rng.choice(x.size, max(1, x.size // 16), replace=False)] = 9.0
    return torch.from_numpy(x)


@pytest.mark.parametrize("geometry", OVERLAPPING)
def test_max_pool_backward_of_overlapping_windows_against_torch(geometry):
    x = _spiky((2, 3, 9, 8), seed=12)
    y, idx = check_primitive("max_pool2d", x, *geometry)
    ty, tidx = torch_max_pool(x.double(), *geometry)
    assert torch.equal(idx, tidx)
    dy = random_array(tuple(y.shape), seed=13)
    dx = check_primitive("max_pool2d_backward", dy, idx, tuple(x.shape), *geometry)
    want = torch.ops.aten.max_pool2d_with_indices_backward(dy.double(), x.double(), *geometry,
                                                            tidx)
    assert_close(dx, want, 1e-6, 1e-6, name="dx against torch")


@pytest.mark.parametrize("dtype", [td.float32, td.float16, td.float64])
@pytest.mark.parametrize("kernel, size", [((2, 2), (28, 28)), ((3, 2), (9, 8)), ((1, 3), (2, 6)),
                                          ((2, 2), (2, 4))])
def test_max_pool_backward_window_by_window(kernel, size, dtype, monkeypatch):
    """Windows that tile the input exactly take the window-by-window backward: the bits of the
    element-by-element gather (dy of -0.0, NaN and inf at argmaxes, ties, a gate with 0, -0.0,
    NaN; strided dy, indices and gate), every element written, and the reference's values."""
    x = _spiky((2, 3) + size, seed=31).to(dtype.torch)
    y, idx = check_primitive("max_pool2d", x, kernel, kernel)
    dy = random_array((y.shape[0], y.shape[1], y.shape[3], y.shape[2]), dtype, seed=32)
    dy.view(-1)[:4] = torch.tensor([-0.0, float("nan"), float("inf"), 0.0])
    dy = dy.transpose(2, 3)
    gate = random_array(tuple(y.shape), dtype, seed=33)
    gate.view(-1)[4:8] = torch.tensor([0.0, -0.0, float("nan"), -1.0])
    strided_idx = idx.transpose(2, 3).contiguous().transpose(2, 3)
    launched = []
    real = pool.run
    monkeypatch.setattr(pool, "run", lambda kernel, *a, **k: (
        launched.append(kernel.fn.__name__), real(kernel, *a, **k))[1])
    for g in (None, gate):
        got = check_primitive("max_pool2d_backward", dy, strided_idx, tuple(x.shape), kernel,
                              kernel, gate=g)
        monkeypatch.setattr(pool, "WINDOW_BACKWARD", False)
        plans.clear_plans()  # (the switch is not in the plans' keys)
        want = pool.max_pool2d_backward(dy, idx, tuple(x.shape), kernel, kernel, gate=g)
        monkeypatch.setattr(pool, "WINDOW_BACKWARD", True)
        plans.clear_plans()
        assert _same_bits(got, want)
    assert launched == ["_max_pool_bwd_windows_kernel", "_max_pool_bwd_kernel"] * 2


@pytest.mark.parametrize("geometry", OVERLAPPING + [((2, 2), (2, 2), (0, 0), (1, 1), False),
                                                ((2, 2), (2, 2), (1, 1), (1, 1), True)])
def test_max_pool_backward_gate(geometry):
    """With a gate (the pool's output, when a relu came before it), only the windows whose
    gate is > 0 give their dy: the same as the ungated backward of dy zeroed there (exactly:
    the same sums in the same order). Gates of 0, -0.0, negatives and NaN shut a window;
    strided dy and gate, tiling and overlapping windows."""
    x = _spiky((2, 3, 9, 8), seed=21)
    y, idx = check_primitive("max_pool2d", x, *geometry)
    gate = random_array(tuple(y.shape), seed=22)
    gate.view(-1)[:4] = torch.tensor([0.0, -0.0, float("nan"), float("inf")])
    dy = random_array((y.shape[0], y.shape[1], y.shape[3], y.shape[2]), seed=23).transpose(2, 3)
    gated = check_primitive("max_pool2d_backward", dy, idx, tuple(x.shape), *geometry,
                            gate.transpose(2, 3).contiguous().transpose(2, 3))
    want = pool.max_pool2d_backward(torch.where(gate > 0, dy, 0.0), idx, tuple(x.shape),
                                    *geometry)
    assert torch.equal(gated, want)
    assert gated.abs().sum() < pool.max_pool2d_backward(dy, idx, tuple(x.shape),
                                                        *geometry).abs().sum()
    with pytest.raises(ValueError, match="gate"):
        pool.max_pool2d_backward(dy, idx, tuple(x.shape), *geometry, gate[:, :1])


def test_max_pool_backward_nan_goes_to_the_argmax_only():
    """A NaN input is its window's argmax; a NaN in dy reaches only the position its window
    picked, not the other positions of the window."""
    x = _spiky((1, 2, 7, 7), seed=14)
    x[0, 0, 3, 3] = float("nan")
    geometry = ((3, 3), (2, 2), (1, 1), (1, 1), True)
    y, idx = check_primitive("max_pool2d", x, *geometry)
    assert torch.isnan(y[0, 0]).sum() == 4  # the four windows that hold (3, 3)
    dy = random_array(tuple(y.shape), seed=15)
    dy[0, 1, 1, 1] = float("nan")
    dx = check_primitive("max_pool2d_backward", dy, idx, tuple(x.shape), *geometry)
    picked = int(idx[0, 1, 1, 1])
    assert torch.isnan(dx[0, 1].reshape(-1)[picked])
    assert torch.isnan(dx).sum() == 1


def test_max_pool_backward_skips_indices_outside_their_window():
    """The backward gathers from the windows that hold a position: an index that names a
    position outside its own window (or -1) adds nothing anywhere."""
    dy = random_array((1, 1, 2, 2), seed=16)
    idx = torch.tensor([[[[0, 0], [-1, 15]]]])  # window (0, 1) names position 0, not its own
    dx = check_primitive("max_pool2d_backward", dy, idx, (1, 1, 4, 4), (2, 2), (2, 2))
    want = torch.zeros(1, 1, 4, 4)
    want[0, 0, 0, 0], want[0, 0, 3, 3] = dy[0, 0, 0, 0], dy[0, 0, 1, 1]
    assert torch.equal(dx, want)


def test_reference_max_pool_keeps_the_first_maximum_bits():
    """y is the element at the index, to the bit: -0.0 before 0.0 stays -0.0, and the other
    way round."""
    x = torch.tensor([[[[-0.0, 0.0, 0.0, -0.0]]]])
    y, idx = NumpyBackend().max_pool2d(x, (1, 2), (1, 2))
    assert idx.tolist() == [[[[0, 2]]]]
    assert torch.signbit(y).tolist() == [[[[True, False]]]]


def _same_bits(a, b):
    bits = {2: torch.int16, 4: torch.int32, 8: torch.int64}
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(
        a.view(bits[a.element_size()]), b.view(bits[b.element_size()]))


@pytest.mark.parametrize("kernel", [(1, 1), (2, 2), (3, 3), (2, 3), (4, 1)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_reference_tiled_max_pool_is_the_general_path(kernel, dtype, monkeypatch):
    """Windows that tile the input (stride = kernel, no padding, dilation or overhang) take a
    faster path in the reference (NumpyBackend._max_pool_tiled; the backward as one scatter):
    maxima, indices and gradients bit for bit those of the general path, on ties, infinities,
    all -inf windows, a NaN, -0.0, sizes the windows do not divide, strided inputs and dy,
    and indices outside their windows."""
    rng = np.random.default_rng(6)
    base = rng.integers(-2, 3, (2, 3, 11, 14)).astype(np.float64)
    base[0, 0, :4, :4] = -np.inf
    base[1, 2, 5, 6] = np.inf
    nan, zero = base.copy(), base.copy()
    nan[1, 1, 4, 4] = np.nan
    zero[0, 2, 2, 1] = -0.0
    contiguous = torch.from_numpy(base).to(dtype)
    strided = torch.from_numpy(np.ascontiguousarray(base.transpose(0, 1, 3, 2))).to(dtype)
    strided = strided.transpose(2, 3)[:, :, 1:, :]  # (not contiguous, an offset)
    ref = NumpyBackend()
    general = NumpyBackend()
    monkeypatch.setattr(general, "_tiled", lambda *args: False)
    for x in (contiguous, strided, torch.from_numpy(nan).to(dtype),
              torch.from_numpy(zero).to(dtype)):
        fast, slow = (b.max_pool2d(x, kernel, kernel) for b in (ref, general))
        assert _same_bits(fast[0], slow[0]) and torch.equal(fast[1], slow[1])
        assert _same_bits(ref.max_pool2d(x, kernel, kernel, with_indices=False)[0], slow[0])
        dy = torch.from_numpy(rng.standard_normal(tuple(fast[0].shape) + (2,))).to(dtype)[..., 0]
        for index in (fast[1], torch.where(fast[1] % 3 == 0, fast[1], 0)):  # some not theirs
            dx = ref.max_pool2d_backward(dy, index, x.shape, kernel, kernel)
            assert _same_bits(dx, general.max_pool2d_backward(dy, index, x.shape, kernel, kernel))
    # the fast path ran where it could (no NaN, no -0.0)
    assert ref._max_pool_tiled(to_numpy(contiguous), kernel, fast[0].shape[2:], True) is not None


def _deterministic_case(shape, device, seed):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randint(-2, 3, shape, generator=gen).float()
    x[..., ::5, ::3] = 7.0  # spikes: up to nine windows sum into one position
    dy = torch.rand(shape, generator=gen) * 2 - 1  # (stride 1, padding 1: y has x's shape)
    return x.to(device), dy.to(device)


def test_max_pool_backward_is_deterministic():
    x, dy = _deterministic_case((2, 3, 11, 10), "cpu", seed=17)
    _, idx = pool.max_pool2d(x, (3, 3), (1, 1), (1, 1))
    first = pool.max_pool2d_backward(dy, idx, x.shape, (3, 3), (1, 1), (1, 1))
    again = pool.max_pool2d_backward(dy.clone(), idx.clone(), x.shape, (3, 3), (1, 1), (1, 1))
    assert torch.equal(first, again)
    assert_close(first, NumpyBackend().max_pool2d_backward(dy, idx, x.shape, (3, 3), (1, 1),
                                                            (1, 1)), 1e-6, 1e-6)


def test_max_pool_without_indices(monkeypatch):
    """Evaluation (no gradient wanted) skips the indices: the same maxima, no index array; a
    forward that autodiff records, or return_indices=True, still gets them."""
    x = _spiky((2, 3, 9, 8), seed=19)
    y, idx = check_primitive("max_pool2d", x, (3, 3), (2, 2), (1, 1), (1, 1), True,
                             with_indices=False)
    assert idx is None
    assert torch.equal(y, pool.max_pool2d(x, (3, 3), (2, 2), (1, 1), (1, 1), True)[0])
    asked = []
    backend = td.get_backend()
    real = backend.max_pool2d
    monkeypatch.setattr(backend, "max_pool2d", lambda *a: asked.append(a[-1]) or real(*a))
    t = td.tensor(x.numpy(), requires_grad=True)
    with td.no_grad():
        F.max_pool2d(t, 2)
    F.max_pool2d(t.detach(), 2)
    F.max_pool2d(t, 2)
    F.max_pool2d(t.detach(), 2, return_indices=True)
    assert asked == [False, False, True, True]


# ----------------------------------------------------------------------------- average pooling


@given(geo=pool_geometry(dilation=False), include=st.booleans(),
       override=st.sampled_from([None, 1, 5]))
def test_avg_pool_matches_reference(geo, include, override):
    kernel, stride, padding, _, size, ceil_mode = geo
    args = (kernel, stride, padding, ceil_mode, include, override)
    x = random_array((2, 3) + size, seed=3)
    y = check_primitive("avg_pool2d", x, *args)
    dy = random_array(tuple(y.shape), seed=4)
    check_primitive("avg_pool2d_backward", dy, tuple(x.shape), *args)


@pytest.mark.parametrize("dtype", [td.float16, td.bfloat16, td.float64])
def test_avg_pool_dtypes(dtype):
    x = random_array((2, 3, 7, 6), dtype, seed=9)
    args = ((3, 2), (2, 2), (1, 1), True, False, None)
    y = check_primitive("avg_pool2d", x, *args)
    check_primitive("avg_pool2d_backward", random_array(tuple(y.shape), dtype), (2, 3, 7, 6),
                    *args)


def test_avg_pool_strided_operands():
    x = random_array((6, 5, 2, 3), seed=10).permute(2, 3, 0, 1)  # [2, 3, 6, 5]
    y = check_primitive("avg_pool2d", x, (3, 3), (2, 2), (1, 1), True, True, None)
    dy = random_array((2, 1, 4, 1), seed=11).expand(*y.shape)
    check_primitive("avg_pool2d_backward", dy, tuple(x.shape), (3, 3), (2, 2), (1, 1), True,
                    True, None)


# ----------------------------------------------------------------------------- autodiff level


def test_autodiff_pooling():
    rng = np.random.default_rng(0)
    x = rng.integers(-3, 4, (2, 3, 8, 7)).astype(np.float64)  # ties
    check_op(lambda x: F.max_pool2d(x, 2), x)
    check_op(lambda x: F.max_pool2d(x, 3, stride=2, padding=1, ceil_mode=True), x)
    check_op(lambda x: F.avg_pool2d(x, 3, stride=2, padding=1, count_include_pad=False), x)


# ----------------------------------------------------------------------------- bad input


def test_bad_input_names_the_shapes():
    x = random_array((1, 2, 4, 4))
    with pytest.raises(ValueError, match=r"does not fit the input \(1, 2, 4, 4\)"):
        pool.max_pool2d(x, (6, 6), (1, 1))
    with pytest.raises(ValueError, match="stride"):
        pool.avg_pool2d(x, (2, 2), (0, 2))
    with pytest.raises(ValueError, match="divisor_override"):
        pool.avg_pool2d(x, (2, 2), (2, 2), divisor_override=-1)
    with pytest.raises(ValueError, match="dy"):
        pool.avg_pool2d_backward(random_array((1, 2, 3, 3)), (1, 2, 4, 4), (2, 2), (2, 2))
    with pytest.raises(ValueError, match="indices"):
        pool.max_pool2d_backward(random_array((1, 2, 2, 2)), torch.zeros(1, 2, 3, 3,
                                                                         dtype=torch.int64),
                                 (1, 2, 4, 4), (2, 2), (2, 2))
    with pytest.raises(ValueError, match=r"output \(1, 2, 2, 2\)"):
        pool.max_pool2d_backward(random_array((1, 2, 3, 3)), torch.zeros(1, 2, 3, 3,
                                                                         dtype=torch.int64),
                                 (1, 2, 4, 4), (2, 2), (2, 2))
    with pytest.raises(TypeError, match="floating"):
        pool.max_pool2d(torch.zeros(1, 1, 2, 2, dtype=torch.int64), (2, 2), (2, 2))


# ----------------------------------------------------------------------------- GPU tier


@pytest.mark.gpu
@pytest.mark.parametrize("shape, kernel, stride, padding", [
    ((100, 32, 28, 28), 2, 2, 0),     # MNIST CNN pool1
    ((100, 64, 14, 14), 2, 2, 0),     # MNIST CNN pool2
    ((256, 64, 112, 112), 3, 2, 1),   # a ResNet stem
])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gpu_pooling_at_real_shapes(shape, kernel, stride, padding, dtype):
    """Against torch's CUDA pooling: max values and indices exactly, gradients exactly where
    windows do not overlap, average pooling within rounding."""
    x = torch.randn(shape, device="cuda").to(dtype)
    y, idx = pool.max_pool2d(x, (kernel, kernel), (stride, stride), (padding, padding))
    ty, tidx = torch_max_pool(x, kernel, stride, padding, 1, False)
    assert torch.equal(y, ty) and torch.equal(idx, tidx)
    dy = torch.randn(y.shape, device="cuda").to(dtype)
    dx = pool.max_pool2d_backward(dy, idx, x.shape, (kernel, kernel), (stride, stride),
                                  (padding, padding))
    tdx = torch.ops.aten.max_pool2d_with_indices_backward(
        dy, x, [kernel] * 2, [stride] * 2, [padding] * 2, [1, 1], False, tidx)
    # windows that overlap sum up to four terms, in another order than torch's
    tol = 0 if stride >= kernel else (1e-5 if dtype == torch.float32 else 1e-2)
    torch.testing.assert_close(dx, tdx, rtol=tol, atol=tol)
    # gated by the pool's output (a relu before the pool): torch's gradient of max_pool(relu)
    gated = pool.max_pool2d_backward(dy, idx, x.shape, (kernel, kernel), (stride, stride),
                                     (padding, padding), (1, 1), False, y)
    tgated = torch.where(x > 0, torch.ops.aten.max_pool2d_with_indices_backward(
        dy, x, [kernel] * 2, [stride] * 2, [padding] * 2, [1, 1], False, tidx), 0)
    torch.testing.assert_close(gated, tgated, rtol=tol, atol=tol)
    args = ((kernel, kernel), (stride, stride), (padding, padding), False, True, None)
    ya = pool.avg_pool2d(x, *args)
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(ya, torch_avg_pool(x, kernel, stride, padding, False, True, None),
                               rtol=tol, atol=tol)
    dxa = pool.avg_pool2d_backward(dy, x.shape, *args)
    xs = x.detach().requires_grad_()
    torch_avg_pool(xs, kernel, stride, padding, False, True, None).backward(dy)
    torch.testing.assert_close(dxa, xs.grad, rtol=tol, atol=tol)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gpu_max_pool_backward_is_deterministic(dtype):
    """Overlapping 3x3 windows at stride 1 with spikes that up to nine windows pick: the same
    gradient bits on every run, and torch's gradient within the summation's rounding."""
    x, dy = _deterministic_case((64, 32, 56, 56), "cuda", seed=18)
    x, dy = x.to(dtype), dy.to(dtype)
    _, idx = pool.max_pool2d(x, (3, 3), (1, 1), (1, 1))
    runs = [pool.max_pool2d_backward(dy, idx, x.shape, (3, 3), (1, 1), (1, 1)) for _ in range(3)]
    for other in runs[1:]:
        assert torch.equal(runs[0], other)
    want = torch.ops.aten.max_pool2d_with_indices_backward(dy.double(), x.double(), [3, 3],
                                                            [1, 1], [1, 1], [1, 1], False, idx)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(runs[0].double(), want, rtol=tol, atol=tol)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gpu_max_pool_backward_window_by_window_is_the_gather(dtype, monkeypatch):
    """MNIST's pool1 and pool2: the window-by-window backward gives the element-by-element
    gather's bits, with dy of -0.0, NaN and inf and a gate (compiled, where -0.0 + 0.0 and the
    store of a zero could differ from the interpreter)."""
    for shape in ((100, 32, 28, 28), (100, 64, 14, 14)):
        x = torch.randn(shape, device="cuda").round().to(dtype)  # ties
        y, idx = pool.max_pool2d(x, (2, 2), (2, 2))
        dy = torch.randn(y.shape, device="cuda").to(dtype)
        dy.view(-1)[:6] = torch.tensor([-0.0, float("nan"), float("inf"), -0.0, 0.0, -1.0])
        for gate in (None, y):
            got = pool.max_pool2d_backward(dy, idx, shape, (2, 2), (2, 2), gate=gate)
            monkeypatch.setattr(pool, "WINDOW_BACKWARD", False)
            plans.clear_plans()
            want = pool.max_pool2d_backward(dy, idx, shape, (2, 2), (2, 2), gate=gate)
            monkeypatch.setattr(pool, "WINDOW_BACKWARD", True)
            plans.clear_plans()
            assert torch.equal(got.view(torch.int16 if dtype == torch.bfloat16 else torch.int32),
                               want.view(torch.int16 if dtype == torch.bfloat16 else torch.int32))
