"""One optimizer step: tritonad's fused single-launch SGD-momentum, Adam, Adadelta, RMSprop and
Adagrad against torch.optim (foreach=True, and fused=True where torch has it on the GPU: SGD and
Adam) on the same GPU in the same run, for the parameter sets of the MNIST mlp and cnn recipes
and a 100M-parameter set.

    python benchmarks/bench_optim.py --out bench-results [--quick]

Metric: GB/s = bytes touched / t, with bytes touched per parameter (float32) = what a fused
update must read and write: SGD with momentum reads p, g, buf and writes p, buf: 5 * 4 = 20 B;
Adam reads p, g, m, v and writes p, m, v: 7 * 4 = 28 B; Adadelta likewise with its two
averages: 28 B; RMSprop reads p, g, v and writes p, v: 20 B, plus 8 B for the momentum buffer
and 8 B for the centered average; Adagrad reads p, g, sum and writes p, sum: 20 B (the same
count for every contender). Two timings each: eager (step() called 200 times back to back,
wall time per call: host time where the launch is the bottleneck, as on these sets; GB/s from
it) and replayed from a CUDA graph (the step captured once; torch's Adam, Adadelta and
RMSprop need capturable=True there). Ratios are torch time / tritonad time: above 1 means
tritonad is faster; "best torch" is the faster of foreach and fused.
"""
from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

import tritonad as td  # noqa: E402
from tritonad import optim  # noqa: E402

PARAM_SETS = {
    # 784-256-100-10 with biases (torch's Linear layout: weight [out, in])
    "mlp": [(256, 784), (256,), (100, 256), (100,), (10, 100), (10,)],
    # conv5x5(1->32)-conv5x5(32->64)-linear(3136->512)-linear(512->10)
    "cnn": [(32, 1, 5, 5), (32,), (64, 32, 5, 5), (64,), (512, 3136), (512,), (10, 512), (10,)],
    # the MLP blocks of a width-1024 transformer, 12 layers: 100.8M parameters in 48 tensors
    "100M": [(4096, 1024), (4096,), (1024, 4096), (1024,)] * 12,
}
QUICK_SETS = ("mlp", "cnn")
EAGER_CALLS = 200
OPTIMIZERS = {
    # name: (class name, options, bytes touched per parameter, torch's variant for the graph)
    "sgd-momentum": ("SGD", dict(lr=0.01, momentum=0.9), 20, dict(fused=True)),
    "adam": ("Adam", dict(lr=1e-3), 28, dict(fused=True, capturable=True)),
    "adadelta": ("Adadelta", dict(lr=1.0), 28, dict(foreach=True, capturable=True)),
    "rmsprop": ("RMSprop", dict(lr=1e-2), 20, dict(foreach=True, capturable=True)),
    "rmsprop-momentum-centered": ("RMSprop", dict(lr=1e-2, momentum=0.9, centered=True), 36,
                                  dict(foreach=True, capturable=True)),
    "adagrad": ("Adagrad", dict(lr=1e-2), 20, dict(foreach=True)),
}


def _graph_ms(step):
    """Median ms of step() replayed from a CUDA graph, or None if it cannot be captured."""
    try:
        return common.bench_graph(step)
    except Exception as err:  # a contender that does not capture gets an empty cell
        print(f"  (graph capture failed: {type(err).__name__}: {str(err).splitlines()[0]})")
        torch.cuda.synchronize()
        return None


def _tritonad_step(values, grads, cls, options):
    params = [td.from_torch(v.clone()).requires_grad_() for v in values]
    opt = getattr(optim, cls)(params, **options)
    for p, g in zip(params, grads):
        p.grad = td.from_torch(g.clone())
    opt.step()  # warm up: compiles, moves the grads into the flat buffer, creates the state
    return opt


def _torch_step(values, grads, cls, options, **variant):
    """A warmed-up torch optimizer, or None where torch lacks the variant (say fused=True for
    Adadelta, or on CUDA for Adagrad)."""
    params = [v.clone().requires_grad_() for v in values]
    for p, g in zip(params, grads):
        p.grad = g.clone()
    try:
        opt = getattr(torch.optim, cls)(params, **options, **variant)
        opt.step()
    except (TypeError, RuntimeError) as err:
        print(f"  (torch.optim.{cls} {variant}: {type(err).__name__}: "
              f"{str(err).splitlines()[0]})")
        return None
    return opt


