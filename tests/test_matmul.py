"""matmul: the tiled Triton kernel (tritonad/kernels/matmul.py) against the numpy reference.

Every result is compared with the reference backend computed in float64. The error allowed
scales with |a| @ |b| + |bias| (the size of the terms summed, the standard bound for a dot
product), so near-zero results from cancellation do not need a loose absolute tolerance:
    |got - ref| <= rtol(dtype) * (|a| @ |b| + |bias|) + tiny
CPU runs use Triton's interpreter with one 64x64x64 plan; tests force the other paths (every
tuning candidate, small tiles with grouped ordering, split-K, K-major staging) through
`matmul.FORCE_PLAN`. The GPU tier (`pytest -m gpu`) adds large and odd shapes, the MNIST
shapes, CUDA graph capture and the on-disk autotune cache.
"""
import json
import os

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import tritonad as td
import tritonad.nn.functional as F
from helpers import as_numpy, assert_close, check_op, random_array, reference_inputs
from tritonad.kernels import matmul as mm
from tritonad.kernels import matmul_menu
from tritonad.kernels.tuning import Tuner
from tritonad.reference import NumpyBackend

# allowed error relative to |a| @ |b| + |bias| (not to the result): TF32 input rounding
# (2^-10 per factor: Triton may truncate), one rounding of half outputs (the interpreter rounds
# bfloat16 towards zero: up to 2^-7), plus the accumulation bound K * u (see rtol())
RTOL = {"float64": 1e-12, "float32": 1e-6, "tf32": 2e-3, "float16": 1e-3, "bfloat16": 1e-2}


def rtol(kind, k):
    """RTOL plus gamma_K = K * u, the worst-case rounding of a K-term sum in the accumulator."""
    return RTOL[kind] + k * (2.0**-53 if kind == "float64" else 2.0**-24)


DTYPES = [td.float32, td.float16, td.bfloat16, td.float64]


# ---------------------------------------------------------------------------- reference


def reference(a, b, bias=None, activation=None):
    """The numpy backend's matmul on float64 copies of the inputs, as a numpy array."""
    args = reference_inputs([a, b] + ([bias] if bias is not None else []))
    out = NumpyBackend().matmul(args[0], args[1], args[2] if bias is not None else None,
                                activation)
    return as_numpy(out)


def term_scale(a, b, bias=None):
    """|a| @ |b| + |bias| in float64: the magnitude of the terms each output sums."""
    scale = np.matmul(np.abs(as_numpy(a)), np.abs(as_numpy(b)))
    return scale + (np.abs(as_numpy(bias)) if bias is not None else 0.0)


def check(got, a, b, bias=None, activation=None, kind=None):
    """got == act(a @ b + bias) within the dtype's error bound; dtype and layout as documented."""
    kind = kind or td.dtypes.get_dtype(a.dtype).name
    expected = reference(a, b, bias, activation)
    assert got.dtype == a.dtype, f"output dtype {got.dtype} != input dtype {a.dtype}"
    assert tuple(got.shape) == expected.shape, f"shape {tuple(got.shape)} != {expected.shape}"
    assert got.is_contiguous(), "output must be contiguous"
    error = (as_numpy(got) - expected) / (term_scale(a, b, bias) + 1e-30)
    assert_close(error, np.zeros_like(error), rtol=0, atol=rtol(kind, a.shape[-1]),
                 name="scaled error")
    if activation == "relu":
        assert (as_numpy(got) >= 0).all(), "relu output has negative values"


def operand(shape, dtype, layout="contiguous", seed=0):
    """A raw array of `shape` stored as `layout`: contiguous, transposed (the last two dims
    swapped in memory, as w.t()), or strided (every other element of a larger array, with a
    storage offset)."""
    if layout == "contiguous":
        return random_array(shape, dtype, seed=seed)
    if layout == "transposed":
        return random_array(shape[:-2] + shape[::-1][:2], dtype, seed=seed).transpose(-1, -2)
    big = random_array(shape[:-2] + (2 * shape[-2] + 1, 2 * shape[-1] + 3), dtype, seed=seed)
    return big[..., 1::2, 3::2][..., :shape[-2], :shape[-1]]


@pytest.fixture(autouse=True)
def triton_backend(monkeypatch):
    """Run on the triton backend with the best-guess plan (no timing: GPU tests stay quick;
    test_gpu_autotune_cache turns tuning back on)."""
    monkeypatch.setattr(mm, "FORCE_PLAN", None)
    td.autotune(False)
    with td.use_backend("triton"):
        yield
    td.autotune(False)


def run(a, b, bias=None, activation=None):
    return td.get_backend().matmul(a, b, bias=bias, activation=activation)


# ---------------------------------------------------------------------------- shapes and dtypes

SIZES = [1, 2, 7, 16, 33, 64, 65, 100, 129]


@given(m=st.sampled_from(SIZES), n=st.sampled_from(SIZES), k=st.sampled_from(SIZES),
       dtype=st.sampled_from(DTYPES),
       layout_a=st.sampled_from(["contiguous", "transposed", "strided"]),
       layout_b=st.sampled_from(["contiguous", "transposed", "strided"]),
       has_bias=st.booleans(), activation=st.sampled_from([None, "relu"]))
def test_matmul_property(m, n, k, dtype, layout_a, layout_b, has_bias, activation):
    a = operand((m, k), dtype, layout_a, seed=1)
    b = operand((k, n), dtype, layout_b, seed=2)
    bias = random_array((n,), dtype, seed=3) if has_bias else None
    check(run(a, b, bias, activation), a, b, bias, activation)


@pytest.mark.parametrize("m, k, n", [(1, 1, 1), (1, 300, 1), (300, 1, 1), (1, 1, 300),
                                     (45, 65, 17), (1, 257, 33), (257, 129, 300)])
def test_odd_shapes(m, k, n):
    a, b = random_array((m, k), seed=4), random_array((k, n), seed=5)
    check(run(a, b), a, b)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("has_bias", [False, True], ids=["nobias", "bias"])
@pytest.mark.parametrize("activation", [None, "relu"])
def test_every_epilogue(dtype, has_bias, activation):
    a, b = random_array((70, 40), dtype, seed=6), random_array((40, 50), dtype, seed=7)
    bias = random_array((50,), dtype, seed=8) if has_bias else None
    check(run(a, b, bias, activation), a, b, bias, activation)


def test_relu_edge_values():
    """Exact zeros stay zero, negatives clip, NaN propagates (as torch.relu)."""
    device = td.get_backend().default_device
    a = torch.tensor([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0], [float("nan"), 0.0]], device=device)
    b = torch.tensor([[2.0, -3.0, 0.0], [0.0, 0.0, 0.0]], device=device)
    got = as_numpy(run(a, b, activation="relu"))
    expected = np.array([[2, 0, 0], [0, 0, 0], [0, 3, 0], [np.nan] * 3])
    np.testing.assert_array_equal(got, expected)


def test_linear_layout():
    """x @ w.T + b, the linear layer's forward: w.t() is read in place."""
    x, w, bias = random_array((37, 50), seed=9), random_array((23, 50), seed=10), \
        random_array((23,), seed=11)
    check(run(x, w.t(), bias, "relu"), x, w.t(), bias, "relu")


def test_backward_layouts():
    """dX = dY @ W and dW = dY^T @ X of a linear layer, through strides."""
    dy, w, x = random_array((37, 23), seed=12), random_array((23, 50), seed=13), \
        random_array((37, 50), seed=14)
    check(run(dy, w), dy, w)
    check(run(dy.transpose(0, 1), x), dy.transpose(0, 1), x)


