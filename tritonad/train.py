"""Training and evaluation loops for the MNIST recipes (used by the CLI and the benchmarks).

One step = gather the batch from the device-resident dataset, forward, cross-entropy, backward,
optimizer update, and accumulate loss and accuracy on the device. On a GPU the step is captured
as a CUDA graph after a short eager warm-up (tritonad.capture); metrics are read back only when
the progress bar refreshes, so the host never waits for the GPU between steps.
"""
from __future__ import annotations

import contextlib
import os
import sys
import time

import torch

from . import amp, data, distributed, models, nn, optim
from .autodiff import nn_ops
from .autodiff.autocast import state as _autocast
from .autodiff.grad_mode import no_grad
from .backend import get_backend
from .capture import CapturedStep
from .tensor import Tensor, arange, empty, zeros


class Progress:
    """A one-line progress bar: tqdm when it is installed, a plain carriage-return line otherwise."""

    def __init__(self, total, desc, enabled=True, stream=sys.stderr):
        self.total, self.desc, self.enabled, self.stream = total, desc, enabled, stream
        self.count, self.postfix = 0, ""
        self.bar = None
        if enabled:
            try:
                from tqdm import tqdm

                self.bar = tqdm(total=total, desc=desc, file=stream, leave=True, ncols=100,
                                mininterval=0.25)
            except ImportError:
                pass

    def update(self, n, postfix):
        self.count += n
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.set_postfix_str(postfix, refresh=False)
            self.bar.update(n)
        else:
            self.stream.write(f"\r{self.desc} {self.count}/{self.total} {postfix}")
            self.stream.flush()

    def close(self):
        if self.bar is not None:
            self.bar.close()
        elif self.enabled:
            self.stream.write("\n")


