"""Image transforms, as torchvision's: Compose, ToTensor, Normalize, and random augmentation of
a whole batch on the device in one kernel (RandomAffine, RandomRotation, RandomCrop).

    from tritonad import transforms
    to_input = transforms.Compose([transforms.ToTensor(), transforms.Normalize((0.1307,), (0.3081,))])
    train = td.data.MNIST(train=True, transform=to_input)       # ds[i]: ([1, 28, 28], label)
    loader = td.data.DataLoader(train, batch_size=64, shuffle=True)   # still device-resident
    augment = transforms.RandomAffine(degrees=10, translate=(0.1, 0.1), scale=(0.9, 1.1))
    for x, y in loader:
        x = augment(x)      # [64, 1, 28, 28]: each image its own rotation, shift and scale

Where they compute: ToTensor on the host (numpy), giving a CPU tensor as torchvision does;
Normalize and the augmentations on their input's device with our kernels (a CPU tensor while the
backend runs on a GPU is computed by the numpy backend). The augmentations draw from
td.manual_seed's Philox stream, one counter per image, so a seed gives the same batch on every
backend. Unlike torchvision's, which draws one set of parameters per call, they give every image
of a batch its own parameters (the point of augmenting batches), and they do not track gradients.

A DataLoader over MNIST-like datasets keeps its device-resident path for a transform that starts
with ToTensor, then any Normalize, then any Normalize or augmentation: it applies ToTensor and
the leading Normalize to the whole image array once, and the rest to each batch.
"""
from __future__ import annotations

import contextlib
import numbers

import numpy as np

from . import dtypes, generator
from .autodiff import no_grad
from .backend import get_backend, use_backend
from .tensor import Tensor, tensor


def _computing(x: Tensor):
    """The backend to compute on x with: the current one, or the numpy reference for a CPU
    tensor while the current backend runs on a GPU (a sample's transform in a GPU program)."""
    if x.device.type == "cpu" and get_backend().default_device.type != "cpu":
        return use_backend("numpy")
    return contextlib.nullcontext()


class Compose:
    """Transforms applied one after another: `Compose([ToTensor(), Normalize(m, s)])(image)`."""

    def __init__(self, transforms):
        self.transforms = list(transforms)
        for t in self.transforms:
            if not callable(t):
                raise TypeError(f"Compose: every transform must be callable, got "
                                f"{type(t).__name__}")

    def __call__(self, x):
        for t in self.transforms:
            x = t(x)
        return x

    def __repr__(self):
        return "Compose(" + ", ".join(map(repr, self.transforms)) + ")"


class ToTensor:
    """An image as a float32 Tensor [C, H, W] on the CPU, as torchvision's ToTensor: a numpy
    array [H, W] or [H, W, C] or a PIL image; uint8 values are scaled to [0, 1] (x / 255),
    other types keep their values and type. `ToTensor()(np.zeros((28, 28), np.uint8))`"""

    def __call__(self, pic) -> Tensor:
        if hasattr(pic, "mode") and hasattr(pic, "getdata"):  # a PIL image
            pic = np.asarray(pic)
        if not isinstance(pic, np.ndarray):
            raise TypeError(f"ToTensor: expected a numpy array [H, W] or [H, W, C] or a PIL "
                            f"image, got {type(pic).__name__}")
        if pic.ndim not in (2, 3):
            raise ValueError(f"ToTensor: expected an image [H, W] or [H, W, C], got an array of "
                             f"shape {pic.shape}")
        chw = pic[None] if pic.ndim == 2 else pic.transpose(2, 0, 1)
        if pic.dtype == np.uint8:
            chw = chw.astype(np.float32) / np.float32(255)
        return tensor(np.ascontiguousarray(chw), device="cpu")

    @staticmethod
    def batch(images: Tensor) -> Tensor:
        """The same conversion for a stack of images on their device, with our kernels:
        images: [N, H, W] or [N, H, W, C] -> [N, C, H, W]."""
        if images.ndim not in (3, 4):
            raise ValueError(f"ToTensor: expected images [N, H, W] or [N, H, W, C], got "
                             f"{images.shape}")
        with no_grad():
            x = images.unsqueeze(1) if images.ndim == 3 else images.permute(0, 3, 1, 2)
            return x.float() / 255 if x.dtype is dtypes.uint8 else x

    def __repr__(self):
        return "ToTensor()"


