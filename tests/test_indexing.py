"""Embeddings and indexing (autodiff/index_ops.py, kernels/scatter.py): the row scatter with a
reduction against the numpy reference; every op, forward and backward under a random
cotangent, against PyTorch (the spec) on both backends; float64 finite differences; errors.

Interpreter time is the budget here: the triton backend runs the cases marked TRITON_CASES (the
ones whose kernels or paths differ), the numpy backend all of them."""
import numpy as np
import pytest
import torch
from helpers import assert_close, check_primitive, read_device

import tritonad as td
import tritonad.nn.functional as F
from tritonad import nn
from tritonad.autodiff import gradcheck
from tritonad.kernels import plans
from tritonad.kernels import scatter as sc

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
RNG = np.random.default_rng(0)


def arr(*shape, low=-2.0, high=2.0, seed=0):
    """Floats on a grid of halves (ties appear, and sums are exact)."""
    return np.round(np.random.default_rng(seed).uniform(low, high, shape) * 2) / 2


def ints(high, shape, seed=0, low=0):
    return np.random.default_rng(seed).integers(low, high, shape)


# ----------------------------------------------------------------------------- the kernels


@pytest.fixture
def triton_backend():
    with td.use_backend("triton"):
        yield td.get_backend()


@pytest.mark.parametrize("reduce,base,include_self,dtype,path", [
    ("sum", False, False, td.float32, "sparse"), ("sum", True, True, td.float16, "dense"),
    ("prod", True, True, td.float32, "dense"), ("mean", True, False, td.float32, "sparse"),
    ("mean", True, True, td.int64, "dense"), ("amax", True, True, td.float32, "sparse"),
    ("amax", False, True, td.float32, "dense"), ("amin", False, False, td.bfloat16, "sparse"),
    ("last", True, True, td.int32, "sparse"), ("last", True, False, td.float32, "dense")])
def test_scatter_reduce_rows_against_reference(triton_backend, monkeypatch, reduce, base,
                                               include_self, dtype, path):
    """Narrow rows take the sparse path (out starts as base; rows named are written), others
    the dense one (every row folds its segment); each forced here on tiny rows."""
    monkeypatch.setattr(sc, "SPARSE_ROW_BYTES", 10**6 if path == "sparse" else 0)
    plans.clear_plans()
    # 300 indices: three blocks of sorted keys and two merge passes under the interpreter
    n, rows = (300, 37) if reduce == "sum" else (29, 11)
    index = torch.from_numpy(ints(rows, (n,), seed=1)).to(DEVICE)
    src = torch.from_numpy(arr(n, 3, seed=2)).to(DEVICE, dtype.torch)
    if reduce == "amax":
        src[5, 1] = float("nan")  # NaN propagates
    start = torch.from_numpy(arr(rows, 3, seed=3)).to(DEVICE, dtype.torch) if base else None
    got = check_primitive("scatter_reduce_rows", src, index, start, rows, reduce, include_self,
                          2 if path == "dense" or not base else -1,
                          rtol=1e-2 if dtype.itemsize == 2 else 1e-5, atol=1e-2)
    assert got.dtype == dtype.torch and tuple(got.shape) == (rows, 3)
    plans.clear_plans()


def test_scatter_reduce_rows_shapes_and_layouts(triton_backend):
    # src [2, 3, 2, 2] transposed (non-contiguous), a 2-d index, a base sliced; an empty index
    index = torch.from_numpy(ints(5, (2, 3), seed=4)).to(DEVICE)
    src = torch.from_numpy(arr(2, 3, 2, 2, seed=5)).to(DEVICE).float().transpose(2, 3)
    base = torch.from_numpy(arr(10, 2, 2, seed=6)).to(DEVICE).float()[::2]
    check_primitive("scatter_reduce_rows", src, index, base, 5, "sum", True)
    empty = torch.zeros((0,), dtype=torch.int64, device=DEVICE)
    got = check_primitive("scatter_reduce_rows", torch.zeros((0, 4), device=DEVICE), empty,
                          None, 3, "amax", False)
    assert got.cpu().tolist() == [[0.0] * 4] * 3