class Trainer:
    """Trains `model` on a DataLoader with cross-entropy; `graph=True` captures the step.

    A captured step takes no arguments from the host. The epoch's sample order sits in a static
    device buffer and a device cursor says which batch comes next (one kernel cuts the batch's
    images and labels from the dataset at the cursor); the learning rate (and any
    device hyperparameter of the optimizer) of each step is written by the host into a row of
    a pinned table, which the step copies onto the device itself (Optimizer.fed_hyperparameters).
    So the host work of a step is one graph launch and the scheduler's arithmetic: no input
    copy, no launch per changed learning rate. The last, partial batch of an epoch is a second
    captured step (a fixed slice of the order; its learning rate set by sync()).

    `fuse=True` (the default) trains a plain ReLU MLP with nn.FusedMLP's fused step: forward,
    cross-entropy and backward in one backend call (three kernels on the GPU, which also cut
    the batch from the dataset themselves) instead of ~12 per-op kernels; the gradients, the
    optimizer step and the metrics are the same. Other models (nn.fused.fusable says why), or
    fuse=False, take the per-op autodiff path.


    `precision`: "fp32" (the default), "bf16" (autocast: matmuls and convolutions, the fused
    conv+relu+pool included, in bfloat16, the loss in float32; weights stay float32) or "fp16"
    (autocast to float16 and a GradScaler: dynamic loss scaling, a step with an inf or NaN
    gradient skipped on the device). Under bf16 or fp16 two fused paths give way to their
    per-op forms, as PyTorch's autocast policy would compute them: FusedMLP's fused step (its
    kernels are float32 only) becomes the per-op MLP under autocast, and the classifier head's
    fused linear + cross-entropy becomes a low-precision linear and a float32 loss
    (precision_note says which). A captured fp16 step needs an optimizer whose kernel reads the
    GradScaler's flag (sgd, adam, adamw): the others read it on the host.

    Data-parallel (in a process group, tritonad.distributed; torchrun): the model is
    replicated (rank 0's parameters everywhere, gradients averaged in optimizer.step(), inside
    the captured graph too), `loader` must be sharded (DataLoader(..., shard=...)), and each
    epoch's loss and accuracy are summed over the processes.
    """

    def __init__(self, model, optimizer, loader, scheduler=None, graph=False, warmup=2,
                 fuse=True, precision="fp32"):
        self.model, self.optimizer, self.loader, self.scheduler = model, optimizer, loader, scheduler
        device = loader.images.device
        images = loader.images
        self.precision = precision
        self.cast, self.scaler = amp.for_precision(precision, device)
        self.precision_note = None if precision == "fp32" else \
            "autocast: matmuls and convolutions low precision, the loss float32" + \
            ("; the fused MLP step and the fused classifier head run as their per-op forms"
             if fuse else "")
        if graph and self.scaler.is_enabled() and not (
                getattr(optimizer, "_fused", False) and optimizer._reads_skip):
            raise ValueError(f"Trainer: a captured fp16 step needs an optimizer that reads the "
                             f"GradScaler's inf/NaN flag on the device (SGD, Adam, AdamW); "
                             f"{type(optimizer).__name__} reads it on the host: run it eagerly "
                             f"(graph=False, `train --no-graph`)")
        self.replica = _replicate(model, loader)
        if isinstance(model, distributed.DistributedDataParallel):
            model = model.module
        self._fused = None
        if fuse and precision == "fp32" and images.is_contiguous() and \
                nn.fused.fusable(model, tuple(images.shape)) is None:
            self._fused = nn.FusedMLP.from_sequential(model)
            # the dataset as [N, features] and the labels, read by the fused step
            self._flat_images = images.reshape(images.shape[0], -1)
            self._labels = loader.labels
        # per-step metrics stay on the device, added up by the loss kernel itself: the sum of
        # every sample's loss and the count of correct predictions
        self.loss_sum = zeros((), device=device)
        self.correct = zeros((), dtype="int64", device=device)
        self.eager_step = self._index_step
        self.captured_step = None
        full = loader.num_samples // loader.batch_size
        if graph and full:
            backend = get_backend()
            batch = loader.batch_size
            self._order = empty(loader.num_samples, dtype="int64", device=device)
            self._batches = self._order._data[:full * batch].view(full, batch)
            self._index = empty(batch, dtype="int64", device=device)
            self._cursor = zeros((), dtype="int64", device=device)  # the next captured batch
            images, labels = loader.images, loader.labels
            self._x = empty((batch,) + images.shape[1:], dtype=images.dtype, device=device)
            self._y = empty((batch,) + labels.shape[1:], dtype=labels.dtype, device=device)
            # one pinned host table per optimizer bucket: row b holds step b's hyperparameters
            # (not for a tensor learning rate, which the optimizer reads in place)
            self._feed = isinstance(optimizer, optim.Optimizer) and not any(
                isinstance(value, Tensor) for value in optimizer.hyperparameter_values())
            self._hyper, self._tables, self._table_rows = [], [], []
            if self._feed:
                with optimizer.fed_hyperparameters() as arrays:
                    self._hyper = arrays
                self._tables = [torch.empty((full, a.numel()), dtype=torch.float32,
                                            pin_memory=True) for a in arrays]
                self._table_rows = [t.numpy() for t in self._tables]
            self._backend = backend
            self.captured_step = CapturedStep(self._fed_step, warmup=warmup)
            # the last, partial batch has its own graph: its indices are a fixed slice of the
            # epoch's order, so it reads nothing at a cursor
            self._tail_step = None
            if loader.num_samples > full * batch and not loader.drop_last:
                self._tail_index = Tensor._wrap(self._order._data[full * batch:])
                self._tail_step = CapturedStep(lambda: self._index_step(self._tail_index),
                                               warmup=warmup)

    @property
    def fused(self) -> bool:
        """Whether steps run the fused MLP path."""
        return self._fused is not None

    def _index_step(self, index):
        if self._fused is not None:
            return self._fused_step(index)
        return self._step(self.loader.images[index], self.loader.labels[index])

    def _fused_step(self, rows, cursor=None, advance=False):
        self.optimizer.zero_grad(set_to_none=True)
        loss = self._fused.loss_and_grads(self._flat_images, self._labels, rows, cursor,
                                          advance, metrics=(self.loss_sum, self.correct))
        self.optimizer.step()
        return loss

    def _step(self, x, y):
        with self.cast:
            loss = loss_with_metrics(self.model, x, y, self.loss_sum, self.correct)
        self.optimizer.zero_grad(set_to_none=True)
        self.scaler.scale(loss).backward()
        self.scaler.step(self.optimizer)
        self.scaler.update()
        return loss

    def _fed_step(self):
        """The captured step: this step's batch and hyperparameters come from device memory at
        the cursor, which the last read advances."""
        backend, cursor = self._backend, self._cursor._data
        if self._fused is not None:  # the fused kernels cut the batch and advance the cursor
            for table, array in zip(self._tables, self._hyper):
                backend.take_row_(table, cursor, array)
            return self._fused_step(Tensor._wrap(self._batches), self._cursor, advance=True)
        backend.gather_rows_at_((self.loader.images._data, self.loader.labels._data),
                                (self._x._data, self._y._data), self._batches, cursor)
        for i, (table, array) in enumerate(zip(self._tables, self._hyper)):
            backend.take_row_(table, cursor, array, advance=i == len(self._tables) - 1)
        if not self._tables:
            backend.take_row_(self._batches, cursor, self._index._data, advance=True)
        for t in (self._x, self._y, self._cursor):
            t._bump_version()
        return self._step(self._x, self._y)

    def precompile(self, eval_loader=None):
        """Compile every kernel of a training step (a full batch and the epoch's last, partial
        one) and of an evaluation batch of eval_loader at once, concurrently, before the first
        step (kernels.plans.compile_ahead: a dry run that computes nothing). The first step
        then compiles nothing but the optimizer's update. Returns how many kernel launches were
        compiled (0 on backends that compile nothing, or when called again: Triton's caches
        have them). Leaves the parameters, gradients, metrics and random numbers as they were."""
        from .generator import get_rng_state, set_rng_state
        from .kernels import plans

        if getattr(get_backend(), "name", "") != "triton":
            return 0
        images = self.loader.images
        device = images.device
        rng = get_rng_state()
        grads = [(p, p.grad) for p in self.model.parameters()]
        sizes = [self.loader.batch_size]
        tail = self.loader.num_samples % self.loader.batch_size
        if tail and not self.loader.drop_last:
            sizes.append(tail)
        try:
            with plans.compile_ahead() as ahead:
                loss_sum = zeros((), device=device)  # (nothing runs: their values never matter)
                correct = zeros((), dtype="int64", device=device)
                backend = get_backend()
                order = self.loader.permutation()  # an epoch's start (random numbers restored)
                if self.captured_step is not None:
                    backend.copy_(self._order._data, order._data)
                    # the captured step's own variant: its batch and hyperparameters read at
                    # the device cursor (the optimizer's update itself is left out: it changes
                    # Python state, so it compiles at the first real step)
                    for table, array in zip(self._tables, self._hyper):
                        backend.take_row_(table, self._cursor._data, array)
                    if not self._tables:
                        backend.take_row_(self._batches, self._cursor._data, self._index._data)
                    if self._fused is not None:
                        self._fused.loss_and_grads(self._flat_images, self._labels,
                                                   Tensor._wrap(self._batches), self._cursor,
                                                   advance=True, metrics=(loss_sum, correct))
                    else:
                        backend.gather_rows_at_((images._data, self.loader.labels._data),
                                                (self._x._data, self._y._data), self._batches,
                                                self._cursor._data)
                        with self.cast:
                            loss = loss_with_metrics(self.model, self._x, self._y, loss_sum,
                                                     correct)
                        loss.backward()
                for size in sizes:  # the eager steps: the first ones, and a partial last batch
                    index = order[:size]
                    if self._fused is not None:
                        self._fused.loss_and_grads(self._flat_images, self._labels, index,
                                                   metrics=(loss_sum, correct))
                    else:
                        x, y = images[index], self.loader.labels[index]
                        with self.cast:
                            loss = loss_with_metrics(self.model, x, y, loss_sum, correct)
                        loss.backward()
                if eval_loader is not None and eval_loader.num_samples:
                    with no_grad(), self.cast:
                        was_training = self.model.training
                        self.model.eval()
                        index = arange(min(eval_loader.batch_size, eval_loader.num_samples),
                                       device=device)
                        loss_with_metrics(self.model, eval_loader.images[index],
                                          eval_loader.labels[index], loss_sum, correct,
                                          reduction="sum")
                        self.model.train(was_training)
        finally:
            for p, grad in grads:  # the dry run's gradients hold nothing
                p.grad = grad
            set_rng_state(rng)
        return ahead.kernels

    def _mean_loss(self, seen):
        """Mean loss of the `seen` samples so far."""
        return self.loss_sum.item() / seen

    def _scheduler_step(self):
        if self.scheduler is not None:
            self.scheduler.step()
            self.optimizer.sync()  # the new learning rate reaches the device before a replay

    def steps(self):
        """One pass over the data, step by step: a generator that launches each step and
        yields its number of samples (the GPU may still be running it)."""
        self.model.train()
        for counter in (self.loss_sum, self.correct):
            counter.zero_()
        order = self.loader.permutation()
        batch = self.loader.batch_size
        if self.captured_step is not None:
            self._backend.copy_(self._order._data, order._data)
            self._cursor.zero_()
            feeding = self.optimizer.fed_hyperparameters() if self._feed else \
                contextlib.nullcontext()
            with feeding:
                for b in range(len(self._batches)):
                    for row, values in zip(self._table_rows, self._hyperparameter_rows()):
                        row[b] = values
                    self.captured_step()
                    self._scheduler_step()
                    yield batch
            if self._tail_step is not None:
                self.optimizer.sync()  # no longer fed: the device scalars get this step's values
                self._tail_step()
                self._scheduler_step()
                yield self._tail_index.shape[0]
            return
        for b in range(len(self.loader)):
            index = order[b * batch:(b + 1) * batch]
            self.eager_step(index)
            self._scheduler_step()
            yield index.shape[0]

    def _hyperparameter_rows(self):
        """optimizer.hyperparameter_values() cut into one row per bucket table."""
        values, rows, start = self.optimizer.hyperparameter_values(), [], 0
        for table in self._tables:
            rows.append(values[start:start + table.shape[1]])
            start += table.shape[1]
        return rows

    def train_epoch(self, epoch=1, epochs=1, progress=True, refresh_seconds=0.25):
        """One pass over the data; returns {"loss", "accuracy", "images_per_s", "seconds"}."""
        bar = Progress(len(self.loader), f"epoch {epoch}/{epochs}", enabled=progress)
        seen, last_refresh, pending = 0, time.perf_counter(), 0
        _synchronize()
        start = time.perf_counter()
        for b, n in enumerate(self.steps()):
            seen += n
            pending += 1
            now = time.perf_counter()
            if progress and (now - last_refresh > refresh_seconds or b == len(self.loader) - 1):
                loss, acc = self._mean_loss(seen), self.correct.item() / seen
                rate = seen / (time.perf_counter() - start)
                bar.update(pending, f"loss {loss:.4f} acc {acc:.4f} {rate:,.0f} img/s")
                last_refresh, pending = now, 0
        if self.replica is not None:  # every process's samples (the bar showed this one's)
            distributed.sum_([self.loss_sum._data, self.correct._data])
            seen *= distributed.get_world_size()
        _synchronize()
        seconds = time.perf_counter() - start
        bar.close()
        return {"loss": self._mean_loss(seen), "accuracy": self.correct.item() / seen,
                "images_per_s": seen / seconds, "seconds": seconds}


