"""Softmax, log-softmax and the fused cross-entropy (tritonad/kernels/softmax.py) against the
numpy reference in float64; the reference itself checked against torch's CPU implementation and
float64 finite differences.

CPU: the kernels run under Triton's interpreter. Wide rows take the streamed (two-pass) path
naturally above SINGLE_BLOCK_MAX columns; the `streamed` fixture shrinks the block sizes so that
the same path also runs on small shapes, block boundaries, -inf blocks and all.
"""
import numpy as np
import pytest
import torch
from helpers import (assert_close, check_op, check_primitive, random_array, read_device,
                     tolerance)
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import tritonad as td
import tritonad.nn.functional as F
from tritonad import nn
from tritonad.autodiff import gradcheck
from tritonad.kernels import softmax as kernels
from tritonad.reference import NumpyBackend, from_numpy

INF = float("inf")
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # the triton backend's
DTYPES = [td.float32, td.float16, td.bfloat16]

# ----------------------------------------------------------------------------- references
# The oracle is the numpy backend (tritonad.reference) in float64. torch's CPU softmax and
# cross-entropy (an independent implementation) check it on finite inputs.


def torch_cross_entropy(x, t, reduction, ignore_index, smoothing):
    """torch's loss and d(loss)/dx for a float64 CPU x (the sum of the losses for "none")."""
    x = x.detach().clone().requires_grad_()
    loss = torch.nn.functional.cross_entropy(x, t, reduction=reduction, ignore_index=ignore_index,
                                             label_smoothing=smoothing)
    (loss.sum() if reduction == "none" else loss).backward()
    return loss.detach(), x.grad


def logits(n, c, dtype=td.float32, scale=3.0, seed=0):
    """Raw [n, c] logits uniform in [-scale, scale]."""
    return random_array((n, c), dtype, low=-scale, high=scale, seed=seed)


def targets(n, c, ignore=0.0, ignore_index=-100, dtype=torch.int64, seed=0):
    """Raw [n] class indices, a fraction `ignore` of them set to ignore_index."""
    rng = np.random.default_rng(seed)
    t = np.where(rng.random(n) < ignore, ignore_index, rng.integers(0, c, n))
    return torch.from_numpy(t).to(DEVICE, dtype)


def on_device(values):
    """A raw int64 array of `values` on the triton backend's device."""
    return torch.tensor(values).to(DEVICE)


@pytest.fixture(autouse=True)
def _triton_backend():
    with td.use_backend("triton"):
        yield


@pytest.fixture
def streamed(monkeypatch):
    """Tiny blocks: every row of more than 8 columns takes the two-pass streamed path."""
    monkeypatch.setattr(kernels, "SINGLE_BLOCK_MAX", 8)
    monkeypatch.setattr(kernels, "LOOP_BLOCK", 8)


@given(shape=st.sampled_from([(1, 1), (3, 7), (6, 33), (40, 5)]),
       reduction=st.sampled_from(["none", "sum", "mean"]),
       ignore=st.sampled_from([0.0, 0.4]), smoothing=st.sampled_from([0.0, 0.1, 1.0]))
@settings(max_examples=20)
def test_reference_agrees_with_torch(shape, reduction, ignore, smoothing):
    ref = NumpyBackend()
    x = random_array(shape, td.float64, device="cpu", seed=1)
    for dim in range(2):
        assert_close(ref.softmax(x, dim), torch.softmax(x, dim), 1e-12, 1e-14)
        assert_close(ref.log_softmax(x, dim), torch.log_softmax(x, dim), 1e-12, 1e-14)
    t = targets(shape[0], shape[1], ignore, seed=2).cpu()
    loss, grad = ref.cross_entropy(x, t, reduction, -100, smoothing)
    want_loss, want_grad = torch_cross_entropy(x, t, reduction, -100, smoothing)
    assert_close(loss, want_loss, 1e-12, 1e-12, name="loss")
    assert_close(grad, want_grad, 1e-12, 1e-12, name="grad")  # "none": per-row gradients


