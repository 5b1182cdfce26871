"""Fused optimizers, gradient clipping and lr schedulers: against the textbook formulas (numpy,
float64) and against torch.optim on the same values, on both backends.

The kernels (tritonad/kernels/optim.py) run under Triton's interpreter on the CPU; the GPU tier
updates 10M-parameter sets and replays a captured step in a CUDA graph while a scheduler changes
the learning rate.
"""
import math

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import tritonad as td
from tritonad import optim
from tritonad.kernels import optim as kernels
from helpers import assert_close
from tritonad.optim import lr_scheduler

# ---------------------------------------------------------------------- numpy references


def sgd_reference(p, g, buf, lr, momentum=0.0, dampening=0.0, weight_decay=0.0,
                  nesterov=False, maximize=False, first_step=False):
    """One SGD step in float64: returns (param, momentum buffer)."""
    g = -g if maximize else g
    g = g + weight_decay * p
    if momentum:
        buf = g.copy() if first_step else momentum * buf + (1 - dampening) * g
        g = g + momentum * buf if nesterov else buf
    return p - lr * g, buf


def adam_reference(p, g, m, v, step, lr, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0,
                   decoupled=False, maximize=False):
    """One Adam / AdamW step in float64 (step counts this one): returns (param, m, v)."""
    g = -g if maximize else g
    if decoupled:
        p = p * (1 - lr * weight_decay)
    else:
        g = g + weight_decay * p
    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * g * g
    m_hat, v_hat = m / (1 - beta1 ** step), v / (1 - beta2 ** step)
    return p - lr * m_hat / (np.sqrt(v_hat) + eps), m, v


def test_references_by_hand():
    # SGD: first momentum step buf = g = 0.5, p = 1 - 0.1 * 0.5
    p, buf = sgd_reference(np.array([1.0]), np.array([0.5]), None, 0.1, momentum=0.9,
                           first_step=True)
    assert p[0] == pytest.approx(0.95) and buf[0] == 0.5
    # Adam's first step moves every coordinate by about lr in the direction of -sign(g)
    p, m, v = adam_reference(np.array([1.0, 1.0]), np.array([3.0, -0.02]), np.zeros(2),
                             np.zeros(2), 1, 0.1)
    assert p == pytest.approx([0.9, 1.1], abs=1e-6)


SHAPES = [(5, 3), (3,), (7,), (2, 2), ()]  # 15, 3 and 1 elements break 16-byte alignment


def _values(shape, seed):
    return np.random.default_rng(seed).uniform(-1, 1, size=shape).astype(np.float32)


def _raw(values):
    return torch.from_numpy(np.array(values, dtype=np.float32)).to(td.get_backend().default_device)


# ---------------------------------------------------------------------- the primitives

SGD_OPTIONS = [
    dict(),
    dict(momentum=0.9),
    dict(momentum=0.9, nesterov=True, weight_decay=0.01),
    dict(momentum=0.5, dampening=0.3),
    dict(momentum=0.5, dampening=0.3, first_step=True),
    dict(momentum=0.9, maximize=True, weight_decay=0.1),
]


@pytest.mark.parametrize("options", SGD_OPTIONS, ids=str)
@pytest.mark.parametrize("n", [4099, 1])
def test_sgd_step_primitive(backend_name, options, n):
    p, g, buf = (_values(n, s) for s in (1, 2, 3))
    expected = sgd_reference(p.astype(np.float64), g.astype(np.float64), buf.astype(np.float64),
                             0.1, **options)
    raws = [_raw(a) for a in (p, g, buf)]
    # lr from device memory as a captured step reads it; momentum as a number
    td.get_backend().sgd_step_(raws[0], raws[1], raws[2], _raw([0.1]), **options)
    assert_close(raws[0], expected[0], 1e-5, 1e-6, name="param")
    if options.get("momentum"):
        assert_close(raws[2], expected[1], 1e-5, 1e-6, name="momentum_buf")


@pytest.mark.parametrize("device_scalars", [False, True])
def test_sgd_step_primitive_scalars_on_device(backend_name, device_scalars):
    p, g, buf = (_values(100, s) for s in (1, 2, 3))
    expected = sgd_reference(p, g, buf, 0.05, momentum=0.8)
    raws = [_raw(a) for a in (p, g, buf)]
    lr, momentum = (_raw([0.05]), _raw([0.8])) if device_scalars else (0.05, 0.8)
    td.get_backend().sgd_step_(*raws, lr, momentum)
    assert_close(raws[0], expected[0], 1e-5, 1e-6, name="param")
    assert_close(raws[2], expected[1], 1e-5, 1e-6, name="momentum_buf")


ADAM_OPTIONS = [
    dict(),
    dict(weight_decay=0.1),
    dict(weight_decay=0.1, decoupled_weight_decay=True),
    dict(maximize=True, beta1=0.8, beta2=0.99, eps=1e-6),
]


