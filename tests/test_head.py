"""The classifier head, linear + cross-entropy as one node (tritonad/kernels/head.py,
nn_ops.LinearCrossEntropy, F.linear_cross_entropy), against the numpy reference in float64 (the
three steps it replaces: matmul, cross_entropy, matmul); the reference itself checked against
torch's CPU implementation and float64 finite differences.

CPU: the kernels run under Triton's interpreter. The `blocks` settings send small batches
through the many-row-block path (count, partials, rows, reduce), and `steps` makes the split-K
slices take several K steps and dx many feature blocks.
"""
import contextlib

import numpy as np
import pytest
import torch
from helpers import assert_close, check_op, check_primitive, random_array, read_device
from hypothesis import given, settings
from hypothesis import strategies as st

import tritonad as td
import tritonad.nn.functional as F
from tritonad import nn, train
from tritonad.autodiff import gradcheck, nn_ops
from tritonad.backend import matmul_precision
from tritonad.kernels import head, launch, plans
from tritonad.reference import NumpyBackend

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # the triton backend's
DTYPES = [td.float32, td.float16, td.bfloat16]

# alternative settings of kernels/head.py (the shipped ones take the one-row-block path for
# batches up to SINGLE_ROWS)
BLOCKS = {"SINGLE_ROWS": 0, "BLOCK_M": 16, "PART_M": 16}
STEPS = {"BLOCK_K": 16, "MAX_SPLITS": 3, "DX_PROGRAMS": 1}
PATHS = {"shipped": {}, "blocks": BLOCKS, "steps": STEPS, "both": {**BLOCKS, **STEPS}}


@contextlib.contextmanager
def path(name):
    with pytest.MonkeyPatch.context() as mp:
        for setting, value in PATHS[name].items():
            mp.setattr(head, setting, value)
        yield


@pytest.fixture(autouse=True)
def _triton_backend():
    with td.use_backend("triton"):
        yield


def problem(n, k, c, dtype=td.float32, ignore=0.0, ignore_index=-100, seed=0):
    """Raw (x [n, k], w [c, k], b [c], target [n]): weights scaled so the logits are O(1)."""
    x = random_array((n, k), dtype, low=-2, high=2, seed=seed)
    scale = 1.0 / max(k, 1) ** 0.5
    w = random_array((c, k), dtype, low=-2 * scale, high=2 * scale, seed=seed + 1)
    b = random_array((c,), dtype, low=-1, high=1, seed=seed + 2)
    rng = np.random.default_rng(seed + 3)
    t = np.where(rng.random(n) < ignore, ignore_index, rng.integers(0, max(c, 1), n))
    return x, w, b, torch.from_numpy(t).to(DEVICE)


def torch_head(x, w, b, t, reduction, ignore_index, smoothing):
    """torch's loss and gradients (x, w, b) of cross_entropy(x @ w^T + b) in float64 on the CPU
    (the sum of the losses for "none")."""
    leaves = [torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in (x, w, b)]
    logits = torch.nn.functional.linear(*leaves)
    loss = torch.nn.functional.cross_entropy(logits, torch.tensor(t), reduction=reduction,
                                             ignore_index=ignore_index, label_smoothing=smoothing)
    (loss.sum() if reduction == "none" else loss).backward()
    return loss.detach(), [leaf.grad for leaf in leaves]


# ----------------------------------------------------------------------------- the reference


@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
def test_reference_agrees_with_torch_and_finite_differences(reduction):
    rng = np.random.default_rng(1)
    x, w, b = rng.standard_normal((6, 5)), rng.standard_normal((4, 5)), rng.standard_normal(4)
    t = np.array([1, -100, 3, 0, 3, 2])
    with td.use_backend("numpy"):
        leaves = [td.tensor(a, dtype=td.float64, requires_grad=True) for a in (x, w, b)]
        loss = F.linear_cross_entropy(*leaves, td.tensor(t), reduction, label_smoothing=0.2)
        (loss.sum() if reduction == "none" else loss).backward()
        want_loss, want_grads = torch_head(x, w, b, t, reduction, -100, 0.2)
        assert_close(loss, want_loss, 1e-12, 1e-12, name="loss")
        for leaf, want in zip(leaves, want_grads):
            assert_close(leaf.grad, want, 1e-12, 1e-12, name="gradient")
        gradcheck(lambda x, w, b: F.linear_cross_entropy(x, w, b, td.tensor(t), reduction,
                                                         label_smoothing=0.2),
                  [td.tensor(a, dtype=td.float64, requires_grad=True) for a in (x, w, b)])