def test_block_sort_by_tl_sort(triton_backend, monkeypatch):
    """The GPU sorts blocks of keys with tl.sort; the interpreter by ranks. Both give the
    reference's sums (16-key blocks here, so that tl.sort's network stays small, merged two
    runs at a time: two merge passes)."""
    monkeypatch.setattr(sc, "BLOCK_SORT", 1)
    monkeypatch.setattr(sc, "SORT_BLOCK", 16)
    monkeypatch.setattr(sc, "MERGE_GROUP", 2)
    plans.clear_plans()
    index = torch.from_numpy(ints(9, (40,), seed=7)).to(DEVICE)
    src = torch.from_numpy(arr(40, 2, seed=8)).to(DEVICE).float()
    check_primitive("scatter_reduce_rows", src, index, None, 9, "sum", False)
    plans.clear_plans()


def test_wide_sums_fold_many_indices_a_step(triton_backend, monkeypatch):
    """Sums of wide rows (embedding gradients) take _segment_sum_kernel: 16 indices a step,
    a fixed tree. A row named 40 times, a base, a mean, a zero row: as the reference, and the
    same bits twice."""
    monkeypatch.setattr(sc, "SUM_MIN_WIDTH", 1)
    monkeypatch.setattr(sc, "SPARSE_ROW_BYTES", 0)
    plans.clear_plans()
    index = torch.from_numpy(np.r_[np.full(40, 2), ints(6, (30,), seed=40)]).to(DEVICE)
    src = torch.from_numpy(RNG.standard_normal((70, 5))).to(DEVICE).float()
    base = torch.from_numpy(RNG.standard_normal((6, 5))).to(DEVICE).float()
    check_primitive("scatter_reduce_rows", src, index, None, 6, "sum", False, 4)
    check_primitive("scatter_reduce_rows", src, index, base, 6, "mean", True)
    first = triton_backend.scatter_reduce_rows(src, index, None, 6, "sum")
    assert torch.equal(first, triton_backend.scatter_reduce_rows(src, index, None, 6, "sum"))
    plans.clear_plans()


def test_scatter_reduce_rows_is_deterministic(triton_backend):
    """The same bits on every run: each row sums its indices in increasing order."""
    index = torch.from_numpy(ints(4, (150,), seed=9)).to(DEVICE)
    src = torch.from_numpy(RNG.standard_normal((150, 3))).to(DEVICE).float() * 1e3
    first = triton_backend.scatter_reduce_rows(src, index, None, 4, "sum")
    again = triton_backend.scatter_reduce_rows(src, index, None, 4, "sum")
    assert torch.equal(first, again)
    plans.clear_plans()
    sc.SPARSE_ROW_BYTES, saved = 0, sc.SPARSE_ROW_BYTES  # the dense path: the same bits
    try:
        assert torch.equal(first, triton_backend.scatter_reduce_rows(src, index, None, 4, "sum"))
    finally:
        sc.SPARSE_ROW_BYTES = saved
        plans.clear_plans()
    # the order is increasing i: float32 sums in that order, exactly
    expected = np.zeros((4, 3), np.float32)
    for i, r in enumerate(index.cpu().numpy()):
        expected[r] += src.cpu().numpy()[i]
    np.testing.assert_array_equal(first.cpu().numpy(), expected)


def test_index_errors_are_reported_on_the_device(triton_backend):
    index = torch.tensor([0, 7, 1], device=DEVICE)
    out = triton_backend.scatter_reduce_rows(torch.ones((3, 2), device=DEVICE), index, None, 4,
                                             "sum", False, -1, "index_add")
    with pytest.raises(IndexError, match=r"index_add: index 7 is out of bounds for size 4 "
                                         r"\(at position 1\)"):
        read_device(out)
    checked = triton_backend.index_check(torch.tensor([-3, 2], device=DEVICE), 3, "gather",
                                         True)
    assert read_device(checked).cpu().tolist() == [0, 2]
    with pytest.raises(IndexError, match="gather: index -1 is out of bounds for size 3"):
        read_device(triton_backend.index_check(torch.tensor([0, -1], device=DEVICE), 3,
                                               "gather", False))


# ----------------------------------------------------------------------------- ops vs PyTorch

X = arr(4, 5, 3, seed=10)
IDX_D1 = ints(5, (4, 2, 3), seed=11)
SRC_D1 = arr(4, 2, 3, seed=12)
MASK = arr(4, 5, 3, seed=13) > 0