@pytest.mark.parametrize("options", ADAM_OPTIONS, ids=str)
@pytest.mark.parametrize("step", [1, 2, 1000])
def test_adam_step_primitive(backend_name, options, step):
    p, g, m = (_values(4099, s) for s in (1, 2, 3))
    v = np.abs(_values(4099, 4))
    o = dict(options)
    decoupled = o.pop("decoupled_weight_decay", False)
    expected = adam_reference(*(a.astype(np.float64) for a in (p, g, m, v)), step, 0.01,
                              decoupled=decoupled, **o)
    for step_arg in (step, _raw([step])):  # a number, and the device counter of a captured step
        raws = [_raw(a) for a in (p, g, m, v)]
        td.get_backend().adam_step_(*raws, step_arg, _raw([0.01]), **options)
        for got, want, name in zip((raws[0], raws[2], raws[3]), expected, ("param", "m", "v")):
            assert_close(got, want, 1e-5, 1e-6, name=f"{name} (step {type(step_arg).__name__})")


@given(n=st.sampled_from([1, 5, 64, 4097]), lr=st.floats(1e-4, 1.0),
       momentum=st.floats(0.0, 0.99), weight_decay=st.sampled_from([0.0, 1e-4, 0.1]),
       nesterov=st.booleans())
def test_sgd_step_property(n, lr, momentum, weight_decay, nesterov):
    with td.use_backend("triton"):
        nesterov = nesterov and momentum > 0
        p, g, buf = (_values(n, s) for s in (5, 6, 7))
        expected = sgd_reference(p.astype(np.float64), g.astype(np.float64),
                                 buf.astype(np.float64), lr, momentum, 0.0, weight_decay, nesterov)
        raws = [_raw(a) for a in (p, g, buf)]
        td.get_backend().sgd_step_(*raws, lr, momentum, 0.0, weight_decay, nesterov)
        assert_close(raws[0], expected[0], 1e-5, 1e-6, name="param")


def test_step_primitives_reject_bad_input():
    with td.use_backend("triton"):
        backend = td.get_backend()
        a, b = _raw(np.zeros(4)), _raw(np.zeros(5))
        with pytest.raises(ValueError, match="sgd_step_.*elements"):
            backend.sgd_step_(a, b, None, 0.1)
        with pytest.raises(TypeError, match="adam_step_.*float32"):
            backend.adam_step_(a, a.double(), a, a, 1, 0.1)
        with pytest.raises(ValueError, match="lr must be a number or a 1-element"):
            backend.sgd_step_(a, a, None, _raw(np.zeros(2)))
        with pytest.raises(ValueError, match="momentum_buf is None"):
            backend.sgd_step_(a, a, None, 0.1, momentum=0.9)


NORM_TYPES = [2.0, 1.0, math.inf, 3.0, 0.5]


@pytest.mark.parametrize("norm_type", NORM_TYPES)
def test_total_norm_and_clip_scale(backend_name, norm_type):
    # 10000 elements: under the interpreter two programs each loop over two blocks
    values = [_values(10000, 1), _values(77, 2), _values(0, 3), _values(3, 4) * 100]
    flat = np.concatenate(values).astype(np.float64)
    expected = np.abs(flat).max() if norm_type == math.inf else \
        np.sum(np.abs(flat) ** norm_type) ** (1 / norm_type)
    raws = [_raw(v) for v in values]
    norm = td.get_backend().total_norm(raws, norm_type)
    assert norm.shape == () and norm.dtype == torch.float32
    assert_close(norm, expected, 2e-5, 1e-6, name="norm")
    td.get_backend().clip_scale_(raws, norm.reshape(1), 1.0)
    coef = min(1.0, 1.0 / (expected + 1e-6))
    for raw, v in zip(raws, values):
        assert_close(raw, v.astype(np.float64) * coef, 2e-5, 1e-7, name="clipped")


def test_total_norm_edge_values(backend_name):
    backend = td.get_backend()
    zeros = _raw(np.zeros(9))
    assert float(backend.total_norm([zeros], 2.0)) == 0.0
    assert float(backend.total_norm([zeros], 3.0)) == 0.0
    with_nan = _raw([1.0, float("nan"), 2.0])
    for p in (2.0, math.inf):
        assert math.isnan(float(backend.total_norm([zeros, with_nan], p)))
    half = torch.tensor([3.0, -4.0], dtype=torch.bfloat16, device=zeros.device)
    assert float(backend.total_norm([half], 2.0)) == pytest.approx(5.0)
    backend.clip_scale_([half], _raw([10.0]), 1.0)  # coef 1 / (10 + 1e-6)
    assert half.float().tolist() == pytest.approx([0.3, -0.4], rel=1e-2)
    with pytest.raises(ValueError, match="norm_type"):
        backend.total_norm([zeros], -1.0)


# ---------------------------------------------------------------------- optimizers vs torch


def _pair(shapes=SHAPES, seed=0):
    """The same initial values as tritonad parameters and torch parameters."""
    init = [_values(s, seed + k) for k, s in enumerate(shapes)]
    ours = [td.tensor(a, requires_grad=True) for a in init]
    theirs = [torch.tensor(a, requires_grad=True) for a in init]
    return ours, theirs


