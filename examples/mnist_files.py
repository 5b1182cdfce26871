"""torchvision's datasets.MNIST, transforms.Compose, ToTensor and Normalize for the MNIST
images, for a machine without torchvision (the GPU machines here): the same files as
tritonad reads (root, root/mnist or root/MNIST/raw; the IDX files, gzipped or not) and the
same values as torchvision gives (ToTensor: uint8 [H, W] -> float32 [1, H, W] / 255).
mnist_pytorch.py uses it only when `import torchvision` fails."""
import gzip
import os
import types

import numpy as np
import torch


def _read_idx(path):
    with (gzip.open(path) if path.endswith(".gz") else open(path, "rb")) as f:
        content = f.read()
    dims = content[3]
    shape = [int.from_bytes(content[4 + 4 * i:8 + 4 * i], "big") for i in range(dims)]
    return np.frombuffer(content, np.uint8, offset=4 + 4 * dims).reshape(shape)


class MNIST(torch.utils.data.Dataset):
    def __init__(self, root, train=True, transform=None, target_transform=None, download=False):
        prefix = "train" if train else "t10k"
        self.data = self._find(root, f"{prefix}-images-idx3-ubyte")
        self.targets = self._find(root, f"{prefix}-labels-idx1-ubyte").astype(np.int64)
        self.transform, self.target_transform = transform, target_transform

    @staticmethod
    def _find(root, name):
        for folder in (root, os.path.join(root, "mnist"), os.path.join(root, "MNIST", "raw")):
            for path in (os.path.join(folder, name + ".gz"), os.path.join(folder, name)):
                if os.path.isfile(path):
                    return _read_idx(path)
        raise FileNotFoundError(f"MNIST: {name}(.gz) not found under {root}")

    def __len__(self):
        return len(self.data)

    def __getitem__(self, i):
        image, target = self.data[i], int(self.targets[i])
        if self.transform is not None:
            image = self.transform(image)
        if self.target_transform is not None:
            target = self.target_transform(target)
        return image, target


class Compose:
    def __init__(self, transforms):
        self.transforms = transforms

    def __call__(self, x):
        for t in self.transforms:
            x = t(x)
        return x


class ToTensor:
    def __call__(self, image):
        return torch.from_numpy(np.array(image, np.float32)[None] / np.float32(255))


class Normalize:
    def __init__(self, mean, std):
        self.mean = torch.tensor(mean).view(-1, 1, 1)
        self.std = torch.tensor(std).view(-1, 1, 1)

    def __call__(self, x):
        return (x - self.mean) / self.std


datasets = types.SimpleNamespace(MNIST=MNIST)
transforms = types.SimpleNamespace(Compose=Compose, ToTensor=ToTensor, Normalize=Normalize)