# name -> (f(module, *tensors), inputs): float arrays become leaves that require grad, integer
# and bool arrays index tensors; f runs the same on tritonad and torch
CASES = {
    "x[list]": (lambda m, x: x[[2, 0, 2, -1]], [X]),
    "x[:, idx]": (lambda m, x, i: x[:, i], [X.transpose(1, 0, 2), ints(4, (2, 2), seed=1)]),
    "x[..., list]": (lambda m, x: x[..., [2, 0]], [X]),
    "x[i, j]": (lambda m, x, i, j: x[i, j], [X, ints(4, (3,), seed=2), ints(5, (3,), seed=3)]),
    "x[i, :, j] broadcast": (lambda m, x, i, j: x[i, :, j],
                             [X, ints(4, (2, 1), seed=4), ints(3, (3,), seed=5, low=-3)]),
    "x[0, :, list]": (lambda m, x: x[0, :, [1, 2, 1]], [X]),
    "x[None, i, 1:, j]": (lambda m, x, i, j: x[None, i, 1:, j],
                          [X, ints(4, (2,), seed=6), ints(3, (2,), seed=7)]),
    "x[mask]": (lambda m, x, k: x[k], [X, MASK]),
    "x[mask2d]": (lambda m, x, k: x[k], [X, MASK[:, :, 0]]),
    "x[x > 0]": (lambda m, x: x[x > 0], [X]),
    "x[empty]": (lambda m, x: x[[]], [X]),
    "gather": (lambda m, x, i: m.gather(x, 1, i), [X, IDX_D1]),
    "gather dim -1": (lambda m, x, i: x.gather(-1, i), [X, ints(3, (2, 5, 2), seed=8)]),
    "scatter": (lambda m, x, i, s: x.scatter(1, i, s), [X, IDX_D1, SRC_D1]),
    "scatter value": (lambda m, x, i: x.scatter(0, i, value=1.5), [X, ints(4, (2, 5, 3), seed=9)]),
    "scatter_add": (lambda m, x, i, s: m.scatter_add(x, 1, i, s), [X, IDX_D1, SRC_D1]),
    "scatter_reduce sum": (lambda m, x, i, s: x.scatter_reduce(1, i, s, "sum"),
                           [X, IDX_D1, SRC_D1]),
    "scatter_reduce mean": (lambda m, x, i, s: x.scatter_reduce(1, i, s, "mean"),
                            [X, IDX_D1, SRC_D1]),
    "scatter_reduce mean excl": (lambda m, x, i, s: x.scatter_reduce(
        1, i, s, "mean", include_self=False), [X, IDX_D1, SRC_D1]),
    "scatter_reduce amax": (lambda m, x, i, s: x.scatter_reduce(1, i, s, "amax"),
                            [X, IDX_D1, SRC_D1]),
    "scatter_reduce amin excl": (lambda m, x, i, s: x.scatter_reduce(
        1, i, s, "amin", include_self=False), [X, IDX_D1, SRC_D1]),
    "scatter_reduce prod": (lambda m, x, i, s: x.scatter_reduce(1, i, s, "prod"),
                            [X, IDX_D1, SRC_D1]),
    "scatter_reduce prod excl": (lambda m, x, i, s: x.scatter_reduce(
        1, i, s, "prod", include_self=False), [X, IDX_D1, np.where(SRC_D1 > 1, 0.0, SRC_D1)]),
    "index_select": (lambda m, x, i: m.index_select(x, 1, i), [X, np.array([4, 0, 4])]),
    "index_select transposed": (lambda m, x, i: x.transpose(0, 2).index_select(0, i),
                                [X, np.array([1, 2])]),
    "index_add": (lambda m, x, i, s: x.index_add(1, i, s, alpha=-2.0),
                  [X, np.array([4, 0, 4]), arr(4, 3, 3, seed=14)]),
    "index_put": (lambda m, x, i, j, v: x.index_put((i, j), v),
                  [X, np.array([0, 3]), np.array([1, -1]), arr(3, seed=15)]),
    "index_put accumulate": (lambda m, x, i, v: x.index_put((i,), v, accumulate=True),
                             [X, np.array([1, 1, 0]), arr(3, 5, 3, seed=16)]),
    "masked_fill": (lambda m, x, k: x.masked_fill(k, -1.5), [X, MASK[0, :, :1]]),
    "masked_select": (lambda m, x, k: x.masked_select(k), [X, MASK[0]]),
    "take_along_dim": (lambda m, x, i: m.take_along_dim(x, i, 1), [X, ints(5, (4, 1, 3), seed=17)]),
    "take_along_dim flat": (lambda m, x, i: m.take_along_dim(x, i), [X, np.array([3, 59, 3])]),
    "embedding": (lambda m, i, w: m.nn.functional.embedding(i, w, padding_idx=1),
                  [ints(6, (2, 5), seed=18), arr(6, 4, seed=19)]),
    "embedding freq": (lambda m, i, w: m.nn.functional.embedding(i, w, scale_grad_by_freq=True),
                       [ints(3, (7,), seed=20), arr(6, 4, seed=21)]),
    "one_hot": (lambda m, i: m.nn.functional.one_hot(i, 5), [ints(5, (2, 3), seed=22)]),
    "setitem list": (lambda m, x, v: _assigned(m, x, (slice(None), [1, 0]), v),
                     [X, arr(4, 2, 3, seed=23)]),
    "setitem mask": (lambda m, x, k: _assigned(m, x, k, 0.0), [X, MASK]),
    "setitem i, j": (lambda m, x, v: _assigned(m, x, ([0, 2], 1), v), [X, arr(3, seed=24)]),
    "setitem basic": (lambda m, x, v: _assigned(m, x, (1, slice(0, 2)), v), [X, arr(3, seed=25)]),
    "index_put_ accumulate": (lambda m, x, i, v: _updated(x, lambda y: y.index_put_(
        (i,), v, accumulate=True)), [X, np.array([3, 3]), arr(2, 5, 3, seed=26)]),
    "scatter_": (lambda m, x, i, s: _updated(x, lambda y: y.scatter_(1, i, s)),
                 [X, IDX_D1, SRC_D1]),
    "masked_fill_": (lambda m, x, k: _updated(x, lambda y: y.masked_fill_(k, 2.0)), [X, MASK]),
}
TRITON_CASES = ["x[i, :, j] broadcast", "x[x > 0]", "gather", "scatter", "scatter_reduce amax",
                "index_add", "index_put accumulate", "embedding", "setitem mask", "one_hot"]


