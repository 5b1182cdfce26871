"""The start-up breakdown that `train` logs: where the time before training went (import, data,
compile, tuning, capture, the first step or epoch), for the MNIST recipes and for gpt / resnet."""
from __future__ import annotations

import os


def process_seconds():
    """Seconds since this process started (Linux; None elsewhere): the import phase of a run."""
    try:
        with open("/proc/self/stat") as f:
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return max(0.0, uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return None


def counters():
    """(tuning seconds, capture seconds) spent in this process so far."""
    from .capture import CapturedStep
    from .kernels.tuning import Tuner

    return sum(t.seconds for t in Tuner.ALL), CapturedStep.capture_seconds


def after_first_epoch(seconds, since=(0.0, 0.0)):
    """Tuning and capture time spent since `since` (counters() before the run; they happen in
    the first epoch), and the first epoch's own time without them."""
    from .kernels.tuning import Tuner

    now = counters()
    tune, capture = now[0] - since[0], now[1] - since[1]
    sources = {}
    for t in Tuner.ALL:
        for source, count in t.counts().items():
            sources[source] = sources.get(source, 0) + count
    return {"tune": tune, "capture": capture,
            "first_epoch": max(0.0, seconds - tune - capture), "plans": sources}


def _sec(x):
    return "?" if x is None else f"{x:.1f} s"


def line(s):
    """One line (MNIST recipes): where the time before training went."""
    plans = ", ".join(f"{n} {k}" for k, n in sorted(s.get("plans", {}).items())) or "none"
    return (f"start-up: import {_sec(s['import'])} | data {_sec(s['data'])} | compile ahead "
            f"{_sec(s['compile'])} ({s['kernels_compiled_ahead']} kernels) | tune "
            f"{_sec(s['tune'])} | capture {_sec(s['capture'])} | first epoch "
            f"{_sec(s['first_epoch'])} (plans: {plans})")


def recipe_line(s):
    """One line (gpt, resnet): where the time before training went. Their first step compiles
    its kernels (there is no compile-ahead pass); the capture records the step as a graph."""
    return (f"start-up: import {_sec(s.get('import'))} | data {_sec(s.get('data'))} | first "
            f"step (compile) {_sec(s.get('first_step'))} | tune {_sec(s.get('tune'))} | "
            f"capture {_sec(s.get('capture'))}")


def rounded(s):
    """The breakdown for JSON: seconds to the millisecond."""
    return {k: round(v, 3) if isinstance(v, float) else v for k, v in s.items()}
