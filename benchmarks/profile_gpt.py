"""Profile: where a gpt recipe step goes on the GPU (not part of `tritonad bench`; `bench gpt`
gives the user-facing ratios against PyTorch).

    python benchmarks/profile_gpt.py [--steps 300] [--precision bf16]

1. The steady step of the recipe as `train` runs it (captured unless --no-graph): gpt.train for
   --steps steps, the time of each interval of 100 steps after the first (evaluation excluded).
2. The eager step's kernels: 3 steps under torch.profiler after 5 warm-up steps, each kernel's
   GPU time per step, largest first, and their sum against the step's wall time.
"""
import argparse
import time

import torch


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--precision", default="bf16", choices=["fp32", "bf16"])
    p.add_argument("--no-graph", action="store_true")
    p.add_argument("--top", type=int, default=30)
    args = p.parse_args(argv)
    import tritonad as td
    from tritonad import corpus, gpt, optim
    from tritonad.amp import for_precision
    from tritonad.nn.utils import clip_grad_norm_

    td.set_backend("triton")
    text = corpus.Shakespeare()
    _, history = gpt.train(text, "cuda", steps=args.steps, precision=args.precision,
                           eval_every=100, eval_batches=2, graph=not args.no_graph)
    from tritonad.kernels import matmul
    print(f"matmul plans by source: {matmul.tuner.counts()}")
    for key, plan in sorted(matmul.tuner.memory.items()):
        print(f"  {key:48} {matmul.tuner.sources.get(key, '?'):9} {matmul.describe(plan)}")
    batch, context = gpt.RECIPE["batch"], gpt.RECIPE["context"]
    for entry in history:
        ms = batch * context / entry["tokens_per_s"] * 1e3
        print(f"steps to {entry['step']}: {ms:.2f} ms a step ({entry['tokens_per_s']:,.0f} tokens/s)")

    r = gpt.RECIPE
    model = gpt.GPT(text.vocab_size, r["layers"], r["heads"], r["width"], r["context"],
                    r["dropout"]).to("cuda")
    opt = optim.AdamW(model.decay_groups(r["weight_decay"]), lr=r["lr"], betas=r["betas"])
    cast, _ = for_precision(args.precision, "cuda")
    train_ids, _ = text.split(0.9, "cuda")
    params = list(model.parameters())

    def step():
        x, y = text.windows(train_ids, batch, context)
        with cast:
            _, loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        clip_grad_norm_(params, r["clip"])
        opt.step()

    for _ in range(5):
        step()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(10):
        step()
    torch.cuda.synchronize()
    wall = (time.perf_counter() - start) / 10 * 1e3
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            step()
        torch.cuda.synchronize()
    rows = [(e.device_time_total / 3, e.count / 3, e.key) for e in prof.key_averages()
            if e.device_time_total > 0]
    rows.sort(reverse=True)
    total = sum(r[0] for r in rows) / 1e3
    print(f"eager step: {wall:.2f} ms wall, {total:.2f} ms of kernels")
    for us, count, key in rows[:args.top]:
        print(f"{us / 1e3:8.3f} ms {count:6.0f}x  {key[:100]}")


if __name__ == "__main__":
    main()
