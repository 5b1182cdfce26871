"""Scans and sorting (tritonad/kernels/scan.py, reference/scan.py, autodiff/scan_ops.py):
cumsum, cumprod, logcumsumexp, cummax, cummin, sort, argsort, topk, forward and backward, on
both backends against PyTorch's CPU implementation (the spec), the gradients also against
float64 central differences.

The kernels' long-row paths (rows split into chunks for scans; merges across tiles for sort;
per-tile candidates for topk) start at GPU sizes; the `small_tiles` fixture shrinks their
thresholds so that the interpreter runs them on a few hundred elements.
"""
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import tritonad as td
from tritonad.autodiff import gradcheck, gradgradcheck
from tritonad.kernels import plans, radix_sort, scan_lookback
from tritonad.kernels import scan as kernels

NAN = float("nan")


@pytest.fixture
def small_tiles(monkeypatch):
    """Long-row paths on tiny rows: 8-wide sort tiles, 16-column scan chunks, radix blocks of
    16 ranked 8 at a time on 8-bit digits (4 passes: the interpreter pays per launch),
    look-back windows of 2 chunks (no plans kept: a plan records the path its first call
    took)."""
    monkeypatch.setattr(plans, "PLANS_ENABLED", False)
    for name, value in (("SORT_TILE", 8), ("MERGE_BLOCK", 8), ("SCAN_CHUNK", 16),
                        ("SCAN_BLOCK", 8), ("SPLIT_ROWS", 64)):
        monkeypatch.setattr(kernels, name, value)
    for name, value in (("RADIX_BLOCK", 16), ("RADIX_SUB", 8), ("MAX_BLOCKS", 4), ("BITS", 8)):
        monkeypatch.setattr(radix_sort, name, value)
    monkeypatch.setattr(scan_lookback, "WINDOW", 2)


@pytest.fixture(params=["new", "old"])
def variant(request, backend_name, monkeypatch):
    """The long-row kernels of each variant (kernels.VARIANT): the single-pass scan, radix sort
    and halving topk, or the paths before them (the numpy backend has one path: new only)."""
    if backend_name == "numpy" and request.param == "old":
        pytest.skip("the numpy backend has no kernel variants")
    monkeypatch.setattr(kernels, "VARIANT", request.param)
    return request.param


def both(values, dtype=None, grad=False):
    """(tritonad tensor, torch tensor) of the same numpy values."""
    t = torch.from_numpy(np.array(values))
    if dtype is not None:
        t = t.to(dtype)
    x = td.from_torch(t.clone()) if hasattr(td, "from_torch") else td.tensor(t.numpy())
    if grad:
        x.requires_grad_()
        t = t.clone().requires_grad_()
    return x, t


def assert_same(got, want, rtol=1e-5, atol=1e-6, exact=False):
    g = torch.from_numpy(np.array(got.numpy()))
    want = want.detach()
    assert tuple(g.shape) == tuple(want.shape), (g.shape, want.shape)
    if exact or not want.dtype.is_floating_point:
        assert torch.equal(g.to(want.dtype) if g.dtype != want.dtype else g, want) or \
            torch.allclose(g.double(), want.double(), equal_nan=True, rtol=0, atol=0), (g, want)
    else:
        torch.testing.assert_close(g.to(want.dtype), want, rtol=rtol, atol=atol, equal_nan=True)


def check_against_torch(td_fn, torch_fn, values, dtype=torch.float32, seed=0, rtol=1e-5,
                        atol=1e-6):
    """Forward outputs (values and indices) and the input gradient under a random cotangent."""
    x, t = both(values, dtype, grad=dtype.is_floating_point)
    got, want = td_fn(x), torch_fn(t)
    got = got if isinstance(got, tuple) else (got,)
    want = want if isinstance(want, tuple) else (want,)
    for g, w in zip(got, want):
        assert_same(g, w, rtol, atol)
    if not dtype.is_floating_point:
        return
    rng = np.random.default_rng(seed)
    cot = rng.standard_normal(tuple(want[0].shape)).astype(np.float32)
    got[0].backward(td.tensor(cot, dtype=got[0].dtype))
    want[0].backward(torch.from_numpy(cot).to(dtype))
    assert_same(x.grad, t.grad, rtol * 10, atol * 10)