def _set_grads(ours, theirs, step, skip=()):
    """The same gradients (numbered by step) on two parameter lists, tritonad or torch."""
    for k, (p, t) in enumerate(zip(ours, theirs)):
        g = _values(tuple(p.shape), 100 * step + k)
        for x in (p, t):
            x.grad = None if k in skip else \
                (td.tensor(g) if isinstance(x, td.Tensor) else torch.tensor(g))


def _assert_same(ours, theirs, rtol=1e-5, atol=1e-6, what="param"):
    for k, (p, t) in enumerate(zip(ours, theirs)):
        assert_close(p, t.detach().numpy(), rtol, atol, name=f"{what} {k}")


OPTIMIZERS = [
    ("SGD", dict(lr=0.1)),
    ("SGD", dict(lr=0.1, momentum=0.9)),
    ("SGD", dict(lr=0.1, momentum=0.9, dampening=0.5, weight_decay=0.01)),
    ("SGD", dict(lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.1, maximize=True)),
    ("Adam", dict(lr=0.01)),
    ("Adam", dict(lr=0.01, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1, maximize=True)),
    ("AdamW", dict(lr=0.01)),
    ("AdamW", dict(lr=0.01, weight_decay=0.3)),
]


@pytest.mark.parametrize("name,options", OPTIMIZERS, ids=lambda x: str(x))
def test_steps_match_torch(backend_name, name, options):
    ours, theirs = _pair()
    opt, ref = getattr(optim, name)(ours, **options), getattr(torch.optim, name)(theirs, **options)
    for step in range(3):
        _set_grads(ours, theirs, step)
        opt.step()
        ref.step()
        _assert_same(ours, theirs, 1e-5, 2e-6)
    # the state too, through state_dict (same layout as torch's)
    mine, torch_state = opt.state_dict()["state"], ref.state_dict()["state"]
    assert sorted(mine) == sorted(torch_state)
    for k in torch_state:
        for key, value in torch_state[k].items():
            if value is not None:
                assert_close(mine[k][key], value.detach().numpy(), 1e-5, 1e-6, name=f"{key} {k}")


@pytest.mark.parametrize("name", ["SGD", "Adam"])
def test_one_step_matches_the_textbook(backend_name, name):
    ours, _ = _pair()
    init = [p.numpy().astype(np.float64) for p in ours]
    grads = [_values(p.shape, 50 + k).astype(np.float64) for k, p in enumerate(ours)]
    if name == "SGD":
        opt = optim.SGD(ours, lr=0.1, momentum=0.9, weight_decay=0.01, nesterov=True)
        expected = [sgd_reference(p, g, None, 0.1, 0.9, 0, 0.01, True, first_step=True)[0]
                    for p, g in zip(init, grads)]
    else:
        opt = optim.AdamW(ours, lr=0.01, weight_decay=0.1)
        expected = [adam_reference(p, g, 0 * p, 0 * p, 1, 0.01, weight_decay=0.1,
                                   decoupled=True)[0] for p, g in zip(init, grads)]
    for p, g in zip(ours, grads):
        p.grad = td.tensor(g, dtype=td.float32)
    opt.step()
    for k, (p, want) in enumerate(zip(ours, expected)):
        assert_close(p, want, 1e-5, 1e-6, name=f"param {k}")


class _CountingKernel:
    """Stands in for a @triton.jit kernel and counts its launches (plans recorded with the
    real kernel are forgotten, so that every launch goes through this one)."""

    def __init__(self, kernel):
        from tritonad.kernels.plans import clear_plans

        clear_plans()
        self.kernel, self.launches = kernel, 0
        self.fn = kernel.fn

    def __getitem__(self, grid):
        self.launches += 1
        return self.kernel[grid]


@pytest.mark.parametrize("name", ["SGD", "Adam"])
def test_one_launch_updates_every_parameter(monkeypatch, name):
    kernel = "_sgd_kernel" if name == "SGD" else "_adam_kernel"
    counter = _CountingKernel(getattr(kernels, kernel))
    monkeypatch.setattr(kernels, kernel, counter)
    with td.use_backend("triton"):
        ours, theirs = _pair()
        opt = getattr(optim, name)(ours, lr=0.01, **({"momentum": 0.9} if name == "SGD" else {}))
        ref = getattr(torch.optim, name)(theirs, lr=0.01,
                                         **({"momentum": 0.9} if name == "SGD" else {}))
        for step in range(2):
            _set_grads(ours, theirs, step)
            opt.step()
            ref.step()
            assert counter.launches == step + 1
        _assert_same(ours, theirs)
        # a parameter without a gradient is skipped (as torch): the others update in two runs
        _set_grads(ours, theirs, 2, skip=(2,))
        opt.step()
        ref.step()
        assert counter.launches == 2 + 2
        _assert_same(ours, theirs)


