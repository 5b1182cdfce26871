"""Convolution kernels (the tritonad/kernels/conv/ package): conv2d forward and backward through
each algorithm (im2col + matmul, implicit GEMM, window GEMM, flat shift, batch-inner, Winograd),
im2col and col2im, against the numpy reference backend.

The oracle is checked first: the reference convolution against the plain loop definition below,
and its gradients against float64 central differences.
"""
import dataclasses

import numpy as np
import pytest
import torch
import triton
from hypothesis import given, settings
from hypothesis import strategies as st
from helpers import assert_close, check_op, check_primitive, random_array

import tritonad as td
import tritonad.nn.functional as F
from tritonad.autodiff import gradcheck
from tritonad.kernels import conv
from tritonad.kernels import plans
from tritonad.kernels.conv import batch_inner, common, flat_shift, implicit_gemm, layout, \
    routing, sums, tf32, window, winograd
from tritonad.kernels.conv import im2col_path
from tritonad.kernels.conv import settings as conv_settings
from tritonad.reference import NumpyBackend
from tritonad.reference import from_numpy as raw_from_numpy
from tritonad.reference import to_numpy


# ----------------------------------------------------------------------------- numpy references


def loop_conv2d(x, w, b, stride, padding, dilation, groups=1):
    """The definition, one output pixel and tap at a time (g = the group of o):
    y[n, o, p, q] = b[o] + sum_{c,i,j} w[o, c, i, j] x[n, g*C/G + c, p*s - pad + i*d, ...]."""
    n, _, h, wd = x.shape
    co, cg, kh, kw = w.shape
    (sh, sw), (ph, pw), (dh, dw) = stride, padding, dilation
    oh = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    ow = (wd + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    y = np.zeros((n, co, oh, ow))
    for o in range(co):
        first = (o // (co // groups)) * cg
        for p in range(oh):
            for q in range(ow):
                for i in range(kh):
                    for j in range(kw):
                        hh, ww = p * sh - ph + i * dh, q * sw - pw + j * dw
                        if 0 <= hh < h and 0 <= ww < wd:
                            y[:, o, p, q] += x[:, first:first + cg, hh, ww] @ w[o, :, i, j]
        if b is not None:
            y[:, o] += b[o]
    return y


# ----------------------------------------------------------------------------- fixtures


@pytest.fixture(autouse=True)
def _triton_backend():
    with td.use_backend("triton"):
        yield


# every module of the package that launches kernels or asks for the GPU's SM count
CONV_MODULES = (common, im2col_path, implicit_gemm, layout, sums, tf32, window, flat_shift,
                batch_inner, winograd, routing, conv.weight_grad)


@pytest.fixture(autouse=True)
def _conv_settings():
    """Each test starts from the default conv.Settings; knobs() changes them for the test."""
    saved = conv.set_settings(conv.Settings())
    yield
    conv.set_settings(saved)


def knobs(**changes):
    """conv's settings with `changes` (field=value) for the rest of the test."""
    conv.set_settings(dataclasses.replace(conv.current_settings(), **changes))


def _spy_run(monkeypatch, spy):
    """Every kernel launch of the conv package through spy(kernel, grid, *args, **meta)."""
    for module in CONV_MODULES:
        if hasattr(module, "run"):
            monkeypatch.setattr(module, "run", spy)


def _fake_sms(monkeypatch, sms):
    """The conv package sees a GPU of `sms` SMs."""
    for module in CONV_MODULES:
        if hasattr(module, "sm_count"):
            monkeypatch.setattr(module, "sm_count", lambda device: sms)


@pytest.fixture(params=["implicit", "im2col"])
def algo(request, monkeypatch):
    """Run a test through one convolution path (the im2col path needs kernels/matmul.py)."""
    if request.param == "im2col" and not im2col_path.have_matmul():
        pytest.skip("tritonad.kernels.matmul is not there yet")
    knobs(algo=request.param)
    return request.param


def _pairs(*values):
    return tuple((v, v) if isinstance(v, int) else tuple(v) for v in values)


def _check_conv(n, c, h, w, co, k, stride, padding, dilation, groups=1, bias=True, seed=0,
                grads=(True, True, True), dtype=td.float32, rtol=1e-4, atol=1e-5):
    """Forward and backward of the triton conv2d against the float64 reference."""
    kh, kw = (k, k) if isinstance(k, int) else k
    stride, padding, dilation = _pairs(stride, padding, dilation)
    x = random_array((n, c, h, w), dtype, low=-1, high=1, seed=seed)
    wt = random_array((co, c // groups, kh, kw), dtype, low=-1, high=1, seed=seed + 1)
    b = random_array((co,), dtype, seed=seed + 2) if bias else None
    y = check_primitive("conv2d", x, wt, b, stride, padding, dilation, groups, rtol=rtol,
                        atol=atol)
    dy = random_array(tuple(y.shape), dtype, low=-1, high=1, seed=seed + 3)
    check_primitive("conv2d_backward", dy, x, wt, stride, padding, dilation, groups,
                    input_grad=grads[0], weight_grad=grads[1], bias_grad=grads[2], rtol=rtol,
                    atol=atol)


# ----------------------------------------------------------------------------- the oracle


@pytest.mark.parametrize("geometry", [
    ((2, 3, 6, 5), (4, 3, 3, 2), (1, 1), (1, 0), (1, 1), 1),
    ((1, 4, 7, 7), (6, 2, 2, 3), (2, 3), (2, 1), (2, 1), 2),
    ((2, 1, 3, 3), (2, 1, 3, 3), (3, 3), (0, 0), (1, 1), 1),  # a 1-pixel output
])
def test_reference_conv_is_the_loop_definition(geometry):
    xs, ws, stride, padding, dilation, groups = geometry
    rng = np.random.default_rng(0)
    x, w, b = rng.standard_normal(xs), rng.standard_normal(ws), rng.standard_normal(ws[0])
    got = NumpyBackend().conv2d(raw_from_numpy(x, td.float64), raw_from_numpy(w, td.float64),
                                raw_from_numpy(b, td.float64), stride, padding, dilation, groups)
    assert_close(got, loop_conv2d(x, w, b, stride, padding, dilation, groups), 1e-12, 1e-12)


def test_reference_conv_gradients_match_finite_differences():
    rng = np.random.default_rng(1)
    with td.use_backend("numpy"):
        x, w, b = (td.tensor(rng.standard_normal(s), dtype=td.float64, requires_grad=True)
                   for s in ((2, 2, 5, 4), (3, 2, 3, 2), (3,)))
        gradcheck(lambda x, w, b: F.conv2d(x, w, b, stride=(2, 1), padding=1, dilation=(1, 2)),
                  (x, w, b))
        gradcheck(lambda x, w: F.conv2d(x, w, None, padding=2, groups=2),
                  (td.tensor(rng.standard_normal((1, 4, 3, 3)), dtype=td.float64,
                             requires_grad=True),
                   td.tensor(rng.standard_normal((2, 2, 2, 2)), dtype=td.float64,
                             requires_grad=True)))


def _torch_reference_grads(x, w, b, dy, stride, padding, dilation, groups):
    """torch's float64 convolution and its autograd gradients: an independent oracle."""
    xs, ws, bs = (torch.from_numpy(np.asarray(a, np.float64)).requires_grad_() for a in (x, w, b))
    y = torch.nn.functional.conv2d(xs, ws, bs, stride, padding, dilation, groups)
    y.backward(torch.from_numpy(np.asarray(dy, np.float64)))
    return y.detach(), xs.grad, ws.grad, bs.grad


@pytest.mark.parametrize("chunk_bytes", [1, 1 << 26])  # one sample per chunk; all at once
@pytest.mark.parametrize("geometry", [
    ((3, 3, 6, 5), (4, 3, 3, 2), (1, 1), (1, 0), (1, 1), 1),
    ((2, 4, 7, 7), (6, 2, 2, 3), (2, 3), (2, 1), (2, 1), 2),
    ((3, 2, 9, 8), (5, 2, 5, 5), (1, 1), (2, 2), (1, 1), 1),   # the MNIST layers' k5 p2
    ((2, 6, 5, 4), (6, 1, 3, 3), (1, 2), (1, 1), (1, 1), 6),   # depthwise
    ((3, 1, 9, 8), (12, 1, 3, 3), (2, 1), (1, 2), (1, 1), 1),  # few input channels, as conv1:
    ((2, 4, 6, 5), (8, 2, 1, 2), (1, 1), (0, 1), (1, 1), 2),   # columns in sample order
])
@pytest.mark.parametrize("dtype", [td.float32, td.float64])
def test_reference_conv_against_torch(geometry, chunk_bytes, dtype, monkeypatch):
    """The reference's own float32 path (not only the float64 one the kernel tests use), with
    the batch split into chunks, against torch's float64 convolution and autograd."""
    monkeypatch.setattr(td.reference.conv, "CONV_CHUNK_BYTES", chunk_bytes)
    monkeypatch.setattr(td.reference.conv, "CONV_ROWS_BYTES", chunk_bytes)  # 1: row by row
    xs, ws, stride, padding, dilation, groups = geometry
    rng = np.random.default_rng(2)
    x, w, b = rng.standard_normal(xs), rng.standard_normal(ws), rng.standard_normal(ws[0])
    ref = NumpyBackend()
    raw = [raw_from_numpy(a, dtype) for a in (x, w, b)]
    y = ref.conv2d(*raw, stride, padding, dilation, groups)
    dy = rng.standard_normal(tuple(y.shape))
    got = (y,) + ref.conv2d_backward(raw_from_numpy(dy, dtype), raw[0], raw[1], stride, padding,
                                     dilation, groups)
    # the float32 inputs' exact values, so that only the computation's rounding is measured
    exact = [to_numpy(a).astype(np.float64) for a in raw] + [np.float32(dy).astype(np.float64)
                                                            if dtype is td.float32 else dy]
    want = _torch_reference_grads(*exact, stride, padding, dilation, groups)
    tol = 1e-12 if dtype is td.float64 else 1e-5
    for name, g, e in zip(("y", "dx", "dw", "db"), got, want):
        assert g.dtype == dtype.torch, name
        assert_close(g, e, tol, tol, name=name)


def test_reference_unfold_fold_against_torch(monkeypatch):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 3, 7, 6))
    args = ((3, 2), (2, 1), (1, 1), (1, 2))
    cols = NumpyBackend().im2col(raw_from_numpy(x, td.float64), *args)
    want = torch.nn.functional.unfold(torch.from_numpy(x), args[0], args[3], args[2], args[1])
    assert_close(cols, want, 0, 0)
    c = rng.standard_normal(tuple(cols.shape))
    back = NumpyBackend().col2im(raw_from_numpy(c, td.float64), (7, 6), *args)
    want = torch.nn.functional.fold(torch.from_numpy(c), (7, 6), args[0], args[3], args[2],
                                    args[1])
    assert_close(back, want, 1e-12, 1e-12)


def _fresh_backward(ref, dy, x, w, *geometry):
    """conv2d_backward with no columns kept from a forward: the columns built again."""
    td.reference._WORK.kept_columns = None
    return ref.conv2d_backward(dy, x, w, *geometry)


@pytest.mark.parametrize("dtype", [td.float32, td.float64])
def test_reference_conv_backward_reuses_only_columns_of_the_same_input(dtype):
    """A forward with few input channels keeps its columns for the backward
    (td.reference._KeptColumns): the weight gradient is bit for bit the one of columns built
    again, and a backward whose input changed in place since the forward, or whose input is
    another array, never reads columns of other values."""
    rng = np.random.default_rng(4)
    ref = NumpyBackend()
    geometry = ((1, 1), (1, 1), (1, 1), 1)
    # (2 * 9 <= 20 output channels: columns in sample order, kept; as the MNIST cnn's conv1)
    x1, x2 = (raw_from_numpy(rng.standard_normal((3, 2, 6, 5)), dtype) for _ in range(2))
    w = raw_from_numpy(rng.standard_normal((20, 2, 3, 3)), dtype)
    dy = raw_from_numpy(rng.standard_normal((3, 20, 6, 5)), dtype)
    want1, want2 = (_fresh_backward(ref, dy, x, w, *geometry) for x in (x1, x2))
    # two forwards, then their backwards in reverse order, as autodiff runs them
    ref.conv2d(x1, w, None, *geometry)
    ref.conv2d(x2, w, None, *geometry)
    for x, want in ((x2, want2), (x1, want1)):
        got = ref.conv2d_backward(dy, x, w, *geometry)
        for g, e in zip(got, want):
            assert torch.equal(g, e)
    # the input changed in place (through numpy, which no version counter sees) after the
    # forward: the backward sees the new values
    ref.conv2d(x1, w, None, *geometry)
    to_numpy(x1)[1, 1, 3, 4] += 1
    x1_now = raw_from_numpy(to_numpy(x1).copy(), dtype)
    got = ref.conv2d_backward(dy, x1, w, *geometry)
    want = _fresh_backward(ref, dy, x1_now, w, *geometry)
    assert torch.equal(got[1], want[1])
    # another geometry on the same input builds its own columns
    ref.conv2d(x2, w, None, *geometry)
    other = ((1, 1), (2, 0), (1, 1), 1)
    dy_other = raw_from_numpy(rng.standard_normal((3, 20, 8, 3)), dtype)
    got = ref.conv2d_backward(dy_other, x2, w, *other)
    want = _fresh_backward(ref, dy_other, x2, w, *other)
    assert torch.equal(got[1], want[1])


def test_reference_conv_keeps_a_bounded_number_of_columns():
    rng = np.random.default_rng(5)
    ref = NumpyBackend()
    geometry = ((1, 1), (1, 1), (1, 1), 1)
    w = raw_from_numpy(rng.standard_normal((9, 1, 3, 3)), td.float32)
    xs = [raw_from_numpy(rng.standard_normal((2, 1, 5, 5)), td.float32) for _ in range(6)]
    dy = raw_from_numpy(rng.standard_normal((2, 9, 5, 5)), td.float32)
    wants = [_fresh_backward(ref, dy, x, w, *geometry) for x in xs]
    for x in xs:
        ref.conv2d(x, w, None, *geometry)
    kept = td.reference._kept_columns()
    assert len(kept.slots) == kept.SLOTS and all(slot[2] for slot in kept.slots)
    # the two oldest were dropped: those backwards build their columns again
    for x, want in zip(xs, wants):
        got = ref.conv2d_backward(dy, x, w, *geometry)
        assert torch.equal(got[1], want[1])
    assert not any(slot[2] for slot in kept.slots)  # every kept entry was taken


# ----------------------------------------------------------------------------- properties

_SIZES = [1, 2, 3, 5, 8, 13]


def _fit(size, k, pad, dil):
    """The smallest size >= `size` that a kernel k (dilation dil, padding pad) fits."""
    return max(size, dil * (k - 1) + 1 - 2 * pad)


@given(data=st.data())
def test_conv2d_matches_reference(algo, data):
    """Random geometry: batch, channels, sizes, kernels 1..7, stride 1..3, padding 0..3,
    dilation 1..2; outputs down to a single pixel, windows that overlap or skip pixels."""
    k = data.draw(st.sampled_from([1, 2, 3, 5, 7]), "k")
    kw = data.draw(st.sampled_from([k, 1, 3]), "kw")
    dil = data.draw(st.sampled_from([1, 2]), "dilation")
    ph = data.draw(st.sampled_from([0, 1, 2, 3]), "ph")
    pw = data.draw(st.sampled_from([0, ph]), "pw")
    h = _fit(data.draw(st.sampled_from(_SIZES), "h"), k, ph, dil)
    w = _fit(data.draw(st.sampled_from(_SIZES), "w"), kw, pw, 1)
    _check_conv(n=data.draw(st.sampled_from([1, 2]), "n"),
                c=data.draw(st.sampled_from([1, 3]), "c"), h=h, w=w,
                co=data.draw(st.sampled_from([1, 4]), "co"), k=(k, kw),
                stride=(data.draw(st.sampled_from([1, 2, 3]), "sh"),
                        data.draw(st.sampled_from([1, 2]), "sw")),
                padding=(ph, pw), dilation=(dil, 1), bias=data.draw(st.booleans(), "bias"),
                grads=data.draw(st.sampled_from([(True, True, True), (True, False, False),
                                                 (False, True, False), (False, False, True)]),
                                "grads"))


@pytest.mark.parametrize("window", [True, False])
def test_conv2d_channel_inner_tiles_and_split_k(algo, window, monkeypatch):
    """C and Co >= 16: K walks (tap, channel block), in the window GEMM or the implicit GEMM;
    the weight gradient splits its pixels in three chunks summed in a fixed order, so two runs
    agree bit for bit."""
    knobs(window_gemm=window)
    knobs(dw_split=3)
    _check_conv(2, 20, 6, 7, 18, 3, stride=1, padding=1, dilation=1)
    x = random_array((2, 20, 6, 7), low=-1, high=1, seed=5)
    w = random_array((18, 20, 3, 3), low=-1, high=1, seed=6)
    dy = random_array((2, 18, 6, 7), low=-1, high=1, seed=7)
    first = conv.conv2d_backward(dy, x, w, (1, 1), (1, 1), (1, 1))
    again = conv.conv2d_backward(dy, x, w, (1, 1), (1, 1), (1, 1))
    for a, b in zip(first, again):
        assert torch.equal(a, b)


@pytest.mark.parametrize("split", [1, 3])
def test_conv2d_backward_writes_into_given_buffers(split, monkeypatch):
    """dw_out / db_out (an optimizer's flat gradient buffer): the gradients are written there
    and returned as those arrays, the same bits as into new arrays, whether db follows dw or
    lies apart (the split sum writes both in one launch); the reference backend agrees; a
    buffer of the wrong shape, dtype or layout is a clear error."""
    knobs(dw_split=split)
    x = random_array((2, 20, 6, 7), low=-1, high=1, seed=5)
    w = random_array((18, 20, 3, 3), low=-1, high=1, seed=6)
    dy = random_array((2, 18, 6, 7), low=-1, high=1, seed=7)
    geometry = (1, 1), (1, 1), (1, 1), 1, True, True, True, None
    want = conv.conv2d_backward(dy, x, w, *geometry)
    for gap in (0, 5, 0):  # (the third call replays the first's plan on other memory)
        flat = torch.full((w.numel() + gap + 18 + 3,), float("nan"))
        dw_out, db_out = flat[:w.numel()].view(w.shape), flat[w.numel() + gap:][:18]
        got = conv.conv2d_backward(dy, x, w, *geometry, dw_out, db_out)
        assert got[1] is dw_out and got[2] is db_out
        for a, b in zip(got, want):
            assert torch.equal(a, b)
        assert torch.isnan(flat[w.numel():w.numel() + gap]).all() and torch.isnan(flat[-3:]).all()
    ref = NumpyBackend()
    dw_ref, db_ref = torch.empty(w.shape), torch.empty(18)
    got = ref.conv2d_backward(dy, x, w, *geometry, dw_ref, db_ref)
    assert got[1] is dw_ref and got[2] is db_ref
    assert_close(dw_ref, want[1], 1e-4, 1e-5)
    assert_close(db_ref, want[2], 1e-4, 1e-5)
    for backend in (conv, ref):
        with pytest.raises(ValueError, match=r"dw_out must be a contiguous \(18, 20, 3, 3\)"):
            backend.conv2d_backward(dy, x, w, *geometry, torch.empty(18, 20, 9), None)
        with pytest.raises(ValueError, match="db_out must be a contiguous"):
            backend.conv2d_backward(dy, x, w, *geometry, None, torch.empty(36)[::2])


@pytest.mark.parametrize("pack, channels_last", [(False, False), (True, True)])
def test_conv2d_operand_layouts(pack, channels_last, monkeypatch):
    """The implicit GEMM with the weights read in place or packed K-major, and the gathered
    source read NCHW or copied channels-last first (strided x and dy included)."""
    knobs(algo="implicit")
    knobs(window_gemm=False)
    knobs(pack_weights=pack)
    knobs(channels_last=channels_last)
    _check_conv(2, 16, 5, 6, 17, 3, stride=(1, 2), padding=1, dilation=1)
    _check_conv(1, 32, 4, 4, 16, 2, stride=2, padding=0, dilation=2, groups=2, bias=False)
    ref = NumpyBackend()
    x = random_array((2, 5, 6, 16), low=-1, high=1).permute(0, 3, 1, 2)  # [2, 16, 5, 6]
    w = random_array((16, 16, 3, 3), low=-1, high=1, seed=1)
    dy = random_array((2, 5, 6, 16), low=-1, high=1, seed=2).permute(0, 3, 1, 2)
    got = conv.conv2d_backward(dy, x, w, (1, 1), (1, 1), (1, 1))
    want = ref.conv2d_backward(dy.double(), x.double(), w.double(), (1, 1), (1, 1), (1, 1))
    for name, g, e in zip(("dx", "dw", "db"), got, want):
        assert_close(g, e, 1e-4, 1e-5, name=name)


def test_conv2d_weight_grad_rows_wider_than_a_block(monkeypatch):
    """Output rows wider than the weight gradient's pixel block: rows split in column blocks."""
    knobs(algo="implicit")
    knobs(dw_split=2)
    _check_conv(1, 2, 3, 70, 3, 3, stride=1, padding=1, dilation=1, grads=(False, True, True))


def test_conv2d_mnist_like_first_layer(algo, monkeypatch):
    """C_in = 1, k5 p2 (K = 25 fits one tile) with the batch split across programs."""
    knobs(dw_split=2)
    _check_conv(3, 1, 12, 12, 8, 5, stride=1, padding=2, dilation=1)


def test_conv2d_large_spatial(algo):
    _check_conv(1, 2, 32, 29, 3, 7, stride=3, padding=3, dilation=1, bias=False)


def test_conv2d_groups(monkeypatch):
    knobs(dw_split=2)  # per-group dw and db sums
    _check_conv(2, 6, 5, 5, 4, 3, stride=1, padding=1, dilation=1, groups=2)
    _check_conv(1, 4, 6, 6, 8, 2, stride=2, padding=0, dilation=2, groups=4, bias=False)


def test_conv2d_strided_operands(algo):
    """Transposed x, a sliced weight and a stride-0 (expanded) dy are read in place."""
    ref = NumpyBackend()
    x = random_array((2, 6, 5, 3), low=-1, high=1).permute(0, 3, 1, 2)  # [2, 3, 6, 5]
    w = random_array((4, 3, 3, 5), low=-1, high=1, seed=1)[:, :, :, 1:4]
    b = random_array((8,), seed=2)[::2]
    y = conv.conv2d(x, w, b, (1, 2), (1, 1), (1, 1))
    assert y.is_contiguous()
    widen = lambda t: t.double()  # noqa: E731
    assert_close(y, ref.conv2d(widen(x), widen(w), widen(b), (1, 2), (1, 1), (1, 1)), 1e-4, 1e-5)
    dy = random_array((1, 4, 1, 1), low=-1, high=1, seed=3).expand(*y.shape)
    got = conv.conv2d_backward(dy, x, w, (1, 2), (1, 1), (1, 1))
    want = ref.conv2d_backward(widen(dy), widen(x), widen(w), (1, 2), (1, 1), (1, 1))
    for name, g, e in zip(("dx", "dw", "db"), got, want):
        assert_close(g, e, 1e-4, 1e-5, name=name)


@pytest.mark.parametrize("dtype", [td.float16, td.bfloat16])
def test_conv2d_half_precision(algo, dtype):
    """float16 / bfloat16 in and out, float32 accumulation: one rounding of the result."""
    rtol = {"float16": 5e-3, "bfloat16": 3e-2}[dtype.name]
    _check_conv(2, 3, 6, 6, 4, 3, stride=1, padding=1, dilation=1, dtype=dtype, rtol=rtol,
                atol=rtol)


def test_conv_precision_selects_the_dot_input_precision(monkeypatch):
    # TF32 by default, as PyTorch's cuDNN convolutions (torch.backends.cudnn.allow_tf32);
    # float32 accuracy as 3xTF32, or the FMA path when asked (TRITONAD_CONV_IEEE=1)
    def dot(dtype):
        return conv.dot_precision(dtype, conv.call_precision())

    assert td.conv_precision() == "high" and dot(torch.float32) == "tf32"
    try:
        td.set_conv_precision("highest")
        assert dot(torch.float32) == "tf32x3"
        assert dot(torch.float16) == "tf32"  # (half types: their own tensor cores)
        _check_conv(1, 2, 5, 5, 3, 3, stride=1, padding=1, dilation=1, rtol=1e-3, atol=1e-3)
        monkeypatch.setattr(conv_settings, "IEEE", True)
        assert conv.call_precision() == "ieee" and dot(torch.float32) == "ieee"
        _check_conv(1, 2, 5, 5, 3, 3, stride=1, padding=1, dilation=1, rtol=1e-3, atol=1e-3)
    finally:
        td.set_conv_precision("high")


def test_split_tf32_heads_and_tails():
    """The 3xTF32 weight gradient's pre-split: head = x rounded to TF32 (low 13 bits zero, to
    the nearest), head + tail = x exactly, from a strided source."""
    x = random_array((3, 4, 5, 6), low=-1e3, high=1e3, seed=3).permute(0, 2, 1, 3)
    head = tf32.split_tf32(x)
    tail = head.flatten().as_strided(head.shape, head.stride(), head.numel())
    assert head.is_contiguous() and tail.is_contiguous()
    bits = to_numpy(head).view(np.uint32)
    assert not (bits & 0x1FFF).any()
    xs = np.ascontiguousarray(to_numpy(x))
    assert np.array_equal(to_numpy(head) + to_numpy(tail), xs)
    assert (np.abs(to_numpy(tail)) <= np.abs(xs) * 2.0 ** -11).all()


@pytest.mark.parametrize("layout", ["contiguous", "channels-last", "sliced", "long planes"])
@pytest.mark.parametrize("splits", [1, 4, 40])
def test_bias_grad_partials_per_split(layout, splits):
    """The bias gradient's partials (sums.channel_sums): row s is dy's float32 sum over split s's
    even share of the images, from any layout of dy, with planes shorter and longer than a
    load; splits past the last image hold zeros; bias_grad's fixed-order sum of them
    matches float64 and repeats bit for bit, and is zero for no images."""
    base = random_array((11, 7, 17, 19), low=-1, high=1, seed=4)
    dy = {"contiguous": base, "channels-last": base.permute(0, 2, 3, 1).contiguous()
          .permute(0, 3, 1, 2), "sliced": base[:, 1:6, :, ::2],
          "long planes": random_array((3, 2, 70, 65), low=-1, high=1, seed=5)}[layout]
    n, co, h, w = dy.shape
    part = sums.channel_sums(dy, conv.current_settings(), torch.full((splits, co), float("nan")))
    values = to_numpy(dy).astype(np.float64).sum(axis=(2, 3))  # [N, Co]
    share = -(-n // splits)
    for s in range(splits):
        assert_close(part[s], values[s * share:(s + 1) * share].sum(axis=0), 1e-6, 1e-5)
    db = sums.bias_grad(dy, torch.empty(co), conv.current_settings())
    assert_close(db, values.sum(axis=0), 1e-6, 1e-5)
    s = conv.current_settings()
    assert torch.equal(sums.bias_grad(dy, torch.empty(co), s), db)
    assert torch.equal(sums.bias_grad(dy[:0], torch.full((co,), float("nan")), s), torch.zeros(co))


@pytest.mark.parametrize("n, co, plane", [(256, 256, 196), (256, 128, 784), (256, 64, 3136),
                                          (100, 64, 196), (100, 32, 784), (4096, 16, 9),
                                          (3, 5, 7)])
def test_channel_sum_blocks_fill_the_gpu(n, co, plane, monkeypatch):
    """The bias gradient's partial-sum pass on 132 SMs: CHANNEL_SUM_PROGRAMS programs an SM
    (or a split an image), each at most CHANNEL_SUM_LOADS loads of about CHANNEL_SUM_TILE
    elements (or one image's plane), and channels packed a program only while their run is at
    most CHANNEL_SUM_RUN."""
    _fake_sms(monkeypatch, 132)
    s = conv.current_settings()
    splits, block_c, block_n, block_e = sums.channel_sum_blocks(n, co, plane, "cuda", s)
    programs = -(-co // block_c) * splits
    assert programs >= s.channel_sum_programs * 132 or splits == n
    assert block_c == 1 or block_c * plane <= s.channel_sum_run
    assert block_n * block_e <= s.channel_sum_tile and block_e >= min(block_c * plane, 4096)
    loads = -(-(-(-n // splits)) // block_n) * -(-block_c * plane // block_e)
    assert loads <= max(s.channel_sum_loads, -(-plane // block_e)), loads


def test_sum_splits_two_sums_in_one_launch():
    """_sum_splits: the fixed-order sum over the leading axis of strided partials, and a second
    sum of another split count and shape in the same launch (a weight gradient's and its bias
    gradient's partials); either may be empty; the same bits on every run."""
    part = random_array((6, 9, 5), low=-1, high=1, seed=7).permute(0, 2, 1)  # [6, 5, 9]
    part2 = random_array((70, 3), low=-1, high=1, seed=8)[:, None, :]       # [70, 1, 3]
    out, out2 = torch.full((5, 9), float("nan")), torch.full((1, 3), float("nan"))
    conv.sum_splits(part, out, part2, out2)
    assert_close(out, to_numpy(part).astype(np.float64).sum(0), 1e-6, 1e-6)
    assert_close(out2, to_numpy(part2).astype(np.float64).sum(0), 1e-6, 1e-6)
    again, again2 = torch.empty(5, 9), torch.empty(1, 3)
    conv.sum_splits(part, again, part2, again2)
    assert torch.equal(again, out) and torch.equal(again2, out2)
    alone = torch.full((1, 3), float("nan"))
    conv.sum_splits(part[:, :0], torch.empty(0, 9), part2, alone)  # (the first sum empty)
    assert torch.equal(alone, out2)
    single = torch.full((5, 9), float("nan"))
    conv.sum_splits(part, single)
    assert torch.equal(single, out)


@pytest.mark.parametrize("presplit", [True, False])
def test_weight_grad_at_float32_accuracy(presplit, monkeypatch):
    """3xTF32 weight gradient, operands pre-split or split by tl.dot: strided dy and x,
    groups, split-K, the bias gradient beside it."""
    knobs(dw_presplit=presplit)
    knobs(dw_split=2)
    x = random_array((2, 6, 5, 32), low=-1, high=1, seed=8).permute(0, 3, 1, 2)  # [2, 32, 6, 5]
    w = random_array((20, 16, 3, 3), low=-1, high=1, seed=9)
    dy = random_array((2, 3, 20, 3), low=-1, high=1, seed=10).permute(0, 2, 1, 3)  # [2, 20, 3, 3]
    args = ((2, 2), (1, 1), (1, 1), 2)
    try:
        td.set_conv_precision("highest")
        _, dw, db = conv.conv2d_backward(dy, x, w, *args, input_grad=False)
    finally:
        td.set_conv_precision("high")
    xs, ws = (torch.from_numpy(to_numpy(t)).double().requires_grad_() for t in (x, w))
    bs = torch.zeros(20, dtype=torch.float64, requires_grad=True)
    torch.nn.functional.conv2d(xs, ws, bs, *args).backward(torch.from_numpy(to_numpy(dy)).double())
    assert_close(to_numpy(dw), ws.grad.numpy(), rtol=1e-5, atol=1e-5)
    assert_close(to_numpy(db), bs.grad.numpy(), rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------- Winograd


@pytest.fixture
def winograd_calls(monkeypatch):
    """Float32 accuracy with Winograd's F(4x4, 3x3) from 1 channel (the GPU takes it from 128);
    yields the names of the Winograd kernels launched, so that a test sees the path ran."""
    knobs(winograd_min_channels=1)
    knobs(winograd_wgrad_min_tiles=1)  # (its dw rules: tested apart)
    knobs(winograd_wgrad_fill=False)
    seen = []
    real = winograd.run

    def spy(kernel, grid, *args, **meta):
        seen.append(kernel.__name__ if hasattr(kernel, "__name__") else kernel.fn.__name__)
        return real(kernel, grid, *args, **meta)

    monkeypatch.setattr(winograd, "run", spy)
    td.set_conv_precision("highest")
    try:
        yield seen
    finally:
        td.set_conv_precision("high")


# Winograd's transforms spread an element's rounding over its tile (coefficients up to 8 and
# 1/24): like the DFT path's, its error is bounded norm-wise, not element-wise. Measured under
# the interpreter: at most 1.2e-6 of the largest sum of |terms| (torch in float64 as the truth).
WINOGRAD_TOL = 1e-5


def _f64_conv_grads(x, w, b, dy, groups=1):
    """torch's float64 3x3 padding-1 convolution and its gradients, on the arrays' device."""
    xs, ws, bs = (t.detach().double().requires_grad_() for t in (x, w, b))
    y = torch.nn.functional.conv2d(xs, ws, bs, 1, 1, 1, groups)
    y.backward(dy.double())
    return [y.detach(), xs.grad, ws.grad, bs.grad]


def _check_winograd(x, w, b, dy, groups=1, relu=False, dw_out=None, db_out=None):
    """conv2d (+ relu) and conv2d_backward (gated by relu' where relu) against float64 torch,
    norm-wise (WINOGRAD_TOL of the largest sum of |terms| behind an element)."""
    args = ((1, 1), (1, 1), (1, 1), groups)
    y = conv.conv2d(x, w, b, *args, "relu" if relu else None)
    got = (y,) + conv.conv2d_backward(dy, x, w, *args, gate=y if relu else None,
                                      dw_out=dw_out, db_out=db_out)
    want = _f64_conv_grads(x, w, b, dy, groups)
    if relu:
        want = [want[0].clamp_min(0)] + _f64_conv_grads(x, w, b, torch.where(y > 0, dy, 0.0),
                                                        groups)[1:]
    scale = _f64_conv_grads(x.abs(), w.abs(), b.abs(), dy.abs(), groups)
    for part, g, e, s in zip(("y", "dx", "dw", "db"), got, want, scale):
        assert tuple(g.shape) == tuple(e.shape), part
        error = float((g.double() - e).abs().max() / s.max().clamp_min(1e-30))
        assert error < WINOGRAD_TOL, (part, error)
    return got


@given(data=st.data())
@settings(max_examples=6)
def test_winograd_conv_matches_reference(data, winograd_calls):
    """3x3, stride 1, padding 1 by Winograd: planes not a multiple of the 4x4 tiles (down to
    one pixel), channel counts from 8 (below, the input gradient takes the im2col path);
    forward, input, weight and bias gradients against float64."""
    n, c, co = (data.draw(st.sampled_from(v), name) for v, name in
                (([1, 3], "n"), ([8, 9], "c"), ([8, 17], "co")))
    h, w = data.draw(st.sampled_from([1, 3, 4, 6, 9]), "h"), data.draw(st.sampled_from(
        [1, 2, 5, 8, 11]), "w")
    seed = data.draw(st.integers(0, 100), "seed")
    _check_winograd(random_array((n, c, h, w), low=-1, high=1, seed=seed),
                    random_array((co, c, 3, 3), low=-1, high=1, seed=seed + 1),
                    random_array((co,), seed=seed + 2),
                    random_array((n, co, h, w), low=-1, high=1, seed=seed + 3))
    assert {"_input_transform_kernel", "_weight_transform_kernel", "_output_transform_kernel",
            "_grad_transform_kernel", "_weight_output_kernel"} <= set(winograd_calls)


def test_winograd_conv_relu_strided_operands_and_groups(winograd_calls):
    """The fused relu and its gated backward, operands read in place through their strides (a
    transposed x, a transposed and sliced weight, a strided bias, an expanded dy), two groups,
    and dw / db written into given buffers."""
    x = random_array((2, 7, 5, 16), low=-1, high=1).permute(0, 3, 1, 2)       # [2, 16, 7, 5]
    w = random_array((16, 12, 3, 4), low=-1, high=1, seed=1).transpose(0, 1)[:, :, :, 1:]
    b = random_array((24,), seed=2)[::2]
    dy = random_array((2, 12, 1, 5), low=-1, high=1, seed=3).expand(2, 12, 7, 5)
    for groups in (1, 2):
        wg = w[:, :16 // groups]
        dw, db = torch.full(wg.shape, np.nan), torch.full((12,), np.nan)
        y, _, dw_got, db_got = _check_winograd(x, wg, b, dy, groups, relu=True, dw_out=dw,
                                               db_out=db)
        assert (to_numpy(y) == 0).any() and (to_numpy(y) > 0).any()
        assert dw_got is dw and db_got is db
    assert winograd_calls.count("_grad_transform_kernel") == 3  # one a group


def test_winograd_weight_gradient_slices_sum_in_a_fixed_order(winograd_calls, monkeypatch):
    """The weight gradient's reduction over tiles cut into slices (the products' split-K):
    the same dw as one slice, to float32 accuracy, and bit for bit from run to run."""
    x = random_array((5, 9, 8, 8), low=-1, high=1, seed=4)
    w = random_array((10, 9, 3, 3), low=-1, high=1, seed=5)
    dy = random_array((5, 10, 8, 8), low=-1, high=1, seed=6)
    dws = []
    # (the interpreter counts 1 SM: 144 programs over 36 products a slice ask for 4 slices, of
    # 5 of the 20 tiles each)
    for programs in (1, 144, 144):
        knobs(winograd_split_programs=programs, winograd_min_slice_tiles=1)
        dws.append(conv.conv2d_backward(dy, x, w, (1, 1), (1, 1), (1, 1), input_grad=False,
                                        bias_grad=False)[1])
    assert torch.equal(dws[1], dws[2])
    assert not torch.equal(dws[0], dws[1])  # (another order of the sums: it did split)
    b = torch.zeros(10)
    want = _f64_conv_grads(x, w, b, dy)[2]
    scale = _f64_conv_grads(x.abs(), w.abs(), b, dy.abs())[2]
    for dw in dws:
        assert float((dw.double() - want).abs().max() / scale.max()) < WINOGRAD_TOL


def test_winograd_runs_large_batches_in_chunks(winograd_calls, monkeypatch):
    """A batch whose transformed operands pass winograd_max_bytes runs in chunks of images
    (here 2 + 2 + 1): the same y, dx, dw and db to float32 accuracy, dw and db summed over
    the chunks in a fixed order."""
    x = random_array((5, 9, 6, 7), low=-1, high=1, seed=11)
    w = random_array((10, 9, 3, 3), low=-1, high=1, seed=12)
    b = random_array((10,), seed=13)
    dy = random_array((5, 10, 6, 7), low=-1, high=1, seed=14)
    per_image = 4 * 36 * 2 * 2 * (9 + 10)
    knobs(winograd_max_bytes=2 * per_image + 1)
    _check_winograd(x, w, b, dy)
    assert winograd_calls.count("_output_transform_kernel") == 6      # y and dx: 3 chunks each
    assert winograd_calls.count("_weight_transform_kernel") == 2      # once each
    assert winograd_calls.count("_weight_output_kernel") == 3


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_winograd_never_hides_a_non_finite_input(bad, winograd_calls):
    """A NaN or Inf pixel of x reaches every output whose window holds it, as in direct
    convolution; Winograd's transforms spread it over its tiles (up to 8x8 outputs, Inf as
    NaN where the transforms subtract it from itself), and no further."""
    x = random_array((1, 8, 11, 10), low=-1, high=1, seed=19)
    x[0, 3, 5, 6] = bad           # in the 6x6 window (rows and columns 3-8) of tile (1, 1)
    w = random_array((8, 8, 3, 3), low=-1, high=1, seed=20)
    y = to_numpy(conv.conv2d(x, w, None, (1, 1), (1, 1), (1, 1)))
    direct = torch.nn.functional.conv2d(x.double(), w.double(), None, 1, 1).numpy()
    assert (~np.isfinite(direct)).sum() == 8 * 9          # its 3x3 neighbourhood
    assert not np.isfinite(y[~np.isfinite(direct)]).any()
    reach = np.zeros(y.shape, bool)
    reach[:, :, 4:8, 4:8] = True                          # that tile's outputs
    assert np.isfinite(y[~reach]).all()
    assert np.abs(y[~reach] - direct[~reach]).max() < 1e-4


def test_winograd_weight_gradient_where_its_products_fill_the_gpu(winograd_calls,
                                                                   monkeypatch):
    """The weight gradient runs by Winograd from winograd_wgrad_min_tiles 4x4 tiles, where its
    36 products (times their slices) give every SM a 128x128 tile; else the direct kernels."""
    def fills(tiles, c, co, sms):
        return winograd.weight_grad_fills(tiles, c, co, sms, conv.current_settings())

    assert not fills(16 * 49, 128, 128, 132)   # 16x128x28x28: 36 products, 1 slice
    assert not fills(32 * 49, 128, 128, 132)   # 3 slices of 512 tiles: 108
    assert fills(64 * 49, 128, 128, 132)       # 6 slices: 216
    assert fills(4 * 16, 256, 256, 132)        # 144 products of one slice
    assert fills(4, 512, 512, 132)
    knobs(winograd_wgrad_min_tiles=16)
    knobs(winograd_wgrad_fill=True)   # (1 SM under the interpreter)
    x = random_array((3, 8, 5, 7), low=-1, high=1, seed=15)     # 3 x 2 x 2 = 12 tiles
    w = random_array((8, 8, 3, 3), low=-1, high=1, seed=16)
    b = random_array((8,), seed=17)
    dy = random_array((3, 8, 5, 7), low=-1, high=1, seed=18)
    _check_winograd(x, w, b, dy)
    assert "_output_transform_kernel" in winograd_calls             # forward and dx: Winograd
    assert "_weight_output_kernel" not in winograd_calls            # dw: the direct kernels


@pytest.mark.parametrize("change, runs", [
    ({}, True),
    ({"stride": (2, 1)}, False), ({"padding": (0, 0)}, False), ({"padding": (1, 2)}, False),
    ({"dilation": (2, 2)}, False), ({"kernel": (5, 5)}, False), ({"kernel": (3, 1)}, False),
    ({"precision": "high"}, False), ({"ieee": True}, False), ({"dtype": torch.float16}, False),
    ({"channels": (127, 128)}, False), ({"channels": (128, 127)}, False),
    ({"max_bytes": 1 << 19}, False), ({"off": True}, False),  # (884 kB an image)
])
def test_winograd_takes_only_its_layers(change, runs, monkeypatch):
    """winograd.applies: 3x3, stride 1, padding 1, no dilation, float32 accuracy on tensor
    cores, 128 channels or more on both sides, an image's transformed operands within
    winograd_max_bytes."""
    kh, kw = change.get("kernel", (3, 3))
    k_ch, n_ch = change.get("channels", (128, 256))
    g = conv.Geometry("conv2d", (2, k_ch, 14, 14), (n_ch, k_ch, kh, kw),
                       change.get("stride", 1), change.get("padding", 1),
                       change.get("dilation", 1), 1)
    monkeypatch.setattr(conv_settings, "IEEE", change.get("ieee", False))
    knobs(winograd=not change.get("off", False))
    knobs(winograd_max_bytes=change.get("max_bytes", 1 << 30))
    td.set_conv_precision(change.get("precision", "highest"))
    try:
        assert winograd.applies(g, k_ch, n_ch, change.get("dtype", torch.float32),
                                conv.call_precision(), conv.current_settings()) is runs
    finally:
        td.set_conv_precision("high")


def _launched(monkeypatch):
    """The kernels conv launches from now on, with their constexpr USE_TMA where given."""
    seen = []
    real = plans.run

    def spy(kernel, grid, *args, **meta):
        seen.append((getattr(kernel, "__name__", getattr(getattr(kernel, "fn", None),
                                                          "__name__", "?")),
                     meta.get("USE_TMA")))
        return real(kernel, grid, *args, **meta)

    _spy_run(monkeypatch, spy)
    return seen


def _assert_weight_grads(x, w, dy, args, tol, *results):
    """Each (dw, db) of results against float64 torch's for conv2d(x, w, b, *args) and dy:
    relative tol, absolute tol times the largest element of the float64 gradient."""
    xs, ws, dys = (torch.from_numpy(to_numpy(t).astype(np.float64)).requires_grad_()
                   for t in (x, w, dy))
    bs = torch.zeros(w.shape[0], dtype=torch.float64, requires_grad=True)
    torch.nn.functional.conv2d(xs, ws, bs, *args).backward(dys)
    for dw, db in results:
        for got, want in ((dw, ws.grad), (db, bs.grad)):
            assert_close(to_numpy(got).astype(np.float64), want.numpy(), rtol=tol,
                         atol=tol * float(want.abs().max()))


# (N, C, H, W, Co, k, splits): odd planes, channel counts that are not a tile multiple (the
# tile's rows past C read the next image's channels), several channel tiles, a plane smaller
# than one pixel step, 1x1 / 3x3 / 5x5 kernels, split-K; tiles whose columns span several taps
# (C below a tile: 16, 20, 1 channels) and tiles of one tap each (C = 128, and the 1x1 kernel)
_SHIFT_GEOMETRIES = [(2, 16, 5, 7, 24, 3, None), (3, 20, 6, 6, 40, 5, 3),
                     (2, 16, 4, 9, 136, 1, 2), (1, 16, 3, 3, 8, 3, None),
                     (1, 128, 3, 4, 8, 3, None), (2, 1, 7, 6, 12, 5, 3)]


@pytest.mark.parametrize("geometry", _SHIFT_GEOMETRIES)
@pytest.mark.parametrize("dtype, precision", [(td.float32, "highest"), (td.float32, "high"),
                                              (td.bfloat16, "high")])
@pytest.mark.parametrize("taps_below", [16, 1 << 30], ids=["tiles-by-channels", "tiles-by-taps"])
def test_flat_shift_weight_grad(geometry, dtype, precision, taps_below, monkeypatch):
    """The flat-shift weight gradient (and its fused bias gradient) against float64 torch and
    against the implicit-GEMM kernel it replaces at stride-1 "same" convolutions; at float32
    accuracy through its pre-split 3xTF32 form; with tiles of one tap's channels and with
    tiles whose columns span taps (Settings.shift_taps_below: few channels, at any count here)."""
    n, c, h, w_, co, k, splits = geometry
    knobs(dw_split=splits)
    knobs(window_wgrad=False)  # (half types: the window form else)
    knobs(batch_inner=False)  # (float32: the batch-inner form else)
    knobs(shift_taps_below=taps_below)
    x = random_array((n, c, h, w_), dtype, low=-1, high=1, seed=1)
    w = random_array((co, c, k, k), dtype, low=-1, high=1, seed=2)
    dy = random_array((n, co, h, w_), dtype, low=-1, high=1, seed=3)
    args = ((1, 1), (k // 2, k // 2), (1, 1))
    td.set_conv_precision(precision)
    try:
        seen = _launched(monkeypatch)
        _, dw, db = conv.conv2d_backward(dy, x, w, *args, input_grad=False)
        assert ("_shift_wgrad_kernel", False) in seen  # the interpreter: pointer loads
        knobs(flat_shift=False)  # (a setting: no plan of the first call)
        first = len(seen)
        _, dw_gemm, db_gemm = conv.conv2d_backward(dy, x, w, *args, input_grad=False)
        assert {name for name, _ in seen[first:]} & {"_shift_wgrad_kernel",
                                                     "_conv_wgrad_kernel"} == \
            {"_conv_wgrad_kernel"}
    finally:
        td.set_conv_precision("high")
    _assert_weight_grads(x, w, dy, args, 1e-5 if dtype == td.float32 else 2e-2,
                         (dw, db), (dw_gemm, db_gemm))


@pytest.mark.parametrize("geometry", _SHIFT_GEOMETRIES)
@pytest.mark.parametrize("precision", ["highest", "high"])
def test_flat_shift_weight_grad_from_shifted_planes(geometry, precision, monkeypatch):
    """The flat-shift weight gradient with every tile a TMA rectangle (as on Hopper): x as one
    zero-padded plane per kernel column (_shifted_planes; odd widths take a wider pitch, and
    dy with them), against float64 torch; at float32 accuracy the planes carry TF32 heads and
    tails. Also the planes themselves against a numpy construction."""
    n, c, h, w_, co, k, splits = geometry
    knobs(dw_split=splits)
    knobs(shift_taps_below=0)  # (planes: tiles of one tap)
    knobs(shift_planes_min_channels=0)  # (TF32: a rule for speed)
    knobs(batch_inner=False)
    monkeypatch.setattr(flat_shift, "uses_tma", lambda g, dy, s: True)
    seen = []
    real_run = plans.run

    def spy(kernel, grid, *args, **meta):
        seen.append((kernel.fn.__name__ if hasattr(kernel, "fn") else kernel.__name__,
                     meta.get("X_TMA")))
        return real_run(kernel, grid, *args, **meta)

    _spy_run(monkeypatch, spy)
    x = random_array((n, c, h, w_), td.float32, low=-1, high=1, seed=1)
    w = random_array((co, c, k, k), td.float32, low=-1, high=1, seed=2)
    dy = random_array((n, co, h, w_), td.float32, low=-1, high=1, seed=3)
    args = ((1, 1), (k // 2, k // 2), (1, 1))
    td.set_conv_precision(precision)
    try:
        _, dw, db = conv.conv2d_backward(dy, x, w, *args, input_grad=False)
    finally:
        td.set_conv_precision("high")
    assert ("_shift_wgrad_kernel", True) in seen
    _assert_weight_grads(x, w, dy, args, 1e-5 if precision == "highest" else 1e-2, (dw, db))

    # the planes: plane j holds x shifted left by j - pad, pad zero rows on top, zero past W
    pad, wp, hp = k // 2, -(-w_ // 4) * 4, h + k - 1
    xv = x[:, :, :, 1:] if w_ > 1 else x  # (a view: any strides)
    xn = to_numpy(xv)
    planes, lo = flat_shift.shifted_planes(xv, k, pad, pad, hp, wp, split=True)
    want = np.zeros((k, n * c, hp, wp), np.float32)
    for j in range(k):
        for q in range(min(wp, xn.shape[3])):
            if 0 <= q + j - pad < xn.shape[3]:
                want[j, :, pad:pad + h, q] = xn[:, :, :, q + j - pad].reshape(n * c, h)
    got = to_numpy(planes)
    assert lo == want.size and got.shape == (2,) + want.shape
    assert np.array_equal(got[0] + got[1], want)  # head + tail, exactly
    assert np.array_equal(got[0].view(np.uint32) & 0x1FFF, np.zeros(want.shape, np.uint32))


# (N, C, H, W, Co, k, splits): batches that are not a multiple of 4 (padded with zeros), odd
# planes, channel counts that are not a tile multiple, several channel and row tiles, 1x1,
# 3x3 and 5x5 kernels, split-K
_BATCH_INNER_GEOMETRIES = [(2, 16, 5, 7, 24, 3, None), (3, 20, 6, 6, 40, 5, 3),
                           (4, 16, 4, 9, 136, 1, 2), (1, 40, 3, 3, 8, 3, None),
                           (5, 136, 3, 4, 8, 3, 4)]


@pytest.mark.parametrize("geometry", _BATCH_INNER_GEOMETRIES)
@pytest.mark.parametrize("precision", ["highest", "high"])
def test_batch_inner_weight_grad(geometry, precision, monkeypatch):
    """The batch-inner weight gradient (float32 stride-1 "same" layers): against float64 torch
    and against the implicit-GEMM kernel, from a strided x, at float32 accuracy (copies of
    TF32 heads and tails) and TF32; and the copies themselves against numpy."""
    n, c, h, w_, co, k, splits = geometry
    knobs(dw_split=splits)
    knobs(winograd=False)
    x = random_array((n, c, h, w_ + 1), low=-1, high=1, seed=1)[..., 1:]  # (a view)
    w = random_array((co, c, k, k), low=-1, high=1, seed=2)
    dy = random_array((n, co, h, w_), low=-1, high=1, seed=3)
    args = ((1, 1), (k // 2, k // 2), (1, 1))
    td.set_conv_precision(precision)
    try:
        seen = _launched(monkeypatch)
        _, dw, db = conv.conv2d_backward(dy, x, w, *args, input_grad=False)
        assert "_batch_inner_wgrad_kernel" in {name for name, _ in seen}
        knobs(batch_inner=False)
        knobs(flat_shift=False)
        first = len(seen)
        _, dw_gemm, db_gemm = conv.conv2d_backward(dy, x, w, *args, input_grad=False)
        assert "_conv_wgrad_kernel" in {name for name, _ in seen[first:]}
    finally:
        td.set_conv_precision("high")
    _assert_weight_grads(x, w, dy, args, 1e-5 if precision == "highest" else 1e-2,
                         (dw, db), (dw_gemm, db_gemm))

    # the copies: [C, H + k - 1, W + k - 1, NB], x shifted by the padding, zeros around it
    # and past the batch; with split, TF32 heads then their tails
    pad, nb = k // 2, -(-n // 4) * 4
    got, lo, _ = batch_inner.copy(x, h + k - 1, w_ + k - 1, nb, pad, pad, split=True)
    want = np.zeros((c, h + k - 1, w_ + k - 1, nb), np.float32)
    want[:, pad:pad + h, pad:pad + w_, :n] = to_numpy(x).transpose(1, 2, 3, 0)
    got = to_numpy(got)
    assert lo == want.size and got.shape == (2,) + want.shape
    assert np.array_equal(got[0] + got[1], want)
    assert np.array_equal(got[0].view(np.uint32) & 0x1FFF, np.zeros(want.shape, np.uint32))
    # with sums: the same copy, and partial channel sums adding up to x's (the bias gradient)
    again, _, partial = batch_inner.copy(x, h + k - 1, w_ + k - 1, nb, pad, pad, True, True)
    assert np.array_equal(to_numpy(again), got)
    np.testing.assert_allclose(to_numpy(partial).astype(np.float64).sum(0),
                               to_numpy(x).astype(np.float64).sum((0, 2, 3)), rtol=1e-5)


def test_batch_inner_only_where_it_applies(monkeypatch):
    """batch_inner.applies: float32 stride-1, undilated, same-size layers at TF32 or 3xTF32
    with batch_inner_min_channels input channels, planes of at most batch_inner_max_pixels and
    copies within batch_inner_max_bytes; IEEE float32, half types, strides, dilation, "valid"
    layers, few channels and large planes keep the other kernels."""
    def takes(xs, ws, stride=1, padding=1, dilation=1, dtype=td.float32, precision="high"):
        g = conv.Geometry("t", xs, ws, stride, padding, dilation, 1)
        td.set_conv_precision(precision)
        try:
            dot = conv.dot_precision(dtype.torch, conv.call_precision())
            return batch_inner.applies(g, random_array(xs, dtype), dot, precision == "highest",
                                       conv.current_settings())
        finally:
            td.set_conv_precision("high")

    assert takes((2, 16, 6, 6), (8, 16, 3, 3))
    assert takes((3, 32, 6, 5), (8, 32, 5, 5), padding=2, precision="highest")
    assert takes((2, 16, 6, 6), (8, 16, 1, 1), padding=0)
    with monkeypatch.context() as m:
        m.setattr(conv_settings, "IEEE", True)
        assert not takes((2, 16, 6, 6), (8, 16, 3, 3), precision="highest")
    assert not takes((2, 16, 6, 6), (8, 16, 3, 3), dtype=td.bfloat16)
    assert not takes((2, 16, 6, 6), (8, 16, 3, 3), stride=2)
    assert not takes((2, 16, 6, 6), (8, 16, 3, 3), dilation=2, padding=2)
    assert not takes((2, 16, 6, 6), (8, 16, 3, 3), padding=0)
    assert not takes((2, 8, 6, 6), (8, 8, 3, 3))                    # few channels
    assert takes((1, 16, 32, 32), (8, 16, 3, 3))
    assert not takes((1, 16, 33, 32), (8, 16, 3, 3))                # a large plane
    # copies: (16 channels x 8 x 8 padded + 8 x 6 x 8 of dy) x 4 images (padded) x 4 bytes
    knobs(batch_inner_max_bytes=(16 * 8 + 8 * 6) * 8 * 4 * 4)
    assert takes((3, 16, 6, 6), (8, 16, 3, 3)) and not takes((5, 16, 6, 6), (8, 16, 3, 3))


def test_flat_shift_only_where_a_tap_is_a_flat_shift():
    """flat_shift.applies: stride-1, undilated, same-size, single-group convolutions over
    contiguous arrays, of any channel count (few channels: tiles spanning taps); everything
    else keeps the implicit-GEMM weight gradient."""
    def takes(xs, ws, stride=1, padding=1, dilation=1, groups=1, dy_view=False):
        g = conv.Geometry("t", xs, ws, stride, padding, dilation, groups)
        x = random_array(xs)
        dy = random_array((g.n, g.co, g.oh, g.ow))
        if dy_view:
            dy = random_array((g.n, g.co, g.oh, 2 * g.ow))[..., ::2]
        return flat_shift.applies(g, dy, x, conv.current_settings())

    assert takes((2, 16, 6, 6), (8, 16, 3, 3))
    assert takes((2, 32, 6, 5), (8, 32, 5, 5), padding=2)
    assert takes((2, 16, 6, 6), (8, 16, 1, 1), padding=0)
    assert not takes((2, 16, 6, 6), (8, 16, 3, 3), stride=2)
    assert not takes((2, 16, 6, 6), (8, 16, 3, 3), dilation=2, padding=2)
    assert not takes((2, 16, 6, 6), (8, 16, 3, 3), padding=0)       # "valid": the plane shrinks
    assert not takes((2, 16, 6, 6), (8, 8, 3, 3), groups=2)
    assert takes((2, 8, 6, 6), (8, 8, 3, 3))                        # few channels
    assert takes((2, 1, 6, 6), (8, 1, 5, 5), padding=2)             # one (MNIST conv1)
    assert not takes((2, 16, 6, 6), (8, 16, 3, 3), dy_view=True)    # not contiguous


# (x shape, weight shape, padding, dilation, groups, x channels-last?): symmetric and unequal
# padding, none, dilation, a 1x1 kernel, channel counts that are not a multiple of 16 (rows
# padded) and above one tile of output channels (two column tiles), groups (strided views of
# x, w and y), a channels-last x
_WINDOW_GEOMETRIES = [
    ((2, 16, 6, 7), (18, 16, 3, 3), (1, 1), (1, 1), 1, False),
    ((2, 20, 5, 5), (17, 20, 5, 5), (2, 1), (1, 1), 1, True),
    ((1, 24, 7, 9), (130, 24, 3, 1), (0, 0), (1, 1), 1, False),
    ((2, 16, 8, 8), (16, 16, 3, 3), (2, 1), (2, 1), 1, False),
    ((1, 48, 4, 5), (20, 48, 1, 1), (0, 0), (1, 1), 1, False),
    ((2, 32, 5, 6), (32, 16, 3, 3), (1, 1), (1, 1), 2, False),
]


@pytest.mark.parametrize("geometry", _WINDOW_GEOMETRIES)
@pytest.mark.parametrize("dtype, precision", [(td.float32, "highest"), (td.float32, "high"),
                                              (td.bfloat16, "high")])
def test_window_gemm(geometry, dtype, precision, monkeypatch):
    """The window GEMM's forward (with bias and relu) and input gradient against float64 torch
    and against the implicit-GEMM kernel it replaces; at float32 accuracy with pre-split
    operands (3xTF32) and with tl.dot's own split."""
    xs, ws, pad, dil, groups, channels_last = geometry
    x = random_array(xs, dtype, low=-1, high=1, seed=1)
    if channels_last:
        x = random_array((xs[0], xs[2], xs[3], xs[1]), dtype, low=-1, high=1,
                         seed=1).permute(0, 3, 1, 2)
    w = random_array(ws, dtype, low=-1, high=1, seed=2)
    b = random_array((ws[0],), dtype, low=-1, high=1, seed=3)
    g = conv.Geometry("t", xs, ws, 1, pad, dil, groups)
    dy = random_array((g.n, g.co, g.oh, g.ow), dtype, low=-1, high=1, seed=4)
    args = ((1, 1), pad, dil, groups)
    results = {}
    knobs(window_x3_min=16)  # (3xTF32 takes it from 64 channels)
    td.set_conv_precision(precision)
    try:
        for window, presplit in ((True, True), (True, False), (False, True)):
            knobs(window_gemm=window)
            knobs(window_presplit=presplit)
            seen = _launched(monkeypatch)
            y = conv.conv2d(x, w, b, *args, activation="relu")
            dx, _, _ = conv.conv2d_backward(dy, x, w, *args, weight_grad=False,
                                            bias_grad=False)
            assert [n for n, _ in seen].count("_window_gemm_kernel") == 2 * groups * window
            results[window, presplit] = (y, dx)
    finally:
        td.set_conv_precision("high")
    xd, wd, bd, dyd = (torch.from_numpy(to_numpy(t).astype(np.float64)).requires_grad_()
                       for t in (x, w, b, dy))
    want_y = torch.nn.functional.conv2d(xd, wd, bd, *args)
    want_y.backward(dyd)
    tol = 1e-5 if dtype == td.float32 else 2e-2
    for got_y, got_dx in results.values():
        for got, want in ((got_y, want_y.detach().clamp_min(0)), (got_dx, xd.grad)):
            assert got.dtype == dtype.torch
            assert_close(to_numpy(got).astype(np.float64), want.numpy(), rtol=tol,
                         atol=tol * float(want.abs().max()))


@pytest.mark.parametrize("sms, grid", [(1, 12), (5, 14), (7, 12), (8, 16), (100, 24)])
def test_window_gemm_split_tail(sms, grid, monkeypatch):
    """Where the last wave of large tiles would fill at most half of the SMs, its tiles run as
    two half-wide tiles each: 12 tiles (6 pixel blocks by 2 channel blocks) on 5 SMs split
    the last 2, on 8 the last 4 (half the SMs), on 100 all 12, on 7 none (5 left: more than
    half), nor on 1. The forward (bias, relu) and input gradient match the unsplit launch."""
    from tritonad.kernels.plans import clear_plans

    _fake_sms(monkeypatch, sms)
    x = random_array((3, 16, 9, 10), low=-1, high=1, seed=1)
    w = random_array((130, 16, 3, 3), low=-1, high=1, seed=2)
    b = random_array((130,), low=-1, high=1, seed=3)
    dy = random_array((3, 130, 9, 10), low=-1, high=1, seed=4)
    grids = []
    real = plans.run

    def spy(kernel, grid, *args, **meta):
        if kernel is window._window_gemm_kernel:
            grids.append(grid[0])
        return real(kernel, grid, *args, **meta)

    _spy_run(monkeypatch, spy)
    results = []
    for tail_tile in (64 * 128, 1 << 40):  # (the interpreter's tiles: 64 x 128)
        knobs(window_tail_tile=tail_tile)
        clear_plans()  # (a call's recorded launches would replay the first grid)
        y = conv.conv2d(x, w, b, (1, 1), (1, 1), activation="relu")
        results.append((y, conv.conv2d_backward(dy, x, w, (1, 1), (1, 1), weight_grad=False,
                                                bias_grad=False)[0]))
    assert grids[0] == grid and grids[2] == 12  # (the forward's; unsplit: one a tile)
    for got, want in zip(results[0], results[1]):
        assert_close(to_numpy(got), to_numpy(want), rtol=1e-6, atol=1e-6)
    clear_plans()


@pytest.mark.parametrize("sms, persist, grid", [(6, 1, 6), (6, 2, 12), (7, 2, 14),
                                                (100, 1, 28), (1, 3, 3)])
def test_window_gemm_persistent(sms, persist, grid, monkeypatch):
    """A persistent plan (PERSIST programs an SM, each taking tiles, then half tiles, in turn)
    runs min(work units, PERSIST * SMs) programs: the forward's 14 tiles on 6 SMs are 12 full
    tiles and 4 half tiles (16 units), on 7 SMs 14 tiles, on 100 SMs 28 halves (the last of
    them with outputs in it). The forward (bias, relu) and input gradient are the
    one-program-a-tile launch's, bit for bit."""
    from tritonad.kernels.plans import clear_plans

    _fake_sms(monkeypatch, sms)
    knobs(window_tail_tile=64 * 128)  # (the interpreter's tiles)
    # (data of its own, persistent first: a tile left out must not find this case's numbers
    # in a reused buffer)
    seed = 10 * (10 * sms + persist)
    x = random_array((3, 16, 9, 13), low=-1, high=1, seed=seed + 1)
    w = random_array((130, 16, 3, 3), low=-1, high=1, seed=seed + 2)
    b = random_array((130,), low=-1, high=1, seed=seed + 3)
    dy = random_array((3, 130, 9, 13), low=-1, high=1, seed=seed + 4)
    grids, real, configs = [], plans.run, window.configs

    def spy(kernel, grid, *args, **meta):
        if kernel is window._window_gemm_kernel:
            grids.append((grid[0], meta.get("PERSIST", 0)))
        return real(kernel, grid, *args, **meta)

    _spy_run(monkeypatch, spy)
    results = []
    for p in (persist, 0):
        monkeypatch.setattr(window, "configs", lambda *a: [
            triton.Config({**c.kwargs, **({"PERSIST": p} if p else {})}, num_warps=c.num_warps,
                          num_stages=c.num_stages) for c in configs(*a)])
        clear_plans()  # (a call's recorded launches would replay the first plan)
        y = conv.conv2d(x, w, b, (1, 1), (1, 1), activation="relu")
        results.append((y, conv.conv2d_backward(dy, x, w, (1, 1), (1, 1), weight_grad=False,
                                                bias_grad=False)[0]))
    clear_plans()
    # (the input gradient's 16 channels make small tiles: no split, one unit a tile)
    assert grids[0] == (grid, persist) and grids[2][1] == grids[3][1] == 0, grids
    assert grids[1] == (min(grids[3][0], persist * sms), persist), grids
    for got, want in zip(results[0], results[1]):
        assert np.array_equal(to_numpy(got), to_numpy(want))


@pytest.mark.parametrize("geometry", _WINDOW_GEOMETRIES)
def test_window_weight_grad(geometry, monkeypatch):
    """The half-precision window weight gradient (and its fused bias gradient, split-K in two)
    against float64 torch and against the kernels it replaces."""
    xs, ws, pad, dil, groups, channels_last = geometry
    knobs(dw_split=2)
    x = random_array(xs, td.bfloat16, low=-1, high=1, seed=1)
    if channels_last:
        x = random_array((xs[0], xs[2], xs[3], xs[1]), td.bfloat16, low=-1, high=1,
                         seed=1).permute(0, 3, 1, 2)
    w = random_array(ws, td.bfloat16, low=-1, high=1, seed=2)
    g = conv.Geometry("t", xs, ws, 1, pad, dil, groups)
    dy = random_array((g.n, g.co, g.oh, g.ow), td.bfloat16, low=-1, high=1, seed=4)
    args = ((1, 1), pad, dil, groups)
    results = []
    for window in (True, False):
        knobs(window_wgrad=window)
        seen = _launched(monkeypatch)
        results.append(conv.conv2d_backward(dy, x, w, *args, input_grad=False)[1:])
        wanted = window and g.co // groups >= 16
        assert ("_window_wgrad_kernel" in [n for n, _ in seen]) == wanted
    xd, wd, dyd = (torch.from_numpy(to_numpy(t).astype(np.float64)).requires_grad_()
                   for t in (x, w, dy))
    bd = torch.zeros(ws[0], dtype=torch.float64, requires_grad=True)
    torch.nn.functional.conv2d(xd, wd, bd, *args).backward(dyd)
    for dw, db in results:
        for got, want in ((dw, wd.grad), (db, bd.grad)):
            assert got.dtype == torch.bfloat16
            assert_close(to_numpy(got).astype(np.float64), want.numpy(), rtol=2e-2,
                         atol=2e-2 * float(want.abs().max()))


@pytest.mark.parametrize("programs, splits", [(1, 1), (3, 2), (40, 3)])
def test_window_weight_grad_sums_db_in_its_launch(programs, splits, monkeypatch):
    """The window weight gradient's launch sums the bias gradient in programs of its own
    ahead of the GEMM's (any count of them: past dy's row blocks some sum nothing), with no
    pass of its own: db against float64 torch, dw unchanged by them, and asked for with the
    input gradient (another copy of dy, rows shifted) the same bits."""
    knobs(dw_split=splits)
    knobs(window_db_programs=programs)
    xs, ws = (2, 16, 9, 10), (130, 16, 3, 3)  # (two column blocks of db's tiles, 7 row blocks)
    x = random_array(xs, td.bfloat16, low=-1, high=1, seed=1)
    w = random_array(ws, td.bfloat16, low=-1, high=1, seed=2)
    dy = random_array((2, 130, 9, 10), td.bfloat16, low=-1, high=1, seed=4)
    args = ((1, 1), (1, 1), (1, 1), 1)
    seen = _launched(monkeypatch)
    _, dw, db = conv.conv2d_backward(dy, x, w, *args, input_grad=False)
    names = [name for name, _ in seen]
    assert "_window_wgrad_kernel" in names and "_channel_sum_kernel" not in names, names
    _, dw_alone, _ = conv.conv2d_backward(dy, x, w, *args, input_grad=False, bias_grad=False)
    assert np.array_equal(to_numpy(dw), to_numpy(dw_alone))
    _, dw_both, db_both = conv.conv2d_backward(dy, x, w, *args)
    assert np.array_equal(to_numpy(db_both), to_numpy(db))
    assert np.array_equal(to_numpy(dw_both), to_numpy(dw))
    want = to_numpy(dy).astype(np.float64).sum(axis=(0, 2, 3))
    assert_close(to_numpy(db).astype(np.float64), want, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("geometry", _WINDOW_GEOMETRIES)
def test_window_weight_grad_reads_the_input_gradients_copy(geometry, monkeypatch):
    """Asked for both, the half-precision window weight gradient reads the input gradient's
    padded copy of dy (the same plane, dy at another corner: rows shifted) and copies only x;
    the gradients are those of separate calls, bit for bit."""
    xs, ws, pad, dil, groups, _ = geometry
    x = random_array(xs, td.bfloat16, low=-1, high=1, seed=1)
    w = random_array(ws, td.bfloat16, low=-1, high=1, seed=2)
    g = conv.Geometry("t", xs, ws, 1, pad, dil, groups)
    dy = random_array((g.n, g.co, g.oh, g.ow), td.bfloat16, low=-1, high=1, seed=4)
    args = ((1, 1), pad, dil, groups)
    copies, real = [], layout.padded_channels_last

    def spy(*c, **kw):
        copies.append(len(c))
        return real(*c, **kw)

    monkeypatch.setattr(window, "padded_channels_last", spy)
    both = conv.conv2d_backward(dy, x, w, *args)
    windowed = g.co // groups >= 16  # (else not the window weight gradient)
    assert copies == [1, 1] * groups + [1 if windowed else 2] * groups * windowed, copies
    alone = (conv.conv2d_backward(dy, x, w, *args, weight_grad=False, bias_grad=False)[0],
             *conv.conv2d_backward(dy, x, w, *args, input_grad=False)[1:])
    for got, want in zip(both, alone):
        assert np.array_equal(to_numpy(got), to_numpy(want))


def test_window_menus_by_channel_count(monkeypatch):
    """The window GEMM's first plan (the one taken untuned) by output channels: at float32
    accuracy one warpgroup's 64-wide tile, two programs an SM, at every channel count;
    256-wide tiles first from 256 channels (TF32); persistent plans first from 128 channels
    at TF32 and half precision. The weight gradient's by tile."""
    monkeypatch.setattr(window, "INTERPRET", False)  # (the interpreter has a menu of one)

    def first(n_ch, kind):
        config = window.configs(n_ch, 64, kind)[0]
        return config.kwargs["BLOCK_M"], config.kwargs["BLOCK_N"], config.num_warps

    assert first(32, "tf32x3") == (128, 32, 4) and first(64, "tf32x3") == (128, 64, 4)
    assert first(96, "tf32x3") == (128, 64, 4) and first(300, "tf32x3") == (128, 64, 4)
    assert first(64, "tf32") == (128, 64, 8) and first(256, "tf32") == (128, 256, 8)
    assert first(128, "half") == (128, 128, 4)
    persist = {(n_ch, kind): window.configs(n_ch, 64, kind)[0].kwargs.get("PERSIST", 0)
               for n_ch in (32, 64, 128, 256) for kind in ("tf32", "half", "tf32x3")}
    # persistent from 128 channels at TF32 and half precision: one program an SM of 128x256
    # tiles, two of 128x128; at float32 accuracy two of 128x64 at every count
    assert persist == {(n, k): {128: 2, 256: 1}.get(n, 0) if k != "tf32x3" else 2
                       for n, k in persist}, persist
    # the weight gradient's: tiles of 128 (rows or columns) with 8 warps, 64-pixel steps first
    for tile, want in (((128, 128), (64, 8, 3)), ((64, 128), (64, 8, 3)), ((64, 32), (128, 4, 3))):
        config = window.weight_grad_configs(*tile)[0]
        assert (config.kwargs["BLOCK_K"], config.num_warps, config.num_stages) == want, tile


def test_window_gemm_only_where_it_applies(monkeypatch):
    """window.applies: stride-1 convolutions of at least channel_inner_min reduced channels,
    padding within the window's reach and a padded plane of at most window_waste times the
    output's, at TF32 or half precision, or 3xTF32 from window_x3_min channels; IEEE float32
    keeps the implicit GEMM."""
    def takes(xs, ws, stride=1, padding=1, dilation=1, transposed=False):
        g = conv.Geometry("t", xs, ws, stride, padding, dilation, 1)
        src = random_array((g.n, g.co, g.oh, g.ow) if transposed else xs)
        return window.applies(g, src, transposed, conv.call_precision(),
                              conv.current_settings())

    assert takes((2, 16, 6, 6), (8, 16, 3, 3))
    assert takes((2, 8, 6, 6), (16, 8, 3, 3), transposed=True)      # dx reduces Co = 16
    assert not takes((2, 8, 6, 6), (16, 8, 3, 3))                   # x has 8 channels
    assert takes((2, 16, 6, 6), (8, 16, 1, 1), padding=0)
    assert not takes((2, 16, 6, 6), (8, 16, 1, 1), padding=1)      # padding beyond the reach
    assert takes((2, 16, 9, 9), (16, 16, 3, 3), padding=2, dilation=2)
    assert not takes((2, 16, 6, 6), (8, 16, 3, 3), stride=2)
    assert not takes((2, 16, 2, 2), (8, 16, 5, 5), padding=2)      # 4x4 for a 2x2 output
    td.set_conv_precision("highest")
    try:
        assert not takes((2, 63, 6, 6), (8, 63, 3, 3))           # 3xTF32: from 64 channels
        assert takes((2, 64, 6, 6), (8, 64, 3, 3))
        monkeypatch.setattr(conv_settings, "IEEE", True)
        assert not takes((2, 64, 6, 6), (8, 64, 3, 3))
    finally:
        td.set_conv_precision("high")


def test_padded_channels_last_places_flips_and_splits():
    """The window GEMM's operand copies: a strided [N, C, H, W] source at a corner of a zeroed
    [N, HP, WP, CP] buffer, each plane turned by 180 degrees (flip), float32 as TF32 heads
    with their exact tails one buffer on (split, for both or one of them); two sources of
    other shapes in one launch."""
    t = random_array((2, 5, 3, 4), low=-1e3, high=1e3, seed=5).permute(0, 3, 1, 2)  # [2,4,5,3]
    w = random_array((3, 70, 2, 3), low=-1e3, high=1e3, seed=6)   # more pixel and channel blocks
    src, wsrc = (torch.from_numpy(to_numpy(a)) for a in (t, w))
    for flip in (False, True):
        want = torch.zeros(2, 8, 6, 16)
        want[:, 2:7, 1:4, :4] = (src.flip(2, 3) if flip else src).permute(0, 2, 3, 1)
        want_w = torch.zeros(3, 9, 5, 80)
        want_w[:, :2, :3, :70] = (wsrc if flip else wsrc.flip(2, 3)).permute(0, 2, 3, 1)
        out, out_w = layout.padded_channels_last((t, (2, 1), (8, 6), 16, flip),
                                                (w, (0, 0), (9, 5), 80, not flip), split=True)
        for buf, expect in ((out, want), (out_w, want_w)):
            got = torch.from_numpy(to_numpy(buf))
            assert torch.equal(got[0] + got[1], expect)
            assert not (got[0].numpy().view(np.uint32) & 0x1FFF).any()
    plain, = layout.padded_channels_last((t, (0, 0), (5, 3), 4))
    assert torch.equal(torch.from_numpy(to_numpy(plain)), src.permute(0, 2, 3, 1))
    # split for one of the two copies only (the window GEMM's weights at float32 accuracy)
    whole, cut = layout.padded_channels_last((t, (0, 0), (5, 3), 4), (w, (0, 0), (2, 3), 70),
                                            split=(False, True))
    assert torch.equal(torch.from_numpy(to_numpy(whole)), src.permute(0, 2, 3, 1))
    cut = torch.from_numpy(to_numpy(cut))
    assert cut.shape == (2, 3, 2, 3, 70) and torch.equal(cut[0] + cut[1], wsrc.permute(0, 2, 3, 1))
    assert not (cut[0].numpy().view(np.uint32) & 0x1FFF).any() and cut[1].abs().max() > 0
    empty_first, second = layout.padded_channels_last((t[:0], (0, 0), (5, 3), 4),
                                                     (t, (0, 0), (5, 3), 4))
    assert empty_first.shape == (0, 5, 3, 4)
    assert torch.equal(torch.from_numpy(to_numpy(second)), src.permute(0, 2, 3, 1))


def test_auto_picks_per_direction(monkeypatch):
    knobs(algo="auto")
    first = conv.Geometry("t", (4, 1, 28, 28), (32, 1, 5, 5), 1, 2, 1, 1)
    second = conv.Geometry("t", (4, 32, 14, 14), (64, 32, 5, 5), 1, 2, 1, 1)
    def picks(direction, g):
        return routing.layer_algorithm(direction, g, conv.current_settings())

    assert picks("forward", first) == "implicit"
    assert picks("weight", first) == "implicit"
    assert picks("input", first) == ("im2col" if im2col_path.have_matmul() else "implicit")
    assert {picks(d, second) for d in ("forward", "input", "weight")} == {"implicit"}
    knobs(algo="im2col")
    grouped = conv.Geometry("t", (1, 4, 5, 5), (4, 2, 3, 3), 1, 0, 1, 2)
    assert picks("forward", grouped) == "implicit"
    with pytest.raises(ValueError, match="algo"):
        knobs(algo="fastest")


# ----------------------------------------------------------------------------- fused relu


# (x, w, stride, padding, groups, grads, precision, strided gate): the few-taps (flat K) and
# channel-inner implicit GEMM, flat-shift and pre-split weight gradients, the im2col input
# gradient, groups, a bias gradient alone and a gate laid out unlike dy
_GATE_CASES = [
    ((2, 1, 7, 6), (5, 1, 5, 5), 1, 2, 1, (False, True, True), "high", False),
    ((2, 3, 6, 5), (4, 3, 3, 3), 2, 1, 1, (True, True, False), "highest", True),
    ((2, 4, 6, 5), (6, 2, 3, 3), 1, 0, 2, (True, True, True), "high", False),
    ((2, 1, 7, 6), (5, 1, 5, 5), 1, 2, 1, (False, False, True), "high", False),
    ((2, 8, 7, 6), (5, 8, 3, 3), 2, 1, 1, (True, True, True), "high", False),
    ((2, 8, 5, 5), (4, 8, 3, 3), 1, 1, 1, (True, True, True), "highest", False),
    ((2, 16, 6, 5), (8, 16, 3, 3), 1, 1, 1, (True, True, True), "high", True),
]


@pytest.mark.parametrize("case", _GATE_CASES)
def test_conv2d_relu_and_gated_backward(case):
    """conv2d(activation="relu") and conv2d_backward(gate=y) against the float64 reference."""
    xs, ws, stride, padding, groups, grads, precision, strided = case
    args = _pairs(stride, padding, 1) + (groups,)
    x = random_array(xs, low=-1, high=1, seed=1)
    w = random_array(ws, low=-1, high=1, seed=2)
    b = random_array((ws[0],), low=-0.5, high=0.5, seed=3)
    td.set_conv_precision(precision)
    try:
        y = check_primitive("conv2d", x, w, b, *args, "relu", rtol=1e-4, atol=1e-5)
        assert (y == 0).any() and (y > 0).any()
        gate = y
        if strided:  # the same values laid out otherwise
            gate = torch.empty(y.shape[:3] + (2 * y.shape[3],))[..., ::2]
            gate.copy_(y)
        dy = random_array(tuple(y.shape), low=-1, high=1, seed=4)
        check_primitive("conv2d_backward", dy, x, w, *args, *grads, gate, rtol=1e-4, atol=1e-5)
    finally:
        td.set_conv_precision("high")


def test_conv2d_relu_keeps_nan_and_bad_gate_names_the_shapes():
    x = random_array((1, 2, 4, 4))
    x[0, 0, 1, 1] = float("nan")
    w = random_array((3, 2, 3, 3))
    y = conv.conv2d(x, w, None, (1, 1), (1, 1), (1, 1), 1, "relu")
    assert torch.isnan(y).any() and (y[~torch.isnan(y)] >= 0).all()
    with pytest.raises(ValueError, match="activation"):
        conv.conv2d(x, w, None, (1, 1), (1, 1), (1, 1), 1, "gelu")
    with pytest.raises(ValueError, match=r"gate \(1, 3, 4, 3\)"):
        conv.conv2d_backward(y, x, w, (1, 1), (1, 1), gate=y[..., :3])


# ----------------------------------------------------------------------------- im2col / col2im


@given(k=st.sampled_from([1, 2, 3]), stride=st.sampled_from([1, 2, 3]),
       padding=st.sampled_from([0, 1, 2]), dilation=st.sampled_from([1, 2]),
       size=st.sampled_from([(3, 4), (6, 5), (8, 8)]))
def test_im2col_col2im_match_reference(k, stride, padding, dilation, size):
    h, w = size
    if h + 2 * padding < dilation * (k - 1) + 1 or w + 2 * padding < dilation * (k - 1) + 1:
        return
    args = ((k, k), (stride, stride), (padding, padding), (dilation, dilation))
    x = random_array((2, 3, h, w))
    cols = check_primitive("im2col", x, *args)
    c = random_array(tuple(cols.shape), seed=1)
    back = check_primitive("col2im", c, (h, w), *args)
    # adjoint: <im2col(x), c> == <x, col2im(c)>
    lhs = float((cols.double() * c.double()).sum())
    rhs = float((x.double() * back.double()).sum())
    assert abs(lhs - rhs) <= 1e-4 * max(1.0, abs(lhs))


def test_im2col_of_strided_input_and_col2im_of_strided_columns():
    x = random_array((3, 4, 5, 2)).permute(3, 2, 0, 1)  # [2, 3, 4, 5] not contiguous
    check_primitive("im2col", x, (2, 3), (1, 2), (1, 0), (1, 1))
    cols = random_array((2, 30, 6)).transpose(1, 2)[:, :, ::3]  # [2, 6, 10], strided
    check_primitive("col2im", cols, (4, 7), (2, 3), (1, 1), (0, 0), (2, 1))


# ----------------------------------------------------------------------------- autodiff level


def test_autodiff_conv2d_unfold_fold(algo):
    rng = np.random.default_rng(0)
    x, w, b = (rng.uniform(-1, 1, s) for s in ((2, 3, 6, 5), (4, 3, 3, 3), (4,)))
    check_op(lambda x, w, b: F.conv2d(x, w, b, stride=(1, 2), padding=1), x, w, b, rtol=1e-4,
             atol=1e-5)
    check_op(lambda x: F.fold(F.unfold(x, 3, padding=1, stride=2), (6, 5), 3, padding=1,
                              stride=2), x)


# ----------------------------------------------------------------------------- bad input


def test_bad_input_names_the_shapes():
    x = random_array((1, 3, 4, 4))
    with pytest.raises(ValueError, match=r"\(1, 3, 4, 4\).*\(2, 2, 3, 3\)"):
        conv.conv2d(x, random_array((2, 2, 3, 3)))
    with pytest.raises(ValueError, match="does not fit"):
        conv.conv2d(x, random_array((2, 3, 5, 5)))
    with pytest.raises(ValueError, match="stride"):
        conv.conv2d(x, random_array((2, 3, 3, 3)), stride=(0, 1))
    with pytest.raises(ValueError, match="bias"):
        conv.conv2d(x, random_array((2, 3, 3, 3)), random_array((3,)))
    with pytest.raises(TypeError, match="dtype"):
        conv.conv2d(x, random_array((2, 3, 3, 3), td.float16))
    with pytest.raises(ValueError, match="dy"):
        conv.conv2d_backward(random_array((1, 2, 3, 3)), x, random_array((2, 3, 3, 3)))
    with pytest.raises(ValueError, match="columns"):
        conv.col2im(random_array((1, 5, 4)), (3, 3), (2, 2))


# ----------------------------------------------------------------------------- GPU tier


def _torch_conv_grads(x, w, b, dy, stride, padding):
    xs, ws, bs = (t.detach().double().requires_grad_() for t in (x, w, b))
    y = torch.nn.functional.conv2d(xs, ws, bs, stride, padding)
    y.backward(dy.double())
    return y.detach(), xs.grad, ws.grad, bs.grad


def _relative_error(got, want):
    return float((got.double() - want).norm() / want.norm().clamp_min(1e-30))


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [
    ((100, 1, 28, 28), (32, 1, 5, 5), 2),     # MNIST CNN conv1
    ((100, 32, 14, 14), (64, 32, 5, 5), 2),   # MNIST CNN conv2
    ((256, 64, 56, 56), (64, 64, 3, 3), 1),
    ((256, 64, 56, 56), (64, 64, 5, 5), 2),
    ((256, 128, 28, 28), (128, 128, 3, 3), 1),  # float32 accuracy: Winograd (implicit)
    ((256, 256, 14, 14), (256, 256, 3, 3), 1),
])
@pytest.mark.parametrize("precision", ["highest", "high"])
def test_gpu_conv_at_real_shapes(algo, shape, precision):
    """Both paths against float64 cuDNN: float32 accuracy (3xTF32) within 1e-5 relative (norm),
    TF32 within 1e-2 (TF32 keeps 10 of float32's 23 mantissa bits)."""
    xs, ws, pad = shape
    if algo == "im2col" and xs[0] == 256 and ws[2] == 5 and precision == "highest":
        pytest.skip("one im2col run at 256x64x56x56 k5 is enough (10 GB of columns)")
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.rand(xs, device="cuda", generator=gen) * 2 - 1
    w = (torch.rand(ws, device="cuda", generator=gen) * 2 - 1) / ws[1] ** 0.5
    b = torch.rand(ws[0], device="cuda", generator=gen)
    td.set_conv_precision(precision)
    try:
        y = conv.conv2d(x, w, b, (1, 1), (pad, pad), (1, 1))
        dy = torch.rand(y.shape, device="cuda", generator=gen) * 2 - 1
        got = (y,) + conv.conv2d_backward(dy, x, w, (1, 1), (pad, pad), (1, 1))
    finally:
        td.set_conv_precision("high")
    want = _torch_conv_grads(x, w, b, dy, (1, 1), (pad, pad))
    limit = 1e-5 if precision == "highest" else 1e-2
    for name, g, e in zip(("y", "dx", "dw", "db"), got, want):
        assert _relative_error(g, e) < limit, (name, _relative_error(g, e))


@pytest.mark.gpu
@pytest.mark.parametrize("n, c, h, w, co, groups, max_mb", [
    (256, 128, 28, 28, 128, 1, 1024), (256, 256, 14, 14, 256, 1, 1024),  # ResNet-style layers
    (3, 128, 13, 9, 136, 1, 1024),   # odd planes and channel counts
    (2, 512, 7, 7, 512, 1, 1024),    # ResNet's last stage
    (4, 256, 10, 10, 384, 2, 1024),  # 128 and 192 channels a group
    (64, 128, 28, 28, 128, 1, 32),   # in 4 chunks of images (1.8 MB an image)
])
def test_gpu_winograd(n, c, h, w, co, groups, max_mb, winograd_calls, monkeypatch):
    """Winograd's F(4x4, 3x3) as dispatched on the GPU (128 channels and up; a weight
    gradient split into slices where the products would not fill the SMs, here also where
    conv2d would leave it to the direct kernels; a batch in chunks)
    against float64 torch, norm-wise, with the fused relu, transposed x and an expanded dy;
    and bit for bit the same from run to run."""
    knobs(winograd_min_channels=128)
    knobs(winograd_max_bytes=max_mb << 20)
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = (torch.rand((n, h, w, c), device="cuda", generator=gen) * 2 - 1).permute(0, 3, 1, 2)
    wt = (torch.rand((co, c // groups, 3, 3), device="cuda", generator=gen) * 2 - 1) / c ** 0.5
    b = torch.rand(co, device="cuda", generator=gen) - 0.5
    dy = (torch.rand((n, co, 1, w), device="cuda", generator=gen) * 2 - 1).expand(n, co, h, w)
    first = _check_winograd(x, wt, b, dy, groups, relu=True)
    assert {"_input_transform_kernel", "_output_transform_kernel", "_grad_transform_kernel",
            "_weight_output_kernel"} <= set(winograd_calls)
    again = _check_winograd(x, wt, b, dy, groups, relu=True)
    for a, b in zip(first, again):
        assert torch.equal(a, b)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [
    ((100, 1, 28, 28), (32, 1, 5, 5), 2),     # MNIST conv1
    ((100, 32, 14, 14), (64, 32, 5, 5), 2),   # MNIST conv2: flat-shift dw
    ((32, 64, 28, 28), (128, 64, 3, 3), 1),
    ((8, 128, 28, 28), (128, 128, 3, 3), 1),  # float32 accuracy: Winograd
])
@pytest.mark.parametrize("dtype, precision", [(torch.float32, "high"), (torch.float32, "highest"),
                                              (torch.bfloat16, "high")])
def test_gpu_conv_relu_and_gated_backward(shape, dtype, precision):
    """conv2d(activation="relu") and its backward with gate=y against float64 torch's
    relu(conv2d) (relu' taken from our output, so both sides use one mask): 1e-5 relative
    (norm) at float32 accuracy, 1e-2 for TF32 and bf16."""
    xs, ws, pad = shape
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = (torch.rand(xs, device="cuda", generator=gen) * 2 - 1).to(dtype)
    w = ((torch.rand(ws, device="cuda", generator=gen) * 2 - 1) / xs[1] ** 0.5).to(dtype)
    b = (torch.rand(ws[0], device="cuda", generator=gen) - 0.5).to(dtype)
    td.set_conv_precision(precision)
    try:
        y = conv.conv2d(x, w, b, (1, 1), (pad, pad), (1, 1), 1, "relu")
        dy = (torch.rand(y.shape, device="cuda", generator=gen) * 2 - 1).to(dtype)
        got = (y,) + conv.conv2d_backward(dy, x, w, (1, 1), (pad, pad), (1, 1), gate=y)
        alone = conv.conv2d_backward(dy, x, w, (1, 1), (pad, pad), (1, 1), gate=y,
                                     input_grad=False)  # (a first layer)
    finally:
        td.set_conv_precision("high")
    assert (y == 0).any() and (y > 0).any()
    dz = torch.where(y > 0, dy, torch.zeros_like(dy))
    ref_y, *grads = _torch_conv_grads(x, w, b, dz, (1, 1), (pad, pad))
    want = (ref_y.clamp_min(0), *grads)
    limit = 1e-5 if precision == "highest" else 1e-2
    for name, g, e in zip(("y", "dx", "dw", "db", "dw alone", "db alone"), got + alone[1:],
                          want + want[2:]):
        assert g.dtype == dtype
        assert _relative_error(g, e) < limit, (name, _relative_error(g, e))


@pytest.mark.gpu
@pytest.mark.parametrize("pack, channels_last", [(False, False), (True, True)])
@pytest.mark.parametrize("precision", ["highest", "high"])
def test_gpu_conv_operand_layouts(pack, channels_last, precision, monkeypatch):
    """The implicit GEMM's layout knobs at the MNIST conv2 shape, both precisions."""
    knobs(algo="implicit")
    knobs(window_gemm=False)
    knobs(pack_weights=pack)
    knobs(channels_last=channels_last)
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.rand((100, 32, 14, 14), device="cuda", generator=gen) * 2 - 1
    w = (torch.rand((64, 32, 5, 5), device="cuda", generator=gen) * 2 - 1) / 32 ** 0.5
    b = torch.rand(64, device="cuda", generator=gen)
    td.set_conv_precision(precision)
    try:
        y = conv.conv2d(x, w, b, (1, 1), (2, 2), (1, 1))
        dy = torch.rand(y.shape, device="cuda", generator=gen) * 2 - 1
        got = (y,) + conv.conv2d_backward(dy, x, w, (1, 1), (2, 2), (1, 1))
    finally:
        td.set_conv_precision("high")
    want = _torch_conv_grads(x, w, b, dy, (1, 1), (2, 2))
    limit = 1e-5 if precision == "highest" else 1e-2
    for name, g, e in zip(("y", "dx", "dw", "db"), got, want):
        assert _relative_error(g, e) < limit, (name, _relative_error(g, e))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_gpu_conv_half_precision(algo, dtype):
    x = torch.randn(64, 32, 14, 14, device="cuda").to(dtype)
    w = (torch.randn(64, 32, 5, 5, device="cuda") / 40).to(dtype)
    b = torch.randn(64, device="cuda").to(dtype)
    y = conv.conv2d(x, w, b, (1, 1), (2, 2), (1, 1))
    dy = torch.randn(y.shape, device="cuda").to(dtype)
    got = (y,) + conv.conv2d_backward(dy, x, w, (1, 1), (2, 2), (1, 1))
    want = _torch_conv_grads(x, w, b, dy, (1, 1), (2, 2))
    for name, g, e in zip(("y", "dx", "dw", "db"), got, want):
        assert g.dtype == dtype
        assert _relative_error(g, e) < 1e-2, (name, _relative_error(g, e))


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [
    ((8, 48, 16, 16), (80, 48, 3, 3)),      # channel counts that are not a tile multiple
    ((16, 128, 28, 28), (128, 128, 3, 3)),  # a 128x128 tile (8 warps), split-K
    ((100, 32, 14, 14), (64, 32, 5, 5)),    # MNIST conv2 (tiles of four taps)
    ((100, 1, 28, 28), (32, 1, 5, 5)),      # MNIST conv1 (all 25 taps in one tile)
    ((8, 64, 20, 20), (64, 64, 3, 3)),      # tiles of two taps
])
@pytest.mark.parametrize("dtype, precision", [(torch.float32, "highest"),
                                              (torch.float32, "high"),
                                              (torch.bfloat16, "high"), (torch.float16, "high")])
def test_gpu_flat_shift_weight_grad(shape, dtype, precision, monkeypatch):
    """The flat-shift weight gradient with dy through TMA where the plane's rows allow it
    (16-byte multiples; MNIST conv2's 196 half-precision pixels do not: the implicit-GEMM
    kernel then), against float64 cuDNN: 1e-5 relative (norm) at float32 accuracy, 1e-2 for
    TF32 and half types."""
    knobs(window_wgrad=False)  # (half types: the window form else)
    knobs(batch_inner=False)   # (float32: the batch-inner form)
    seen = _check_gpu_same_weight_grad(shape, dtype, precision, monkeypatch)
    tma = shape[0][2] * shape[0][3] * dtype.itemsize % 16 == 0
    assert (("_shift_wgrad_kernel", True) in seen) == tma
    assert tma or "_conv_wgrad_kernel" in {name for name, _ in seen}


def _check_gpu_same_weight_grad(shape, dtype, precision, monkeypatch):
    """dw and db of the stride-1 "same" convolution of shape = (x's, w's) on the GPU against
    float64 cuDNN: 1e-5 relative (norm) at float32 accuracy, 1e-2 for TF32 and half types
    (Winograd off). Returns the kernels launched."""
    knobs(winograd=False)      # (float32 accuracy at 128 channels)
    (n, c, h, w_), ws = shape
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = (torch.rand((n, c, h, w_), device="cuda", generator=gen) * 2 - 1).to(dtype)
    w = ((torch.rand(ws, device="cuda", generator=gen) * 2 - 1) / c ** 0.5).to(dtype)
    dy = (torch.rand((n, ws[0], h, w_), device="cuda", generator=gen) * 2 - 1).to(dtype)
    pad = ws[2] // 2
    td.set_conv_precision(precision)
    try:
        seen = _launched(monkeypatch)
        _, dw, db = conv.conv2d_backward(dy, x, w, (1, 1), (pad, pad), (1, 1),
                                         input_grad=False)
    finally:
        td.set_conv_precision("high")
    want = _torch_conv_grads(x, w, torch.zeros(ws[0], device="cuda"), dy, (1, 1), (pad, pad))
    limit = 1e-5 if precision == "highest" and dtype == torch.float32 else 1e-2
    for name, g, e in (("dw", dw, want[2]), ("db", db, want[3])):
        assert g.dtype == dtype
        assert _relative_error(g, e) < limit, (name, _relative_error(g, e))
    return seen


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [
    ((100, 32, 14, 14), (64, 32, 5, 5)),    # MNIST conv2
    ((16, 128, 28, 28), (128, 128, 3, 3)),  # a 128x128 tile (8 warps), split-K
    ((5, 48, 15, 13), (80, 48, 3, 3)),      # a batch padded to 8, odd planes, partial tiles
    ((8, 256, 14, 14), (256, 256, 3, 3)),   # two tiles of rows and of columns a tap
])
@pytest.mark.parametrize("precision", ["highest", "high"])
def test_gpu_batch_inner_weight_grad(shape, precision, monkeypatch):
    """The batch-inner weight gradient (every tile a TMA rectangle of the batch-inner copies)
    against float64 cuDNN: 1e-5 relative (norm) at float32 accuracy, 1e-2 at TF32."""
    seen = _check_gpu_same_weight_grad(shape, torch.float32, precision, monkeypatch)
    assert "_batch_inner_wgrad_kernel" in {name for name, _ in seen}


# (x shape, weight shape, padding, dilation) of the GPU window-GEMM tests: MNIST conv2, channel
# counts that are not a tile multiple, rows padded with more than one tile of output channels,
# dilation, and a ResNet-style layer (split-K in the weight gradient)
_GPU_WINDOW_GEOMETRIES = [
    ((100, 32, 14, 14), (64, 32, 5, 5), (2, 2), (1, 1)),
    ((8, 48, 16, 16), (80, 48, 3, 3), (1, 1), (1, 1)),
    ((4, 20, 9, 11), (150, 20, 3, 5), (0, 2), (1, 1)),
    ((4, 24, 12, 13), (32, 24, 3, 3), (2, 1), (2, 1)),
    ((16, 256, 14, 14), (256, 256, 3, 3), (1, 1), (1, 1)),
]


@pytest.mark.gpu
@pytest.mark.parametrize("geometry", _GPU_WINDOW_GEOMETRIES)
@pytest.mark.parametrize("dtype, precision", [(torch.float32, "highest"),
                                              (torch.float32, "high"),
                                              (torch.bfloat16, "high"), (torch.float16, "high")])
def test_gpu_window_gemm(geometry, dtype, precision, monkeypatch):
    """The window GEMM (TMA rectangles of the padded channels-last input): the forward with
    bias and relu and the input gradient against float64 cuDNN, 1e-5 relative (norm) at
    float32 accuracy, 1e-2 for TF32 and half types."""
    xs, ws, pad, dil = geometry
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = (torch.rand(xs, device="cuda", generator=gen) * 2 - 1).to(dtype)
    w = ((torch.rand(ws, device="cuda", generator=gen) * 2 - 1) / xs[1] ** 0.5).to(dtype)
    b = torch.rand(ws[0], device="cuda", generator=gen).to(dtype)
    want_y = torch.nn.functional.conv2d(x.double(), w.double(), b.double(), 1, pad, dil)
    dy = (torch.rand(want_y.shape, device="cuda", generator=gen) * 2 - 1).to(dtype)
    want_dx = torch.ops.aten.convolution_backward(
        dy.double(), x.double(), w.double(), [ws[0]], [1, 1], list(pad), list(dil), False,
        [0, 0], 1, [True, False, False])[0]
    knobs(window_x3_min=16)  # (3xTF32 takes it from 64 channels;
    knobs(winograd=False)    # Winograd takes 3x3 ones at 128 and up)
    td.set_conv_precision(precision)
    try:
        seen = _launched(monkeypatch)
        y = conv.conv2d(x, w, b, (1, 1), pad, dil, activation="relu")
        dx, _, _ = conv.conv2d_backward(dy, x, w, (1, 1), pad, dil, weight_grad=False,
                                        bias_grad=False)
    finally:
        td.set_conv_precision("high")
    assert [name for name, _ in seen].count("_window_gemm_kernel") == 2, seen
    limit = 1e-5 if precision == "highest" and dtype == torch.float32 else 1e-2
    for name, g, e in (("y", y, want_y.clamp_min(0)), ("dx", dx, want_dx)):
        assert g.dtype == dtype
        assert _relative_error(g, e) < limit, (name, _relative_error(g, e))


@pytest.mark.gpu
@pytest.mark.parametrize("persist", [0, 1])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gpu_window_gemm_split_tail(dtype, persist, monkeypatch):
    """The window GEMM's 128x256 tiles with the last wave split into half tiles (SM counts
    made up so that 29 tiles leave 9 on 20 SMs, all 29 on 132), one program a tile or
    persistent (one program an SM), against the unsplit launch (1e-6 relative) and float64
    cuDNN (1e-2: TF32 and bf16)."""
    from tritonad.kernels.plans import clear_plans
    from tritonad.kernels.tuning import Tuner

    xs, ws = (16, 256, 14, 14), (256, 256, 3, 3)
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = (torch.rand(xs, device="cuda", generator=gen) * 2 - 1).to(dtype)
    w = ((torch.rand(ws, device="cuda", generator=gen) * 2 - 1) / xs[1] ** 0.5).to(dtype)
    b = torch.rand(ws[0], device="cuda", generator=gen).to(dtype)
    dy = (torch.rand(xs, device="cuda", generator=gen) * 2 - 1).to(dtype)
    want_y = torch.nn.functional.conv2d(x.double(), w.double(), b.double(), 1, 1)
    want_dx = torch.ops.aten.convolution_backward(
        dy.double(), x.double(), w.double(), [ws[0]], [1, 1], [1, 1], [1, 1], False, [0, 0],
        1, [True, False, False])[0]
    knobs(winograd=False)
    monkeypatch.setattr(window, "WINDOW_MENU", {
        k: [e for e in menu if e[:2] == (128, 256) and (e[5:] or (0,))[0] == persist]
        for k, menu in window.WINDOW_MENU.items()})
    monkeypatch.setattr(common, "tuner", Tuner("conv-tail-test"))
    monkeypatch.setattr(common.tuner, "path", lambda: "/dev/null/none")
    grids, real = [], plans.run

    def spy(kernel, grid, *args, **meta):
        if kernel is window._window_gemm_kernel:
            grids.append(grid[0])
        return real(kernel, grid, *args, **meta)

    _spy_run(monkeypatch, spy)
    results = {}
    for sms, tail_tile in ((20, 128 * 256), (132, 128 * 256), (132, 1 << 40)):
        _fake_sms(monkeypatch, sms)
        knobs(window_tail_tile=tail_tile)
        clear_plans()
        results[sms, tail_tile] = (
            conv.conv2d(x, w, b, (1, 1), (1, 1), activation="relu"),
            conv.conv2d_backward(dy, x, w, (1, 1), (1, 1), weight_grad=False,
                                 bias_grad=False)[0])
    clear_plans()
    # (forward, input gradient; persistent: at most one program an SM)
    assert grids == [20 if persist else 38] * 2 + [58, 58, 29, 29], grids
    for got in results.values():
        for name, g, e, same in (("y", got[0], want_y.clamp_min(0), results[132, 1 << 40][0]),
                                 ("dx", got[1], want_dx, results[132, 1 << 40][1])):
            assert _relative_error(g, e) < 1e-2, (name, _relative_error(g, e))
            assert _relative_error(g, same.double()) < 1e-6, (name, "split against unsplit")


@pytest.mark.gpu
@pytest.mark.parametrize("geometry", _GPU_WINDOW_GEOMETRIES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gpu_window_weight_grad(geometry, dtype, monkeypatch):
    """The half-precision weight gradient from the window GEMM's buffers (TMA rectangles of
    the padded channels-last x and of dy on the same grid) and its fused bias gradient,
    against float64 cuDNN within 1e-2 relative (norm); asked for with the input gradient,
    from that one's copy of dy, bit for bit the same."""
    xs, ws, pad, dil = geometry
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = (torch.rand(xs, device="cuda", generator=gen) * 2 - 1).to(dtype)
    w = ((torch.rand(ws, device="cuda", generator=gen) * 2 - 1) / xs[1] ** 0.5).to(dtype)
    y = torch.nn.functional.conv2d(x.double(), w.double(), None, 1, pad, dil)
    dy = (torch.rand(y.shape, device="cuda", generator=gen) * 2 - 1).to(dtype)
    want = torch.ops.aten.convolution_backward(
        dy.double(), x.double(), w.double(), [ws[0]], [1, 1], list(pad), list(dil), False,
        [0, 0], 1, [False, True, True])
    seen = _launched(monkeypatch)
    _, dw, db = conv.conv2d_backward(dy, x, w, (1, 1), pad, dil, input_grad=False)
    assert "_window_wgrad_kernel" in [name for name, _ in seen], seen
    for name, g, e in (("dw", dw, want[1]), ("db", db, want[2])):
        assert g.dtype == dtype
        assert _relative_error(g, e) < 1e-2, (name, _relative_error(g, e))
    # with the input gradient too: from its copy of dy, the same bits
    _, dw_both, db_both = conv.conv2d_backward(dy, x, w, (1, 1), pad, dil)
    assert torch.equal(dw_both, dw) and torch.equal(db_both, db)


@pytest.mark.gpu
@pytest.mark.parametrize("entry", range(len(window.WINDOW_WGRAD_MENU)))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gpu_window_weight_grad_menu(entry, dtype, monkeypatch):
    """Every plan of the window weight gradient's menu, at a layer of 128x128 tiles and one
    of 64x32 tiles (4-warp plans of 128x128 tiles computed wrong gradients on Triton 3.6:
    see window.WINDOW_WGRAD_MENU)."""
    from tritonad.kernels.plans import clear_plans
    from tritonad.kernels.tuning import Tuner

    monkeypatch.setattr(window, "WINDOW_WGRAD_MENU", [window.WINDOW_WGRAD_MENU[entry]])
    monkeypatch.setattr(common, "tuner", Tuner("conv-menu-test"))
    monkeypatch.setattr(common.tuner, "path", lambda: "/dev/null/none")
    clear_plans()
    gen = torch.Generator(device="cuda").manual_seed(0)
    for xs, ws in (((32, 128, 28, 28), (128, 128, 3, 3)), ((100, 32, 14, 14), (64, 32, 5, 5))):
        pad = ws[2] // 2
        x = (torch.rand(xs, device="cuda", generator=gen) * 2 - 1).to(dtype)
        w = ((torch.rand(ws, device="cuda", generator=gen) * 2 - 1) / xs[1] ** 0.5).to(dtype)
        dy = (torch.rand((xs[0], ws[0], xs[2], xs[3]), device="cuda", generator=gen) * 2 -
              1).to(dtype)
        want = torch.ops.aten.convolution_backward(
            dy.double(), x.double(), w.double(), [ws[0]], [1, 1], [pad, pad], [1, 1], False,
            [0, 0], 1, [False, True, True])
        _, dw, db = conv.conv2d_backward(dy, x, w, (1, 1), (pad, pad), (1, 1), input_grad=False)
        for name, g, e in (("dw", dw, want[1]), ("db", db, want[2])):
            err = float((g.double() - e).abs().max() / e.abs().max())  # (the bug: 3e-2+)
            assert err < 1e-2, (xs, name, err)
    clear_plans()


@pytest.mark.gpu
@settings(max_examples=10)
@given(data=st.data())
def test_gpu_conv_random_geometry(algo, data, monkeypatch):
    """The CPU property, compiled, with larger channels (channel-inner tiles, split-K); one
    config per tile family (tuning every new shape would mostly measure compile times). Exact
    IEEE float32, so that the tight tolerance tests the indexing, not TF32 rounding.
    (No tuning: td.autotune is off by default.)"""
    monkeypatch.setattr(conv_settings, "conv_precision", lambda: "highest")
    k = data.draw(st.sampled_from([1, 3, 5, 7]))
    pad = data.draw(st.sampled_from([0, k // 2]))
    dil = data.draw(st.sampled_from([1, 2]))
    _check_conv(n=data.draw(st.sampled_from([1, 3, 8])),
                c=data.draw(st.sampled_from([1, 5, 16, 48])),
                h=_fit(data.draw(st.sampled_from([7, 16, 31])), k, pad, dil),
                w=_fit(data.draw(st.sampled_from([9, 32])), k, pad, dil),
                co=data.draw(st.sampled_from([1, 8, 40, 130])), k=k,
                stride=data.draw(st.sampled_from([1, 2, 3])), padding=pad, dilation=dil,
                bias=data.draw(st.booleans()), rtol=1e-4, atol=1e-4)


def _against_torch(fn, *arrays):
    """fn's output and its inputs' gradients (under the loss sum(y * y)) agree with torch's."""
    results = []
    for lib in (td, torch):
        xs = [lib.tensor(a, requires_grad=True) for a in arrays]
        y = fn(lib, *xs)
        (y * y).sum().backward()
        results.append([y.detach()] + [x.grad for x in xs])
    for ours, theirs in zip(*results):
        if ours is None or theirs is None:  # an input the case does not use
            assert ours is None and theirs is None
            continue
        assert ours.shape == tuple(theirs.shape)
        assert_close(ours, theirs, rtol=1e-4, atol=1e-4)


_RNG = np.random.default_rng(11)
_X = _RNG.normal(size=(2, 3, 7, 6)).astype(np.float32)
_W = _RNG.normal(size=(4, 3, 3, 2)).astype(np.float32)
_B = _RNG.normal(size=4).astype(np.float32)
STRING_AND_UNBATCHED = {  # (h, w) kernel 3 x 2: 'same' pads one side more along w
    "unbatched": lambda lib, x, w, b: lib.nn.functional.conv2d(x[0], w, b, padding=1),
    "same": lambda lib, x, w, b: lib.nn.functional.conv2d(x, w, b, padding="same"),
    "same, dilation 2": lambda lib, x, w, b: lib.nn.functional.conv2d(x, w, b, padding="same",
                                                                       dilation=2),
    "valid": lambda lib, x, w, b: lib.nn.functional.conv2d(x, w, b, padding="valid"),
    "unbatched, same": lambda lib, x, w, b: lib.nn.functional.conv2d(x[1], w, b, padding="same"),
    "unbatched max pool": lambda lib, x, w, b: lib.nn.functional.max_pool2d(x[0] * w.sum(), 2),
    "unbatched avg pool": lambda lib, x, w, b: lib.nn.functional.avg_pool2d(x[0] + b.sum(), 2),
}


@pytest.mark.parametrize("case", list(STRING_AND_UNBATCHED))
def test_string_padding_and_unbatched_input_as_torch(backend_name, case):
    _against_torch(STRING_AND_UNBATCHED[case], _X, _W, _B)


def test_conv2d_module_with_string_padding_and_unbatched_input(backend_name):
    td.manual_seed(0)
    ours = td.nn.Conv2d(3, 4, (3, 2), padding="same")
    theirs = torch.nn.Conv2d(3, 4, (3, 2), padding="same")
    with torch.no_grad():
        theirs.weight.copy_(ours.weight.torch())
        theirs.bias.copy_(ours.bias.torch())
    pool = (td.nn.ReLU(), td.nn.MaxPool2d(2)), (torch.nn.ReLU(), torch.nn.MaxPool2d(2))
    for x in (_X, _X[0]):
        assert_close(ours(td.tensor(x)), theirs(torch.tensor(x)).detach(), rtol=1e-4, atol=1e-4)
        assert_close(td.nn.Sequential(ours, *pool[0])(td.tensor(x)),  # the fused path
                     torch.nn.Sequential(theirs, *pool[1])(torch.tensor(x)).detach(),
                     rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="padding='same' is not supported for strided"):
        td.nn.Conv2d(3, 4, 3, stride=2, padding="same")
    with pytest.raises(ValueError, match="conv2d: padding must be ints, 'valid' or 'same'"):
        F.conv2d(td.tensor(_X), td.tensor(_W), padding="full")
