"""Compile, for a GPU, every kernel specialization that a CPU test run launched, on a machine
without a GPU: Triton's compiler needs no device, and the interpreter that runs our kernels in
CPU tests does not check what the compiler checks (operand types of atomics, layouts, ...).

    TRITONAD_NOTE_KERNELS=/tmp/kernels.jsonl python -m pytest tests/... -q   # CPU, interpreter
    python scripts/compile_check.py /tmp/kernels.jsonl [--arch 90] [-j 2]

Each distinct (kernel, argument types, constexprs, options) is compiled to a cubin for sm_ARCH;
the failures are printed with the compiler's first error line, and the exit status is 1 if any.
The interpreter runs with huge blocks (one program does a lot); block constexprs above --max-block
are clamped to it, so that each check compiles a kernel of the size a GPU would run. A launch of
the elementwise kernel names its table formula, which is made again here (an entry that a test
defined for itself is skipped).
"""
from __future__ import annotations

import argparse
import concurrent.futures
import importlib
import json
import os
import sys

os.environ["TRITON_INTERPRET"] = "0"  # import our kernels as compilable JITFunctions


SKIPPED = "skipped"


def compile_one(entry, arch):
    import triton
    import triton.language as tl
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    module = importlib.import_module(entry["module"])
    fn = getattr(module, entry["name"])
    constexprs = {}
    for name, value in entry["constexprs"].items():
        if isinstance(value, dict) and "dtype" in value:
            value = tl.dtype(value["dtype"])
        elif isinstance(value, dict) and "formula" in value:  # the elementwise table's
            from tritonad import elementwise as table
            from tritonad.kernels.elementwise import form
            try:
                value = form(table.formula(value["formula"])).fn
            except KeyError:  # an entry a test defined for itself: not in this process
                return SKIPPED
        constexprs[name] = value
    options = dict(entry["options"])
    options.pop("launch_cooperative_grid", None)
    try:
        src = ASTSource(fn=fn, signature=entry["signature"], constexprs=constexprs)
        triton.compile(src, target=GPUTarget("cuda", arch, 32), options=options)
    except Exception as err:  # noqa: BLE001  (report every failure, go on)
        lines = [ln for ln in str(err).splitlines() if "error" in ln.lower()] or [str(err)]
        return f"{entry['module']}.{entry['name']} {entry['constexprs']}: " \
               f"{type(err).__name__}: {lines[0][:400]}"
    return None


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notes")
    parser.add_argument("--arch", type=int, default=90)
    parser.add_argument("-j", type=int, default=2, help="compile processes")
    parser.add_argument("--max-block", type=int, default=1024)
    args = parser.parse_args(argv)
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    entries = {}
    with open(args.notes) as f:
        for line in f:
            if not line.strip():
                continue
            entry = json.loads(line)
            for name, value in entry["constexprs"].items():
                if "BLOCK" in name and isinstance(value, int) and value > args.max_block:
                    entry["constexprs"][name] = args.max_block
            entries[json.dumps(entry, sort_keys=True)] = entry
    print(f"compiling {len(entries)} kernel specializations for sm_{args.arch}", flush=True)
    with concurrent.futures.ProcessPoolExecutor(args.j) as pool:
        results = list(pool.map(compile_one, entries.values(), [args.arch] * len(entries)))
    failures = [r for r in results if r and r != SKIPPED]
    skipped = results.count(SKIPPED)
    for failure in failures:
        print("FAILED", failure)
    print(f"{len(entries) - len(failures) - skipped} compiled, {len(failures)} failed, "
          f"{skipped} skipped (elementwise entries that a test defined for itself)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