def _assigned(m, x, key, value):
    y = x * 1.0  # a non-leaf copy that may be changed in place
    y[key] = value
    return y


def _updated(x, change):
    y = x * 1.0
    change(y)
    return y


def _run(module, f, inputs, as_float):
    tensors = []
    for a in inputs:
        a = np.asarray(a)
        if a.dtype.kind == "f":
            t = module.tensor(a, dtype=as_float)
            t.requires_grad_()
        else:
            t = module.tensor(a)
        tensors.append(t)
    return f(module, *tensors), tensors


@pytest.mark.parametrize("case", list(CASES))
def test_ops_against_torch(backend_name, case):
    if backend_name == "triton" and case not in TRITON_CASES:
        pytest.skip("interpreter time: the numpy backend checks this case")
    f, inputs = CASES[case]
    ours, ours_in = _run(td, f, inputs, td.float32)
    spec, spec_in = _run(torch, f, inputs, torch.float64)
    assert tuple(ours.shape) == tuple(spec.shape), f"{case}: shape"
    expected = "float32" if spec.dtype.is_floating_point else str(spec.dtype).split(".")[-1]
    assert ours.dtype.name == expected, f"{case}: dtype {ours.dtype.name}, expected {expected}"
    assert_close(ours.numpy(), spec.detach().numpy(), 1e-5, 1e-5, name=f"{case} forward")
    if not spec.requires_grad:
        return
    cot = RNG.standard_normal(tuple(spec.shape))
    ours.backward(td.tensor(cot, dtype=td.float32))
    spec.backward(torch.tensor(cot))
    for k, (a, b) in enumerate(zip(ours_in, spec_in)):
        if b.requires_grad:
            assert_close(a.grad.numpy(), b.grad.numpy(), 1e-5, 1e-5, name=f"{case} grad {k}")


# ----------------------------------------------------------------------------- gradients


def test_gradients_against_finite_differences():
    """The gradients (float64, numpy backend) against central differences under a random
    cotangent; values away from ties, where amax's gradient has a kink."""
    x = np.random.default_rng(30).standard_normal((3, 4))
    src = np.random.default_rng(31).standard_normal((3, 2))
    idx = td.tensor(ints(4, (3, 2), seed=32))
    fns = [lambda a, s: a.scatter_reduce(1, idx, s, "amax"),
           lambda a, s: a.scatter_reduce(1, idx, s, "prod", include_self=False),
           lambda a, s: a.scatter_reduce(1, idx, s, "mean") * a.gather(1, idx).sum(),
           lambda a, s: a[[0, 2], [1, 1]].sum() * s[:, [1, 0]],
           lambda a, s: F.embedding(td.tensor([[2, 0], [2, 2]]), a) * s[0, 0]]
    with td.use_backend("numpy"):
        for fn in fns:
            tensors = [td.tensor(v, dtype=td.float64, requires_grad=True) for v in (x, src)]
            assert gradcheck(fn, tensors, eps=1e-6, atol=1e-6, rtol=1e-5)


