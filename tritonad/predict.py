"""Turn a picture of a handwritten digit into an MNIST-like input, as MNIST itself was made.

MNIST digits are light on a dark background, size-normalised to fit a 20x20 box (keeping the
aspect ratio, anti-aliased) and placed in a 28x28 image so that their centre of mass is at the
centre. A photo or drawing of any size, dark on light or light on dark, gets the same treatment.
"""
from __future__ import annotations

import os

import numpy as np


def load_digit(path) -> np.ndarray:
    """[28, 28] float32 in [0, 1], light digit on black, from an image file (PNG, JPG, ...)."""
    from PIL import Image, UnidentifiedImageError

    if not os.path.isfile(path):
        raise FileNotFoundError(f"predict: no such image file: {path}")
    try:
        with Image.open(path) as img:
            img.load()
            if img.mode in ("RGBA", "LA") or (img.mode == "P" and "transparency" in img.info):
                # transparent drawings: put them on white paper first
                rgba = img.convert("RGBA")
                paper = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
                img = Image.alpha_composite(paper, rgba)
            gray = np.asarray(img.convert("L"), dtype=np.float32) / 255.0
    except (UnidentifiedImageError, OSError) as err:
        raise ValueError(f"predict: {path} is not an image that can be read ({err})") from None
    return mnist_like(gray)


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
