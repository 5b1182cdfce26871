"""Sweep the implicit-GEMM convolution kernels' tile configurations at the MNIST CNN layers.

For each layer, direction (forward, input gradient, weight gradient) and precision, every
configuration below is timed by Triton's autotuner (its per-config timings are read back), and
the best is printed beside cuDNN's time for the same direction. Used to choose the config menus
in tritonad/kernels/conv.py; not part of `tritonad bench`.

    python benchmarks/sweep_conv.py --out DIR
"""
from __future__ import annotations

import itertools
import json
import os
import time

import torch
import triton

import common

LAYERS = {"conv1": ((100, 1, 28, 28), 32), "conv2": ((100, 32, 14, 14), 64)}


def gemm_space():
    out = []
    for bm, bn, bk, warps, stages in itertools.product((32, 64), (32, 64, 128, 256), (16, 32),
                                                       (4, 8), (2, 3)):
        if bm * bn // (warps * 32) > 128 or (bn == 32 and warps == 8):
            continue  # too many accumulators per thread, or idle warps
        out.append(triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk},
                                 num_warps=warps, num_stages=stages))
    return out


def wgrad_space(block_m, block_n):
    return [triton.Config({"BLOCK_M": block_m, "BLOCK_N": block_n, "BLOCK_K": bk},
                          num_warps=warps, num_stages=stages)
            for bk, warps, stages in itertools.product((16, 32, 64, 128), (4, 8), (2, 3))]


def timings(kernel):
    found = getattr(kernel, "configs_timings", None) or {}
    rows = []
    for cfg, t in found.items():
        t = t[0] if isinstance(t, (list, tuple)) else t
        rows.append((float(t), str(cfg)))
    return sorted(rows)


def main(argv=None):
    args = common.parse_args(__doc__.splitlines()[0], argv)
    common.require_gpu("sweep_conv")
    from tritonad.backend import set_matmul_precision
    from tritonad.kernels import conv

    conv.AUTOTUNE = True
    seen = []
    tuned = conv._tuned

    def recording(*key):  # remember which tuned kernels a call used
        kernel = tuned(*key)
        seen.append(kernel)
        return kernel

    conv._tuned = recording
    conv._gemm_configs = lambda block_m, max_k, precision: gemm_space()
    conv._wgrad_configs = lambda block_m, block_n, precision: wgrad_space(block_m, block_n)
    results = []
    for precision in ("highest", "high"):
        set_matmul_precision(precision)
        torch.backends.cudnn.allow_tf32 = precision == "high"
        for name, (shape, co) in LAYERS.items():
            x = torch.randn(shape, device="cuda")
            w = torch.randn(co, shape[1], 5, 5, device="cuda") * 0.1
            b = torch.randn(co, device="cuda")
            y = torch.nn.functional.conv2d(x, w, b, padding=2)
            dy = torch.randn_like(y)
            cases = {
                "forward": (lambda: conv.conv2d(x, w, b, (1, 1), (2, 2)),
                            lambda: torch.nn.functional.conv2d(x, w, b, padding=2), "gemm"),
                "weight": (lambda: conv.conv2d_backward(dy, x, w, (1, 1), (2, 2), input_grad=False),
                           lambda: torch.nn.grad.conv2d_weight(x, w.shape, dy, padding=2),
                           "wgrad"),
            }
            if shape[1] > 1:
                cases["input"] = (
                    lambda: conv.conv2d_backward(dy, x, w, (1, 1), (2, 2), weight_grad=False,
                                                 bias_grad=False),
                    lambda: torch.nn.grad.conv2d_input(x.shape, w, dy, padding=2), "gemm")
            for direction, (ours, theirs, family) in cases.items():
                conv._tuned_family.cache_clear()
                seen.clear()
                start = time.perf_counter()
                ours()
                torch.cuda.synchronize()
                tune_s = time.perf_counter() - start
                best = []
                for k in {id(k): k for k in seen}.values():
                    best += timings(k)
                best.sort()
                t_ours = common.bench(ours)
                t_torch = common.bench(theirs)
                row = {"layer": name, "precision": precision, "direction": direction,
                       "ours_ms": t_ours, "cudnn_ms": t_torch, "ratio": t_torch / t_ours,
                       "tune_s": tune_s, "top": best[:6], "worst": best[-2:]}
                results.append(row)
                print(f"{name} {precision:7s} {direction:7s} ours {t_ours:.4f} ms  cudnn "
                      f"{t_torch:.4f} ms  x{t_torch / t_ours:.2f}  (tuned {tune_s:.0f} s)",
                      flush=True)
                for t, cfg in best[:4]:
                    print(f"      {t:.4f}  {cfg}", flush=True)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "sweep_conv.json"), "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