def test_second_order_through_scatter_and_gather():
    with td.use_backend("numpy"):
        x = td.tensor(arr(3, 4, seed=33), dtype=td.float64, requires_grad=True)
        idx = td.tensor([[0, 0], [3, 1], [2, 2]])
        y = (x.gather(1, idx) ** 2).sum()
        (g,) = td.grad(y, x, create_graph=True)
        (gg,) = td.grad((g * g).sum(), x)
        xt = torch.tensor(arr(3, 4, seed=33), requires_grad=True)
        yt = (xt.gather(1, torch.tensor([[0, 0], [3, 1], [2, 2]])) ** 2).sum()
        (gt,) = torch.autograd.grad(yt, xt, create_graph=True)
        (ggt,) = torch.autograd.grad((gt * gt).sum(), xt)
        assert_close(gg.numpy(), ggt.numpy(), 1e-12, 1e-12)


# ----------------------------------------------------------------------------- Embedding


def test_embedding_module_and_max_norm(backend_name):
    td.manual_seed(0)
    emb = nn.Embedding(7, 3, padding_idx=-1)
    assert emb.padding_idx == 6 and not emb.weight.numpy()[6].any()
    w = arr(7, 3, seed=34) * 2
    pre = nn.Embedding.from_pretrained(td.tensor(w), freeze=False, max_norm=1.5)
    assert pre.weight.requires_grad and not nn.Embedding.from_pretrained(td.tensor(w)).weight \
        .requires_grad
    index = np.array([[0, 3], [3, 5]])
    out = pre(td.tensor(index))
    spec_w = torch.tensor(w, dtype=torch.float32)
    spec = torch.nn.functional.embedding(torch.tensor(index), spec_w, max_norm=1.5)
    assert_close(out.numpy(), spec.numpy(), 1e-5, 1e-5)
    assert_close(pre.weight.numpy(), spec_w.numpy(), 1e-5, 1e-5, name="renormalised weight")


def test_embedding_gradient_is_deterministic_with_repeats(backend_name):
    index = td.tensor(ints(5, (60,), seed=35))
    w = td.tensor(RNG.standard_normal((5, 8)) * 1e3, dtype=td.float32, requires_grad=True)
    dy = td.tensor(RNG.standard_normal((60, 8)) * 1e3, dtype=td.float32)
    grads = []
    for _ in range(2):
        w.grad = None
        F.embedding(index, w).backward(dy)
        grads.append(w.grad.numpy())
    np.testing.assert_array_equal(grads[0], grads[1])


# ----------------------------------------------------------------------------- errors

ERRORS = {
    "gather index dims": (lambda x: td.gather(x, 0, td.tensor([0])), ValueError,
                          "gather: index has 1 dims but the tensor has 2"),
    "gather float index": (lambda x: td.gather(x, 0, td.tensor([[0.5]])), TypeError,
                           "gather: index must be an int64"),
    "scatter dtype": (lambda x: x.scatter(0, td.tensor([[0]]), td.tensor([[1]])), TypeError,
                      "scatter: src has dtype .*int64"),
    "scatter_reduce name": (lambda x: x.scatter_reduce(0, td.tensor([[0]]), x, "max"),
                            ValueError, "scatter_reduce: reduce must be one of"),
    "index_add shape": (lambda x: x.index_add(0, td.tensor([0]), x), ValueError,
                        r"index_add: source shape \(2, 3\) must be \(1, 3\)"),
    "float index": (lambda x: x[td.tensor([0.0])], IndexError,
                    "tensors used as indices must be int64"),
    "broadcast": (lambda x: x[td.tensor([0, 1]), td.tensor([0, 1, 2])], IndexError,
                  "shape mismatch"),
    "mask shape": (lambda x: x[td.tensor([True, False, True])], IndexError,
                   r"mask of shape \(3,\) does not match"),
    "masked_fill mask": (lambda x: x.masked_fill(td.tensor([1, 0, 1]), 0.0), TypeError,
                         "masked_fill: mask must be a bool tensor"),
    "one_hot dtype": (lambda x: F.one_hot(td.tensor([1], dtype=td.int32)), TypeError,
                      "one_hot: expects an int64 tensor"),
    "embedding weight": (lambda x: F.embedding(td.tensor([0]), x[0]), ValueError,
                         "embedding: weight must be a 2-d tensor"),
    "put shape": (lambda x: x.index_put((td.tensor([0]),), td.ones(2)), ValueError,
                  "index_put: values of shape"),
}


