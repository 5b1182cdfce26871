"""Make (on a GPU) or merge (anywhere) the plan table shipped in tritonad/kernels/plans.json.

    python scripts/make_plan_table.py --out plans-h100.json [--quick]     # on the GPU: tune
    python scripts/make_plan_table.py --merge plans-h100.json              # add to the table

On a GPU this tunes (td.autotune(True), into a fresh cache) every matmul and convolution the
MNIST recipes run (the three models' training steps at their batch sizes and last partial
batches, in the per-op path, and a test-set batch of 1000) and the benchmark sizes (bench matmul
and bench conv; --quick: their quick sizes), then writes the tuned choices under this GPU's key
(tuning.gpu_key: name, compute capability, Triton version). --merge adds such a file to the
shipped table, replacing that GPU's entries.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TABLE = os.path.join(ROOT, "tritonad", "kernels", "plans.json")


def tune(out, quick):
    os.environ["TRITONAD_AUTOTUNE_DIR"] = tempfile.mkdtemp(prefix="tritonad-tune-")
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    import torch

    import tritonad as td
    import tritonad.nn.functional as F
    from tritonad import models, optim
    from tritonad.kernels import conv, matmul
    from tritonad.kernels.tuning import gpu_key

    td.autotune(True)
    for name, batches in (("logreg", (128, 96)), ("mlp", (128, 96)), ("cnn", (100,))):
        model = models.build(name).to("cuda")
        opt = optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        for batch in batches:
            x = td.randn(batch, 1, 28, 28, device="cuda")
            y = td.from_torch(torch.randint(0, 10, (batch,), device="cuda"))
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        with td.no_grad():
            model.eval()
            model(td.randn(1000, 1, 28, 28, device="cuda"))
        print(f"{name}: tuned", flush=True)
    import bench_conv
    import bench_matmul

    scratch = tempfile.mkdtemp(prefix="tritonad-bench-")
    bench_matmul.main(["--out", scratch] + (["--quick"] if quick else []))
    bench_conv.main(["--out", scratch] + (["--quick"] if quick else []))
    table = {}
    for tuner in (matmul.tuner, conv.tuner):
        table[tuner.name] = {k: v for k, v in tuner.memory.items()
                             if tuner.sources.get(k) == "tuned"}
    with open(out, "w") as f:
        json.dump({gpu_key(): table}, f, indent=1, sort_keys=True)
    print(f"wrote {out}: " + ", ".join(f"{k} {len(v)}" for k, v in table.items()))


def merge(path):
    with open(path) as f:
        new = json.load(f)
    try:
        with open(TABLE) as f:
            table = json.load(f)
    except (OSError, ValueError):
        table = {}
    table.update(new)
    tmp = TABLE + ".tmp"
    with open(tmp, "w") as f:
        json.dump(table, f, indent=1, sort_keys=True)
        f.write("\n")
    os.replace(tmp, TABLE)
    for gpu, tuners in new.items():
        print(f"{gpu}: " + ", ".join(f"{k} {len(v)} plans" for k, v in tuners.items()))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="tune on this GPU and write the plans here")
    parser.add_argument("--quick", action="store_true", help="the benchmarks' quick sizes only")
    parser.add_argument("--merge", help="add a file written by --out to the shipped table")
    args = parser.parse_args()
    if args.merge:
        merge(args.merge)
    elif args.out:
        tune(args.out, args.quick)
    else:
        parser.error("give --out (on a GPU) or --merge")


if __name__ == "__main__":
    main()