def test_reference_gradients_match_finite_differences():
    rng = np.random.default_rng(3)
    with td.use_backend("numpy"):
        x = td.tensor(rng.standard_normal((4, 5)), dtype=td.float64, requires_grad=True)
        t = td.tensor(np.array([1, -100, 4, 0]))
        gradcheck(lambda x: x.softmax(1), [x])
        gradcheck(lambda x: x.log_softmax(0), [x])
        for reduction in ("none", "sum", "mean"):
            gradcheck(lambda x, r=reduction: F.cross_entropy(x, t, reduction=r,
                                                             label_smoothing=0.2), [x])
        with td.no_grad():  # the primitive backward formulas themselves
            ref, dy = NumpyBackend(), td.tensor(rng.standard_normal((4, 5)))._data
            y = ref.softmax(x._data, 1)
            jvp = ref.softmax_backward(dy, y, 1)
            eps = 1e-6
            for i, j in [(0, 0), (2, 3)]:
                bump = x._data.clone()
                bump[i, j] += eps
                fd = ((ref.softmax(bump, 1) - y) * dy).sum() / eps
                assert abs(float(fd) - float(jvp[i, j])) < 1e-5


# ----------------------------------------------------------------------------- softmax


SHAPES = [((7,), 0), ((1, 1), 1), ((3, 7), 1), ((3, 7), 0), ((45, 65), 1), ((1, 1023), 1),
          ((2, 3, 5), 1), ((4, 1, 6, 3), 2), ((4, 1, 6, 3), 0), ((5000, 3), 1), ((3, 5000), 0),
          ((2, 40000), 1)]


@given(case=st.sampled_from(SHAPES), dtype=st.sampled_from(DTYPES),
       scale=st.sampled_from([3.0, 1e4]), name=st.sampled_from(["softmax", "log_softmax"]))
def test_softmax_matches_reference(case, dtype, scale, name):
    shape, dim = case
    x = random_array(shape, dtype, low=-scale, high=scale, seed=4)
    check_primitive(name, x, dim)


@given(case=st.sampled_from(SHAPES[:9]), dtype=st.sampled_from(DTYPES),
       name=st.sampled_from(["softmax", "log_softmax"]))
def test_softmax_backward_matches_reference(case, dtype, name):
    shape, dim = case
    y = getattr(NumpyBackend(), name)(random_array(shape, dtype, device="cpu", seed=5), dim)
    y = y.to(DEVICE)
    check_primitive(f"{name}_backward", random_array(shape, dtype, seed=6), y, dim)