def _replicate(model, loader):
    """In a process group: the model's DistributedDataParallel (made here unless the model is
    one), after checking that the loader gives this process its own part of the data. None
    outside a group."""
    if not distributed.is_initialized():
        if distributed.launched() and os.environ["WORLD_SIZE"] != "1":
            raise RuntimeError(f"Trainer: this is process {os.environ['RANK']} of "
                               f"{os.environ['WORLD_SIZE']} that torchrun started, but there is "
                               "no process group, so each would train alone on all the data; "
                               "call tritonad.distributed.init_process_group() first (it gives "
                               "this process its GPU), then shard the loader "
                               "(DataLoader(..., shard=tritonad.distributed.shard()))")
        return None
    rank, world = distributed.shard()
    if world > 1 and loader.shard != (rank, world):
        raise ValueError(f"Trainer: this is process {rank} of {world} but its loader "
                         f"{'has shard=' + str(loader.shard) if loader.shard else 'is not sharded'}"
                         f": every process would train on the same samples; make it with "
                         f"DataLoader(..., shard=tritonad.distributed.shard())")
    if isinstance(model, distributed.DistributedDataParallel):
        return model
    return distributed.DistributedDataParallel(model)


def _synchronize():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


# On the numpy backend the test set is evaluated in slices of a few hundred images: the
# temporaries then stay below the size (32 MB) above which each allocation comes fresh from the
# system and pays a page fault per 4 kB on first touch (for the cnn at 1000 images, about a
# third of the time). The triton backend takes the loader's batches as they are.
CPU_EVAL_BATCH = 250


