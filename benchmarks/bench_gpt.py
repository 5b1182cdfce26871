"""End-to-end gpt: tritonad's `train --model gpt` recipe against the same recipe in PyTorch
(benchmarks/torch_gpt.py in eager fp32, eager bf16 and torch.compile bf16), in one run on one
GPU: time per step, tokens/s, final train and validation loss, the whole run's wall time, and
`generate` at batch 1 (tritonad's key/value-cache sampler against PyTorch's naive loop).

    python -m tritonad bench gpt              # the recipe: 2000 steps, 2 seeds (~5 min a seed)
    python -m tritonad bench gpt --quick      # 200 steps, 1 seed
    python -m tritonad bench gpt --first-seed 1 --seeds 1 --out bench-results/seed1  # seed 1 only

Each run is a fresh process (benchmarks/recipe_bench.py): tritonad's through a worker that
calls tritonad.gpt.train as `train --model gpt` does (import, corpus, training, evaluations),
PyTorch's through torch_gpt.py. Time per step is the steady state: the intervals between
validation losses after the first (which holds compilation, autotuning and graph capture),
evaluation excluded; the wall time runs from the process's start to its last evaluation.
Ratios are PyTorch time / tritonad time (above 1: tritonad is faster): a PyTorch mode against
tritonad at its precision (bf16 or fp32), tritonad against PyTorch's fastest mode. `generate`
samples --generate characters after the prompt "ROMEO:" at temperature 0.8, top-k 50, each
read back to the host as it is drawn; tritonad's sampler runs float32 (as the `generate`
command), PyTorch's loop in its eager mode's precision; tokens/s after the first token.
"""
from __future__ import annotations

import json
import sys
import time

import common
import recipe_bench as rb

STEPS, QUICK_STEPS = 2000, 200
PROMPT = "ROMEO:"


def parse(argv=None):
    def extra(p):
        p.add_argument("--steps", type=int, help=f"optimizer steps (default: the recipe's "
                       f"{STEPS}; --quick {QUICK_STEPS})")
        p.add_argument("--eval-every", type=int, help="steps between validation losses "
                       "(default 250, as `train`; --quick 50)")
        p.add_argument("--generate", type=int, default=500, metavar="N",
                       help="characters sampled at batch 1 after training (0: none)")
        rb.add_options(p, seeds=2)

    args = common.parse_args(__doc__.splitlines()[0], argv, extra)
    if args.worker:
        return args
    rb.check_lists(args, seeds=2)
    args.steps = args.steps or (QUICK_STEPS if args.quick else STEPS)
    args.eval_every = args.eval_every or (50 if args.quick else 250)
    if args.steps < 1 or args.eval_every < 1 or args.generate < 0:
        raise SystemExit("bench gpt: --steps and --eval-every must be positive, --generate >= 0")
    return args


# ------------------------------------------------------------------------------- tritonad side


def worker(spec):
    """One tritonad run in this process (spec: precision, seed, steps, eval_every, generate;
    for tests also device, backend, batch, eval_batches, overrides of gpt.RECIPE); returns the
    result dict, which it prints as a JSON line."""
    import tritonad as td
    from tritonad import corpus, gpt

    startup = {"import": rb.process_seconds()}
    device = spec.get("device", "cuda")
    td.set_backend(spec.get("backend", "triton"))
    clock = time.perf_counter()
    text = corpus.Shakespeare(spec.get("data_dir"))
    startup["data"] = time.perf_counter() - clock
    overrides = spec.get("overrides", {})
    clock = time.perf_counter()
    model, history = gpt.train(
        text, device, steps=spec["steps"], batch=spec.get("batch"), precision=spec["precision"],
        seed=spec["seed"], eval_every=spec["eval_every"],
        eval_batches=spec.get("eval_batches", 20),
        log=lambda e: print(json.dumps(e), file=sys.stderr, flush=True), **overrides)
    startup["train"] = time.perf_counter() - clock
    recipe = dict(gpt.RECIPE, **overrides)
    batch, context = spec.get("batch") or recipe["batch"], recipe["context"]
    intervals, done = [], 0  # (steps, seconds) between evaluations, from the logged tokens/s
    for entry in history:
        steps = entry["step"] - done
        intervals.append((steps, steps * batch * context / entry["tokens_per_s"]))
        done = entry["step"]
    steady = intervals[1:] or intervals  # the first holds the warm-up
    step_ms = 1e3 * sum(s for _, s in steady) / sum(n for n, _ in steady)
    result = {"framework": "tritonad", "mode": spec["precision"], "device": device,
              "seed": spec["seed"], "steps": spec["steps"], "batch": batch, "context": context,
              "step_ms": step_ms, "steady": len(intervals) > 1,
              "tokens_per_s": batch * context / step_ms * 1e3,
              "train_loss": history[-1]["train_loss"], "val_loss": history[-1]["val_loss"],
              "startup": startup, "history": history, "wall_s": rb.process_seconds()}
    tokens = spec.get("generate", 0)
    if tokens:
        td.manual_seed(spec["seed"])
        prompt = td.tensor([text.encode(PROMPT)], device=device)
        model.generate(prompt, min(20, tokens), 0.8, 50)  # warm-up: the kernels compile
        stamps = []
        ids = model.generate(prompt, tokens, 0.8, 50,
                             emit=lambda _: stamps.append(time.perf_counter()))
        rate = (len(stamps) - 1) / (stamps[-1] - stamps[0]) if len(stamps) > 1 else None
        result["generate"] = {"tokens": tokens, "tokens_per_s": rate, "text": text.decode(ids)}
    print(json.dumps(result), flush=True)
    return result


