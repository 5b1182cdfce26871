"""Normalisation (autodiff/norm_ops.py, kernels/norm.py, nn/normalization.py) against PyTorch's
CPU implementation (the spec), forward and backward under a random cotangent, on both backends:
the numpy backend runs the composites, the triton backend the fused kernels (under Triton's
interpreter here). The composites' own gradients are checked against float64 finite
differences, and the fused kernels against the composites in float64.
"""
import numpy as np
import pytest
import torch
from helpers import assert_close
from hypothesis import given, settings
from hypothesis import strategies as st

import tritonad as td
import tritonad.nn.functional as F
from tritonad import nn
from tritonad.autodiff import norm_ops
from tritonad.autodiff.gradcheck import gradcheck
from tritonad.kernels import norm as kernels
from tritonad.kernels import norm_common, norm_stream
from tritonad.kernels.plans import clear_plans

TF = torch.nn.functional
# forward / gradient tolerances (rtol, atol) by dtype, against torch
TOL = {td.float32: (1e-4, 1e-5), td.float64: (1e-10, 1e-12), td.bfloat16: (2e-2, 2e-2),
       td.float16: (5e-3, 5e-3)}
TORCH = {td.float32: torch.float32, td.float64: torch.float64, td.bfloat16: torch.bfloat16,
         td.float16: torch.float16}


def arrays(seed, *shapes, scale=1.0, shift=0.0):
    rng = np.random.default_rng(seed)
    return [None if s is None else (rng.standard_normal(s) * scale + shift) for s in shapes]


def compare(ours, theirs, inputs, dtype=td.float32, views=None, seed=0, tol=None):
    """ours(*Tensors) and theirs(*torch tensors) on the same values: forward, then the gradient
    of every input under one random cotangent. views: functions applied to both inputs (a
    transpose, a slice) after the leaves are made, so that the ops see non-contiguous inputs."""
    rtol, atol = tol or TOL[dtype]
    views = views or [None] * len(inputs)
    leaves_td = [None if a is None else td.tensor(a, dtype=dtype, requires_grad=True)
                 for a in inputs]
    # the oracle for half types: PyTorch in float64 on the same (rounded) values, not its own
    # half kernels, whose partial sums round more than ours (a weight gradient of 257 rows in
    # bfloat16 on torch's CPU kernels was off by 0.24 where ours sums in float32)
    half = dtype in (td.bfloat16, td.float16)

    def to_pt(a):
        t = torch.tensor(a, dtype=TORCH[dtype])
        return (t.double() if half else t).requires_grad_()

    leaves_pt = [None if a is None else to_pt(a) for a in inputs]
    args_td = [v(t) if v is not None and t is not None else t for v, t in zip(views, leaves_td)]
    args_pt = [v(t) if v is not None and t is not None else t for v, t in zip(views, leaves_pt)]
    y = ours(*args_td)
    expected = theirs(*args_pt)
    assert tuple(y.shape) == tuple(expected.shape)
    assert y.dtype == dtype
    assert_close(y, expected.detach().double(), rtol, atol, name="forward")
    cotangent = np.random.default_rng(seed + 1).standard_normal(tuple(y.shape))
    (y * td.tensor(cotangent, dtype=dtype)).sum().backward()
    cot_pt = torch.tensor(cotangent, dtype=TORCH[dtype])
    (expected * (cot_pt.double() if half else cot_pt)).sum().backward()
    for i, (a, b) in enumerate(zip(leaves_td, leaves_pt)):
        if a is not None:
            assert_close(a.grad, b.grad.double(), rtol * 10, atol * 10, name=f"grad {i}")


def transposed(t):
    return t.transpose(0, 1)


# -------------------------------------------------------------------- layer_norm, rms_norm


