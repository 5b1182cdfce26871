"""Row gather and scatter-add (tritonad/kernels/index.py) against the numpy reference backend,
and through the Tensor API (x[idx] and its gradient) against the numpy backend."""
import numpy as np
import pytest
import torch
from helpers import assert_close, check_op, check_primitive, random_array, read_device
from hypothesis import given
from hypothesis import strategies as st

import tritonad as td
from tritonad.kernels import index as ix
from tritonad.reference import NumpyBackend

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # the triton backend's
REFERENCE = NumpyBackend()
DTYPES = [td.float32, td.float16, td.bfloat16, td.int32, td.int64, td.uint8, td.bool]


@pytest.fixture(autouse=True)
def _triton_backend():
    with td.use_backend("triton"):
        yield


def backend():
    return td.get_backend()


def indices(shape, rows, dtype=torch.int64, seed=0, negative=True):
    """Raw indices into `rows` rows (some negative, counting from the end)."""
    rng = np.random.default_rng(seed)
    values = rng.integers(-rows if negative else 0, rows, size=shape) if rows else \
        np.zeros(shape, np.int64)
    return torch.from_numpy(np.asarray(values)).to(DEVICE, dtype)


def rows_of(shape, dtype, layout, seed):
    """x: [R, *rest] in a layout: contiguous, rows sliced (stride 2R), or rest transposed."""
    if layout == "sliced":
        return random_array((2 * shape[0],) + shape[1:], dtype, DEVICE, seed=seed)[::2]
    if layout == "transposed" and len(shape) == 3:
        base = random_array((shape[0], shape[2], shape[1]), dtype, DEVICE, seed=seed)
        return base.transpose(1, 2)
    return random_array(shape, dtype, DEVICE, seed=seed)


# ----------------------------------------------------------------------------- gather


@given(x_shape=st.sampled_from([(10,), (7, 3), (5, 4, 3), (1, 9), (60, 784)]),
       index_shape=st.sampled_from([(), (1,), (5,), (2, 3), (0,)]),
       dtype=st.sampled_from(DTYPES), index_dtype=st.sampled_from([torch.int64, torch.int32]),
       layout=st.sampled_from(["contiguous", "sliced", "transposed"]),
       seed=st.integers(0, 2**16))
def test_gather_rows_against_reference(x_shape, index_shape, dtype, index_dtype, layout, seed):
    x = rows_of(x_shape, dtype, layout, seed)
    index = indices(index_shape, x_shape[0], index_dtype, seed)
    got = check_primitive("gather_rows", x, index, rtol=0, atol=0)
    assert got.dtype == x.dtype and tuple(got.shape) == index_shape + x_shape[1:]


def test_gather_rows_non_contiguous_index():
    x = random_array((9, 4), td.float32, DEVICE, seed=1)
    index = indices((6, 4), 9, seed=2).t()  # a transposed index array
    check_primitive("gather_rows", x, index, rtol=0, atol=0)


@pytest.mark.parametrize("bad", [10, -11, 2**40])
def test_gather_rows_out_of_range_raises(bad):
    x = random_array((10, 3), td.float32, DEVICE)
    index = torch.tensor([0, bad, 3], device=DEVICE)
    with pytest.raises(IndexError, match=f"gather_rows: index {bad} is out of bounds"):
        read_device(backend().gather_rows(x, index))
    with pytest.raises(IndexError, match="gather_rows"):
        backend().gather_rows(random_array((0, 3), td.float32, DEVICE), index)


def test_gather_rows_bad_index_never_faults():
    """A bad index is clamped, so the kernel still reads inside x; the error waits on the
    device's flags for the next read (no synchronisation at the op)."""
    x = random_array((10, 3), td.float32, DEVICE, seed=5)
    got = backend().gather_rows(x, torch.tensor([-1, 10**6, -10**6], device=DEVICE))
    assert_close(got, x.cpu()[[9, 9, 0]])
    with pytest.raises(IndexError, match=r"gather_rows: index 1000000 is out of bounds .* "
                                         r"\(at position 1\); found on the device"):
        read_device(got)
    read_device(got)  # the flags were cleared by the read that raised


