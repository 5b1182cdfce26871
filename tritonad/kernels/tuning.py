"""How a tiled kernel (matmul, convolution) gets its plan (tile sizes, split-K, warps, stages)
for a problem, without making the user wait.

A problem's plan comes from the first of:
1. this process's memory of earlier choices;
2. this machine's tuning cache, ~/.cache/tritonad/autotune/<tuner>-<gpu>-triton<version>.json
   (TRITONAD_AUTOTUNE_DIR moves it), which only tuning writes;
3. the table shipped in the package (plans.json beside this file), made by
   scripts/make_plan_table.py on the GPUs we could measure, keyed by GPU name and compute
   capability, Triton version, tuner and problem;
4. timing every candidate (autotuning), only when asked for: td.autotune(True),
   TRITONAD_AUTOTUNE=1 or `train --tune`;
5. otherwise the first candidate, the launcher's shape heuristic (its candidate lists are
   ordered best guess first, from the sweeps in benchmarks/).
So a new shape costs no more than compiling its kernel (and nothing once compiled), and a tuned
choice is kept for the next run. Tuner.sources says where each plan came from.
"""
from __future__ import annotations

import json
import os
import threading
import time
import warnings

import torch
import triton

from ..backend import autotuning
from .launch import gc_paused
from .plans import compiling_ahead, not_recording

_TABLE_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "plans.json")
_TABLE = None
_LOCK = threading.Lock()


def gpu_key(device=None) -> str:
    """What the shipped table is keyed on: GPU name, compute capability, Triton major.minor."""
    index = torch.cuda.current_device() if device is None or device.index is None \
        else device.index
    major, minor = torch.cuda.get_device_capability(index)
    version = ".".join(triton.__version__.split(".")[:2])
    return f"{torch.cuda.get_device_name(index)}|sm{major}{minor}|triton{version}"


def shipped_plans(tuner_name, device=None) -> dict:
    """The shipped table's plans of one tuner for this GPU and Triton version ({} if none)."""
    global _TABLE
    with _LOCK:
        if _TABLE is None:
            try:
                with open(_TABLE_PATH) as f:
                    _TABLE = json.load(f)
            except (OSError, ValueError):
                _TABLE = {}
    if not torch.cuda.is_available():
        return {}
    return _TABLE.get(gpu_key(device), {}).get(tuner_name, {})