@pytest.mark.parametrize("shape, normalized, affine, view", [
    ((3, 5, 37), (37,), "both", None),            # odd width, several rows a program
    ((13, 6), (6,), "weight", transposed),         # strided columns (a transposed input)
    ((4, 3, 7), (3, 7), "both", None),            # two normalised dims
    ((2, 9), 9, None, None),                     # no affine, int normalized_shape
    ((5, 9), (9,), "bias", None),                 # a bias without a weight
])
def test_layer_norm_matches_torch(backend_name, shape, normalized, affine, view):
    n = (normalized,) if isinstance(normalized, int) else normalized
    x, w, b = arrays(0, shape, n if affine in ("both", "weight") else None,
                     n if affine in ("both", "bias") else None)
    if view is not None:
        x = np.ascontiguousarray(x.swapaxes(0, 1))
    compare(lambda x, w, b: F.layer_norm(x, normalized, w, b, eps=1e-5),
            lambda x, w, b: TF.layer_norm(x, n, w, b, eps=1e-5), [x, w, b],
            views=[view, None, None])


@pytest.mark.parametrize("eps, affine", [(None, True), (1e-6, False)])
def test_rms_norm_matches_torch(backend_name, eps, affine):
    x, w = arrays(1, (7, 45), (45,) if affine else None, scale=0.01)  # small: eps matters
    compare(lambda x, w: F.rms_norm(x, (45,), w, eps=eps),
            lambda x, w: TF.rms_norm(x, (45,), w, eps=eps), [x, w])


@pytest.mark.parametrize("dtype", [td.bfloat16, td.float16])
def test_row_norms_in_half_precision(dtype):
    """Half inputs: statistics in float32, one rounding (fused kernels against torch)."""
    x, w, b = arrays(2, (6, 40), (40,), (40,), shift=3.0)
    with td.use_backend("triton"):
        compare(lambda x, w, b: F.layer_norm(x, (40,), w, b),
                lambda x, w, b: TF.layer_norm(x, (40,), w, b), [x, w, b], dtype=dtype)
        compare(lambda x, w: F.rms_norm(x, (40,), w), lambda x, w: TF.rms_norm(x, (40,), w),
                [x, w], dtype=dtype)


def test_fused_row_norms_match_the_composite_in_float64():
    """The fused kernels (triton backend) against their composites (numpy backend), float64,
    with several programs' partial sums of dweight and dbias."""
    x, w, b, dy = arrays(3, (11, 19), (19,), (19,), (11, 19))
    results = {}
    for name in ("numpy", "triton"):
        with td.use_backend(name):
            xs = [td.tensor(a, dtype=td.float64, requires_grad=True) for a in (x, w, b)]
            y = F.layer_norm(xs[0], (19,), xs[1], xs[2]) + F.rms_norm(xs[0], (19,), xs[1])
            (y * td.tensor(dy)).sum().backward()
            results[name] = [y.numpy()] + [t.grad.numpy() for t in xs]
    for i, (a, e) in enumerate(zip(results["triton"], results["numpy"])):
        assert_close(a, e, 1e-12, 1e-12, name=f"output {i}")


@pytest.fixture
def variant(request, monkeypatch):
    """The kernels on small tiles and several programs, so that every loop takes several steps,
    with a masked tail and a fully masked load past a program's last tile. Plans are cleared
    around it (their key does not see the program count)."""
    # "deep": two steps in flight for every dtype, elementwise batch-norm tiles of their own
    name = getattr(request, "param", "default")
    monkeypatch.setattr(norm_common, "programs_override", 3)
    monkeypatch.setattr(norm_stream, "INTERPRET_MIN_TILE", 0)
    monkeypatch.setattr(norm_common, "SETTINGS", norm_common.NormSettings(
        row_tile=64, bn_reduce_tile=32, bn_tile=64, depth=2 if name == "deep" else 1,
        bn_l2_order=0 if name == "deep" else 1))
    clear_plans()
    yield name
    clear_plans()


@pytest.mark.parametrize("dtype", [td.float32, td.bfloat16])
def test_streaming_row_backward_on_small_tiles(variant, dtype):
    """The row backward with the next rows' loads in flight (one step ahead for float32, two
    for bfloat16): 3 programs of 4 steps of 2 rows, the last step part masked; strided x for
    rms_norm."""
    x, w, b = arrays(15, (23, 29), (29,), (29,), shift=2.0)
    with td.use_backend("triton"):
        compare(lambda x, w, b: F.layer_norm(x, (29,), w, b),
                lambda x, w, b: TF.layer_norm(x, (29,), w, b), [x, w, b], dtype=dtype)
        if dtype == td.float32:
            compare(lambda x, w: F.rms_norm(x, (29,), w),
                    lambda x, w: TF.rms_norm(x, (29,), w),
                    [np.ascontiguousarray(x.T), w], views=[transposed, None])