# ----------------------------------------------------------------------------- the primitive


SHAPES = [(1, 1, 1), (3, 70, 10), (20, 33, 64), (45, 130, 7), (130, 20, 3)]


@given(shape=st.sampled_from(SHAPES), reduction=st.sampled_from(["none", "sum", "mean"]),
       ignore=st.sampled_from([0.0, 0.3]), smoothing=st.sampled_from([0.0, 0.1, 1.0]),
       dtype=st.sampled_from(DTYPES), bias=st.booleans(),
       grads=st.sampled_from([(True, True), (True, False), (False, False)]),
       route=st.sampled_from(sorted(PATHS)))
@settings(max_examples=30)
def test_matches_reference(shape, reduction, ignore, smoothing, dtype, bias, grads, route):
    """Loss, dlogits and dx (as asked for) on odd shapes, every reduction, ignored rows, label
    smoothing, half types, with and without a bias, down every path of the kernels."""
    x, w, b, t = problem(*shape, dtype, ignore, ignore_index=-1, seed=5)
    with path(route):
        check_primitive("linear_cross_entropy", x, w, b if bias else None, t, reduction, -1,
                        smoothing, compute_grad=grads[0], input_grad=grads[1])


@pytest.mark.parametrize("route", sorted(PATHS))
def test_strided_operands(route):
    """Operands are read through their strides: a transposed and a broadcast input, a weight
    slice and a transposed one, a bias and a target with stride 2."""
    x, w, b, t = problem(33, 40, 9, seed=6)
    t2 = torch.stack([t, t], 1).reshape(-1)[::2]                # target with stride 2
    b2 = torch.stack([b, b], 1).reshape(-1)[::2]                # bias with stride 2
    wide = problem(33, 80, 9, seed=7)[1][:, ::2]                # weight with K stride 2
    with path(route):
        check_primitive("linear_cross_entropy", x.t().contiguous().t(), w, b2, t2, "mean",
                        -100, 0.1)
        check_primitive("linear_cross_entropy", x, wide, b, t, "none")
        check_primitive("linear_cross_entropy", x, w.t().contiguous().t(), None, t, "sum")
        check_primitive("linear_cross_entropy", x[:1].expand(33, 40), w, b, t, "mean")


@pytest.mark.parametrize("route", ["shipped", "blocks"])
def test_edge_values(route):
    """Infinite and NaN inputs give the reference's NaN / inf losses; large logits stay finite;
    a batch of only ignored rows has mean NaN (0 / 0, as torch) and zero gradients."""
    x, w, b, t = problem(12, 16, 5, seed=8)
    x[2, 3] = float("inf")
    x[5, 0] = float("nan")
    x[7] *= 1e4
    with path(route):
        check_primitive("linear_cross_entropy", x, w, b, t, "none", -100, 0.1)
        loss, dlogits, dx = head.linear_cross_entropy(x[8:], w, b, torch.full_like(t[8:], -100))
    assert np.isnan(loss.item())
    assert not dlogits.cpu().numpy().any() and not dx.cpu().numpy().any()


def test_empty_batch_and_empty_features():
    x, w, b, t = problem(0, 7, 3)
    loss, dlogits, dx = head.linear_cross_entropy(x, w, b, t)
    assert np.isnan(loss.item()) and dlogits.shape == (0, 3) and dx.shape == (0, 7)
    x, w, b, t = problem(6, 0, 3)       # no features: the logits are the bias
    check_primitive("linear_cross_entropy", x, w, b, t, "sum")