def with_specials(shape, seed=0, nan=True, zeros=True, ties=True):
    rng = np.random.default_rng(seed)
    v = rng.standard_normal(shape).astype(np.float32)
    flat = v.reshape(-1)
    if ties and flat.size > 4:
        flat[1::3] = np.round(flat[1::3])  # repeated values
    if zeros and flat.size > 3:
        flat[3] = 0.0
        flat[2] = -0.0
    if nan and flat.size > 5:
        flat[5] = np.nan
    return v


# ------------------------------------------------------------------------------------ scans

SCAN_CASES = [((3, 37), -2), ((4, 5, 6), 1), ((2, 1, 9), -1)]


@pytest.mark.parametrize("shape,dim", SCAN_CASES)
def test_cumsum_cumprod_forward_backward(backend_name, shape, dim):
    values = with_specials(shape, nan=False)
    check_against_torch(lambda x: td.cumsum(x, dim), lambda t: torch.cumsum(t, dim), values)
    small = (values / 2 + 1).astype(np.float32)  # products that stay in range
    small.reshape(-1)[3] = 0.0
    check_against_torch(lambda x: x.cumprod(dim), lambda t: t.cumprod(dim), small)


@pytest.mark.parametrize("shape,dim", SCAN_CASES[:1])
def test_logcumsumexp_forward_backward(backend_name, shape, dim):
    values = with_specials(shape, nan=False, zeros=False) * 30  # differences exp would overflow
    check_against_torch(lambda x: td.logcumsumexp(x, dim), lambda t: torch.logcumsumexp(t, dim),
                        values, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("largest", [True, False])
def test_cummax_cummin_ties_nan(backend_name, largest):
    values = with_specials((3, 23))
    values[1, 7:] = 2.0  # a run of ties: the last index wins, as torch
    op = "cummax" if largest else "cummin"
    check_against_torch(lambda x: getattr(td, op)(x, 1), lambda t: getattr(torch, op)(t, 1),
                        values)


def test_scan_edge_values(backend_name):
    inf = float("inf")
    values = np.array([[-inf, -inf, 0.0, inf, 1.0], [NAN, 1.0, 2.0, -inf, 3.0]], np.float32)
    with torch.no_grad():
        for op in ("cumsum", "cumprod", "logcumsumexp"):
            x, t = both(values)
            assert_same(getattr(td, op)(x, 1), getattr(torch, op)(t, 1))
        x, t = both(np.zeros((0, 3), np.float32))
        assert_same(td.cumsum(x, 0), torch.cumsum(t, 0))
        x, t = both(np.float32(2.5))
        assert_same(td.cumsum(x, 0), torch.cumsum(t, 0))
        assert_same(td.cummax(x, -1).indices, torch.cummax(t, -1).indices)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.uint8, torch.bool])
def test_integer_scans_accumulate_in_int64(backend_name, dtype):
    values = np.random.default_rng(1).integers(0, 5, (3, 11))
    x, t = both(values, dtype)
    for op in ("cumsum", "cumprod"):
        got, want = getattr(td, op)(x, 1), getattr(torch, op)(t, 1)
        assert got.dtype is td.int64
        assert_same(got, want)
    assert_same(td.cummax(x, 1).values, torch.cummax(t, 1).values)
    assert_same(td.cumsum(x, 1, dtype=td.float32), torch.cumsum(t, 1, dtype=torch.float32))


def test_scans_of_half_and_strided_inputs(backend_name):
    values = with_specials((6, 9), nan=False)
    check_against_torch(lambda x: td.cumsum(x.t(), 1), lambda t: torch.cumsum(t.t(), 1), values)
    check_against_torch(lambda x: td.cumsum(x[:, 1::2], 0), lambda t: torch.cumsum(t[:, 1::2], 0),
                        values)
    x, t = both(values, torch.float16)
    assert_same(td.cumsum(x, 1), torch.cumsum(t.float(), 1).half(), rtol=1e-3, atol=1e-3)


def test_long_row_scans(backend_name, small_tiles):
    values = with_specials((2, 40), nan=False)
    check_against_torch(lambda x: td.cumsum(x, 1), lambda t: torch.cumsum(t, 1), values)
    values[1, 20] = np.nan
    with td.no_grad():
        x, t = both(values)
        for got, want in zip(td.cummax(x, 1), torch.cummax(t, 1)):
            assert_same(got, want)


