"""Adadelta, RMSprop, Adagrad, SGD's flags, hand-written optimizers and the lr schedulers, each
against torch.optim on the same values.

The fused updates are checked three ways: the backend primitives against the textbook rules in
float64; whole optimizers against torch.optim for 200 steps on random problems (several shapes,
two parameter groups with different hyperparameters, every flag, gradients missing or zero at
some steps) on the numpy backend, and for a shorter run on the triton interpreter; state dicts
round trip and a loaded state continues identically. The schedulers must give torch's lr
sequences exactly. The GPU tier (10M-parameter updates and captured steps of every fused
optimizer) is in test_optim.py; here, the Trainer's captured steps with the new optimizers.
"""
import math
import textwrap
import warnings

import numpy as np
import pytest
import torch

import tritonad as td
from helpers import assert_close
from test_optim import _CountingKernel, _raw, _snapshot, forbid_host_reads
from tritonad import optim
from tritonad.kernels import optim as kernels
from tritonad.optim import lr_scheduler

# ---------------------------------------------------------------------- float64 references


def adadelta_reference(p, g, v, u, lr, rho=0.9, eps=1e-6, weight_decay=0.0, maximize=False):
    """One Adadelta step (Zeiler 2012, torch's placement of eps): (param, square_avg, acc_delta)."""
    g = (-g if maximize else g) + weight_decay * p
    v = rho * v + (1 - rho) * g * g
    delta = np.sqrt(u + eps) / np.sqrt(v + eps) * g
    u = rho * u + (1 - rho) * delta * delta
    return p - lr * delta, v, u


def rmsprop_reference(p, g, v, a, buf, lr, alpha=0.99, eps=1e-8, weight_decay=0.0,
                      momentum=0.0, centered=False, maximize=False):
    """One RMSprop step: (param, square_avg, grad_avg, momentum_buf)."""
    g = (-g if maximize else g) + weight_decay * p
    v = alpha * v + (1 - alpha) * g * g
    if centered:
        a = alpha * a + (1 - alpha) * g
        avg = np.sqrt(v - a * a) + eps
    else:
        avg = np.sqrt(v) + eps
    if momentum:
        buf = momentum * buf + g / avg
        return p - lr * buf, v, a, buf
    return p - lr * g / avg, v, a, buf


def adagrad_reference(p, g, s, step, lr, lr_decay=0.0, eps=1e-10, weight_decay=0.0,
                      maximize=False):
    """One Adagrad step (step counts this one): (param, sum)."""
    g = (-g if maximize else g) + weight_decay * p
    s = s + g * g
    return p - lr / (1 + (step - 1) * lr_decay) * g / (np.sqrt(s) + eps), s


def test_references_by_hand():
    # Adadelta from zero state: v = 0.1 g^2, delta = sqrt(eps) / sqrt(0.1 g^2 + eps) g
    p, v, u = adadelta_reference(np.array([1.0]), np.array([2.0]), np.zeros(1), np.zeros(1), 1.0)
    assert v[0] == pytest.approx(0.4) and p[0] == pytest.approx(1 - 2e-3 / math.sqrt(0.4 + 1e-6))
    # RMSprop's first step moves by lr / sqrt(1 - alpha) in the direction of -sign(g)
    p, *_ = rmsprop_reference(np.array([0.0, 0.0]), np.array([3.0, -0.5]), np.zeros(2),
                              np.zeros(2), None, 0.01)
    assert p == pytest.approx([-0.1, 0.1], rel=1e-6)
    # Adagrad's first step from a zero sum moves every coordinate by lr
    p, s = adagrad_reference(np.array([1.0, 1.0]), np.array([3.0, -0.02]), np.zeros(2), 1, 0.1)
    assert p == pytest.approx([0.9, 1.1], rel=1e-6) and s == pytest.approx([9.0, 4e-4])


def _values(shape, seed, low=-1.0, high=1.0):
    return np.random.default_rng(seed).uniform(low, high, size=shape).astype(np.float32)


# ---------------------------------------------------------------------- the primitives

ADADELTA_OPTIONS = [dict(), dict(rho=0.5, eps=1e-3, weight_decay=0.1, maximize=True)]
RMSPROP_OPTIONS = [
    dict(),
    dict(momentum=0.9, weight_decay=0.01),
    dict(centered=True, alpha=0.9, eps=1e-4),
    dict(centered=True, alpha=0.3, momentum=0.5, maximize=True),  # torch's other lerp form
]
ADAGRAD_OPTIONS = [dict(), dict(lr_decay=0.1, weight_decay=0.1, eps=1e-3, maximize=True)]


