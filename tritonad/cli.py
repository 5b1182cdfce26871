"""The command line: `python -m tritonad {train,eval,predict,bench} ...` (also `tritonad ...`).

A user's mistake (a bad option, a missing or corrupt file, no network) ends in one line on
stderr, `error: <message>`, and exit status 2, as argparse does for its own errors; `--debug`
or TRITONAD_DEBUG=1 shows the traceback too. A bug in tritonad still shows its traceback.
"""
from __future__ import annotations

import argparse
import json
import linecache
import math
import os
import sys
import time
from pathlib import Path

BENCHMARKS = ("elementwise", "reduce", "matmul", "softmax", "cross-entropy", "conv", "pool",
              "optim", "mnist", "augment", "host", "ddp",
              "norms", "attention", "embedding", "scan", "rnn", "losses")
BENCHMARKS += ("gpt", "resnet")  # the recipes end to end against PyTorch (bench_gpt, bench_resnet)
BENCHMARKS += ("torch-backend",)  # tritonad.torch_backend: unmodified PyTorch on our kernels
EXIT_USAGE = 2  # argparse's status for a bad command line; ours for any user mistake


class CommandError(Exception):
    """A mistake in the command line or in the files it names: printed as `error: ...`."""


class _Parser(argparse.ArgumentParser):
    """argparse with its errors in our one-line format (usage is one `--help` away)."""

    def error(self, message):
        self.exit(EXIT_USAGE, f"error: {message} (see `{self.prog} --help`)\n")


def _parser():
    p = _Parser(prog="tritonad", description="Train, evaluate and run MNIST models and kernel "
                "benchmarks on tritonad's Triton kernels.")
    p.add_argument("--debug", action="store_true", help="show the traceback of an error "
                   "(also TRITONAD_DEBUG=1)")
    sub = p.add_subparsers(dest="command", required=True)
    # every subcommand takes --debug too, after its name (SUPPRESS keeps the top-level value)
    debug = _Parser(add_help=False)
    debug.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                       help=argparse.SUPPRESS)

    t = sub.add_parser("train", parents=[debug],
                       help="train a model (logreg, mlp, cnn, resnet, gpt)")
    t.add_argument("--model", choices=["logreg", "mlp", "cnn", "resnet", "gpt"],
                   help="default: mlp (with --resume: the checkpoint's); resnet: an "
                        "airbench-style ResNet on Fashion-MNIST; gpt: a character-level GPT on "
                        "the Shakespeare corpus")
    t.add_argument("--steps", type=int, help="gpt: optimizer steps (default: 2000)")
    t.add_argument("--precision", choices=["fp32", "bf16", "fp16"],
                   help="bf16: autocast (matmuls and convolutions in bfloat16, weights "
                        "float32); fp16: autocast to float16 with dynamic loss scaling "
                        "(GradScaler); default: bf16 for gpt and resnet, fp32 for logreg, mlp "
                        "and cnn")
    t.add_argument("--epochs", type=int, help="the run's total number of epochs (default: the "
                   "recipe's, 10; with --resume: the checkpoint's run's, or more to extend it)")
    t.add_argument("--batch-size", type=int, help="default: the recipe's (under torchrun: "
                   "the global batch, split evenly over the processes)")
    t.add_argument("--lr", type=float, help="default: the recipe's")
    t.add_argument("--optimizer", choices=["sgd", "adam", "adamw", "adadelta", "rmsprop",
                                           "adagrad"], help="default: sgd")
    t.add_argument("--schedule", choices=["cosine", "constant"], help="default: cosine")
    t.add_argument("--device", help="cuda or cpu (default: cuda if there is a GPU)")
    t.add_argument("--backend", choices=["triton", "numpy"],
                   help="default: triton on a GPU, numpy otherwise")
    t.add_argument("--seed", type=int, help="default: 0")
    t.add_argument("--save", metavar="PATH", help="write a checkpoint here after each epoch")
    t.add_argument("--resume", metavar="PATH", help="continue the run of a checkpoint (its "
                   "settings; --epochs may extend it)")
    t.add_argument("--data-dir", help="folder holding the dataset files (or TRITONAD_DATA)")
    t.add_argument("--dataset", choices=["mnist", "fashion-mnist"], help="default: mnist")
    t.add_argument("--plot", metavar="PATH", help="write a PNG of the loss/accuracy curves")
    t.add_argument("--no-graph", action="store_true", help="run every step eagerly on the GPU "
                   "instead of replaying a captured CUDA graph (every recipe captures its "
                   "whole step by default on a GPU)")
    t.add_argument("--no-fuse", action="store_true", help="train a plain ReLU MLP with per-op "
                   "kernels and autodiff instead of the fused MLP step")
    t.add_argument("--limit", type=int, help="train on the first N training images only")
    t.add_argument("--quiet", action="store_true", help="no progress bars")
    t.add_argument("--tune", action="store_true", help="time the candidate plans of every new "
                   "matmul and convolution shape and keep the fastest (cached for later runs); "
                   "by default plans come from the table shipped for this GPU or a heuristic")

    e = sub.add_parser("eval", parents=[debug], help="test accuracy of a checkpoint")
    e.add_argument("--checkpoint", required=True)
    e.add_argument("--data-dir")
    e.add_argument("--device")
    e.add_argument("--backend", choices=["triton", "numpy"])

    r = sub.add_parser("predict", parents=[debug], help="classify images of handwritten digits")
    r.add_argument("--checkpoint", required=True)
    r.add_argument("images", nargs="+", metavar="IMAGE")
    r.add_argument("--device")
    r.add_argument("--backend", choices=["triton", "numpy"])

    g = sub.add_parser("generate", parents=[debug], help="sample text from a gpt checkpoint")
    g.add_argument("--checkpoint", required=True)
    g.add_argument("--prompt", default="\n", help="text to continue (default: a new line)")
    g.add_argument("--tokens", type=int, default=500, help="characters to sample (default 500)")
    g.add_argument("--temperature", type=float, default=0.8, help="default: 0.8")
    g.add_argument("--top-k", type=int, default=50, help="sample among the k likeliest "
                   "(default 50; 0: all)")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--device")
    g.add_argument("--backend", choices=["triton", "numpy"])

    b = sub.add_parser("bench", parents=[debug],
                       help="benchmarks against PyTorch (needs a GPU, except mnist --cpu)",
                       epilog="Other options go to the benchmark itself (bench conv --layers "
                              "28x28-k3 --precisions tf32); `python benchmarks/bench_NAME.py "
                              "--help` lists them.")
    b.add_argument("which", choices=BENCHMARKS + ("all",))
    b.add_argument("--out", default="bench-results", help="folder for tables, JSON and PNGs")
    b.add_argument("--quick", action="store_true", help="fewer sizes")
    b.add_argument("--gpus", default="1,2,4", help="ddp: the GPU counts to compare (default "
                   "1,2,4; counts above this machine's are skipped)")
    b.add_argument("--cpu", action="store_true",
                   help="mnist only: the numpy backend against PyTorch CPU (step and evaluation "
                        "times), on this machine's CPU")
    return p