def test_scan_gradients_float64_differences():
    rng = np.random.default_rng(2)
    x = td.tensor(rng.uniform(0.5, 1.5, (3, 6))).requires_grad_()
    z = td.tensor(np.array([[2.0, 0.0, 3.0, 0.0, 1.5], [1.0, 2.0, 0.0, 4.0, 0.5]]))
    z.requires_grad_()
    for fn in (lambda v: td.cumsum(v, 1), lambda v: td.cumprod(v, 0),
               lambda v: td.logcumsumexp(v, 1), lambda v: td.cummax(v, 1).values):
        assert gradcheck(fn, [x])
    assert gradcheck(lambda v: td.cumprod(v, 1), [z])  # zeros: torch's exact rule
    assert gradgradcheck(lambda v: td.logcumsumexp(v, 1), [x])


# ------------------------------------------------------------------------------------ sorting


@pytest.mark.parametrize("shape,dim", [((3, 37), 1), ((4, 6, 5), -2)])
@pytest.mark.parametrize("descending", [False, True])
def test_sort_matches_torch_stable(backend_name, shape, dim, descending):
    values = with_specials(shape)
    check_against_torch(lambda x: td.sort(x, dim, descending, stable=True),
                        lambda t: torch.sort(t, dim=dim, descending=descending, stable=True),
                        values)


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16, torch.int64, torch.uint8])
def test_sort_dtypes(backend_name, dtype):
    rng = np.random.default_rng(3)
    values = rng.integers(-3, 4, (2, 19)) if not dtype.is_floating_point else \
        with_specials((2, 19)).astype(np.float64)
    if dtype is torch.uint8 or dtype is torch.bool:
        values = np.abs(values)
    x, t = both(values, dtype)
    for descending in (False, True):
        v, i = td.sort(x, 1, descending=descending)
        tv, ti = torch.sort(t, dim=1, descending=descending, stable=True)
        assert v.dtype is td.dtypes.get_dtype(dtype) and i.dtype is td.int64
        assert_same(v, tv)
        assert_same(i, ti)
    assert_same(x.argsort(dim=1), torch.argsort(t, dim=1, stable=True))


def test_sort_strided_and_edges(backend_name):
    values = with_specials((9, 7))
    check_against_torch(lambda x: td.sort(x.t(), 1), lambda t: torch.sort(t.t(), dim=1, stable=True),
                        values)
    inf = float("inf")
    edge = np.array([[inf, -inf, NAN, 0.0, -0.0, 1.0, NAN, -inf]], np.float32)
    x, t = both(edge)
    for descending in (False, True):
        v, i = td.sort(x, descending=descending)
        tv, ti = torch.sort(t, descending=descending, stable=True)
        assert_same(v, tv)
        assert_same(i, ti)
    x, t = both(np.zeros((3, 0), np.float32))
    assert td.sort(x).values.shape == (3, 0)
    x, t = both(np.float32(4.0))
    assert_same(td.sort(x).indices, torch.sort(t).indices)


@pytest.mark.parametrize("n,k,largest", [(37, 0, True), (37, 5, False), (37, 37, True),
                                         (64, 1, True)])
def test_topk(backend_name, n, k, largest):
    values = with_specials((3, n), ties=False, zeros=False)
    x, t = both(values, grad=True)
    v, i = td.topk(x, k, dim=1, largest=largest)
    tv, ti = torch.topk(t, k, dim=1, largest=largest)
    assert_same(v, tv)
    assert_same(i, ti)
    cot = np.random.default_rng(4).standard_normal(tv.shape).astype(np.float32)
    v.backward(td.tensor(cot))
    tv.backward(torch.from_numpy(cot))
    assert_same(x.grad, t.grad)


def test_topk_ties_take_the_lower_index(backend_name):
    x, t = both(np.array([[1.0, 3.0, 3.0, 2.0, 3.0]], np.float32))
    assert td.topk(x, 2).indices.tolist() == [[1, 2]]
    assert td.topk(x, 2, largest=False).indices.tolist() == [[0, 3]]


def test_long_rows_sort_and_topk(backend_name, small_tiles, variant):
    values = with_specials((2, 21))
    check_against_torch(lambda x: td.sort(x, 1, True),
                        lambda t: torch.sort(t, dim=1, descending=True, stable=True), values)
    distinct = with_specials((2, 30), ties=False, zeros=False)
    for k in (2, 30):  # candidates per tile; k too large for them: the whole sort
        check_against_torch(lambda x: td.topk(x, k, 1), lambda t: torch.topk(t, k, 1), distinct)