@pytest.mark.parametrize("options", ADADELTA_OPTIONS, ids=str)
@pytest.mark.parametrize("n", [4099, 1])
def test_adadelta_step_primitive(backend_name, options, n):
    p, g, v, u = _values(n, 1), _values(n, 2), _values(n, 3, 0, 1), _values(n, 4, 0, 1)
    expected = adadelta_reference(*(a.astype(np.float64) for a in (p, g, v, u)), 0.5, **options)
    raws = [_raw(a) for a in (p, g, v, u)]
    count = _raw([3.0])
    td.get_backend().adadelta_step_(*raws, _raw([0.5]), **options, count=count)
    for got, want, name in zip((raws[0], raws[2], raws[3]), expected, ("param", "v", "u")):
        assert_close(got, want, 1e-5, 1e-6, name=name)
    assert count.tolist() == [4.0]


@pytest.mark.parametrize("options", RMSPROP_OPTIONS, ids=str)
@pytest.mark.parametrize("n", [4099, 1])
def test_rmsprop_step_primitive(backend_name, options, n):
    p, g, a, buf = (_values(n, s) for s in (1, 2, 3, 4))
    v = _values(n, 5, 1, 2)  # >= a^2: the centered variance stays positive
    expected = rmsprop_reference(*(x.astype(np.float64) for x in (p, g, v, a, buf)), 0.01,
                                 **options)
    raws = [_raw(x) for x in (p, g, v, a, buf)]
    momentum = options.get("momentum", 0.0)
    o = {k: x for k, x in options.items() if k != "momentum"}
    # lr and momentum from device memory, as a captured step reads them
    td.get_backend().rmsprop_step_(*raws, _raw([0.01]), momentum=_raw([momentum]) if momentum
                                   else 0.0, **o)
    checked = [(raws[0], expected[0], "param"), (raws[2], expected[1], "square_avg")]
    if options.get("centered"):
        checked.append((raws[3], expected[2], "grad_avg"))
    if momentum:
        checked.append((raws[4], expected[3], "momentum_buf"))
    for got, want, name in checked:
        assert_close(got, want, 1e-5, 1e-6, name=name)


@pytest.mark.parametrize("options", ADAGRAD_OPTIONS, ids=str)
@pytest.mark.parametrize("step", [1, 7])
def test_adagrad_step_primitive(backend_name, options, step):
    p, g, s = _values(4099, 1), _values(4099, 2), _values(4099, 3, 0, 1)
    expected = adagrad_reference(*(a.astype(np.float64) for a in (p, g, s)), step, 0.1,
                                 **options)
    for step_arg in (step, _raw([step])):  # a number, and the device counter of a captured step
        raws = [_raw(a) for a in (p, g, s)]
        td.get_backend().adagrad_step_(*raws, step_arg, _raw([0.1]), **options)
        for got, want, name in zip((raws[0], raws[2]), expected, ("param", "sum")):
            assert_close(got, want, 1e-5, 1e-6, name=f"{name} (step {type(step_arg).__name__})")


def test_counting_an_empty_update(backend_name):
    """A parameter with no elements still counts its step (torch's state["step"])."""
    empty, count = _raw(np.zeros(0)), _raw([0.0])
    backend = td.get_backend()
    backend.adadelta_step_(empty, empty, empty, empty, 1.0, count=count)
    backend.rmsprop_step_(empty, empty, empty, None, None, 0.1, count=count)
    backend.adagrad_step_(empty, empty, empty, 1, 0.1, count=count)
    assert count.tolist() == [3.0]


def test_new_step_primitives_reject_bad_input():
    with td.use_backend("triton"):
        backend = td.get_backend()
        a, b = _raw(np.zeros(4)), _raw(np.zeros(5))
        with pytest.raises(ValueError, match="adadelta_step_.*acc_delta has 5"):
            backend.adadelta_step_(a, a, a, b, 1.0)
        with pytest.raises(ValueError, match="adadelta_step_: rho must lie in"):
            backend.adadelta_step_(a, a, a, a, 1.0, rho=1.5)
        with pytest.raises(ValueError, match="rmsprop_step_: centered is set but grad_avg"):
            backend.rmsprop_step_(a, a, a, None, None, 0.1, centered=True)
        with pytest.raises(ValueError, match="rmsprop_step_: momentum is nonzero"):
            backend.rmsprop_step_(a, a, a, None, None, 0.1, momentum=0.9)
        with pytest.raises(ValueError, match="adagrad_step_: count must be None or"):
            backend.adagrad_step_(a, a, a, 1, 0.1, count=_raw([1.0, 2.0]))
        with pytest.raises(ValueError, match="adagrad_step_: a device step"):
            backend.adagrad_step_(a, a, a, _raw([1.0]), 0.1, lr_decay=0.1, count=_raw([1.0]))
        with pytest.raises(TypeError, match="rmsprop_step_: square_avg must be float32"):
            backend.rmsprop_step_(a, a, a.double(), None, None, 0.1)


# ---------------------------------------------------------------------- optimizers vs torch