def _per_channel(name, values):
    values = (values,) if isinstance(values, numbers.Number) else tuple(values)
    if not values or not all(isinstance(v, numbers.Number) for v in values):
        raise TypeError(f"Normalize: {name} must be a number or a sequence of numbers, got "
                        f"{values!r}")
    return tuple(float(v) for v in values)


class Normalize:
    """(x - mean[c]) / std[c] for each channel c of a float Tensor [..., C, H, W] (one image or
    a batch), as torchvision's Normalize. `Normalize((0.1307,), (0.3081,))`"""

    def __init__(self, mean, std, inplace=False):
        self.mean, self.std = _per_channel("mean", mean), _per_channel("std", std)
        self.inplace = bool(inplace)
        if len(self.mean) != len(self.std):
            raise ValueError(f"Normalize: {len(self.mean)} means but {len(self.std)} stds")
        if any(np.float32(s) == 0 for s in self.std):
            raise ValueError(f"Normalize: std {self.std} has a zero, which would divide by zero")
        self._channels = {}  # (device, dtype) -> (mean, std) as [C, 1, 1] tensors

    def __call__(self, x: Tensor) -> Tensor:
        if not isinstance(x, Tensor):
            raise TypeError(f"Normalize: expected a Tensor [..., C, H, W] (put ToTensor() "
                            f"before it), got {type(x).__name__}")
        if x.ndim < 3 or not x.dtype.is_floating_point:
            raise ValueError(f"Normalize: expected a floating point tensor [..., C, H, W], got "
                             f"{x.dtype.name} of shape {x.shape} (put ToTensor() before it)")
        channels = x.shape[-3]
        if len(self.mean) not in (1, channels):
            raise ValueError(f"Normalize: {len(self.mean)} means and stds for images of "
                             f"{channels} channels (shape {x.shape})")
        with _computing(x):  # NOTE: differentiable, as torchvision's
            if len(self.mean) == 1:  # Python numbers: no tensor to make
                mean, std = self.mean[0], self.std[0]
            else:
                key = (x.device, x.dtype)
                if key not in self._channels:
                    self._channels[key] = tuple(
                        tensor(v, dtype=x.dtype, device=x.device).reshape(-1, 1, 1)
                        for v in (self.mean, self.std))
                mean, std = self._channels[key]
            if self.inplace:
                return x.sub_(mean).div_(std)
            return (x - mean) / std

    def __repr__(self):
        return f"Normalize(mean={self.mean}, std={self.std})"


class InterpolationMode:
    """torchvision's names for the sampling of the augmentations."""
    NEAREST = "nearest"
    BILINEAR = "bilinear"


# ---------------------------------------------------------------------- batch augmentation
def _range(owner, name, value, low=None, symmetric=False):
    """(lo, hi) from a number d (-> (-d, d) if symmetric) or a pair, checked."""
    if isinstance(value, numbers.Number) and symmetric:
        if value < 0:
            raise ValueError(f"{owner}: {name} must be non-negative when it is one number, got "
                             f"{value}")
        lo, hi = -float(value), float(value)
    else:
        try:
            lo, hi = (float(v) for v in value)
        except (TypeError, ValueError):
            raise TypeError(f"{owner}: {name} must be {'a number or ' if symmetric else ''}a "
                            f"pair (min, max), got {value!r}") from None
    if not lo <= hi or (low is not None and not lo > low):
        raise ValueError(f"{owner}: {name} must be (min, max) with min <= max"
                         f"{f' and min > {low}' if low is not None else ''}, got {value!r}")
    return lo, hi


def _fill(owner, fill):
    if not isinstance(fill, numbers.Number):
        raise TypeError(f"{owner}: fill must be one number (a fill per channel is not "
                        f"supported yet), got {fill!r}")
    return float(fill)


