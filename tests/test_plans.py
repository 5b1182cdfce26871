"""Recorded launch plans (kernels/plans.py: @planned, its lean path) and the backward engine's
fast paths: a replay must give what a fresh call gives, whatever the layout, the arguments that
are not arrays, the settings, or an `out` array passed by position.

The plans run under the interpreter too (they pass arrays there, raw pointers on a GPU), so these
check on the CPU that each signature gets its own plan and that the lean key (the leading arrays'
attributes and the other arguments as given) never hands one signature another's plan.
"""
import numpy as np
import pytest
import torch

import tritonad as td
from tritonad.kernels import launch, plans, reduce as rd, softmax as sm

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


@pytest.fixture(autouse=True,
                params=["interpreted", pytest.param("compiled", marks=pytest.mark.gpu)])
def _triton_backend(request):
    """Each test in both tiers: on a GPU the replays pass raw pointers (launch.RAW_POINTERS)."""
    with td.use_backend("triton"):
        yield


def _array(*shape, seed=0):
    return torch.from_numpy(np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
                            ).to(DEVICE)


def _np(x):
    return x.cpu().numpy().astype(np.float64)


def test_a_lean_plan_per_layout_of_one_shape():
    """A square matrix and its transpose share a shape, not strides: each sum over dim 1 is
    right on its first call, on its replay, and after the other one's."""
    x = _array(6, 6, seed=1)
    rd.sum.lean.clear()
    for _ in range(3):
        for view in (x, x.t(), x[:, ::1]):
            got = rd.sum(view, (1,), False, None)
            np.testing.assert_allclose(got.cpu().numpy(), _np(view).sum(1), rtol=1e-5, atol=1e-5)
    if plans.PLANS_ENABLED:
        assert len(rd.sum.lean) == 2  # (x and x[:, ::1] have one layout)


def test_the_lean_key_takes_every_other_argument():
    x = _array(5, 7, seed=2)
    for dims, keepdim in [((0,), False), ((1,), False), ((1,), True), (None, False),
                          ((0, 1), True)]:
        for _ in range(2):
            got = rd.sum(x, dims, keepdim, None)
            want = _np(x).sum(axis=dims, keepdims=keepdim)
            assert tuple(got.shape) == want.shape
            np.testing.assert_allclose(got.cpu().numpy(), want, rtol=1e-5, atol=1e-5)
    # a dtype argument: int64 input summed as float64
    i = torch.arange(12, device=DEVICE).reshape(3, 4)
    for _ in range(2):
        assert rd.sum(i, (1,), False, None).dtype == torch.int64
        assert rd.sum(i, (1,), False, td.float64).dtype == torch.float64


def test_an_out_array_by_position_is_written_and_never_keyed_leanly():
    x = _array(4, 9, seed=3)
    rd.sum.lean.clear()
    for _ in range(3):
        out = torch.empty(4, device=DEVICE)
        got = rd.sum(x, (1,), False, None, out)
        assert got is out
        np.testing.assert_allclose(out.cpu().numpy(), _np(x).sum(1), rtol=1e-5, atol=1e-5)
    assert not rd.sum.lean  # an array among the other arguments: the general path only


def test_unhashable_arguments_take_the_general_path():
    x = _array(3, 8, seed=4)
    for _ in range(2):
        got = rd.sum(x, [1], False, None)  # a list of dims
        np.testing.assert_allclose(got.cpu().numpy(), _np(x).sum(1), rtol=1e-5, atol=1e-5)


def test_settings_join_the_lean_key(monkeypatch):
    """The split target is a setting the plan depends on (how many programs and partials)."""
    x = _array(64, 33, seed=5)
    want = _np(x).sum(0)
    for target in (None, 8, None, 8):
        monkeypatch.setattr(rd, "split_target_override", target)
        monkeypatch.setattr(rd, "SPLIT_MIN_ELEMENTS", 0)
        np.testing.assert_allclose(rd.sum(x, (0,), False, None).cpu().numpy(), want,
                                   rtol=1e-5, atol=1e-5)


def test_two_array_lean_plans_follow_each_arrays_layout():
    """softmax_backward(dy, y, dim): two leading arrays; a transposed y is another plan."""
    x = _array(5, 5, seed=6)
    dy = _array(5, 5, seed=7)
    for _ in range(2):
        for yv in (sm.softmax(x, 1), sm.softmax(x, 1).t().contiguous().t()):
            got = sm.softmax_backward(dy, yv, 1)
            y, g = _np(yv), _np(dy)
            want = y * (g - (g * y).sum(1, keepdims=True))
            np.testing.assert_allclose(got.cpu().numpy(), want, rtol=1e-5, atol=1e-6)


