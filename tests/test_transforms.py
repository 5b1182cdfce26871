"""tritonad.transforms: ToTensor and Normalize against numpy, and the batch augmentations
(RandomAffine, RandomRotation, RandomCrop): the kernel against the numpy reference, and the
geometry against independent oracles (np.rot90, shifted and padded copies)."""
import numpy as np
import pytest
import torch
from PIL import Image

import tritonad as td
from tritonad import transforms as T
from tritonad.kernels import augment
from tritonad.reference import NumpyBackend

from conftest import HAS_GPU
from helpers import assert_close


def images(shape, seed=0, dtype=np.float32):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def shifted(img, dy, dx, fill):
    """img [..., H, W] moved down by dy and right by dx, uncovered pixels = fill."""
    h, w = img.shape[-2:]
    out = np.full_like(img, fill)
    ys, yd = (slice(0, h - dy), slice(dy, h)) if dy >= 0 else (slice(-dy, h), slice(0, h + dy))
    xs, xd = (slice(0, w - dx), slice(dx, w)) if dx >= 0 else (slice(-dx, w), slice(0, w + dx))
    out[..., yd, xd] = img[..., ys, xs]
    return out


# ---------------------------------------------------------------------- ToTensor, Normalize
def test_to_tensor_follows_torchvision():
    gray = np.random.default_rng(0).integers(0, 256, (5, 3), dtype=np.uint8)
    x = T.ToTensor()(gray)
    assert x.shape == (1, 5, 3) and x.dtype is td.float32 and x.device.type == "cpu"
    assert_close(x, gray[None].astype(np.float32) / np.float32(255), 0, 0)
    rgb = np.random.default_rng(1).integers(0, 256, (4, 6, 3), dtype=np.uint8)
    assert_close(T.ToTensor()(rgb), rgb.transpose(2, 0, 1) / np.float32(255), 0, 0)
    assert_close(T.ToTensor()(Image.fromarray(rgb)), rgb.transpose(2, 0, 1) / np.float32(255),
                 0, 0)
    assert_close(T.ToTensor()(Image.fromarray(gray)), x, 0, 0)
    floats = images((2, 2, 3), dtype=np.float64)  # not uint8: values and type kept
    y = T.ToTensor()(floats)
    assert y.dtype is td.float64 and np.array_equal(y.numpy(), floats.transpose(2, 0, 1))
    # the batch form (the DataLoader's resident path) gives the same values
    stack = np.stack([gray, gray[::-1]])
    batch = T.ToTensor.batch(td.tensor(stack))
    assert batch.shape == (2, 1, 5, 3)
    assert_close(batch[1], T.ToTensor()(np.ascontiguousarray(gray[::-1])), 0, 0)
    assert_close(T.ToTensor.batch(td.tensor(rgb[None])), T.ToTensor()(rgb)[None], 0, 0)
    with pytest.raises(TypeError, match="ToTensor: expected a numpy array .* got Tensor"):
        T.ToTensor()(x)
    with pytest.raises(ValueError, match=r"\[H, W\] or \[H, W, C\], got an array of shape \(7,\)"):
        T.ToTensor()(np.zeros(7, np.uint8))


def test_normalize_per_channel(backend_name):
    x = images((2, 3, 4, 5))
    mean, std = (0.5, -1.0, 2.0), (0.25, 2.0, 4.0)
    expected = (x - np.float32(mean)[:, None, None]) / np.float32(std)[:, None, None]
    norm = T.Normalize(mean, std)
    assert_close(norm(td.tensor(x)), expected, 1e-6, 1e-6)  # a batch
    assert_close(norm(td.tensor(x[1])), expected[1], 1e-6, 1e-6)  # one image
    one = T.Normalize((0.1307,), (0.3081,))  # one value for every channel
    assert_close(one(td.tensor(x)), (x - np.float32(0.1307)) / np.float32(0.3081), 1e-6, 1e-6)
    t = td.tensor(x)
    assert T.Normalize(mean, std, inplace=True)(t) is t
    assert_close(t, expected, 1e-6, 1e-6)
    leaf = td.tensor(x, requires_grad=True)  # differentiable, as torchvision's
    norm(leaf).sum().backward()
    assert_close(leaf.grad, np.broadcast_to(1 / np.float32(std)[:, None, None], x.shape), 1e-6,
                 1e-6)
    half = norm(td.tensor(x).half())
    assert half.dtype is td.float16
    assert_close(half, expected, 2e-3, 2e-3)
    with pytest.raises(ValueError, match="std .* has a zero"):
        T.Normalize((0.0, 0.0), (1.0, 0.0))
    with pytest.raises(ValueError, match="2 means but 3 stds"):
        T.Normalize((0.0, 0.0), (1.0, 1.0, 1.0))
    with pytest.raises(ValueError, match=r"3 means and stds for images of 2 channels"):
        norm(td.tensor(x[:, :2]))
    with pytest.raises(ValueError, match="got uint8 .*put ToTensor"):
        one(td.tensor(np.zeros((1, 2, 2), np.uint8)))
    with pytest.raises(TypeError, match="put ToTensor"):
        one(np.zeros((1, 2, 2), np.float32))


