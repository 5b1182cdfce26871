"""End-to-end resnet: tritonad's `train --model resnet` recipe (Fashion-MNIST) against the same
recipe in PyTorch (benchmarks/torch_resnet.py in eager fp32, eager bf16 and torch.compile bf16),
in one run on one GPU: time per epoch, test accuracy, the whole run's wall time.

    python -m tritonad bench resnet           # the recipe: 12 epochs, 3 seeds (~4 min a seed)
    python -m tritonad bench resnet --quick   # 2 epochs, 1 seed

Each run is a fresh process (benchmarks/recipe_bench.py): tritonad's through a worker that
calls tritonad.resnet.train as `train --model resnet` does, PyTorch's through torch_resnet.py.
The epoch time is the steady state: the median of the epochs after the first (which holds
compilation, autotuning and graph capture), the test evaluation excluded; the wall time runs
from the process's start to its last evaluation. Ratios are PyTorch time / tritonad time
(above 1: tritonad is faster): a PyTorch mode against tritonad at its precision (bf16 or fp32,
TF32 convolutions in both), tritonad against PyTorch's fastest mode.
"""
from __future__ import annotations

import json
import statistics
import sys
import time

import common
import recipe_bench as rb

EPOCHS, QUICK_EPOCHS = 12, 2


def parse(argv=None):
    def extra(p):
        p.add_argument("--epochs", type=int, help=f"epochs (default: the recipe's {EPOCHS}; "
                       f"--quick {QUICK_EPOCHS})")
        rb.add_options(p, seeds=3)

    args = common.parse_args(__doc__.splitlines()[0], argv, extra)
    if args.worker:
        return args
    rb.check_lists(args, seeds=3)
    args.epochs = args.epochs or (QUICK_EPOCHS if args.quick else EPOCHS)
    if args.epochs < 1:
        raise SystemExit(f"bench resnet: --epochs must be a positive integer, got {args.epochs}")
    return args


# ------------------------------------------------------------------------------- tritonad side


def worker(spec):
    """One tritonad run in this process (spec: precision, seed, epochs; for tests also device,
    backend, batch, limit, test_limit, widths); returns the result dict, which it prints as a
    JSON line."""
    import tritonad as td
    from tritonad import resnet

    startup = {"import": rb.process_seconds()}
    device = spec.get("device", "cuda")
    td.set_backend(spec.get("backend", "triton"))
    extra = {k: spec[k] for k in ("batch", "limit", "test_limit", "data_dir") if k in spec}
    if "widths" in spec:
        extra["widths"] = tuple(spec["widths"])
    clock = time.perf_counter()
    _, history = resnet.train(device, epochs=spec["epochs"], precision=spec["precision"],
                              seed=spec["seed"],
                              log=lambda e: print(json.dumps(e), file=sys.stderr, flush=True),
                              **extra)
    startup["train"] = time.perf_counter() - clock  # (data included)
    times = [h["seconds"] for h in history]
    result = {"framework": "tritonad", "mode": spec["precision"], "device": device,
              "seed": spec["seed"], "epochs": spec["epochs"],
              "epoch_s": statistics.median(times[1:]) if len(times) > 1 else times[0],
              "steady": len(times) > 1, "first_epoch_s": times[0], "epoch_seconds": times,
              "test_accuracy": history[-1]["test_accuracy"],
              "test_accuracies": [h["test_accuracy"] for h in history],
              "startup": startup, "history": history, "wall_s": rb.process_seconds()}
    print(json.dumps(result), flush=True)
    return result


# ------------------------------------------------------------------------------- the run


COLUMNS = [("framework", "framework", "{}"), ("mode", "mode", "{}"),
           ("epoch_s", "s/epoch", "{:.3f}"), ("first_epoch_s", "1st epoch s", "{:.2f}"),
           ("test_accuracy", "test acc", "{:.4f}"),
           ("quality_delta", "acc - PyTorch's", "{:+.4f}"), ("wall_s", "wall s", "{:.1f}"),
           ("ratio", "PyTorch / tritonad", "{:.2f}"), ("vs", "vs", "{}"),
           ("wall_ratio", "wall ratio", "{:.2f}")]


def table(results):
    """The summary rows (mean over seeds) with their ratios."""
    rows = rb.summarise(results, ["epoch_s", "first_epoch_s", "test_accuracy", "wall_s",
                                  "process_s"])
    return rb.add_ratios(rows, "epoch_s", "test_accuracy")


def main(argv=None):
    args = parse(argv)
    if args.worker:
        return worker(json.loads(args.worker))
    common.require_gpu("bench_resnet")
    results = []
    for seed in args.seed_list:
        for precision in args.precisions:
            spec = dict(precision=precision, seed=seed, epochs=args.epochs)
            results.append(rb.run_json(rb.python("bench_resnet.py", "--worker",
                                                 json.dumps(spec)), args.cold))
        for mode in args.modes:
            results.append(rb.run_json(rb.python("torch_resnet.py", "--mode", mode, "--epochs",
                                                 args.epochs, "--seed", seed), args.cold))
    results = [r for r in results if r is not None]
    if not results:
        raise SystemExit("bench resnet: every run failed (see above)")
    rows = table(results)
    steady = all(r.get("steady") for r in results)
    common.print_table(f"resnet recipe (Fashion-MNIST), {args.epochs} epochs, mean of "
                       f"{args.seeds} seed(s) ({common.environment().get('gpu')}); ratio = "
                       f"PyTorch time / tritonad time" + ("" if steady else "; NOTE: one "
                                                          "epoch, so s/epoch includes the "
                                                          "warm-up"), rows, COLUMNS)
    print(common.markdown_table(rows, COLUMNS))
    common.save(args.out, "bench_resnet", rows, {"epochs": args.epochs, "seeds": args.seed_list,
                                                "cold": args.cold, "runs": results})
    return rows


if __name__ == "__main__":
    main()