def test_a_replay_allocates_new_results():
    x = _array(4, 4, seed=8)
    a = rd.sum(x, (1,), False, None)
    b = rd.sum(x, (1,), False, None)
    assert a.data_ptr() != b.data_ptr()
    np.testing.assert_array_equal(a.cpu().numpy(), b.cpu().numpy())


# ------------------------------------------------------------------ the engine's fast paths


def test_a_retained_graph_backward_twice_with_gradient_buffers():
    """An optimizer lends each parameter a gradient buffer; the second backward of a retained
    graph must add to .grad, not write over it (the buffer is only for a first gradient)."""
    lin = td.nn.Linear(3, 2)
    opt = td.optim.SGD(lin.parameters(), lr=0.1)
    x = td.tensor(np.arange(12, dtype=np.float32).reshape(4, 3) / 10)
    loss = (lin(x).relu() * 2).sum()  # (the weight used once: its gradient may go to the buffer)
    opt.zero_grad()
    loss.backward(retain_graph=True)
    first = lin.weight.grad.numpy().copy()
    lin.weight.grad.mul_(3)  # (a second backward written into the buffer would lose this)
    loss.backward()
    np.testing.assert_allclose(lin.weight.grad.numpy(), 4 * first, rtol=1e-6)


def test_sum_backward_expands_the_gradient_without_a_copy_and_with_create_graph():
    x = td.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], requires_grad=True)
    (x.sum(1) * td.tensor([1.0, 2.0])).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [[1, 1, 1], [2, 2, 2]])
    # higher order: d/dx of sum(d(sum(x^2))/dx) = 2 everywhere
    x.grad = None
    (g,) = td.grad((x * x).sum(), x, create_graph=True)
    g.sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), np.full((2, 3), 2.0))


def test_backward_seeds_with_ones_of_the_output_dtype():
    x = td.tensor([1.0, -2.0, 3.0], requires_grad=True)
    y = (x.to(td.float64) * 2).sum()
    y.backward()
    assert x.grad.dtype == td.float32
    np.testing.assert_array_equal(x.grad.numpy(), [2.0, 2.0, 2.0])


def test_an_optional_leading_array_keys_apart_from_none():
    """conv2d(x, w, bias, ...) keys bias None and a bias array apart: each replay is right."""
    from tritonad.kernels import conv

    x, w, b = _array(2, 3, 5, 5, seed=9), _array(4, 3, 3, 3, seed=10), _array(4, seed=11)
    conv.conv2d.lean.clear()
    ref = torch.nn.functional.conv2d  # (the oracle only: torch on the CPU, float64)
    xs, ws, bs = (t.cpu().double() for t in (x, w, b))
    previous = td.conv_precision()
    td.set_conv_precision("highest")  # (float32 accuracy on a GPU too: TF32 would need 1e-2)
    try:
        for _ in range(2):
            for bias in (None, b):
                got = conv.conv2d(x, w, bias, (1, 1), (1, 1), (1, 1), 1)
                want = ref(xs, ws, None if bias is None else bs, padding=1)
                np.testing.assert_allclose(got.cpu().numpy(), want.numpy(), rtol=1e-4,
                                           atol=1e-4)
    finally:
        td.set_conv_precision(previous)
    if plans.PLANS_ENABLED:
        assert len(conv.conv2d.lean) == 2


@pytest.mark.parametrize("first", ["aliased", "apart"])
def test_a_plan_recorded_with_one_array_twice_never_replays_two(first):
    """matmul(a, a) and matmul(a, b) key apart, in either order, on the lean and the general
    path: a plan points each launch at the first array that holds its pointer."""
    from tritonad.kernels import matmul as mm

    a, b = _array(6, 6, seed=1), _array(6, 6, seed=2)
    calls = [(a, a), (a, b)] if first == "aliased" else [(a, b), (a, a)]
    for x, y in calls + calls:
        for out in (mm.matmul(x, y), mm.matmul(x, y, bias=None)):  # (lean, then general)
            np.testing.assert_allclose(_np(out), _np(x) @ _np(y), rtol=1e-5, atol=1e-5)
    h = td.randn(3, 4, device=DEVICE)
    np.testing.assert_allclose((h @ h.t()).numpy(), h.numpy() @ h.numpy().T, rtol=1e-5,
                               atol=1e-5)
