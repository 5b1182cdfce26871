"""The image models (the MNIST recipes, and an airbench-style ResNet) and their training
recipes (the README documents them; the benchmarks run the same recipes in PyTorch for
comparison)."""
from __future__ import annotations

from dataclasses import dataclass

from . import nn


def logreg() -> nn.Module:
    """Multinomial logistic regression: 784 -> 10."""
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 10))


def mlp() -> nn.Module:
    """784-256-100-10 with ReLU."""
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 100),
                         nn.ReLU(), nn.Linear(100, 10))


def cnn() -> nn.Module:
    """conv5x5(1->32, pad 2)-ReLU-maxpool2-conv5x5(32->64, pad 2)-ReLU-maxpool2-
    linear(3136->512)-ReLU-linear(512->10)."""
    return nn.Sequential(
        nn.Conv2d(1, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(3136, 512), nn.ReLU(), nn.Linear(512, 10))


class _ConvGroup(nn.Module):
    """conv3x3 -> maxpool2 -> BatchNorm -> GELU, then a residual conv3x3 -> BatchNorm -> GELU
    added to it (one group of the airbench-style ResNet)."""

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
    """An airbench-style ResNet for 28x28 grey images: stem conv3x3 1->64, BatchNorm, GELU;
    groups of 128, 256 and 256 channels (28 -> 14 -> 7 -> 3 pixels); global max pool; a linear
    256 -> classes without bias, logits scaled by 1/8."""

    def __init__(self, classes=10, widths=(64, 128, 256, 256)):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(1, widths[0], 3, padding=1, bias=False),
                                  nn.BatchNorm2d(widths[0]), nn.GELU())
        self.groups = nn.Sequential(*[_ConvGroup(a, b) for a, b in zip(widths, widths[1:])])
        self.head = nn.Linear(widths[-1], classes, bias=False)

    def forward(self, x):
        x = self.groups(self.stem(x))
        return self.head(x.amax((2, 3))) * (1.0 / 8.0)


def resnet() -> nn.Module:
    return ResNet()


@dataclass(frozen=True)
class Recipe:
    """How a model is trained: SGD with momentum and a cosine learning-rate decay per step."""
    build: object
    batch_size: int
    lr: float
    momentum: float = 0.9
    optimizer: str = "sgd"
    epochs: int = 10
    schedule: str = "cosine"


RECIPES = {
    "logreg": Recipe(logreg, batch_size=128, lr=0.05),
    "mlp": Recipe(mlp, batch_size=128, lr=0.05),
    "cnn": Recipe(cnn, batch_size=100, lr=0.01),
}


def build(name: str) -> nn.Module:
    if name not in RECIPES:
        raise ValueError(f"unknown model {name!r}; choose one of {sorted(RECIPES)}")
    return RECIPES[name].build()