def test_compose_and_its_errors():
    pipeline = T.Compose([T.ToTensor(), T.Normalize((0.5,), (0.5,))])
    gray = np.array([[0, 255], [51, 102]], np.uint8)
    assert_close(pipeline(gray), (gray[None] / np.float32(255) - np.float32(0.5)) /
                 np.float32(0.5), 1e-6, 1e-6)
    assert "ToTensor()" in repr(pipeline)
    with pytest.raises(TypeError, match="every transform must be callable, got int"):
        T.Compose([T.ToTensor(), 3])


# ---------------------------------------------------------------------- the kernel
WARPS = [  # (name, out size or None for the input's, crop, ranges)
    ("affine", None, False, (-45.0, 30.0, 2.0, 1.0, 0.7, 1.3)),
    ("rotation", None, False, (-180.0, 180.0, 0.0, 0.0, 1.0, 1.0)),
    ("crop", (4, 6), True, (2.0, 3.0, 3.0, 2.0)),
    ("crop-large", (9, 9), True, (4.0, 4.0, 2.0, 4.0)),
]


@pytest.mark.parametrize("name,size,crop,ranges", WARPS, ids=[w[0] for w in WARPS])
@pytest.mark.parametrize("bilinear", [False, True])
@pytest.mark.parametrize("shape", [(3, 2, 5, 7), (1, 1, 1, 1), (2, 3, 8, 8)])
def test_kernel_matches_the_reference(name, size, crop, ranges, bilinear, shape):
    x = torch.from_numpy(images(shape, seed=len(name)))
    size = size or shape[2:]
    got = augment.random_warp(x, size, crop, ranges, 0.5, bilinear, seed=2 ** 40 + 3,
                              offset=2 ** 32 - 2)  # counters cross a 32-bit boundary
    expected = NumpyBackend().random_warp(x, size, crop, ranges, 0.5, bilinear, 2 ** 40 + 3,
                                          2 ** 32 - 2)
    assert got.shape == (shape[0], shape[1], *size)
    # the interpreter evaluates the kernel's float32 steps as numpy does: bit for bit
    assert_close(got, expected, 0, 0, name=f"{name} bilinear={bilinear}")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_kernel_half_precision_and_strides(dtype):
    base = torch.from_numpy(images((3, 6, 4, 2)))  # viewed as [2, 3, 6, 4], not contiguous
    x = base.permute(3, 0, 1, 2).to(dtype)
    x = x.as_strided(x.shape, x.stride())
    ranges = (-20.0, 20.0, 1.0, 1.0, 0.9, 1.1)
    got = augment.random_warp(x, (6, 4), False, ranges, -1.0, True, 5, 0)
    expected = NumpyBackend().random_warp(x, (6, 4), False, ranges, -1.0, True, 5, 0)
    assert got.dtype == dtype and not x.is_contiguous()
    assert_close(got, expected, 0, 0)


def test_kernel_argument_errors():
    x = torch.zeros(2, 1, 4, 4)
    with pytest.raises(ValueError, match=r"images must be \[N, C, H, W\], got shape \(1, 4, 4\)"):
        augment.random_warp(x[0], (4, 4), False, (0,) * 6, 0, False, 0, 0)
    with pytest.raises(TypeError, match="float32, float16 or bfloat16, got uint8"):
        augment.random_warp(x.to(torch.uint8), (4, 4), False, (0,) * 6, 0, False, 0, 0)
    with pytest.raises(ValueError, match=r"keeps the image size \(4, 4\), got an output size"):
        augment.random_warp(x, (3, 4), False, (0,) * 6, 0, False, 0, 0)
    with pytest.raises(ValueError, match="crop takes 4 ranges, got 6"):
        augment.random_warp(x, (3, 4), True, (0,) * 6, 0, False, 0, 0)
    assert augment.random_warp(x[:0], (2, 2), True, (0,) * 4, 0, False, 0, 0).shape == \
        (0, 1, 2, 2)


