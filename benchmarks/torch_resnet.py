"""The resnet recipe (tritonad/resnet.py, `train --model resnet`) as a plain PyTorch script: the
comparison for `bench resnet` and for the whole `train` command's wall time.

    python benchmarks/torch_resnet.py --mode eager-bf16            # 12 epochs, as the recipe
    python benchmarks/torch_resnet.py --mode compile-bf16 --epochs 2

The same data (data/fashion-mnist, the IDX files read with numpy, the whole set on the device,
normalised once by the training set's mean and std, 0.2860 / 0.3530), the same model
(tritonad.models.ResNet: stem conv3x3 1->64, BatchNorm, GELU; groups of 128, 256 and 256
channels, each conv3x3 -> maxpool2 -> BatchNorm -> GELU plus a residual conv3x3 -> BatchNorm ->
GELU; global max pool; linear 256->10 without bias; logits times 1/8; PyTorch's default init,
which tritonad's layers share), batches of 512 from a fresh permutation each epoch (the last
partial batch dropped), each batch augmented on the device (a random 28x28 window of the image
padded by 2 pixels of zeros, each image its own offset, then a horizontal flip of each image
with probability 1/2), SGD Nesterov momentum 0.9 with weight decay 5e-4 on every parameter,
the learning rate rising linearly to 0.2 over the first 20% of the steps and falling linearly
to 0 at the last, cross-entropy with label smoothing 0.2, 12 epochs, channels-last, and the
test accuracy after every epoch (batches of 1000, eval mode).

Modes: eager-fp32 (float32 at PyTorch's defaults: TF32 convolutions, IEEE matmul), eager-bf16
(torch.autocast bfloat16, weights float32), compile-bf16 (the same under torch.compile).

Prints one JSON object: the seconds of each epoch (the test evaluation excluded), the steady
epoch (the median of the epochs after the first, which holds the warm-up and compilation), the
test accuracy after each epoch and the whole wall time.
"""
from __future__ import annotations

import time

_STARTED = time.perf_counter()

import argparse  # noqa: E402  (the clock above times the imports)
import gzip  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data")
MODES = ("eager-fp32", "eager-bf16", "compile-bf16")
MEAN, STD = 0.2860, 0.3530  # the training images' (tritonad.data.FashionMNIST)
RECIPE = dict(epochs=12, batch=512, lr=0.2, warmup=0.2, momentum=0.9, weight_decay=5e-4,
              label_smoothing=0.2, crop_padding=2)


# ------------------------------------------------------------------------------- data


def _folder(data_dir):
    """The first folder holding the Fashion-MNIST files, searched as tritonad's loader does:
    data_dir (or TRITONAD_DATA), else the repository's data/, then Debian's /usr/share/datasets;
    each as is or its fashion-mnist/ subfolder."""
    roots = [data_dir or os.environ.get("TRITONAD_DATA")] if (
        data_dir or os.environ.get("TRITONAD_DATA")) else [DATA, "/usr/share/datasets"]
    for root in roots:
        for folder in (os.path.join(root, "fashion-mnist"), root):
            if any(os.path.isfile(os.path.join(folder, "train-images-idx3-ubyte" + ext))
                   for ext in (".gz", "")):
                return folder
    raise SystemExit(f"torch_resnet: the Fashion-MNIST files are not in {', '.join(roots)}")


def read_idx(folder, name):
    path = os.path.join(folder, name)
    with (gzip.open(path + ".gz") if os.path.isfile(path + ".gz") else open(path, "rb")) as f:
        data = f.read()
    dims = data[3]
    shape = tuple(int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(dims))
    return np.frombuffer(data, np.uint8, offset=4 + 4 * dims).reshape(shape)