SHAPES = [(5, 3), (3,), (7,), (2, 2), (), (33,)]  # 15, 3, 7, 1, 33: slices break alignment


def _problem(shapes=SHAPES, seed=0):
    """The same initial values as tritonad parameters and torch parameters."""
    init = [_values(s, seed + k) for k, s in enumerate(shapes)]
    return ([td.tensor(a, requires_grad=True) for a in init],
            [torch.tensor(a, requires_grad=True) for a in init])


def _grads(ours, theirs, step, skip=(), zero=()):
    """The same gradients (numbered by step) on both; None for `skip`, zeros for `zero`."""
    for k, (p, t) in enumerate(zip(ours, theirs)):
        g = _values(tuple(p.shape), 1000 * step + k) * (0.0 if k in zero else 1.0)
        for x in (p, t):  # either list may hold tritonad or torch tensors
            x.grad = None if k in skip else \
                td.tensor(g) if isinstance(x, td.Tensor) else torch.tensor(g)


def _schedule(step):
    """Which parameters have no gradient or a zero one at a step: counts drift apart."""
    skip = (1,) if step % 7 == 3 else (0, 4) if step % 11 == 5 else ()
    zero = (2,) if step % 5 == 1 else ()
    return skip, zero


def _groups(params, name, options, other):
    """Two parameter groups: the first with the defaults, the second with `other` on top."""
    if other is None:
        return params
    return [{"params": params[:3]}, {"params": params[3:], **other}]


def _assert_same(ours, theirs, what, rtol=1e-5, atol=1e-6):
    for k, (p, t) in enumerate(zip(ours, theirs)):
        assert_close(p, t.detach().numpy(), rtol, atol, name=f"{what}: param {k}")


def _assert_same_state(opt, ref, what, rtol=1e-5, atol=1e-6):
    mine, theirs = opt.state_dict(), ref.state_dict()
    assert sorted(mine["state"]) == sorted(theirs["state"]), what
    for k, entry in theirs["state"].items():
        assert sorted(mine["state"][k]) == sorted(entry), f"{what}: state keys of param {k}"
        for key, value in entry.items():
            assert_close(mine["state"][k][key], value.numpy(), rtol, atol,
                         name=f"{what}: {key} of param {k}")
    for g_mine, g_theirs in zip(mine["param_groups"], theirs["param_groups"]):
        for key, value in g_mine.items():
            assert g_theirs[key] == value, f"{what}: param_groups {key}"


# (optimizer, options, the second group's overrides or None); every flag appears somewhere
NEW_OPTIMIZERS = [
    ("Adadelta", dict(), None),
    ("Adadelta", dict(lr=0.5, rho=0.8, weight_decay=0.05), dict(lr=1.0, eps=1e-4, maximize=True)),
    ("RMSprop", dict(), None),
    ("RMSprop", dict(lr=1e-3, momentum=0.9, weight_decay=0.01),
     dict(centered=True, alpha=0.9, momentum=0.0)),
    ("RMSprop", dict(lr=1e-3, centered=True, momentum=0.5, maximize=True),
     dict(lr=5e-3, alpha=0.3, eps=1e-5)),
    ("Adagrad", dict(), None),
    ("Adagrad", dict(lr=0.05, lr_decay=0.01, initial_accumulator_value=0.1),
     dict(lr_decay=0.0, weight_decay=0.1, eps=1e-6, maximize=True)),
    ("SGD", dict(lr=0.01, momentum=0.9, nesterov=True, weight_decay=0.01),
     dict(momentum=0.5, nesterov=False, dampening=0.3, maximize=True)),
]
IDS = [f"{name}-{i}" for i, (name, _, _) in enumerate(NEW_OPTIMIZERS)]


def _run_against_torch(name, options, other, steps, check_every):
    ours, theirs = _problem()
    opt = getattr(optim, name)(_groups(ours, name, options, other), **options)
    ref = getattr(torch.optim, name)(_groups(theirs, name, options, other), **options)
    _assert_same_state(opt, ref, "before the first step")  # Adagrad's state exists already
    for step in range(steps):
        _grads(ours, theirs, step, *_schedule(step))
        opt.step()
        ref.step()
        if (step + 1) % check_every == 0:
            _assert_same(ours, theirs, f"step {step + 1}")
    _assert_same_state(opt, ref, f"after {steps} steps")
    return opt, ref, ours, theirs


@pytest.mark.parametrize("name,options,other", NEW_OPTIMIZERS, ids=IDS)
def test_200_steps_match_torch(name, options, other):
    with td.use_backend("numpy"):
        _run_against_torch(name, options, other, steps=200, check_every=50)


@pytest.mark.parametrize("name,options,other", NEW_OPTIMIZERS, ids=IDS)
def test_steps_match_torch_on_the_triton_interpreter(name, options, other):
    with td.use_backend("triton"):
        _run_against_torch(name, options, other, steps=8, check_every=4)