# ------------------------------------------------------------------------------- the run


COLUMNS = [("framework", "framework", "{}"), ("mode", "mode", "{}"),
           ("step_ms", "ms/step", "{:.2f}"), ("tokens_per_s", "tokens/s", "{:,.0f}"),
           ("train_loss", "train loss", "{:.4f}"), ("val_loss", "val loss", "{:.4f}"),
           ("quality_delta", "val - PyTorch's", "{:+.4f}"), ("wall_s", "wall s", "{:.1f}"),
           ("ratio", "PyTorch / tritonad", "{:.2f}"), ("vs", "vs", "{}"),
           ("wall_ratio", "wall ratio", "{:.2f}"), ("generate_tps", "generate tok/s", "{:,.0f}"),
           ("generate_ratio", "generate tritonad x", "{:.1f}")]


def table(results):
    """The summary rows (mean over seeds) with their ratios."""
    rows = rb.summarise(results, ["step_ms", "tokens_per_s", "train_loss", "val_loss",
                                  "wall_s", "process_s", "generate.tokens_per_s"])
    for r in rows:
        r["generate_tps"] = r.pop("generate.tokens_per_s")
    rb.add_ratios(rows, "step_ms", "val_loss")
    ours = next((r["generate_tps"] for r in rows
                 if r["framework"] == "tritonad" and r["generate_tps"]), None)
    for r in rows:
        if r["framework"] == "torch" and ours and r["generate_tps"]:
            r["generate_ratio"] = ours / r["generate_tps"]
    return rows


def main(argv=None):
    args = parse(argv)
    if args.worker:
        return worker(json.loads(args.worker))
    common.require_gpu("bench_gpt")
    results = []
    for seed in args.seed_list:
        for precision in args.precisions:
            spec = dict(precision=precision, seed=seed, steps=args.steps,
                        eval_every=args.eval_every,
                        generate=args.generate if precision == args.precisions[0] else 0)
            results.append(rb.run_json(rb.python("bench_gpt.py", "--worker", json.dumps(spec)),
                                       args.cold))
        for mode in args.modes:
            sample = ["--generate", args.generate] if args.generate and \
                mode.startswith("eager") else []
            results.append(rb.run_json(rb.python(
                "torch_gpt.py", "--mode", mode, "--steps", args.steps, "--seed", seed,
                "--eval-every", args.eval_every, *sample), args.cold))
    results = [r for r in results if r is not None]
    if not results:
        raise SystemExit("bench gpt: every run failed (see above)")
    rows = table(results)
    steady = all(r.get("steady") for r in results)
    common.print_table(f"gpt recipe, {args.steps} steps, mean of {args.seeds} seed(s) "
                       f"({common.environment().get('gpu')}); ratio = PyTorch time / tritonad "
                       f"time" + ("" if steady else "; NOTE: one evaluation interval, so ms/step "
                                  "includes the warm-up"), rows, COLUMNS)
    print(common.markdown_table(rows, COLUMNS))
    sample = next((r["generate"]["text"] for r in results
                   if r["framework"] == "tritonad" and r.get("generate")), None)
    if sample:
        print(f"\ntritonad generate, {args.generate} characters after {PROMPT!r}:\n{sample}\n")
    common.save(args.out, "bench_gpt", rows, {"steps": args.steps, "seeds": args.seed_list,
                                             "eval_every": args.eval_every, "cold": args.cold,
                                             "runs": results})
    return rows


if __name__ == "__main__":
    main()
