"""The MNIST recipes as a plain PyTorch eager script, the comparison for `tritonad train`'s
whole-command time (a user times the command, start-up included):

    time python benchmarks/torch_recipe.py --model mlp      # vs time python -m tritonad train

Same recipe (tritonad.models.RECIPES: the model, batch size, SGD momentum 0.9, cosine decay per
step, 10 epochs), the same data files (data/mnist, read with numpy, normalised once on the GPU),
a fresh permutation each epoch, a test evaluation after every epoch as `train` does. Prints the
epoch times and the final test accuracy as JSON.
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import time

import numpy as np
import torch

ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data", "mnist")
RECIPES = {"logreg": (128, 0.05), "mlp": (128, 0.05), "cnn": (100, 0.01)}


def read_idx(name):
    with gzip.open(os.path.join(ROOT, name + ".gz")) as f:
        data = f.read()
    dims = data[3]
    shape = tuple(int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(dims))
    return np.frombuffer(data, np.uint8, offset=4 + 4 * dims).reshape(shape)


def model_of(name):
    nn = torch.nn
    if name == "logreg":
        return nn.Sequential(nn.Flatten(), nn.Linear(784, 10))
    if name == "mlp":
        return nn.Sequential(nn.Flatten(), nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 100),
                             nn.ReLU(), nn.Linear(100, 10))
    return nn.Sequential(nn.Conv2d(1, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(32, 64, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(3136, 512), nn.ReLU(), nn.Linear(512, 10))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(RECIPES), default="mlp")
    parser.add_argument("--epochs", type=int, default=10)
    args = parser.parse_args()
    torch.backends.cudnn.allow_tf32 = True          # both frameworks at their defaults
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.manual_seed(0)
    device = "cuda"

    def load(prefix):
        x = torch.tensor(read_idx(f"{prefix}-images-idx3-ubyte"), device=device)
        y = torch.tensor(read_idx(f"{prefix}-labels-idx1-ubyte").astype(np.int64), device=device)
        return ((x.float() / 255 - 0.1307) / 0.3081).unsqueeze(1), y

    xtr, ytr = load("train")
    xte, yte = load("t10k")
    batch, lr = RECIPES[args.model]
    model = model_of(args.model).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    steps = -(-len(xtr) // batch)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=args.epochs * steps)
    times, acc = [], None
    for _ in range(args.epochs):
        start = time.perf_counter()
        model.train()
        order = torch.randperm(len(xtr), device=device)
        for b in range(steps):
            idx = order[b * batch:(b + 1) * batch]
            loss = torch.nn.functional.cross_entropy(model(xtr[idx]), ytr[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
        model.eval()
        with torch.no_grad():
            correct = sum(int((model(xte[i:i + 1000]).argmax(1) == yte[i:i + 1000]).sum())
                          for i in range(0, len(xte), 1000))
        acc = correct / len(xte)
    print(json.dumps({"model": args.model, "framework": "torch eager", "epochs": args.epochs,
                      "epoch_seconds": [round(t, 4) for t in times], "test_accuracy": acc}))


if __name__ == "__main__":
    main()