@pytest.mark.parametrize("name,options", [
    ("Adadelta", dict(weight_decay=0.1)), ("RMSprop", dict(momentum=0.9, centered=True)),
    ("Adagrad", dict(lr_decay=0.1)), ("Adagrad", dict())])
def test_one_launch_per_step(monkeypatch, name, options):
    """The fused update counts its own step: one launch per step (Adagrad's lr_decay reads the
    count, so it is counted first, by one more launch)."""
    kernel = f"_{name.lower()}_kernel"
    counter = _CountingKernel(getattr(kernels, kernel))
    monkeypatch.setattr(kernels, kernel, counter)
    launches = {"n": 0}
    with td.use_backend("triton"):
        backend = td.get_backend()
        add = backend.add

        def counting_add(*args, **kwargs):
            launches["n"] += 1
            return add(*args, **kwargs)

        monkeypatch.setattr(type(backend), "add", staticmethod(counting_add))
        ours, theirs = _problem()
        opt = getattr(optim, name)(ours, **options)
        ref = getattr(torch.optim, name)(theirs, **options)
        for step in range(2):
            _grads(ours, theirs, step)
            opt.step()
            ref.step()
        assert counter.launches == 2
        assert launches["n"] == (2 if options.get("lr_decay") else 0)
        _assert_same(ours, theirs, "after 2 steps")
        _assert_same_state(opt, ref, "after 2 steps")


def test_no_gradients_at_all_change_nothing(backend_name):
    ours, _ = _problem()
    for name in ("Adadelta", "RMSprop", "Adagrad"):
        opt = getattr(optim, name)(ours)
        before = [p.numpy().copy() for p in ours]
        opt.zero_grad()
        opt.step()
        for p, b in zip(ours, before):
            np.testing.assert_array_equal(p.numpy(), b)
        steps = {k: float(v["step"]) for k, v in opt.state_dict()["state"].items()}
        assert steps == ({k: 0.0 for k in range(len(ours))} if name == "Adagrad" else {})


def test_an_empty_parameter_is_counted(backend_name):
    ours, theirs = _problem([(0,), (3,)])
    opt, ref = optim.RMSprop(ours, lr=0.01), torch.optim.RMSprop(theirs, lr=0.01)
    for step in range(3):
        _grads(ours, theirs, step)
        opt.step()
        ref.step()
    _assert_same(ours, theirs, "3 steps")
    _assert_same_state(opt, ref, "3 steps")


@pytest.mark.parametrize("name,options,other", NEW_OPTIMIZERS[1::2], ids=IDS[1::2])
def test_state_dict_round_trip_resumes_identically(backend_name, name, options, other,
                                                    tmp_path):
    serialization = pytest.importorskip("tritonad.serialization")
    ours, _ = _problem()
    opt = getattr(optim, name)(_groups(ours, name, options, other), **options)
    for step in range(4):
        _grads(ours, ours, step, *_schedule(step))
        opt.step()
    serialization.save({"optimizer": _snapshot(opt.state_dict())}, tmp_path / "opt.td")
    loaded = serialization.load(tmp_path / "opt.td")["optimizer"]
    resumed = [td.tensor(p.numpy().copy(), requires_grad=True) for p in ours]
    other_opt = getattr(optim, name)(_groups(resumed, name, {}, {} if other else None), lr=0.123)
    other_opt.load_state_dict(loaded)
    assert [g["lr"] for g in other_opt.param_groups] == [g["lr"] for g in opt.param_groups]
    for step in range(4, 8):
        _grads(ours, resumed, step, *_schedule(step))
        opt.step()
        other_opt.step()
        for p, q in zip(ours, resumed):
            np.testing.assert_array_equal(p.numpy(), q.numpy())


@pytest.mark.parametrize("name,options", [("Adadelta", dict(lr=0.5)),
                                          ("RMSprop", dict(momentum=0.9, centered=True)),
                                          ("Adagrad", dict(lr_decay=0.01))])
def test_a_torch_state_dict_loads_and_continues_as_torch(name, options):
    """torch.optim's state_dict (torch tensors, its extra group keys) loads into ours."""
    ours, theirs = _problem()
    ref = getattr(torch.optim, name)(theirs, **options)
    for step in range(3):
        _grads(theirs, theirs, step, *_schedule(step))
        ref.step()
    ours = [td.tensor(t.detach().numpy().copy(), requires_grad=True) for t in theirs]
    opt = getattr(optim, name)(ours, lr=1.0)
    opt.load_state_dict(ref.state_dict())
    for step in range(3, 6):
        _grads(ours, theirs, step, *_schedule(step))
        opt.step()
        ref.step()
    _assert_same(ours, theirs, "3 steps after loading")


