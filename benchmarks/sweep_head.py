"""Sweep the classifier head (tritonad/kernels/head.py): linear + cross-entropy's loss, dlogits
and dx in two kernels, setting by setting, against the three kernels it replaces (matmul,
cross_entropy, matmul) and PyTorch (linear, cross_entropy, backward to the input), each timed
in a CUDA graph of its own (kernel time, no host work).

    python benchmarks/sweep_head.py [--problems cnn,linear,wide] [--precision highest]

Used to choose head.py's settings; not part of `tritonad bench`.
"""
from __future__ import annotations

import argparse
import itertools
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import bench_graph, environment, require_gpu  # noqa: E402

PROBLEMS = {  # rows, features, classes
    "cnn": (100, 512, 10),
    "linear": (100, 784, 10),
    "b128": (128, 512, 10),
    "wide": (1024, 2048, 64),
}
# one setting at a time around head.py's (name: values)
SETTINGS = {"PART_M": [32, 64], "BLOCK_K": [32, 128], "PROGRAMS": [64, 128, 512],
            "MAX_SPLITS": [8, 32], "DX_PROGRAMS": [16, 1024], "WARPS_ONE": [4],
            "WARPS_ROWS": [8],
            "SINGLE_ROWS": [0], "BLOCK_M": [16, 64]}
GRID = {"WARPS_ONE": [4, 8], "WARPS_ROWS": [4, 8], "DX_PROGRAMS": [16, 256, 1024],
        "SINGLE_ROWS": [0, 128], "BLOCK_M": [16, 32]}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--problems", default="cnn,linear,b128,wide")
    parser.add_argument("--precision", default="highest")
    parser.add_argument("--grid", action="store_true",
                        help="every combination of GRID's settings, not one at a time")
    args = parser.parse_args(argv)
    require_gpu("sweep_head")
    import tritonad as td
    from tritonad.backend import Backend
    from tritonad.kernels import head

    td.set_matmul_precision(args.precision)
    torch.backends.cuda.matmul.allow_tf32 = args.precision == "high"
    print(environment(), args.precision)
    saved = {name: getattr(head, name) for name in SETTINGS}
    for name in args.problems.split(","):
        n, k, c = PROBLEMS[name]
        gen = torch.Generator(device="cuda").manual_seed(0)
        x = torch.randn(n, k, device="cuda", generator=gen)
        w = torch.randn(c, k, device="cuda", generator=gen) / k ** 0.5
        b = torch.randn(c, device="cuda", generator=gen)
        t = torch.randint(0, c, (n,), device="cuda", generator=gen)
        loss_total = torch.zeros((), device="cuda")
        correct = torch.zeros((), dtype=torch.int64, device="cuda")
        metrics = (loss_total, correct)
        print(f"== {name}: {n}x{k} -> {c}")

        def composed():
            Backend.linear_cross_entropy(head._Composed, x, w, b, t, metrics=metrics)

        def fused():
            head.linear_cross_entropy(x, w, b, t, metrics=metrics)

        want = Backend.linear_cross_entropy(head._Composed, x, w, b, t)
        print(f"  three kernels:           {bench_graph(composed) * 1e3:7.1f} us")

        def report(label):
            got = head.linear_cross_entropy(x, w, b, t)
            err = max((g - r).abs().max().item() for g, r in zip(got, want))
            print(f"  {label:24s} {bench_graph(fused) * 1e3:7.1f} us (vs three kernels "
                  f"{err:.1e})")
        report("fused, as shipped")
        if args.grid:
            for values in itertools.product(*GRID.values()):
                for setting, value in zip(GRID, values):
                    setattr(head, setting, value)
                report(" ".join(str(v) for v in values))
            for setting, value in saved.items():
                setattr(head, setting, value)
            continue
        for setting, values in SETTINGS.items():
            for value in values:
                setattr(head, setting, value)
                report(f"{setting}={value}")
                setattr(head, setting, saved[setting])
        xg = x.clone().requires_grad_()

        def torch_head():
            logits = torch.nn.functional.linear(xg, w, b)
            torch.nn.functional.cross_entropy(logits, t).backward()
        print(f"  torch (fwd, dx):          {bench_graph(torch_head) * 1e3:7.1f} us")


if __name__ == "__main__":
    main()