def classifier_head(model):
    """The last layer of `model` when it is a Sequential ending in a Linear: the layer whose
    cross-entropy loss_with_metrics computes with it as one node; else None."""
    if type(model) is nn.Sequential and len(model) and type(model[-1]) is nn.Linear:
        return model[-1]
    return None


def loss_with_metrics(model, x, y, loss_sum, correct, reduction="mean"):
    """cross_entropy(model(x), y), adding the batch's summed loss and correct count to the
    running totals on the device (nn_ops.cross_entropy_with_metrics). A Sequential that ends in
    a Linear runs that layer and the loss as one node (nn_ops.linear_cross_entropy: one kernel
    on the GPU for up to 64 classes), with the same results up to rounding. Under autocast the
    logits come from the model in low precision and the loss is float32 (PyTorch's policy):
    the head is then a low-precision linear followed by the loss, not one node."""
    head = classifier_head(model)
    if _autocast.dtype and x._data.device.type in _autocast.dtype:
        return nn_ops.cross_entropy_with_metrics(model(x).float(), y, loss_sum, correct,
                                                 reduction)
    if head is None:
        return nn_ops.cross_entropy_with_metrics(model(x), y, loss_sum, correct, reduction)
    h = model._forward_items(x, len(model) - 1)
    if h.ndim != 2:  # (the loss takes [N, classes] logits: its own error, unfused)
        return nn_ops.cross_entropy_with_metrics(head(h), y, loss_sum, correct, reduction)
    return nn_ops.linear_cross_entropy_with_metrics(h, head.weight, head.bias, y, loss_sum,
                                                    correct, reduction)