def measure(set_name, shapes, opt_name, device="cuda"):
    """One row: eager and graph timings of one step of every contender."""
    cls, options, bytes_per_param, graph_variant = OPTIMIZERS[opt_name]
    gen = torch.Generator(device=device).manual_seed(0)
    values = [torch.randn(s, device=device, generator=gen) for s in shapes]
    grads = [torch.randn(s, device=device, generator=gen) * 1e-2 for s in shapes]
    n = sum(v.numel() for v in values)
    nbytes = bytes_per_param * n
    row = {"set": set_name, "optimizer": opt_name, "params": n, "tensors": len(shapes)}

    opt = _tritonad_step(values, grads, cls, options)
    row["td_ms"] = common.per_call_us(opt.step, EAGER_CALLS) / 1e3
    row["td_graph_ms"] = _graph_ms(opt.step)
    del opt
    for variant, kwargs in (("foreach", dict(foreach=True)), ("fused", dict(fused=True))):
        opt = _torch_step(values, grads, cls, options, **kwargs)
        row[f"{variant}_ms"] = common.per_call_us(opt.step, EAGER_CALLS) / 1e3 \
            if opt is not None else None
        del opt
    opt = _torch_step(values, grads, cls, options, **graph_variant)
    row["torch_graph_ms"] = _graph_ms(opt.step) if opt is not None else None
    del opt
    if device == "cuda":
        torch.cuda.empty_cache()

    for key in ("td", "td_graph", "foreach", "fused", "torch_graph"):
        ms = row.get(f"{key}_ms")
        row[f"{key}_gbps"] = nbytes / ms / 1e6 if ms else None   # bytes touched / t
    best_torch = min(ms for ms in (row["foreach_ms"], row["fused_ms"]) if ms is not None)
    row["ratio"] = best_torch / row["td_ms"]
    if row["td_graph_ms"] and row["torch_graph_ms"]:
        row["graph_ratio"] = row["torch_graph_ms"] / row["td_graph_ms"]
    return row


COLUMNS = [
    ("set", "set", "{}"), ("optimizer", "optimizer", "{}"), ("params", "params", "{:,}"),
    ("td_ms", "tritonad ms", "{:.4f}"), ("td_gbps", "GB/s", "{:.0f}"),
    ("foreach_ms", "torch foreach ms", "{:.4f}"), ("fused_ms", "torch fused ms", "{:.4f}"),
    ("fused_gbps", "GB/s", "{:.0f}"), ("ratio", "best torch / td", "{:.2f}x"),
    ("td_graph_ms", "td graph ms", "{:.4f}"), ("torch_graph_ms", "torch graph ms", "{:.4f}"),
    ("graph_ratio", "graph ratio", "{:.2f}x"),
]


def main(argv=None):
    args = common.parse_args(__doc__.splitlines()[0], argv)
    common.require_gpu("bench_optim")
    td.set_backend("triton")
    sets = QUICK_SETS if args.quick else tuple(PARAM_SETS)
    rows = []
    for set_name in sets:
        for opt_name in OPTIMIZERS:
            print(f"measuring {opt_name} on {set_name} ...", flush=True)
            rows.append(measure(set_name, PARAM_SETS[set_name], opt_name))
    peak = common.copy_bandwidth()
    title = (f"one optimizer step (GB/s = bytes touched / t; device copy bandwidth "
             f"{peak:.0f} GB/s)")
    common.print_table(title, rows, COLUMNS)
    path = common.save(args.out, "optim", rows, meta={"copy_bandwidth_gbps": peak,
                                                     "bytes_per_param": {k: v[2] for k, v in
                                                                         OPTIMIZERS.items()}})
    common.plot(args.out, "optim", rows, x="params",
                series=[("td_gbps", "tritonad"), ("fused_gbps", "torch fused"),
                        ("foreach_gbps", "torch foreach")],
                xlabel="parameters", ylabel="GB/s (bytes touched / t)", group="optimizer",
                title="one optimizer step, eager")
    print(f"\nwrote {path}")
    return rows


if __name__ == "__main__":
    main()
