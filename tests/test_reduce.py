"""Reductions (tritonad/kernels/reduce.py) against the numpy reference backend.

The oracle is tritonad.reference.NumpyBackend in float64 (helpers.check_primitive). Inputs come
contiguous, transposed, sliced and expanded; dims are drawn as random subsets. The split path (a
reduction spread over several programs plus a second pass) is exercised on small shapes by
lowering the target program count (`split` fixture); on the GPU it runs naturally.
"""
import itertools

import numpy as np
import pytest
import torch
from helpers import assert_close, check_primitive, random_array
from hypothesis import given
from hypothesis import strategies as st

import tritonad as td
from tritonad.kernels import reduce as rd
from tritonad.reference import NumpyBackend

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # the triton backend's
REFERENCE = NumpyBackend()
NAN = float("nan")

SHAPES = [(), (1,), (7,), (1, 1), (3, 5), (5, 1), (45, 65), (2, 3, 4), (2, 1, 3, 5), (3, 4, 2, 3)]
LAYOUTS = ["contiguous", "transposed", "sliced", "expanded"]
FLOATS = [td.float32, td.float16, td.bfloat16]


@pytest.fixture(autouse=True)
def _triton_backend():
    with td.use_backend("triton"):
        yield


@pytest.fixture
def split(monkeypatch):
    """Spread reductions over up to 8 programs even under the interpreter and on small inputs."""
    monkeypatch.setattr(rd, "split_target_override", 8)
    monkeypatch.setattr(rd, "SPLIT_MIN_ELEMENTS", 0)


# ----------------------------------------------------------------------------- inputs


def make(shape, dtype=td.float32, layout="contiguous", seed=0, low=-3.0, high=3.0):
    """A raw array of `shape` on the triton device, laid out as `layout` says."""
    shape = tuple(shape)
    if layout == "transposed" and len(shape) >= 2:
        base = random_array(shape[::-1], dtype, DEVICE, low, high, seed)
        return base.permute(*reversed(range(len(shape))))
    if layout == "sliced" and shape:
        base = random_array(shape[:-1] + (2 * shape[-1],), dtype, DEVICE, low, high, seed)
        return base[..., ::2]
    if layout == "expanded" and shape and shape[0] > 1:
        return random_array((1,) + shape[1:], dtype, DEVICE, low, high, seed).expand(shape)
    return random_array(shape, dtype, DEVICE, low, high, seed)


def check(name, *args, rtol=None, atol=None, **kwargs):
    """The primitive against the float64 reference (values and shape); its dtype against the
    reference at the input's own dtype."""
    got = check_primitive(name, *args, rtol=rtol, atol=atol, **kwargs)
    cpu = [a.cpu() if isinstance(a, torch.Tensor) else a for a in args]
    expected = getattr(REFERENCE, name)(*cpu, **kwargs)
    assert got.dtype == expected.dtype, f"{name}: dtype {got.dtype}, reference {expected.dtype}"
    return got


@st.composite
def problems(draw, dtypes=FLOATS):
    """(x, dims, keepdim): a strided input and a random subset of its dims (or None: all)."""
    shape = draw(st.sampled_from(SHAPES))
    x = make(shape, draw(st.sampled_from(dtypes)), draw(st.sampled_from(LAYOUTS)),
             draw(st.integers(0, 2**16)))
    subset = draw(st.lists(st.booleans(), min_size=len(shape), max_size=len(shape)))
    dims = tuple(i for i, keep in enumerate(subset) if keep)
    dims = draw(st.sampled_from([dims, None]))
    return x, dims, draw(st.booleans())


def sum_tolerance(x, dims, op="sum"):
    """float32 sums in another order than the float64 reference: the error grows with the count
    of terms (values up to 3), not with the (possibly cancelling) result; a mean divides it by
    the count again; a variance (about 3 here) needs only a relative bound."""
    if x.dtype != torch.float32:
        return {}
    count = np.prod([x.shape[d] for d in (dims if dims is not None else range(x.dim()))])
    return dict(rtol=1e-5, atol={"sum": 3e-6 * max(count, 1), "mean": 3e-6, "var": 1e-5}[op])


# ----------------------------------------------------------------------------- properties


@pytest.mark.parametrize("op", ["sum", "mean", "var", "max", "min"])
@given(problem=problems(FLOATS + [td.int32, td.int64]))
def test_reduce_against_reference(op, problem):
    x, dims, keepdim = problem
    if op in ("mean", "var") and not x.dtype.is_floating_point:
        return  # floating point x only (backend.py)
    if op in ("max", "min") and x.numel() == 0:
        return
    tol = sum_tolerance(x, dims, op) if op in ("sum", "mean", "var") else {}
    if op == "var":
        check(op, x, dims, 1, keepdim, **tol)
    else:
        check(op, x, dims, keepdim, **tol)