def test_inputs_are_not_modified():
    a, b = random_array((20, 30), seed=15), random_array((30, 10), seed=16)
    a0, b0 = as_numpy(a).copy(), as_numpy(b).copy()
    run(a, b, random_array((10,), seed=17), "relu")
    np.testing.assert_array_equal(as_numpy(a), a0)
    np.testing.assert_array_equal(as_numpy(b), b0)


# ---------------------------------------------------------------------------- batches


def test_batched():
    a, b = random_array((3, 20, 30), seed=18), random_array((3, 30, 25), seed=19)
    bias = random_array((25,), seed=20)
    check(run(a, b, bias, "relu"), a, b, bias, "relu")


def test_batch_broadcast_stride_zero():
    """A weight shared by the batch arrives as a stride-0 batch dim (the conv's im2col path)."""
    w = random_array((20, 30), seed=21)
    a = w.unsqueeze(0).unsqueeze(0).expand(2, 3, 20, 30)
    b = random_array((2, 3, 30, 9), seed=22)
    assert a.stride()[:2] == (0, 0)
    check(run(a, b), a, b)


def test_batch_dims_broadcast_like_numpy():
    a, b = random_array((2, 1, 20, 30), seed=23), random_array((3, 30, 9), seed=24)
    got = run(a, b)
    assert tuple(got.shape) == (2, 3, 20, 9)
    check(got, a.expand(2, 3, 20, 30), b.expand(2, 3, 30, 9))


@given(batch=st.sampled_from([(2,), (2, 3), (2, 1, 3)]), data=st.data(),
       m=st.sampled_from([1, 5, 40]), n=st.sampled_from([1, 9, 70]),
       k=st.sampled_from([1, 17, 65]), dtype=st.sampled_from(DTYPES))
def test_batched_property(batch, data, m, n, k, dtype):
    """Batch dims broadcast by numpy's rules (left to the primitive, or expanded by the caller
    into stride-0 dims), operands transposed or not."""
    def draw_operand(rows, cols, seed):
        ones = data.draw(st.lists(st.booleans(), min_size=len(batch), max_size=len(batch)))
        shape = tuple(1 if one else size for one, size in zip(ones, batch))
        layout = data.draw(st.sampled_from(["contiguous", "transposed"]))
        x = operand(shape + (rows, cols), dtype, layout, seed=seed)
        return x.expand(batch + (rows, cols)) if data.draw(st.booleans()) else x

    a, b = draw_operand(m, k, 41), draw_operand(k, n, 42)
    check(run(a, b), a, b)


def test_batch_dims_that_cannot_merge():
    """Three batch dims with permuted strides: two go to the kernel, the first is looped."""
    base = random_array((3, 2, 4, 20, 30), seed=25)
    a = base.permute(1, 0, 2, 3, 4)[:, :, ::2]          # [2, 3, 2, 20, 30], strides mixed
    b = random_array((30, 2, 3, 2, 9), seed=26).permute(1, 2, 3, 0, 4)
    check(run(a, b), a, b)


def test_batch_dims_of_size_one_and_transposed_batches():
    a = random_array((1, 4, 1, 30, 20), seed=27).transpose(-1, -2)
    b = random_array((1, 4, 1, 30, 9), seed=28)
    check(run(a, b), a, b)


# ---------------------------------------------------------------------------- empty and K = 0


@pytest.mark.parametrize("has_bias", [False, True])
def test_k_zero_gives_bias(has_bias):
    a, b = random_array((5, 0)), random_array((0, 4))
    bias = random_array((4,), seed=29) if has_bias else None
    got = as_numpy(run(a, b, bias, "relu"))
    expected = np.maximum(np.broadcast_to(as_numpy(bias), (5, 4)), 0) if has_bias else 0
    np.testing.assert_array_equal(got, np.zeros((5, 4)) + expected)


@pytest.mark.parametrize("a_shape, b_shape, out_shape", [
    ((0, 3), (3, 4), (0, 4)), ((3, 3), (3, 0), (3, 0)), ((0, 3, 3), (0, 3, 2), (0, 3, 2)),
    ((2, 0, 5), (2, 5, 3), (2, 0, 3))])
def test_empty_outputs(a_shape, b_shape, out_shape):
    got = run(random_array(a_shape), random_array(b_shape))
    assert tuple(got.shape) == out_shape


# ---------------------------------------------------------------------------- fused linear backward


def gated_reference(dy, y):
    """where(y > 0, dy, 0) (relu's backward; a selection, exact in any dtype)."""
    return torch.where(y > 0, dy, torch.zeros((), dtype=dy.dtype, device=dy.device))


def check_row_sums(got, a, kind):
    """got == the row sums of a (float64), within the dot-product bound on sum(|a|)."""
    expected = as_numpy(a).astype(np.float64).sum(axis=1)
    scale = np.abs(as_numpy(a).astype(np.float64)).sum(axis=1)
    error = (as_numpy(got).astype(np.float64) - expected) / (scale + 1e-30)
    assert_close(error, np.zeros_like(error), rtol=0, atol=rtol(kind, a.shape[1]),
                 name="scaled row-sum error")


@pytest.mark.parametrize("dtype", [td.float32, td.bfloat16, td.float64], ids=lambda d: d.name)
@pytest.mark.parametrize("split", [1, 3])
def test_gate_and_row_sums(monkeypatch, dtype, split):
    """The linear + relu backward: dx = gated(dy) @ w and dw = gated(dy)^T @ x with db = its row
    sums, in the transposed layouts the autodiff passes; zeros and negatives in the relu output
    (0 exactly is not > 0), K past the block edge, with split-K's reduction of the row sums."""
    monkeypatch.setattr(mm, "FORCE_PLAN", dict(split=split, BK=16, BM=16, BN=32))
    batch, n_in, n_out = 37, 21, 45
    x, w = random_array((batch, n_in), dtype, seed=50), random_array((n_out, n_in), dtype, seed=51)
    dy = random_array((batch, n_out), dtype, seed=52)
    y = random_array((batch, n_out), dtype, seed=53)
    y[:, ::4] = 0
    dz = gated_reference(dy, y)
    backend = td.get_backend()
    check(backend.matmul(dy, w, a_gate=y), dz, w)
    db = torch.full((n_out,), 7.0, dtype=dtype.torch)
    dw = backend.matmul(dy.t(), x, a_gate=y.t(), a_row_sums=db)
    check(dw, dz.t(), x)
    check_row_sums(db, dz.t(), dtype.name)
    db2 = torch.full((n_out,), 7.0, dtype=dtype.torch)  # ungated row sums into a given out
    out = torch.empty((n_out, n_in), dtype=dtype.torch)
    assert backend.matmul(dy.t(), x, a_row_sums=db2, out=out) is out
    check(out, dy.t(), x)
    check_row_sums(db2, dy.t(), dtype.name)


def test_row_sums_of_degenerate_products():
    """N = 0 (no product tile to fuse into) and K = 0 (empty rows sum to 0) still fill them."""
    backend = td.get_backend()
    a, gate = random_array((5, 3), seed=54), random_array((5, 3), seed=55)
    rows = torch.full((5,), 9.0)
    out = backend.matmul(a, random_array((3, 0)), a_gate=gate, a_row_sums=rows)
    assert tuple(out.shape) == (5, 0)
    check_row_sums(rows, gated_reference(a, gate), "float32")
    rows = torch.full((5,), 9.0)
    backend.matmul(random_array((5, 0)), random_array((0, 4)), a_row_sums=rows)
    assert (rows == 0).all()