def test_norm_composites_gradcheck():
    """The composites (the oracle) against float64 finite differences."""
    x, w, b = arrays(5, (3, 4, 5), (5,), (5,))
    xg, wg, bg = arrays(6, (2, 4, 3), (4,), (4,))
    with td.use_backend("numpy"):
        t = [td.tensor(a, dtype=td.float64, requires_grad=True) for a in (x, w, b, xg, wg, bg)]
        gradcheck(lambda x, w, b: F.layer_norm(x, (5,), w, b), t[:3])
        gradcheck(lambda x, w: F.rms_norm(x, (5,), w), t[:2])
        gradcheck(lambda x, w, b: F.group_norm(x, 2, w, b), t[3:])
        gradcheck(lambda x, w, b: F.batch_norm(x, None, None, w, b, training=True),
                            t[3:])
        gradcheck(lambda x: F.normalize(x, dim=-1), t[:1])


def test_wide_rows_compose():
    """Rows wider than the fused kernel's registers take the composite."""
    assert norm_ops.FUSED_MAX_COLS == kernels.MAX_COLS
    with pytest.raises(ValueError, match="wider"):
        kernels._row_blocks(4, kernels.MAX_COLS + 1, "layer_norm")


# --------------------------------------------------------------------- group_norm, normalize


@pytest.mark.parametrize("shape, groups, affine", [((3, 6, 5, 3), 3, True), ((2, 4, 7), 4, False)])
def test_group_norm_matches_torch(backend_name, shape, groups, affine):
    c = (shape[1],) if affine else None
    x, w, b = arrays(7, shape, c, c, shift=2.0)
    compare(lambda x, w, b: F.group_norm(x, groups, w, b),
            lambda x, w, b: TF.group_norm(x, groups, w, b), [x, w, b])


@pytest.mark.parametrize("p, dim", [(2.0, 1), (1.0, -1), (float("inf"), 0), (3.0, 1)])
def test_normalize_matches_torch(backend_name, p, dim):
    (x,) = arrays(8, (4, 6))
    x[1] = 0.0  # a zero vector along dim 1: output 0 and gradient 0, not NaN
    compare(lambda x: F.normalize(x, p=p, dim=dim), lambda x: TF.normalize(x, p=p, dim=dim), [x])


# ---------------------------------------------------------------------------------- batch_norm

LAYOUTS = {
    "nchw": (lambda a: a, lambda a: a),
    # channels-last memory: a [N, H, W, C] array seen as [N, C, H, W]
    "channels_last": (lambda a: np.ascontiguousarray(a.transpose(0, 2, 3, 1)),
                      lambda t: t.permute(0, 3, 1, 2)),
}


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("activation", [None, "relu", "gelu"])
def test_batch_norm_training_matches_torch(backend_name, layout, activation):
    store, view = LAYOUTS[layout]
    x, w, b = arrays(9, (3, 5, 4, 3), (5,), (5,), shift=1.5)
    act = {None: lambda y: y, "relu": TF.relu, "gelu": TF.gelu}[activation]
    compare(lambda x, w, b: F.batch_norm_act(x, None, None, w, b, True, activation=activation),
            lambda x, w, b: act(TF.batch_norm(x, None, None, w, b, training=True)),
            [store(x), w, b], views=[view, None, None])