@pytest.mark.parametrize("name", ["SGD", "Adam", "AdamW"])
def test_parameters_without_grad_are_skipped(backend_name, name):
    ours, theirs = _pair()
    options = dict(lr=0.05, momentum=0.9, dampening=0.2) if name == "SGD" else dict(lr=0.05)
    opt, ref = getattr(optim, name)(ours, **options), getattr(torch.optim, name)(theirs, **options)
    # per-parameter step counts drift apart: Adam's bias corrections must follow each one
    for step, skip in enumerate([(1,), (), (0, 3), (4,), ()]):
        _set_grads(ours, theirs, step, skip)
        opt.step()
        ref.step()
        _assert_same(ours, theirs, 1e-5, 2e-6)
    steps = {k: v.get("step") for k, v in opt.state_dict()["state"].items()}
    if name != "SGD":
        assert {k: float(s) for k, s in steps.items()} == \
            {k: float(v["step"]) for k, v in ref.state_dict()["state"].items()}


def test_flattening_keeps_identity_and_values(backend_name):
    ours, _ = _pair()
    before = [(id(p), p.numpy().copy()) for p in ours]
    ours[1].grad = td.tensor(_values(3, 9))  # a gradient that existed before the optimizer
    opt = optim.SGD(ours, lr=0.1)
    for p, (ident, values) in zip(ours, before):
        assert id(p) == ident and p.is_leaf and p.requires_grad
        np.testing.assert_array_equal(p.numpy(), values)
    np.testing.assert_array_equal(ours[1].grad.numpy(), _values(3, 9))
    bucket = opt._buckets[0][0]
    storage = bucket.flat.untyped_storage().data_ptr()
    assert all(p._data.untyped_storage().data_ptr() == storage for p in ours)
    # every aligned-size parameter starts on a 16-byte boundary
    assert all(p._data.data_ptr() % 16 == 0 for p in ours if p.numel() % 4 == 0)
    # backward writes the gradients into the flat buffer
    opt.zero_grad()
    loss = (ours[0] * ours[0]).sum() + ours[2].sum()
    loss.backward()
    grad_storage = bucket.grad_flat.untyped_storage().data_ptr()
    assert ours[0].grad._data.untyped_storage().data_ptr() == grad_storage
    assert_close(ours[0].grad, 2 * ours[0].numpy(), name="grad")
    assert ours[1].grad is None


def test_a_small_model_learns(backend_name):
    rng = np.random.default_rng(0)
    x = td.tensor(rng.standard_normal((16, 4)).astype(np.float32))
    y = td.tensor((rng.standard_normal((16, 4)) @ rng.standard_normal((4, 2))).astype(np.float32))
    w1 = td.tensor(rng.standard_normal((4, 8)).astype(np.float32) * 0.5, requires_grad=True)
    b1 = td.zeros(8, requires_grad=True)
    w2 = td.tensor(rng.standard_normal((8, 2)).astype(np.float32) * 0.5, requires_grad=True)
    b2 = td.zeros(2, requires_grad=True)
    opt = optim.Adam([w1, b1, w2, b2], lr=0.1)

    def loss_fn():
        return (((x @ w1 + b1).relu() @ w2 + b2 - y) ** 2).mean()

    losses = []
    for _ in range(5):
        opt.zero_grad()
        loss = loss_fn()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert all(b < a for a, b in zip(losses, losses[1:])) and losses[-1] < 0.7 * losses[0], losses


def test_zero_grad_both_ways(backend_name):
    ours, _ = _pair()
    opt = optim.SGD(ours, lr=0.1)
    (ours[0].sum() * 3.0).backward()
    slot = ours[0].grad._data
    opt.zero_grad(set_to_none=False)
    assert ours[0].grad is not None and ours[0].grad._data is slot
    np.testing.assert_array_equal(ours[0].grad.numpy(), 0.0)
    assert ours[2].grad is None  # never had one: stays None, as torch
    # the next backward accumulates into the zeroed slot
    (ours[0].sum() * 2.0).backward()
    np.testing.assert_array_equal(ours[0].grad.numpy(), 2.0)
    ours[3].grad = td.ones(2, 2)  # assigned by hand, outside the flat buffer
    opt.zero_grad(set_to_none=False)
    np.testing.assert_array_equal(ours[3].grad.numpy(), 0.0)
    opt.zero_grad()
    assert all(p.grad is None for p in ours)


@pytest.mark.parametrize("norm_type", [2.0, math.inf, 1.0])
def test_clip_grad_norm_matches_torch(backend_name, norm_type):
    ours, theirs = _pair()
    optim.SGD(ours, lr=0.1)
    _set_grads(ours, theirs, 0, skip=(1,))  # assigned by hand: each grad is its own span
    ours[4].grad = td.tensor(_values((), 400) * 10)  # a gradient that lives outside the buffer
    theirs[4].grad = torch.tensor(_values((), 400) * 10)
    norm = optim.clip_grad_norm_(ours, 0.5, norm_type)
    ref = torch.nn.utils.clip_grad_norm_(theirs, 0.5, norm_type)
    assert isinstance(norm, td.Tensor) and norm.shape == ()
    assert_close(norm, ref.numpy(), 1e-5, 1e-6, name="total norm")
    for k, (p, t) in enumerate(zip(ours, theirs)):
        if t.grad is not None:
            assert_close(p.grad, t.grad.numpy(), 1e-5, 1e-7, name=f"clipped grad {k}")
    # below max_norm nothing changes
    before = [p.grad.numpy().copy() for p in ours if p.grad is not None]
    optim.clip_grad_norm_(ours, 1e6, norm_type)
    for b, p in zip(before, [p for p in ours if p.grad is not None]):
        assert_close(p.grad, b, 1e-6, 0, name="unclipped")


