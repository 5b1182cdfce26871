"""End-to-end MNIST: the three recipes in tritonad and in PyTorch (eager and torch.compile), in
one run on one GPU: time per epoch, total time, test accuracy, peak device memory; plus epochs
on tritonad's numpy backend on the CPU (the "numpy vs GPU" table).

--cpu (no GPU needed): tritonad's numpy backend against PyTorch's CPU build in the same run, on
the same cores: the time of one training step (the recipe's batch) and of the test-set
evaluation (10000 images, batches of 1000, as `tritonad train` evaluates), for the cnn and the
mlp. PyTorch gets as many threads as numpy's BLAS finds cores (torch.set_num_threads). The two
frameworks take turns, round after round, so that a load that comes and goes on a shared
machine falls on both; the table gives medians and the spread of the rounds.

Both frameworks get the same recipe (models.RECIPES: SGD momentum 0.9, cosine decay per step),
the same data on the GPU (normalised once), a fresh permutation each epoch and batches gathered
by index, and the same float32 precision at both frameworks' defaults (IEEE matmul, TF32
convolutions). Time per epoch excludes the test evaluation; the first epoch includes warm-up
(compilation, autotuning, graph capture), so the steady-state epoch is reported as the median
of the later ones.
"""
from __future__ import annotations

import os
import platform
import statistics
import time

import numpy as np
import torch

import common

MODELS = ("logreg", "mlp", "cnn")


# ------------------------------------------------------------------------------- PyTorch side