@pytest.mark.parametrize("shape", [(7, 3), (4, 3, 5)])
def test_batch_norm_1d_eval_and_running_stats(backend_name, shape):
    """BatchNorm1d on [N, C] and [N, C, L]: two training steps update the running statistics
    (unbiased variance, momentum), then eval normalises with them; as torch's module."""
    ours, theirs = nn.BatchNorm1d(3), torch.nn.BatchNorm1d(3)
    for step in range(2):
        (x,) = arrays(10 + step, shape, scale=2.0, shift=step)
        compare(ours, theirs, [x])
    for name in ("running_mean", "running_var", "num_batches_tracked"):
        assert_close(getattr(ours, name), getattr(theirs, name), 1e-5, 1e-6, name=name)
    assert ours.num_batches_tracked.dtype == td.int64
    ours.eval(), theirs.eval()
    (x,) = arrays(12, shape)
    compare(ours, theirs, [x])


@pytest.mark.parametrize("momentum, affine, track", [(None, True, True), (0.3, False, True),
                                                     (0.1, True, False)])
def test_batch_norm_2d_options(backend_name, momentum, affine, track):
    kwargs = dict(momentum=momentum, affine=affine, track_running_stats=track)
    ours, theirs = nn.BatchNorm2d(4, **kwargs), torch.nn.BatchNorm2d(4, **kwargs)
    for step in range(2):
        (x,) = arrays(20 + step, (2, 4, 3, 3), shift=step)
        compare(ours, theirs, [x])
    assert list(ours.state_dict()) == list(theirs.state_dict())
    if track:
        assert_close(ours.running_mean, theirs.running_mean, 1e-5, 1e-6)
        assert_close(ours.running_var, theirs.running_var, 1e-5, 1e-6)
        assert int(ours.num_batches_tracked.item()) == 2
        assert ours.running_var._constant() is None  # (filled with 1 once, changed since)
    ours.eval(), theirs.eval()
    (x,) = arrays(30, (2, 4, 3, 3))
    compare(ours, theirs, [x])


def test_batch_norm_strided_spatial_input():
    """Rows of a plane that cannot be walked as one (every other row): copied, then fused."""
    x, w, b = arrays(14, (2, 3, 6, 4), (3,), (3,))
    with td.use_backend("triton"):
        compare(lambda x, w, b: F.batch_norm(x, None, None, w, b, True),
                lambda x, w, b: TF.batch_norm(x, None, None, w, b, training=True),
                [x, w, b], views=[lambda t: t[:, :, ::2], None, None])


def test_batch_norm_half_channels_last():
    x, w, b = arrays(13, (2, 3, 4, 4), (3,), (3,), shift=4.0)
    store, view = LAYOUTS["channels_last"]
    with td.use_backend("triton"):
        compare(lambda x, w, b: F.batch_norm_act(x, None, None, w.float(), b.float(), True,
                                                 activation="gelu"),
                lambda x, w, b: TF.gelu(TF.batch_norm(x.float(), None, None, w.float(),
                                                      b.float(), training=True)).bfloat16(),
                [store(x), w, b], dtype=td.bfloat16, views=[view, None, None])


@pytest.mark.parametrize("variant, layout", [("deep", "nchw"), ("default", "channels_last")],
                         indirect=["variant"])
def test_batch_norm_on_small_tiles(variant, layout):
    """Statistics, normalise and backward over several programs of several tiles (channel
    blocks of 1 in NCHW; in channels-last 3 splits of 4, 4 and 2 tiles of 4 positions, which
    the elementwise passes visit last first), gelu fused, a
    mean 1000 standard deviations from 0 (sum(x^2) - sum(x)^2 / m would lose every digit of
    the variance in float32; the kernels' shifted or combined sums keep them), and the
    running statistics of a cumulative average over two steps."""
    store, view = LAYOUTS[layout]
    ours, theirs = nn.BatchNorm2d(5, momentum=None), torch.nn.BatchNorm2d(5, momentum=None)
    with td.use_backend("triton"):
        for step in range(2):
            (x,) = arrays(70 + step, (2, 5, 4, 5), scale=0.1, shift=100.0)
            compare(lambda x: ours(x, activation="gelu"), lambda x: TF.gelu(theirs(x)),
                    [store(x)], views=[view], tol=(2e-3, 2e-3))
    assert_close(ours.running_mean, theirs.running_mean, 1e-6, 1e-6)
    assert_close(ours.running_var, theirs.running_var, 1e-3, 1e-9)
    assert int(ours.num_batches_tracked.item()) == 2


