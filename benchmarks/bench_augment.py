"""Batch augmentation: tritonad.transforms on a batch of MNIST images against PyTorch, same run.

    python benchmarks/bench_augment.py --out DIR [--quick]

Each row augments one batch [128, 1, 28, 28] float32 on the GPU, every image with its own random
parameters (tritonad: one random_warp kernel). Columns, in microseconds:
    eager      the transform called from Python, as a training loop calls it: the wall time of
               200 calls in a row and one synchronisation, per call, best of 5 (the call is
               bound by the host, whose timings jitter; do_bench's per-call events jitter more)
    kernel     the random_warp launch alone, replayed in a CUDA graph (the GPU's time, median)
    torch      the same per-image work in PyTorch (random parameters, affine_grid, grid_sample),
               timed as eager
    tv v2      torchvision.transforms.v2 on the GPU tensor, if installed, timed as eager; NOTE it
               draws ONE set of parameters for the whole batch (less work than the others)
GB/s counts the bytes moved at least: the batch read once and the result written once,
(N*C*H*W + N*C*Ho*Wo) * 4 / t. x = torch us / eager us (above 1: tritonad is faster).
"""
from __future__ import annotations

import math
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

BATCH = (128, 1, 28, 28)


def _cases():
    """name -> (tritonad transform, torch equivalent(x), torchvision v2 transform or None)."""
    from tritonad import transforms as T

    try:
        from torchvision.transforms import v2
    except ImportError:
        v2 = None
    bilinear = T.InterpolationMode.BILINEAR
    cases = {
        "affine-nearest": (T.RandomAffine(10, translate=(0.1, 0.1), scale=(0.9, 1.1)),
                           lambda x: torch_affine(x, 10, 0.1, (0.9, 1.1), "nearest"),
                           v2 and v2.RandomAffine(10, translate=(0.1, 0.1), scale=(0.9, 1.1))),
        "affine-bilinear": (T.RandomAffine(10, translate=(0.1, 0.1), scale=(0.9, 1.1),
                                           interpolation=bilinear),
                            lambda x: torch_affine(x, 10, 0.1, (0.9, 1.1), "bilinear"),
                            v2 and v2.RandomAffine(10, translate=(0.1, 0.1), scale=(0.9, 1.1),
                                                   interpolation=v2.InterpolationMode.BILINEAR)),
        "rotation": (T.RandomRotation(15), lambda x: torch_affine(x, 15, 0.0, (1, 1), "nearest"),
                     v2 and v2.RandomRotation(15)),
        "crop-pad2": (T.RandomCrop(28, padding=2), lambda x: torch_crop(x, 28, 2),
                      v2 and v2.RandomCrop(28, padding=2)),
    }
    return cases


def torch_affine(x, degrees, translate, scale, mode):
    """Per-image random rotation, whole-pixel shift and scale about the centre, in PyTorch ops
    (square images): theta maps output to input in grid_sample's [-1, 1] coordinates."""
    n, _, h, w = x.shape
    u = torch.rand(4, n, device=x.device)
    angle = (2 * u[0] - 1) * (degrees * math.pi / 180)
    shift_x = torch.round((2 * u[1] - 1) * translate * w) * (2 / w)
    shift_y = torch.round((2 * u[2] - 1) * translate * h) * (2 / h)
    s = scale[0] + (scale[1] - scale[0]) * u[3]
    a, b = torch.cos(angle) / s, torch.sin(angle) / s
    theta = torch.stack([torch.stack([a, -b, -(a * shift_x - b * shift_y)], 1),
                         torch.stack([b, a, -(b * shift_x + a * shift_y)], 1)], 1)
    grid = torch.nn.functional.affine_grid(theta, list(x.shape), align_corners=False)
    return torch.nn.functional.grid_sample(x, grid, mode=mode, align_corners=False)


def torch_crop(x, size, padding):
    """Per-image random window of the zero-padded batch, in PyTorch ops (a gather)."""
    n, c, h, w = x.shape
    padded = torch.nn.functional.pad(x, (padding,) * 4)
    span = padded.shape[-1] - size + 1
    top = torch.randint(0, span, (n, 1, 1), device=x.device)
    left = torch.randint(0, span, (n, 1, 1), device=x.device)
    rows = (top + torch.arange(size, device=x.device)[None, :, None])
    cols = (left + torch.arange(size, device=x.device)[None, None, :])
    index = (rows * padded.shape[-1] + cols).reshape(n, 1, -1).expand(n, c, -1)
    return padded.reshape(n, c, -1).gather(2, index).reshape(n, c, size, size)


def loop_us(fn, calls=200, repeats=5):
    """Per-call microseconds of `calls` calls in a row with one synchronisation, best of
    `repeats` (after a warm-up)."""
    fn()
    best = float("inf")
    for _ in range(repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - start) / calls * 1e6)
    return best


def run_case(name, ours, theirs, tv, x_td):
    from tritonad.kernels import augment

    x = x_td.torch()
    out_size, crop, ranges = ours._warp(*x.shape[2:])
    row = {"op": name, "batch": "x".join(map(str, x.shape))}
    row["us_eager"] = loop_us(lambda: ours(x_td))
    row["us_kernel"] = common.bench_graph(lambda: augment.random_warp(
        x, out_size, crop, ranges, ours.fill, ours.bilinear, 1, 0)) * 1e3
    row["torch_us"] = loop_us(lambda: theirs(x))
    row["tv_us"] = loop_us(lambda: tv(x)) if tv is not None else None
    nbytes = (x.numel() + x.shape[0] * x.shape[1] * out_size[0] * out_size[1]) * 4
    row["gbs_kernel"] = nbytes / row["us_kernel"] / 1e3
    row["ratio"] = row["torch_us"] / row["us_eager"]
    return row


COLUMNS = [("op", "op", "{}"), ("batch", "batch", "{}"), ("us_eager", "eager us", "{:.1f}"),
           ("us_kernel", "kernel us", "{:.1f}"), ("gbs_kernel", "GB/s", "{:.0f}"),
           ("torch_us", "torch us", "{:.1f}"), ("ratio", "x", "{:.2f}"),
           ("tv_us", "tv v2 us (one draw)", "{:.1f}")]


def main(argv=None):
    import tritonad as td

    args = common.parse_args(__doc__.splitlines()[0], argv)
    common.require_gpu("bench_augment")
    td.set_backend("triton")
    td.manual_seed(0)
    x = td.rand(*BATCH, device="cuda")
    rows = []
    for name, (ours, theirs, tv) in _cases().items():
        if args.quick and name not in ("affine-nearest", "crop-pad2"):
            continue
        rows.append(run_case(name, ours, theirs, tv, x))
    common.print_table("batch augmentation of 128 MNIST images: tritonad vs PyTorch "
                       "(x = torch us / tritonad eager us)", rows, COLUMNS)
    path = common.save(args.out, "bench_augment", rows, meta={"formula": __doc__})
    print(f"\nwrote {path}")
    print(common.markdown_table(rows, COLUMNS))
    return rows


if __name__ == "__main__":
    main()