# ---------------------------------------------------------------------- checking options
# (option, what it must be, test): numbers are checked by what they mean, so that 0 or nan is
# an error that names the option, never a silent default
_NUMBERS = (("epochs", "a positive integer", lambda v: v >= 1),
            ("batch_size", "a positive integer", lambda v: v >= 1),
            ("limit", "a positive integer", lambda v: v >= 1),
            ("seed", "a non-negative integer", lambda v: v >= 0),
            ("lr", "a positive finite number", lambda v: math.isfinite(v) and v > 0))


def _option(dest) -> str:
    return "--" + dest.replace("_", "-")


def _check_numbers(args):
    for dest, what, ok in _NUMBERS:
        value = getattr(args, dest, None)
        if value is not None and not ok(value):
            raise CommandError(f"{_option(dest)} must be {what}, got {value}")


def _check_input_file(path, option):
    if not os.path.exists(path):
        raise CommandError(f"{option} {path}: no such file")
    if os.path.isdir(path):
        raise CommandError(f"{option} {path} is a folder, not a file")


def _check_output_file(path, option):
    """The file can be created: its folder exists and it is not a folder itself."""
    if os.path.isdir(path):
        raise CommandError(f"{option} {path} is a folder; give a file name")
    folder = os.path.dirname(path) or "."
    if not os.path.isdir(folder):
        raise CommandError(f"{option} {path}: the folder {folder} does not exist")


def _check_data_dir(path):
    if path is not None and os.path.exists(path) and not os.path.isdir(path):
        raise CommandError(f"--data-dir {path} is a file, not a folder")


def _check_plot(path):
    """--plot at the start, not after the training: a writable path, matplotlib, a format."""
    _check_output_file(path, "--plot")
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
    except ImportError:
        raise CommandError("--plot needs matplotlib (pip install matplotlib)") from None
    formats = FigureCanvasAgg.get_supported_filetypes()
    suffix = os.path.splitext(path)[1].lstrip(".").lower()
    if suffix and suffix not in formats:
        raise CommandError(f"--plot {path}: matplotlib cannot write .{suffix} pictures; use one "
                           f"of {', '.join('.' + f for f in sorted(formats))}")