def test_wide_classes_take_the_three_kernels(monkeypatch):
    """More classes than a register tile holds: the composed path, same results."""
    monkeypatch.setattr(head, "MAX_CLASSES", 4)
    log = count_launches(monkeypatch)
    check_primitive("linear_cross_entropy", *problem(9, 20, 6, seed=9), "mean", -100, 0.2)
    assert not log


class _CountLaunches:
    """Stands in for a kernel and logs its launches."""

    def __init__(self, name, kernel, log):
        self.name, self.kernel, self.log = name, kernel, log

    def __getitem__(self, grid):
        self.log.append(self.name)
        return self.kernel[grid]


def count_launches(monkeypatch):
    log = []
    for name in ("_head_partials_kernel", "_ce_count_kernel", "_head_kernel",
                 "_head_reduce_kernel"):
        monkeypatch.setattr(head, name, _CountLaunches(name, getattr(head, name), log))
    plans.clear_plans()  # (a recorded plan would replay the kernels themselves)
    return log


@pytest.mark.parametrize("n, reduction, metrics, route, launches", [
    (100, "mean", True, "shipped", 2),     # MNIST-sized: partials, then everything else
    (100, "none", False, "shipped", 2),
    (40, "mean", True, "blocks", 4),       # partials, count, rows, reduce
    (40, "none", True, "blocks", 4),
    (40, "none", False, "blocks", 3),      # (nothing to reduce)
])
def test_launch_count(monkeypatch, n, reduction, metrics, route, launches):
    log = count_launches(monkeypatch)
    x, w, b, t = problem(n, 24, 10)
    totals = (torch.zeros((), device=DEVICE), torch.zeros((), dtype=torch.int64, device=DEVICE))
    with path(route):
        head.linear_cross_entropy(x, w, b, t, reduction, metrics=totals if metrics else None)
    assert len(log) == launches, log


@pytest.mark.parametrize("route", ["shipped", "blocks"])
@pytest.mark.parametrize("reduction", ["none", "mean"])
def test_metrics(route, reduction):
    """The training loop's totals, as cross_entropy's with metrics on the same logits: the
    summed row losses, and rows whose first largest logit is the target, with ties (the first
    wins), a NaN row (NaN is the largest) and ignored rows (never correct). An identity
    weight makes the logits x exactly (integers: no rounding), so the ties survive the
    product; the NaN makes its whole row NaN (NaN * 0), whose prediction is column 0."""
    x = random_array((37, 7), td.float32, low=-3, high=3, seed=10).round()
    x[0] = 1.0                       # all tied: column 0 is the prediction
    x[1, 2] = x[1, 5] = 9.0          # a tie at 2 and 5: 2
    x[2, 3] = float("nan")           # a row of NaN logits: 0
    t = problem(37, 7, 7, ignore=0.2, seed=11)[3]
    t[:4] = torch.tensor([0, 5, 0, -100])
    eye = random_array((7, 7), td.float32, low=0, high=0, seed=0)
    eye[range(7), range(7)] = 1.0
    logits = td.get_backend().matmul(x, eye.t())

    def totals():
        return (torch.full((), 1.5, device=DEVICE),
                torch.full((), 4, dtype=torch.int64, device=DEVICE))
    got, want = totals(), totals()
    with path(route):
        loss = head.linear_cross_entropy(x, eye, None, t, reduction, metrics=got)[0]
    want_loss = td.get_backend().cross_entropy(logits, t, reduction, metrics=want)[0]
    assert got[1].item() == want[1].item() >= 4 + 2
    assert_close(got[0].item(), want[0].item(), 1e-5, 1e-4, name="loss_total")
    assert_close(loss, want_loss, 1e-5, 1e-5, name="loss")