class _RandomWarp:
    """A random geometric transform of each image of a batch, one kernel for the whole batch
    (Backend.random_warp). Subclasses say what to draw in _warp(height, width)."""

    bilinear = False

    def _interpolation(self, interpolation):
        mode = getattr(interpolation, "value", interpolation)  # torchvision's enum or a string
        if str(mode).lower() not in ("nearest", "bilinear"):
            raise ValueError(f"{type(self).__name__}: interpolation must be 'nearest' or "
                             f"'bilinear', got {interpolation!r}")
        self.bilinear = str(mode).lower() == "bilinear"

    def _warp(self, height, width):
        """(output size, crop, ranges) of Backend.random_warp for images of this size."""
        raise NotImplementedError

    def __call__(self, images: Tensor) -> Tensor:
        """images: [N, C, H, W] (or one image [C, H, W]), floating point, on any device."""
        name = type(self).__name__
        if not isinstance(images, Tensor):
            raise TypeError(f"{name}: expected a Tensor [N, C, H, W] or [C, H, W] (put "
                            f"ToTensor() before it), got {type(images).__name__}")
        if images.ndim not in (3, 4) or not images.dtype.is_floating_point:
            raise ValueError(f"{name}: expected float images [N, C, H, W] or [C, H, W], got "
                             f"{images.dtype.name} of shape {images.shape} (put ToTensor() "
                             f"before it)")
        if images.requires_grad:
            raise ValueError(f"{name}: augmentation does not track gradients; give it images "
                             f"that do not require grad (x.detach())")
        batch = images if images.ndim == 4 else images.unsqueeze(0)
        out_size, crop, ranges = self._warp(*batch.shape[2:])
        seed, offset = generator.take(batch.shape[0])  # one Philox counter per image
        with _computing(batch):
            raw = get_backend().random_warp(batch._data, out_size, crop, ranges, self.fill,
                                            self.bilinear, seed, offset)
        out = Tensor._wrap(raw)
        return out if images.ndim == 4 else out.squeeze(0)


class RandomAffine(_RandomWarp):
    """Each image rotated, shifted and scaled about its centre by its own random amounts:
    an angle in degrees (one number d: [-d, d]; counter-clockwise as seen is positive), a shift
    of up to translate = (a, b) times the width and height (rounded to whole pixels), a scale in
    scale = (lo, hi). The uncovered area takes `fill`. As torchvision's RandomAffine, but each
    image of a batch draws its own parameters; shear and center are not supported yet.
    `RandomAffine(degrees=10, translate=(0.1, 0.1), scale=(0.9, 1.1))(x)`"""

    def __init__(self, degrees, translate=None, scale=None, shear=None,
                 interpolation=InterpolationMode.NEAREST, fill=0, center=None):
        name = type(self).__name__
        self.degrees = _range(name, "degrees", degrees, symmetric=True)
        if translate is not None:
            pair = tuple(translate) if isinstance(translate, (tuple, list)) else ()
            if len(pair) != 2 or not all(isinstance(t, numbers.Real) and 0 <= t <= 1
                                         for t in pair):
                raise ValueError(f"{name}: translate must be two fractions (a, b) in [0, 1] of "
                                 f"the width and height, got {translate!r}")
            translate = tuple(float(t) for t in pair)
        self.translate = translate
        self.scale = _range(name, "scale", scale, low=0.0) if scale is not None else None
        if shear not in (None, 0) or center is not None:
            raise NotImplementedError(f"{name}: {'shear' if shear not in (None, 0) else 'center'}"
                                      f" is not supported yet")
        self._interpolation(interpolation)
        self.fill = _fill(name, fill)

    def _warp(self, height, width):
        max_dx, max_dy = (self.translate[0] * width, self.translate[1] * height) \
            if self.translate else (0.0, 0.0)
        scale = self.scale or (1.0, 1.0)
        return (height, width), False, (*self.degrees, max_dx, max_dy, *scale)

    def __repr__(self):
        return (f"{type(self).__name__}(degrees={self.degrees}, translate={self.translate}, "
                f"scale={self.scale}, bilinear={self.bilinear}, fill={self.fill})")