def test_clip_grad_norm_takes_one_launch_per_flat_buffer(monkeypatch):
    counters = {}
    for name in ("_norm_partials_kernel", "_norm_finish_kernel", "_clip_scale_kernel"):
        counters[name] = _CountingKernel(getattr(kernels, name))
        monkeypatch.setattr(kernels, name, counters[name])
    with td.use_backend("triton"):
        ours, theirs = _pair()
        optim.Adam(ours)
        for params in (ours, theirs):  # backward writes the grads into the flat buffer
            sum((p * p).sum() for p in params).backward()
        norm = optim.clip_grad_norm_(ours, 0.1)
        ref = torch.nn.utils.clip_grad_norm_(theirs, 0.1)
        assert_close(norm, ref.numpy(), 1e-5, 1e-6, name="norm")
        assert {k: c.launches for k, c in counters.items()} == {
            "_norm_partials_kernel": 1, "_norm_finish_kernel": 1, "_clip_scale_kernel": 1}


def test_a_tensor_learning_rate_is_read_on_the_device(backend_name):
    p = td.tensor([1.0, 2.0], requires_grad=True)
    lr = td.tensor([0.5])
    opt = optim.SGD([p], lr=lr)
    p.grad = td.ones(2)
    opt.step()
    with td.no_grad():
        lr.fill_(0.25)  # changed in place: no sync() needed
    p.grad = td.ones(2)
    opt.step()
    assert_close(p, [0.25, 1.25], name="param")


def test_clip_grad_norm_edge_cases(backend_name):
    p = td.tensor([1.0, 2.0], requires_grad=True)
    assert float(optim.clip_grad_norm_([p], 1.0)) == 0.0  # no gradients at all
    p.grad = td.tensor([float("inf"), 0.0])
    with pytest.raises(RuntimeError, match="non-finite"):
        optim.clip_grad_norm_(p, 1.0, error_if_nonfinite=True)
    q = td.tensor(np.arange(6, dtype=np.float32).reshape(2, 3), requires_grad=True)
    q.grad = td.tensor(np.arange(6, dtype=np.float32).reshape(3, 2)).T  # not contiguous
    norm = optim.clip_grad_norm_([q], 1.0)
    assert float(norm) == pytest.approx(math.sqrt(55), rel=1e-6)
    assert_close(q.grad, np.arange(6).reshape(3, 2).T / math.sqrt(55), 1e-5, 1e-7, name="grad")


def forbid_host_reads(monkeypatch):
    """From now on, reading a tensor's values on the host (a synchronisation) fails."""
    def forbidden(*args, **kwargs):
        raise AssertionError("a host synchronisation inside the step")

    for name in ("item", "numpy", "tolist", "__float__", "__bool__"):
        monkeypatch.setattr(td.Tensor, name, forbidden)


def test_step_never_reads_device_values_on_the_host(monkeypatch):
    """What a captured step needs: no .item()/.numpy() (host syncs) inside step() or clipping."""
    with td.use_backend("triton"):
        ours, _ = _pair()
        sgd, adam = optim.SGD(ours, lr=0.1, momentum=0.9), optim.Adam(ours, lr=0.1)
        for p in ours:
            p.grad = td.ones(*p.shape)
        forbid_host_reads(monkeypatch)
        for _ in range(2):
            sgd.step()
            adam.step()
            optim.clip_grad_norm_(ours, 0.1)


def test_device_lr_follows_the_python_value():
    """The kernels read lr from a device scalar: a scheduler refreshes it (one fill launch) when
    the value changes, so a replayed step sees the new value without running step() in Python."""
    p = td.tensor([1.0, 2.0], requires_grad=True)
    opt = optim.SGD([p], lr=0.5, momentum=0.9)
    sched = lr_scheduler.StepLR(opt, step_size=1, gamma=0.1)
    bucket = opt._buckets[0][0]
    assert float(bucket.hyper[0]) == pytest.approx(0.5)
    sched.step()  # no optimizer.step() in between: the scheduler itself updates the scalar
    assert float(bucket.hyper[0]) == pytest.approx(0.05)
    opt.param_groups[0]["momentum"] = 0.5
    opt.sync()
    assert float(bucket.hyper[1]) == pytest.approx(0.5)