@pytest.mark.parametrize("route", ["shipped", "blocks"])
def test_bad_targets_are_named(route):
    x, w, b, _ = problem(4, 6, 5)
    with path(route):
        with pytest.raises(ValueError, match=r"cross_entropy: target 5 is outside \[0, 5\) "
                                             r"\(at row 2\)"):
            read_device(head.linear_cross_entropy(x, w, b, torch.tensor([0, 1, 5, 7],
                                                                        device=DEVICE))[0])
        with pytest.raises(ValueError, match=r"target -3 .* \(at row 0\)"):
            F.linear_cross_entropy(*(td.from_torch(a) for a in (x, w, b)),
                                   td.tensor(np.array([-3, 1, 2, 0]))).item()


@pytest.mark.parametrize("backend", ["triton", "numpy"])
def test_bad_input_is_named(backend):
    x, w, b, t = (td.from_torch(a.cpu() if backend == "numpy" else a) for a in problem(4, 6, 5))
    with td.use_backend(backend):
        with pytest.raises(ValueError, match=r"linear_cross_entropy: expected input \[N, in\] "
                                             r"and weight \[classes, in\], got input \(4, 6\) "
                                             r"and weight \(5, 7\)"):
            F.linear_cross_entropy(x, td.zeros((5, 7)), None, t)
        with pytest.raises(ValueError, match=r"bias of shape \(4,\) does not match weight"):
            F.linear_cross_entropy(x, w, b[:4], t)
        with pytest.raises(ValueError, match=r"input \(4, 6\) and target \(3,\)"):
            F.linear_cross_entropy(x, w, b, t[:3])
        with pytest.raises(TypeError, match="target must be an int64"):
            F.linear_cross_entropy(x, w, b, x[:, 0])
        with pytest.raises(TypeError, match="linear_cross_entropy"):
            F.linear_cross_entropy(x, w.to(td.float64), b, t)
        with pytest.raises(ValueError, match="reduction must be one of"):
            F.linear_cross_entropy(x, w, b, t, reduction="avg")
        with pytest.raises(ValueError, match="label_smoothing"):
            F.linear_cross_entropy(x, w, b, t, label_smoothing=2.0)


def test_primitive_checks_its_arguments():
    x, w, b, t = problem(4, 6, 5)
    with pytest.raises(ValueError, match=r"linear_cross_entropy: expected input \[N, K\] and "
                                         r"weight \[C, K\]"):
        head.linear_cross_entropy(x, w[:, :5], b, t)
    with pytest.raises(TypeError, match="one dtype"):
        head.linear_cross_entropy(x, w.double(), b, t)
    with pytest.raises(TypeError, match="target must be int64"):
        head.linear_cross_entropy(x, w, b, t.float())
    with pytest.raises(ValueError, match="has no classes"):
        head.linear_cross_entropy(x, w[:0], None, t)
    with pytest.raises(ValueError, match="metrics loss_total must be one floating point"):
        head.linear_cross_entropy(x, w, b, t, metrics=(torch.zeros(2, device=DEVICE),
                                                       torch.zeros((), dtype=torch.int64,
                                                                   device=DEVICE)))


# ----------------------------------------------------------------------------- autodiff level


def test_autodiff_against_reference():
    """Forward and every gradient under a random cotangent (a seed that is not 1: the backward
    then scales dlogits and recomputes dx), reductions, smoothing, ignore_index, no bias."""
    rng = np.random.default_rng(12)
    x, w, b = rng.uniform(-2, 2, (9, 13)), rng.uniform(-1, 1, (6, 13)), rng.uniform(-1, 1, 6)
    t = np.array([0, 5, -100, 3, 3, 1, -100, 2, 5])
    for reduction in ("mean", "sum", "none"):
        check_op(lambda x, w, b, t, r=reduction: F.linear_cross_entropy(x, w, b, t, r),
                 x, w, b, t)
    check_op(lambda x, w, t: F.linear_cross_entropy(x, w, None, t, label_smoothing=0.3,
                                                    ignore_index=3), x, w, np.abs(t) % 6)
    with path("blocks"):
        check_op(lambda x, w, b, t: F.linear_cross_entropy(x, w, b, t), x, w, b, t)