def _device_option(value, backend, gpu):
    """The device a command runs on: --device checked against the backend and this machine."""
    import torch

    if value is None:
        return "cuda" if backend == "triton" and gpu else "cpu"
    try:
        device = torch.device(value)
    except (RuntimeError, ValueError, TypeError):
        device = None
    if device is None or device.type not in ("cpu", "cuda"):
        raise CommandError(f"--device {value!r} is not a device tritonad runs on; use cpu or "
                           f"cuda (cuda:N for the N-th GPU)")
    if device.type == "cuda":
        if not gpu:
            raise CommandError(f"--device {value}: this machine has no CUDA GPU; use --device "
                               f"cpu")
        count = torch.cuda.device_count()
        if device.index is not None and device.index >= count:
            raise CommandError(f"--device {value}: this machine has {count} GPU(s), cuda:0 to "
                               f"cuda:{count - 1}")
        if backend == "numpy":
            raise CommandError(f"--device {value}: the numpy backend runs on the CPU only; use "
                               f"--backend triton on the GPU")
    elif backend == "triton" and gpu:
        raise CommandError(f"--device {value}: on a machine with a GPU the triton backend runs "
                           f"on the GPU; use --backend numpy on the CPU")
    return str(device)


def _setup(args):
    """Pick backend and device: (backend, device, notes), the notes saying what was picked and
    why (commands print them once their files have loaded, so a bad file is the only line)."""
    import torch

    import tritonad as td

    gpu = torch.cuda.is_available()
    backend = args.backend or ("triton" if gpu else "numpy")
    device = _device_option(args.device, backend, gpu)
    td.set_backend(backend)
    notes = []
    if backend == "triton" and not gpu:
        notes.append("note: no GPU found: the triton backend runs under Triton's interpreter "
                     "(very slow)")
    elif backend == "numpy" and not args.backend and not gpu:
        notes.append("note: no GPU found, so this runs on the numpy backend on the CPU")
    where = torch.cuda.get_device_name(device) if device.startswith("cuda") else "CPU"
    notes.append(f"backend: {backend} | device: {device} ({where})")
    return backend, device, notes


# ---------------------------------------------------------------------- checkpoints
def _load_checkpoint(path, device, option, resume=False):
    """A training checkpoint (written by `train --save`), checked for what the commands read."""
    from tritonad import models, serialization

    _check_input_file(path, option)
    state = serialization.load(path, map_location=device)
    needed = ("model_name", "model") + (("optimizer", "epoch", "rng") if resume else ())
    if not isinstance(state, dict) or state.get("format") != "tritonad-checkpoint" or \
            any(key not in state for key in needed):
        raise CommandError(f"{option} {path}: not a tritonad training checkpoint (written by "
                           f"`train --save`)")
    if state["model_name"] not in models.RECIPES:
        raise CommandError(f"{option} {path} holds an unknown model {state['model_name']!r}; "
                           f"this tritonad knows {', '.join(models.RECIPES)}")
    if resume and (not isinstance(state["epoch"], int) or state["epoch"] < 1):
        raise CommandError(f"{option} {path}: its epoch count {state['epoch']!r} is not a "
                           f"positive integer")
    return state


def _restore(what, path, load, value):
    """load(value) with the path named if the checkpoint's `what` does not fit."""
    try:
        load(value)
    except (KeyError, TypeError, ValueError, RuntimeError) as err:
        raise CommandError(f"{path}: its {what} does not fit ({type(err).__name__}: "
                           f"{err})") from None


def _build_model(state, path, device):
    from tritonad import models

    model = models.build(state["model_name"]).to(device)
    _restore("model", path, model.load_state_dict, state["model"])
    return model


# ---------------------------------------------------------------------- train
# the settings that make a run: a resumed run keeps its checkpoint's (only --epochs may change)
_RUN_SETTINGS = ("model", "dataset", "batch_size", "lr", "optimizer", "schedule", "limit",
                 "precision")