@pytest.mark.parametrize("case", list(ERRORS))
def test_bad_arguments_raise_one_line_errors(case):
    fn, exc, message = ERRORS[case]
    with td.use_backend("numpy"):
        with pytest.raises(exc, match=message):
            fn(td.tensor(arr(2, 3, seed=36), dtype=td.float32))


@pytest.mark.parametrize("op,call", [
    ("gather", lambda x: td.gather(x, 1, td.tensor([[0, 3]]))),
    ("scatter_add", lambda x: x.scatter_add(1, td.tensor([[3]]), x[:, :1])),
    ("index_select", lambda x: x.index_select(1, td.tensor([-1]))),
    ("indexing", lambda x: x[td.tensor([0, 1]), td.tensor([0, -4])]),
    ("embedding", lambda x: F.embedding(td.tensor([2, 5]), x)),
    ("one_hot", lambda x: F.one_hot(td.tensor([0, 5]), 3)),
])
def test_out_of_range_indices_raise_named_errors(backend_name, op, call):
    """The numpy backend raises at the op; the triton backend at the next read of the device
    (the asynchronous error of kernels/errors.py), naming the op."""
    with pytest.raises(IndexError, match=f"{op}: index -?[0-9]+ is out of bounds"):
        out = call(td.tensor(arr(2, 3, seed=37), dtype=td.float32))
        read_device(out._data)


# ----------------------------------------------------------------------------- GPU sizes


@pytest.mark.gpu
def test_embedding_backward_at_gpu_size_matches_torch_and_repeats_its_bits():
    torch.manual_seed(0)
    index = torch.randint(0, 50_000, (32_768,), device="cuda")
    index[::7] = index[0]  # a row that many indices repeat
    w = torch.randn(50_000, 768, device="cuda", requires_grad=True)
    dy = torch.randn(32_768, 768, device="cuda")
    torch.nn.functional.embedding(index, w, padding_idx=3).backward(dy)
    ours_w = td.tensor(w.detach(), requires_grad=True)
    grads = []
    for _ in range(2):
        ours_w.grad = None
        F.embedding(td.from_torch(index), ours_w, padding_idx=3).backward(td.from_torch(dy))
        grads.append(ours_w.grad.torch().clone())
    assert torch.equal(grads[0], grads[1])
    torch.testing.assert_close(grads[0], w.grad, rtol=1e-4, atol=1e-3)


@pytest.mark.gpu
@pytest.mark.parametrize("n,rows,width", [(1, 1, 1), (1023, 5, 1), (4097, 3000, 300),
                                          (100_000, 1 << 20, 1)])
def test_scatter_reduce_rows_gpu_sizes(n, rows, width):
    be = td.backend.backend_for(torch.device("cuda"))
    index = torch.randint(0, rows, (n,), device="cuda")
    src = torch.randn(n, width, device="cuda")
    for reduce in ("sum", "amax", "last"):
        got = be.scatter_reduce_rows(src, index, None, rows, reduce, False)
        expected = torch.zeros(rows, width, device="cuda")
        if reduce == "last":  # the largest i naming a row wins
            last = torch.full((rows,), -1, dtype=torch.int64, device="cuda").scatter_reduce(
                0, index, torch.arange(n, device="cuda"), "amax")
            hit = last >= 0
            expected[hit] = src[last[hit]]
        elif reduce == "amax":
            expected = expected.index_reduce(0, index, src, "amax", include_self=False)
        else:
            expected = expected.index_add(0, index, src)
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.gpu
def test_advanced_indexing_gpu_sizes():
    x = torch.randn(64, 513, 33, device="cuda")
    i = torch.randint(-64, 64, (1000,), device="cuda")
    j = torch.randint(0, 33, (1000,), device="cuda")
    ours = td.from_torch(x)
    torch.testing.assert_close(ours[td.from_torch(i), :, td.from_torch(j)].torch(), x[i, :, j])
    mask = x > 0.5
    torch.testing.assert_close(ours[td.from_torch(mask)].torch(), x[mask])
    k = torch.randint(0, 513, (64, 7, 33), device="cuda")
    torch.testing.assert_close(td.gather(ours, 1, td.from_torch(k)).torch(), x.gather(1, k))