# ---------------------------------------------------------------------- geometry
@pytest.fixture(params=["numpy", "triton"])
def on_backend(request):
    with td.use_backend(request.param):
        yield request.param


@pytest.mark.parametrize("bilinear", [False, True])
def test_no_rotation_or_shift_is_the_identity(on_backend, bilinear):
    x = images((4, 2, 5, 7))
    mode = "bilinear" if bilinear else "nearest"
    for transform in (T.RandomAffine(0, interpolation=mode), T.RandomRotation(0),
                      T.RandomAffine(0, translate=(0, 0), scale=(1, 1)),
                      T.RandomCrop((5, 7))):
        assert_close(transform(td.tensor(x)), x, 0, 0, name=repr(transform))


@pytest.mark.parametrize("bilinear", [False, True])
def test_rotations_by_right_angles(on_backend, bilinear):
    """Counter-clockwise as seen, about the centre: np.rot90 for square images."""
    x = images((3, 2, 6, 6))
    mode = T.InterpolationMode.BILINEAR if bilinear else T.InterpolationMode.NEAREST
    # NOTE: cos(90 degrees) is -4e-8 in float32: bilinear weights are off by that much
    tolerance = 1e-5 if bilinear else 0
    for degrees, k in ((90, 1), (-90, -1), (180, 2)):
        rotated = T.RandomRotation((degrees, degrees), interpolation=mode)(td.tensor(x))
        assert_close(rotated, np.rot90(x, k, axes=(2, 3)), tolerance, tolerance,
                     name=f"{degrees} degrees")
    # a non-square image turned by 90 degrees: its corners go round, the rest is fill
    tall = np.zeros((1, 1, 5, 3), np.float32)
    tall[0, 0, 1, 0] = 1.0  # up and left of the centre (1, 2)
    out = T.RandomRotation((90, 90), fill=-1)(td.tensor(tall)).numpy()[0, 0]
    assert out[3, 0] == 1.0 and out[1:4].sum() == 1.0  # -> down and left of it
    assert (out[[0, 4]] == -1).all()  # rows that the turned 3 wide image does not reach


def test_shifts_are_whole_pixels_within_range(on_backend):
    x = images((24, 1, 6, 9), seed=3)
    out = T.RandomAffine(0, translate=(0.3, 0.5), fill=7.0)(td.tensor(x)).numpy()
    seen = set()
    for i in range(len(x)):  # each output is its input moved by a whole-pixel (dy, dx)
        found = [(dy, dx) for dy in range(-3, 4) for dx in range(-3, 4)
                 if np.array_equal(out[i], shifted(x[i], dy, dx, 7.0))]
        assert found, f"sample {i} is not a shifted copy of its input"
        dy, dx = found[0]
        assert abs(dx) <= 0.3 * 9 + 0.5 and abs(dy) <= 0.5 * 6 + 0.5
        seen.add((dy, dx))
    assert len(seen) > 8  # every image draws its own shift


def test_random_crop_takes_windows_of_the_padded_image(on_backend):
    x = images((24, 2, 5, 6), seed=4)
    out = T.RandomCrop((4, 5), padding=(1, 2), fill=-3.0)(td.tensor(x)).numpy()
    padded = np.pad(x, ((0, 0), (0, 0), (2, 2), (1, 1)), constant_values=-3.0)
    corners = set()
    for i in range(len(x)):
        found = [(t, l) for t in range(9 - 4 + 1) for l in range(8 - 5 + 1)
                 if np.array_equal(out[i], padded[i, :, t:t + 4, l:l + 5])]
        assert found, f"sample {i} is not a window of its padded image"
        corners.add(found[0])
    assert len(corners) > 6
    # pad_if_needed: a window larger than the image; torchvision grows both sides
    small = T.RandomCrop(8, pad_if_needed=True)(td.tensor(x[:2]))
    assert small.shape == (2, 2, 8, 8)
    with pytest.raises(ValueError, match=r"crop \(8, 8\) is larger than the padded image "
                                         r"\(5, 6\); pass pad_if_needed=True"):
        T.RandomCrop(8)(td.tensor(x))