@pytest.mark.parametrize("backend", ["triton", "numpy"])
@pytest.mark.parametrize("kwargs, match", [
    (lambda: dict(a_gate=random_array((4, 6))), "a_gate must"),
    (lambda: dict(a_row_sums=random_array((5,))), "a_row_sums must"),
    (lambda: dict(a_gate=random_array((2, 4, 5)), batched=True), "2-d operands"),
])
def test_bad_gate_and_row_sums(backend, kwargs, match):
    kwargs = kwargs()
    a, b = random_array((4, 5)), random_array((5, 3))
    if kwargs.pop("batched", False):
        a, b = random_array((2, 4, 5)), random_array((2, 5, 3))
    with td.use_backend(backend), pytest.raises(ValueError, match=match):
        td.get_backend().matmul(a, b, **kwargs)


def test_bad_row_sums_dtype_and_layout():
    a, b = random_array((4, 5)), random_array((5, 3))
    with pytest.raises(ValueError, match="a_row_sums must be a"):
        td.get_backend().matmul(a, b, a_row_sums=random_array((4,), td.float64))
    with pytest.raises(ValueError, match="contiguous"):
        td.get_backend().matmul(a, b, a_row_sums=random_array((8,))[::2])


# ---------------------------------------------------------------------------- forced plans


def test_small_tiles_and_grouped_ordering(monkeypatch):
    """16x16 tiles in groups of 2 row-tiles: a 7 x 5 grid of programs in swizzled order."""
    monkeypatch.setattr(mm, "FORCE_PLAN", dict(BM=16, BN=16, BK=16, GM=2))
    a, b, bias = random_array((100, 40), seed=30), random_array((40, 70), seed=31), \
        random_array((70,), seed=32)
    check(run(a, b, bias, "relu"), a, b, bias, "relu")


@pytest.mark.parametrize("dtype", [td.float32, td.bfloat16, td.float64], ids=lambda d: d.name)
@pytest.mark.parametrize("split", [2, 3, 100])
def test_split_k(monkeypatch, dtype, split):
    """K in slices summed by the reduction kernel, then bias and relu; K not a multiple of the
    block, more slices asked than K tiles (clamped), batched."""
    monkeypatch.setattr(mm, "FORCE_PLAN", dict(split=split, BK=16))
    a, b = random_array((2, 30, 100), dtype, seed=33), random_array((2, 100, 20), dtype, seed=34)
    bias = random_array((20,), dtype, seed=35)
    check(run(a, b, bias, "relu"), a, b, bias, "relu")
    check(run(a, b), a, b)


def test_split_k_is_deterministic(monkeypatch):
    monkeypatch.setattr(mm, "FORCE_PLAN", dict(split=4, BK=16))
    a, b = random_array((30, 130), seed=36), random_array((130, 20), seed=37)
    first, second = as_numpy(run(a, b)), as_numpy(run(a, b))
    np.testing.assert_array_equal(first, second)


def test_tf32_setting_and_k_major_staging(monkeypatch):
    """TF32 ("high"): runs and is close (the interpreter computes it in fp32). Staging copies
    transposed operands K-major first; a stride-0 batch dim stays broadcast."""
    try:
        td.set_matmul_precision("high")
        assert mm._kind(torch.float32, td.matmul_precision()) == "tf32"
        a, b = operand((40, 30), td.float32, "transposed"), operand((30, 20), td.float32)
        check(run(a, b), a, b, kind="tf32")
        monkeypatch.setattr(mm, "FORCE_PLAN", dict(stage_a=True, stage_b=True))
        check(run(a, b, random_array((20,)), "relu"), a, b, random_array((20,)), "relu",
              kind="tf32")
        w = random_array((30, 20), seed=38).transpose(0, 1).unsqueeze(0).expand(3, 20, 30)
        x = operand((3, 30, 10), td.float32, "transposed", seed=39)
        check(run(w, x), w, x, kind="tf32")
    finally:
        td.set_matmul_precision("highest")
    assert mm._kind(torch.float32, td.matmul_precision()) == "ieee"


# ---------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("make, error, match", [
    (lambda: (random_array((2, 3)), random_array((4, 5))), ValueError,
     r"matmul: inner dimensions differ: a \(2, 3\) @ b \(4, 5\)"),
    (lambda: (random_array((2, 3)), random_array((3, 5), td.float16)), TypeError,
     r"matmul: dtypes differ: a \(2, 3\) float32, b \(3, 5\) float16"),
    (lambda: (random_array((2, 3), td.int64), random_array((3, 5), td.int64)), TypeError,
     r"matmul: expected floating point operands"),
    (lambda: (random_array((3,)), random_array((3, 5))), ValueError,
     r"matmul: operands need at least 2 dims"),
    (lambda: (random_array(()), random_array((3, 5))), ValueError,
     r"matmul: operands need at least 2 dims"),
    (lambda: (random_array((2, 4, 3)), random_array((3, 3, 5))), ValueError,
     r"matmul: batch dims do not broadcast: a \(2, 4, 3\) @ b \(3, 3, 5\)"),
], ids=["inner", "mixed-dtypes", "integers", "1-d", "0-d", "batch"])
def test_bad_operands(make, error, match):
    a, b = make()
    with pytest.raises(error, match=match):
        run(a, b)


def test_bad_epilogue():
    a, b = random_array((2, 3)), random_array((3, 5))
    with pytest.raises(ValueError, match=r"matmul: bias must have shape \(5,\)"):
        run(a, b, random_array((4,)))
    with pytest.raises(TypeError, match="matmul: bias dtype float16 differs"):
        run(a, b, random_array((5,), td.float16))
    with pytest.raises(ValueError, match="matmul: unknown activation 'gelu'"):
        run(a, b, activation="gelu")


# ---------------------------------------------------------------------------- plans and tuner

MNIST = {  # name: (M, N, K) of the forward and both backward products
    "mlp1": (128, 256, 784), "mlp1.dx": (128, 784, 256), "mlp1.dw": (256, 784, 128),
    "mlp2": (128, 100, 256), "mlp2.dx": (128, 256, 100), "mlp2.dw": (100, 256, 128),
    "mlp3": (128, 10, 100), "mlp3.dx": (128, 100, 10), "mlp3.dw": (10, 100, 128),
    "cnn1": (100, 512, 3136), "cnn1.dx": (100, 3136, 512), "cnn1.dw": (512, 3136, 100),
    "cnn2": (100, 10, 512), "cnn2.dx": (100, 512, 10), "cnn2.dw": (10, 512, 100),
}


def test_every_shipped_plan_is_on_its_menu():
    """The tuner takes a shipped table's plan only where candidate_plans offers it (else the
    menu's first guess runs, silently): a menu change must not orphan a row (two did once). The
    table's GPUs (H100 SXM, H200) have 132 SMs."""
    with open(os.path.join(os.path.dirname(mm.__file__), "plans.json")) as f:
        table = json.load(f)
    for gpu, families in table.items():
        for key, plan in families["matmul"].items():
            dims, _, kind, layout, *_ = key.split(":")
            batch, m, n, k = map(int, dims.split("x"))
            a_layout = "k" if layout.startswith("k") else "mn"
            menu = mm.candidate_plans(batch, m, n, k, kind, a_layout == "k",
                                      layout[len(a_layout):] == "k", 132, tma=bool(plan.get("tma")))
            assert plan in menu, f"{gpu} {key}: {plan} is not on the menu"


