"""Elementwise kernels (tritonad/kernels/elementwise.py) against the numpy reference backend.

The oracle is tritonad.reference.NumpyBackend (float inputs widened to float64 by
helpers.check_primitive); the result dtype is checked against the same reference run at the
inputs' own dtypes. Inputs come in every layout a kernel meets: contiguous, transposed (strides
reversed), sliced (a step of 2) and expanded (stride 0).

CPU: the kernels run under Triton's interpreter on small shapes; `pytest -m gpu` runs them
compiled on shapes up to 2**24 elements.
"""
import math

import numpy as np
import pytest
import torch
from helpers import assert_close, check_primitive, random_array
from hypothesis import given
from hypothesis import strategies as st

import tritonad as td
from tritonad.kernels import elementwise as ew
from tritonad.reference import NumpyBackend, from_numpy

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # the triton backend's
REFERENCE = NumpyBackend()
INF, NAN = float("inf"), float("nan")

SHAPES = [(), (1,), (7,), (1, 1), (3, 5), (5, 1), (45, 65), (2, 3, 4), (2, 1, 3, 5)]
BROADCAST_PAIRS = [((), ()), ((7,), ()), ((), (3, 5)), ((3, 1), (1, 4)), ((2, 3, 4), (4,)),
                   ((45, 65), (45, 1)), ((1, 7), (6, 1, 7)), ((2, 1, 3, 5), (4, 1, 5)),
                   ((0, 3), (3,)), ((17,), (17,)), ((3, 5), (3, 5))]
LAYOUTS = ["contiguous", "transposed", "sliced", "expanded"]
FLOATS = [td.float32, td.float16, td.bfloat16]
NUMERIC = FLOATS + [td.int32, td.int64]
MIXED = [(td.float32, td.float32), (td.float16, td.float16), (td.bfloat16, td.bfloat16),
         (td.int32, td.int32), (td.int64, td.int64), (td.float16, td.float32),
         (td.int32, td.float32), (td.int64, td.int32), (td.bfloat16, td.float16),
         (td.bool, td.int32), (td.float32, td.int64)]


@pytest.fixture(autouse=True)
def _triton_backend():
    with td.use_backend("triton"):
        yield


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


def check(name, *args, rtol=None, atol=None, upcast=True, **kwargs):
    """The primitive against the float64 reference (the reference at the inputs' own dtypes when
    not upcast: where float32 overflows), and its dtype against the reference at those dtypes."""
    got = check_primitive(name, *args, rtol=rtol, atol=atol, upcast=upcast, **kwargs)
    cpu = [a.cpu() if isinstance(a, torch.Tensor) else a for a in args]
    expected = getattr(REFERENCE, name)(*cpu, **kwargs)
    assert got.dtype == expected.dtype, f"{name}: dtype {got.dtype}, reference {expected.dtype}"
    assert tuple(got.shape) == tuple(expected.shape)
    return got


def backend():
    return td.get_backend()


# ----------------------------------------------------------------------------- unary ops

UNARY = ["neg", "exp", "log", "sqrt", "abs", "sign", "relu", "sigmoid", "tanh"]
FLOAT_RESULT = {"exp", "log", "sqrt", "sigmoid", "tanh"}


@pytest.mark.parametrize("op", UNARY)
@given(shape=st.sampled_from(SHAPES), dtype=st.sampled_from(NUMERIC),
       layout=st.sampled_from(LAYOUTS), seed=st.integers(0, 2**16))
def test_unary_against_reference(op, shape, dtype, layout, seed):
    x = make(shape, dtype, layout, seed)
    # integer inputs of exp, log, ... give float32: compare at float32 accuracy
    tol = dict(rtol=1e-5, atol=1e-6) if op in FLOAT_RESULT and dtype in (td.int32, td.int64) \
        else {}
    check(op, x, **tol)


def test_unary_edge_values():
    x = torch.tensor([-INF, -100.0, -88.0, -1e-3, -0.0, 0.0, 1e-3, 88.0, 100.0, INF, NAN],
                     device=DEVICE)
    for op in UNARY:
        check(op, x, upcast=False)  # exp(100) overflows float32 as the reference's does
    b = backend()
    s = b.sigmoid(torch.tensor([-100.0, 100.0, -INF, INF], device=DEVICE)).cpu()
    assert s[1] == 1.0 and s[3] == 1.0 and s[2] == 0.0 and 0.0 <= s[0] < 1e-30
    assert b.tanh(torch.tensor([-100.0, 100.0], device=DEVICE)).cpu().tolist() == [-1.0, 1.0]
    # NOTE: relu keeps NaN, relu(-0.0) is a zero; tiny tanh arguments keep full precision
    assert_close(b.relu(x), REFERENCE.relu(x.cpu()))
    tiny = torch.tensor([1e-6, -3e-4, 0.05, 0.124, 0.126], device=DEVICE)
    assert_close(b.tanh(tiny), np.tanh(tiny.cpu().double().numpy()), rtol=2e-6, atol=0)