def test_same_seed_same_batch_on_every_backend():
    x = images((6, 3, 7, 7), seed=5)
    transform = T.RandomAffine(25, translate=(0.2, 0.2), scale=(0.8, 1.2),
                               interpolation="bilinear")
    results = []
    for name in ("numpy", "triton"):
        with td.use_backend(name):
            td.manual_seed(42)
            results.append(transform(td.tensor(x)).numpy())
            results.append(transform(td.tensor(x)).numpy())  # the stream moved on
    assert_close(results[0], results[2], 0, 0, name="numpy vs triton")
    assert_close(results[1], results[3], 0, 0, name="numpy vs triton, second draw")
    assert not np.array_equal(results[0], results[1])


def test_one_image_and_dtypes(on_backend):
    x = images((2, 5, 5))
    out = T.RandomRotation(30)(td.tensor(x))
    assert out.shape == (2, 5, 5)
    assert T.RandomCrop(3, padding=1)(td.tensor(x).half()).dtype is td.float16


def test_augmentation_errors():
    x = td.tensor(images((2, 1, 4, 4)))
    cases = [
        (lambda: T.RandomAffine(-5), ValueError, "degrees must be non-negative"),
        (lambda: T.RandomAffine((10, -10)), ValueError, "min <= max"),
        (lambda: T.RandomAffine(5, translate=(0.5, 1.5)), ValueError, "two fractions"),
        (lambda: T.RandomAffine(5, translate=0.1), ValueError, "two fractions"),
        (lambda: T.RandomAffine(5, scale=(0, 1)), ValueError, "min > 0.0"),
        (lambda: T.RandomAffine(5, shear=10), NotImplementedError, "shear is not supported"),
        (lambda: T.RandomAffine(5, interpolation="bicubic"), ValueError, "'nearest' or"),
        (lambda: T.RandomAffine(5, fill=(0, 1, 2)), TypeError, "fill must be one number"),
        (lambda: T.RandomRotation(5, expand=True), NotImplementedError, "expand=True"),
        (lambda: T.RandomCrop(0), ValueError, "size must be a positive int"),
        (lambda: T.RandomCrop(3, padding=(1, 2, 3)), ValueError, "padding must be"),
        (lambda: T.RandomCrop(3, padding_mode="reflect"), NotImplementedError, "'reflect'"),
        (lambda: T.RandomRotation(5)(np.zeros((1, 4, 4), np.float32)), TypeError,
         "put ToTensor"),
        (lambda: T.RandomRotation(5)(td.zeros(1, 4, 4, dtype=td.uint8)), ValueError,
         "got uint8 .*put ToTensor"),
        (lambda: T.RandomRotation(5)(x.reshape(8, 4)), ValueError, r"shape \(8, 4\)"),
        (lambda: T.RandomRotation(5)(x.requires_grad_()), ValueError, "x.detach()"),
    ]
    for make, kind, message in cases:
        with pytest.raises(kind, match=message):
            make()


@pytest.mark.gpu
@pytest.mark.parametrize("name,size,crop,ranges", WARPS, ids=[w[0] for w in WARPS])
@pytest.mark.parametrize("bilinear", [False, True])
def test_compiled_kernel_matches_the_reference(name, size, crop, ranges, bilinear):
    """Compiled, the kernel's sin and cos may differ from numpy's in the last bits: bilinear
    values by that much, nearest picks only where a position lies within that of a tie."""
    x = torch.from_numpy(images((128, 3, 28, 28), seed=7))
    size = size or (28, 28)
    got = augment.random_warp(x.cuda(), size, crop, ranges, 0.5, bilinear, 11, 3).cpu()
    expected = NumpyBackend().random_warp(x, size, crop, ranges, 0.5, bilinear, 11, 3)
    if bilinear or crop:
        assert_close(got, expected, 1e-4, 1e-4)
    else:
        differ = (got != expected).float().mean().item()
        assert differ < 1e-3, f"{differ:.2%} of the nearest picks differ"
    assert HAS_GPU
