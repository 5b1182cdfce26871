"""The command line: `python -m tritonad {train,eval,predict,bench} ...` (also `tritonad ...`)."""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

BENCHMARKS = ("elementwise", "reduce", "matmul", "softmax", "cross-entropy", "conv", "pool",
              "optim", "mnist", "augment")


def _parser():
    p = argparse.ArgumentParser(prog="tritonad", description="Train, evaluate and run MNIST "
                                "models and kernel benchmarks on tritonad's Triton kernels.")
    sub = p.add_subparsers(dest="command", required=True)

    t = sub.add_parser("train", help="train a model (logreg, mlp, cnn)")
    t.add_argument("--model", choices=["logreg", "mlp", "cnn"], default="mlp")
    t.add_argument("--epochs", type=int, help="default: the recipe's (10)")
    t.add_argument("--batch-size", type=int, help="default: the recipe's")
    t.add_argument("--lr", type=float, help="default: the recipe's")
    t.add_argument("--optimizer", choices=["sgd", "adam", "adamw"], help="default: sgd")
    t.add_argument("--schedule", choices=["cosine", "constant"], help="default: cosine")
    t.add_argument("--device", help="cuda or cpu (default: cuda if there is a GPU)")
    t.add_argument("--backend", choices=["triton", "numpy"],
                   help="default: triton on a GPU, numpy otherwise")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--save", metavar="PATH", help="write a checkpoint here after each epoch")
    t.add_argument("--resume", metavar="PATH", help="continue from a checkpoint")
    t.add_argument("--data-dir", help="folder holding the dataset files (or TRITONAD_DATA)")
    t.add_argument("--dataset", choices=["mnist", "fashion-mnist"], default="mnist")
    t.add_argument("--plot", metavar="PATH", help="write a PNG of the loss/accuracy curves")
    t.add_argument("--no-graph", action="store_true", help="run every step eagerly on the GPU "
                   "instead of replaying a captured CUDA graph")
    t.add_argument("--no-fuse", action="store_true", help="train a plain ReLU MLP with per-op "
                   "kernels and autodiff instead of the fused MLP step")
    t.add_argument("--limit", type=int, help="train on the first N training images only")
    t.add_argument("--quiet", action="store_true", help="no progress bars")

    e = sub.add_parser("eval", help="test accuracy of a checkpoint")
    e.add_argument("--checkpoint", required=True)
    e.add_argument("--data-dir")
    e.add_argument("--device")
    e.add_argument("--backend", choices=["triton", "numpy"])

    r = sub.add_parser("predict", help="classify images of handwritten digits")
    r.add_argument("--checkpoint", required=True)
    r.add_argument("images", nargs="+", metavar="IMAGE")
    r.add_argument("--device")
    r.add_argument("--backend", choices=["triton", "numpy"])

    b = sub.add_parser("bench", help="benchmarks against PyTorch (needs a GPU)")
    b.add_argument("which", choices=BENCHMARKS + ("all",))
    b.add_argument("--out", default="bench-results", help="folder for tables, JSON and PNGs")
    b.add_argument("--quick", action="store_true", help="fewer sizes")
    return p


def _setup(args, say):
    """Pick backend and device; say what was picked and why."""
    import torch

    import tritonad as td

    gpu = torch.cuda.is_available()
    backend = args.backend or ("triton" if gpu else "numpy")
    td.set_backend(backend)
    device = args.device or ("cuda" if backend == "triton" and gpu else "cpu")
    if backend == "triton" and not gpu:
        say("note: no GPU found: the triton backend runs under Triton's interpreter (very slow)")
    elif backend == "numpy" and not args.backend and not gpu:
        say("note: no GPU found, so this runs on the numpy backend on the CPU")
    where = torch.cuda.get_device_name() if device.startswith("cuda") else "CPU"
    say(f"backend: {backend} | device: {device} ({where})")
    return backend, device


