"""Make (on a GPU) or merge (anywhere) the plan table shipped in tritonad/kernels/plans.json.

    python scripts/make_plan_table.py --out plans-h100.json [--quick]     # on the GPU: tune
    python scripts/make_plan_table.py --merge plans-h100.json              # add to the table
    python scripts/make_plan_table.py --out recipes.json --recipes         # on the GPU: tune
    python scripts/make_plan_table.py --add recipes.json                   # add, keep the rest

On a GPU this tunes (td.autotune(True), into a fresh cache) every matmul and convolution the
MNIST recipes run (the three models' training steps at their batch sizes and last partial
batches, in the per-op path, and a test-set batch of 1000) and the benchmark sizes (the MNIST
convolutions at TF32 and 3xTF32, bench conv's ResNet-style 3x3 layers at TF32, bf16, 3xTF32
and fp16, square products of every dtype; --quick leaves out the largest products and the
3x3 layers' 3xTF32 and fp16), writing the tuned choices under this GPU's key
(tuning.gpu_key: name, compute capability, Triton version) after each group. --merge adds
such a file to the shipped table, replacing that GPU's entries.

--recipes tunes the gpt and resnet recipes' problems instead (a few eager steps of each, bf16
and fp32, their evaluation included), and --add adds such a file's plans to the GPU's entries,
keeping the others.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TABLE = os.path.join(ROOT, "tritonad", "kernels", "plans.json")


def _write(out, tuners, gpu):
    table = {t.name: {k: v for k, v in t.memory.items() if t.sources.get(k) == "tuned"}
             for t in tuners}
    with open(out, "w") as f:
        json.dump({gpu: table}, f, indent=1, sort_keys=True)
    return ", ".join(f"{k} {len(v)}" for k, v in table.items())


def _tuning(out):
    """Start tuning every problem afresh into a fresh cache; returns done(what), which writes
    the plans tuned so far to `out` and says so."""
    os.environ["TRITONAD_AUTOTUNE_DIR"] = tempfile.mkdtemp(prefix="tritonad-tune-")
    import time

    import tritonad as td
    from tritonad.kernels import conv, conv_pool, matmul, tuning
    from tritonad.kernels.tuning import gpu_key

    # the table being made replaces this GPU's shipped entries: time every problem afresh
    # rather than take the shipped plan (which would leave the new table empty)
    tuning.shipped_plans = lambda *args, **kwargs: {}
    gpu, tuners, start = gpu_key(), (matmul.tuner, conv.tuner, conv_pool.tuner), time.perf_counter()
    td.autotune(True)

    def done(what):
        print(f"{time.perf_counter() - start:6.1f} s  {what}: {_write(out, tuners, gpu)}",
              flush=True)

    return done


def tune_recipes(out):
    """The gpt and resnet recipes' problems: three eager steps and an evaluation of each at bf16
    and fp32 (TF32), at the recipes' batch sizes and resnet's last partial batch (60000 % 512)."""
    from tritonad import corpus, gpt, resnet

    done = _tuning(out)
    text = corpus.Shakespeare()
    for precision in ("bf16", "fp32"):
        gpt.train(text, "cuda", steps=3, precision=precision, eval_every=3, eval_batches=1,
                  graph=False)
        done(f"gpt {precision}")
        batch = resnet.RECIPE["batch"]
        resnet.train("cuda", epochs=1, precision=precision, limit=2 * batch + 60000 % batch,
                     graph=False)
        done(f"resnet {precision}")


def tune(out, quick):
    """Tune every problem, writing the table after each group (a time limit keeps what was
    done)."""
    import torch

    import tritonad as td
    import tritonad.nn.functional as F
    from tritonad import models, optim

    done = _tuning(out)
    for name, batches in (("mlp", (128, 96)), ("cnn", (100,)), ("logreg", (128, 96))):
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
        done(name)
    # the benchmarks' problems: conv layers (forward and both gradients) at float32's two
    # precisions and in half precision, then squares. The MNIST layers, and bench conv's
    # ResNet-style 3x3 layers (batch 256: 64 channels at 56x56, 128 at 28x28, 256 at 14x14);
    # --quick: those at TF32 and bf16 only
    mnist = [((100, 1, 28, 28), 32, 5, 2), ((100, 32, 14, 14), 64, 5, 2)]
    resnet = [((256, 64, 56, 56), 64, 3, 1), ((256, 128, 28, 28), 128, 3, 1),
              ((256, 256, 14, 14), 256, 3, 1)]
    runs = [("high", td.float32, mnist + resnet), ("highest", td.float32, mnist),
            ("high", td.bfloat16, resnet)]
    if not quick:
        runs += [("highest", td.float32, resnet), ("high", td.float16, resnet)]
    for precision, dtype, layers in runs:
        td.set_conv_precision(precision)
        for shape, co, k, pad in layers:
            x = td.randn(*shape, device="cuda").to(dtype).requires_grad_(shape[1] > 1)
            w = td.randn(co, shape[1], k, k, device="cuda").to(dtype).requires_grad_()
            y = F.conv2d(x, w, padding=pad)
            y.backward(td.ones_like(y))
            del x, w, y
            done(f"conv {shape} -> {co} k{k} {dtype.name} {precision}")
    td.set_conv_precision("high")
    sizes = [1024, 4096] if quick else [1024, 4096, 8192]
    for dtype, precision in ((td.float32, "highest"), (td.float32, "high"),
                             (td.bfloat16, "highest"), (td.float16, "highest")):
        td.set_matmul_precision(precision)
        for n in sizes:
            a = td.randn(n, n, device="cuda").to(dtype)
            b = td.randn(n, n, device="cuda").to(dtype)
            a @ b
            done(f"matmul {n}^3 {dtype.name} {precision}")
    td.set_matmul_precision("highest")


def merge(path, keep=False):
    """Add the plans of `path` to the table: replacing its GPUs' entries, or with keep, beside
    the entries there (a key in both takes the new plan)."""
    with open(path) as f:
        new = json.load(f)
    try:
        with open(TABLE) as f:
            table = json.load(f)
    except (OSError, ValueError):
        table = {}
    for gpu, tuners in new.items():
        if keep and gpu in table:
            for name, plans in tuners.items():
                table[gpu].setdefault(name, {}).update(plans)
        else:
            table[gpu] = tuners
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
    parser.add_argument("--recipes", action="store_true",
                        help="tune the gpt and resnet recipes' problems instead")
    parser.add_argument("--merge", help="add a file written by --out to the shipped table, "
                                        "replacing its GPU's entries")
    parser.add_argument("--add", help="add a file written by --out to the shipped table, "
                                      "keeping its GPU's other entries")
    args = parser.parse_args()
    if args.merge or args.add:
        merge(args.merge or args.add, keep=bool(args.add))
    elif args.out:
        tune_recipes(args.out) if args.recipes else tune(args.out, args.quick)
    else:
        parser.error("give --out (on a GPU) or --merge")


if __name__ == "__main__":
    main()