# ----------------------------------------------------------------------------- binary ops

BINARY = ["add", "sub", "mul", "div", "pow", "maximum", "minimum", "eq", "ne", "lt", "le", "gt",
          "ge"]


@st.composite
def operand_pairs(draw, op):
    """(a, b): arrays of a broadcast pair in some layouts and dtypes, or one of them a number."""
    shapes = draw(st.sampled_from(BROADCAST_PAIRS))
    types = draw(st.sampled_from(MIXED))
    if op in ("sub", "pow") and td.bool in types:
        types = (td.int32, td.int32)
    seed = draw(st.integers(0, 2**16))
    low_b = 0.0 if op == "pow" else -3.0  # numpy refuses negative integer powers
    a = make(shapes[0], types[0], draw(st.sampled_from(LAYOUTS)), seed)
    b = make(shapes[1], types[1], draw(st.sampled_from(LAYOUTS)), seed + 1, low=low_b)
    which = draw(st.sampled_from(["arrays", "number a", "number b"]))
    number = draw(st.sampled_from([2, 1.5, -0.5, True])) if op != "pow" else 2
    if which == "number a":
        a = number
    elif which == "number b":
        b = number
    return a, b


@pytest.mark.parametrize("op", BINARY)
@given(data=st.data())
def test_binary_against_reference(op, data):
    a, b = data.draw(operand_pairs(op))
    check(op, a, b)


def test_binary_edge_values():
    v = [-INF, -2.0, -0.0, 0.0, 0.5, 1.0, 2.0, INF, NAN]
    a = torch.tensor(v, device=DEVICE)[:, None].expand(9, 9)
    b = torch.tensor(v, device=DEVICE)[None, :].expand(9, 9)
    for op in BINARY:
        check(op, a, b, upcast=False)
    ints = torch.tensor([0, 1, -1, 2, -3, 7], device=DEVICE)
    check("pow", ints, torch.tensor([0, 5, 3, 10, 3, 2], device=DEVICE))  # exact, wrapping
    check("div", ints, torch.tensor([1, 0, 0, 4, -2, 3], device=DEVICE))  # int / int -> float32


def test_result_types():
    b = backend()
    i32 = torch.ones(3, dtype=torch.int32, device=DEVICE)
    f16 = torch.ones(3, dtype=torch.float16, device=DEVICE)
    assert b.add(i32, 2).dtype == torch.int32
    assert b.mul(i32, 0.5).dtype == torch.float32
    assert b.add(f16, 1.0).dtype == torch.float16
    assert b.div(i32, i32).dtype == torch.float32
    assert b.lt(f16, i32).dtype == torch.bool
    assert b.add(f16, torch.ones(3, dtype=torch.bfloat16, device=DEVICE)).dtype == torch.float32


# ----------------------------------------------------------------------------- where, clamp, pow


@given(shapes=st.sampled_from([((3, 5), (3, 5), (3, 5)), ((3, 1), (1, 5), ()), ((), (4,), (2, 1)),
                               ((2, 3, 4), (4,), (3, 1))]),
       types=st.sampled_from(MIXED), layout=st.sampled_from(LAYOUTS),
       numbers=st.sampled_from(["none", "a", "b"]), seed=st.integers(0, 2**16))
def test_where_against_reference(shapes, types, layout, numbers, seed):
    cond = make(shapes[0], td.bool, layout, seed)
    a = make(shapes[1], types[0], layout, seed + 1) if numbers != "a" else 0.0
    b = make(shapes[2], types[1], "contiguous", seed + 2) if numbers != "b" else -1
    check("where", cond, a, b)


@given(shape=st.sampled_from(SHAPES), dtype=st.sampled_from(NUMERIC),
       layout=st.sampled_from(LAYOUTS),
       bounds=st.sampled_from([(-1, None), (None, 0.5), (-0.5, 2), (1.5, 2.5), (-2.5, -2.5)]),
       seed=st.integers(0, 2**16))