def cmd_train(args):
    import tritonad as td
    from tritonad import models, optim, serialization, train

    say = (lambda *a: None) if args.quiet else (lambda *a: print(*a, file=sys.stderr))
    backend, device = _setup(args, say)
    rec = train.recipe(args.model)
    epochs = args.epochs or rec.epochs
    batch = args.batch_size or rec.batch_size
    lr = args.lr or rec.lr
    opt_name = args.optimizer or rec.optimizer
    schedule = args.schedule or rec.schedule
    if epochs < 1 or batch < 1 or lr <= 0:
        raise SystemExit("train: --epochs, --batch-size and --lr must be positive")
    td.manual_seed(args.seed)
    train_set, test_set = train.datasets(args.dataset, args.data_dir)
    loader = td.data.DataLoader(train_set, batch, shuffle=True, device=device, limit=args.limit)
    test_loader = td.data.DataLoader(test_set, 1000, device=device)
    model = models.build(args.model).to(device)
    optimizer = train.make_optimizer(opt_name, model.parameters(), lr, rec.momentum)
    steps = epochs * len(loader)
    scheduler = optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=steps) \
        if schedule == "cosine" else None
    start_epoch, history = 1, []
    if args.resume:
        state = serialization.load(args.resume, map_location=device)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        if scheduler is not None and state.get("scheduler"):
            scheduler.load_state_dict(state["scheduler"])
        td.set_rng_state(state["rng"])
        start_epoch, history = state["epoch"] + 1, list(state.get("history", []))
        say(f"resumed from {args.resume} after epoch {state['epoch']}")
    graph = device.startswith("cuda") and backend == "triton" and not args.no_graph
    trainer = train.Trainer(model, optimizer, loader, scheduler, graph=graph,
                            fuse=not args.no_fuse)
    steps = ("captured CUDA graph" if graph else "eager") + (" fused MLP" if trainer.fused else "")
    say(f"model: {args.model} ({sum(p.numel() for p in model.parameters()):,} parameters) | "
        f"data: {args.dataset}, {loader.num_samples} training images | batch {batch}, "
        f"{opt_name} lr {lr} ({schedule}) | {steps} steps")
    began = time.perf_counter()
    for epoch in range(start_epoch, epochs + 1):
        stats = trainer.train_epoch(epoch, epochs, progress=not args.quiet)
        test_loss, test_acc = train.evaluate(model, test_loader)
        stats.update(epoch=epoch, test_loss=test_loss, test_accuracy=test_acc)
        history.append(stats)
        say(f"epoch {epoch}: train loss {stats['loss']:.4f} acc {stats['accuracy']:.4f} | test "
            f"loss {test_loss:.4f} acc {test_acc:.4f} | {stats['seconds']:.2f} s, "
            f"{stats['images_per_s']:,.0f} img/s")
        if args.save:
            serialization.save({"format": "tritonad-checkpoint", "model_name": args.model,
                                "dataset": args.dataset, "model": model.state_dict(),
                                "optimizer": optimizer.state_dict(),
                                "scheduler": scheduler.state_dict() if scheduler else None,
                                "epoch": epoch, "rng": td.get_rng_state(), "history": history},
                               args.save)
    if args.plot:
        _plot(history, args.plot, f"{args.model} on {args.dataset}")
        say(f"wrote {args.plot}")
    final = history[-1] if history else {}
    print(json.dumps({"model": args.model, "dataset": args.dataset, "backend": backend,
                      "device": device, "epochs": epochs, "batch_size": batch, "lr": lr,
                      "optimizer": opt_name, "graph": graph,
                      "test_accuracy": final.get("test_accuracy"),
                      "test_loss": final.get("test_loss"),
                      "train_loss": final.get("loss"), "train_accuracy": final.get("accuracy"),
                      "seconds": round(time.perf_counter() - began, 3),
                      "epoch_seconds": [round(h["seconds"], 4) for h in history],
                      "saved": args.save}))


def _plot(history, path, title):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    epochs = [h["epoch"] for h in history]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    a.plot(epochs, [h["loss"] for h in history], "o-", label="train")
    a.plot(epochs, [h["test_loss"] for h in history], "o-", label="test")
    a.set_xlabel("epoch")
    a.set_ylabel("cross-entropy")
    a.legend()
    b.plot(epochs, [h["accuracy"] for h in history], "o-", label="train")
    b.plot(epochs, [h["test_accuracy"] for h in history], "o-", label="test")
    b.set_xlabel("epoch")
    b.set_ylabel("accuracy")
    b.legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _load_model(path, say, args):
    from tritonad import models, serialization

    _, device = _setup(args, say)
    state = serialization.load(path, map_location=device)
    if not isinstance(state, dict) or state.get("format") != "tritonad-checkpoint":
        raise SystemExit(f"{path}: not a tritonad training checkpoint (written by `train --save`)")
    model = models.build(state["model_name"]).to(device)
    model.load_state_dict(state["model"])
    model.eval()
    return model, state, device


def cmd_eval(args):
    import tritonad as td
    from tritonad import train

    say = lambda *a: print(*a, file=sys.stderr)  # noqa: E731
    model, state, device = _load_model(args.checkpoint, say, args)
    _, test_set = train.datasets(state.get("dataset", "mnist"), args.data_dir)
    loss, acc = train.evaluate(model, td.data.DataLoader(test_set, 1000, device=device))
    print(json.dumps({"checkpoint": args.checkpoint, "model": state["model_name"],
                      "dataset": state.get("dataset"), "test_loss": loss, "test_accuracy": acc,
                      "epoch": state.get("epoch")}))


def cmd_predict(args):
    import numpy as np

    import tritonad as td
    from tritonad import data
    from tritonad.predict import load_digit

    say = lambda *a: print(*a, file=sys.stderr)  # noqa: E731
    model, state, device = _load_model(args.checkpoint, say, args)
    kind = data.FashionMNIST if state.get("dataset") == "fashion-mnist" else data.MNIST
    pictures = []
    for path in args.images:
        try:
            pictures.append(load_digit(path))
        except (ValueError, FileNotFoundError) as err:
            raise SystemExit(str(err)) from None
    x = td.tensor((np.stack(pictures) - kind.MEAN) / kind.STD, dtype=td.float32, device=device)
    with td.no_grad():
        probs = model(x.reshape(len(pictures), 1, 28, 28)).softmax(1).numpy()
    for path, p in zip(args.images, probs):
        top = np.argsort(-p)[:3]
        ranked = ", ".join(f"{kind.classes[k].split(' - ')[-1] if kind is data.FashionMNIST else k}"
                           f" ({p[k]:.1%})" for k in top)
        print(f"{path}: {ranked}")


def cmd_bench(args):
    import importlib
    import pathlib

    root = pathlib.Path(__file__).resolve().parents[1] / "benchmarks"
    if not root.is_dir():
        raise SystemExit(f"bench: the benchmarks folder is not next to the package ({root}); run "
                         "from a checkout of the repository")
    sys.path.insert(0, str(root))
    names = BENCHMARKS if args.which == "all" else (args.which,)
    argv = ["--out", args.out] + (["--quick"] if args.quick else [])
    for name in names:
        module = importlib.import_module("bench_" + name.replace("-", "_"))
        module.main(argv)


def main(argv=None):
    args = _parser().parse_args(argv)
    os.environ.setdefault("TQDM_DISABLE", "0")
    {"train": cmd_train, "eval": cmd_eval, "predict": cmd_predict, "bench": cmd_bench}[
        args.command](args)


if __name__ == "__main__":
    main()