def test_adagrad_state_before_the_first_step_and_after_a_partial_load():
    ours, theirs = _problem([(3,), (2,)])
    opt = optim.Adagrad(ours, initial_accumulator_value=0.5)
    ref = torch.optim.Adagrad(theirs, initial_accumulator_value=0.5)
    _assert_same_state(opt, ref, "fresh")
    state = opt.state_dict()
    del state["state"][1]  # a parameter the checkpoint does not know starts afresh
    opt.load_state_dict(state)
    assert opt.state[ours[1]]["sum"].tolist() == [0.5, 0.5]


BAD_HYPERPARAMETERS = [
    ("Adadelta", dict(lr=-1.0), "Adadelta: invalid lr -1.0"),
    ("Adadelta", dict(rho=1.5), r"Adadelta: invalid rho 1.5 \(must be a number in \[0.0, 1.0\]"),
    ("Adadelta", dict(eps=float("nan")), "Adadelta: invalid eps nan"),
    ("RMSprop", dict(alpha=-0.1), "RMSprop: invalid alpha -0.1"),
    ("RMSprop", dict(alpha=1.01), "RMSprop: invalid alpha 1.01"),
    ("RMSprop", dict(momentum=-0.9), "RMSprop: invalid momentum -0.9"),
    ("RMSprop", dict(weight_decay="0.1"), "RMSprop: invalid weight_decay '0.1'"),
    ("Adagrad", dict(lr_decay=-0.1), "Adagrad: invalid lr_decay -0.1"),
    ("Adagrad", dict(initial_accumulator_value=-1), "Adagrad: invalid initial_accumulator_value"),
    ("Adagrad", dict(eps=-1e-10), "Adagrad: invalid eps"),
    ("SGD", dict(lr=0.1, dampening=-0.5), "SGD: invalid dampening -0.5"),
    ("Adam", dict(eps=-1.0), "Adam: invalid eps -1.0"),
]


@pytest.mark.parametrize("name,options,message", BAD_HYPERPARAMETERS, ids=lambda x: str(x))
def test_bad_hyperparameters_name_the_optimizer_and_the_argument(name, options, message):
    p = td.tensor([1.0], requires_grad=True)
    with pytest.raises(ValueError, match=message):
        getattr(optim, name)([p], **options)
    with pytest.raises(ValueError, match=message):  # in a parameter group too
        getattr(optim, name)([{"params": [p], **options}], **({"lr": 0.1} if name == "SGD"
                                                               else {}))


def test_torch_only_switches_are_accepted():
    p = td.tensor([1.0], requires_grad=True)
    optim.Adadelta([p], foreach=True, capturable=True)
    optim.RMSprop([p], foreach=False, capturable=True)
    optim.Adagrad([p], foreach=None, fused=True)
    optim.SGD([p], lr=0.1, foreach=True, fused=False)
    optim.AdamW([p], fused=True, capturable=True)
    with pytest.raises(NotImplementedError, match="RMSprop: differentiable=True"):
        optim.RMSprop([p], differentiable=True)


def test_fed_hyperparameters_of_rmsprop():
    """lr and momentum are device scalars (the Trainer feeds them into a captured step)."""
    p = td.tensor([0.0, 0.0], requires_grad=True)
    opt = optim.RMSprop([p], lr=0.5, momentum=0.9)
    with opt.fed_hyperparameters() as arrays:
        (hyper,) = arrays
        assert opt.hyperparameter_values() == pytest.approx([0.5, 0.9])
        td.get_backend().copy_(hyper, _raw([0.01, 0.0]))
        p.grad = td.tensor([1.0, -1.0])
        opt.step()  # lr 0.01, momentum 0 (read on the device): p = -0.01 g / (0.1 |g| + eps)
    assert p.tolist() == pytest.approx([-0.1, 0.1], rel=1e-6)


def test_step_never_reads_device_values_on_the_host(monkeypatch):
    """What a captured step needs: no .item()/.numpy() (host syncs) inside step()."""
    with td.use_backend("triton"):
        ours, _ = _problem()
        opts = [optim.Adadelta(ours), optim.RMSprop(ours, momentum=0.9, centered=True),
                optim.Adagrad(ours, lr_decay=0.1), optim.Adagrad(ours)]
        for p in ours:
            p.grad = td.ones(*p.shape)
        forbid_host_reads(monkeypatch)
        for _ in range(2):
            for opt in opts:
                opt.step()


# ---------------------------------------------------------------------- hand-written optimizers


def _docstring_example():
    """The worked example of tritonad.optim's docstring, run as it is written there."""
    doc = optim.__doc__
    start = doc.index("    class MomentumSGD(optim.Optimizer):")
    end = doc.index("\n\n", doc.index("param.sub_(", start))
    namespace = {"optim": optim}
    exec(textwrap.dedent(doc[start:end]), namespace)
    return namespace["MomentumSGD"]