def test_norm_settings_parse():
    s = norm_common.NormSettings.parse("depth=2, row_tile=8192")
    assert (s.depth, s.row_tile, s.bn_tile) == (2, 8192, 4096)
    with pytest.raises(ValueError, match="unknown setting"):
        norm_common.NormSettings.parse("tile=3")
    with pytest.raises(ValueError, match="depth and half_depth must be 1 or 2"):
        norm_common.NormSettings.parse("half_depth=3")


def test_fused_batch_norm_keeps_channels_last():
    x = td.randn(2, 3, 4, 5).permute(0, 3, 1, 2)  # [N, C, H, W] with C innermost
    with td.use_backend("triton"):
        y = F.batch_norm(x, None, None, training=True)
    assert y._data.stride()[1] == 1


# --------------------------------------------------------------------------------- modules


def test_modules_state_dict_keys_match_torch():
    pairs = [(nn.LayerNorm(8), torch.nn.LayerNorm(8)),
             (nn.LayerNorm(8, bias=False), torch.nn.LayerNorm(8, bias=False)),
             (nn.RMSNorm([2, 4]), torch.nn.RMSNorm([2, 4])),
             (nn.GroupNorm(2, 4), torch.nn.GroupNorm(2, 4)),
             (nn.GroupNorm(2, 4, affine=False), torch.nn.GroupNorm(2, 4, affine=False)),
             (nn.BatchNorm2d(4), torch.nn.BatchNorm2d(4)),
             (nn.BatchNorm1d(4, affine=False, track_running_stats=False),
              torch.nn.BatchNorm1d(4, affine=False, track_running_stats=False))]
    for ours, theirs in pairs:
        state, expected = ours.state_dict(), theirs.state_dict()
        assert list(state) == list(expected), type(ours).__name__
        for key in state:
            assert_close(state[key], expected[key], 0, 0, name=key)


def test_layer_norm_module_forward(backend_name):
    ours, theirs = nn.LayerNorm((3, 5), eps=1e-3), torch.nn.LayerNorm((3, 5), eps=1e-3)
    (x,) = arrays(40, (2, 3, 5))
    compare(ours, theirs, [x])


def test_sequential_fuses_batch_norm_and_activation(monkeypatch):
    """Sequential(BatchNorm2d, GELU) runs as one batch_norm node with the activation, with
    torch's results (forward and the input gradient)."""
    seen = []
    fused = norm_ops._batch_norm.fast[1]
    monkeypatch.setattr(norm_ops._batch_norm, "fast", ("batch_norm", lambda *a: seen.append(
        a[8]) or fused(*a)))
    ours = nn.Sequential(nn.BatchNorm2d(3), nn.GELU(), nn.BatchNorm2d(3), nn.ReLU())
    theirs = torch.nn.Sequential(torch.nn.BatchNorm2d(3), torch.nn.GELU(),
                                 torch.nn.BatchNorm2d(3), torch.nn.ReLU())
    (x,) = arrays(41, (2, 3, 3, 2))
    with td.use_backend("triton"):
        compare(ours, theirs, [x])
    assert seen == ["gelu", "relu"]
    assert nn.normalization.fused_activation(nn.BatchNorm1d(3), nn.GELU("tanh")) is None


def test_empty_rows(backend_name):
    x = td.zeros(0, 5, requires_grad=True)
    y = F.layer_norm(x, (5,), td.ones(5), td.zeros(5))
    assert tuple(y.shape) == (0, 5)
    y.sum().backward()
    assert tuple(x.grad.shape) == (0, 5)


class _Block:
    """A ResNet basic block, conv-bn-relu-conv-bn + skip, relu; in torch or in tritonad."""

    def __init__(self, lib, channels=4):
        self.lib = lib
        self.body = lib.nn.Sequential(
            lib.nn.Conv2d(channels, channels, 3, padding=1, bias=False),
            lib.nn.BatchNorm2d(channels), lib.nn.ReLU(),
            lib.nn.Conv2d(channels, channels, 3, padding=1, bias=False),
            lib.nn.BatchNorm2d(channels))

    def __call__(self, x):
        return self.lib.nn.functional.relu(self.body(x) + x)