@pytest.mark.parametrize("op", ["argmax", "argmin"])
@given(problem=problems(FLOATS + [td.int32, td.int64]), ties=st.booleans())
def test_arg_reduce_against_reference(op, problem, ties):
    x, dims, keepdim = problem
    if ties:  # few distinct values: the first extreme must win
        x = make(x.shape, td.int32, "contiguous", 1, low=0, high=3).to(x.dtype)
    dim = None if not dims else dims[0]
    check(op, x, dim, keepdim)


def test_bool_and_int_sums_are_int64_and_dtype_argument():
    b = td.get_backend()
    flags = make((5, 7), td.bool, "transposed", 3)
    check("sum", flags, (1,), False)
    ints = make((4, 9), td.int32, "sliced", 4)
    check("sum", ints, None, False)
    assert b.sum(ints, (0,), dtype=td.float32).dtype == torch.float32
    check("sum", make((4, 9), td.float16, seed=5), (1,), True, td.float32)
    check("sum", make((4, 9), seed=6), (0,), False, td.int64)


def test_half_types_accumulate_in_float32():
    x = torch.full((4096,), 0.1, dtype=torch.float16, device=DEVICE)
    # float16 steps near 400 are 0.25: a float16 accumulator would stall far below the answer
    total = td.get_backend().sum(x)
    assert total.dtype == torch.float16 and abs(float(total) - 409.6) < 0.5
    check("mean", make((3, 700), td.bfloat16, seed=7), (1,), False)


# ----------------------------------------------------------------------------- edge values


def test_nan_propagates_and_ties_pick_the_first():
    b = td.get_backend()
    x = torch.tensor([[1.0, NAN, 3.0, NAN], [2.0, 5.0, 5.0, -1.0]], device=DEVICE)
    for op in ("max", "min"):
        check(op, x, (1,), False)
        check(op, x, None, False)
    assert b.argmax(x, 1).tolist() == [1, 1] and b.argmin(x, 1).tolist() == [1, 3]
    assert b.argmax(x.t(), 0).tolist() == [1, 1]
    inf = torch.tensor([-float("inf")] * 3, device=DEVICE)
    assert b.argmax(inf, 0).item() == 0 and b.max(inf).item() == -float("inf")
    ints = torch.tensor([[7, 7, 2], [-4, -4, -4]], dtype=torch.int64, device=DEVICE)
    assert b.argmax(ints, 1).tolist() == [0, 0] and b.argmin(ints, None).item() == 3
    assert b.argmax(ints, None, keepdim=True).shape == (1, 1)


def test_empty_inputs_as_the_reference():
    b = td.get_backend()
    empty = make((3, 0))
    for op in ("max", "min", "argmax", "argmin"):
        with pytest.raises(RuntimeError, match=op):
            getattr(b, op)(empty, (1,) if op in ("max", "min") else 1)
    check("sum", empty, (1,), False)
    check("mean", empty, (1,), False)
    check("sum", make((0, 3)), (1,), False)
    check("sum", make(()), None, False)
    check("var", make((4,)), (0,), 4, False)  # n - correction = 0: inf or nan, as numpy
    check("max", make(()), None, True)


# ----------------------------------------------------------------------------- planning paths


@pytest.mark.parametrize("shape,dims", [((3, 300), (1,)), ((300, 3), (0,)), ((6, 50, 4), (0, 2)),
                                        ((2, 3, 40, 5), (0, 2, 3)), ((700,), None)])
@pytest.mark.parametrize("op", ["sum", "var", "max", "argmax"])
def test_split_reductions(split, shape, dims, op):
    x = make(shape, seed=8)
    if op == "argmax":
        check(op, x, None if dims is None else dims[0], False)
    elif op == "var":
        check(op, x, dims, 1, False, **sum_tolerance(x, dims, op))
    else:
        check(op, x, dims, False, **sum_tolerance(x, dims))


@pytest.mark.parametrize("dims", [(0,), (0, 2, 3), (1, 3), (0, 1, 2, 3)])
def test_bias_gradient_shapes_and_sum_to(dims):
    """(N, C) -> (C) and (N, C, H, W) -> (C): the engine's un-broadcasting (sum_to)."""
    b = td.get_backend()
    x = make((8, 6, 5, 7), seed=9)
    check("sum", x, dims, True, **sum_tolerance(x, dims))
    assert_close(b.sum_to(x, (1, 6, 1, 1)), x.cpu().double().sum((0, 2, 3), keepdim=True),
                 rtol=1e-5, atol=1e-5)
    assert_close(b.sum_to(make((9, 4), seed=1), (4,)), make((9, 4), seed=1).cpu().sum(0))


def test_more_dims_than_the_kernel_walks():
    """Kept dims that do not collapse to three: the launcher copies once, then reduces."""
    x = make((2, 3, 2, 3, 2, 3), seed=10).permute(1, 0, 3, 2, 5, 4)
    check("sum", x, (1, 3, 5), False, **sum_tolerance(x, (1, 3, 5)))
    check("argmax", x, 4, True)


