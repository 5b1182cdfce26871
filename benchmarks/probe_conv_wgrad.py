"""Probe: which kernels one convolution's weight gradient launches, and their GPU times, for
before/after comparisons of two checkouts (PYTHONPATH=old runs an older tree).

    python benchmarks/probe_conv_wgrad.py [--layer mnist-conv1] [--precision fp32|tf32]

Prints each kernel's name, launch count and mean GPU microseconds over 50 calls (torch
profiler), then the mean wall time per call.
"""
import argparse
import time

import torch

LAYERS = {"mnist-conv1": ((100, 1, 28, 28), 32, 5, 2), "mnist-conv2": ((100, 32, 14, 14), 64, 5, 2)}


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--layer", default="mnist-conv1", choices=sorted(LAYERS))
    p.add_argument("--precision", default="fp32", choices=["fp32", "tf32"])
    args = p.parse_args(argv)
    import tritonad as td
    from tritonad.kernels import conv

    td.set_conv_precision("highest" if args.precision == "fp32" else "high")
    shape, co, k, pad = LAYERS[args.layer]
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.rand(shape, device="cuda", generator=g) * 2 - 1
    w = torch.rand((co, shape[1], k, k), device="cuda", generator=g) * 2 - 1
    ho, wo = shape[2] + 2 * pad - k + 1, shape[3] + 2 * pad - k + 1
    dy = torch.rand((shape[0], co, ho, wo), device="cuda", generator=g) * 2 - 1
    call = lambda: conv.conv2d_backward(dy, x, w, (1, 1), (pad, pad), (1, 1), input_grad=False)  # noqa: E731
    for _ in range(5):
        call()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(50):
            call()
        torch.cuda.synchronize()
    for e in prof.key_averages():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            print(f"{e.key[:90]:90s} {e.count:5d} {e.device_time:9.2f} us")
    t = time.perf_counter()
    for _ in range(200):
        call()
    torch.cuda.synchronize()
    print(f"{args.layer} {args.precision} dw: {(time.perf_counter() - t) / 200 * 1e6:.1f} us a call")


if __name__ == "__main__":
    main()
