"""Sweep the fused first layer (tritonad/kernels/conv_pool.py): conv2d + relu + max_pool2d
forward, and the weight and bias gradients from the pool's gradient, plan by plan, against the
two-primitive path (conv.Settings.pool_fuse = False) and PyTorch (cuDNN convolution, relu, max
pool), each timed in a CUDA graph of its own (kernel time, no host work).

    python benchmarks/sweep_conv_pool.py [--precisions tf32,fp32] [--layers mnist,cifar]

Used to order conv.Settings.pool_menu and choose its pool_wgrad_plan; not part of `tritonad bench`.
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import bench_graph, environment, require_gpu  # noqa: E402

LAYERS = {  # x shape, weight shape, padding
    "mnist": ((100, 1, 28, 28), (32, 1, 5, 5), 2),
    "cifar": ((256, 3, 32, 32), (64, 3, 5, 5), 2),
}
WGRAD_PLANS = [(32, 4, 1, 2), (16, 4, 1, 2), (32, 4, 1, 1), (16, 4, 1, 1), (16, 2, 1, 1),
               (16, 2, 1, 2), (32, 8, 1, 1), (64, 4, 1, 1)]
PER_SM = [2, 4, 8, 16]
MENU = [(32, 4, 1), (16, 4, 1), (32, 2, 1), (16, 2, 1), (32, 8, 1), (64, 4, 1)]
POOL = ((2, 2), (2, 2), (0, 0), (1, 1), False)


def resources(module):
    """Registers, spills and shared memory of every compiled variant of the two kernels."""
    for fn in (module._conv_relu_pool_kernel, module._pooled_wgrad_kernel):
        for cache in getattr(fn, "device_caches", {}).values():
            for kernel in cache[0].values():
                print(f"  {fn.fn.__name__:24s} regs {kernel.n_regs:4d} spills "
                      f"{kernel.n_spills:4d} shared {kernel.metadata.shared:7d} warps "
                      f"{kernel.metadata.num_warps} stages {kernel.metadata.num_stages}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--precisions", default="tf32,fp32")
    parser.add_argument("--layers", default="mnist,cifar")
    args = parser.parse_args(argv)
    require_gpu("sweep_conv_pool")
    import tritonad as td
    from tritonad.kernels import conv as conv_settings, conv_pool

    print(environment())
    for layer in args.layers.split(","):
        xs, ws, pad = LAYERS[layer]
        gen = torch.Generator(device="cuda").manual_seed(0)
        x = torch.rand(xs, device="cuda", generator=gen) * 2 - 1
        w = (torch.rand(ws, device="cuda", generator=gen) * 2 - 1) / (ws[1] * 25) ** 0.5
        b = torch.rand(ws[0], device="cuda", generator=gen) - 0.5
        conv = ((1, 1), (pad, pad), (1, 1), 1)
        for precision in args.precisions.split(","):
            td.set_conv_precision("highest" if precision == "fp32" else "high")
            torch.backends.cudnn.allow_tf32 = precision == "tf32"
            p, idx = conv_pool.conv2d_relu_max_pool2d(x, w, b, *conv, *POOL)
            dp = torch.rand(p.shape, device="cuda", generator=gen) * 2 - 1
            dw, db = torch.empty_like(w), torch.empty_like(b)
            head = f"{layer} {precision}"
            print(f"== {head}")
            for plan in MENU:
                with conv_settings.using(pool_menu=(plan,)):
                    conv_pool.tuner.memory.clear()
                    ms = bench_graph(
                        lambda: conv_pool.conv2d_relu_max_pool2d(x, w, b, *conv, *POOL))
                print(f"  fwd fused  plan {plan}: {ms * 1e3:7.1f} us")
            conv_pool.tuner.memory.clear()

            def backward():
                conv_pool.conv2d_relu_max_pool2d_backward(dp, idx, p, x, w, *conv, *POOL, False,
                                                          True, True, dw, db)
            for plan in WGRAD_PLANS:
                times = []
                for per_sm in PER_SM:
                    with conv_settings.using(pool_wgrad_plan=plan, pool_wgrad_per_sm=per_sm):
                        times.append(f"{bench_graph(backward) * 1e3:7.1f}")
                print(f"  dw fused   plan {plan}: {' '.join(times)} us at {PER_SM} a SM")
            with conv_settings.using(pool_wgrad_per_sm=8, pool_wgrad_plan=WGRAD_PLANS[0]):
                resources(conv_pool)
            with conv_settings.using(pool_fuse=False):
                fwd = bench_graph(lambda: conv_pool.conv2d_relu_max_pool2d(x, w, b, *conv, *POOL))
                bwd = bench_graph(backward)
            print(f"  two primitives: fwd {fwd * 1e3:7.1f} us, dw {bwd * 1e3:7.1f} us")

            def torch_fwd():
                y = torch.relu(torch.nn.functional.conv2d(x, w, b, 1, pad))
                return torch.nn.functional.max_pool2d(y, 2, 2, return_indices=True)
            xg, wg, bg = x.clone(), w.clone().requires_grad_(), b.clone().requires_grad_()

            def torch_step():
                y = torch.relu(torch.nn.functional.conv2d(xg, wg, bg, 1, pad))
                torch.nn.functional.max_pool2d(y, 2, 2).backward(dp)
            tf = bench_graph(torch_fwd)
            ts = bench_graph(torch_step)
            print(f"  torch: fwd {tf * 1e3:7.1f} us, fwd+bwd {ts * 1e3:7.1f} us "
                  f"(bwd ~{(ts - tf) * 1e3:.1f})")
    td.set_conv_precision("high")


if __name__ == "__main__":
    main()