def _train_settings(args, state):
    """{setting: value} for this run: the options given, else the resumed checkpoint's, else the
    recipe's. Refuses options that contradict the run being resumed."""
    from tritonad import train

    saved = {}
    if state is not None:
        saved = dict(state.get("run") or {})
        saved.update(model=state["model_name"], dataset=state.get("dataset", "mnist"),
                     schedule="cosine" if state.get("scheduler") else "constant")
        for name in _RUN_SETTINGS:
            given = getattr(args, name)
            if given is not None and name in saved and given != saved[name]:
                was = f"{_option(name)} {saved[name]}" if saved[name] is not None else \
                    f"no {_option(name)}"
                raise CommandError(f"--resume {args.resume} continues a run with {was}, but "
                                   f"{_option(name)} {given} was given; a resumed run keeps "
                                   f"its settings (only --epochs may change)")
    model = args.model or saved.get("model") or "mlp"
    rec = train.recipe(model)
    defaults = dict(model=model, dataset="mnist", batch_size=rec.batch_size, lr=rec.lr,
                    optimizer=rec.optimizer, schedule=rec.schedule, limit=None,
                    precision="fp32",
                    epochs=saved.get("epochs", rec.epochs), seed=0)
    run = {}
    for name, default in defaults.items():
        given = getattr(args, name)
        run[name] = given if given is not None else saved.get(name, default)
    if state is not None and run["epochs"] <= state["epoch"]:
        raise CommandError(f"--resume {args.resume} has already trained {state['epoch']} "
                           f"epoch(s) of a {run['epochs']}-epoch run; pass --epochs "
                           f"{state['epoch'] + 1} or more to train further")
    return run


def _respan_cosine(scheduler, optimizer, total_steps):
    """Make a loaded cosine schedule span total_steps from the step it reached, t: the learning
    rate becomes the closed form eta_min + (base - eta_min) (1 + cos(pi t / total_steps)) / 2,
    which the scheduler's recurrence continues from. Returns the span it had."""
    state = scheduler.state_dict()
    old, t, low = state["T_max"], state["last_epoch"], state["eta_min"]
    lrs = [low + (base - low) * (1 + math.cos(math.pi * t / total_steps)) / 2
           for base in state["base_lrs"]]
    scheduler.load_state_dict({**state, "T_max": total_steps, "_last_lr": lrs})
    for group, lr in zip(optimizer.param_groups, lrs):
        group["lr"] = lr
    optimizer.sync()
    return old


def _join_group(device, notes):
    """Under torchrun: join the process group (NCCL between GPUs, gloo on the CPU); returns
    (this process's device, its rank, the number of processes)."""
    from tritonad import distributed

    if device.startswith("cuda:"):
        raise CommandError(f"--device {device}: under torchrun each process takes the GPU of "
                           "its local rank (cuda:LOCAL_RANK); pass --device cuda")
    try:
        local = str(distributed.init_process_group(device))
    except (RuntimeError, ValueError) as err:
        raise CommandError(str(err)) from None
    rank, world = distributed.shard()
    notes.append(f"data-parallel: {world} processes ({distributed.dist.get_backend()}), "
                 f"one {'GPU' if local.startswith('cuda') else 'CPU process'} each")
    return local, rank, world