def test_radix_sort_dtypes_blocks_and_strides(small_tiles, monkeypatch):
    # rows of 3 radix blocks against torch's stable sort, indices included: float32 with NaN,
    # -0.0, -inf and ties along a strided dim, int32; bfloat16 on the GPU's 4-bit digits (its
    # low 16 key bits skipped: 4 passes)
    rng = np.random.default_rng(6)
    cases = [(with_specials((1, 37, 2)), torch.float32, (True,), 8),
             (rng.integers(-4, 4, (1, 35)), torch.int32, (True,), 8),
             (with_specials((1, 41)), torch.bfloat16, (False, True), 4)]
    with td.use_backend("triton"):
        for values, dtype, directions, bits in cases:
            monkeypatch.setattr(radix_sort, "BITS", bits)
            if dtype.is_floating_point:
                values.reshape(-1)[7] = -np.inf
            x, t = both(values, dtype)
            for descending in directions:
                v, i = td.sort(x, 1, descending=descending)
                tv, ti = torch.sort(t, dim=1, descending=descending, stable=True)
                assert_same(i, ti)
                assert_same(v, tv)


def test_topk_halving_over_several_candidate_passes(small_tiles):
    # k = 3 keeps runs of 4 from 8-wide tiles: 70 columns -> 36 candidates -> 20 -> 12 -> 8,
    # one tile; ties (rounded values) go to the lower index, NaN is the largest (the smallest
    # k: test_topk)
    values = with_specials((2, 70, 1), zeros=False)
    values[1, 40, 0] = np.nan
    with td.use_backend("triton"):
        x, t = both(values)
        v, i = td.topk(x, 3, 1)
        tv, ti = torch.sort(t, dim=1, descending=True, stable=True)
        assert_same(i, ti[:, :3])
        assert_same(v, tv[:, :3])


def test_lookback_scan_leaves_its_workspace_clean(small_tiles):
    # a cumsum of 4 and 5 chunks a row, forward and reversed (cumsum's gradient), float16 in
    # float32: right each time, and the workspace zeroed for the next launch
    rng = np.random.default_rng(7)
    with td.use_backend("triton"):
        for shape, reverse, dtype in (((3, 50), False, torch.float32),
                                      ((1, 70), True, torch.float16)):
            t = torch.from_numpy(rng.standard_normal(shape).astype(np.float32)).to(dtype)
            y = kernels.cumulative(t, 1, "sum", reverse)
            src = t.float().flip(1) if reverse else t.float()
            want = torch.cumsum(src.double(), 1)
            want = want.flip(1) if reverse else want
            assert y.dtype == dtype
            torch.testing.assert_close(y.double(), want, rtol=2e-3, atol=2e-3)
            ws = scan_lookback._workspace(t.device)
            assert int((ws != 0).sum()) == 0


def test_sort_topk_gradients_float64_differences():
    x = td.tensor(np.random.default_rng(5).standard_normal((3, 7))).requires_grad_()
    assert gradcheck(lambda v: td.sort(v, 1, descending=True).values, [x])
    assert gradcheck(lambda v: td.topk(v, 3, 0).values, [x])
    assert gradgradcheck(lambda v: td.sort(v, 0).values * v.sum(), [x])


def test_errors_name_the_op():
    x = td.tensor(np.ones((2, 3), np.float32))
    with pytest.raises(IndexError, match="sort"):
        td.sort(x, dim=2)
    with pytest.raises(IndexError, match="cumsum"):
        td.cumsum(x, -3)
    with pytest.raises(RuntimeError, match="topk"):
        td.topk(x, 4)
    with pytest.raises(TypeError, match="logcumsumexp"):
        td.logcumsumexp(td.tensor(np.ones(3, np.int64)), 0)


@settings(max_examples=8)
@given(st.lists(st.sampled_from([0.0, -0.0, 1.0, -1.0, 2.5, NAN, float("inf"), -3.0]),
                min_size=1, max_size=24), st.booleans())
