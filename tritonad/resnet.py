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
from .autodiff.autocast import autocast
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


def _resident(dataset, device):
    """(images [N, 1, 28, 28] float32 normalised, labels [N] int64) on device."""
    x = data._normalize(tensor(dataset.images[:, None], device=device), dataset.MEAN,
                        dataset.STD)
    return x, tensor(dataset.labels, device=device)


def train(device, epochs=None, batch=None, precision="bf16", seed=0, data_dir=None, limit=None,
          test_limit=None, widths=(64, 128, 256, 256), log=None):
    """Train the recipe; returns (model, history), an entry per epoch (train loss, test
    accuracy, seconds, images per second). limit / test_limit: the first N training / test
    images only."""
    if precision not in ("fp32", "bf16"):
        raise ValueError(f"resnet: precision must be fp32 or bf16, got {precision!r}")
    r = dict(RECIPE)
    epochs, batch = epochs or r["epochs"], batch or r["batch"]
    manual_seed(seed)
    train_x, train_y = _resident(data.FashionMNIST(data_dir, train=True), device)
    test_x, test_y = _resident(data.FashionMNIST(data_dir, train=False), device)
    if limit is not None:
        train_x, train_y = train_x[:limit], train_y[:limit]
    if test_limit is not None:
        test_x, test_y = test_x[:test_limit], test_y[:test_limit]
    model = models.ResNet(widths=widths).to(device)
    opt = optim.SGD(model.parameters(), lr=r["lr"], momentum=r["momentum"], nesterov=True,
                    weight_decay=r["weight_decay"])
    per_epoch = max(1, train_x.shape[0] // batch)  # (the last partial batch is dropped)
    steps = epochs * per_epoch
    schedule = optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, steps, r["warmup"]))
    crop = transforms.RandomCrop(28, padding=r["crop_padding"])
    cast = autocast(device_type=str(device).split(":")[0], dtype="bfloat16",
                    enabled=precision == "bf16")
    history = []
    for epoch in range(1, epochs + 1):
        clock, losses = time.perf_counter(), []
        model.train()
        order = randperm(train_x.shape[0], device=device)
        for i in range(per_epoch):
            idx = order[i * batch:(i + 1) * batch]
            x = hflip(crop(train_x[idx]))
            with cast:
                loss = F.cross_entropy(model(x), train_y[idx],
                                       label_smoothing=r["label_smoothing"])
            opt.zero_grad()
            loss.backward()
            opt.step()
            schedule.step()
            losses.append(loss.detach())
        train_loss = sum(v.item() for v in losses) / len(losses)
        seconds = time.perf_counter() - clock
        entry = dict(epoch=epoch, train_loss=train_loss,
                     test_accuracy=evaluate(model, test_x, test_y, cast), seconds=seconds,
                     images_per_s=per_epoch * batch / seconds)
        history.append(entry)
        if log is not None:
            log(entry)
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