def test_resnet_block_trains_as_torch():
    """Two SGD steps of a ResNet block with BatchNorm (numpy backend) from torch's weights:
    losses, weights and running statistics as torch's."""
    theirs = _Block(torch)
    ours = _Block(td)
    with td.use_backend("numpy"):
        ours.body.load_state_dict({k: td.tensor(v.numpy()) for k, v in
                                   theirs.body.state_dict().items()})
        opt = td.optim.SGD(ours.body.parameters(), lr=0.1)
        for step in range(2):
            (x, target) = arrays(60 + step, (3, 4, 5, 5), (3, 4, 5, 5))
            loss = ((ours(td.tensor(x, dtype=td.float32)) - td.tensor(target, dtype=td.float32))
                    ** 2).mean()
            loss_pt = ((theirs(torch.tensor(x, dtype=torch.float32)) - torch.tensor(target))
                       ** 2).mean()
            opt.zero_grad(), theirs.body.zero_grad()
            loss.backward(), loss_pt.backward()
            opt.step()
            with torch.no_grad():  # (torch.optim's first import costs seconds)
                for p in theirs.body.parameters():
                    p -= 0.1 * p.grad
            assert_close(loss, loss_pt.detach(), 1e-5, 1e-6, name=f"loss {step}")
        state, expected = ours.body.state_dict(), theirs.body.state_dict()
        assert list(state) == list(expected)
        for key in state:
            assert_close(state[key], expected[key], 1e-4, 1e-5, name=key)


@pytest.mark.parametrize("call, message", [
    (lambda x: F.layer_norm(x, (5,)), "does not end with"),
    (lambda x: F.layer_norm(x, (4,), td.ones(3)), "weight of shape"),
    (lambda x: F.group_norm(x, 2), "must be positive and divide"),
    (lambda x: F.batch_norm(x[:1, :, :1], None, None, training=True), "more than 1 value"),
    (lambda x: F.batch_norm(x, None, None), "running_mean and running_var are needed"),
    (lambda x: F.batch_norm_act(x, None, None, training=True, activation="tanh"),
     "activation must be"),
    (lambda x: nn.BatchNorm2d(3)(x), "expected a 4-d input"),
    (lambda x: F.batch_norm(x, td.zeros(3), td.ones(3), training=True, momentum=None),
     "needs num_batches_tracked"),
])
def test_bad_arguments_raise(call, message):
    x = td.zeros(2, 3, 4)
    with pytest.raises((ValueError, TypeError), match=message):
        call(x)


@settings(max_examples=4)
@given(rows=st.sampled_from([1, 3, 8]), cols=st.sampled_from([17, 64, 300]),
       scale=st.sampled_from([1e-3, 1.0, 1e3]), shift=st.sampled_from([0.0, 10.0]))
def test_layer_norm_rows_have_zero_mean_unit_variance(rows, cols, scale, shift):
    """Any scale, and a mean far from 0 (shift standard deviations): the statistics are taken
    about the mean, so float32 keeps the digits."""
    (x,) = arrays(rows * cols, (rows, cols), scale=scale, shift=shift * scale)
    with td.use_backend("triton"):
        y = F.layer_norm(td.tensor(x, dtype=td.float32), (cols,), eps=0.0).numpy()
    assert np.allclose(y.mean(1), 0.0, atol=1e-4)
    assert np.allclose(y.var(1), 1.0, atol=1e-3)


# ---------------------------------------------------------------------------------- GPU


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [td.float32, td.bfloat16])
@pytest.mark.parametrize("shape", [(4096, 384), (1024, 4096), (257, 16384), (16384, 384),
                                   (8192, 4096), (1000, 1000)])