def test_clamp_against_reference(shape, dtype, layout, bounds, seed):
    x = make(shape, dtype, layout, seed)
    check("clamp", x, *bounds)


def test_clamp_keeps_nan_and_int_dtype():
    x = torch.tensor([NAN, -5.0, 5.0], device=DEVICE)
    assert_close(backend().clamp(x, -1, 1), [NAN, -1.0, 1.0])
    assert backend().clamp(torch.arange(5, device=DEVICE), 1.5, 3).tolist() == [1, 1, 2, 3, 3]


@pytest.mark.parametrize("exponent", [2, 3, 0, 0.5, -1, 2.5, -2.0])
@pytest.mark.parametrize("dtype", [td.float32, td.float16, td.int32])
def test_pow_scalar(exponent, dtype):
    if dtype is td.int32 and exponent == -1:
        pytest.skip("numpy refuses negative integer powers of integers")
    if dtype is td.int32 and isinstance(exponent, float):
        x = make((4, 5), dtype, "transposed", low=1, high=5)
    else:
        x = make((4, 5), dtype, "transposed", low=-3 if dtype is td.int32 else 0.1, high=4)
    check("pow_scalar", x, exponent, rtol=None if dtype is not td.int32 else 1e-5,
          atol=None if dtype is not td.int32 else 1e-6)


def test_pow_float_special_cases():
    x = torch.tensor([-8.0, -2.0, -2.0, 0.0, 0.0, NAN, 1.0, -1.0, 2.0, -0.5], device=DEVICE)
    y = torch.tensor([1 / 3, 3.0, 2.0, -1.0, 0.0, 0.0, NAN, INF, -INF, INF], device=DEVICE)
    check("pow", x, y)


# ----------------------------------------------------------------------------- fused backwards


@given(shape=st.sampled_from(SHAPES), dtype=st.sampled_from(FLOATS),
       layout=st.sampled_from(LAYOUTS), seed=st.integers(0, 2**16))
def test_relu_backward(shape, dtype, layout, seed):
    dy = make(shape, dtype, layout, seed)
    x = make(shape, dtype, "contiguous", seed + 1, low=-3.0, high=1.0)
    check("relu_backward", dy, x)


def test_relu_backward_at_zero():
    x = torch.tensor([-1.0, -0.0, 0.0, 1e-30, 2.0], device=DEVICE)
    dy = torch.ones(5, device=DEVICE)
    assert backend().relu_backward(dy, x).tolist() == [0.0, 0.0, 0.0, 1.0, 1.0]


# ----------------------------------------------------------------------------- fill, copy, cast

ALL_DTYPES = [td.float32, td.float16, td.bfloat16, td.float64, td.int32, td.int64, td.uint8,
              td.bool]


@pytest.mark.parametrize("value", [1.5, -2, True, 0.1, 3e9, NAN])
def test_fill_strided(value):
    for dtype in ALL_DTYPES:
        if math.isnan(value) and not dtype.is_floating_point or value == 3e9 and dtype in (
                td.int32, td.uint8):
            continue
        base = torch.zeros((4, 6), dtype=dtype.torch, device=DEVICE)
        view = base.t()[::2]  # strided, not contiguous
        backend().fill_(view, value)
        expected = REFERENCE.fill_(torch.zeros((4, 6), dtype=dtype.torch).t()[::2], value)
        assert_close(base.t()[::2], expected, name=f"fill_ {dtype} {value}")
        assert_close(base.t()[1::2], np.zeros((3, 4)), name="untouched")


def test_copy_and_cast_every_dtype_pair():
    values = np.array([[-2.7, -1.0, 0.0, 0.4], [1.5, 2.5, 200.0, -0.0]])
    for src_type in ALL_DTYPES:
        for dst_type in ALL_DTYPES:
            # NOTE: negative floats to uint8 are undefined behaviour in C (and numpy)
            v = np.abs(values) if dst_type is td.uint8 else values
            src = from_numpy(v, src_type).to(DEVICE)
            got = backend().cast(src.t(), dst_type)
            expected = REFERENCE.cast(src.t().cpu(), dst_type)
            assert got.dtype == expected.dtype
            assert_close(got, expected, rtol=0, atol=0, name=f"cast {src_type} -> {dst_type}")


