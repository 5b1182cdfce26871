"""The losses, similarities and distances of autodiff/losses.py against PyTorch's CPU
implementations (the spec), forward and backward under a random cotangent, on both backends
(the triton one under the interpreter here); their gradients against float64 central
differences on the numpy backend; PyTorch's edge values (probabilities at 0 and 1, huge
logits, zero targets, zero vectors, ignored rows) and its errors.

Shapes stay tiny: every case runs each of its kernels under the interpreter.
"""
import warnings

import numpy as np
import pytest
import torch
from helpers import assert_close
from hypothesis import given, settings
from hypothesis import strategies as st

import tritonad as td
import tritonad.nn.functional as F
from tritonad import nn
from tritonad.autodiff import gradcheck, gradgradcheck

TF = torch.nn.functional
INF = float("inf")
RNG = np.random.default_rng(0)


def against_torch(ours, theirs, arrays, grads=(0,), rtol=1e-7, atol=1e-9, seed=0,
                  dtype=td.float64):
    """ours(*Tensors) against theirs(*torch tensors) on float64 copies of `arrays` (integer
    arrays pass as int64): the value, then the gradients of the inputs at positions `grads`
    under one random cotangent."""
    def leaves(make, float_dtype):
        out = []
        for i, a in enumerate(arrays):
            if a is None:
                out.append(None)
                continue
            t = make(a, float_dtype if a.dtype.kind == "f" else None)
            out.append(t.requires_grad_() if i in grads else t)
        return out

    mine = leaves(lambda a, d: td.tensor(a, dtype=d), dtype)
    spec = leaves(lambda a, d: torch.tensor(a, dtype=torch.float64 if d else None), True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (torch warns about broadcast targets)
        want = theirs(*spec)
    got = ours(*mine)
    assert tuple(got.shape) == tuple(want.shape), f"shape {got.shape} != {tuple(want.shape)}"
    assert_close(got, want.detach(), rtol, atol, name="value")
    cot = np.random.default_rng(seed).standard_normal(tuple(want.shape))
    (got * td.tensor(cot, dtype=got.dtype)).sum().backward()
    (want * torch.tensor(cot)).sum().backward()
    for i in grads:
        assert_close(mine[i].grad, spec[i].grad, rtol, atol, name=f"gradient of input {i}")


REDUCTIONS = ["none", "mean", "sum"]
# (warnings from numpy inside the interpreter: log(0) and 1/0 are the cases under test)
pytestmark = pytest.mark.filterwarnings("ignore:.*encountered in:RuntimeWarning")


def reductions(backend_name, triton=("mean",)):
    """Every reduction on the numpy backend; on the triton backend (each launch interpreted
    on the CPU) the ones given: the reductions are the same kernels for every loss."""
    return REDUCTIONS if backend_name == "numpy" else list(triton)

# ----------------------------------------------------------------------------- binary


def test_binary_cross_entropy(backend_name):
    """Probabilities of exactly 0 and 1 give finite losses (logs clamped at -100) and PyTorch's
    gradients (+-1e12 against the wrong target, +-inf for the target)."""
    p = RNG.uniform(0.05, 0.95, (4, 5))
    p[0, :4] = [0.0, 1.0, 0.0, 1.0]
    t = RNG.uniform(0, 1, (4, 5))
    t[0, :4] = [1.0, 0.0, 0.0, 1.0]
    w = RNG.uniform(0.5, 2.0, (5,))
    for reduction in reductions(backend_name):
        against_torch(lambda a, b, c: F.binary_cross_entropy(a, b, c, reduction=reduction),
                      lambda a, b, c: TF.binary_cross_entropy(a, b, c, reduction=reduction),
                      [p, t, w], grads=(0,))
    # the target's gradient away from 0 and 1 (at them PyTorch's is +-inf, checked below)
    against_torch(F.binary_cross_entropy, TF.binary_cross_entropy, [p[1:], t[1:]], grads=(0, 1))
    x = td.tensor([0.0, 1.0], dtype=td.float64, requires_grad=True)
    y = td.tensor([1.0, 0.0], dtype=td.float64, requires_grad=True)
    loss = F.binary_cross_entropy(x, y, reduction="none")
    assert loss.tolist() == [100.0, 100.0]
    loss.sum().backward()
    assert_close(x.grad, [-1e12, 1e12], 1e-6, 0, name="clamped gradient")
    assert y.grad.tolist() == [INF, -INF]


def test_binary_cross_entropy_with_logits(backend_name):
    """Stable at logits of +-100 (no overflow, no log(0)), exact at 0, with weight and a
    per-class pos_weight."""
    z = RNG.normal(0, 3, (4, 5))
    z[0, :5] = [0.0, 100.0, -100.0, 30.0, -30.0]
    t = RNG.uniform(0, 1, (4, 5))
    t[0, :5] = [1.0, 0.0, 1.0, 1.0, 0.0]
    w = RNG.uniform(0.5, 2.0, (4, 1))
    pos = RNG.uniform(0.5, 3.0, (5,))
    for reduction in reductions(backend_name, ("none",)):
        against_torch(
            lambda a, b, c, d: F.binary_cross_entropy_with_logits(a, b, c, reduction=reduction,
                                                                  pos_weight=d),
            lambda a, b, c, d: TF.binary_cross_entropy_with_logits(a, b, c, reduction=reduction,
                                                                   pos_weight=d),
            [z, t, w, pos], grads=(0, 1))
    if backend_name == "numpy":
        against_torch(F.binary_cross_entropy_with_logits, TF.binary_cross_entropy_with_logits,
                      [z, t], grads=(0, 1))


# ----------------------------------------------------------------------------- regression


def test_regression_losses(backend_name):
    """l1, smooth l1 (beta 0.5 and 0) and Huber, a broadcast target, ties (gradient 0 as
    PyTorch's sign(0)), each reduction."""
    x = RNG.normal(0, 1.5, (3, 4))
    y = RNG.normal(0, 1.5, (1, 4))
    x[0] = y[0]
    x[1, 0] = y[0, 0] + 0.5  # at smooth l1's beta
    numpy = backend_name == "numpy"
    for l1, smooth, huber in zip(*[reductions(backend_name, (r,)) for r in REDUCTIONS]):
        against_torch(lambda a, b: F.l1_loss(a, b, reduction=l1),
                      lambda a, b: TF.l1_loss(a, b, reduction=l1), [x, y], grads=(0, 1))
        against_torch(lambda a, b: F.smooth_l1_loss(a, b, reduction=smooth, beta=0.5),
                      lambda a, b: TF.smooth_l1_loss(a, b, reduction=smooth, beta=0.5),
                      [x, y], grads=(0, 1))
        against_torch(lambda a, b: F.huber_loss(a, b, reduction=huber, delta=0.7),
                      lambda a, b: TF.huber_loss(a, b, reduction=huber, delta=0.7),
                      [x, y], grads=(0, 1))
    if numpy:
        against_torch(lambda a, b: F.smooth_l1_loss(a, b, beta=0.0),
                      lambda a, b: TF.smooth_l1_loss(a, b, beta=0.0), [x, y], grads=(0, 1))


def test_kl_div(backend_name):
    """Targets of 0 contribute 0 (not 0 * -inf), log_target, "batchmean" divides by the batch."""
    log_p = np.log(RNG.dirichlet(np.ones(5), 3))
    q = RNG.dirichlet(np.ones(5), 3)
    q[0, :2] = 0.0
    for reduction in reductions(backend_name, ()) + ["batchmean"]:
        against_torch(lambda a, b: F.kl_div(a, b, reduction=reduction),
                      lambda a, b: TF.kl_div(a, b, reduction=reduction), [log_p, q], grads=(0,))
    against_torch(lambda a, b: F.kl_div(a, b, reduction="batchmean", log_target=True),
                  lambda a, b: TF.kl_div(a, b, reduction="batchmean", log_target=True),
                  [log_p, np.log(q + 0.1)], grads=(0, 1))


# ----------------------------------------------------------------------------- classes


def test_cross_entropy_weights_smoothing_and_k_dims(backend_name):
    """[N, C, L] logits against class indices with class weights, an ignored position and label
    smoothing, and against class probabilities; each reduction."""
    x = RNG.normal(0, 2, (3, 4, 2))
    t = RNG.integers(0, 4, (3, 2))
    t[0, 1] = -100
    w = RNG.uniform(0.5, 2.0, (4,))
    probs = RNG.dirichlet(np.ones(4), (3, 2)).transpose(0, 2, 1).copy()
    numpy = backend_name == "numpy"
    for index, prob, nll in zip(*[reductions(backend_name, (r,)) for r in REDUCTIONS[::-1]]):
        against_torch(lambda a, b, c: F.cross_entropy(a, b, c, reduction=index,
                                                      label_smoothing=0.2),
                      lambda a, b, c: TF.cross_entropy(a, b, c, reduction=index,
                                                       label_smoothing=0.2), [x, t, w])
        against_torch(lambda a, b, c: F.cross_entropy(a, b, c, reduction=prob,
                                                      label_smoothing=0.1),
                      lambda a, b, c: TF.cross_entropy(a, b, c, reduction=prob,
                                                       label_smoothing=0.1),
                      [x, probs, w], grads=(0, 1))
        against_torch(lambda a, b, c: F.nll_loss(a, b, c, reduction=nll),
                      lambda a, b, c: TF.nll_loss(a, b, c, reduction=nll), [x, t, w])
    if numpy:  # unweighted k-dim with smoothing, [N, C] with a weight (not the fused case)
        against_torch(lambda a, b: F.cross_entropy(a, b, label_smoothing=0.3),
                      lambda a, b: TF.cross_entropy(a, b, label_smoothing=0.3), [x, t])
        against_torch(lambda a, b, c: F.cross_entropy(a, b, c, ignore_index=2),
                      lambda a, b, c: TF.cross_entropy(a, b, c, ignore_index=2),
                      [x[:, :, 0], t[:, 0], w])


def test_cross_entropy_unbatched_and_modules(backend_name):
    """[C] logits with a 0-d target, and the modules with a weight buffer."""
    x = RNG.normal(0, 2, (5,))
    w = RNG.uniform(0.5, 2.0, (5,))
    against_torch(lambda a, c: F.cross_entropy(a, td.tensor(3), c, label_smoothing=0.1),
                  lambda a, c: TF.cross_entropy(a, torch.tensor(3), c, label_smoothing=0.1),
                  [x, w])
    logits = RNG.normal(0, 2, (4, 3))
    t = np.array([0, 2, 1, 2])
    wt = np.array([0.2, 1.0, 3.0])
    ours = nn.CrossEntropyLoss(weight=td.tensor(wt), label_smoothing=0.05)
    assert set(ours.state_dict()) == {"weight"}
    spec = torch.nn.CrossEntropyLoss(weight=torch.tensor(wt), label_smoothing=0.05)
    assert_close(ours(td.tensor(logits), td.tensor(t)),
                 spec(torch.tensor(logits), torch.tensor(t)), 1e-9, 1e-11)
    log_p = td.tensor(logits).log_softmax(1)
    assert_close(nn.NLLLoss(td.tensor(wt), reduction="sum")(log_p, td.tensor(t)),
                 torch.nn.NLLLoss(torch.tensor(wt), reduction="sum")(
                     torch.tensor(logits).log_softmax(1), torch.tensor(t)), 1e-9, 1e-11)


def test_cross_entropy_all_ignored_is_nan_as_torch():
    x = td.tensor([[1.0, 2.0], [0.5, 0.0]])
    t = td.tensor([-100, -100])
    w = td.tensor([1.0, 2.0])
    want = TF.cross_entropy(torch.tensor([[1.0, 2.0], [0.5, 0.0]]), torch.tensor([-100, -100]),
                            torch.tensor([1.0, 2.0]))
    assert np.isnan(want.item()) and np.isnan(F.cross_entropy(x, t, w).item())


# ----------------------------------------------------------------------------- similarity


def test_cosine_similarity_and_pairwise_distance(backend_name):
    """Broadcast operands, a zero row (its gradient 0, as PyTorch's, not NaN), dims, p."""
    a = RNG.normal(0, 1, (3, 4))
    b = RNG.normal(0, 1, (1, 4))
    a[1] = 0.0
    against_torch(F.cosine_similarity, TF.cosine_similarity, [a, b], grads=(0, 1))
    if backend_name == "numpy":
        against_torch(lambda x, y: F.cosine_similarity(x, y, dim=0, eps=1e-3),
                      lambda x, y: TF.cosine_similarity(x, y, dim=0, eps=1e-3),
                      [a, a[::-1].copy()], grads=(0, 1))
    c = RNG.normal(0, 1, (3, 4))
    for p in (2.0, 1.0, 3.0, INF) if backend_name == "numpy" else (3.0,):
        against_torch(lambda x, y: F.pairwise_distance(x, y, p=p, keepdim=p == 1.0),
                      lambda x, y: TF.pairwise_distance(x, y, p=p, keepdim=p == 1.0), [c, b],
                      grads=(0, 1))
    x1, x2 = td.tensor(a), td.tensor(b)
    assert_close(nn.CosineSimilarity(dim=1)(x1, x2), F.cosine_similarity(x1, x2), 0, 0)
    assert_close(nn.PairwiseDistance(p=1.0)(x1, x2), F.pairwise_distance(x1, x2, 1.0), 0, 0)


# ----------------------------------------------------------------------------- modules


def test_modules_are_their_functions():
    x = td.tensor(RNG.uniform(0.1, 0.9, (2, 3)))
    t = td.tensor(RNG.uniform(0, 1, (2, 3)))
    w = td.tensor([1.0, 2.0, 0.5])
    pairs = [
        (nn.BCELoss(w, reduction="sum"), lambda: F.binary_cross_entropy(x, t, w, reduction="sum")),
        (nn.BCEWithLogitsLoss(pos_weight=w), lambda: F.binary_cross_entropy_with_logits(
            x, t, pos_weight=w)),
        (nn.L1Loss(reduction="none"), lambda: F.l1_loss(x, t, reduction="none")),
        (nn.SmoothL1Loss(beta=0.2), lambda: F.smooth_l1_loss(x, t, beta=0.2)),
        (nn.HuberLoss(delta=0.3), lambda: F.huber_loss(x, t, delta=0.3)),
        (nn.KLDivLoss(reduction="batchmean"), lambda: F.kl_div(x, t, reduction="batchmean")),
    ]
    for module, fn in pairs:
        assert_close(module(x, t), fn(), 0, 0, name=type(module).__name__)
    assert nn.L1Loss(size_average=False).reduction == "sum"  # PyTorch's legacy flags
    assert nn.KLDivLoss(reduce=False).reduction == "none"
    assert set(nn.BCEWithLogitsLoss(pos_weight=w).state_dict()) == {"pos_weight"}


# ----------------------------------------------------------------------------- finite differences


def _p(*shape):
    return RNG.uniform(0.1, 0.9, shape)


def _n(*shape):
    return RNG.normal(0, 1, shape)


_T = np.array([[1, 0, 2], [2, -100, 0]])
GRADCHECK = {
    "bce": (lambda x, t, w: F.binary_cross_entropy(x, t, w), [_p(2, 3), _p(2, 3), _p(3)]),
    "bce_logits": (lambda x, t, p: F.binary_cross_entropy_with_logits(x, t, pos_weight=p),
                   [_n(2, 3), _p(2, 3), _p(3)]),
    "smooth_l1": (lambda x, y: F.smooth_l1_loss(x, y, beta=0.5), [_n(2, 3), _n(2, 3)]),
    "huber": (lambda x, y: F.huber_loss(x, y, delta=0.5, reduction="none"), [_n(2, 3), _n(3)]),
    "kl_div": (lambda x, t: F.kl_div(x, t, reduction="batchmean"), [_n(2, 3), _p(2, 3)]),
    "cross_entropy": (lambda x, w: F.cross_entropy(x, td.tensor(_T), w, label_smoothing=0.2),
                      [_n(2, 3, 3), _p(3)]),
    "cross_entropy_probs": (lambda x, q: F.cross_entropy(x, q, label_smoothing=0.1),
                            [_n(2, 3), _p(2, 3)]),
    "cosine": (lambda a, b: F.cosine_similarity(a, b, dim=-1), [_n(2, 3), _n(2, 3)]),
    "pairwise_p3": (lambda a, b: F.pairwise_distance(a, b, p=3.0), [_n(2, 3), _n(2, 3)]),
}


@pytest.mark.parametrize("name", sorted(GRADCHECK))
def test_gradients_match_finite_differences(name):
    fn, inputs = GRADCHECK[name]
    with td.use_backend("numpy"):
        tensors = [td.tensor(a, dtype=td.float64, requires_grad=True) for a in inputs]
        assert gradcheck(fn, tensors, eps=1e-6, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("name", ["bce", "bce_logits", "huber", "cosine", "cross_entropy"])
def test_second_derivatives_match_finite_differences(name):
    """The gradients are Tensor ops themselves (BCE's closed form included): differentiable
    again."""
    fn, inputs = GRADCHECK[name]
    with td.use_backend("numpy"):
        tensors = [td.tensor(a, dtype=td.float64, requires_grad=True) for a in inputs]
        assert gradgradcheck(fn, tensors, eps=1e-6, atol=1e-5, rtol=1e-4)


# ----------------------------------------------------------------------------- properties


@given(z=st.lists(st.floats(-12, 12, width=32, allow_subnormal=False), min_size=6, max_size=6),
       t=st.lists(st.sampled_from([0.0, 0.25, 1.0]), min_size=6, max_size=6),
       pos=st.sampled_from([1.0, 0.5, 3.0]))
@settings(max_examples=10)
def test_bce_with_logits_is_bce_of_the_sigmoid(z, t, pos):
    """On logits where sigmoid is not yet 0 or 1: BCE with logits (and pos_weight p) is the
    BCE of sigmoid(z) with the target's term weighted by p, in value and gradient."""
    with td.use_backend("numpy"):
        x = td.tensor(z, dtype=td.float64, requires_grad=True)
        y = td.tensor(t, dtype=td.float64)
        p = td.full((6,), pos, dtype=td.float64)
        a = F.binary_cross_entropy_with_logits(x, y, pos_weight=p, reduction="sum")
        s = x.sigmoid()
        b = -(p * y * s.log() + (1.0 - y) * (1.0 - s).log()).sum()
        (ga,) = td.grad(a, x)
        (gb,) = td.grad(b, x)
        assert_close(a, b, 1e-9, 1e-9)
        assert_close(ga, gb, 1e-9, 1e-9)


# ----------------------------------------------------------------------------- errors

_X = td.ones(2, 3)
ERRORS = [
    (lambda: F.binary_cross_entropy(_X, td.ones(3)), ValueError, "binary_cross_entropy.*same"),
    (lambda: F.binary_cross_entropy(td.tensor([0.5, 1.5]), td.ones(2)), ValueError,
     r"probability in \[0, 1\]"),
    (lambda: F.binary_cross_entropy(td.tensor([0.5, float("nan")]), td.ones(2)), ValueError,
     "probability"),
    (lambda: F.binary_cross_entropy_with_logits(_X, td.ones(2, 1)), ValueError,
     r"target size \(2, 1\)"),
    (lambda: F.binary_cross_entropy_with_logits(_X, _X, pos_weight=td.ones(2)), ValueError,
     "pos_weight"),
    (lambda: F.l1_loss(_X, td.ones(4)), ValueError, "l1_loss.*broadcast"),
    (lambda: F.l1_loss(_X, _X, reduction="avg"), ValueError, "reduction"),
    (lambda: F.smooth_l1_loss(_X, _X, beta=-1.0), ValueError, "beta"),
    (lambda: F.huber_loss(_X, _X, delta=0.0), ValueError, "delta"),
    (lambda: F.kl_div(_X, _X, reduction="batch"), ValueError, "batchmean"),
    (lambda: F.cross_entropy(_X, td.tensor([0, 1]), td.ones(4)), ValueError, "one entry per"),
    (lambda: F.cross_entropy(td.ones(2, 3, 4), td.tensor([0, 1])), ValueError,
     r"target of shape \(2, 4\)"),
    (lambda: F.cross_entropy(_X, td.ones(2, 4)), TypeError, "class indices, or class prob"),
    (lambda: F.cross_entropy(_X, td.tensor([0, 1]), label_smoothing=1.5), ValueError,
     "label_smoothing"),
    (lambda: F.nll_loss(_X, td.tensor([0.0, 1.0])), TypeError, "int64"),
    (lambda: F.cosine_similarity(_X, td.ones(4)), ValueError, "cosine_similarity"),
    (lambda: F.cosine_similarity(_X, _X, dim=2), IndexError, "dimension 2"),
    (lambda: F.l1_loss(td.tensor([1, 2]), td.tensor([1, 2])), TypeError, "floating point"),
]


@pytest.mark.parametrize("case", range(len(ERRORS)))
def test_bad_arguments_raise_one_clear_error(case):
    fn, kind, match = ERRORS[case]
    with pytest.raises(kind, match=match):
        fn()


def test_a_class_out_of_range_is_reported(backend_name):
    """Raised at the op (numpy) or at the next read of the device (triton), naming the op."""
    from helpers import read_device
    with pytest.raises(ValueError, match="cross_entropy"):
        loss = F.cross_entropy(td.zeros(2, 3, 2), td.tensor([[0, 1], [3, 0]]), td.ones(3))
        read_device(loss._data)


# ----------------------------------------------------------------------------- GPU sizes


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [td.float32, td.bfloat16])
def test_losses_at_gpu_sizes(dtype):
    """A segmentation-sized weighted cross-entropy with smoothing, and BCE with logits with
    pos_weight, against PyTorch on the GPU (PyTorch in float32 on the same values; gradients
    compared relative to their largest entry)."""
    torch.manual_seed(0)
    tdt = {td.float32: torch.float32, td.bfloat16: torch.bfloat16}[dtype]
    rtol, atol = (1e-4, 1e-5) if dtype is td.float32 else (5e-2, 5e-2)

    def compare(ours_loss, ours_x, want_loss, want_x):
        ours_loss.backward()
        want_loss.backward()
        assert_close(ours_loss.float(), want_loss.detach(), rtol, atol, name="loss")
        scale = 1.0 / want_x.grad.abs().max().item()
        assert_close(ours_x.grad.float() * scale, want_x.grad * scale, rtol, atol, name="grad")

    x = torch.randn(8, 21, 64, 64, device="cuda", dtype=tdt)
    t = torch.randint(0, 21, (8, 64, 64), device="cuda")
    t[:, :4] = -100
    w = torch.rand(21, device="cuda", dtype=tdt) + 0.5
    ours_x = td.from_torch(x.clone()).requires_grad_()
    xt = x.clone().float().requires_grad_()
    compare(F.cross_entropy(ours_x, td.from_torch(t), td.from_torch(w), label_smoothing=0.1),
            ours_x, TF.cross_entropy(xt, t, w.float(), label_smoothing=0.1), xt)

    z = torch.randn(4096, 80, device="cuda", dtype=tdt) * 8
    y = (torch.rand(4096, 80, device="cuda") < 0.3).to(tdt)
    pw = torch.rand(80, device="cuda", dtype=tdt) * 4
    ours_z = td.from_torch(z.clone()).requires_grad_()
    zt = z.clone().float().requires_grad_()
    compare(F.binary_cross_entropy_with_logits(ours_z, td.from_torch(y),
                                               pos_weight=td.from_torch(pw)),
            ours_z, TF.binary_cross_entropy_with_logits(zt, y.float(), pos_weight=pw.float()), zt)