MomentumSGD = _docstring_example()


class TorchStyleSGD(optim.Optimizer):
    """The same rule written as torch's optimizers are: step() over param_groups."""

    def __init__(self, params, lr=0.01, momentum=0.9):
        super().__init__(params, dict(lr=lr, momentum=momentum))

    @td.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = p.grad.clone()
                else:
                    state["momentum_buffer"].mul_(group["momentum"]).add_(p.grad)
                p.sub_(state["momentum_buffer"], alpha=group["lr"])


@pytest.mark.parametrize("cls", [MomentumSGD, TorchStyleSGD])
def test_a_hand_written_optimizer_matches_the_fused_one(backend_name, cls):
    """Beside the fused SGD: same parameters after 30 steps (3 on the slow interpreter) with
    two groups, missing grads and a StepLR on each; then its state dict round-trips and the run
    continues identically."""
    steps = 30 if backend_name == "numpy" else 3
    ours, _ = _problem()
    fused_params, _ = _problem()

    def groups(ps):
        return [{"params": ps[:3]}, {"params": ps[3:], "lr": 0.05, "momentum": 0.5}]

    mine = cls(groups(ours), lr=0.1, momentum=0.9)
    fused = optim.SGD(groups(fused_params), lr=0.1, momentum=0.9)
    scheds = [lr_scheduler.StepLR(o, step_size=7 if steps > 7 else 2, gamma=0.5)
              for o in (mine, fused)]
    for step in range(steps):
        _grads(ours, fused_params, step, *_schedule(step))
        mine.step()
        fused.step()
        for s in scheds:
            s.step()
    _assert_same(ours, [torch.tensor(p.numpy()) for p in fused_params], f"{steps} steps", 1e-6,
                 1e-7)
    assert [g["lr"] for g in mine.param_groups] == [g["lr"] for g in fused.param_groups]
    state, fused_state = mine.state_dict(), fused.state_dict()
    assert sorted(state["state"]) == sorted(fused_state["state"])
    for k in state["state"]:
        assert_close(state["state"][k]["momentum_buffer"],
                     fused_state["state"][k]["momentum_buffer"], 1e-6, 1e-7, name=f"buf {k}")
    # round trip: a fresh optimizer loads the state (copies, not views) and continues alike
    resumed = [td.tensor(p.numpy().copy(), requires_grad=True) for p in ours]
    again = cls(groups(resumed))
    again.load_state_dict(state)
    assert again.state[resumed[0]]["momentum_buffer"]._data.data_ptr() != \
        mine.state[ours[0]]["momentum_buffer"]._data.data_ptr()
    for step in range(steps, steps + 2):
        _grads(ours, resumed, step)
        mine.step()
        again.step()
    for p, q in zip(ours, resumed):
        np.testing.assert_array_equal(p.numpy(), q.numpy())


def test_a_hand_written_optimizer_works_beside_schedulers_and_other_dtypes(tmp_path):
    serialization = pytest.importorskip("tritonad.serialization")
    p = td.tensor([1.0, -2.0], dtype=td.float64, requires_grad=True)  # fused Adam refuses it
    opt = MomentumSGD([p], lr=1.0, momentum=0.5)
    sched = lr_scheduler.OneCycleLR(opt, max_lr=1.0, total_steps=10)
    assert opt.param_groups[0]["momentum"] == 0.95  # cycled: it has a momentum default
    p.grad = td.tensor([1.0, 1.0], dtype=td.float64)
    opt.step()
    sched.step()
    assert p.dtype is td.float64 and p.tolist() == pytest.approx([1 - 0.04, -2 - 0.04])
    serialization.save(opt.state_dict(), tmp_path / "custom.td")
    loaded = serialization.load(tmp_path / "custom.td")
    assert loaded["state"][0]["momentum_buffer"].tolist() == [1.0, 1.0]
    opt.zero_grad(set_to_none=False)
    assert p.grad.tolist() == [0.0, 0.0]


def test_an_optimizer_without_a_rule_says_what_to_write():
    class Nothing(optim.Optimizer):
        def __init__(self, params):
            super().__init__(params, {})

    p = td.tensor([1.0], requires_grad=True)
    opt = Nothing([p])
    p.grad = td.ones(1)
    with pytest.raises(NotImplementedError, match=r"Nothing: implement update\(param, grad"):
        opt.step()


# ---------------------------------------------------------------------- schedulers vs torch


def _scheduled(name="SGD", groups=2):
    """A tritonad and a torch optimizer with the same groups (lr 0.1 and 0.02)."""
    def build(module, make):
        params = [{"params": [make()], "lr": 0.1}, {"params": [make()], "lr": 0.02}][:groups]
        return getattr(module, name)(params, **({"momentum": 0.9} if name in ("SGD", "RMSprop")
                                                 else {}))
    return (build(optim, lambda: td.tensor([1.0], requires_grad=True)),
            build(torch.optim, lambda: torch.tensor([1.0], requires_grad=True)))