def test_gather_rows_validates():
    x = random_array((4, 2), td.float32, DEVICE)
    with pytest.raises(TypeError, match="gather_rows: index must be int32 or int64"):
        backend().gather_rows(x, torch.zeros(2, device=DEVICE))
    with pytest.raises(ValueError, match="gather_rows"):
        backend().gather_rows(random_array((), td.float32, DEVICE), torch.zeros(1, device=DEVICE,
                                                                               dtype=torch.int64))


# ----------------------------------------------------------------------------- scatter-add


@given(rows=st.sampled_from([1, 4, 9]), rest=st.sampled_from([(), (3,), (2, 5)]),
       index_shape=st.sampled_from([(1,), (6,), (2, 3), (0,)]),
       dtype=st.sampled_from([td.float32, td.float16, td.bfloat16, td.int32, td.int64, td.bool]),
       seed=st.integers(0, 2**16))
def test_scatter_add_rows_against_reference(rows, rest, index_shape, dtype, seed):
    index = indices(index_shape, rows, seed=seed)
    src = random_array(index_shape + rest, dtype, DEVICE, seed=seed + 1)
    # float32: a few terms summed in another order than the float64 reference
    tol = dict(rtol=1e-5, atol=1e-5) if dtype is td.float32 else {}
    got = check_primitive("scatter_add_rows", src, index, rows, **tol)
    assert got.dtype == src.dtype and tuple(got.shape) == (rows,) + rest


def test_scatter_add_duplicates_accumulate():
    src = torch.ones((1000, 2), device=DEVICE)
    index = torch.zeros(1000, dtype=torch.int32, device=DEVICE)
    index[::2] = -1  # the last row, counted from the end
    out = backend().scatter_add_rows(src, index, 3)
    assert out.cpu().tolist() == [[500.0, 500.0], [0.0, 0.0], [500.0, 500.0]]
    half = backend().scatter_add_rows(src.half(), index, 3)  # float32 accumulation: exact
    assert half.dtype == torch.float16 and half.cpu().tolist()[0] == [500.0, 500.0]


def test_scatter_add_rows_validates():
    with pytest.raises(IndexError, match="scatter_add_rows: index 5 is out of bounds"):
        read_device(backend().scatter_add_rows(torch.ones((2, 3), device=DEVICE),
                                               torch.tensor([0, 5], device=DEVICE), 4))
    with pytest.raises(ValueError, match="scatter_add_rows"):
        backend().scatter_add_rows(torch.ones((2, 3), device=DEVICE),
                                   torch.tensor([0, 1, 2], device=DEVICE), 4)


# ----------------------------------------------------------------------------- through autodiff


def test_indexing_gradient_matches_numpy_backend():
    x = np.random.default_rng(0).standard_normal((7, 4))
    idx = np.array([[0, 3, 3], [-1, 0, 6]])
    check_op(lambda t: t[td.tensor(idx)] * 2.0, x)


# ----------------------------------------------------------------------------- take_row_


@pytest.mark.parametrize("dtype", [td.float32, td.int64])
@pytest.mark.parametrize("cursor_value", [0, 2, 7, -1, 2**40 + 3])
@pytest.mark.parametrize("width", [1, 5, 1500])
def test_take_row_against_reference(dtype, cursor_value, width):
    """out = table[cursor % R] (a cursor past the end wraps), cursor += 1 with advance."""
    table = random_array((3, width), dtype, DEVICE, seed=cursor_value % 5)
    results = []
    for be in (backend(), REFERENCE):
        cursor = torch.tensor([cursor_value], dtype=torch.int64, device=DEVICE)
        out = torch.zeros(width, dtype=table.dtype, device=DEVICE)
        be.take_row_(table, cursor, out, advance=True)
        be.take_row_(table, cursor, out.view(width)[:width])  # again, without advancing
        results.append((out.cpu().clone(), int(cursor.item())))
    assert torch.equal(results[0][0], results[1][0])
    assert torch.equal(results[0][0], table[(cursor_value + 1) % 3].cpu())
    assert results[0][1] == results[1][1] == cursor_value + 1


