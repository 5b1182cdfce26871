"""models.ResNet (the airbench-style ResNet for 28x28 images) against the same network in
PyTorch with copied weights: logits, the label-smoothed loss and every gradient, in training
mode (batch statistics, running statistics updated) and in eval mode."""
import contextlib

import numpy as np
import pytest
import torch

import tritonad as td
import tritonad.nn.functional as F
from tritonad import models


def torch_resnet(widths=(64, 128, 256, 256), classes=10):
    nn = torch.nn

    class Group(nn.Module):
        def __init__(self, a, b):
            super().__init__()
            self.conv = nn.Conv2d(a, b, 3, padding=1, bias=False)
            self.pool = nn.MaxPool2d(2)
            self.norm = nn.BatchNorm2d(b)
            self.act = nn.GELU()
            self.conv2 = nn.Conv2d(b, b, 3, padding=1, bias=False)
            self.norm2 = nn.BatchNorm2d(b)

        def forward(self, x):
            x = self.act(self.norm(self.pool(self.conv(x))))
            return x + self.act(self.norm2(self.conv2(x)))

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = nn.Sequential(nn.Conv2d(1, widths[0], 3, padding=1, bias=False),
                                      nn.BatchNorm2d(widths[0]), nn.GELU())
            self.groups = nn.Sequential(*[Group(a, b) for a, b in zip(widths, widths[1:])])
            self.head = nn.Linear(widths[-1], classes, bias=False)

        def forward(self, x):
            return self.head(self.groups(self.stem(x)).amax((2, 3))) / 8

    return Net()


@contextlib.contextmanager
def _conv_precision(precision):
    previous = td.conv_precision()
    td.set_conv_precision(precision)
    try:
        yield
    finally:
        td.set_conv_precision(previous)


@pytest.mark.parametrize("backend", ["numpy", pytest.param("triton", marks=pytest.mark.gpu)])
def test_resnet_matches_torch(backend):
    widths = (8, 16, 16, 16) if backend == "numpy" else (64, 128, 256, 256)
    device = "cuda" if backend == "triton" else "cpu"
    # (float32 accuracy on the GPU: TF32 convolutions move the first layer's weight gradient
    # by ~10% of its largest element through eight layers of batch statistics)
    with td.use_backend(backend), _conv_precision("highest"):
        torch.manual_seed(0)
        theirs = torch_resnet(widths).double()
        ours = models.ResNet(widths=widths).to(device, td.float64 if backend == "numpy"
                                               else td.float32)
        ours.load_state_dict({k: td.tensor(v.numpy()).to(ours.head.weight.dtype)
                              for k, v in theirs.state_dict().items()})
        rng = np.random.default_rng(0)
        x = rng.standard_normal((6, 1, 28, 28))
        y = np.array([0, 3, 9, 1, 1, 5])
        tx = td.tensor(x).to(device, ours.head.weight.dtype)
        loss = F.cross_entropy(ours(tx), td.tensor(y, device=device), label_smoothing=0.2)
        loss.backward()
        ref = torch.nn.functional.cross_entropy(theirs(torch.from_numpy(x)), torch.from_numpy(y),
                                                label_smoothing=0.2)
        ref.backward()
        tol = dict(rtol=1e-9, atol=1e-12) if backend == "numpy" else dict(rtol=1e-3, atol=1e-4)
        np.testing.assert_allclose(loss.item(), ref.item(), **tol)
        named = dict(theirs.named_parameters())
        for name, p in ours.named_parameters():
            np.testing.assert_allclose(p.grad.cpu().numpy(), named[name].grad.numpy(), **tol,
                                       err_msg=name)
        for name, b in theirs.named_buffers():  # running statistics after one training step
            np.testing.assert_allclose(ours.state_dict()[name].cpu().numpy(), b.numpy(), **tol)
        ours.eval()
        theirs.eval()
        with td.no_grad():
            np.testing.assert_allclose(ours(tx).cpu().numpy(),
                                       theirs(torch.from_numpy(x)).detach().numpy(), **tol)