@no_grad()
def evaluate(model, loader, batch_size=None, precision="fp32"):
    """(mean cross-entropy, accuracy) of model over every sample of loader, in eval mode and
    without autodiff history (no graph is recorded, nothing is saved for a backward), under
    the autocast of `precision` (fp32, bf16, fp16) as training ran.

    On the numpy backend a device-resident loader (MNIST-like datasets) is read in contiguous
    slices of its arrays, `batch_size` samples at a time (default: the loader's batch size, at
    most CPU_EVAL_BATCH), with no gather; otherwise the loader's own batches are used."""
    was_training = model.training
    model.eval()
    device = loader.images.device if loader.images is not None else None
    loss_sum = zeros((), device=device)
    correct = zeros((), dtype="int64", device=device)
    count = 0
    if loader.images is not None and loader.batch_transform is None and \
            getattr(get_backend(), "name", "") == "numpy":
        step = batch_size or min(loader.batch_size, CPU_EVAL_BATCH)
        batches = ((loader.images[i:i + step], loader.labels[i:i + step])
                   for i in range(0, loader.num_samples, step))
    else:
        batches = iter(loader)
    cast, _ = amp.for_precision(precision, device if device is not None else "cpu")
    try:
        for x, y in batches:
            with cast:
                loss_with_metrics(model, x, y, loss_sum, correct, reduction="sum")
            count += y.shape[0]
    finally:
        model.train(was_training)
    if count == 0:
        raise ValueError("evaluate: the loader has no samples")
    return loss_sum.item() / count, correct.item() / count


def make_optimizer(name, params, lr, momentum=0.9):
    name = name.lower()
    if name == "sgd":
        return optim.SGD(params, lr=lr, momentum=momentum)
    if name == "adam":
        return optim.Adam(params, lr=lr)
    if name == "adamw":
        return optim.AdamW(params, lr=lr)
    if name == "adadelta":
        return optim.Adadelta(params, lr=lr)
    if name == "rmsprop":
        return optim.RMSprop(params, lr=lr, momentum=momentum)
    if name == "adagrad":
        return optim.Adagrad(params, lr=lr)
    raise ValueError(f"unknown optimizer {name!r}; choose sgd, adam, adamw, adadelta, rmsprop or "
                     "adagrad")


def datasets(name, data_dir=None):
    """(train, test) datasets by name: "mnist" or "fashion-mnist"."""
    kinds = {"mnist": data.MNIST, "fashion-mnist": data.FashionMNIST}
    if name not in kinds:
        raise ValueError(f"unknown dataset {name!r}; choose one of {sorted(kinds)}")
    return kinds[name](data_dir, train=True), kinds[name](data_dir, train=False)


def recipe(name):
    return models.RECIPES[name]
