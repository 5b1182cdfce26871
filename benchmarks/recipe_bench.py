"""What `bench gpt` and `bench resnet` share: each run in a fresh process (tritonad's recipe
through a worker that calls its train function, PyTorch's through benchmarks/torch_*.py), its
JSON read back, the seeds averaged, and the ratios PyTorch time / tritonad time.

A process per run gives every run what a user's command gets: its own start-up (imports, data,
compilation) in the wall time, an empty device, and no state left by the run before it.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
TORCH_MODES = ("eager-fp32", "eager-bf16", "compile-bf16")
PRECISIONS = ("bf16", "fp32")


def add_options(parser, seeds, quick_seeds=1):
    """The options both benchmarks take, besides their length (--steps / --epochs)."""
    parser.add_argument("--seeds", type=int, default=None,
                        help=f"runs of each side, seeds 0..N-1, averaged (default {seeds}; "
                             f"--quick {quick_seeds})")
    parser.add_argument("--first-seed", type=int, default=0,
                        help="seeds run from this one (to split the seeds over several runs)")
    parser.add_argument("--modes", default=",".join(TORCH_MODES),
                        help="PyTorch's modes, a comma list of " + ",".join(TORCH_MODES))
    parser.add_argument("--precisions", default=",".join(PRECISIONS),
                        help="tritonad's precisions, a comma list of bf16,fp32")
    parser.add_argument("--cold", action="store_true",
                        help="every run starts with empty Triton and Inductor caches, as on a "
                             "fresh machine (compilation in the wall time)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)  # (the tritonad run's process)


def check_lists(args, quick_seeds=1, seeds=1):
    """args.modes / args.precisions as tuples, checked; args.seeds defaulted."""
    args.modes = tuple(m for m in args.modes.split(",") if m)
    args.precisions = tuple(p for p in args.precisions.split(",") if p)
    bad = [m for m in args.modes if m not in TORCH_MODES] + \
        [p for p in args.precisions if p not in PRECISIONS]
    if bad:
        raise SystemExit(f"unknown modes or precisions {bad}: PyTorch's modes are "
                         f"{', '.join(TORCH_MODES)}; tritonad's precisions {', '.join(PRECISIONS)}")
    if args.seeds is None:
        args.seeds = quick_seeds if args.quick else seeds
    if args.seeds < 1 or args.first_seed < 0:
        raise SystemExit(f"--seeds must be a positive integer and --first-seed non-negative, "
                         f"got {args.seeds} and {args.first_seed}")
    args.seed_list = list(range(args.first_seed, args.first_seed + args.seeds))
    return args


def run_json(command, cold=False):
    """Run command (a list) from the repository root in a fresh process and return the last
    JSON object it printed on stdout, with `process_s`, the wall time the parent measured;
    None (and a line saying why) when it fails. Its stderr (progress) passes through."""
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    with tempfile.TemporaryDirectory(prefix="recipe-bench-") as scratch:
        if cold:
            env["TRITON_CACHE_DIR"] = os.path.join(scratch, "triton")
            env["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(scratch, "inductor")
        print("$ " + " ".join(command[1:]), file=sys.stderr, flush=True)
        start = time.perf_counter()
        proc = subprocess.run(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
        seconds = time.perf_counter() - start
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        print(f"failed (exit status {proc.returncode}): {' '.join(command[1:])}", flush=True)
        return None
    result = json.loads(lines[-1])
    result["process_s"] = seconds
    return result


def python(script, *options):
    return [sys.executable, os.path.join(HERE, script)] + [str(o) for o in options]


def process_seconds():
    """Seconds since this process started (Linux's /proc; None elsewhere)."""
    try:
        with open("/proc/self/stat") as f:
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return max(0.0, uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return None


def mean(values):
    values = [v for v in values if v is not None]
    return statistics.fmean(values) if values else None


def summarise(results, keys):
    """One row per (framework, mode): the mean over its seeds of each of `keys` (results: the
    runs' dicts, each with framework and mode)."""
    rows = []
    for framework, mode in dict.fromkeys((r["framework"], r["mode"]) for r in results):
        runs = [r for r in results if (r["framework"], r["mode"]) == (framework, mode)]
        row = {"framework": framework, "mode": mode, "seeds": len(runs)}
        for key in keys:
            row[key] = mean([_get(r, key) for r in runs])
        rows.append(row)
    return rows


def _get(result, key):
    """result[key], or a dotted path into nested dicts ("generate.tokens_per_s")."""
    for part in key.split("."):
        if not isinstance(result, dict):
            return None
        result = result.get(part)
    return result


def add_ratios(rows, time_key, quality_key):
    """Ratios in place, PyTorch time / tritonad time (above 1: tritonad is faster):
    a PyTorch row's `ratio` against tritonad at its precision (bf16 modes against bf16,
    eager-fp32 against fp32; bf16 when that precision did not run) and `wall_ratio` of the
    whole runs alike; a tritonad row's `ratio` against PyTorch's fastest mode, and
    `quality_delta`, its quality_key minus that of PyTorch at its precision."""
    ours = {r["mode"]: r for r in rows if r["framework"] == "tritonad"}
    theirs = [r for r in rows if r["framework"] == "torch" and r.get(time_key)]

    def partner(mode):
        want = "fp32" if mode.endswith("fp32") else "bf16"
        return ours.get(want) or ours.get("bf16")

    for r in theirs:
        mine = partner(r["mode"])
        if mine and mine.get(time_key):
            r["ratio"] = r[time_key] / mine[time_key]
            if r.get("wall_s") and mine.get("wall_s"):
                r["wall_ratio"] = r["wall_s"] / mine["wall_s"]
    if theirs:
        fastest = min(theirs, key=lambda r: r[time_key])
        for precision, r in ours.items():
            if r.get(time_key):
                r["ratio"] = fastest[time_key] / r[time_key]
                r["vs"] = fastest["mode"]
            same = [t for t in theirs if t["mode"].endswith(precision)]
            if same and r.get(quality_key) is not None and same[0].get(quality_key) is not None:
                r["quality_delta"] = r[quality_key] - same[0][quality_key]
    return rows