SCHEDULERS = {  # kind: a builder from (module, optimizer, **last_epoch)
    "StepLR": lambda m, o, **k: m.StepLR(o, step_size=7, gamma=0.5, **k),
    "MultiStepLR": lambda m, o, **k: m.MultiStepLR(o, milestones=[3, 10, 10, 40], gamma=0.3, **k),
    "ExponentialLR": lambda m, o, **k: m.ExponentialLR(o, gamma=0.97, **k),
    "LinearLR": lambda m, o, **k: m.LinearLR(o, start_factor=0.05, total_iters=25, **k),
    "LinearLR-decay": lambda m, o, **k: m.LinearLR(o, start_factor=1.0, end_factor=0.1,
                                                   total_iters=60, **k),
    "ConstantLR": lambda m, o, **k: m.ConstantLR(o, factor=0.25, total_iters=6, **k),
    "LambdaLR": lambda m, o, **k: m.LambdaLR(o, [lambda e: 0.9 ** e, lambda e: 1 / (1 + e)], **k),
    "CosineAnnealingLR": lambda m, o, **k: m.CosineAnnealingLR(o, T_max=40, eta_min=1e-4, **k),
    "OneCycleLR": lambda m, o, **k: m.OneCycleLR(o, max_lr=[1.0, 0.5], total_steps=301, **k),
    "warm-up then cosine": lambda m, o, **k: m.SequentialLR(
        o, [m.LinearLR(o, start_factor=0.1, total_iters=10), m.CosineAnnealingLR(o, T_max=90)],
        milestones=[10], **k),
    "three phases": lambda m, o, **k: m.SequentialLR(
        o, [m.ConstantLR(o, factor=0.1, total_iters=4), m.ExponentialLR(o, gamma=0.95),
            m.MultiStepLR(o, milestones=[20, 50])], milestones=[5, 40], **k),
}


def _both(kind, opt, ref, **last_epoch):
    """The scheduler `kind` on our optimizer and torch's on theirs."""
    return (SCHEDULERS[kind](lr_scheduler, opt, **last_epoch),
            SCHEDULERS[kind](torch.optim.lr_scheduler, ref, **last_epoch))


def _step_alike(ours, theirs, opt, ref, steps, what):
    """Step both schedulers `steps` times: the same lrs after each step, exactly."""
    _same_lrs(ours, theirs, opt, ref, f"{what}, before stepping")
    for step in range(steps):
        ours.step()
        theirs.step()
        _same_lrs(ours, theirs, opt, ref, f"{what}, step {step + 1}")


def _same_lrs(ours, theirs, opt, ref, what):
    assert ours.get_last_lr() == theirs.get_last_lr(), what
    assert [g["lr"] for g in opt.param_groups] == [g["lr"] for g in ref.param_groups], what
    assert ours.last_epoch == theirs.last_epoch, what
    if "momentum" in opt.defaults:  # OneCycleLR cycles it (into RMSprop's device scalar)
        assert [g["momentum"] for g in opt.param_groups] == \
            [g["momentum"] for g in ref.param_groups], what


@pytest.fixture
def quiet():
    with warnings.catch_warnings():  # torch warns when a scheduler steps before its optimizer
        warnings.simplefilter("ignore")
        yield


@pytest.mark.parametrize("kind", list(SCHEDULERS))
def test_schedules_match_torch_exactly(kind, quiet):
    opt, ref = _scheduled("RMSprop" if kind == "OneCycleLR" else "SGD")
    _step_alike(*_both(kind, opt, ref), opt, ref, 300, kind)
    # the device scalars hold what the groups say
    for group, buckets in zip(opt.param_groups, opt._buckets):
        assert float(buckets[0].hyper[0]) == pytest.approx(group["lr"], rel=1e-6)


@pytest.mark.parametrize("kind", list(SCHEDULERS))
def test_scheduler_state_dict_round_trip(kind, quiet):
    """Saved after 37 steps, loaded into a fresh scheduler of a fresh optimizer (made before the
    optimizer's state is loaded, as torch's documentation says): the next 40 lrs are torch's."""
    opt, ref = _scheduled()
    ours, theirs = _both(kind, opt, ref)
    _step_alike(ours, theirs, opt, ref, 37, "before saving")
    state = ours.state_dict()
    assert "optimizer" not in state
    opt2, _ = _scheduled()
    resumed = SCHEDULERS[kind](lr_scheduler, opt2)  # before loading the optimizer, as torch
    opt2.load_state_dict(opt.state_dict())           # says: making it changes the lr
    resumed.load_state_dict(state)
    _step_alike(resumed, theirs, opt2, ref, 40, "resumed")