def test_the_recipe_trains_and_augments():
    from tritonad import cli, resnet

    td.set_backend("numpy")
    steps = [round(resnet.lr_factor(s, 10, 0.2), 3) for s in range(10)]
    assert steps == [0.5, 1.0, 1.0, 0.875, 0.75, 0.625, 0.5, 0.375, 0.25, 0.125]
    x = td.arange(24, dtype=td.float32).reshape((4, 1, 2, 3))
    td.manual_seed(1)
    out = resnet.hflip(x).numpy()
    for got, image in zip(out, x.numpy()):  # each image as it was or mirrored
        assert (got == image).all() or (got == image[..., ::-1]).all()
    assert any((g != i).any() for g, i in zip(out, x.numpy()))
    model, history = resnet.train("cpu", epochs=1, batch=32, limit=64, test_limit=40,
                                  widths=(4, 8, 8, 8), precision="fp32")
    assert len(history) == 1 and np.isfinite(history[0]["train_loss"])
    assert 0.0 <= history[0]["test_accuracy"] <= 1.0
    with pytest.raises(SystemExit):
        cli.main(["train", "--model", "resnet", "--optimizer", "adam"])


class _TinyFashion:
    """32 random 28x28 images in place of Fashion-MNIST (no file to read)."""
    MEAN, STD = 0.29, 0.35

    def __init__(self, root=None, train=True):
        rng = np.random.default_rng(int(train))
        self.images = rng.integers(0, 256, (32, 28, 28)).astype(np.uint8)
        self.labels = rng.integers(0, 10, 32).astype(np.int64)


def test_the_recipe_takes_every_precision(monkeypatch):
    """bf16 autocast and fp16 with a GradScaler on the numpy backend, on a tiny ResNet: the first
    epoch's loss within half-precision noise of fp32's, the start-up breakdown filled."""
    from tritonad import resnet

    td.set_backend("numpy")
    monkeypatch.setattr(resnet.data, "FashionMNIST", _TinyFashion)
    losses = {}
    for precision in ("fp32", "bf16", "fp16"):
        startup = {}
        _, history = resnet.train("cpu", epochs=1, batch=16, limit=32, test_limit=8,
                                  widths=(4, 8, 8, 8), precision=precision, startup=startup)
        losses[precision] = history[0]["train_loss"]
        assert startup["graph"] is False and startup["first_step"] > 0 and "data" in startup
    assert losses["bf16"] == pytest.approx(losses["fp32"], rel=2e-2)
    assert losses["fp16"] == pytest.approx(losses["fp32"], rel=1e-2)
    with pytest.raises(ValueError, match="precision must be fp32, bf16 or fp16"):
        resnet.train("cpu", epochs=1, precision="tf32")


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_captured_epochs_give_the_eager_losses(precision):
    """The whole step captured (the batch at a device cursor, crop and flip drawn per replay,
    SGD with the scheduled lr): two epochs' losses and test accuracies as the eager steps'."""
    from tritonad import resnet

    runs = {}
    with td.use_backend("triton"):
        for graph in (False, True):
            startup = {}
            _, history = resnet.train("cuda", epochs=2, batch=256, limit=2048, test_limit=1000,
                                      widths=(16, 32, 64, 64), precision=precision,
                                      graph=graph, startup=startup)
            assert startup["graph"] is graph and (startup["capture"] > 0) == graph
            runs[graph] = history
    for eager, captured in zip(runs[False], runs[True]):  # (half-precision noise, 16 steps)
        assert captured["train_loss"] == pytest.approx(eager["train_loss"], rel=3e-2)
        assert abs(captured["test_accuracy"] - eager["test_accuracy"]) <= 0.03
    assert runs[True][1]["train_loss"] < runs[True][0]["train_loss"]