def infinite_rows(n_cols, dtype=td.float32):
    """Rows: all -inf; -inf then -1e4 (a -inf first block, then a max whose exp(-m) overflows);
    -inf mixed with finite; one +inf; a NaN; and a plain row."""
    rows = np.full((6, n_cols), -INF)
    rows[1, n_cols // 2:] = -1e4 + np.arange(n_cols - n_cols // 2)
    rows[2, ::3] = np.linspace(-2, 2, len(rows[2, ::3]))
    rows[3] = np.linspace(-1, 1, n_cols)
    rows[3, n_cols // 3] = INF
    rows[4] = 0.5
    rows[4, -1] = np.nan
    rows[5] = np.linspace(-3, 3, n_cols)
    return from_numpy(rows, dtype).to(DEVICE)


@pytest.mark.parametrize("path", ["single", "streamed"])
@pytest.mark.parametrize("n_cols", [1, 5, 37])
def test_softmax_rows_of_infinities(path, n_cols, request):
    """Rows of -inf give NaN (0 / 0) and NaN from log, exactly as the reference; -inf entries
    give 0 and -inf; the streamed path's online sum survives blocks of nothing but -inf."""
    if path == "streamed":
        request.getfixturevalue("streamed")
    x = infinite_rows(n_cols)
    for name in ("softmax", "log_softmax"):
        y = check_primitive(name, x, 1)
        check_primitive(f"{name}_backward", random_array(tuple(x.shape), seed=7), y, 1)


@pytest.mark.usefixtures("streamed")
@pytest.mark.parametrize("case", [((3, 37), 1), ((37, 3), 0), ((2, 20, 3), 1), ((1, 9), 1)])
def test_softmax_streamed_path(case):
    shape, dim = case
    x = random_array(shape, low=-1e4, high=1e4, seed=8)
    for name in ("softmax", "log_softmax"):
        y = check_primitive(name, x, dim)
        check_primitive(f"{name}_backward", random_array(shape, seed=9), y, dim)


def test_softmax_strided_inputs_are_read_in_place():
    base = random_array((6, 10, 8), seed=10)
    cases = [
        (base.transpose(0, 2), 0),                  # reduced dim contiguous in memory
        (base.transpose(0, 2), 2),                  # reduced dim of stride 80
        (base[:, ::3, 1::2], 1),                    # steps and offsets
        (random_array((1, 9), seed=11).expand(5, 9), 1),   # broadcast rows (stride 0)
        (random_array((7, 1), seed=12).expand(7, 6), 1),   # broadcast columns (stride 0)
        (base.permute(1, 0, 2)[2:], 2),
    ]
    for x, dim in cases:
        for name in ("softmax", "log_softmax"):
            y = check_primitive(name, x, dim)
            assert y.is_contiguous()
            check_primitive(f"{name}_backward", x, y.transpose(0, 1).contiguous().transpose(0, 1),
                            dim)


def test_softmax_more_than_three_row_groups():
    """Five dims permuted so that no two row dims merge: the outer groups are looped on the host."""
    x = random_array((3, 2, 4, 2, 5), seed=13).permute(4, 2, 0, 3, 1)
    y = kernels.softmax(x, 2)
    assert len(kernels._row_views(2, y, x)) > 1
    check_primitive("softmax", x, 2)
    check_primitive("log_softmax_backward", x, random_array(tuple(x.shape), seed=14), 1)


def test_softmax_widest_rows():
    """131072 classes (the streamed path at its real block size) and 0-d / empty inputs."""
    x = random_array((1, 131072), low=-20, high=20, seed=15)
    y = check_primitive("softmax", x, 1)
    check_primitive("softmax_backward", random_array((1, 131072), seed=16), y, 1)
    check_primitive("log_softmax", random_array((2, 40000), td.bfloat16, seed=17), 1)
    assert_close(kernels.softmax(random_array((), seed=18), 0), 1.0, 0, 0)
    assert kernels.log_softmax(random_array((0, 5)), 1).shape == (0, 5)
    assert kernels.softmax(random_array((4, 0)), 1).shape == (4, 0)


# ----------------------------------------------------------------------------- cross-entropy


CE_SHAPES = [(1, 1), (1, 7), (128, 10), (45, 65), (7, 1000), (1025, 5), (5000, 3), (3, 40000)]


@given(shape=st.sampled_from(CE_SHAPES), reduction=st.sampled_from(["none", "sum", "mean"]),
       ignore=st.sampled_from([0.0, 0.3]), smoothing=st.sampled_from([0.0, 0.1, 1.0]),
       dtype=st.sampled_from(DTYPES), scale=st.sampled_from([3.0, 1e4]),
       target_dtype=st.sampled_from([torch.int64, torch.int32]))
@settings(max_examples=30)
def test_cross_entropy_matches_reference(shape, reduction, ignore, smoothing, dtype, scale,
                                         target_dtype):
    n, c = shape
    assume(not (dtype is td.float16 and scale == 1e4 and reduction == "sum"))  # > 65504
    x = logits(n, c, dtype, scale, seed=19)
    t = targets(n, c, ignore, ignore_index=-1, dtype=target_dtype, seed=20)
    check_primitive("cross_entropy", x, t, reduction, -1, smoothing)


@pytest.mark.parametrize("path", ["single", "streamed"])
@pytest.mark.parametrize("smoothing", [0.0, 0.25])
def test_cross_entropy_rows_of_infinities(path, smoothing, request):
    """Kept rows of -inf: NaN loss and gradient, as the reference; a target on a -inf logit:
    +inf loss; ignored rows of -inf: exactly 0 and 0 (backend.py: ignored rows give 0 and 0)."""
    if path == "streamed":
        request.getfixturevalue("streamed")
    x = infinite_rows(37)
    for t in ([4, 1, 1, 2, 0, 9], [-100, 1, 0, 2, 0, -100], [0, 0, 0, 0, 0, 0]):
        t = on_device(t)
        for reduction in ("none", "sum", "mean"):
            _, grad = check_primitive("cross_entropy", x, t, reduction, -100, smoothing)
            ignored = (t == -100).cpu().numpy()
            assert (grad.cpu().numpy()[ignored] == 0).all()


def test_cross_entropy_counts_only_kept_rows():
    x = logits(6, 4)
    t = on_device([-100, -100, -100, -100, -100, -100])
    loss, grad = kernels.cross_entropy(x, t, "mean")
    assert np.isnan(loss.item()) and (grad.cpu().numpy() == 0).all()  # 0 / 0, as torch
    loss, grad = kernels.cross_entropy(x, t, "sum")
    assert loss.item() == 0 and (grad.cpu().numpy() == 0).all()
    t = on_device([1, -100, 3, -100, 0, 2])  # the mean divides by 4, not 6
    loss, grad = check_primitive("cross_entropy", x, t, "mean")
    assert_close(loss, kernels.cross_entropy(x, t, "sum")[0].item() / 4, 1e-6, 0)


@pytest.mark.usefixtures("streamed")
@given(shape=st.sampled_from([(1, 9), (3, 37), (20, 16), (300, 11)]),
       reduction=st.sampled_from(["none", "sum", "mean"]),
       smoothing=st.sampled_from([0.0, 0.3]), compute_grad=st.booleans())
def test_cross_entropy_streamed_path(shape, reduction, smoothing, compute_grad):
    x = logits(*shape, scale=1e4, seed=21)
    t = targets(*shape, ignore=0.2, seed=22)
    check_primitive("cross_entropy", x, t, reduction, -100, smoothing, compute_grad=compute_grad)


def test_cross_entropy_strided_operands():
    x = logits(33, 12, seed=23)
    t = targets(66, 12, ignore=0.2, seed=24)[::2]             # a target with stride 2
    transposed = x.t().contiguous().t()                         # [N, C] with strides (1, N)
    check_primitive("cross_entropy", transposed, t, "mean", -100, 0.1)
    check_primitive("cross_entropy", logits(12, 66, seed=25).t()[::2], t, "none")
    check_primitive("cross_entropy", logits(1, 12, seed=26).expand(33, 12), t, "sum")
    wide = logits(4, 5000, seed=27)[:, ::2]                    # column stride 2, 2500 classes
    check_primitive("cross_entropy", wide, targets(4, 2500, seed=28), "mean", -100, 0.2)


def test_cross_entropy_compute_grad_false_and_empty_batch():
    x, t = logits(9, 6), targets(9, 6, seed=29)
    loss, grad = kernels.cross_entropy(x, t, "none", compute_grad=False)
    assert grad is None and loss.shape == (9,)
    loss, grad = kernels.cross_entropy(logits(0, 6), targets(0, 6), "mean")
    assert np.isnan(loss.item()) and grad.shape == (0, 6)
    assert kernels.cross_entropy(logits(0, 6), targets(0, 6), "sum")[0].item() == 0


class _CountLaunches:
    """Stands in for a kernel and counts its launches."""

    def __init__(self, kernel, log):
        self.kernel, self.log = kernel, log

    def __getitem__(self, grid):
        self.log.append(grid)
        return self.kernel[grid]


@pytest.mark.parametrize("shape, reduction, launches", [
    ((128, 10), "mean", 1), ((1024, 16), "none", 1),        # MNIST-sized: one program does all
    ((5000, 3), "mean", 3), ((5000, 3), "none", 2),         # count, rows, (reduce)
])
def test_cross_entropy_launch_count(monkeypatch, shape, reduction, launches):
    log = []
    for name in ("_ce_small_kernel", "_ce_count_kernel", "_ce_rows_kernel", "_ce_reduce_kernel"):
        monkeypatch.setattr(kernels, name, _CountLaunches(getattr(kernels, name), log))
    kernels.cross_entropy(logits(*shape), targets(*shape), reduction)
    assert len(log) == launches


def run_metrics(backend, x, t, reduction, total_dtype=torch.float32):
    """cross_entropy with metrics on `backend`, from running totals of 1.5 and 4: (loss,
    loss_total, correct) as numpy."""
    device = x.device if backend == "triton" else torch.device("cpu")
    loss_total = torch.full((), 1.5, dtype=total_dtype, device=device)
    correct = torch.full((), 4, dtype=torch.int64, device=device)
    with td.use_backend(backend):
        loss, _ = td.get_backend().cross_entropy(x.to(device), t.to(device), reduction,
                                                 metrics=(loss_total, correct))
    return loss.float().cpu().numpy(), loss_total.item(), correct.item()


@pytest.mark.parametrize("path", ["small", "rows"])
@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@pytest.mark.parametrize("dtype", [td.float32, td.bfloat16, td.float64], ids=lambda d: d.name)
def test_cross_entropy_metrics(monkeypatch, path, reduction, dtype):
    """The training loop's totals: loss_total += the summed row losses (ignored rows 0), correct
    += rows whose first largest logit is at the target, with ties (the first wins), a NaN row
    (NaN is the largest), ignored rows (never correct); in the one-program kernel and by
    separate kernels for large losses; the loss itself unchanged."""
    if path == "rows":
        monkeypatch.setattr(kernels, "SMALL_PROBLEM", 0)
    x = random_array((37, 7), dtype, seed=40)
    x[0] = 1.0                       # all tied: column 0 is the prediction
    x[1, 2] = x[1, 5] = 9.0          # a tie at 2 and 5: 2
    x[2, 3] = float("nan")           # NaN at 3: 3
    t = targets(37, 7, ignore=0.2, seed=41)
    t[:3] = torch.tensor([0, 5, 3])
    t[3] = -100
    got = run_metrics("triton", x, t, reduction)
    expected = run_metrics("numpy", x, t, reduction)
    assert got[2] == expected[2] and got[2] >= 4 + 2, (got, expected)
    ref_loss = kernels.cross_entropy(x, t, reduction)[0].float().cpu().numpy()
    np.testing.assert_array_equal(got[0], ref_loss)
    r, a = tolerance(dtype)
    assert_close(got[1], expected[1], r, a * 37, name="loss_total")


def test_cross_entropy_metrics_float64_total_and_launches(monkeypatch):
    """A float64 total takes float32 losses; MNIST-sized, the metrics cost no extra launch."""
    x, t = logits(128, 10, seed=42), targets(128, 10, seed=43)
    got, expected = run_metrics("triton", x, t, "mean", torch.float64), \
        run_metrics("numpy", x, t, "mean", torch.float64)
    assert got[2] == expected[2]
    assert_close(got[1], expected[1], 1e-6, 1e-5, name="loss_total")
    log = []
    monkeypatch.setattr(kernels, "_ce_small_kernel", _CountLaunches(kernels._ce_small_kernel, log))
    run_metrics("triton", x, t, "mean")
    assert len(log) == 1


@pytest.mark.parametrize("backend", ["triton", "numpy"])
@pytest.mark.parametrize("metrics, match", [
    (lambda d: "totals", "metrics must be a pair"),
    (lambda d: (torch.zeros(2, device=d), torch.zeros((), dtype=torch.int64, device=d)),
     "loss_total must be one floating point element"),
    (lambda d: (torch.zeros((), device=d), torch.zeros((), device=d)),
     "correct must be one int64 element"),
])
def test_cross_entropy_bad_metrics(backend, metrics, match):
    device = DEVICE if backend == "triton" else "cpu"
    x, t = logits(5, 3).to(device), targets(5, 3).to(device)
    with td.use_backend(backend), pytest.raises((TypeError, ValueError), match=match):
        td.get_backend().cross_entropy(x, t, metrics=metrics(device))


def test_cross_entropy_with_metrics_autodiff():
    """The Trainer's loss: the same loss and gradient as cross_entropy, the totals added."""
    x = td.tensor(logits(20, 6, seed=44).cpu().numpy(), device=DEVICE, requires_grad=True)
    t = td.tensor(targets(20, 6, seed=45).cpu().numpy(), device=DEVICE)
    loss_total = td.zeros((), device=DEVICE)
    correct = td.zeros((), dtype="int64", device=DEVICE)
    from tritonad.autodiff import nn_ops

    loss = nn_ops.cross_entropy_with_metrics(x, t, loss_total, correct)
    loss.backward()
    plain = x.detach().requires_grad_()
    expected = F.cross_entropy(plain, t)
    expected.backward()
    assert loss.item() == expected.item()
    np.testing.assert_array_equal(x.grad.numpy(), plain.grad.numpy())
    assert_close(loss_total.item(), 20 * expected.item(), 1e-6, 1e-5, name="loss_total")
    assert correct.item() == int((x.detach().numpy().argmax(1) == t.numpy()).sum())


# ----------------------------------------------------------------------------- autodiff level


def test_autodiff_cross_entropy():
    rng = np.random.default_rng(30)
    x = rng.uniform(-3, 3, (9, 7))
    t = np.array([0, 6, -100, 3, 3, 1, -100, 2, 5])
    for reduction in ("mean", "sum", "none"):
        check_op(lambda x, t, r=reduction: F.cross_entropy(x, t, reduction=r), x, t)
    check_op(lambda x, t: F.cross_entropy(x, t, label_smoothing=0.3, ignore_index=3), x,
             np.where(t < 0, 3, t))
    check_op(lambda x, t: F.cross_entropy(x, t), rng.uniform(-3, 3, 7), np.array(4))  # [C], []
    check_op(lambda x, t: nn.CrossEntropyLoss(label_smoothing=0.1)(x, t), x, np.abs(t) % 7)


def test_autodiff_cross_entropy_backward_is_the_saved_gradient():
    """loss.backward() with no argument hands over the forward's gradient as is (no kernel)."""
    x = td.tensor(np.random.default_rng(31).standard_normal((5, 4)), dtype=td.float32,
                  requires_grad=True)
    loss = F.cross_entropy(x, td.tensor(np.array([0, 1, 2, 3, 0])))
    loss.backward()
    want = NumpyBackend().cross_entropy(x.detach()._data.cpu(),
                                        torch.tensor([0, 1, 2, 3, 0]))[1]
    assert_close(x.grad, want, *tolerance(td.float32))


def test_autodiff_softmax():
    rng = np.random.default_rng(32)
    x = rng.uniform(-3, 3, (4, 5, 6))
    for dim in (0, 1, -1):
        check_op(lambda x, d=dim: x.softmax(d), x)
        check_op(lambda x, d=dim: x.log_softmax(d), x)
    check_op(lambda x: F.softmax(x, 0), rng.uniform(-3, 3, ()))


# ----------------------------------------------------------------------------- bad input


def test_bad_input_is_named():
    x = logits(4, 5)
    with pytest.raises(ValueError, match=r"cross_entropy: target 5 is outside \[0, 5\) \(at row 2\)"):
        read_device(kernels.cross_entropy(x, on_device([0, 1, 5, 7]))[0])
    with pytest.raises(ValueError, match=r"cross_entropy: target -3 .* \(at row 0\)"):
        read_device(kernels.cross_entropy(x, on_device([-3, 1, 2, 9]), ignore_index=-100)[0])
    with pytest.raises(TypeError, match="cross_entropy: target must be int64"):
        kernels.cross_entropy(x, on_device([0.0, 1.0, 2.0, 3.0]))
    with pytest.raises(ValueError, match=r"logits \(4, 5\) and target \(3,\)"):
        kernels.cross_entropy(x, on_device([0, 1, 2]))
    with pytest.raises(ValueError, match="reduction"):
        kernels.cross_entropy(x, on_device([0, 1, 2, 3]), "avg")
    with pytest.raises(ValueError, match="label_smoothing"):
        kernels.cross_entropy(x, on_device([0, 1, 2, 3]), label_smoothing=1.5)
    with pytest.raises(ValueError, match="no classes"):
        kernels.cross_entropy(logits(4, 0), on_device([0, 1, 2, 3]))
    with pytest.raises(ValueError, match=r"cross_entropy: target 11 .* \(at row 1\)"):
        F.cross_entropy(td.from_torch(x), td.tensor(np.array([0, 11, 0, 0]))).item()
    with pytest.raises(TypeError, match="softmax: expected floating point"):
        kernels.softmax(torch.zeros(3, dtype=torch.int64), 0)
    with pytest.raises(IndexError, match="log_softmax: dim"):
        kernels.log_softmax(x, 2)
    with pytest.raises(ValueError, match="softmax_backward: shapes differ"):
        kernels.softmax_backward(x, logits(5, 4), 1)


# ----------------------------------------------------------------------------- GPU tier


def _torch_pair(n, c, dtype=torch.float32, ignore=0.0, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(n, c, device="cuda", generator=g).mul_(4).to(dtype)
    t = torch.randint(0, c, (n,), device="cuda", generator=g)
    if ignore:
        t[torch.rand(n, device="cuda", generator=g) < ignore] = -100
    return x, t


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(8192, 128256), (4096, 32000), (128, 10), (1823, 781)])
def test_gpu_cross_entropy_against_torch(shape):
    x, t = _torch_pair(*shape, ignore=0.1)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    loss, grad = kernels.cross_entropy(x, t, "mean")
    torch.cuda.synchronize()
    # forward + backward allocate the gradient and little else
    assert torch.cuda.max_memory_allocated() - before <= x.numel() * 4 + shape[0] * 8 + (1 << 20)
    xs = x.detach().requires_grad_()
    want = torch.nn.functional.cross_entropy(xs, t)
    want.backward()
    torch.testing.assert_close(loss, want.detach(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(grad, xs.grad, rtol=1e-5, atol=1e-7)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("reduction, smoothing", [("none", 0.0), ("sum", 0.1), ("mean", 0.2)])
def test_gpu_cross_entropy_options(dtype, reduction, smoothing):
    x, t = _torch_pair(2048, 50257, dtype, ignore=0.2, seed=1)
    loss, grad = kernels.cross_entropy(x, t, reduction, -100, smoothing)
    xs = x.detach().float().requires_grad_()
    want = torch.nn.functional.cross_entropy(xs, t, reduction=reduction,
                                             label_smoothing=smoothing)
    (want.sum() if reduction == "none" else want).backward()
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(loss.float(), want.detach(), rtol=tol, atol=tol)
    torch.testing.assert_close(grad.float(), xs.grad, rtol=tol, atol=tol * 1e-2)


@pytest.mark.gpu
def test_gpu_cross_entropy_bad_target_and_graph_capture():
    x, t = _torch_pair(512, 1000)
    t[300] = 1000
    with pytest.raises(ValueError, match=r"target 1000 .* \(at row 300\)"):
        read_device(kernels.cross_entropy(x, t)[0])
    t[300] = 7
    kernels.cross_entropy(x, t)  # compile outside the capture
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream), torch.cuda.graph(graph):
        loss, _ = kernels.cross_entropy(x, t)  # no host read while capturing
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(loss, torch.nn.functional.cross_entropy(x, t), rtol=1e-5,
                               atol=1e-6)
    t[300] = -5  # a bad target in a replayed graph is reported at the next read too
    graph.replay()
    with pytest.raises(ValueError, match=r"target -5 .* \(at row 300\)"):
        read_device(loss)


@pytest.mark.gpu
@pytest.mark.parametrize("shape, dim", [((64, 131072), 1), ((1024, 32000), 1), ((1823, 781), 1),
                                        ((781, 1823), 0), ((8, 512, 33), 1)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gpu_softmax_against_torch(shape, dim, dtype):
    """Forward against torch elementwise; backward against float64 from our own y, because
    dx = dy - exp(y) * sum(dy) over tens of thousands of columns cancels: its elementwise error
    scales with |sum(dy)|, so it is judged normwise and with an absolute bound scaled by that."""
    torch.manual_seed(0)
    x = (torch.randn(shape, device="cuda") * 5).to(dtype)
    dy = torch.randn(shape, device="cuda").to(dtype)
    fp32 = dtype == torch.float32
    # NOTE: log_softmax = x - lse cancels near 0: its absolute error scales with |x| (up to ~25)
    tol = {"rtol": 1e-5, "atol": 1e-5} if fp32 else {"rtol": 2e-2, "atol": 1e-2}
    for ours, theirs, back, exact in (
            (kernels.softmax, torch.softmax, kernels.softmax_backward,
             lambda g, s: s * (g - (g * s).sum(dim, keepdim=True))),
            (kernels.log_softmax, torch.log_softmax, kernels.log_softmax_backward,
             lambda g, ls: g - ls.exp() * g.sum(dim, keepdim=True))):
        y = ours(x, dim)
        torch.testing.assert_close(y.float(), theirs(x.float(), dim), **tol)
        got = back(dy, y, dim).double()
        want = exact(dy.double(), y.double())
        error = (got - want).abs()
        relative = (got - want).norm() / want.norm()
        assert relative < (1e-6 if fp32 else 1e-2), f"{ours.__name__}: normwise error {relative}"
        bound = (1e-5 if fp32 else 2e-2) * want.abs().amax()
        assert error.max() <= bound, f"{ours.__name__}: max error {error.max()} > {bound}"


@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
def test_softmax_casts_to_the_dtype_given(backend_name, name):
    import torch.nn.functional as torch_F

    a = np.random.default_rng(3).normal(size=(3, 5)).astype(np.float32)
    x = td.tensor(a, requires_grad=True)
    ours = [getattr(td.nn.functional, name)(x, 1, dtype=td.float64),
            getattr(x, name)(0, dtype=td.float64)]
    theirs = [getattr(torch_F, name)(torch.tensor(a), 1, dtype=torch.float64),
              getattr(torch.tensor(a), name)(0, dtype=torch.float64)]
    for o, t in zip(ours, theirs):
        assert o.dtype is td.float64
        np.testing.assert_allclose(o.numpy(), t.numpy(), rtol=1e-12)
    ours[0].sum().backward()
    assert x.grad.dtype is td.float32