def load(folder, prefix, device, limit=None):
    """(images [N, 1, 28, 28] float32 normalised, labels [N] int64) on device."""
    x = read_idx(folder, f"{prefix}-images-idx3-ubyte")[:limit]
    y = read_idx(folder, f"{prefix}-labels-idx1-ubyte")[:limit]
    x = torch.from_numpy(x.copy()).to(device).float().div_(255).sub_(MEAN).div_(STD)
    return x.unsqueeze(1), torch.from_numpy(y.astype(np.int64)).to(device)


def augment(x, padding):
    """Each image [N, C, H, W] cropped to H x W at its own random offset of the image padded by
    `padding` zeros on every side, then flipped left-right with probability 1/2; on x's device,
    no host read."""
    n, _, h, w = x.shape
    padded = F.pad(x, (padding,) * 4)
    dy = torch.randint(0, 2 * padding + 1, (n, 1, 1, 1), device=x.device)
    dx = torch.randint(0, 2 * padding + 1, (n, 1, 1, 1), device=x.device)
    rows = dy + torch.arange(h, device=x.device).view(1, 1, h, 1)  # [N, 1, H, 1]
    cols = dx + torch.arange(w, device=x.device).view(1, 1, 1, w)  # [N, 1, 1, W]
    batch_index = torch.arange(n, device=x.device).view(n, 1, 1, 1)
    channel_index = torch.arange(x.shape[1], device=x.device).view(1, -1, 1, 1)
    crop = padded[batch_index, channel_index, rows, cols]
    flip = torch.rand(n, 1, 1, 1, device=x.device) < 0.5
    return torch.where(flip, crop.flip(3), crop)


# ------------------------------------------------------------------------------- model


class ConvGroup(nn.Module):
    def __init__(self, c_in, c_out):
        super().__init__()
        self.conv = nn.Conv2d(c_in, c_out, 3, padding=1, bias=False)
        self.pool = nn.MaxPool2d(2)
        self.norm = nn.BatchNorm2d(c_out)
        self.act = nn.GELU()
        self.conv2 = nn.Conv2d(c_out, c_out, 3, padding=1, bias=False)
        self.norm2 = nn.BatchNorm2d(c_out)

    def forward(self, x):
        x = self.act(self.norm(self.pool(self.conv(x))))
        return x + self.act(self.norm2(self.conv2(x)))


class ResNet(nn.Module):
    """tritonad.models.ResNet in PyTorch, with the same parameter names."""

    def __init__(self, classes=10, widths=(64, 128, 256, 256)):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(1, widths[0], 3, padding=1, bias=False),
                                  nn.BatchNorm2d(widths[0]), nn.GELU())
        self.groups = nn.Sequential(*[ConvGroup(a, b) for a, b in zip(widths, widths[1:])])
        self.head = nn.Linear(widths[-1], classes, bias=False)

    def forward(self, x):
        x = self.groups(self.stem(x))
        return self.head(x.amax((2, 3))) * (1.0 / 8.0)


def lr_factor(step, steps, warmup):
    """tritonad.resnet.lr_factor: linear warm-up over the first `warmup` fraction of the steps
    to 1, then linear to 0."""
    rise = max(1, int(warmup * steps))
    if step < rise:
        return (step + 1) / rise
    return max(0.0, (steps - step) / max(1, steps - rise))


