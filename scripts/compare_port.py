"""examples/mnist_pytorch.py against examples/mnist_tritonad.py (the same script with its import
lines changed): the same recipe and data for several seeds, every run its own process and all
of them at once, then each framework's mean test accuracy after every epoch.

    python scripts/compare_port.py --seeds 1 2 3 --epochs 14 --out port.json [--no-accel]

--no-accel runs both on the CPU (tritonad: its numpy backend). Prints one line per run and a
table of the means; writes every run's JSON (accuracy per epoch, seconds) to --out.
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = {"torch": "examples/mnist_pytorch.py", "tritonad": "examples/mnist_tritonad.py"}
FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
         "t10k-labels-idx1-ubyte")


def torchvision_folder():
    """A data folder in torchvision's layout (MNIST/raw/<plain IDX files>) holding the
    repository's MNIST: torchvision reads it without downloading, and so does tritonad."""
    folder = tempfile.mkdtemp(prefix="mnist-port-")
    raw = os.path.join(folder, "MNIST", "raw")
    os.makedirs(raw)
    for name in FILES:
        with gzip.open(os.path.join(ROOT, "data", "mnist", name + ".gz")) as f, \
                open(os.path.join(raw, name), "wb") as out:
            out.write(f.read())
    return folder


def run_all(runs, folder, args, env):
    """Start every (framework, seed) run at once; their final JSON lines, in order."""
    procs = {}
    for fw, seed in runs:
        cmd = [sys.executable, SCRIPTS[fw], "--data", folder, "--quiet",
               "--seed", str(seed), "--epochs", str(args.epochs)]
        cmd += ["--no-accel"] if args.no_accel else []
        cmd += ["--limit", str(args.limit)] if args.limit else []
        procs[fw, seed] = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                           stderr=subprocess.STDOUT, text=True)
    results = []
    try:
        for (fw, seed), proc in procs.items():
            out, _ = proc.communicate()
            last = out.strip().splitlines()[-1] if out.strip() else ""
            if proc.returncode != 0 or not last.startswith("{"):
                sys.exit(f"{fw} seed {seed} failed (exit {proc.returncode}):\n{out[-3000:]}")
            result = json.loads(last)
            results.append(result)
            print(f"{fw:9s} seed {seed}: accuracy {100 * result['accuracy']:.2f}%  "
                  f"{result['seconds']:.0f} s")
    finally:
        for proc in procs.values():  # after a failure, the others too
            if proc.poll() is None:
                proc.kill()
    return results


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--epochs", type=int, default=14)
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--no-accel", action="store_true")
    parser.add_argument("--frameworks", nargs="+", default=list(SCRIPTS), choices=list(SCRIPTS))
    parser.add_argument("--threads", type=int, default=None,
                        help="CPU threads per run (OMP/MKL/OpenBLAS); default: cores / runs")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()

    runs = [(fw, seed) for fw in args.frameworks for seed in args.seeds]
    threads = args.threads or max(1, (os.cpu_count() or 1) // len(runs))
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.update({k: str(threads) for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS",
                                          "OPENBLAS_NUM_THREADS")})
    folder = torchvision_folder()
    start = time.perf_counter()
    try:
        results = run_all(runs, folder, args, env)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    print(f"all runs at once: {time.perf_counter() - start:.0f} s, {threads} CPU threads each")

    means = {}
    for fw in args.frameworks:
        mine = [r["accuracies"] for r in results if r["framework"] == fw]
        means[fw] = [100 * sum(col) / len(col) for col in zip(*mine)]
    print("epoch  " + "  ".join(f"{fw:>9s}" for fw in args.frameworks) +
          ("  difference" if len(means) == 2 else ""))
    for e in range(args.epochs):
        row = [means[fw][e] for fw in args.frameworks]
        diff = f"  {row[1] - row[0]:+9.2f}" if len(row) == 2 else ""
        print(f"{e + 1:5d}  " + "  ".join(f"{v:9.2f}" for v in row) + diff)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"runs": results, "mean_accuracy": means, "epochs": args.epochs,
                       "no_accel": args.no_accel, "limit": args.limit}, f, indent=1)


if __name__ == "__main__":
    main()
