"""tril, triu, mm, bmm and einsum (tritonad/autodiff/tensor_ops.py): composites over existing
ops, checked forward and backward against PyTorch's CPU implementation on both backends, and
their argument errors."""
import numpy as np
import pytest
import torch

import tritonad as td
from tritonad.autodiff import gradcheck

RNG = np.random.default_rng(0)


def rand(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def check(td_fn, torch_fn, *arrays, atol=1e-4):
    """Forward and the gradients of every input under a random cotangent, against torch."""
    xs = [td.tensor(a).requires_grad_() for a in arrays]
    ts = [torch.tensor(a, requires_grad=True) for a in arrays]
    y, yt = td_fn(*xs), torch_fn(*ts)
    assert tuple(y.shape) == tuple(yt.shape)
    np.testing.assert_allclose(y.numpy(), yt.detach().numpy(), rtol=1e-4, atol=atol)
    cot = RNG.standard_normal(tuple(yt.shape)).astype(np.float32)
    y.backward(td.tensor(cot))
    yt.backward(torch.tensor(cot))
    for x, t in zip(xs, ts):
        np.testing.assert_allclose(x.grad.numpy(), t.grad.numpy(), rtol=1e-4, atol=atol)


EINSUM = [
    ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),           # batched matmul
    ("bhqd,bhkd->bhqk", [(2, 3, 4, 5), (2, 3, 6, 5)]),  # attention scores
    ("ij->ji", [(3, 4)]),                               # transpose
    ("ii->", [(4, 4)]),                                 # trace
    ("ii->i", [(4, 4)]),                                # diagonal
    ("i,j->ij", [(3,), (5,)]),                          # outer product
    ("...ij,...jk->...ik", [(2, 3, 4), (4, 5)]),        # ellipsis, broadcast batch
    ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 5)]),         # a chain
    ("ij,ij->", [(3, 4), (3, 4)]),                      # full contraction
    ("bij->bj", [(2, 3, 4)]),                           # a sum
    ("ij", [(3, 4)]),                                   # implicit output
    ("ba,ca", [(3, 2), (4, 2)]),                        # implicit output, sorted letters
]


@pytest.mark.parametrize("equation,shapes", EINSUM)
def test_einsum_matches_torch(equation, shapes):
    with td.use_backend("numpy"):
        check(lambda *xs: td.einsum(equation, *xs), lambda *ts: torch.einsum(equation, *ts),
              *[rand(*s) for s in shapes])


def test_einsum_on_the_kernels(backend_name):
    check(lambda a, b: td.einsum("b i j, b k j -> b i k", a, b),
          lambda a, b: torch.einsum("bij,bkj->bik", a, b), rand(2, 3, 5), rand(2, 4, 5))
    check(lambda a: td.einsum("ii", a), lambda a: torch.einsum("ii", a), rand(3, 3))


def test_einsum_gradients_float64_differences():
    a = td.tensor(RNG.standard_normal((2, 3))).requires_grad_()
    b = td.tensor(RNG.standard_normal((3, 3))).requires_grad_()
    assert gradcheck(lambda x, y: td.einsum("ij,jj->ij", x, y), [a, b])


def test_einsum_errors():
    a = td.tensor(rand(2, 3))
    with pytest.raises(ValueError, match="einsum"):
        td.einsum("ij,jk->ik", a, a)      # sizes 3 and 2 for j
    with pytest.raises(ValueError, match="einsum"):
        td.einsum("ijk->i", a)            # too many letters
    with pytest.raises(ValueError, match="einsum"):
        td.einsum("ij->iz", a)            # z appears nowhere
    with pytest.raises(ValueError, match="einsum"):
        td.einsum("ij,jk->ik", a)         # one operand missing


@pytest.mark.parametrize("diagonal", [1, -2])
def test_tril_triu(backend_name, diagonal):
    x = rand(2, 4, 5)
    check(lambda v: td.tril(v, diagonal), lambda t: torch.tril(t, diagonal), x)
    check(lambda v: v.triu(diagonal), lambda t: t.triu(diagonal), x)
    ints = td.tensor(np.arange(12).reshape(3, 4))
    assert td.tril(ints).dtype is td.int64
    assert td.triu(ints, 1).tolist() == torch.triu(torch.arange(12).reshape(3, 4), 1).tolist()


def test_tril_needs_two_dims():
    with pytest.raises(ValueError, match="tril"):
        td.tril(td.tensor(rand(3)))


def test_mm_bmm(backend_name):
    check(td.mm, torch.mm, rand(3, 4), rand(4, 5))
    check(lambda a, b: a.bmm(b), torch.bmm, rand(2, 3, 4), rand(2, 4, 5))
    with pytest.raises(ValueError, match="mm"):
        td.mm(td.tensor(rand(3, 4)), td.tensor(rand(3, 4)))
    with pytest.raises(ValueError, match="mm"):
        td.mm(td.tensor(rand(2, 3, 4)), td.tensor(rand(4, 5)))
    with pytest.raises(ValueError, match="bmm"):
        td.bmm(td.tensor(rand(2, 3, 4)), td.tensor(rand(3, 4, 5)))


# ------------------------------------------------------------------------ pad, conv1d, pooling

import tritonad.nn.functional as F  # noqa: E402
from tritonad import nn  # noqa: E402


@pytest.mark.parametrize("mode,amounts", [("constant", (1, 2, 0, 3)), ("constant", (-1, 2)),
                                          ("reflect", (2, 1, 1, 3)), ("replicate", (0, 3, 2, 1)),
                                          ("circular", (-1, 2, 3, 1))])