def test_fed_hyperparameters_are_left_to_the_caller():
    """While fed, a scheduler changes the Python value only; the step reads whatever the caller
    put in the device slots (a captured training step copies them from a table row); leaving
    hands the slots back to sync()."""
    p = td.tensor([1.0, 2.0], requires_grad=True)
    opt = optim.SGD([p], lr=0.5, momentum=0.9)
    sched = lr_scheduler.StepLR(opt, step_size=1, gamma=0.1)
    table = td.tensor([[0.25, 0.0], [2.0, 0.0]])
    cursor = td.tensor([1], dtype="int64")
    with opt.fed_hyperparameters() as arrays:
        (hyper,) = arrays
        sched.step()
        assert opt.hyperparameter_values() == pytest.approx([0.05, 0.9])
        assert hyper.tolist() == pytest.approx([0.5, 0.9])  # untouched by the scheduler
        td.get_backend().take_row_(table._data, cursor._data, hyper, advance=True)
        p.grad = td.tensor([1.0, 1.0])
        opt.step()  # lr 2, momentum 0: p - 2 * g
        assert p.tolist() == pytest.approx([-1.0, 0.0])
        assert cursor.tolist() == [2]
    opt.sync()
    assert hyper.tolist() == pytest.approx([0.05, 0.9])
    lr = td.tensor([0.1])
    opt.param_groups[0]["lr"] = lr
    with pytest.raises(ValueError, match="cannot be fed"):
        with opt.fed_hyperparameters():
            pass


# ---------------------------------------------------------------------- state dicts


def _snapshot(state_dict):
    """A deep copy through numpy (state_dict tensors share memory with the optimizer, as torch)."""
    def copy(v):
        if isinstance(v, td.Tensor):
            return td.tensor(v.numpy().copy())
        if isinstance(v, dict):
            return {k: copy(x) for k, x in v.items()}
        if isinstance(v, list):
            return [copy(x) for x in v]
        return v
    return copy(state_dict)


@pytest.mark.parametrize("name", ["SGD", "Adam"])
def test_state_dict_round_trip_resumes_identically(backend_name, name, tmp_path):
    options = dict(lr=0.05, momentum=0.9, dampening=0.1) if name == "SGD" else dict(lr=0.05)
    ours, _ = _pair()
    opt = getattr(optim, name)(ours, **options)
    for step, skip in enumerate([(), (2,), ()]):
        _set_grads(ours, ours, step, skip)
        opt.step()
    saved = _snapshot(opt.state_dict())
    weights = [p.numpy().copy() for p in ours]
    serialization = pytest.importorskip("tritonad.serialization")
    serialization.save({"optimizer": saved}, tmp_path / "opt.td")
    loaded = serialization.load(tmp_path / "opt.td")["optimizer"]

    resumed = [td.tensor(w, requires_grad=True) for w in weights]
    other = getattr(optim, name)(resumed, lr=1.0)
    other.load_state_dict(loaded)
    assert other.param_groups[0]["lr"] == 0.05
    for step in (3, 4):
        _set_grads(ours, resumed, step)
        opt.step()
        other.step()
        for p, q in zip(ours, resumed):
            np.testing.assert_array_equal(p.numpy(), q.numpy())


def test_load_state_dict_rejects_a_mismatch():
    ours, _ = _pair()
    opt = optim.SGD(ours, lr=0.1, momentum=0.9)
    _set_grads(ours, ours, 0)
    opt.step()
    state = opt.state_dict()
    fewer = optim.SGD(ours[:2], lr=0.1)
    with pytest.raises(ValueError, match="parameters in the state dict"):
        fewer.load_state_dict(state)
    bad = _snapshot(state)
    bad["state"][0]["momentum_buffer"] = td.zeros(2)
    with pytest.raises(ValueError, match="momentum_buffer"):
        optim.SGD(ours, lr=0.1, momentum=0.9).load_state_dict(bad)


def test_constructor_errors():
    p = td.tensor([1.0], requires_grad=True)
    with pytest.raises(ValueError, match="empty parameter list"):
        optim.SGD([], lr=0.1)
    with pytest.raises(ValueError, match="non-leaf"):
        optim.SGD([p * 2], lr=0.1)
    with pytest.raises(TypeError, match="float32"):
        optim.Adam([td.tensor([1.0], dtype=td.float64, requires_grad=True)])
    with pytest.raises(ValueError, match="twice"):
        optim.SGD([p, p], lr=0.1)
    with pytest.raises(ValueError, match="nesterov"):
        optim.SGD([p], lr=0.1, nesterov=True)
    with pytest.raises(ValueError, match="betas"):
        optim.Adam([p], betas=(1.0, 0.999))


def test_param_groups(backend_name):
    ours, theirs = _pair()

    def groups(ps):
        return [{"params": ps[:2], "lr": 0.01}, {"params": ps[2:], "momentum": 0.5}]

    opt = optim.SGD(groups(ours), lr=0.1, momentum=0.9)
    ref = torch.optim.SGD(groups(theirs), lr=0.1, momentum=0.9)
    for step in range(2):
        _set_grads(ours, theirs, step)
        opt.step()
        ref.step()
    _assert_same(ours, theirs)
    assert [g["lr"] for g in opt.param_groups] == [0.01, 0.1]
    assert opt.state_dict()["param_groups"][1]["params"] == [2, 3, 4]