def cmd_train(args):
    if args.model == "gpt":
        return _train_gpt(args)
    if args.model == "resnet":
        return _train_resnet(args)
    if args.steps is not None:
        raise CommandError("--steps is an option of --model gpt; the MNIST recipes train for "
                           "--epochs")
    import tritonad as td
    from tritonad import distributed, models, optim, serialization, train
    from tritonad import startup as startup_times

    startup = {"import": startup_times.process_seconds()}  # python, torch, triton, tritonad
    say = (lambda *a: None) if args.quiet else (lambda *a: print(*a, file=sys.stderr))
    if args.tune:
        td.autotune(True)
    _check_numbers(args)
    _check_data_dir(args.data_dir)
    if args.save:
        _check_output_file(args.save, "--save")
    if args.plot:
        _check_plot(args.plot)
    backend, device, notes = _setup(args)
    rank, world = 0, 1
    if distributed.launched():  # one of the processes torchrun started: data-parallel
        device, rank, world = _join_group(device, notes)
        if rank != 0:  # process 0 prints, saves and plots
            say = lambda *a: None  # noqa: E731
    state = _load_checkpoint(args.resume, device, "--resume", resume=True) if args.resume \
        else None
    run = _train_settings(args, state)
    epochs, batch, lr = run["epochs"], run["batch_size"], run["lr"]
    if batch % world:
        raise CommandError(f"--batch-size {batch} does not split evenly over {world} "
                           f"processes; give a multiple of {world}")
    td.manual_seed(run["seed"])
    clock = time.perf_counter()
    train_set, test_set = train.datasets(run["dataset"], args.data_dir)
    for note in notes:
        say(note)
    loader = td.data.DataLoader(train_set, batch // world, shuffle=True, device=device,
                                limit=run["limit"], shard=(rank, world) if world > 1 else None)
    test_loader = td.data.DataLoader(test_set, 1000, device=device)
    startup["data"] = time.perf_counter() - clock
    model = models.build(run["model"]).to(device)
    optimizer = train.make_optimizer(run["optimizer"], model.parameters(), lr,
                                     train.recipe(run["model"]).momentum)
    scheduler = optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=epochs * len(loader)) \
        if run["schedule"] == "cosine" else None
    start_epoch, history, extended = 1, [], None
    if state is not None:
        path = args.resume
        _restore("model", path, model.load_state_dict, state["model"])
        _restore("optimizer state", path, optimizer.load_state_dict, state["optimizer"])
        if scheduler is not None:
            _restore("schedule", path, scheduler.load_state_dict, state["scheduler"])
        _restore("random number state", path, td.set_rng_state, state["rng"])
        done = state["epoch"]
        start_epoch, history = done + 1, list(state.get("history", []))
        say(f"resumed from {path} after epoch {done}")
        if scheduler is not None:
            # the cosine spans this run's total: the steps taken plus the epochs still to go
            total = scheduler.last_epoch + (epochs - done) * len(loader)
            if total != scheduler.T_max:
                extended = _respan_cosine(scheduler, optimizer, total)
                say(f"the cosine schedule now spans {total} steps ({epochs} epochs) instead of "
                    f"{extended}: it continues from step {scheduler.last_epoch} at lr "
                    f"{optimizer.param_groups[0]['lr']:.6g}")
    graph = device.startswith("cuda") and backend == "triton" and not args.no_graph
    try:
        trainer = train.Trainer(model, optimizer, loader, scheduler, graph=graph,
                                fuse=not args.no_fuse, precision=run["precision"])
    except ValueError as err:
        raise CommandError(f"--precision {run['precision']}: {err}") from None
    if state is not None and state.get("scaler"):
        _restore("loss scaler state", args.resume, trainer.scaler.load_state_dict,
                 state["scaler"])
    steps = ("captured CUDA graph" if graph else "eager") + (" fused MLP" if trainer.fused else "")
    if trainer.precision_note:
        say(f"precision: {run['precision']} ({trainer.precision_note})")
    images = f"{loader.num_samples} training images" if world == 1 else \
        f"{loader.num_samples * world} training images, {loader.num_samples} per process"
    say(f"model: {run['model']} ({sum(p.numel() for p in model.parameters()):,} parameters) | "
        f"data: {run['dataset']}, {images} | batch {batch}"
        f"{f' ({batch // world} per process)' if world > 1 else ''}, "
        f"{run['optimizer']} lr {lr} ({run['schedule']}) | {steps} steps")
    clock, spent = time.perf_counter(), startup_times.counters()  # (tune, capture: from here)
    startup["kernels_compiled_ahead"] = trainer.precompile(test_loader)
    startup["compile"] = time.perf_counter() - clock
    began = time.perf_counter()
    for epoch in range(start_epoch, epochs + 1):
        stats = trainer.train_epoch(epoch, epochs, progress=not args.quiet and rank == 0)
        if epoch == start_epoch:
            startup.update(startup_times.after_first_epoch(stats["seconds"], spent))
        test_loss, test_acc = train.evaluate(model, test_loader, precision=run["precision"])
        stats.update(epoch=epoch, test_loss=test_loss, test_accuracy=test_acc,
                     lr=optimizer.param_groups[0]["lr"])
        history.append(stats)
        say(f"epoch {epoch}: train loss {stats['loss']:.4f} acc {stats['accuracy']:.4f} | test "
            f"loss {test_loss:.4f} acc {test_acc:.4f} | {stats['seconds']:.2f} s, "
            f"{stats['images_per_s']:,.0f} img/s")
        if epoch == start_epoch:
            say(startup_times.line(startup))
        if args.save and rank == 0:
            serialization.save({"format": "tritonad-checkpoint", "model_name": run["model"],
                                "dataset": run["dataset"], "model": model.state_dict(),
                                "optimizer": optimizer.state_dict(),
                                "scheduler": scheduler.state_dict() if scheduler else None,
                                "epoch": epoch, "rng": td.get_rng_state(), "history": history,
                                "precision": run["precision"],
                                "scaler": trainer.scaler.state_dict(),
                                "run": {name: run[name] for name in _RUN_SETTINGS + ("epochs",)}},
                               args.save)
    if args.plot and rank == 0:
        _plot(history, args.plot, f"{run['model']} on {run['dataset']}")
        say(f"wrote {args.plot}")
    if distributed.is_initialized():
        distributed.destroy_process_group()
    if rank != 0:
        return
    final = history[-1] if history else {}
    schedule = {"name": run["schedule"]}
    if scheduler is not None:
        schedule.update(steps=scheduler.T_max, extended_from_steps=extended)
    print(json.dumps({"model": run["model"], "dataset": run["dataset"], "backend": backend,
                      "device": device, "processes": world, "epochs": epochs,
                      "batch_size": batch, "train_images": loader.num_samples * world, "lr": lr,
                      "optimizer": run["optimizer"], "schedule": schedule, "graph": graph,
                      "precision": run["precision"],
                      "resumed_from_epoch": state["epoch"] if state is not None else None,
                      "test_accuracy": final.get("test_accuracy"),
                      "test_loss": final.get("test_loss"),
                      "train_loss": final.get("loss"), "train_accuracy": final.get("accuracy"),
                      "seconds": round(time.perf_counter() - began, 3),
                      "epoch_seconds": [round(h["seconds"], 4) for h in history],
                      "startup": {k: round(v, 3) if isinstance(v, float) else v
                                  for k, v in startup.items()},
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


def _evaluation_model(args):
    """(model in eval mode, checkpoint, device, notes) for eval and predict."""
    _, device, notes = _setup(args)
    state = _load_checkpoint(args.checkpoint, device, "--checkpoint")
    model = _build_model(state, args.checkpoint, device)
    model.eval()
    return model, state, device, notes


def _dataset_kind(state):
    """The dataset class a checkpoint's model was trained on."""
    from tritonad import data

    return data.FashionMNIST if state.get("dataset") == "fashion-mnist" else data.MNIST


def _train_gpt(args):
    """train --model gpt: the recipe of tritonad/gpt.py on the Shakespeare corpus."""
    import tritonad as td
    from tritonad import corpus, gpt
    from tritonad import startup as startup_times

    startup = {"import": startup_times.process_seconds()}
    say = (lambda *a: None) if args.quiet else (lambda *a: print(*a, file=sys.stderr))
    for option in ("epochs", "lr", "optimizer", "schedule", "resume", "plot", "limit"):
        if getattr(args, option, None) not in (None, False):
            raise CommandError(f"{_option(option)} is not an option of --model gpt (its recipe "
                               "is fixed: see `python -m tritonad train --help`)")
    if args.steps is not None and args.steps < 1:
        raise CommandError(f"--steps must be a positive integer, got {args.steps}")
    _check_numbers(args)
    if args.save:
        _check_output_file(args.save, "--save")
    _, device, notes = _setup(args)
    clock = time.perf_counter()
    history_seen = []
    text = corpus.Shakespeare(args.data_dir)
    startup["data"] = time.perf_counter() - clock
    for note in notes:
        say(note)
    say(f"corpus: {text.path} ({len(text)} characters, {text.vocab_size} distinct)")
    precision = args.precision or "bf16"
    say(f"model: gpt | precision {precision} | "
        f"{'captured CUDA graph' if _recipe_graph(args, device) else 'eager'} steps")
    model, history = gpt.train(
        text, device, steps=args.steps, batch=args.batch_size, precision=precision,
        seed=args.seed or 0, graph=_recipe_graph(args, device), startup=startup,
        log=lambda e: (say(f"step {e['step']:5d} | train loss {e['train_loss']:.4f} | val loss "
                           f"{e['val_loss']:.4f} | {e['tokens_per_s']:,.0f} tokens/s | "
                           f"lr {e['lr']:.2e}"),
                       len(history_seen) or say(startup_times.recipe_line(startup)),
                       history_seen.append(e)))
    if args.save:
        td.save({"format": "tritonad-gpt", "model": model.state_dict(), "config": model.config,
                 "vocab": "".join(text.vocab), "history": history, "precision": precision},
                args.save)
        say(f"saved {args.save}")
    print(json.dumps({"model": "gpt", "device": device, "precision": precision,
                      "graph": startup.pop("graph", False),
                      "startup": startup_times.rounded(startup),
                      "history": history}))


def _train_resnet(args):
    """train --model resnet: the recipe of tritonad/resnet.py on Fashion-MNIST."""
    import tritonad as td
    from tritonad import resnet
    from tritonad import startup as startup_times

    startup = {"import": startup_times.process_seconds()}
    say = (lambda *a: None) if args.quiet else (lambda *a: print(*a, file=sys.stderr))
    for option in ("lr", "optimizer", "schedule", "resume", "plot", "steps"):
        if getattr(args, option, None) not in (None, False):
            raise CommandError(f"{_option(option)} is not an option of --model resnet (its "
                               "recipe is fixed: see `python -m tritonad train --help`)")
    if args.dataset not in (None, "fashion-mnist"):
        raise CommandError("--model resnet trains on --dataset fashion-mnist")
    _check_numbers(args)
    if args.save:
        _check_output_file(args.save, "--save")
    _, device, notes = _setup(args)
    for note in notes:
        say(note)
    precision = args.precision or "bf16"
    say(f"model: resnet | precision {precision} | "
        f"{'captured CUDA graph' if _recipe_graph(args, device) else 'eager'} steps")
    seen = []
    model, history = resnet.train(
        device, epochs=args.epochs, batch=args.batch_size, precision=precision,
        seed=args.seed or 0, data_dir=args.data_dir, limit=args.limit,
        graph=_recipe_graph(args, device), startup=startup,
        log=lambda e: (say(f"epoch {e['epoch']}: train loss {e['train_loss']:.4f} | test acc "
                           f"{e['test_accuracy']:.4f} | {e['seconds']:.2f} s, "
                           f"{e['images_per_s']:,.0f} img/s"),
                       len(seen) or say(startup_times.recipe_line(startup)), seen.append(e)))
    if args.save:
        td.save({"format": "tritonad-resnet", "model": model.state_dict(),
                 "history": history, "precision": precision}, args.save)
        say(f"saved {args.save}")
    print(json.dumps({"model": "resnet", "dataset": "fashion-mnist", "device": device,
                      "precision": precision, "graph": startup.pop("graph", False),
                      "startup": startup_times.rounded(startup), "history": history}))


def _recipe_graph(args, device):
    """gpt and resnet: whether the step runs as a captured graph (the default on a GPU with
    the triton backend; --no-graph: eager)."""
    from tritonad.capture import capture_default

    return not args.no_graph and capture_default(device)


def cmd_generate(args):
    """generate: stream characters sampled from a gpt checkpoint (key/value cache)."""
    import tritonad as td
    from tritonad import corpus, gpt, serialization

    if args.tokens < 0 or not math.isfinite(args.temperature) or args.temperature <= 0:
        raise CommandError("--tokens must be >= 0 and --temperature a positive number")
    _, device, _ = _setup(args)
    _check_input_file(args.checkpoint, "--checkpoint")
    state = serialization.load(args.checkpoint, map_location=device)
    if not isinstance(state, dict) or state.get("format") != "tritonad-gpt":
        raise CommandError(f"--checkpoint {args.checkpoint} is not a gpt checkpoint (written by "
                           "`train --model gpt --save`)")
    vocab = corpus.CharCorpus(state["vocab"], "the checkpoint's vocabulary")
    model = gpt.GPT(**state["config"]).to(device)
    model.load_state_dict(state["model"])
    try:
        prompt = vocab.encode(args.prompt)
    except ValueError as err:
        raise CommandError(f"--prompt: {err}") from None
    td.manual_seed(args.seed)
    sys.stdout.write(args.prompt)
    model.generate(td.tensor([prompt], device=device), args.tokens, args.temperature,
                   args.top_k or None,
                   emit=lambda i: (sys.stdout.write(vocab.vocab[i]), sys.stdout.flush()))
    sys.stdout.write("\n")


def cmd_eval(args):
    import tritonad as td
    from tritonad import train

    _check_data_dir(args.data_dir)
    model, state, device, notes = _evaluation_model(args)
    test_set = _dataset_kind(state)(args.data_dir, train=False)  # the test split only
    for note in notes:
        print(note, file=sys.stderr)
    loss, acc = train.evaluate(model, td.data.DataLoader(test_set, 1000, device=device))
    print(json.dumps({"checkpoint": args.checkpoint, "model": state["model_name"],
                      "dataset": state.get("dataset"), "test_loss": loss, "test_accuracy": acc,
                      "epoch": state.get("epoch")}))


def cmd_predict(args):
    import numpy as np

    import tritonad as td
    from tritonad import data
    from tritonad.predict import load_digit

    model, state, device, notes = _evaluation_model(args)
    kind = _dataset_kind(state)
    pictures = [load_digit(path) for path in args.images]
    for note in notes:
        print(note, file=sys.stderr)
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

    root = Path(__file__).resolve().parents[1] / "benchmarks"
    if not root.is_dir():
        raise CommandError(f"bench: the benchmarks folder is not next to the package ({root}); "
                           f"run from a checkout of the repository")
    if os.path.exists(args.out) and not os.path.isdir(args.out):
        raise CommandError(f"--out {args.out} is a file, not a folder")
    sys.path.insert(0, str(root))
    names = BENCHMARKS if args.which == "all" else (args.which,)
    if args.cpu and args.which != "mnist":
        raise CommandError("bench --cpu: only `bench mnist --cpu` runs on the CPU (the numpy "
                           "backend against PyTorch CPU); the kernel benchmarks need a GPU")
    extra = list(getattr(args, "extra", []))
    if extra and args.which == "all":
        raise CommandError(f"bench all: {' '.join(extra)} are options of one benchmark; name "
                           f"it (bench conv {' '.join(extra)})")
    argv = ["--out", args.out] + (["--quick"] if args.quick else []) + \
        (["--cpu"] if args.cpu else []) + extra
    for name in names:
        module = importlib.import_module("bench_" + name.replace("-", "_"))
        try:
            module.main(argv + (["--gpus", args.gpus] if name == "ddp" else []))
        except SystemExit as stop:  # a benchmark's own refusal ("needs a CUDA GPU")
            if isinstance(stop.code, str):
                raise CommandError(stop.code) from None
            raise
    line = _plan_sources()
    if line:
        print(line)


def _plan_sources() -> str:
    """Where the tiled kernels' plans of this process came from, a line: "plans: matmul 12
    from the table, 3 by heuristic; conv ..." (empty if no tiled kernel ran)."""
    from tritonad.kernels.tuning import Tuner

    words = {"table": "from the shipped table", "cache": "from this machine's tuning cache",
             "tuned": "tuned now", "heuristic": "by the shape heuristic"}
    parts = []
    for t in Tuner.ALL:
        counts = t.counts()
        if counts:
            parts.append(f"{t.name} " + ", ".join(f"{n} {words.get(k, k)}"
                                                  for k, n in sorted(counts.items())))
    return "plans: " + "; ".join(parts) if parts else ""


# ---------------------------------------------------------------------- errors
def _raised_by_tritonad(err) -> bool:
    """Whether err was raised on purpose by a `raise` statement in tritonad's source (a check
    of a user's input), rather than by Python, numpy or torch inside it (a bug)."""
    tb = err.__traceback__
    if tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    filename = tb.tb_frame.f_code.co_filename
    package = os.path.dirname(os.path.abspath(__file__))
    if os.path.commonpath([package, os.path.abspath(filename)]) != package:
        return False
    return linecache.getline(filename, tb.tb_lineno).lstrip().startswith("raise ")


def _user_error(err):
    """The one-line message of an exception that is a user's mistake; None for a bug."""
    ours = [CommandError]
    for module, name in (("tritonad.serialization", "CheckpointError"),
                         ("tritonad.data", "DataFileError"), ("tritonad.data", "DownloadError")):
        if module in sys.modules:  # not imported: that error cannot have been raised
            ours.append(getattr(sys.modules[module], name))
    if isinstance(err, tuple(ours)):
        message = str(err)
    elif isinstance(err, OSError):  # missing, unreadable, full: the user's files and disks
        message = f"{err.filename}: {err.strerror}" if err.filename and err.strerror \
            else str(err)
    elif isinstance(err, MemoryError) or type(err).__name__ == "OutOfMemoryError":
        message = f"out of memory ({err}); try a smaller --batch-size"
    elif isinstance(err, (ValueError, TypeError)) and _raised_by_tritonad(err):
        message = str(err)
    else:
        return None
    return " ".join(line.strip() for line in message.splitlines() if line.strip()) or \
        type(err).__name__


def main(argv=None):
    parser = _parser()
    args, args.extra = parser.parse_known_args(argv)
    if args.extra and args.command != "bench":  # (bench passes them to the benchmark)
        parser.error(f"unrecognized arguments: {' '.join(args.extra)}")
    debug = args.debug or os.environ.get("TRITONAD_DEBUG", "") not in ("", "0")
    os.environ.setdefault("TQDM_DISABLE", "0")
    command = {"train": cmd_train, "eval": cmd_eval, "predict": cmd_predict,
               "generate": cmd_generate, "bench": cmd_bench}[args.command]
    try:
        command(args)
    except KeyboardInterrupt:
        if debug:
            raise
        print("error: interrupted", file=sys.stderr)
        raise SystemExit(130) from None  # the shell's status for Ctrl-C
    except Exception as err:  # noqa: BLE001: sorted into user mistakes and bugs just below
        message = _user_error(err)
        if message is None or debug:
            raise
        print(f"error: {message}", file=sys.stderr)
        raise SystemExit(EXIT_USAGE) from None


if __name__ == "__main__":
    main()
