"""Shared benchmark plumbing: timing, the printed table, JSON and a PNG plot.

Every benchmark measures tritonad and PyTorch in the same run on the same GPU and reports the
ratio (PyTorch time / tritonad time: above 1 means tritonad is faster).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import time

import torch


def parse_args(description, argv=None, extra=None):
    """--out DIR (JSON and PNG go there), --quick (fewer sizes); extra(parser) adds more."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--out", default="bench-results", help="folder for JSON and PNG files")
    parser.add_argument("--quick", action="store_true", help="fewer sizes, for a smoke test")
    if extra:
        extra(parser)
    return parser.parse_args(argv)


def environment():
    """What the numbers were measured on."""
    import triton

    info = {"torch": torch.__version__, "triton": triton.__version__,
            "python": platform.python_version(), "date": time.strftime("%Y-%m-%d")}
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name()
    return info


def bench(fn, warmup=25, rep=100, flush_l2=True):
    """Median milliseconds of fn() on the GPU (triton.testing.do_bench: CUDA events, L2 flushed
    between runs so that inputs come from memory as in real use)."""
    import triton.testing

    return triton.testing.do_bench(fn, warmup=warmup, rep=rep, return_mode="median")


def bench_pair(ours, theirs, rounds=3, timer=None):
    """Median milliseconds of ours() and of theirs(), timed by `timer` (bench) in `rounds`
    rounds that alternate which of the two goes first; returns (ms_ours, ms_theirs).

    Under a power cap the SM clock falls within tens of milliseconds of sustained load (H200,
    700 W: 1980 MHz idle, 1440-1590 MHz under a large TF32 matmul; benchmarks/probe_power.py,
    2026-11-25, notes/PERF.md under Matmul), so whichever of two back-to-back timings runs
    first meets a cooler, faster GPU. Alternating the order and taking medians gives both the
    same conditions."""
    timer = timer or bench
    times = ([], [])
    for i in range(rounds):
        order = (0, 1) if i % 2 == 0 else (1, 0)
        for side in order:
            times[side].append(timer((ours, theirs)[side]))
    return tuple(sorted(t)[len(t) // 2] for t in times)


def per_call_us(fn, calls):
    """Microseconds per call of fn() run `calls` times back to back, synchronised once at the
    end (after 20 untimed calls): what an eager loop pays per call, host time included."""
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / calls * 1e6


def bench_graph(fn, replays=20):
    """Median ms of fn when captured in a CUDA graph (for launch-bound, tiny problems)."""
    import triton.testing

    if hasattr(triton.testing, "do_bench_cudagraph"):
        return triton.testing.do_bench_cudagraph(fn, rep=replays, return_mode="median")
    return bench(fn)


def peak_memory(fn):
    """Peak bytes allocated on the GPU while fn runs, above what was allocated before."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - before


def copy_bandwidth(nbytes=1 << 30):
    """The GPU's measured device-to-device copy bandwidth in GB/s (bytes read + written)."""
    src = torch.empty(nbytes // 4, dtype=torch.float32, device="cuda")
    dst = torch.empty_like(src)
    ms = bench(lambda: dst.copy_(src))
    return 2 * nbytes / ms / 1e6


def print_table(title, rows, columns):
    """rows: list of dicts; columns: list of (key, header, format)."""
    cells = [[h for _, h, _ in columns]]
    for row in rows:
        cells.append([("" if row.get(k) is None else fmt.format(row[k])) for k, _, fmt in columns])
    widths = [max(len(r[i]) for r in cells) for i in range(len(columns))]
    print(f"\n{title}")
    for i, r in enumerate(cells):
        print("  ".join(c.rjust(w) for c, w in zip(r, widths)))
        if i == 0:
            print("  ".join("-" * w for w in widths))


def markdown_table(rows, columns):
    lines = ["| " + " | ".join(h for _, h, _ in columns) + " |",
             "|" + "|".join("---" for _ in columns) + "|"]
    for row in rows:
        lines.append("| " + " | ".join(("" if row.get(k) is None else fmt.format(row[k]))
                                       for k, _, fmt in columns) + " |")
    return "\n".join(lines)


def save(out_dir, name, rows, meta=None):
    """Write rows (and the environment) to OUT/name.json; returns the path."""
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, f"{name}.json")
    payload = {"benchmark": name, "environment": environment(), "meta": meta or {}, "rows": rows}
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(payload, f, indent=1)
    os.replace(tmp, path)
    return path


def plot(out_dir, name, rows, x, series, xlabel, ylabel, logx=True, title=None, group=None):
    """A PNG line plot: one line per (series key, group value). Skipped if matplotlib is absent."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.5))
    groups = sorted({r[group] for r in rows}, key=str) if group else [None]
    for g in groups:
        sub = [r for r in rows if group is None or r[group] == g]
        for key, label in series:
            pts = [(r[x], r[key]) for r in sub if r.get(key) is not None]
            if pts:
                ax.plot(*zip(*pts), marker="o", label=f"{label} {g}" if g is not None else label)
    if logx:
        ax.set_xscale("log", base=2)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title or name)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, f"{name}.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def require_gpu(name):
    if not torch.cuda.is_available():
        raise SystemExit(f"{name}: benchmarks need a CUDA GPU (none found)")
