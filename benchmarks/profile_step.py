"""Where the time of one captured training step goes: host work per step (batch slicing, input
copy, graph replay, scheduler and learning-rate sync) against the GPU time of the replayed graph,
and the kernels inside the graph with their device times. Not part of `tritonad bench`.

    python benchmarks/profile_step.py --models mlp,cnn
"""
from __future__ import annotations

import statistics
import time

import torch

import common


def host_us(fn, n):
    torch.cuda.synchronize()
    start = time.perf_counter()
    for i in range(n):
        fn(i)
    host = (time.perf_counter() - start) / n * 1e6
    torch.cuda.synchronize()
    return host


def profile(name, epochs, plans=False):
    import tritonad as td
    from tritonad import models, optim, train

    td.manual_seed(0)
    rec = models.RECIPES[name]
    train_set, _ = train.datasets("mnist")
    loader = td.data.DataLoader(train_set, rec.batch_size, shuffle=True, device="cuda")
    model = models.build(name).to("cuda")
    opt = optim.SGD(model.parameters(), lr=rec.lr, momentum=rec.momentum)
    sched = optim.lr_scheduler.CosineAnnealingLR(opt, T_max=10 * len(loader))
    trainer = train.Trainer(model, opt, loader, sched, graph=True)
    trainer.train_epoch(progress=False)  # compile, tune, capture
    seconds = [trainer.train_epoch(progress=False)["seconds"] for _ in range(epochs)]
    steps = len(trainer._batches)
    graph = trainer.captured_step.graph

    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        graph.replay()
    torch.cuda.synchronize()
    replay_us = (time.perf_counter() - start) / steps * 1e6
    print(f"\n== {name}: {steps} captured steps/epoch, epoch {statistics.median(seconds):.4f} s "
          f"= {statistics.median(seconds) / steps * 1e6:.1f} us/step; back-to-back replays "
          f"{replay_us:.1f} us/step (GPU time)")

    def write_rows(i):
        for row, values in zip(trainer._table_rows, trainer._hyperparameter_rows()):
            row[i % steps] = values

    with opt.fed_hyperparameters():
        pieces = {
            "hyperparameter rows into the table": write_rows,
            "captured_step() (graph launch)": lambda i: trainer.captured_step(),
            "scheduler.step() + opt.sync()": lambda i: (sched.step(), opt.sync()),
        }
        for label, fn in pieces.items():
            print(f"  host {label:36s} {host_us(fn, steps):8.1f} us")

    from torch.profiler import ProfilerActivity, profile as tprofile

    reps = 20
    with tprofile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            graph.replay()
        torch.cuda.synchronize()
    kernels = {}
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            kernels.setdefault(ev.name, []).append(ev.device_time)
    total = sum(sum(v) for v in kernels.values()) / reps
    print(f"  kernels in the graph: {sum(len(v) for v in kernels.values()) / reps:.0f} per step, "
          f"{total:.1f} us of kernel time per step")
    for kname, times in sorted(kernels.items(), key=lambda kv: -sum(kv[1])):
        per = sum(times) / reps
        print(f"    {per:7.1f} us  x{len(times) // reps:<2d} {kname[:90]}")
    launches = sorted((ev for ev in prof.events()
                       if ev.device_type == torch.autograd.DeviceType.CUDA),
                      key=lambda ev: ev.time_range.start)
    per_step = len(launches) // reps
    # (the mean of each launch over the replays but the first: one replay's durations vary by
    # a few us, enough to mislead an A/B of one kernel)
    replays = [launches[r * per_step:(r + 1) * per_step] for r in range(1, reps)]
    print(f"  a replay, in order (start offset, duration: mean and min of {reps - 1} replays):")
    for k, ev in enumerate(replays[0]):
        starts = [one[k].time_range.start - one[0].time_range.start for one in replays]
        times = [one[k].device_time for one in replays]
        print(f"    +{statistics.mean(starts):7.1f} us {statistics.mean(times):6.1f} us "
              f"(min {min(times):5.1f})  {ev.name[:64]}")
    if plans:
        matmul_plans(trainer)


def graph_us(fn, launches=20, reps=15):
    """GPU time per call of fn, replayed from a CUDA graph of `launches` calls (min of reps)."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(launches):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(begin.elapsed_time(end) * 1000 / launches)
    return min(times)


def matmul_plans(trainer):
    """Every candidate plan of every matmul of one step, timed eagerly (do_bench, what the tuner
    does) and from a CUDA graph (what a captured step sees)."""
    import triton.testing

    from tritonad.kernels import matmul as mm

    calls = {}
    choose = mm.tuner.choose

    def record(key, make_candidates, run):
        calls.setdefault(key, (make_candidates, run))
        return choose(key, make_candidates, run)

    mm.tuner.choose = record
    try:
        order = trainer.loader.permutation()
        trainer.eager_step(order[:trainer.loader.batch_size])
    finally:
        mm.tuner.choose = choose
    total_now = total_best = 0.0
    for key, (make_candidates, run) in calls.items():
        chosen = mm.tuner.memory.get(key)
        rows = []
        for plan in make_candidates():
            try:
                eager = triton.testing.do_bench(lambda: run(plan), warmup=5, rep=20,
                                                return_mode="median") * 1000
                in_graph = graph_us(lambda: run(plan))
            except Exception as err:  # noqa: BLE001
                print(f"    {mm.describe(plan)}: {type(err).__name__}")
                continue
            rows.append((in_graph, eager, plan))
        rows.sort(key=lambda r: r[0])
        now = next((r[0] for r in rows if r[2] == chosen), float("nan"))
        total_now += now
        total_best += rows[0][0]
        print(f"  matmul {key}: chosen {mm.describe(chosen)} {now:.1f} us in a graph")
        for in_graph, eager, plan in rows:
            mark = "*" if plan == chosen else " "
            print(f"   {mark} graph {in_graph:6.1f} us  eager {eager:6.1f} us  {mm.describe(plan)}")
    print(f"  matmuls of one step in a graph: chosen plans {total_now:.1f} us, best plans "
          f"{total_best:.1f} us")


def main(argv=None):
    args = common.parse_args(__doc__.splitlines()[0], argv, extra=lambda p: (
        p.add_argument("--models", default="mlp,cnn"),
        p.add_argument("--epochs", type=int, default=2),
        p.add_argument("--plans", action="store_true",
                       help="time every candidate matmul plan of the step, eager and in a graph")))
    common.require_gpu("profile_step")
    import tritonad as td

    td.set_backend("triton")
    for name in args.models.split(","):
        profile(name, args.epochs, args.plans)


if __name__ == "__main__":
    main()