class Tuner:
    """Chooses the plan of each problem key (module docstring); `version` stamps the cache
    file, which is ignored when the kernels' source changed."""

    ALL: list = []  # every tuner made (matmul's, conv's), for start-up reports and benchmarks

    def __init__(self, name, version=""):
        Tuner.ALL.append(self)
        self.name, self.version = name, version
        self.memory: dict[str, dict] = {}
        self.disk: dict[str, dict] | None = None
        self.sources: dict[str, str] = {}   # key -> "tuned", "cache", "table" or "heuristic"
        self.seconds = 0.0                  # spent timing candidates in this process
        self.tuned = 0
        self.hits = 0
        self.last = None                    # (key, plan) of the latest choice
        self.timings: dict[str, dict[str, float | str]] = {}  # key -> {plan: ms or error}

    def path(self):
        folder = os.environ.get("TRITONAD_AUTOTUNE_DIR") or os.path.join(
            os.path.expanduser("~"), ".cache", "tritonad", "autotune")
        gpu = "".join(c if c.isalnum() else "-" for c in torch.cuda.get_device_name())
        return os.path.join(folder, f"{self.name}-{gpu}-triton{triton.__version__}.json")

    def _read(self):
        try:
            with open(self.path()) as f:
                payload = json.load(f)
        except (OSError, ValueError):
            return {}
        return payload.get("plans", {}) if payload.get("source") == self.version else {}

    def _write(self, key, plan):
        path = self.path()
        plans = {**self._read(), key: plan}
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            tmp = f"{path}.{os.getpid()}.tmp"
            with open(tmp, "w") as f:
                json.dump({"source": self.version, "plans": plans}, f, indent=0, sort_keys=True)
            os.replace(tmp, path)
        except OSError as err:  # a read-only home only costs re-tuning next run
            warnings.warn(f"{self.name} tuner: cannot save {path}: {err}")

    def choose(self, key, make_candidates, run, device=None):
        """The plan for `key`: remembered, cached, shipped, measured now by timing run(plan)
        for each plan of make_candidates() (when autotuning), or make_candidates()[0]."""
        plan = self.memory.get(key)
        if plan is None and compiling_ahead():  # a dry run: the best guess, nothing kept
            return self._known(key, device) or make_candidates()[0]
        if plan is None:
            plan, source = self._choose(key, make_candidates, run, device)
            self.memory[key] = plan
            self.sources[key] = source
        self.last = (key, plan)
        return plan

    def _known(self, key, device):
        """A plan cached or shipped for key, if any (unchecked against the candidates)."""
        if self.disk is None:
            self.disk = self._read()
        return self.disk.get(key) or shipped_plans(self.name, device).get(key)

    def _choose(self, key, make_candidates, run, device):
        if self.disk is None:
            self.disk = self._read()
        candidates = make_candidates()
        plan = self.disk.get(key)
        if plan is not None and plan in candidates:  # (not a stale choice among older menus)
            self.hits += 1
            return plan, "cache"
        plan = shipped_plans(self.name, device).get(key)
        if plan is not None and plan in candidates:
            return plan, "table"
        if not autotuning() or torch.cuda.is_current_stream_capturing() or len(candidates) == 1:
            return candidates[0], "heuristic"
        start = time.perf_counter()
        with not_recording():  # the candidates' trial launches are no part of a call's plan
            plan = self._measure(key, candidates, run)
        self.seconds += time.perf_counter() - start
        self.tuned += 1
        self.disk[key] = plan
        self._write(key, plan)
        return plan, "tuned"

    def _measure(self, key, candidates, run):
        best, best_ms, first_error = None, float("inf"), None
        timings = self.timings.setdefault(key, {})
        for plan in candidates:
            try:
                ms = measure_ms(lambda plan=plan: run(plan))
            except Exception as err:  # e.g. out of shared memory for this tile on this GPU
                first_error = first_error or err
                timings[json.dumps(plan, sort_keys=True)] = type(err).__name__
                continue
            timings[json.dumps(plan, sort_keys=True)] = ms
            if ms < best_ms:
                best, best_ms = plan, ms
        if best is None:
            raise RuntimeError(f"{self.name}: no candidate plan compiled and ran") \
                from first_error
        return best

    def counts(self) -> dict:
        """How many plans came from each source in this process."""
        out = {}
        for source in self.sources.values():
            out[source] = out.get(source, 0) + 1
        return out


def measure_ms(fn, launches=10, reps=5):
    """Milliseconds of GPU time per call of fn.

    Calls of a few microseconds (the MNIST products) are timed as a captured step runs them:
    `launches` calls captured in a CUDA graph, the best of `reps` replays, so launch gaps count
    and the ~10-40 us of Python per eager call does not (timed eagerly, every small plan looks
    alike and two-kernel plans look worse than they are). Longer calls are timed eagerly
    (triton.testing.do_bench), where host time hides behind the GPU anyway."""
    import triton.testing

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    fn()  # compile and allocate outside any timing
    start.record()
    fn()
    end.record()
    end.synchronize()
    if start.elapsed_time(end) > 0.2:
        return triton.testing.do_bench(fn, warmup=5, rep=20, return_mode="median")
    # NOTE: capture_begin on a side stream rather than `with torch.cuda.graph()`, whose entry
    # runs gc.collect() and empty_cache(): tens of ms per candidate
    graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    try:
        with torch.cuda.stream(stream), gc_paused(collect=False):  # many captures: no collect
            graph.capture_begin()
            try:
                for _ in range(launches):
                    fn()
            finally:
                graph.capture_end()
        torch.cuda.current_stream().wait_stream(stream)
        graph.replay()
        best = float("inf")
        for _ in range(reps):
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            best = min(best, start.elapsed_time(end) / launches)
        return best
    finally:
        # NOTE: destroyed here, not by the garbage collector, which might do it in the middle of
        # a later capture (a graph destroyed while a stream captures invalidates that capture)
        graph.reset()