def test_split_k_heuristic():
    # a skinny long-K product gets slices that fill the SMs once; a big square gets none
    assert mm.split_k_heuristic(1, 100, 512, 3136, 64, 64, 64, 132) == 8
    assert mm.split_k_heuristic(1, 4096, 4096, 4096, 128, 128, 64, 132) == 1
    assert mm.split_k_heuristic(1, 128, 128, 16, 64, 64, 64, 132) == 1   # K too short


@pytest.mark.parametrize("kind", ["half", "tf32", "ieee", "fp64"])
@pytest.mark.parametrize("shape", list(MNIST.values()) + [(4096, 4096, 4096), (1, 1, 1)],
                         ids=list(MNIST) + ["4096", "1"])
def test_candidate_plans(kind, shape):
    m, n, k = shape
    plans = mm.candidate_plans(1, m, n, k, kind, True, False, 132)
    # each is compiled and timed once per GPU and shape (td.autotune): 28 at most (the
    # 3xTF32 tiles' doubled splits took the MNIST menus from 24 to 26)
    assert plans and len(plans) <= 28
    assert len({tuple(sorted(p.items())) for p in plans}) == len(plans), "duplicate plans"
    for p in plans:
        assert set(p) == set(mm.INTERPRET_PLAN)  # (TMA plans only with tma=True)
        assert p["BM"] >= 16 and p["BN"] >= 16 and p["split"] >= 1
        assert p["BK"] >= (16 if kind != "fp64" else 8)
    if kind == "tf32":
        assert any(p["stage_b"] for p in plans), "TF32 with an N-major b should try staging"
    assert any(p["x3"] for p in plans) == (kind == "ieee"), "3xTF32: tried for exact fp32 only"
    if kind == "ieee" and shape == (4096, 4096, 4096):  # tensor cores first where tiles fill
        assert plans[0]["x3"] and plans[0]["stage_b"]    # the GPU (b N-major: staged)
    if shape == MNIST["cnn1"] and kind != "fp64":
        assert any(p["split"] > 1 for p in plans), "skinny long-K products should try split-K"
    if kind != "fp64" and shape in MNIST.values():  # below MEDIUM_MACS: small tiles first
        assert plans[0]["BM"] * plans[0]["BN"] <= 2048


@pytest.mark.parametrize("kind", ["half", "tf32", "ieee"])
@pytest.mark.parametrize("shape", [(1152, 384, 16384), (384, 384, 16384), (84, 384, 16384),
                                   (16384, 84, 384)], ids=["qkv.dw", "proj.dw", "head.dw", "head"])