@given(shapes=st.sampled_from([((3, 5), (5,)), ((3, 5), ()), ((2, 3, 4), (3, 1)),
                               ((45, 65), (45, 65)), ((1,), (1,))]),
       types=st.sampled_from(MIXED), layout=st.sampled_from(LAYOUTS), seed=st.integers(0, 99))
def test_copy_broadcasts_into_strided_dst(shapes, types, layout, seed):
    dst = make(shapes[0], types[0], "transposed", seed)
    src = make(shapes[1], types[1], layout, seed + 1)
    expected = REFERENCE.copy_(dst.cpu().clone(), src.cpu())
    backend().copy_(dst, src)
    assert_close(dst, expected, rtol=0, atol=0)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_contiguous(layout):
    x = make((2, 3, 4), td.float32, layout, seed=3)
    y = backend().contiguous(x)
    assert y.is_contiguous() and torch.equal(y.cpu(), x.cpu())


@pytest.mark.parametrize("args", [(0, 10, 3, td.int64), (5, -3, -2, td.int32), (0.0, 1.0, 0.1,
                                  td.float32), (0.5, 3, 0.25, td.float16), (3, 3, 1, td.int64),
                                  (-1.0, 2.0, 0.7, td.float64), (0, 5, 1, td.float32)])
def test_arange(args):
    got = backend().arange(*args, DEVICE)
    expected = REFERENCE.arange(*args, "cpu")
    assert got.dtype == expected.dtype
    assert_close(got, expected, rtol=1e-6, atol=0)


def test_arange_zero_step():
    with pytest.raises(ValueError, match="arange"):
        backend().arange(0, 5, 0, td.int64, DEVICE)


# ----------------------------------------------------------------------------- out=, errors


def test_out_may_alias_an_input_and_converts():
    b = backend()
    a = make((5, 7), seed=1)
    row = make((7,), seed=2)
    expected = a.cpu() + row.cpu()
    assert b.add(a, row, out=a) is a
    assert_close(a, expected)
    half = torch.empty((5, 7), dtype=torch.float16, device=DEVICE)
    b.mul(a, 2.0, out=half)
    assert_close(half, (expected * 2).half(), rtol=0, atol=0)
    t = make((4, 4), seed=3)
    b.relu(t.t(), out=t.t())  # in place on a transposed view
    assert (t.cpu() >= 0).all()


def test_errors_name_the_op():
    b = backend()
    with pytest.raises(ValueError, match="add.*broadcast"):
        b.add(make((3, 4)), make((5,)))
    with pytest.raises(ValueError, match="mul: out has shape"):
        b.mul(make((3, 4)), 2.0, out=make((4, 3)))
    with pytest.raises(TypeError, match="sub"):
        b.sub(1.0, 2.0)
    with pytest.raises(ValueError, match="copy_"):
        b.copy_(make((3,)), make((4,)))


# ----------------------------------------------------------------------------- launch planning


def test_broadcast_row_is_read_in_place(monkeypatch):
    """(N, C) + (C,): the row reaches the kernel with stride 0, and nothing is copied first."""
    launches = []
    real = ew._launch_collapsed

    def spy(op, out, arrays, kinds, values, sizes, strides, compute):
        launches.append((op, list(sizes), [list(s) for s in strides], arrays))
        return real(op, out, arrays, kinds, values, sizes, strides, compute)

    def no_copy(*args, **kwargs):
        raise AssertionError("a broadcast operand was copied")

    monkeypatch.setattr(ew, "_launch_collapsed", spy)
    monkeypatch.setattr(ew, "copy_", no_copy)
    monkeypatch.setattr(ew, "contiguous", no_copy)
    x, row = make((6, 5), seed=1), make((5,), seed=2)
    y = backend().add(x, row)
    assert len(launches) == 1
    op, sizes, strides, arrays = launches[0]
    assert sizes == [6, 5] and strides[2] == [0, 1]  # out, a, b: the row walks stride 0
    assert arrays[1].data_ptr() == row.data_ptr()
    assert_close(y, x.cpu() + row.cpu())