# ---------------------------------------------------------------------- schedulers vs torch


def _scheduled_pair(name, **options):
    opt = getattr(optim, name)([td.tensor([1.0], requires_grad=True)], lr=0.1,
                               **({"momentum": 0.9} if name == "SGD" else {}))
    ref = getattr(torch.optim, name)([torch.tensor([1.0], requires_grad=True)], lr=0.1,
                                     **({"momentum": 0.9} if name == "SGD" else {}))
    return opt, ref


SCHEDULERS = [
    ("StepLR", "SGD", dict(step_size=7, gamma=0.5)),
    ("CosineAnnealingLR", "SGD", dict(T_max=20, eta_min=0.001)),   # past T_max too
    ("OneCycleLR", "SGD", dict(max_lr=1.0, total_steps=60)),
    ("OneCycleLR", "Adam", dict(max_lr=0.3, epochs=3, steps_per_epoch=20, pct_start=0.25,
                                anneal_strategy="linear", three_phase=True)),
    ("OneCycleLR", "SGD", dict(max_lr=[0.5], total_steps=60, cycle_momentum=False,
                               div_factor=10.0, final_div_factor=100.0)),
]


@pytest.mark.parametrize("sched,name,options", SCHEDULERS, ids=lambda x: str(x))
def test_schedules_match_torch(sched, name, options):
    opt, ref = _scheduled_pair(name)
    ours = getattr(lr_scheduler, sched)(opt, **options)
    theirs = getattr(torch.optim.lr_scheduler, sched)(ref, **options)
    assert ours.get_last_lr() == theirs.get_last_lr()
    key = "betas" if name == "Adam" else "momentum"
    for _ in range(59):
        ref.step()  # (torch warns when the scheduler steps before the optimizer)
        ours.step()
        theirs.step()
        assert ours.get_last_lr() == pytest.approx(theirs.get_last_lr(), rel=1e-12, abs=1e-15)
        assert opt.param_groups[0][key] == pytest.approx(ref.param_groups[0][key], rel=1e-12)


def test_scheduler_state_dict_round_trip():
    opt, _ = _scheduled_pair("SGD")
    sched = lr_scheduler.OneCycleLR(opt, max_lr=1.0, total_steps=50)
    for _ in range(10):
        sched.step()
    state = sched.state_dict()
    assert "optimizer" not in state
    opt2, _ = _scheduled_pair("SGD")
    opt2.load_state_dict(opt.state_dict())
    sched2 = lr_scheduler.OneCycleLR(opt2, max_lr=1.0, total_steps=50)
    sched2.load_state_dict(state)
    for _ in range(5):
        sched.step()
        sched2.step()
        assert sched.get_last_lr() == sched2.get_last_lr()


# ---------------------------------------------------------------------- GPU tier


@pytest.mark.gpu
@pytest.mark.parametrize("name,options,variant", [
    ("SGD", dict(lr=0.01, momentum=0.9, nesterov=True), "fused"),
    ("SGD", dict(lr=0.01, momentum=0.9, dampening=0.1, maximize=True), "fused"),
    ("Adam", dict(lr=1e-3, weight_decay=0.01), "fused"),
    ("AdamW", dict(lr=1e-3), "fused"),
    # torch has no fused Adadelta or RMSprop, nor Adagrad on the GPU
    ("Adadelta", dict(lr=1.0, weight_decay=0.01), "foreach"),
    ("RMSprop", dict(lr=1e-3, momentum=0.9, centered=True), "foreach"),
    ("Adagrad", dict(lr=0.01, lr_decay=1e-3), "foreach")])