@pytest.mark.parametrize("route", ["shipped", "blocks"])
def test_unit_seed_uses_the_forward_gradients(route):
    """loss.backward(): the gradients of the composed ops (linear, cross_entropy), with dx the
    forward kernel's (no product in the backward but dw's)."""
    x, w, b, t = problem(20, 30, 8, seed=13)
    leaves = [td.from_torch(a).requires_grad_() for a in (x, w, b)]
    plain = [td.from_torch(a).requires_grad_() for a in (x, w, b)]
    with path(route):
        loss = F.linear_cross_entropy(*leaves, td.from_torch(t))
        assert loss.grad_fn.function is nn_ops.LinearCrossEntropy
        loss.backward()
    want = F.cross_entropy(F.linear(*plain), td.from_torch(t))
    want.backward()
    assert_close(loss.item(), want.item(), 1e-6, 1e-6, name="loss")
    for got, expected in zip(leaves, plain):
        assert_close(got.grad, expected.grad, 1e-5, 1e-6, name="gradient")


@pytest.mark.parametrize("needs", [(True, False, False), (False, True, True),
                                   (False, True, False), (False, False, True)])
def test_only_the_gradients_asked_for(needs):
    x, w, b, t = problem(11, 9, 4, seed=14)
    leaves = [td.from_torch(a).requires_grad_(need) for a, need in zip((x, w, b), needs)]
    plain = [td.from_torch(a).requires_grad_(need) for a, need in zip((x, w, b), needs)]
    F.linear_cross_entropy(*leaves, td.from_torch(t), "sum").backward()
    F.cross_entropy(F.linear(*plain), td.from_torch(t), reduction="sum").backward()
    for got, expected in zip(leaves, plain):
        assert (got.grad is None) == (expected.grad is None)
        if got.grad is not None:
            assert_close(got.grad, expected.grad, 1e-5, 1e-5, name="gradient")


def test_with_metrics_and_no_grad():
    x, w, b, t = (td.from_torch(a) for a in problem(15, 12, 5, seed=15))
    totals = [td.zeros((), device=x.device), td.zeros((), dtype="int64", device=x.device)]
    with td.no_grad():
        loss = nn_ops.linear_cross_entropy_with_metrics(x, w, b, t, *totals, reduction="sum")
    logits = F.linear(x, w, b)
    assert_close(loss.item(), F.cross_entropy(logits, t, reduction="sum").item(), 1e-5, 1e-5)
    assert_close(totals[0].item(), loss.item(), 1e-6, 1e-6, name="loss_total")
    assert totals[1].item() == int((logits.numpy().argmax(1) == t.numpy()).sum())
    with pytest.raises(TypeError, match="loss_total must be a tensor"):
        nn_ops.linear_cross_entropy_with_metrics(x, w, b, t, 0.0, totals[1])


# ----------------------------------------------------------------------------- the Trainer


@pytest.mark.parametrize("backend", ["triton", "numpy"])
def test_trainer_runs_a_last_linear_with_its_loss(backend):
    """loss_with_metrics: a Sequential ending in a Linear takes the fused node, with the loss,
    totals and gradients of model(x) then cross_entropy; other models take cross_entropy."""
    device = DEVICE if backend == "triton" else "cpu"
    with td.use_backend(backend):
        td.manual_seed(0)
        model = nn.Sequential(nn.Flatten(), nn.Linear(12, 16), nn.ReLU(), nn.Linear(16, 5))
        model.to(device)
        x = td.tensor(np.random.default_rng(16).standard_normal((10, 3, 4)), dtype=td.float32,
                      device=device)
        y = td.tensor(np.random.default_rng(17).integers(0, 5, 10), device=device)
        results = []
        for fused in (True, False):
            totals = [td.zeros((), device=device), td.zeros((), dtype="int64", device=device)]
            for p in model.parameters():
                p.grad = None
            if fused:
                loss = train.loss_with_metrics(model, x, y, *totals)
                assert loss.grad_fn.function is nn_ops.LinearCrossEntropy
            else:
                loss = nn_ops.cross_entropy_with_metrics(model(x), y, *totals)
            loss.backward()
            results.append([loss.item(), totals[0].item(), totals[1].item()]
                           + [p.grad.numpy() for p in model.parameters()])
        for got, want in zip(*results):
            assert_close(got, want, 1e-5, 1e-6)
        assert train.classifier_head(model) is model[-1]
        assert train.classifier_head(nn.Sequential(nn.Linear(3, 3), nn.ReLU())) is None
        assert train.classifier_head(nn.Linear(3, 3)) is None