# ------------------------------------------------------------------------------- the run


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mode", choices=MODES, default="eager-bf16")
    p.add_argument("--epochs", type=int, default=RECIPE["epochs"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default=None, help="default: cuda")
    p.add_argument("--data-dir", help="folder holding the Fashion-MNIST files")
    # smaller runs, for tests on the CPU
    p.add_argument("--batch", type=int, default=RECIPE["batch"])
    p.add_argument("--limit", type=int, help="the first N training images only")
    p.add_argument("--test-limit", type=int, help="the first N test images only")
    p.add_argument("--widths", default="64,128,256,256", help="stem and group channels")
    args = p.parse_args(argv)
    for name in ("epochs", "batch", "limit", "test_limit"):
        value = getattr(args, name)
        if value is not None and value < 1:
            p.error(f"--{name.replace('_', '-')} must be a positive integer")
    try:
        args.widths = tuple(int(w) for w in args.widths.split(","))
    except ValueError:
        p.error(f"--widths must be a comma list of integers, got {args.widths!r}")
    if len(args.widths) < 2 or min(args.widths) < 1:
        p.error("--widths needs the stem's and at least one group's channels")
    return args


def process_seconds():
    """Seconds since this process started (Linux's /proc; else since this module's import)."""
    try:
        with open("/proc/self/stat") as f:
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return max(0.0, uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return time.perf_counter() - _STARTED


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run(args):
    """Train; returns the result dict that main prints."""
    device = torch.device(args.device or "cuda")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("torch_resnet: no CUDA GPU (pass --device cpu)")
    # float32 at PyTorch's defaults: TF32 convolutions (cuDNN), IEEE matmul
    torch.backends.cudnn.allow_tf32 = True
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.manual_seed(args.seed)
    startup = {"import": process_seconds()}

    clock = time.perf_counter()
    folder = _folder(args.data_dir)
    train_x, train_y = load(folder, "train", device, args.limit)
    test_x, test_y = load(folder, "t10k", device, args.test_limit)
    _sync(device)
    startup["data"] = time.perf_counter() - clock

    clock = time.perf_counter()
    r = RECIPE
    model = ResNet(widths=args.widths).to(device, memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=r["lr"], momentum=r["momentum"], nesterov=True,
                          weight_decay=r["weight_decay"])
    batch, epochs = args.batch, args.epochs
    per_epoch = max(1, train_x.shape[0] // batch)  # (the last partial batch is dropped)
    steps = epochs * per_epoch
    schedule = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, steps, r["warmup"]))
    cast = torch.autocast(device_type=device.type, dtype=torch.bfloat16,
                          enabled=args.mode != "eager-fp32")
    forward = torch.compile(model) if args.mode.startswith("compile") else model
    _sync(device)
    startup["model"] = time.perf_counter() - clock

    def evaluate():
        forward.eval()
        correct = 0
        with torch.no_grad(), cast:
            for i in range(0, test_x.shape[0], 1000):
                images = test_x[i:i + 1000].contiguous(memory_format=torch.channels_last)
                correct += int((forward(images).argmax(1) == test_y[i:i + 1000]).sum())
        forward.train()
        return correct / test_x.shape[0]

    history = []
    for epoch in range(1, epochs + 1):
        _sync(device)
        clock = time.perf_counter()
        losses = []
        order = torch.randperm(train_x.shape[0], device=device)
        for i in range(per_epoch):
            idx = order[i * batch:(i + 1) * batch]
            x = augment(train_x[idx], r["crop_padding"]).contiguous(
                memory_format=torch.channels_last)
            with cast:
                loss = F.cross_entropy(forward(x), train_y[idx],
                                       label_smoothing=r["label_smoothing"])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            schedule.step()
            losses.append(loss.detach())
        train_loss = torch.stack(losses).float().mean().item()  # (synchronises)
        seconds = time.perf_counter() - clock
        history.append(dict(epoch=epoch, train_loss=train_loss, test_accuracy=evaluate(),
                            seconds=seconds, images_per_s=per_epoch * batch / seconds))
        print(json.dumps(history[-1]), file=sys.stderr, flush=True)
    times = [h["seconds"] for h in history]
    return {"framework": "torch", "mode": args.mode, "torch": torch.__version__,
            "device": str(device), "seed": args.seed, "epochs": epochs, "batch": batch,
            "epoch_s": statistics.median(times[1:]) if len(times) > 1 else times[0],
            "steady": len(times) > 1,  # False: epoch_s includes the warm-up
            "first_epoch_s": times[0], "epoch_seconds": times,
            "test_accuracy": history[-1]["test_accuracy"],
            "test_accuracies": [h["test_accuracy"] for h in history],
            "startup": startup, "history": history,
            "wall_s": process_seconds()}


def main(argv=None):
    result = run(parse_args(argv))
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