def test_sort_is_a_stable_permutation(values, descending):
    with td.use_backend("triton"):
        x = td.tensor(np.array(values, np.float32))
        v, i = td.sort(x, descending=descending)
        t = torch.tensor(values, dtype=torch.float32)
        tv, ti = torch.sort(t, descending=descending, stable=True)
        assert i.tolist() == ti.tolist()
        assert_same(v, tv)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(1 << 20,), (64, 32000), (3, 300001)])
def test_gpu_sizes(shape):
    with td.use_backend("triton"):
        t = torch.randn(shape, device="cuda")
        t.view(-1)[::1000] = float("nan")
        x = td.from_torch(t.clone())
        v, i = td.sort(x, descending=True)
        tv, ti = torch.sort(t, descending=True, stable=True)
        assert torch.equal(v._data, tv) or torch.allclose(v._data, tv, equal_nan=True)
        assert torch.equal(i._data, ti)
        for k in (1, 50, 2000):
            v, i = td.topk(x, k)
            tv, ti = torch.topk(t, k)
            assert torch.allclose(v._data, tv, equal_nan=True)
            assert torch.equal(t.gather(-1, i._data), v._data) or \
                torch.allclose(t.gather(-1, i._data), v._data, equal_nan=True)
        finite = torch.randn(shape, device="cuda")
        y = td.cumsum(td.from_torch(finite), -1)._data
        want = torch.cumsum(finite.double(), -1)
        assert torch.allclose(y.double(), want, rtol=1e-4, atol=1e-3 * shape[-1] ** 0.5)
        mv, mi = td.cummax(td.from_torch(finite), -1)
        tmv, tmi = torch.cummax(finite, -1)
        assert torch.equal(mv._data, tmv) and torch.equal(mi._data, tmi)


@pytest.mark.gpu
@pytest.mark.parametrize("variant", ["new", "old"])
@pytest.mark.parametrize("shape,dtype", [
    ((1 << 20,), torch.float32), ((4096, 32000), torch.float32), ((3, 300001), torch.float32),
    ((64, 32000), torch.bfloat16), ((5, 40961), torch.float16), ((7, 100003), torch.int32),
    ((2, 70001), torch.uint8)])
def test_gpu_kernels_against_torch(monkeypatch, variant, shape, dtype):
    """The kernels of each variant at real sizes (radix blocks, look-back windows and topk
    candidate passes as the GPU runs them): sort and topk indices exactly torch's stable sort
    (NaN, ties), cumsum within float32 rounding, twice (the look-back workspace reused)."""
    monkeypatch.setattr(kernels, "VARIANT", variant)
    gen = torch.Generator(device="cuda").manual_seed(0)
    if dtype.is_floating_point:
        x = torch.randn(shape, device="cuda", generator=gen)
        x.view(-1)[1::7] = x.view(-1)[1::7].round()  # ties
        x.view(-1)[::1009] = float("nan")
        x.view(-1)[3::1013] = -0.0
        x = x.to(dtype)
    else:
        x = torch.randint(0, 200 if dtype == torch.uint8 else 1000, shape, device="cuda",
                          generator=gen).to(dtype)
        if dtype == torch.int32:
            x -= 500
    dim = x.dim() - 1
    for descending in (False, True):
        v, i = kernels.sort(x, dim, descending, True)
        tv, ti = torch.sort(x, dim=-1, descending=descending, stable=True)
        assert torch.equal(i, ti), (variant, shape, dtype, descending)
        assert torch.equal(v, tv) or torch.allclose(v.float(), tv.float(), equal_nan=True)
        for k in (1, 50, 500):
            v, i = kernels.topk(x, k, dim, descending, True)
            assert torch.equal(i, ti[..., :k]), (variant, shape, dtype, descending, k)
            assert torch.allclose(v.float(), tv[..., :k].float(), equal_nan=True)
        del v, i, tv, ti
    finite = torch.nan_to_num(x.float(), nan=0.0).to(dtype) if dtype.is_floating_point else x
    n = shape[-1]
    for reverse in (False, True, False):
        y = kernels.cumulative(finite, dim, "sum", reverse)
        src = finite.flip(-1) if reverse else finite
        want = torch.cumsum(src.double() if dtype.is_floating_point else src, -1)
        want = want.flip(-1) if reverse else want
        if dtype.is_floating_point:
            tol = 1e-3 if dtype == torch.float32 else 2e-2
            assert torch.allclose(y.double(), want, rtol=tol, atol=tol * n ** 0.5), reverse
        else:
            assert torch.equal(y, want)