@pytest.mark.parametrize("kind", ["StepLR", "MultiStepLR", "ExponentialLR", "LinearLR",
                                  "CosineAnnealingLR"])
def test_last_epoch_resumes_as_torch(kind, quiet):
    """A scheduler made with last_epoch=k (on the optimizer it ran with) continues as torch's
    does, and step(epoch) jumps by the closed form as torch's."""
    opt, ref = _scheduled()
    _step_alike(*_both(kind, opt, ref), opt, ref, 12, "first run")
    ours, theirs = _both(kind, opt, ref, last_epoch=12)
    _step_alike(ours, theirs, opt, ref, 20, "resumed")
    ours.step(5)
    theirs.step(5)
    _step_alike(ours, theirs, opt, ref, 5, "after step(5)")


def test_a_tensor_learning_rate_is_filled_in_place():
    p = td.tensor([1.0], requires_grad=True)
    lr = td.tensor([0.5])
    opt = optim.SGD([p], lr=lr)
    sched = lr_scheduler.ExponentialLR(opt, gamma=0.5)
    sched.step()
    assert opt.param_groups[0]["lr"] is lr and lr.tolist() == [0.25]
    p.grad = td.ones(1)
    opt.step()
    assert p.tolist() == [0.75]


def test_scheduler_errors():
    opt, _ = _scheduled(groups=1)
    cases = [
        (lambda: lr_scheduler.StepLR(opt, step_size=0), "StepLR: step_size must be an int >= 1"),
        (lambda: lr_scheduler.MultiStepLR(opt, [2, -1]), "MultiStepLR: each milestone"),
        (lambda: lr_scheduler.LinearLR(opt, start_factor=0.0), "LinearLR: start_factor"),
        (lambda: lr_scheduler.LinearLR(opt, end_factor=1.5), "LinearLR: end_factor"),
        (lambda: lr_scheduler.LinearLR(opt, total_iters=0), "LinearLR: total_iters"),
        (lambda: lr_scheduler.ConstantLR(opt, factor=2.0), "ConstantLR: factor"),
        (lambda: lr_scheduler.CosineAnnealingLR(opt, T_max=0), "CosineAnnealingLR: T_max"),
        (lambda: lr_scheduler.LambdaLR(opt, [abs, abs]), "LambdaLR: expected 1 lr_lambdas"),
        (lambda: lr_scheduler.SequentialLR(opt, [lr_scheduler.StepLR(opt, 2)], [3]),
         "SequentialLR: expects one milestone fewer"),
        (lambda: lr_scheduler.SequentialLR(opt, [], []), "SequentialLR: expects at least one"),
    ]
    for make, message in cases:
        with pytest.raises(ValueError, match=message):
            make()
    other, _ = _scheduled(groups=1)
    with pytest.raises(ValueError, match="belongs to another optimizer"):
        lr_scheduler.SequentialLR(opt, [lr_scheduler.StepLR(opt, 2), lr_scheduler.StepLR(
            other, 2)], [3])
    with pytest.raises(TypeError, match="StepLR: expected an optimizer, got list"):
        lr_scheduler.StepLR([], 2)
    with pytest.raises(TypeError, match="LambdaLR: lr_lambda must be callable"):
        lr_scheduler.LambdaLR(opt, 0.5)


# ---------------------------------------------------------------------- GPU tier


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["Adadelta", "RMSprop", "Adagrad", "MomentumSGD"])
def test_captured_training_matches_eager(name):
    """The Trainer's captured steps (hyperparameters fed from a host table) with the new
    optimizers and a hand-written one train the CNN as eager steps do."""
    from tritonad import models, train

    def run(graph):
        td.manual_seed(0)
        train_set, _ = train.datasets("mnist")
        loader = td.data.DataLoader(train_set, 64, shuffle=True, device="cuda", limit=6 * 64)
        model = models.build("cnn").to("cuda")
        if name == "MomentumSGD":  # hyperparameters frozen at capture: no scheduler
            opt, sched = MomentumSGD(model.parameters(), lr=0.02), None
        else:
            opt = getattr(optim, name)(model.parameters(), **(
                dict(lr=1.0) if name == "Adadelta" else dict(lr=1e-3, momentum=0.5)
                if name == "RMSprop" else dict(lr=0.01)))
            sched = lr_scheduler.StepLR(opt, step_size=2, gamma=0.7)
        trainer = train.Trainer(model, opt, loader, sched, graph=graph)
        trainer.train_epoch(progress=False)
        assert trainer.captured_step is None or trainer.captured_step.captured
        return {k: v.numpy() for k, v in model.state_dict().items()}

    eager, graphed = run(False), run(True)
    for key in eager:
        assert_close(graphed[key], eager[key], 1e-4, 1e-5, name=key)