def test_long_k_products_start_on_tensor_core_tiles(kind, shape):
    """The gpt recipe's weight gradients (K = its 16384 rows) and its narrow head: output tiles
    too few to fill 132 SMs, but 2^28 multiply-adds or more. The first guess is a 64-row tile
    or more (wgmma's minimum), split along K where the tiles alone leave SMs idle (exact
    fp32: such tiles are on the menu, after the small ones)."""
    m, n, k = shape
    menu = plans = mm.candidate_plans(1, m, n, k, kind, False, False, 132)
    if kind == "ieee":  # exact fp32: after the small 3xTF32 tiles (tuned: those won)
        assert plans[0]["BM"] * plans[0]["BN"] <= 2048
        medium = matmul_menu._medium_plans(1, m, n, k, kind, 132)
        plans = [p for p in plans if p in medium]
    first = plans[0]
    assert first["BM"] >= 64 and first["BN"] >= 64 and first["x3"] == (kind == "ieee")
    tiles = -(-m // first["BM"]) * -(-n // first["BN"])
    assert tiles * first["split"] <= 132
    assert tiles * first["split"] * 2 > 132 or first["split"] == 16 or k < 4096
    assert any(p["BM"] * p["BN"] <= 2048 for p in menu)  # the small menu is there too


def test_autotuner_caches_on_disk(tmp_path, monkeypatch):
    """The first choice is measured and saved; a new process (a new tuner) reads it back
    without measuring; a saved plan that is no longer a candidate is measured again."""
    path = str(tmp_path / "matmul-test.json")
    monkeypatch.setattr(Tuner, "path", lambda self: path)
    td.autotune(True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    plans = [mm._plan(64, 64, 32, 4, 3), mm._plan(128, 128, 32, 8, 3)]
    measured = []

    def measure(self, key, candidates, run):
        measured.append(len(candidates))
        return candidates[-1]

    monkeypatch.setattr(Tuner, "_measure", measure)
    first = Tuner("matmul-test")
    assert first.choose("k1", lambda: plans, None) == plans[1]
    assert first.choose("k1", lambda: plans, None) == plans[1]
    assert (first.tuned, measured, first.last) == (1, [2], ("k1", plans[1]))
    assert mm.describe(plans[1]) == "128x128x32 w8 s3"
    assert mm.describe({**plans[0], "split": 4, "stage_b": True}) == \
        "64x64x32 w4 s3, split 4, stage b"
    second = Tuner("matmul-test")
    assert second.choose("k1", lambda: plans, None) == plans[1]
    assert (second.tuned, second.hits, measured) == (0, 1, [2])
    assert second.sources == {"k1": "cache"} and first.sources == {"k1": "tuned"}
    third = Tuner("matmul-test")  # the saved plan is no longer a candidate: measured again
    others = [plans[0], mm._plan(32, 32, 32, 2, 3)]
    assert third.choose("k1", lambda: others, None) == others[1]
    assert third.tuned == 1
    td.autotune(False)  # by default nothing is timed: the first candidate, the best guess
    fourth = Tuner("matmul-test")
    assert fourth.choose("k2", lambda: plans, None) == plans[0]
    assert (fourth.tuned, fourth.sources) == (0, {"k2": "heuristic"})


@pytest.mark.parametrize("dtype, precision", [(td.float32, "highest"), (td.float32, "high"),
                                              (td.bfloat16, "highest")],
                         ids=["fp32", "tf32", "bf16"])
def test_every_candidate_plan(dtype, precision, monkeypatch):
    """Every plan the tuner may pick (large and small menus) computes the right thing; on a GPU
    this compiles each of them (fp16 compiles the same plans as bf16)."""
    shape = (300, 1000, 260) if torch.cuda.is_available() else (70, 100, 50)
    try:
        td.set_matmul_precision(precision)
        kind = mm._kind(dtype.torch, precision)
        plans = mm.candidate_plans(1, 8192, 8192, 512, kind, True, False, 132)
        plans += mm.candidate_plans(1, 100, 512, 3136, kind, True, False, 132)
        if kind != "fp64":  # the tensor-core split-K tiles of long-K weight gradients
            plans += [p for p in mm.candidate_plans(1, 384, 384, 16384, kind, True, False, 132)
                      if p not in plans]
        m, k, n = shape
        a, b = random_array((m, k), dtype, seed=43), random_array((k, n), dtype, seed=44)
        bias = random_array((n,), dtype, seed=45)
        for plan in plans:
            monkeypatch.setattr(mm, "FORCE_PLAN", plan)
            check(run(a, b, bias, "relu"), a, b, bias, "relu",
                  kind="tf32" if precision == "high" else dtype.name)
    finally:
        td.set_matmul_precision("highest")


# ---------------------------------------------------------------------------- TMA plans
# _matmul_tma_kernel reads operands through tensor descriptors; Triton's interpreter runs them,
# so the kernel is checked here on small shapes too (forced), and its legality rules (which
# problems it may take; the classic kernel runs the others) without a GPU.


def _tma_layout(a, b, out=None, kind="half", **fused):
    out = out if out is not None else torch.empty(
        tuple(a.shape[:-2]) + (a.shape[-2], b.shape[-1]), dtype=a.dtype)
    a, b = mm._check(a, b, None, None)
    groups = mm._batch_groups(a, b, out)
    assert len(groups) == 1
    return mm._tma_operands(*groups[0], kind, **fused)


def test_tma_legality():
    """TMA reads a matrix with one axis of stride 1, the other's a multiple of 16 bytes, from
    16-byte aligned memory; 2-d problems or batches merged onto one shared b."""
    f32, bf16 = torch.float32, torch.bfloat16
    a, b = torch.empty(64, 32, dtype=f32), torch.empty(32, 48, dtype=f32)
    assert _tma_layout(a, b, kind="tf32") == (64, True, 32, False, 48, 48)
    w = torch.empty(48, 32, dtype=f32)  # x @ w.t(): b K-major
    assert _tma_layout(a, w.t(), kind="tf32") == (64, True, 32, True, 32, 48)
    at = torch.empty(32, 64, dtype=f32).t()  # a stored [K, M]
    assert _tma_layout(at, b, kind="tf32") == (64, False, 64, False, 48, 48)
    assert _tma_layout(a, b, kind="ieee") is not None  # (the menu offers none for it)
    # rows not a multiple of 16 bytes: N = 46 fp32 (b and out), K = 30 fp32 (a)
    assert _tma_layout(a, torch.empty(32, 46, dtype=f32), kind="tf32") is None
    assert _tma_layout(torch.empty(64, 30, dtype=f32), torch.empty(30, 48, dtype=f32),
                       kind="tf32") is None
    assert _tma_layout(torch.empty(64, 40, dtype=bf16), torch.empty(40, 48, dtype=bf16)) \
        is not None  # 80-byte rows
    # memory not 16-byte aligned, general strides, fp64, the fused backward options
    assert _tma_layout(torch.empty(64 * 32 + 1, dtype=f32)[1:].view(64, 32), b,
                       kind="tf32") is None
    assert _tma_layout(torch.empty(64, 64, dtype=f32)[:, ::2], b, kind="tf32") is None
    assert _tma_layout(a.double(), b.double(), kind="fp64") is None
    assert _tma_layout(a, b, kind="tf32", gate=a) is None
    assert _tma_layout(a, b, kind="tf32", rows=torch.empty(64)) is None
    # batches: merged into one tall product where b is shared and a's matrices follow each
    # other; a batch of different b's is not a TMA problem (for now)
    x = torch.empty(3, 5, 64, 32, dtype=f32)
    assert _tma_layout(x, b, kind="tf32") == (3 * 5 * 64, True, 32, False, 48, 48)
    assert _tma_layout(x, w.t(), kind="tf32") == (3 * 5 * 64, True, 32, True, 32, 48)
    assert _tma_layout(x, torch.empty(3, 5, 32, 48, dtype=f32), kind="tf32") is None
    assert _tma_layout(x.transpose(0, 1), b, kind="tf32") is None


def test_tma_menu():
    """TMA plans join the menu of large fp16/bf16/TF32 problems TMA can read, first where the
    sweep measured them to win (tma_first); the MNIST products and exact fp32 keep today's
    menu."""
    for kind in ("half", "tf32"):
        for n in (4096, 8192):
            for b_kmajor in (False, True):
                plans = mm.candidate_plans(1, n, n, n, kind, True, b_kmajor, 132, tma=True)
                tma = [p for p in plans if p.get("tma")]
                assert tma and len(plans) <= 24
                assert len({tuple(sorted(p.items())) for p in plans}) == len(plans)
                # measured: x @ w.t() at 4096 (TF32, fp16, bf16), a @ b at 8192 (fp16, bf16)
                assert bool(plans[0].get("tma")) == (b_kmajor or (kind == "half" and n == 8192))
                assert plans[0].get("ws", False) == (kind == "half" and n == 8192)
                assert [p for p in plans if not p.get("tma")] == \
                    mm.candidate_plans(1, n, n, n, kind, True, b_kmajor, 132)
                for p in tma:
                    assert set(p) == set(mm.INTERPRET_PLAN) | {"tma", "persistent", "ws"}
                    assert p["split"] == 1 and not p["stage_a"]
                    # TF32: wgmma reads K-major operands only, so an N-major b is staged
                    assert p["stage_b"] == (kind == "tf32" and not b_kmajor)
    for kind in ("half", "tf32", "ieee", "fp64"):
        for m, n, k in list(MNIST.values()) + [(4096, 4096, 32), (16384, 84, 384)]:
            assert mm.candidate_plans(1, m, n, k, kind, True, False, 132, tma=True) == \
                mm.candidate_plans(1, m, n, k, kind, True, False, 132)
    # from TMA_TRY_MACS to TMA_MIN_MACS (the gpt recipe's forward products): offered after the
    # classic plans, which keep the first guess
    for kind in ("half", "tf32"):
        for m, n, k in [(2048, 2048, 2048), (16384, 1152, 384), (4096, 4096, 64)]:
            for b_kmajor in (False, True):
                classic = mm.candidate_plans(1, m, n, k, kind, True, b_kmajor, 132)
                plans = mm.candidate_plans(1, m, n, k, kind, True, b_kmajor, 132, tma=True)
                assert plans[:len(classic)] == classic
                assert plans[len(classic):] and all(p.get("tma") for p in plans[len(classic):])
    assert not mm.tma_problem(1, 4096, 4096, 4096, "ieee", 132)
    assert mm.tma_problem(256, 512, 512, 512, "half", 132)  # 256 x 16 tiles, 2^35 MACs
    assert mm.describe(mm._tma_plan(128, 256, 64, 8, 3, True)) == \
        "128x256x64 w8 s3, tma, persistent"
    assert mm.describe(mm._tma_plan(128, 256, 32, 8, 3, False, stage_b=True, ws=True)) == \
        "128x256x32 w8 s3, stage b, tma, warp-specialized"


TMA_SHAPES = [(64, 48, 32), (70, 72, 40), (33, 200, 96)]  # rows of 16-byte multiples


@pytest.mark.parametrize("dtype", [td.float32, td.float16, td.bfloat16])
@pytest.mark.parametrize("persistent", [False, True], ids=["tile", "persistent"])
def test_tma_kernel(dtype, persistent, monkeypatch):
    """The TMA kernel (forced, small tiles) in every operand layout TMA reads, with the fused
    bias + relu epilogue, edges that cut tiles, and a persistent loop over several tiles."""
    monkeypatch.setattr(mm, "FORCE_PLAN", mm._tma_plan(32, 32, 16, 4, 2, persistent))
    for i, (m, n, k) in enumerate(TMA_SHAPES):
        for la, lb in [("contiguous", "contiguous"), ("contiguous", "transposed"),
                       ("transposed", "contiguous"), ("transposed", "transposed")]:
            if la == "transposed" and (m * dtype.itemsize) % 16:
                continue
            a, b = operand((m, k), dtype, la, seed=i), operand((k, n), dtype, lb, seed=i + 9)
            bias = random_array((n,), dtype, seed=3)
            assert _tma_layout(a, b, kind=mm._kind(dtype.torch, td.matmul_precision())) is not None
            check(run(a, b, bias, "relu"), a, b, bias, "relu")
            check(run(a, b), a, b)


def test_tma_batched_and_fallbacks(monkeypatch):
    """A batch of activations times one weight runs as one merged TMA product; problems TMA
    cannot read (odd row strides, a strided operand, the fused backward options) run the
    classic kernel with the TMA plan's tiles, and all give the reference's results."""
    monkeypatch.setattr(mm, "FORCE_PLAN", mm._tma_plan(32, 32, 16, 4, 2, True))
    x, w = random_array((3, 2, 20, 24), seed=1), random_array((40, 24), seed=2)
    bias = random_array((40,), seed=3)
    assert _tma_layout(x, w.t(), kind="ieee")[0] == 120
    check(run(x, w.t(), bias, "relu"), x, w.t(), bias, "relu")
    for a, b in [(random_array((33, 30), seed=4), random_array((30, 41), seed=5)),
                 (operand((40, 48), td.float32, "strided"), random_array((48, 32), seed=6)),
                 (random_array((2, 16, 32), seed=7), random_array((2, 32, 16), seed=8))]:
        assert _tma_layout(a, b, kind="ieee") is None
        check(run(a, b), a, b)
    dz, x2 = random_array((16, 32), seed=9), random_array((16, 24), seed=10)
    gate, rows = random_array((16, 32), seed=11).t(), torch.empty(32)
    got = td.get_backend().matmul(dz.t(), x2, a_gate=gate, a_row_sums=rows)
    gated = torch.where(gate > 0, dz.t(), torch.zeros(()))
    check(got, gated, x2)


def test_tma_plan_replays_with_new_memory(monkeypatch):
    """A recorded plan (launch.planned) of a TMA call launches with each call's own pointers:
    the descriptors are made in the kernel from them, never kept from the first call."""
    monkeypatch.setattr(mm, "FORCE_PLAN", mm._tma_plan(32, 32, 16, 4, 2, True))
    results = []
    for seed in range(3):
        a, b = random_array((64, 32), seed=seed), random_array((32, 48), seed=seed + 10)
        results.append((run(a, b), a, b))
    for got, a, b in results:
        check(got, a, b)


# ---------------------------------------------------------------------------- b in registers
# kernels/hopper.py: TF32 a @ b with an N-major b, b's tiles as wgmma's register operand (Gluon,
# Hopper only; it does not run under the interpreter).


def test_rs_menu():
    """The Gluon kernel goes first for large TF32 a @ b with a K-major a and an N-major b, on a
    GPU that runs it (rs=True); every other problem keeps its menu."""
    for n in (4096, 8192):
        plans = mm.candidate_plans(1, n, n, n, "tf32", True, False, 132, tma=True, rs=True)
        assert plans[0] == mm._rs_plan() and plans[1:] == \
            mm.candidate_plans(1, n, n, n, "tf32", True, False, 132, tma=True)
        assert mm.describe(plans[0]) == \
            "256x128x32 w8 s4, tma, b in registers (gluon)"
        for kind, a_kmajor, b_kmajor in [("tf32", True, True), ("tf32", False, False),
                                         ("half", True, False), ("ieee", True, False)]:
            assert mm.candidate_plans(1, n, n, n, kind, a_kmajor, b_kmajor, 132, tma=True,
                                      rs=True) == \
                mm.candidate_plans(1, n, n, n, kind, a_kmajor, b_kmajor, 132, tma=True)
    for m, n, k in MNIST.values():  # not TMA problems
        assert not any(p.get("rs") for p in
                       mm.candidate_plans(1, m, n, k, "tf32", True, False, 132, rs=True))


def test_rs_plan_falls_back_where_gluon_cannot_run(monkeypatch):
    """A forced Gluon plan where the kernel cannot run (the interpreter, or operands TMA cannot
    read) runs the classic kernel with b staged, and gives the reference's results."""
    monkeypatch.setattr(mm, "FORCE_PLAN", mm._rs_plan())
    td.set_matmul_precision("high")
    try:
        for a, b in [(random_array((40, 36), seed=1), random_array((36, 44), seed=2)),
                     (random_array((33, 30), seed=3), random_array((30, 41), seed=4)),
                     (random_array((20, 24), seed=5), random_array((40, 24), seed=6).t())]:
            bias = random_array((b.shape[1],), seed=7)
            check(run(a, b, bias, "relu"), a, b, bias, "relu", kind="tf32")
    finally:
        td.set_matmul_precision("highest")


@pytest.mark.skipif(not mm.hopper.GLUON, reason="this Triton has no Gluon Hopper dialect")
def test_rs_kernel_compiles_for_hopper(tmp_path):
    """The Gluon kernel compiles for sm_90 with this Triton (no GPU needed): its wgmmas read b
    from registers, and each K step waits only for the step before it (wait(1)), so that one
    step's wgmma runs while the next step's registers load."""
    script = tmp_path / "compile_rs.py"
    script.write_text(r"""
import os, re, sys
os.environ["TRITON_INTERPRET"] = "0"
sys.path.insert(0, ROOT)
import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource
from tritonad.kernels import hopper as H
sig = {n: "*fp32" for n in ("a_ptr", "b_ptr", "c_ptr", "bias_ptr")}
sig.update({n: "i32" for n in ("M", "N", "K", "stride_a", "stride_b", "stride_c",
                               "stride_bias")})
const = dict(BN=H.TILE_N, BM=H.TILE_M, BK=H.TILE_K, STAGES=H.STAGES, GROUP_M=8, HAS_BIAS=True,
             RELU=True, num_warps=H.WARPS)
sig.update({n: "constexpr" for n in const})
k = triton.compile(GluonASTSource(H._tf32_nmajor_kernel, sig, constexprs=const),
                   target=GPUTarget("cuda", 90, 32), options={"num_warps": H.WARPS})
ptx = k.asm["ptx"]
print("register-A", len(re.findall(r"wgmma.mma_async.sync.aligned.m64n256k8.f32.tf32.tf32 "
                                   r"\{[^}]*\}, \{%r", ptx)))
print("wait1", len(re.findall(r"wgmma.wait_group.sync.aligned 1;", ptx)))
""".replace("ROOT", repr(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))
    import subprocess
    import sys
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    counts = dict(line.split() for line in done.stdout.splitlines() if line[:1] in "rw")
    # four k8 wgmmas a K step: the first step, two a loop trip, one after the loop
    assert counts == {"register-A": "16", "wait1": "4"}


@pytest.mark.gpu
def test_gpu_rs_kernel(precision, monkeypatch):
    """The Gluon kernel (forced) against float64: K of 1, 2, 3 and 17 K steps (the loop's
    first step, pairs and last step), edges that cut tiles, bias + relu, a strided a, a batch
    of rows times one b; on a GPU that is not a Hopper it falls back to the classic kernel."""
    precision("high")
    monkeypatch.setattr(mm, "FORCE_PLAN", mm._rs_plan())
    for i, (m, n, k) in enumerate([(64, 48, 20), (257, 132, 36), (33, 200, 96),
                                   (300, 260, 516), (1000, 1028, 2048)]):
        a, b = random_array((m, k), seed=i), random_array((k, n), seed=i + 10)
        bias = random_array((n,), seed=i + 20)
        assert _tma_layout(a, b, kind="tf32") is not None
        _gpu_check(run(a, b, bias, "relu"), a, b, bias, "relu", "tf32")
        _gpu_check(run(a, b), a, b, kind="tf32")
    big = random_array((300, 520), seed=30)
    a, b = big[:, :516], random_array((516, 260), seed=31)
    _gpu_check(run(a, b), a, b, kind="tf32")
    x, w = random_array((3, 2, 100, 64), seed=32), random_array((64, 132), seed=33)
    _gpu_check(run(x, w), x, w, kind="tf32")


@pytest.mark.gpu
def test_gpu_rs_is_the_first_guess_on_hopper(precision):
    """A large TF32 a @ b takes the Gluon plan untuned on a Hopper (and not elsewhere), and it
    replays from a CUDA graph."""
    precision("high")
    a, b = random_array((4096, 2048), seed=1), random_array((2048, 4096), seed=2)
    out = run(a, b)
    hopper = mm.hopper.rs_available(torch.cuda.current_device())
    assert bool(mm.tuner.last[1].get("rs")) == hopper
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = run(a, b)
    a.copy_(random_array((4096, 2048), seed=3))
    graph.replay()
    torch.cuda.synchronize()
    _gpu_check(out, a, b, kind="tf32")


# ---------------------------------------------------------------------------- autodiff level


def test_autodiff_matmul_and_linear():
    rng = np.random.default_rng(40)
    check_op(lambda a, b: a @ b, rng.uniform(-2, 2, (2, 5, 7)), rng.uniform(-2, 2, (7, 3)))
    x, w, bias = rng.uniform(-2, 2, (6, 7)), rng.uniform(-2, 2, (4, 7)), rng.uniform(-2, 2, 4)
    check_op(lambda x, w, b: F.linear(x, w, b, activation="relu"), x, w, bias)
    check_op(lambda x, w: F.linear(x, w), x, w)


@pytest.mark.parametrize("frozen", ["x", "w", "b", "x+w"])
def test_linear_backward_with_frozen_inputs(frozen):
    """The fused linear backward with only some inputs needing gradients: the bias gradient
    without a weight gradient takes its own path; relu outputs with exact zeros."""
    rng = np.random.default_rng(41)
    values = {"x": rng.uniform(-2, 2, (9, 7)), "w": rng.uniform(-2, 2, (5, 7)),
              "b": rng.uniform(-2, 2, 5)}
    values["b"][0] = -100.0  # a column that relu zeroes everywhere
    names = [n for n in "xwb" if n not in frozen]

    def fn(*leaves):
        given = dict(zip(names, leaves))
        args = [given.get(n) if n in given else td.tensor(values[n], dtype=leaves[0].dtype)
                for n in "xwb"]
        return F.linear(*args, activation="relu")

    check_op(fn, *[values[n] for n in names])


# ---------------------------------------------------------------------------- GPU tier

KINDS = [("float32", "highest"), ("tf32", "high"), ("bfloat16", "highest"),
         ("float16", "highest")]


def _gpu_inputs(shape_a, shape_b, kind, layout_b="contiguous", seed=0):
    dtype = td.float32 if kind in ("float32", "tf32") else td.dtypes.get_dtype(kind)
    return operand(shape_a, dtype, seed=seed), operand(shape_b, dtype, layout_b, seed=seed + 1)


def _gpu_check(got, a, b, bias=None, activation=None, kind="float32"):
    """check() with the reference computed by torch in float64 on the GPU (numpy is slow)."""
    ref = a.double() @ b.double()
    scale = a.double().abs() @ b.double().abs()
    if bias is not None:
        ref, scale = ref + bias.double(), scale + bias.double().abs()
    if activation == "relu":
        ref = ref.clamp_min(0)
    assert got.dtype == a.dtype and got.shape == ref.shape and got.is_contiguous()
    error = ((got.double() - ref) / (scale + 1e-30)).abs()
    worst, allowed = (error.max().item() if error.numel() else 0.0), rtol(kind, a.shape[-1])
    assert worst <= allowed, f"{kind}: worst scaled error {worst:.3g} > {allowed:.3g}"


@pytest.fixture
def precision():
    def use(value):
        td.set_matmul_precision(value)
    yield use
    td.set_matmul_precision("highest")


@pytest.mark.gpu
@pytest.mark.parametrize("kind, prec", KINDS, ids=[k for k, _ in KINDS])
@pytest.mark.parametrize("layout_b", ["contiguous", "transposed"])
def test_gpu_large_odd_shape(kind, prec, layout_b, precision):
    precision(prec)
    a, b = _gpu_inputs((1823, 1023), (1023, 781), kind, layout_b)
    bias = random_array((781,), a.dtype, seed=7)
    _gpu_check(run(a, b, bias, "relu"), a, b, bias, "relu", kind)


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["bfloat16", "float16"])
def test_gpu_4096_half(kind):
    a, b = _gpu_inputs((4096, 4096), (4096, 4096), kind)
    _gpu_check(run(a, b), a, b, kind=kind)


@pytest.mark.gpu
@pytest.mark.parametrize("kind, prec", KINDS, ids=[k for k, _ in KINDS])
def test_gpu_mnist_shapes(kind, prec, precision):
    """Forward (with bias + relu), dX = dY @ W and dW = dY^T @ X of both MNIST models, in the
    layouts the autodiff passes (w.t(), dy.transpose)."""
    precision(prec)
    dtype = td.float32 if kind in ("float32", "tf32") else td.dtypes.get_dtype(kind)
    for batch, n_in, n_out in [(128, 784, 256), (128, 256, 100), (128, 100, 10),
                               (100, 3136, 512), (100, 512, 10)]:
        x, w = random_array((batch, n_in), dtype, seed=1), random_array((n_out, n_in), dtype,
                                                                         seed=2)
        bias, dy = random_array((n_out,), dtype, seed=3), random_array((batch, n_out), dtype,
                                                                        seed=4)
        _gpu_check(run(x, w.t(), bias, "relu"), x, w.t(), bias, "relu", kind)
        _gpu_check(run(dy, w), dy, w, kind=kind)
        _gpu_check(run(dy.t(), x), dy.t(), x, kind=kind)


@pytest.mark.gpu
def test_gpu_forced_split_and_staging(precision, monkeypatch):
    precision("high")
    dy, x = random_array((100, 512), seed=1), random_array((100, 3136), seed=2)
    for plan in (dict(split=6), dict(stage_a=True, stage_b=True),
                 dict(split=4, stage_a=True, stage_b=True)):
        monkeypatch.setattr(mm, "FORCE_PLAN", plan)
        _gpu_check(run(dy.t(), x), dy.t(), x, kind="tf32")


@pytest.mark.gpu
@pytest.mark.parametrize("plan", [dict(x3=True, BK=32), dict(x3=True, BM=16, BN=32, BK=16),
                                  dict(x3=True, BK=32, split=4, stage_a=True, stage_b=True)],
                         ids=["64x64", "16x32", "split-staged"])
def test_gpu_3xtf32_keeps_fp32_accuracy(plan, monkeypatch):
    """3xTF32 plans (tensor cores, operands split into TF32 head + tail) stay within the float32
    bound on the MNIST products, in the layouts of the autodiff, and on odd sizes and edge
    values (large and tiny magnitudes, exact zeros)."""
    monkeypatch.setattr(mm, "FORCE_PLAN", plan)
    for batch, n_in, n_out in [(128, 784, 256), (128, 100, 10), (100, 3136, 512), (37, 19, 5)]:
        x, w = random_array((batch, n_in), seed=1), random_array((n_out, n_in), seed=2)
        dy = random_array((batch, n_out), seed=4)
        _gpu_check(run(x, w.t()), x, w.t())
        _gpu_check(run(dy, w), dy, w)
        _gpu_check(run(dy.t(), x), dy.t(), x)
    x = random_array((65, 70), seed=5) * torch.logspace(-20, 20, 70, device="cuda")
    x[:, ::7] = 0
    w = random_array((70, 33), seed=6)
    _gpu_check(run(x, w), x, w)


@pytest.mark.gpu
@pytest.mark.parametrize("plan", [None, dict(split=8)], ids=["tuned", "split"])
def test_gpu_cuda_graph_capture(plan, monkeypatch):
    """A warmed-up matmul (split-K path included) replays correctly from a CUDA graph, again
    and again."""
    monkeypatch.setattr(mm, "FORCE_PLAN", plan)
    a, b = random_array((100, 3136), seed=1), random_array((3136, 512), seed=2)
    bias = random_array((512,), seed=3)
    run(a, b, bias, "relu")
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = run(a, b, bias, "relu")
    for seed in (4, 5):
        a.copy_(random_array((100, 3136), seed=seed))
        graph.replay()
        torch.cuda.synchronize()
        _gpu_check(out, a, b, bias, "relu", "float32")


@pytest.mark.gpu
def test_gpu_autotune_cache(tmp_path, monkeypatch):
    """Tuning measures once, saves to disk, and a fresh tuner (a new run) reuses the choice."""
    monkeypatch.setenv("TRITONAD_AUTOTUNE_DIR", str(tmp_path))
    td.autotune(True)
    monkeypatch.setattr(mm, "tuner", Tuner("matmul", mm._SOURCE_HASH))
    a, b = random_array((100, 3136), td.bfloat16, seed=1), random_array((3136, 512),
                                                                        td.bfloat16, seed=2)
    _gpu_check(run(a, b), a, b, kind="bfloat16")
    assert mm.tuner.tuned == 1 and mm.tuner.seconds > 0
    assert len(list(tmp_path.glob("matmul-*.json"))) == 1
    monkeypatch.setattr(mm, "tuner", Tuner("matmul", mm._SOURCE_HASH))
    td.autotune(False)  # a cached choice is used whether or not tuning is on
    _gpu_check(run(a, b), a, b, kind="bfloat16")
    assert (mm.tuner.tuned, mm.tuner.hits) == (0, 1)


@pytest.mark.gpu
@pytest.mark.parametrize("kind, prec", KINDS[1:], ids=[k for k, _ in KINDS[1:]])
def test_gpu_tma_plans(kind, prec, precision, monkeypatch):
    """Every TMA plan of the large menus (forced on a mid-size problem so that the numpy
    reference stays quick) with bias + relu, within the precision's bound; the first one also
    in the layouts of x @ w.t() and dy.t() @ x."""
    precision(prec)
    mkind = "tf32" if kind == "tf32" else "half"
    plans = [p for p in mm.candidate_plans(1, 8192, 8192, 8192, mkind, True, False, 132,
                                           tma=True) if p.get("tma")]
    m, n, k = 520, 1032, 264
    for i, plan in enumerate(plans):
        monkeypatch.setattr(mm, "FORCE_PLAN", plan)
        for la, lb in [("contiguous", "contiguous"), ("contiguous", "transposed"),
                       ("transposed", "contiguous")][:3 if i == 0 else 1]:
            a, b = _gpu_inputs((m, k), (k, n), kind, lb, seed=3)
            if la == "transposed":
                a = operand((m, k), a.dtype, "transposed", seed=5)
            assert _tma_layout(a, b, kind=mkind) is not None
            bias = random_array((n,), a.dtype, seed=7)
            check(run(a, b, bias, "relu"), a, b, bias, "relu", kind=kind)


@pytest.mark.gpu
@pytest.mark.parametrize("kind, prec", KINDS[1:], ids=[k for k, _ in KINDS[1:]])
@pytest.mark.parametrize("n", [4096, 8192])
def test_gpu_tma_default_large(kind, prec, n, precision):
    """a @ b at 4096^3 and 8192^3 in TF32 / bf16 / fp16 runs the tuner's best guess and is
    right: a TMA plan for fp16/bf16 at 8192 (the key says so); TF32 the Gluon kernel on a
    Hopper (":rs"), else the classic plans staged K-major; the classic plans otherwise."""
    precision(prec)
    a, b = _gpu_inputs((n, n), (n, n), kind, seed=11)
    _gpu_check(run(a, b), a, b, kind=kind)
    key, plan = mm.tuner.last
    tma = kind != "tf32" and n == 8192
    rs = kind == "tf32" and mm.hopper.rs_available(torch.cuda.current_device())
    assert key.endswith(":tma") == tma and key.endswith(":rs") == rs
    if mm.tuner.sources[key] == "heuristic":
        assert bool(plan.get("tma")) == tma or rs
        assert bool(plan.get("rs")) == rs
        assert plan["stage_b"] == (kind == "tf32" and not rs)


@pytest.mark.gpu
def test_gpu_tma_replay_graph_and_threads(monkeypatch):
    """A TMA call replays from its recorded plan with new memory, replays from a CUDA graph,
    and runs (first call and replay) from a thread where Triton's allocator was never set."""
    import threading

    monkeypatch.setattr(mm, "FORCE_PLAN", mm._tma_plan(128, 256, 64, 8, 3, True, ws=True))
    shapes = (512, 256), (256, 384)
    calls = []
    for seed in range(3):
        a = random_array(shapes[0], td.bfloat16, seed=seed)
        b = random_array(shapes[1], td.bfloat16, seed=seed + 9)
        calls.append((run(a, b), a, b))
    for got, a, b in calls:
        _gpu_check(got, a, b, kind="bfloat16")
    a, b = calls[0][1], calls[0][2]
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = mm.matmul(a, b)
    for seed in (20, 21):
        a.copy_(random_array(shapes[0], td.bfloat16, seed=seed))
        graph.replay()
        torch.cuda.synchronize()
        _gpu_check(out, a, b, kind="bfloat16")
    results, errors = [], []

    def worker():
        try:
            # a new problem, then a replay of the plan recorded above
            for x in (random_array((96, 64), td.bfloat16, seed=1),
                      random_array(shapes[0], td.bfloat16, seed=2)):
                y = random_array((x.shape[1], shapes[1][1]), x.dtype, seed=3)
                results.append((mm.matmul(x, y), x, y))
            torch.cuda.synchronize()
        except Exception as err:  # noqa: BLE001
            errors.append(err)

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    assert not errors, errors
    for got, x, y in results:
        _gpu_check(got, x, y, kind="bfloat16")


@pytest.mark.parametrize("n", [3, 0])
def test_vector_dot_vector_is_a_0d_tensor_as_torch(backend_name, n):
    a = np.arange(n, dtype=np.float32) + 1
    b = a[::-1].copy()
    x, y = td.tensor(a, requires_grad=True), td.tensor(b, requires_grad=True)
    tx, ty = torch.tensor(a, requires_grad=True), torch.tensor(b, requires_grad=True)
    out, expected = x @ y, tx @ ty
    out.backward()
    expected.backward()
    assert out.shape == () and out.item() == expected.item()
    assert x.grad.tolist() == tx.grad.tolist() and y.grad.tolist() == ty.grad.tolist()
