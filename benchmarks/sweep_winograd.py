"""Winograd F(4x4, 3x3) convolution (tritonad/kernels/conv/winograd.py) step by step, against
cuDNN's IEEE float32 and tritonad's direct kernels, same run (issue 16: "exact fp32 >= 1.0 vs
cuDNN").
Not part of `tritonad bench` (`bench conv` times what conv2d dispatches).

    python benchmarks/sweep_winograd.py [--layers 28x28,14x14] [--out DIR]

Per layer and direction (fwd, dx, dw with db), kernel time (CUDA events, L2 flushed):
cuDNN with TF32 off, conv2d at float32 accuracy with Winograd on and off, the error
of each against float64 (relative norm); then each step of the Winograd forward (input
transform, weight transform, the 36 products at 3xTF32 and, for comparison, at TF32, output
transform), the weight gradient without the bias gradient, and the bias gradient two ways
(from dy's transform, as conv2d does, and as channel sums of dy), with the bytes each step
moves (its floor at the copy bandwidth measured).
Layers below conv.Settings.winograd_min_channels run Winograd too here (it is lowered to 1).
"""
from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

# name: (batch, channels, height = width, output channels)
LAYERS = {"56x56": (256, 64, 56, 64), "28x28": (256, 128, 28, 128),
          "14x14": (256, 256, 14, 256), "7x7": (256, 512, 7, 512), "odd": (3, 136, 13, 144)}


def _directions(x, w, b, dy):
    from tritonad.kernels import conv

    args = ((1, 1), (1, 1), (1, 1))
    k = w.shape[0]

    def cudnn(mask):
        return lambda: torch.ops.aten.convolution_backward(
            dy, x, w, [k], [1, 1], [1, 1], [1, 1], False, [0, 0], 1, mask)

    ours = {"fwd": lambda: conv.conv2d(x, w, b, *args),
            "dx": lambda: conv.conv2d_backward(dy, x, w, *args, weight_grad=False,
                                               bias_grad=False)[0],
            "dw": lambda: conv.conv2d_backward(dy, x, w, *args, input_grad=False)[1]}
    theirs = {"fwd": lambda: torch.nn.functional.conv2d(x, w, b, 1, 1),
              "dx": cudnn([True, False, False]), "dw": cudnn([False, True, True])}
    return ours, theirs


def _steps(x, w, b, dy):
    """The Winograd steps as callables (each re-running what it needs from the one before
    from saved operands), with the bytes each transform reads and writes."""
    from tritonad.kernels import conv, launch, matmul
    from tritonad.kernels.conv import sums, winograd
    from tritonad.kernels.reduce import sum as sum_dims

    n, c, h, wd = x.shape
    k = w.shape[0]
    tiles = n * launch.cdiv(h, 4) * launch.cdiv(wd, 4)
    u = winograd._transform_input(x, (tiles, 0))
    v = winograd._transform_weight(w, False)
    m = matmul.matmul(u, v.transpose(1, 2), precision="highest")
    y = torch.empty((n, k, h, wd), device=x.device)
    bp, bn = winograd.BLOCK

    def output():
        winograd.run(winograd._output_transform_kernel,
                     (launch.cdiv(tiles, bp), launch.cdiv(k, bn)), m, y, b, k, h, wd,
                     launch.cdiv(h, 4), launch.cdiv(wd, 4), tiles, m.stride(0), m.stride(1),
                     *y.stride(), b.stride(0), HAS_BIAS=True, RELU=False, BLOCK_P=bp,
                     BLOCK_N=bn, num_warps=4)

    t_bytes = 4 * 36 * tiles
    d = torch.rand((36, 1, k, tiles), device=x.device)
    steps = {
        "input transform": (lambda: winograd._transform_input(x, (tiles, 0)),
                            x.numel() * 4 + t_bytes * c),
        "weight transform": (lambda: winograd._transform_weight(w, False), 0),
        "products 3xTF32": (lambda: matmul.matmul(u, v.transpose(1, 2), precision="highest"),
                            t_bytes * (c + k)),
        "products TF32": (lambda: matmul.matmul(u, v.transpose(1, 2), precision="high"),
                          t_bytes * (c + k)),
        "output transform": (output, t_bytes * k + y.numel() * 4),
        "dw without db": (lambda: winograd.weight_grad(dy, x, torch.empty_like(w), None,
                                                        conv.sm_count(x.device),
                                                        conv.current_settings()), 0),
        "db (from dy's transform)": (lambda: sum_dims(d[7], (0, 2)), d[7].numel() * 4),
        "db (channel sums of dy)": (lambda: sums.bias_grad(dy, torch.empty_like(b),
                                                           conv.current_settings()),
                                  dy.numel() * 4),
    }
    return steps


def run_layer(name):
    from tritonad.kernels import conv, plans

    n, c, hw, k = LAYERS[name]
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.rand((n, c, hw, hw), device="cuda", generator=gen) * 2 - 1
    w = (torch.rand((k, c, 3, 3), device="cuda", generator=gen) * 2 - 1) / (c * 9) ** 0.5
    b = torch.rand(k, device="cuda", generator=gen)
    dy = torch.rand((n, k, hw, hw), device="cuda", generator=gen) * 2 - 1
    exact = [t.double().requires_grad_() for t in (x, w, b)]
    y64 = torch.nn.functional.conv2d(*exact, 1, 1)
    y64.backward(dy.double())
    want = {"fwd": y64.detach(), "dx": exact[0].grad, "dw": exact[1].grad}
    ours, theirs = _directions(x, w, b, dy)
    rows = []
    for d in ("fwd", "dx", "dw"):
        row = dict(layer=name, direction=d, ms_cudnn=common.bench(theirs[d]))
        for path, on in (("winograd", True), ("direct", False)):
            with conv.using(winograd=on):
                plans.clear_plans()
                got = ours[d]()
                row[f"err_{path}"] = ((got.double() - want[d]).norm() / want[d].norm()).item()
                row[f"ms_{path}"] = common.bench(ours[d])
            row[f"ratio_{path}"] = row["ms_cudnn"] / row[f"ms_{path}"]
        rows.append(row)
        print(f"{name} {d}: cuDNN {row['ms_cudnn'] * 1e3:.0f} us | Winograd "
              f"{row['ms_winograd'] * 1e3:.0f} us ({row['ratio_winograd']:.2f}x, error "
              f"{row['err_winograd']:.1e}) | direct {row['ms_direct'] * 1e3:.0f} us "
              f"({row['ratio_direct']:.2f}x, error {row['err_direct']:.1e})", flush=True)
    bandwidth = common.copy_bandwidth()
    for step, (fn, nbytes) in _steps(x, w, b, dy).items():
        ms = common.bench(fn)
        floor = f", {nbytes / 1e6:.0f} MB: floor {nbytes / bandwidth / 1e3:.0f} us" \
            if nbytes else ""
        rows.append(dict(layer=name, step=step, ms=ms, bytes=nbytes))
        print(f"  {step}: {ms * 1e3:.0f} us{floor}", flush=True)
    return rows


def main(argv=None):
    def extra(parser):
        parser.add_argument("--layers", default="28x28,14x14")

    args = common.parse_args(__doc__.splitlines()[0], argv, extra)
    common.require_gpu("sweep_winograd")
    import tritonad as td
    from tritonad.kernels import conv

    td.set_conv_precision("highest")
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    rows = []
    with conv.using(winograd_min_channels=1):
        for name in args.layers.split(","):
            rows += run_layer(name)
    print(f"results: {common.save(args.out, 'sweep_winograd', rows)}")


if __name__ == "__main__":
    main()