@pytest.mark.parametrize("be", ["triton", "numpy"])
def test_take_row_validates(be):
    table = torch.zeros(4, 3, device=DEVICE if be == "triton" else "cpu")
    cursor = torch.zeros(1, dtype=torch.int64, device=table.device)
    out = torch.zeros(3, device=table.device)
    b = backend() if be == "triton" else REFERENCE
    with pytest.raises(ValueError, match=r"take_row_: table must be \[R >= 1, \*\(2,\)\]"):
        b.take_row_(table, cursor, out[:2])
    with pytest.raises(TypeError, match="take_row_: table dtype float32 differs"):
        b.take_row_(table, cursor, out.to(torch.int64))
    with pytest.raises(TypeError, match="cursor must be one int64 value"):
        b.take_row_(table, cursor.float(), out)
    with pytest.raises(ValueError, match="must be contiguous"):
        b.take_row_(table.t().contiguous().t(), cursor, torch.zeros(3, 4)[:, 0])


# ----------------------------------------------------------------------------- gather_rows_at_


@pytest.mark.parametrize("cursor_value", [0, 4, -1])
@pytest.mark.parametrize("two", [True, False], ids=["images+labels", "one source"])
def test_gather_rows_at_against_reference(cursor_value, two):
    """The batch at the cursor's row of the index table (wrapping), from a strided image source
    and an int64 label source, negative indices counting from the end; the cursor unchanged."""
    images = random_array((50, 9, 7), td.float32, DEVICE, seed=11)[:, ::2, 1:]  # strided rows
    labels = random_array((50,), td.int64, DEVICE, low=0, high=10, seed=12)
    table = torch.stack([indices((6,), 50, seed=13 + r) for r in range(4)])
    sources = (images, labels) if two else (images,)
    results = []
    for be in (backend(), REFERENCE):
        cursor = torch.tensor([cursor_value], dtype=torch.int64, device=DEVICE)
        outs = tuple(torch.zeros((6,) + tuple(x.shape[1:]), dtype=x.dtype, device=DEVICE)
                     for x in sources)
        assert be.gather_rows_at_(sources, outs, table, cursor) is outs
        assert int(cursor.item()) == cursor_value
        results.append(outs)
    row = table[cursor_value % 4]
    for got, ref, x in zip(*results, sources):
        assert torch.equal(got.cpu(), ref.cpu())
        assert torch.equal(got.cpu(), x.cpu()[row.cpu()])


@pytest.mark.parametrize("be", ["triton", "numpy"])
def test_gather_rows_at_validates(be):
    device = DEVICE if be == "triton" else "cpu"
    b = backend() if be == "triton" else REFERENCE
    x = torch.zeros(10, 3, device=device)
    y = torch.zeros(10, dtype=torch.int64, device=device)
    table = torch.zeros(2, 4, dtype=torch.int64, device=device)
    cursor = torch.zeros(1, dtype=torch.int64, device=device)
    out_x, out_y = torch.zeros(4, 3, device=device), torch.zeros(4, dtype=torch.int64,
                                                                 device=device)
    with pytest.raises(ValueError, match="one or two sources"):
        b.gather_rows_at_((x, y, x), (out_x, out_y, out_x), table, cursor)
    with pytest.raises(ValueError, match=r"must be a contiguous \(4, 3\)"):
        b.gather_rows_at_((x, y), (out_x[:3], out_y), table, cursor)
    with pytest.raises(ValueError, match="table must be int64"):
        b.gather_rows_at_((x,), (out_x,), table.float(), cursor)
    with pytest.raises(ValueError, match="cursor must be one int64"):
        b.gather_rows_at_((x,), (out_x,), table, cursor.float())
    table[1, 2] = 10
    cursor += 1
    with pytest.raises(IndexError, match="index 10 is out of bounds"):
        b.gather_rows_at_((x, y), (out_x, out_y), table, cursor)
        read_device(out_x)


# ----------------------------------------------------------------------------- GPU tier


@pytest.mark.gpu
def test_gpu_mnist_batch_gather():
    images = random_array((60000, 784), td.float32, DEVICE, seed=6)
    index = indices((128,), 60000, seed=7, negative=False)
    got = backend().gather_rows(images, index)
    assert torch.equal(got, images.index_select(0, index))
    raw = random_array((60000, 28, 28), td.uint8, DEVICE, low=0, high=255, seed=8)
    assert torch.equal(backend().gather_rows(raw, index), raw[index])


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [td.float32, td.bfloat16])
def test_gpu_large_scatter_add(dtype):
    index = indices((100000,), 1000, seed=9)
    src = random_array((100000, 64), dtype, DEVICE, seed=10)
    tol = dict(rtol=1e-5, atol=1e-4) if dtype is td.float32 else {}
    check_primitive("scatter_add_rows", src, index, 1000, **tol)