def test_ten_million_parameters_match_torch(name, options, variant):
    """20 steps of every fused optimizer on ~10M parameters against torch's fused or foreach
    step (to float32 rounding: compiled, sqrt_rn and the order of operations must hold)."""
    with td.use_backend("triton"):
        gen = torch.Generator(device="cuda").manual_seed(0)
        shapes = [(4096, 2048), (1023,), (1823, 781), (7,), (5000, 17)]  # ~10M, odd sizes
        init = [torch.randn(s, device="cuda", generator=gen) for s in shapes]
        ours = [td.from_torch(t.clone()).requires_grad_() for t in init]
        theirs = [t.clone().requires_grad_() for t in init]
        opt = getattr(optim, name)(ours, **options)
        ref = getattr(torch.optim, name)(theirs, **{variant: True}, **options)
        for step in range(20):
            for p, t in zip(ours, theirs):
                g = torch.randn(t.shape, device="cuda", generator=gen)
                p.grad, t.grad = td.from_torch(g.clone()), g
            opt.step()
            ref.step()
        for p, t in zip(ours, theirs):
            torch.testing.assert_close(p.torch(), t.detach(), rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
def test_ten_million_element_norm_and_clip():
    with td.use_backend("triton"):
        gen = torch.Generator(device="cuda").manual_seed(1)
        grads = [torch.randn(s, device="cuda", generator=gen) for s in (10_000_000, 4097, 1)]
        ours = [g.clone() for g in grads]
        for p in (2.0, 1.0, math.inf):
            norm = td.get_backend().total_norm(ours, p)
            expected = torch.linalg.vector_norm(torch.cat([g.reshape(-1) for g in grads]), p)
            torch.testing.assert_close(norm, expected, rtol=1e-5, atol=0)
        td.get_backend().clip_scale_(ours, norm.reshape(1), 1.0)
        for o, g in zip(ours, grads):
            torch.testing.assert_close(o, g / (norm + 1e-6), rtol=1e-5, atol=1e-9)


@pytest.mark.gpu
@pytest.mark.parametrize("name,options,schedule", [
    ("SGD", dict(lr=0.1, momentum=0.9), lambda m, o: m.StepLR(o, step_size=2, gamma=0.5)),
    ("Adam", dict(lr=0.01), lambda m, o: m.StepLR(o, step_size=2, gamma=0.5)),
    ("Adadelta", dict(lr=1.0), lambda m, o: m.StepLR(o, step_size=2, gamma=0.7)),
    ("RMSprop", dict(lr=1e-2, momentum=0.9, centered=True),
     lambda m, o: m.OneCycleLR(o, max_lr=0.02, total_steps=20)),
    ("Adagrad", dict(lr=0.1, lr_decay=0.1), lambda m, o: m.ExponentialLR(o, gamma=0.9))])
def test_captured_step_follows_the_schedule(name, options, schedule):
    """Capture opt.step() in a CUDA graph, change lr (and RMSprop's momentum) with a scheduler
    between replays: the replays match torch's eager steps with the same schedule (lr,
    momentum and the step counts are read on the device at every replay)."""
    with td.use_backend("triton"):
        ours, theirs = _pair([(300, 7), (5,), (64,)])
        ours = [td.from_torch(p.torch().cuda()).requires_grad_() for p in ours]
        theirs = [t.detach().cuda().requires_grad_() for t in theirs]
        opt, ref = getattr(optim, name)(ours, **options), getattr(torch.optim, name)(theirs,
                                                                                    **options)
        sched, ref_sched = schedule(lr_scheduler, opt), schedule(torch.optim.lr_scheduler, ref)
        for p, t in zip(ours, theirs):
            g = torch.randn(t.shape, device="cuda")
            p.grad, t.grad = td.from_torch(g.clone()), g
        opt.step()  # warm-up: compiles the kernels, creates the state
        ref.step()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            opt.step()
        for _ in range(6):
            sched.step()
            ref_sched.step()
            graph.replay()
            ref.step()
        torch.cuda.synchronize()
        for p, t in zip(ours, theirs):
            torch.testing.assert_close(p.torch(), t.detach(), rtol=1e-5, atol=1e-6)
        if name != "SGD":  # the step counts advanced at every replay: 1 eager step, 6 replays
            assert float(opt.state_dict()["state"][0]["step"]) == 7.0


@pytest.mark.gpu
def test_capturing_a_first_step_is_refused():
    """The first step creates state (zero fills); captured, it would re-zero at every replay."""
    with td.use_backend("triton"):
        p = td.from_torch(torch.ones(10, device="cuda")).requires_grad_()
        opt = optim.SGD([p], lr=0.1, momentum=0.9)
        p.grad = td.from_torch(torch.ones(10, device="cuda"))
        graph = torch.cuda.CUDAGraph()
        with pytest.raises(RuntimeError, match="eagerly before capturing"):
            with torch.cuda.graph(graph):
                opt.step()


@pytest.mark.parametrize("hyper", [dict(momentum=0.9, nesterov=True, weight_decay=0.01),
                                   dict(momentum=0.5, dampening=0.1), dict()])
def test_sgd_updates_float64_parameters_beside_float32_ones(backend_name, hyper):
    rng = np.random.default_rng(4)
    w0, x0 = rng.normal(size=(3, 4)), rng.normal(size=(5, 4))
    w, w32 = td.tensor(w0, requires_grad=True), td.tensor(w0.astype(np.float32), requires_grad=True)
    theirs = torch.tensor(w0, requires_grad=True)
    opt, topt = td.optim.SGD([w, w32], lr=0.1, **hyper), torch.optim.SGD([theirs], lr=0.1, **hyper)
    for _ in range(3):
        opt.zero_grad()
        topt.zero_grad()
        ((td.tensor(x0) @ w.T).tanh().sum()
         + (td.tensor(x0.astype(np.float32)) @ w32.T).tanh().sum()).backward()
        (torch.tensor(x0) @ theirs.T).tanh().sum().backward()
        opt.step()
        topt.step()
    assert w.dtype is td.float64 and w32.dtype is td.float32 and w.grad.dtype is td.float64
    # lr and momentum travel as float32 device scalars: 1e-8 relative
    assert_close(w, theirs.detach(), rtol=1e-6, atol=1e-7)
    assert_close(w32, theirs.detach(), rtol=1e-4, atol=1e-5)
