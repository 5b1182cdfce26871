"""Data-parallel MNIST on 1, 2, 4 GPUs (torchrun, NCCL, captured steps): throughput and
accuracy per GPU count in one table.

Every run is the command line a user types, `torchrun --standalone --nproc_per_node=G -m
tritonad train --model M ...`, one process per GPU, its step a captured CUDA graph that holds
the gradient all-reduce. Two runs per model and GPU count:
- "same global batch": the recipe (its global batch split over the G GPUs, its epochs, its
  learning rate): the test accuracy should match one GPU's (the issue: within 0.2 points);
- "512 per GPU": a fixed per-GPU batch of 512 (global 512 G), a few epochs: throughput,
  images/s = the epoch's training images / the epoch's seconds, the median of the epochs after
  the first (which compiles and captures); speedup = images/s over one GPU's at 512.
tritonad only: PyTorch's DDP is not measured here (bench mnist compares one GPU with PyTorch).
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import torch

import common

ROOT = Path(__file__).resolve().parents[1]


def run(gpus, model, extra, timeout):
    """One torchrun launch of `tritonad train`; returns its JSON report."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc_per_node={gpus}", "-m", "tritonad", "train", "--model", model, "--quiet",
           *extra]
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)
    reports = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode or not reports:
        raise RuntimeError(f"{' '.join(cmd[2:])} failed ({done.returncode}):\n"
                           f"{done.stderr[-3000:]}")
    return json.loads(reports[-1])


def row(model, gpus, mode, report):
    seconds = report["epoch_seconds"]
    steady = statistics.median(seconds[1:]) if len(seconds) > 1 else seconds[0]
    return {"model": model, "gpus": gpus, "mode": mode, "global_batch": report["batch_size"],
            "epochs": report["epochs"], "epoch_s": steady,
            "images_per_s": report["train_images"] / steady,
            "test_accuracy": report["test_accuracy"], "graph": report["graph"]}


def main(argv=None):
    args = common.parse_args(__doc__.splitlines()[0], argv, extra=lambda p: (
        p.add_argument("--gpus", default="1,2,4", help="comma list of GPU counts"),
        p.add_argument("--models", default="cnn", help="comma list of logreg,mlp,cnn"),
        p.add_argument("--epochs", type=int, help="accuracy runs (default: the recipe's)"),
        p.add_argument("--throughput-epochs", type=int, default=3),
        p.add_argument("--per-gpu-batch", type=int, default=512),
        p.add_argument("--timeout", type=int, default=1200, help="seconds per launch")))
    common.require_gpu("bench_ddp")
    try:
        counts = sorted({int(g) for g in args.gpus.split(",") if g})
    except ValueError:
        raise SystemExit(f"bench_ddp: --gpus {args.gpus!r} is not a comma list of numbers")
    available = torch.cuda.device_count()
    skipped = [g for g in counts if g > available or g < 1]
    counts = [g for g in counts if g not in skipped]
    if skipped:
        print(f"bench_ddp: skipping {skipped} GPUs (this machine has {available})")
    if not counts:
        raise SystemExit(f"bench_ddp: none of --gpus {args.gpus} fits this machine's "
                         f"{available} GPU(s)")
    epochs = 2 if args.quick else args.epochs
    fast_epochs = 2 if args.quick else args.throughput_epochs
    rows = []
    for model in [m for m in args.models.split(",") if m]:
        for gpus in counts:
            same = ["--epochs", str(epochs)] if epochs else []
            rows.append(row(model, gpus, "same global batch", run(gpus, model, same,
                                                                   args.timeout)))
            print(rows[-1], flush=True)
            fixed = ["--epochs", str(fast_epochs), "--batch-size",
                     str(args.per_gpu_batch * gpus)]
            rows.append(row(model, gpus, f"{args.per_gpu_batch} per GPU",
                            run(gpus, model, fixed, args.timeout)))
            print(rows[-1], flush=True)
    for r in rows:  # against one GPU of the same model and mode, where it ran
        base = next((b for b in rows if b["gpus"] == 1 and b["model"] == r["model"] and
                     b["mode"] == r["mode"]), None)
        r["speedup"] = r["images_per_s"] / base["images_per_s"] if base else None
        r["accuracy_change_points"] = \
            100 * (r["test_accuracy"] - base["test_accuracy"]) if base else None
    columns = [("model", "model", "{}"), ("mode", "batch", "{}"), ("gpus", "GPUs", "{}"),
               ("global_batch", "global batch", "{}"), ("epochs", "epochs", "{}"),
               ("epoch_s", "s/epoch", "{:.3f}"), ("images_per_s", "img/s", "{:,.0f}"),
               ("speedup", "x one GPU", "{:.2f}"), ("test_accuracy", "test acc", "{:.4f}"),
               ("accuracy_change_points", "acc change (points)", "{:+.2f}")]
    env = common.environment()
    title = f"Data-parallel MNIST, torchrun + NCCL, captured steps ({env.get('gpu')})"
    common.print_table(title, rows, columns)
    print(common.markdown_table(rows, columns))
    common.save(args.out, "bench_ddp", rows, {"gpus": counts, "per_gpu_batch":
                                              args.per_gpu_batch})
    common.plot(args.out, "bench_ddp", [r for r in rows if r["mode"] != "same global batch"],
                "gpus", [("images_per_s", "img/s")], "GPUs", "training images per second",
                logx=False, group="model")
    return rows


if __name__ == "__main__":
    main()