def test_orientation_choice():
    """Columns (lanes along the kept dim) when that dim is the contiguous one."""
    launches = []
    real = rd._reduce_kernel

    class Spy:
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                launches.append(kwargs["AXIS"])
                return real[grid](*args, **kwargs)
            return launch

    rd._reduce_kernel = Spy()
    try:
        td.get_backend().sum(make((64, 32)), (0,))
        td.get_backend().sum(make((64, 32)), (1,))
        td.get_backend().sum(make((64, 32)).t(), (0,))
    finally:
        rd._reduce_kernel = real
    assert launches == [0, 1, 1]


# ----------------------------------------------------------------------------- GPU tier


@pytest.mark.gpu
@pytest.mark.parametrize("shape,dims", [((4096, 4096), (1,)), ((4096, 4096), (0,)),
                                        ((1 << 24,), None), ((1823, 781), (0,)),
                                        ((1823, 781), (1,)), ((45, 65), None),
                                        ((64, 128, 28, 28), (0, 2, 3)), ((256, 64, 32, 32), (1,))])
@pytest.mark.parametrize("op", ["sum", "mean", "var", "max", "argmax"])
def test_gpu_large_reductions(shape, dims, op):
    x = make(shape, td.float32, "contiguous", 11)
    if op == "argmax":
        check(op, x, None if dims is None else dims[-1], False)
    elif op == "var":
        check(op, x, dims, 1, False, **sum_tolerance(x, dims, op))
    elif op == "max":
        check(op, x, dims, False)
    else:
        check(op, x, dims, False, **sum_tolerance(x, dims, op))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [td.float16, td.bfloat16, td.int32])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_gpu_strided_and_half(dtype, layout):
    x = make((1823, 781), dtype, layout, 12)
    for dims in [(0,), (1,), None]:
        check("sum", x, dims, False, **sum_tolerance(x, dims))
        check("max", x, dims, True)
    check("argmin", x, 0, False)


@pytest.mark.gpu
def test_gpu_against_torch_combinations():
    x = torch.randn(6, 7, 8, 9, device="cuda")
    for r in range(1, 5):
        for dims in itertools.combinations(range(4), r):
            got = td.get_backend().sum(x, dims)
            torch.testing.assert_close(got, x.sum(dims), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("n, c", [(1, 1), (128, 10), (37, 5), (9, 1500)])
def test_count_correct_matches_reference(n, c):
    """The fused metric kernel: first argmax (ties included) against the target, added to a
    counter in place."""
    rng = np.random.default_rng(n * c)
    logits = rng.integers(0, 3, size=(n, c)).astype(np.float32)  # many ties
    target = rng.integers(0, c, size=n)
    with td.use_backend("triton"):
        counter = td.full((), 7, dtype=td.int64)
        td.get_backend().count_correct_(td.tensor(logits).torch(), td.tensor(target).torch(),
                                        counter.torch())
    expected = 7 + int((np.argmax(logits, axis=1) == target).sum())
    assert counter.item() == expected


def test_sum_and_matmul_write_into_out():
    with td.use_backend("triton"):
        x = td.tensor(np.arange(12, dtype=np.float32).reshape(3, 4))
        out = td.empty(4)
        got = td.get_backend().sum(x.torch(), (0,), out=out.torch())
        assert got is out.torch() and out.tolist() == [12.0, 15.0, 18.0, 21.0]
        prod = td.empty(3, 3)
        td.get_backend().matmul(x.torch(), x.torch().t(), out=prod.torch())
        np.testing.assert_allclose(prod.numpy(), x.numpy() @ x.numpy().T)
        with pytest.raises(ValueError, match="out must be"):
            td.get_backend().sum(x.torch(), (0,), out=td.empty(3).torch())


VAR_FORMS = {  # name -> call, the same on a tritonad or a torch tensor and module
    "positional unbiased": lambda m, x: x.std(True),
    "positional biased": lambda m, x: x.var(False),
    "dim, unbiased, keepdim": lambda m, x: x.var(1, False, True),
    "dim, unbiased": lambda m, x: x.std(0, True),
    "correction keyword": lambda m, x: x.var(1, correction=0, keepdim=True),
    "correction 2": lambda m, x: x.std(dim=(0, 1), correction=2),
    "unbiased keyword": lambda m, x: x.var(dim=0, unbiased=False),
    "functions": lambda m, x: m.std(x, 1, False) + m.var(x, correction=0),
    "function, lone bool": lambda m, x: m.var(x, False),
}


@pytest.mark.parametrize("form", list(VAR_FORMS))
def test_var_and_std_read_their_arguments_as_torch(backend_name, form):
    a = np.random.default_rng(5).normal(size=(4, 6)).astype(np.float32)
    got = VAR_FORMS[form](td, td.tensor(a))
    expected = VAR_FORMS[form](torch, torch.from_numpy(a))
    assert got.shape == tuple(expected.shape)
    torch.testing.assert_close(got.torch().cpu(), expected, rtol=1e-5, atol=1e-6)