def test_gpu_row_norms_against_torch(dtype, shape):
    """The bench shapes and odd ones (a stripe of rows that is not a multiple of the rows a
    step; 1000 columns in a 1024 block)."""
    rows, cols = shape
    x, w, b = arrays(50, shape, (cols,), (cols,))
    tol = (2e-2, 2e-2) if dtype is td.bfloat16 else (1e-4, 1e-4)
    compare(lambda x, w, b: F.layer_norm(x, (cols,), w, b),
            lambda x, w, b: TF.layer_norm(x, (cols,), w, b), [x, w, b], dtype=dtype,
            tol=tol)
    compare(lambda x, w: F.rms_norm(x, (cols,), w), lambda x, w: TF.rms_norm(x, (cols,), w),
            [x, w], dtype=dtype, tol=tol)


@pytest.mark.gpu
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("dtype", [td.float32, td.bfloat16])
@pytest.mark.parametrize("activation", [None, "gelu"])
@pytest.mark.parametrize("shape", [(64, 128, 14, 14), (512, 256, 7, 7), (3, 300, 5, 7),
                                   (100, 64, 17, 19)])
def test_gpu_batch_norm_against_torch(layout, dtype, activation, shape):
    """The bench shapes; 300 channels (two channel blocks, a part-masked one) on an odd plane;
    an odd plane whose tiles do not split evenly over the programs (channels-last: 1010 tiles,
    337 stripes of 3, the last of 2)."""
    store, view = LAYOUTS[layout]
    c = shape[1]
    x, w, b = arrays(51, shape, (c,), (c,), shift=1.0)
    act = {None: lambda y: y, "gelu": TF.gelu}[activation]
    tol = (3e-2, 3e-2) if dtype is td.bfloat16 else (1e-3, 1e-4)
    compare(lambda x, w, b: F.batch_norm_act(x, None, None, w, b, True,
                                             activation=activation),
            lambda x, w, b: act(TF.batch_norm(x, None, None, w, b, training=True)),
            [store(x), w, b], views=[view, None, None], dtype=dtype, tol=tol)


@pytest.mark.gpu
@pytest.mark.parametrize("channels_last", [False, True])
def test_gpu_batch_norm_running_stats_under_cuda_graph(channels_last):
    """A captured training step updates the running statistics at every replay."""
    _captured_running_stats(channels_last)


def _captured_running_stats(channels_last):
    from tritonad.capture import CapturedStep

    ours, theirs = nn.BatchNorm2d(8, momentum=None), torch.nn.BatchNorm2d(8, momentum=None)
    ours = ours.to("cuda")
    theirs = theirs.cuda()
    (x,) = arrays(52, (4, 8, 5, 5), shift=2.0)
    if channels_last:
        x_td = td.tensor(np.ascontiguousarray(x.transpose(0, 2, 3, 1)), dtype=td.float32,
                         device="cuda").permute(0, 3, 1, 2)
    else:
        x_td = td.tensor(x, dtype=td.float32, device="cuda")

    def step(x):
        return ours(x, activation="relu").sum()

    captured = CapturedStep(step, warmup=1)
    for _ in range(5):
        captured(x_td)
        theirs(torch.tensor(x, dtype=torch.float32, device="cuda"))
    assert captured.captured
    assert_close(ours.running_mean, theirs.running_mean, 1e-5, 1e-6)
    assert_close(ours.running_var, theirs.running_var, 1e-5, 1e-6)
    assert int(ours.num_batches_tracked.item()) == 5


@pytest.mark.gpu
def test_gpu_weight_gradients_are_deterministic():
    """dweight and dbias are fixed-order sums (no float atomics): the same bits every run."""
    x, w, b, xb, wb, bb = arrays(53, (8192, 384), (384,), (384,), (128, 64, 7, 7), (64,), (64,))
    grads = []
    for _ in range(2):
        ws = [td.tensor(a, dtype=td.float32, requires_grad=True) for a in (w, b, wb, bb)]
        y = F.layer_norm(td.tensor(x, dtype=td.float32), (384,), ws[0], ws[1])
        z = F.batch_norm(td.tensor(xb, dtype=td.float32), None, None, ws[2], ws[3], True)
        (y.square().sum() + z.square().sum()).backward()
        grads.append([t.grad.numpy() for t in ws])
    for a, e in zip(*grads):
        assert np.array_equal(a, e)
