"""examples/mnist_pytorch.py on tritonad: only the import lines differ (`diff` the two files).
`import tritonad as torch` keeps every `torch.` in the body; a new script would say `td`.

    python examples/mnist_tritonad.py --data data --epochs 14 --seed 1   # on the GPU
    python examples/mnist_tritonad.py --data data --no-accel             # numpy backend
"""
import argparse
import json
import time

import tritonad as torch
import tritonad.nn as nn
import tritonad.nn.functional as F
import tritonad.optim as optim
from tritonad.optim.lr_scheduler import StepLR
from tritonad.utils.data import DataLoader, Subset
from tritonad import data as datasets, transforms


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        x = F.max_pool2d(x, 2)
        x = self.dropout1(x)
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        x = self.dropout2(x)
        x = self.fc2(x)
        return F.log_softmax(x, dim=1)


def train(args, model, device, train_loader, optimizer, epoch):
    model.train()
    for batch_idx, (data, target) in enumerate(train_loader):
        data, target = data.to(device), target.to(device)
        optimizer.zero_grad()
        output = model(data)
        loss = F.nll_loss(output, target)
        loss.backward()
        optimizer.step()
        if batch_idx % args.log_interval == 0 and not args.quiet:
            print(f"Train Epoch: {epoch} [{batch_idx * len(data)}/{len(train_loader.dataset)} "
                  f"({100. * batch_idx / len(train_loader):.0f}%)]\tLoss: {loss.item():.6f}")


def test(model, device, test_loader):
    model.eval()
    test_loss = 0
    correct = 0
    with torch.no_grad():
        for data, target in test_loader:
            data, target = data.to(device), target.to(device)
            output = model(data)
            test_loss += F.nll_loss(output, target, reduction="sum").item()
            pred = output.argmax(dim=1, keepdim=True)
            correct += pred.eq(target.view_as(pred)).sum().item()
    test_loss /= len(test_loader.dataset)
    print(f"\nTest set: Average loss: {test_loss:.4f}, Accuracy: {correct}/"
          f"{len(test_loader.dataset)} ({100. * correct / len(test_loader.dataset):.2f}%)\n")
    return correct / len(test_loader.dataset)


def main():
    parser = argparse.ArgumentParser(description="MNIST example")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--test-batch-size", type=int, default=1000)
    parser.add_argument("--epochs", type=int, default=14)
    parser.add_argument("--lr", type=float, default=1.0)
    parser.add_argument("--gamma", type=float, default=0.7)
    parser.add_argument("--no-accel", action="store_true", help="train on the CPU")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--log-interval", type=int, default=10)
    parser.add_argument("--save-model", action="store_true")
    parser.add_argument("--data", default="../data", help="where the MNIST files are")
    parser.add_argument("--limit", type=int, default=None, help="use the first N images only")
    parser.add_argument("--quiet", action="store_true", help="no per-batch lines")
    args = parser.parse_args()

    use_accel = not args.no_accel and torch.accelerator.is_available()
    torch.manual_seed(args.seed)
    device = torch.accelerator.current_accelerator() if use_accel else torch.device("cpu")

    train_kwargs = {"batch_size": args.batch_size}
    test_kwargs = {"batch_size": args.test_batch_size}
    if use_accel:
        accel_kwargs = {"num_workers": 1, "pin_memory": True, "shuffle": True}
        train_kwargs.update(accel_kwargs)
        test_kwargs.update(accel_kwargs)
    else:
        train_kwargs["shuffle"] = True

    transform = transforms.Compose([transforms.ToTensor(),
                                    transforms.Normalize((0.1307,), (0.3081,))])
    dataset1 = datasets.MNIST(args.data, train=True, download=True, transform=transform)
    dataset2 = datasets.MNIST(args.data, train=False, transform=transform)
    if args.limit:
        dataset1, dataset2 = Subset(dataset1, range(args.limit)), Subset(dataset2, range(args.limit))
    train_loader = DataLoader(dataset1, **train_kwargs)
    test_loader = DataLoader(dataset2, **test_kwargs)

    model = Net().to(device)
    optimizer = optim.Adadelta(model.parameters(), lr=args.lr)

    start = time.perf_counter()
    scheduler = StepLR(optimizer, step_size=1, gamma=args.gamma)
    accuracies = []
    for epoch in range(1, args.epochs + 1):
        train(args, model, device, train_loader, optimizer, epoch)
        accuracies.append(test(model, device, test_loader))
        scheduler.step()

    if args.save_model:
        torch.save(model.state_dict(), "mnist_cnn.pt")
    print(json.dumps({"framework": torch.__name__, "seed": args.seed, "accuracy": accuracies[-1],
                      "seconds": round(time.perf_counter() - start, 2),
                      "accuracies": accuracies}))


if __name__ == "__main__":
    main()