def test_pad_modes(backend_name, mode, amounts):
    x = rand(2, 3, 5, 6)
    check(lambda v: F.pad(v, amounts, mode), lambda t: torch.nn.functional.pad(t, amounts, mode),
          x)


def test_pad_value_and_errors():
    x = rand(2, 4)
    got = F.pad(td.tensor(x), (1, 1), value=-2.5).numpy()
    np.testing.assert_array_equal(got, torch.nn.functional.pad(torch.tensor(x), (1, 1),
                                                               value=-2.5).numpy())
    with pytest.raises(ValueError, match="pad"):
        F.pad(td.tensor(x), (4, 0), mode="reflect")    # not smaller than the dim
    with pytest.raises(ValueError, match="pad"):
        F.pad(td.tensor(x), (1, 1, 1), mode="constant")
    with pytest.raises(ValueError, match="pad"):
        F.pad(td.tensor(x), (1, 1), mode="wrap")


def test_conv1d(backend_name):
    x, w, b = rand(2, 4, 11), rand(6, 2, 3), rand(6)
    check(lambda *v: F.conv1d(*v, stride=2, padding=1, dilation=2, groups=2),
          lambda *t: torch.nn.functional.conv1d(*t, stride=2, padding=1, dilation=2, groups=2),
          x, w, b, atol=3e-2)  # (float32 convolution runs at TF32 by default, as torch's)
    layer = nn.Conv1d(4, 3, 3, padding="same", bias=False)
    assert layer(td.tensor(x)).shape == (2, 3, 11)
    assert layer.weight.shape == (3, 4, 3)


@pytest.mark.parametrize("size", [1, (1, 3), (2, 4)])
def test_adaptive_avg_pool2d(size):
    # global (one mean), bins that tile the plane (avg_pool2d), uneven bins (per-bin means)
    x = rand(2, 3, 5, 6)
    check(lambda v: F.adaptive_avg_pool2d(v, size),
          lambda t: torch.nn.functional.adaptive_avg_pool2d(t, size), x, atol=1e-5)
    assert nn.AdaptiveAvgPool2d(size)(td.tensor(x)).shape == \
        torch.nn.AdaptiveAvgPool2d(size)(torch.tensor(x)).shape


def test_adaptive_avg_pool2d_on_the_kernels(backend_name):
    x = rand(2, 3, 4, 6)
    for size in (1, (2, 3)):
        check(lambda v: F.adaptive_avg_pool2d(v, size),
              lambda t: torch.nn.functional.adaptive_avg_pool2d(t, size), x, atol=1e-5)


@pytest.mark.parametrize("geometry", [dict(stride=2, padding=1, output_padding=1, groups=2),
                                      dict(stride=1, padding=0, dilation=2)])
def test_conv_transpose2d(backend_name, geometry):
    groups = geometry.get("groups", 1)
    x, w, b = rand(2, 4, 3, 4), rand(4, 6 // groups, 3, 3), rand(6)
    with _conv_precision("highest"):  # float32 accuracy, not TF32
        check(lambda *v: F.conv_transpose2d(*v, **geometry),
              lambda *t: torch.nn.functional.conv_transpose2d(*t, **geometry), x, w, b,
              atol=1e-3)
    layer = nn.ConvTranspose2d(4, 2, 2, stride=2)
    assert layer(td.tensor(x)).shape == (2, 2, 6, 8)


def test_conv_transpose2d_errors():
    x = td.tensor(rand(1, 4, 3, 3))
    with pytest.raises(ValueError, match="conv_transpose2d"):
        F.conv_transpose2d(x, td.tensor(rand(3, 2, 3, 3)))             # channels differ
    with pytest.raises(ValueError, match="conv_transpose2d"):
        F.conv_transpose2d(x, td.tensor(rand(4, 2, 3, 3)), output_padding=1)  # >= stride


class _conv_precision:
    def __init__(self, precision):
        self.precision = precision

    def __enter__(self):
        self.saved = td.conv_precision()
        td.set_conv_precision(self.precision)

    def __exit__(self, *exc):
        td.set_conv_precision(self.saved)


@pytest.mark.parametrize("options", [dict(scale_factor=2), dict(size=(7, 5)),
                                     dict(size=(3, 9), mode="bilinear"),
                                     dict(scale_factor=2, mode="bilinear", align_corners=True),
                                     dict(scale_factor=0.5, mode="bilinear")])
def test_interpolate(options):
    check(lambda v: F.interpolate(v, **options),
          lambda t: torch.nn.functional.interpolate(t, **options), rand(2, 3, 4, 6), atol=1e-5)


def test_upsample_layer():
    x = rand(1, 2, 3, 4)
    got = nn.Upsample(scale_factor=2, mode="bilinear")(td.tensor(x)).numpy()
    want = torch.nn.Upsample(scale_factor=2, mode="bilinear")(torch.tensor(x)).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_interpolate_on_the_kernels(backend_name):
    check(lambda v: F.interpolate(v, size=(5, 3), mode="bilinear"),
          lambda t: torch.nn.functional.interpolate(t, size=(5, 3), mode="bilinear"),
          rand(1, 2, 3, 4), atol=1e-5)


def test_interpolate_errors():
    x = td.tensor(rand(1, 1, 2, 2))
    with pytest.raises(ValueError, match="interpolate"):
        F.interpolate(x)                                   # neither size nor scale_factor
    with pytest.raises(ValueError, match="interpolate"):
        F.interpolate(x, size=3, scale_factor=2)
    with pytest.raises(ValueError, match="interpolate"):
        F.interpolate(x, size=3, mode="bicubic")
    with pytest.raises(ValueError, match="interpolate"):
        F.interpolate(td.tensor(rand(2, 3)), size=3)