class RandomRotation(RandomAffine):
    """Each image rotated about its centre by its own random angle in degrees (one number d:
    [-d, d]), as torchvision's RandomRotation. `RandomRotation(15)(x)`"""

    def __init__(self, degrees, interpolation=InterpolationMode.NEAREST, expand=False,
                 center=None, fill=0):
        if expand:
            raise NotImplementedError("RandomRotation: expand=True is not supported yet")
        super().__init__(degrees, interpolation=interpolation, fill=fill, center=center)


class RandomCrop(_RandomWarp):
    """A window of `size` (h, w) at a random place of each padded image, as torchvision's
    RandomCrop. padding: one number for every side, (left/right, top/bottom), or (left, top,
    right, bottom); pad_if_needed pads images smaller than the window. `RandomCrop(28, 4)(x)`"""

    def __init__(self, size, padding=None, pad_if_needed=False, fill=0,
                 padding_mode="constant"):
        name = type(self).__name__
        size = (size, size) if isinstance(size, numbers.Number) else tuple(size)
        if len(size) != 2 or not all(isinstance(s, numbers.Integral) and s > 0 for s in size):
            raise ValueError(f"{name}: size must be a positive int or (height, width), got "
                             f"{size}")
        self.size = tuple(int(s) for s in size)
        pads = (0,) if padding is None else \
            (padding,) if isinstance(padding, numbers.Number) else tuple(padding)
        if len(pads) not in (1, 2, 4) or not all(isinstance(p, numbers.Integral) and p >= 0
                                                 for p in pads):
            raise ValueError(f"{name}: padding must be a non-negative int or a sequence of 2 or "
                             f"4 of them, got {padding!r}")
        # as (left, top, right, bottom)
        self.padding = tuple(int(p) for p in (pads * 4 if len(pads) == 1 else
                                              pads * 2 if len(pads) == 2 else pads))
        if padding_mode != "constant":
            raise NotImplementedError(f"{name}: padding_mode {padding_mode!r} is not supported "
                                      "yet; 'constant' pads with fill")
        self.pad_if_needed = bool(pad_if_needed)
        self.fill = _fill(name, fill)

    def _warp(self, height, width):
        left, top, right, bottom = self.padding
        out_h, out_w = self.size
        if self.pad_if_needed:  # as torchvision: both sides grow by the shortfall
            top, bottom = (p + max(out_h - (height + top + bottom), 0) for p in (top, bottom))
            left, right = (p + max(out_w - (width + left + right), 0) for p in (left, right))
        span_y, span_x = height + top + bottom - out_h, width + left + right - out_w
        if span_y < 0 or span_x < 0:
            raise ValueError(f"{type(self).__name__}: the crop {self.size} is larger than the "
                             f"padded image ({height + top + bottom}, {width + left + right}); "
                             f"pass pad_if_needed=True or more padding")
        return (out_h, out_w), True, (top, left, span_y, span_x)

    def __repr__(self):
        return f"RandomCrop(size={self.size}, padding={self.padding}, fill={self.fill})"


AUGMENTATIONS = (RandomAffine, RandomRotation, RandomCrop)


def resident_plan(transform):
    """How a DataLoader can apply `transform` to a dataset of uint8 images [N, H, W] that stays
    on the device: (once, per_batch) lists of transforms, `once` applied to the whole image
    array (ToTensor, then Normalize) and `per_batch` to every batch (Normalize and the
    augmentations); None when some transform must see the samples one by one."""
    def flat(t):
        return [s for inner in t.transforms for s in flat(inner)] if type(t) is Compose else [t]

    steps = flat(transform)
    if not steps or type(steps[0]) is not ToTensor:
        return None
    split = 1
    while split < len(steps) and type(steps[split]) is Normalize:
        split += 1
    per_batch = steps[split:]
    if not all(type(t) in (Normalize, *AUGMENTATIONS) for t in per_batch):
        return None
    return steps[:split], per_batch


__all__ = ["Compose", "ToTensor", "Normalize", "InterpolationMode", "RandomAffine",
           "RandomRotation", "RandomCrop"]