def torch_model(name):
    nn = torch.nn
    if name == "logreg":
        return nn.Sequential(nn.Flatten(), nn.Linear(784, 10))
    if name == "mlp":
        return nn.Sequential(nn.Flatten(), nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 100),
                             nn.ReLU(), nn.Linear(100, 10))
    return nn.Sequential(nn.Conv2d(1, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(32, 64, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(3136, 512), nn.ReLU(), nn.Linear(512, 10))


def run_torch(name, data, epochs, compiled, seed=0):
    from tritonad.models import RECIPES

    # matched precision, both frameworks at their defaults: float32 matmul in IEEE float32,
    # float32 convolution on TF32 tensor cores (torch.backends.cudnn.allow_tf32 = True)
    torch.backends.cudnn.allow_tf32 = True
    torch.backends.cuda.matmul.allow_tf32 = False

    rec = RECIPES[name]
    torch.manual_seed(seed)
    xtr, ytr, xte, yte = data
    model = torch_model(name).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=rec.lr, momentum=rec.momentum)
    steps_per_epoch = -(-len(xtr) // rec.batch_size)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=epochs * steps_per_epoch)
    loss_fn = torch.nn.functional.cross_entropy

    fwd = torch.compile(model) if compiled else model

    def step(x, y):
        loss = loss_fn(fwd(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(epochs):
        torch.cuda.synchronize()
        start = time.perf_counter()
        order = torch.randperm(len(xtr), device="cuda")
        for b in range(steps_per_epoch):
            idx = order[b * rec.batch_size:(b + 1) * rec.batch_size]
            step(xtr[idx], ytr[idx])
            sched.step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    with torch.no_grad():
        model.eval()
        correct = sum(int((fwd(xte[i:i + 1000]).argmax(1) == yte[i:i + 1000]).sum())
                      for i in range(0, len(xte), 1000))
    return times, correct / len(xte), torch.cuda.max_memory_allocated()


# ------------------------------------------------------------------------------- tritonad side


def run_tritonad(name, epochs, graph, device="cuda", backend="triton", limit=None, seed=0,
                 fuse=True):
    import tritonad as td
    from tritonad import models, optim, train

    td.set_backend(backend)
    td.manual_seed(seed)
    rec = models.RECIPES[name]
    train_set, test_set = train.datasets("mnist")
    loader = td.data.DataLoader(train_set, rec.batch_size, shuffle=True, device=device,
                                limit=limit)
    test_loader = td.data.DataLoader(test_set, 1000, device=device)
    model = models.build(name).to(device)
    opt = optim.SGD(model.parameters(), lr=rec.lr, momentum=rec.momentum)
    sched = optim.lr_scheduler.CosineAnnealingLR(opt, T_max=epochs * len(loader))
    trainer = train.Trainer(model, opt, loader, sched, graph=graph, fuse=fuse)
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    times = [trainer.train_epoch(e + 1, epochs, progress=False)["seconds"] for e in range(epochs)]
    _, acc = train.evaluate(model, test_loader)
    peak = torch.cuda.max_memory_allocated() if device == "cuda" else None
    return times, acc, peak


# ------------------------------------------------------------------------------- CPU mode


def _cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _timed(fn):
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


class _TritonadCPU:
    """A model, optimizer and loaders on the numpy backend; step(b) trains on batch b of an
    epoch's order, evaluate() runs train.evaluate over the test set."""

    def __init__(self, name, train_set, test_set):
        import tritonad as td
        from tritonad import models, optim, train

        td.manual_seed(0)
        rec = models.RECIPES[name]
        self.batch = rec.batch_size
        loader = td.data.DataLoader(train_set, rec.batch_size, shuffle=True, device="cpu")
        self.test_loader = td.data.DataLoader(test_set, 1000, device="cpu")
        self.model = models.build(name)
        opt = optim.SGD(self.model.parameters(), lr=rec.lr, momentum=rec.momentum)
        self.trainer = train.Trainer(self.model, opt, loader)  # the CLI's eager CPU step
        self.order = loader.permutation()
        self._evaluate = train.evaluate

    def step(self, b):
        self.trainer.eager_step(self.order[b * self.batch:(b + 1) * self.batch])

    def evaluate(self):
        return self._evaluate(self.model, self.test_loader)


class _TorchCPU:
    """The same recipe in PyTorch on the CPU."""

    def __init__(self, name, data):
        from tritonad.models import RECIPES

        rec = RECIPES[name]
        torch.manual_seed(0)
        self.batch = rec.batch_size
        self.xtr, self.ytr, self.xte, self.yte = data
        self.model = torch_model(name)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=rec.lr, momentum=rec.momentum)
        self.order = torch.randperm(len(self.xtr))

    def step(self, b):
        idx = self.order[b * self.batch:(b + 1) * self.batch]
        loss = torch.nn.functional.cross_entropy(self.model(self.xtr[idx]), self.ytr[idx])
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()

    @torch.no_grad()
    def evaluate(self):
        """Mean loss and accuracy over the test set in batches of 1000, as train.evaluate."""
        self.model.eval()
        loss, correct = 0.0, 0
        for i in range(0, len(self.xte), 1000):
            logits = self.model(self.xte[i:i + 1000])
            y = self.yte[i:i + 1000]
            loss += float(torch.nn.functional.cross_entropy(logits, y, reduction="sum"))
            correct += int((logits.argmax(1) == y).sum())
        self.model.train()
        return loss / len(self.xte), correct / len(self.xte)


def cpu_main(args):
    """tritonad's numpy backend against PyTorch CPU, step and evaluation, taking turns."""
    import tritonad as td

    threads = args.threads or len(os.sched_getaffinity(0))
    saved_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with td.use_backend("numpy"):
            return _cpu_rows(args, threads)
    finally:
        torch.set_num_threads(saved_threads)


def _cpu_rows(args, threads):
    import tritonad as td
    from tritonad import train

    names = [m for m in args.models.split(",") if m]
    steps, rounds = (5, 2) if args.quick else (args.steps, args.rounds)
    train_set, test_set = train.datasets("mnist")
    mean, std = td.data.MNIST.MEAN, td.data.MNIST.STD

    def prep(ds):
        x = torch.tensor(ds.images).float().div_(255).sub_(mean).div_(std)
        return x.unsqueeze(1), torch.tensor(ds.labels)

    data = (*prep(train_set), *prep(test_set))
    rows = []
    for name in names:
        ours, theirs = _TritonadCPU(name, train_set, test_set), _TorchCPU(name, data)
        times = {("step", "tritonad"): [], ("step", "torch"): [], ("eval", "tritonad"): [],
                 ("eval", "torch"): []}
        for side, runner in (("tritonad", ours), ("torch", theirs)):  # warm-up
            for b in range(2):
                runner.step(b)
        batch = 2
        for _ in range(rounds):
            for side, runner in (("tritonad", ours), ("torch", theirs)):
                times[("step", side)] += [_timed(lambda: runner.step(b))
                                          for b in range(batch, batch + steps)]
                times[("eval", side)].append(_timed(runner.evaluate))
            batch += steps
        for what, label in (("step", f"train step (batch {ours.batch})"),
                            ("eval", "test evaluation (10000 images)")):
            row = {"model": name, "measure": label}
            for side in ("tritonad", "torch"):
                values = times[(what, side)]
                row[f"{side}_ms"] = statistics.median(values) * 1e3
                row[f"{side}_spread"] = (max(values) - min(values)) / statistics.median(values)
            row["ratio"] = row["tritonad_ms"] / row["torch_ms"]
            rows.append(row)
            print(row, flush=True)
    columns = [("model", "model", "{}"), ("measure", "measure", "{}"),
               ("tritonad_ms", "tritonad numpy ms", "{:.1f}"),
               ("tritonad_spread", "spread", "{:.0%}"),
               ("torch_ms", "PyTorch CPU ms", "{:.1f}"), ("torch_spread", "spread", "{:.0%}"),
               ("ratio", "tritonad / PyTorch time", "{:.2f}")]
    title = (f"MNIST on the CPU ({_cpu_name()}, {threads} threads for PyTorch, numpy's BLAS on "
             f"the cores it finds; medians of {rounds} rounds: {steps} steps and one evaluation "
             f"each; spread = (max - min) / median)")
    common.print_table(title, rows, columns)
    print(common.markdown_table(rows, columns))
    common.save(args.out, "bench_mnist_cpu", rows, {"threads": threads, "cpu": _cpu_name(),
                                                    "steps": steps, "rounds": rounds})
    return rows


def _row(framework, name, times, acc, peak, epochs):
    steady = statistics.median(times[1:]) if len(times) > 1 else times[0]
    return {"model": name, "framework": framework, "epochs": epochs,
            "first_epoch_s": times[0], "epoch_s": steady, "total_s": sum(times),
            "test_accuracy": acc, "peak_mb": None if peak is None else peak / 2 ** 20}


def main(argv=None):
    args = common.parse_args(__doc__.splitlines()[0], argv, extra=lambda p: (
        p.add_argument("--models", default="mlp,cnn", help="comma list of logreg,mlp,cnn"),
        p.add_argument("--epochs", type=int, default=10),
        p.add_argument("--skip-compile", action="store_true", help="no torch.compile runs"),
        p.add_argument("--no-fuse", action="store_true",
                       help="the mlp on per-op kernels, not the fused MLP step (both backends)"),
        p.add_argument("--skip-numpy", action="store_true", help="no CPU numpy-backend epochs"),
        p.add_argument("--numpy-limit", type=int, default=6000,
                       help="images per numpy-backend cnn epoch (extrapolated to 60000)"),
        p.add_argument("--cpu", action="store_true",
                       help="tritonad's numpy backend against PyTorch CPU: step and evaluation "
                            "times (no GPU needed)"),
        p.add_argument("--steps", type=int, default=10, help="--cpu: timed steps per round"),
        p.add_argument("--rounds", type=int, default=3, help="--cpu: rounds of turns"),
        p.add_argument("--threads", type=int, default=None,
                       help="--cpu: PyTorch's threads (default: the cores this process has)")))
    if args.cpu:
        return cpu_main(args)
    common.require_gpu("bench_mnist")
    import tritonad as td
    from tritonad import train

    names = [m for m in args.models.split(",") if m]
    epochs = 2 if args.quick else args.epochs
    train_set, test_set = train.datasets("mnist")
    mean, std = td.data.MNIST.MEAN, td.data.MNIST.STD

    def prep(ds):
        x = torch.tensor(ds.images, device="cuda").float().div_(255).sub_(mean).div_(std)
        return x.unsqueeze(1), torch.tensor(ds.labels, device="cuda")

    data = (*prep(train_set), *prep(test_set))
    rows = []
    for name in names:
        for graph in (True, False):
            label = "tritonad (graph)" if graph else "tritonad (eager)"
            rows.append(_row(label, name, *run_tritonad(name, epochs, graph,
                                                        fuse=not args.no_fuse), epochs))
            print(rows[-1], flush=True)
        rows.append(_row("torch eager", name, *run_torch(name, data, epochs, False), epochs))
        print(rows[-1], flush=True)
        if not args.skip_compile:
            try:
                rows.append(_row("torch.compile", name, *run_torch(name, data, epochs, True),
                                 epochs))
            except Exception as err:  # noqa: BLE001  (compile needs a working inductor toolchain)
                print(f"torch.compile failed for {name}: {err}")
            print(rows[-1], flush=True)
        if not args.skip_numpy and name in ("mlp", "cnn", "logreg"):
            limit = None if name != "cnn" else args.numpy_limit
            times, acc, _ = run_tritonad(name, 1, graph=False, device="cpu", backend="numpy",
                                         limit=limit, fuse=not args.no_fuse)
            scale = 60000 / (limit or 60000)
            rows.append({"model": name, "framework": "tritonad numpy (CPU)", "epochs": 1,
                         "first_epoch_s": times[0] * scale, "epoch_s": times[0] * scale,
                         "total_s": None, "test_accuracy": acc if limit is None else None,
                         "peak_mb": None,
                         "note": None if limit is None else f"extrapolated from {limit} images"})
            td.set_backend("triton")
    for name in names:
        base = next((r for r in rows if r["model"] == name and r["framework"] == "torch eager"),
                    None)
        ours = next(r for r in rows if r["model"] == name and r["framework"] == "tritonad (graph)")
        for r in rows:
            if r["model"] == name:
                r["speedup_vs_torch_eager"] = base["epoch_s"] / r["epoch_s"] if base else None
                r["tritonad_graph_speedup"] = r["epoch_s"] / ours["epoch_s"]
    columns = [("model", "model", "{}"), ("framework", "framework", "{}"),
               ("epoch_s", "s/epoch", "{:.4f}"), ("first_epoch_s", "1st epoch s", "{:.3f}"),
               ("total_s", "total s", "{:.2f}"), ("test_accuracy", "test acc", "{:.4f}"),
               ("peak_mb", "peak MB", "{:.0f}"),
               ("speedup_vs_torch_eager", "x vs torch eager", "{:.2f}"),
               ("tritonad_graph_speedup", "tritonad graph x faster", "{:.1f}")]
    common.print_table(f"MNIST, {epochs} epochs ({common.environment().get('gpu')})", rows,
                       columns)
    print(common.markdown_table(rows, columns))
    common.save(args.out, "bench_mnist", rows, {"epochs": epochs})
    common.plot(args.out, "bench_mnist", rows, "model", [("epoch_s", "s/epoch")], "model",
                "seconds per epoch", logx=False, group="framework")
    return rows


if __name__ == "__main__":
    main()
