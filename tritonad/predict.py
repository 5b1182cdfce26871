"""Turn a picture of a handwritten digit into an MNIST-like input, as MNIST itself was made.

MNIST digits are light on a dark background, size-normalised to fit a 20x20 box (keeping the
aspect ratio, anti-aliased) and placed in a 28x28 image so that their centre of mass is at the
centre. A photo or drawing of any size, dark on light or light on dark, 8- or 16-bit, grey,
colour or with transparency, gets the same treatment.
"""
from __future__ import annotations

import os

import numpy as np


def load_digit(path) -> np.ndarray:
    """[28, 28] float32 in [0, 1], light digit on black, from an image file (PNG, JPG, TIFF, ...:
    8- or 16-bit, grey, colour or with transparency)."""
    from PIL import Image, UnidentifiedImageError

    if not os.path.isfile(path):
        raise FileNotFoundError(f"predict: no such image file: {path}")
    try:
        with Image.open(path) as img:
            img.load()
            gray = grayscale(img, name=path)
    except (UnidentifiedImageError, OSError) as err:
        raise ValueError(f"predict: {path} is not an image that can be read ({err})") from None
    except Image.DecompressionBombError as err:  # far more pixels than any picture of a digit
        raise ValueError(f"predict: {path} is too large to read ({err})") from None
    return mnist_like(gray)


# full scale of the integer modes whose values are not 8-bit (Pillow's convert("L") would clip
# them at 255): 16-bit grey comes as "I;16*", other integer pictures as "I" (32-bit)
_SIXTEEN_BIT = ("I;16", "I;16L", "I;16B", "I;16N")
_ALPHA = ("RGBA", "LA", "PA", "RGBa", "La")


def grayscale(img, name="the image") -> np.ndarray:
    """[H, W] float32 in [0, 1] of a PIL image of any mode, scaled by its real bit depth.

    "I;16*": / 65535. "I" (32-bit integers of unknown depth, as some readers give 16-bit
    files) and "F": / the smallest full scale of 1 (floats only), 255, 65535 or 2**32 - 1 that
    holds the largest value. Pictures with transparency are put on paper (see _on_paper).
    Everything else through Pillow's 8-bit grey conversion.
    """
    mode = img.mode
    if mode in _SIXTEEN_BIT:
        return np.asarray(img).astype(np.float32) / 65535.0
    if mode in ("I", "F"):
        values = np.asarray(img).astype(np.float64)
        if not np.isfinite(values).all():
            raise ValueError(f"predict: {name} holds values that are not finite numbers")
        values = np.clip(values, 0.0, None)
        scales = ((1.0,) if mode == "F" else ()) + (255.0, 65535.0, 2.0 ** 32 - 1)
        top = values.max(initial=0.0)
        scale = next((s for s in scales if top <= s), scales[-1])
        return (values / scale).astype(np.float32)
    if mode in _ALPHA or (mode in ("P", "L", "RGB") and "transparency" in img.info):
        lum_alpha = np.asarray(img.convert("RGBA").convert("LA"), dtype=np.float32) / 255.0
        return _on_paper(lum_alpha[..., 0], lum_alpha[..., 1])
    try:
        return np.asarray(img.convert("L"), dtype=np.float32) / 255.0
    except ValueError as err:  # a mode Pillow cannot turn into grey (LAB, HSV, ...)
        raise ValueError(f"predict: {name}: pictures of mode {mode} cannot be read ({err})") \
            from None


def _on_paper(lum, alpha) -> np.ndarray:
    """Grey values of a picture with transparency: its transparent parts become paper.

    If most of it is opaque, the opaque part is the paper (a drawing with transparent margins)
    and the paper takes its median shade. If most of it is transparent, the opaque part is the
    strokes, and the paper contrasts with them: black under light strokes, white under dark.
    """
    opaque = alpha > 0.5
    if not opaque.any():
        return np.ones_like(lum)  # all transparent: blank paper (mnist_like says so)
    shade = float(np.median(lum[opaque]))
    paper = shade if opaque.mean() > 0.5 else (0.0 if shade > 0.5 else 1.0)
    return lum * alpha + paper * (1.0 - alpha)


def mnist_like(gray: np.ndarray) -> np.ndarray:
    """The MNIST normalisation of a grayscale image with values in [0, 1]."""
    from PIL import Image

    if gray.ndim != 2 or min(gray.shape) < 1:
        raise ValueError(f"predict: expected a 2-d grayscale image, got shape {gray.shape}")
    background = float(np.median(np.concatenate([gray[0], gray[-1], gray[:, 0], gray[:, -1]])))
    light_paper = background > 0.5
    ink = 1.0 - gray if light_paper else gray  # strokes become light on dark
    ink = np.clip(ink - (1.0 - background if light_paper else background), 0.0, None)
    if ink.max() <= 0:
        raise ValueError("predict: the image is blank (no strokes found)")
    ink /= ink.max()
    rows = np.flatnonzero(ink.max(axis=1) > 0.1)
    cols = np.flatnonzero(ink.max(axis=0) > 0.1)
    ink = ink[rows[0]:rows[-1] + 1, cols[0]:cols[-1] + 1]
    h, w = ink.shape
    scale = 20.0 / max(h, w)
    size = (max(1, round(w * scale)), max(1, round(h * scale)))
    box = np.asarray(Image.fromarray((ink * 255).astype(np.uint8)).resize(size, Image.LANCZOS),
                     dtype=np.float32) / 255.0
    # place the box so that its centre of mass lands on the centre of the 28x28 image
    total = box.sum()
    cy = (box.sum(axis=1) * np.arange(box.shape[0])).sum() / total
    cx = (box.sum(axis=0) * np.arange(box.shape[1])).sum() / total
    top = int(np.clip(round(14.0 - cy), 0, 28 - box.shape[0]))  # MNIST puts it at pixel (14, 14)
    left = int(np.clip(round(14.0 - cx), 0, 28 - box.shape[1]))
    out = np.zeros((28, 28), np.float32)
    out[top:top + box.shape[0], left:left + box.shape[1]] = box
    return np.clip(out, 0.0, 1.0)
