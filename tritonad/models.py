"""The MNIST models and their training recipes (the README documents them; the benchmarks run
the same recipes in PyTorch for comparison)."""
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