def test_odd_length_runs_as_vector_body_and_tail(monkeypatch):
    """Compiled, a contiguous length that is not a multiple of 16 runs as two launches (the body
    with 16-byte accesses, then the tail); here forced on under the interpreter."""
    monkeypatch.setattr(ew, "INTERPRET", False)
    parts = []
    real = ew._launch_collapsed

    def spy(op, out, arrays, kinds, values, sizes, strides, compute, start=0):
        parts.append(list(sizes))
        return real(op, out, arrays, kinds, values, sizes, strides, compute, start)

    monkeypatch.setattr(ew, "_PLANS", ew.PlanCache())
    monkeypatch.setattr(ew, "_launch_collapsed", spy)
    a, b = make((7, 11), seed=1), make((7, 11), seed=2)
    check("mul", a, b)
    assert parts == [[77], [64], [13]]
    # the second call of the signature replays both launches, the tail at its offset
    c, d = make((7, 11), seed=3), make((7, 11), seed=4)
    check("mul", c, d)
    assert parts == [[77], [64], [13]]


def test_collapse_merges_what_every_operand_walks_as_one():
    assert ew.collapse((2, 3, 4), [[12, 4, 1], [12, 4, 1]]) == ([24], [[1], [1]])
    assert ew.collapse((2, 3, 4), [[12, 4, 1], [0, 0, 1]]) == ([6, 4], [[4, 1], [0, 1]])
    assert ew.collapse((5, 1, 3), [[3, 3, 1], [1, 7, 5]]) == ([5, 3], [[3, 1], [1, 5]])
    assert ew.collapse((), [[]]) == ([], [[]])


def test_int64_indexing_decision():
    """Offsets at or past 2**31 switch the kernel to int64 arithmetic; smaller ones stay int32."""
    assert not ew.needs_int64(2**20, [2**20], [[1], [1]])
    assert ew.needs_int64(2**31, [2**31], [[1], [1]])
    assert ew.needs_int64(8, [2, 4], [[4, 1], [2**31, 1]])  # a huge stride, few elements
    assert not ew.needs_int64(8, [2, 4], [[4, 1], [2**20, 1]])
    assert ew.needs_int64(2**30, [2**30], [[1], [4]])  # an operand read with stride 4


def test_more_dims_than_the_kernel_walks():
    x = make((2, 3, 2, 3, 2, 3), seed=4).permute(5, 3, 1, 0, 2, 4)
    assert len(ew.collapse(x.shape, [list(x.stride())])[0]) > ew.MAX_RANK
    check("add", x, make(x.shape, seed=5))


def test_empty_and_zero_dim():
    b = backend()
    assert b.add(make((0, 3)), make((3,))).shape == (0, 3)
    y = b.mul(make(()), 3)
    assert y.shape == () and y.dtype == torch.float32


# ----------------------------------------------------------------------------- GPU tier

GPU_SHAPES = [(1823, 781), (45, 65), (1 << 24,), (64, 128, 28, 28)]


@pytest.mark.gpu
@pytest.mark.parametrize("shape", GPU_SHAPES)
@pytest.mark.parametrize("op", ["add", "mul", "div", "maximum", "relu_backward", "gt"])
def test_gpu_binary_large(shape, op):
    a = make(shape, td.float32, "contiguous", 1)
    b = make(shape[-1:], td.float32, "contiguous", 2)
    check(op, a, b)
    check(op, a, make(shape, td.float32, "transposed", 3))


@pytest.mark.gpu
@pytest.mark.parametrize("shape", GPU_SHAPES)
@pytest.mark.parametrize("op", ["exp", "log", "sqrt", "relu", "sigmoid", "tanh", "neg"])
@pytest.mark.parametrize("dtype", [td.float32, td.bfloat16])
def test_gpu_unary_large(shape, op, dtype):
    check(op, make(shape, dtype, "contiguous", 7))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [td.float16, td.bfloat16, td.int32, td.int64, td.uint8,
                                   td.bool])
def test_gpu_cast_and_copy_large(dtype):
    low = 0 if dtype is td.uint8 else -100  # negative floats to uint8: undefined behaviour
    x = make((1823, 781), td.float32, "transposed", 9, low=low, high=100)
    check("cast", x, dtype)
    check("contiguous", x)


@pytest.mark.gpu
def test_gpu_huge_offsets_use_int64():
    """A broadcast add whose output passes 2**31 elements (needs ~10 GB: skipped if short)."""
    free, _ = torch.cuda.mem_get_info()
    n = 2**31 + 64
    if free < 2 * n + (1 << 30):
        pytest.skip("not enough GPU memory for a 2**31-element test")
    x = torch.empty(n, dtype=torch.uint8, device="cuda")
    backend().fill_(x, 3)
    y = backend().add(x, x)
    assert y[-64:].cpu().tolist() == [6] * 64 and y[:4].cpu().tolist() == [6] * 4