# ----------------------------------------------------------------------------- GPU tier


def _torch_problem(n, k, c, dtype, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(n, k, device="cuda", generator=g).to(dtype)
    w = (torch.randn(c, k, device="cuda", generator=g) / k ** 0.5).to(dtype)
    b = torch.randn(c, device="cuda", generator=g).to(dtype)
    t = torch.randint(0, c, (n,), device="cuda", generator=g)
    t[::7] = -100
    return x, w, b, t


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(100, 512, 10), (128, 784, 10), (1024, 2048, 64),
                                   (4097, 300, 33), (1, 5, 2)])
@pytest.mark.parametrize("dtype, precision", [(torch.float32, "highest"),
                                              (torch.float32, "high"),
                                              (torch.bfloat16, "highest"),
                                              (torch.float16, "highest")])
def test_gpu_against_torch(shape, dtype, precision):
    """Loss, dlogits and dx against torch's (float64) at tolerances of the precision: exact
    float32 (3xTF32) at float32's, TF32 and half types at theirs."""
    x, w, b, t = _torch_problem(*shape, dtype)
    previous = matmul_precision()
    td.set_matmul_precision(precision)
    try:
        loss, dlogits, dx = head.linear_cross_entropy(x, w, b, t, "mean", -100, 0.1)
    finally:
        td.set_matmul_precision(previous)
    leaves = [a.double().requires_grad_() for a in (x, w, b)]
    logits = torch.nn.functional.linear(*leaves)
    logits.retain_grad()
    want = torch.nn.functional.cross_entropy(logits, t, label_smoothing=0.1)
    want.backward()
    k = shape[1]
    name = "tf32" if precision == "high" and dtype == torch.float32 else \
        td.dtypes.get_dtype(dtype).name
    rtol, atol = {"float32": (1e-5, 1e-6), "tf32": (1e-3, 1e-4), "float16": (5e-3, 1e-3),
                  "bfloat16": (3e-2, 1e-2)}[name]
    grow = max(1.0, k ** 0.5 / 8)  # the product's rounding grows with K
    assert_close(loss, want, rtol * grow, atol * grow, name="loss")
    assert_close(dlogits, logits.grad, rtol * grow, atol * grow, name="dlogits")
    assert_close(dx, leaves[0].grad, rtol * grow, atol * grow, name="dx")


@pytest.mark.gpu
def test_gpu_deterministic_and_captured():
    """The same inputs give the same bits on every call, eager and replayed from a CUDA graph
    (no atomics); metrics accumulate across replays."""
    for shape in ((100, 512, 10), (3000, 256, 20)):
        x, w, b, t = _torch_problem(*shape, torch.float32, seed=1)
        first = head.linear_cross_entropy(x, w, b, t)
        again = head.linear_cross_entropy(x, w, b, t)
        for a, c in zip(first, again):
            assert torch.equal(a, c)
        totals = (torch.zeros((), device="cuda"), torch.zeros((), dtype=torch.int64,
                                                              device="cuda"))
        graph = torch.cuda.CUDAGraph()
        head.linear_cross_entropy(x, w, b, t, metrics=totals)  # (plans and compiles first)
        with torch.cuda.graph(graph):
            captured = head.linear_cross_entropy(x, w, b, t, metrics=totals)
        totals[0].zero_()
        totals[1].zero_()
        for _ in range(3):
            graph.replay()
        torch.cuda.synchronize()
        for a, c in zip(first, captured):
            assert torch.equal(a, c)
        assert_close(totals[0].item(), 3 * first[0].item() * (t != -100).sum().item(), 1e-5,
                     1e-3, name="loss_total")
