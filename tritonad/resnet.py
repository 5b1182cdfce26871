"""The ResNet recipe: models.ResNet (airbench-style) on Fashion-MNIST, `train --model resnet`.

Batches of 512 drawn from a fresh permutation each epoch, the whole dataset on the device,
normalised once by the training images' mean and std; each batch augmented on the device (a
random 28x28 crop of the image padded by 2 pixels, one kernel for the batch, and a horizontal
flip of half the images); SGD with Nesterov momentum 0.9 and weight decay 5e-4; the learning
rate rises linearly to 0.2 over the first 20% of the steps and falls linearly to 0 at the last;
cross-entropy with label smoothing 0.2; 12 epochs; bf16 autocast (weights float32). The test
accuracy is measured after every epoch.
"""
from __future__ import annotations

import time

from . import data, models, optim, transforms
from .autodiff import no_grad
from .autodiff.ops import where
from .generator import manual_seed
from .nn import functional as F
from .tensor import arange, rand, randperm, tensor

RECIPE = dict(epochs=12, batch=512, lr=0.2, warmup=0.2, momentum=0.9, weight_decay=5e-4,
              label_smoothing=0.2, crop_padding=2)


def lr_factor(step, steps, warmup):
    """Linear warm-up over the first `warmup` fraction of the steps to 1, then linear to 0."""
    rise = max(1, int(warmup * steps))
    if step < rise:
        return (step + 1) / rise
    return max(0.0, (steps - step) / max(1, steps - rise))


def hflip(images, p=0.5):
    """Each image of a batch [N, C, H, W] flipped left-right with probability p (one uniform
    draw an image, then a gather along the width: no host read)."""
    n, width = images.shape[0], images.shape[-1]
    flipped = images[..., arange(width - 1, -1, -1, device=images.device)]
    take = (rand(n, device=images.device) < p).reshape((n, 1, 1, 1))
    return where(take, flipped, images)


def _resident(dataset, device, limit=None):
    """(images [N, 1, 28, 28] float32 normalised, labels [N] int64) on device: the first
    `limit` samples (default: all)."""
    x = data._normalize(tensor(dataset.images[:limit, None], device=device), dataset.MEAN,
                        dataset.STD)
    return x, tensor(dataset.labels[:limit], device=device)


def train(device, epochs=None, batch=None, precision="bf16", seed=0, data_dir=None, limit=None,
          test_limit=None, widths=(64, 128, 256, 256), log=None, graph=None, warmup_calls=2,
          startup=None):
    """Train the recipe; returns (model, history), an entry per epoch (train loss, test
    accuracy, seconds, images per second). limit / test_limit: the first N training / test
    images only. precision: "fp32", "bf16" (autocast) or "fp16" (autocast and a GradScaler).
    graph: capture the whole step (the batch cut at a device cursor from the epoch's order,
    crop and flip, forward, backward, SGD with the scheduled lr) as a CUDA graph after
    `warmup_calls` eager steps (capture.ScheduledStep); default: on a CUDA device with the
    triton backend. startup: a dict to fill with the start-up breakdown (data, first_step,
    capture, tune: seconds)."""
    from .backend import get_backend
    from .amp import PRECISIONS, for_precision
    from .capture import CapturedStep, ScheduledStep, capture_default, synchronize
    from .kernels.tuning import Tuner
    from .tensor import empty, zeros

    if precision not in PRECISIONS:
        raise ValueError(f"resnet: precision must be fp32, bf16 or fp16, got {precision!r}")
    r = dict(RECIPE)
    epochs, batch = epochs or r["epochs"], batch or r["batch"]
    graph = capture_default(device) if graph is None else bool(graph)
    manual_seed(seed)
    clock = time.perf_counter()
    train_x, train_y = _resident(data.FashionMNIST(data_dir, train=True), device, limit)
    test_x, test_y = _resident(data.FashionMNIST(data_dir, train=False), device, test_limit)
    if startup is not None:
        startup["data"] = time.perf_counter() - clock
    model = models.ResNet(widths=widths).to(device)
    opt = optim.SGD(model.parameters(), lr=r["lr"], momentum=r["momentum"], nesterov=True,
                    weight_decay=r["weight_decay"])
    n = train_x.shape[0]
    per_epoch = max(1, n // batch)  # (the last partial batch is dropped)
    batch = min(batch, n)
    steps = epochs * per_epoch
    schedule = optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, steps, r["warmup"]))
    crop = transforms.RandomCrop(28, padding=r["crop_padding"])
    cast, scaler = for_precision(precision, device)
    # the epoch's order in a fixed buffer, one row of sample indices per step, read at a device
    # cursor: the same step eager or replayed
    backend = get_backend()
    order = empty(n, dtype="int64", device=device)
    batches = order._data[:per_epoch * batch].view(per_epoch, batch)
    index = empty(batch, dtype="int64", device=device)
    cursor = zeros((), dtype="int64", device=device)
    loss_sum = zeros((), device=device)

    def train_step():
        backend.take_row_(batches, cursor._data, index._data, advance=True)
        index._bump_version()
        cursor._bump_version()
        x = hflip(crop(train_x[index]))
        with cast:
            loss = F.cross_entropy(model(x), train_y[index], label_smoothing=r["label_smoothing"])
        opt.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        loss_sum.add_(loss.detach())
        return loss

    step_fn = ScheduledStep(train_step, opt, steps, device, graph=graph, warmup=warmup_calls)
    tune0, capture0 = sum(t.seconds for t in Tuner.ALL), CapturedStep.capture_seconds

    def note_startup():  # (tuning and capture happen in the first steps)
        if startup is not None:
            startup.update(tune=sum(t.seconds for t in Tuner.ALL) - tune0,
                           capture=CapturedStep.capture_seconds - capture0, graph=graph)

    history = []
    try:
        for epoch in range(1, epochs + 1):
            clock = time.perf_counter()
            model.train()
            backend.copy_(order._data, randperm(n, device=device)._data)
            order._bump_version()
            cursor.zero_()
            loss_sum.zero_()
            for i in range(per_epoch):
                step_fn()
                schedule.step()
                if epoch == 1 and i == 0 and startup is not None:
                    synchronize(device)
                    startup["first_step"] = time.perf_counter() - clock
            train_loss = loss_sum.item() / per_epoch
            seconds = time.perf_counter() - clock
            entry = dict(epoch=epoch, train_loss=train_loss,
                         test_accuracy=evaluate(model, test_x, test_y, cast), seconds=seconds,
                         images_per_s=per_epoch * batch / seconds)
            history.append(entry)
            if log is not None:
                note_startup()
                log(entry)
    finally:
        step_fn.close()
    note_startup()
    return model, history


def evaluate(model, images, labels, cast, batch=1000):
    """Test accuracy, batches of 1000, in eval mode (running statistics)."""
    model.eval()
    correct = 0
    with no_grad(), cast:
        for i in range(0, images.shape[0], batch):
            logits = model(images[i:i + batch])
            correct += (logits.argmax(1) == labels[i:i + batch]).sum().item()
    model.train()
    return correct / images.shape[0]


__all__ = ["RECIPE", "train", "evaluate", "hflip", "lr_factor"]
