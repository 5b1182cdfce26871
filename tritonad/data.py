"""Datasets (MNIST, FashionMNIST, TensorDataset, your own Dataset) and a DataLoader that keeps
array-backed datasets on the device and batches any other dataset sample by sample.

    train = td.data.MNIST(train=True)                  # numpy uint8 images [60000, 28, 28]
    loader = td.data.DataLoader(train, batch_size=128, shuffle=True, device="cuda")
    for images, labels in loader: ...                  # [128, 1, 28, 28] float32, [128] int64
    td.data.DataLoader(MyDataset(), batch_size=32, shuffle=True, collate_fn=None)  # any dataset

Where the files come from, first match wins:
  1. `root=` (the CLI's --data-dir), else the environment variable TRITONAD_DATA: that folder only;
  2. otherwise the copy shipped with the repository (data/mnist/), then ~/.cache/tritonad.
A folder holds a dataset if the files lie in it, in its subfolder named after the dataset
("mnist", "fashion-mnist"), or where torchvision keeps them (MNIST/raw, FashionMNIST/raw: a
PyTorch user's data folder works as it is); gzipped (.gz) and plain IDX files both work. Missing files are
downloaded (download=True) into <folder>/<dataset>/ from the public mirrors, written atomically
and checked against pinned checksums before they are kept.
"""
from __future__ import annotations

import hashlib
import math
import numbers
import os
import struct
from pathlib import Path

import numpy as np

from . import dtypes
from . import generator as rng
from .autodiff import no_grad
from .backend import get_backend
from .datafiles import (IDX_TYPES, _FIX, DataFileError, DownloadError,  # noqa: F401 (td.data's)
                        _exact_uint8, cache_root, download_file, parse_idx, read_file, read_idx,
                        repo_data_root)
from .reference import from_numpy as raw_from_numpy
from .reference import randperm_numpy
from .tensor import Tensor, _device, arange, from_numpy, tensor
from .transforms import Compose, resident_plan

# ---------------------------------------------------------------------- datasets
def _normalize(images: Tensor, mean, std) -> Tensor:
    """uint8 pixels -> float32 in [0, 1] (-> (x - mean) / std), on images' device, as
    torchvision's ToTensor + Normalize."""
    x = images.float() / 255 if images.dtype is dtypes.uint8 else images.float()
    return (x - mean) / std if mean is not None else x


class MNIST:
    """The MNIST digits: `images` numpy uint8 [N, 28, 28], `labels` numpy int64 [N].

    MNIST(root=None, train=True, transform=None, target_transform=None, download=True): the
    60000 training or 10000 test images, from `root` / TRITONAD_DATA / the repository's
    data/mnist / ~/.cache/tritonad (module docstring). Checksums: the MD5 of each file's
    decompressed contents (mirrors differ in their gz bytes); a file of another IDX element
    type holding the same values is checked as the uint8 file.
    `ds[i]` gives (transform(image), target_transform(label)) as torchvision does, the image a
    uint8 numpy array [28, 28] (what transforms.ToTensor takes); with no transform, a float32
    Tensor [1, 28, 28] normalised with MEAN and STD, and with no target_transform an int label.
    """

    NAME = "mnist"
    FILES = {True: ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
             False: ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")}
    MIRRORS = ("https://ossci-datasets.s3.amazonaws.com/mnist/",
               "https://storage.googleapis.com/cvdf-datasets/mnist/")
    CONTENT_MD5 = {"train-images-idx3-ubyte": "6bbc9ace898e44ae57da46a324031adb",
                   "train-labels-idx1-ubyte": "a25bea736e30d166cdddb491f175f624",
                   "t10k-images-idx3-ubyte": "2646ac647ad5339dbf082846283269ea",
                   "t10k-labels-idx1-ubyte": "27ae3e4e09519cfbb04c329615203637"}
    classes = ["0 - zero", "1 - one", "2 - two", "3 - three", "4 - four", "5 - five", "6 - six",
               "7 - seven", "8 - eight", "9 - nine"]
    MEAN, STD = 0.1307, 0.3081
    IMAGE_SHAPE = (28, 28)

    def __init__(self, root=None, train=True, transform=None, target_transform=None,
                 download=True):
        for name, fn in (("transform", transform), ("target_transform", target_transform)):
            if fn is not None and not callable(fn):
                raise TypeError(f"{type(self).__name__}: {name} must be callable, got "
                                f"{type(fn).__name__}")
        self.transform, self.target_transform = transform, target_transform
        self.train = bool(train)
        image_file, label_file = (self._locate(base, root, download)
                                  for base in self.FILES[self.train])
        self.files = (image_file, label_file)
        self.folder = image_file.parent
        self.images = self._load(image_file, ndim=3)
        self.labels = self._load(label_file, ndim=1).astype(np.int64)
        if len(self.images) != len(self.labels):
            raise DataFileError(f"{image_file} holds {len(self.images)} images but {label_file} "
                                f"holds {len(self.labels)} labels; {_FIX}")
        if self.labels.size and (self.labels.min() < 0 or self.labels.max() >= len(self.classes)):
            raise DataFileError(f"{label_file} has labels outside 0..{len(self.classes) - 1}; "
                                f"{_FIX}")

    @classmethod
    def roots(cls, root=None) -> list:
        """The folders searched, in order; the last one is where downloads go."""
        if root is not None:
            return [Path(root).expanduser()]
        if os.environ.get("TRITONAD_DATA"):
            return [Path(os.environ["TRITONAD_DATA"]).expanduser()]
        return [repo_data_root(), cache_root()]

    def _locate(self, base, root, download) -> Path:
        roots = self.roots(root)
        # root itself, root/mnist, and torchvision's layout root/MNIST/raw (FashionMNIST/raw)
        folders = [f for r in roots for f in (r, r / self.NAME, r / type(self).__name__ / "raw")]
        for folder in folders:
            for name in (base + ".gz", base):
                if (folder / name).is_file():
                    return folder / name
        target = roots[-1] / self.NAME
        holding = f"a folder holding {', '.join(f + '.gz' for f in self.FILES[self.train])}"
        env = os.environ.get("TRITONAD_DATA")
        if root is not None:  # say which setting won, so that nobody sets the one that lost
            source = "the root argument" + (f", which takes precedence over TRITONAD_DATA={env}"
                                            if env else "")
            elsewhere = "pass another root"
        elif env:
            source, elsewhere = f"TRITONAD_DATA={env}", "point TRITONAD_DATA elsewhere"
        else:
            source = "the default places: the repository's data/ folder, then ~/.cache/tritonad"
            elsewhere = "pass root= (--data-dir) or set TRITONAD_DATA"
        if not download:
            raise FileNotFoundError(
                f"{type(self).__name__}: {base}.gz not found; looked in "
                f"{', '.join(map(str, folders))} ({source}); pass download=True to fetch it into "
                f"{target}, put the files there, or {elsewhere} ({holding})")
        return download_file(base + ".gz", target, self.MIRRORS, self._verify_download,
                             f" ({holding}); the folder came from {source}")

    def _checked(self, name, content, where, images) -> np.ndarray:
        """The values of a dataset file as uint8, after every check: IDX header and size, shape
        ([N, *IMAGE_SHAPE] images or [N] labels), element type, and the MD5 of the contents
        pinned under `name`. `content` is the decompressed file, `where` names it in errors;
        `images`: whether it holds the images (else the labels).

        A file of another IDX element type (int16, int32, float32, ...) is converted if its
        values are exactly those of the uint8 file (whole numbers in range) and then checked
        as that file: its checksum is the MD5 of the canonical uint8 IDX contents.
        """
        base = name[:-3] if name.endswith(".gz") else name
        values = parse_idx(content, where)
        shape = ("N",) + self.IMAGE_SHAPE if images else ("N",)
        if values.ndim != len(shape) or (images and values.shape[1:] != self.IMAGE_SHAPE):
            what = "images" if images else "labels"
            raise DataFileError(f"{where} holds an array of shape {values.shape}, expected "
                                f"{what} of shape [{', '.join(map(str, shape))}]; {_FIX}")
        top = 255 if images else len(self.classes) - 1
        if values.dtype != np.uint8:
            values = _exact_uint8(values, top, where, "pixel values" if images else "labels",
                                  content[2])
            content = bytes([0, 0, 0x08, values.ndim]) + struct.pack(
                f">{values.ndim}I", *values.shape) + values.tobytes()
        if base in self.CONTENT_MD5:
            found, expected = hashlib.md5(content).hexdigest(), self.CONTENT_MD5[base]
            if found != expected:
                raise DataFileError(f"{where}: checksum mismatch: the MD5 of its decompressed "
                                    f"contents is {found}, expected {expected}; the file is "
                                    f"corrupt or not the {type(self).__name__} file of that "
                                    f"name; {_FIX}")
        return values

    def _verify_download(self, tmp, url):
        name = url.rsplit("/", 1)[-1]
        images = name.removesuffix(".gz") in (self.FILES[True][0], self.FILES[False][0])
        self._checked(name, read_file(tmp, name=url), url, images)

    def _load(self, path, ndim) -> np.ndarray:
        return self._checked(path.name, read_file(path), str(path), images=ndim == 3)

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        """(transform(uint8 image [28, 28]) or a float32 Tensor [1, 28, 28] normalised with
        MEAN/STD, target_transform(label) or the int label)."""
        if not -len(self) <= int(i) < len(self):
            raise IndexError(f"{type(self).__name__}: index {i} is out of range for "
                             f"{len(self)} images")
        label = int(self.labels[i])
        if self.target_transform is not None:
            label = self.target_transform(label)
        if self.transform is not None:
            return self.transform(self.images[i].copy()), label
        with no_grad():
            image = _normalize(tensor(self.images[i][None]), self.MEAN, self.STD)
        return image, label

    def __repr__(self):
        split = "train" if self.train else "test"
        return f"{type(self).__name__}({split}, {len(self)} images from {self.folder})"


class FashionMNIST(MNIST):
    """Zalando's Fashion-MNIST: MNIST's format and sizes, 10 kinds of clothing.

    Checksums: as MNIST's, the MD5 of each file's decompressed contents, so that recompressed
    copies (some distributions ship them) and plain files are accepted and checked alike.
    """

    NAME = "fashion-mnist"
    MIRRORS = ("http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",)
    CONTENT_MD5 = {"train-images-idx3-ubyte": "f4a8712d7a061bf5bd6d2ca38dc4d50a",  # 47040016 B
                   "train-labels-idx1-ubyte": "9018921c3c673c538a1fc5bad174d6f9",  # 60008 B
                   "t10k-images-idx3-ubyte": "8181f5470baa50b63fa0f6fddb340f0a",  # 7840016 B
                   "t10k-labels-idx1-ubyte": "15d484375f8d13e6eb1aabb0c3f46965"}  # 10008 B
    classes = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt",
               "Sneaker", "Bag", "Ankle boot"]
    MEAN, STD = 0.2860, 0.3530
    DEBIAN = Path("/usr/share/datasets")  # Debian's dataset-fashion-mnist: its fashion-mnist/

    @classmethod
    def roots(cls, root=None) -> list:
        """As MNIST's, with Debian's /usr/share/datasets/fashion-mnist before the cache."""
        found = super().roots(root)
        if root is None and not os.environ.get("TRITONAD_DATA"):
            found.insert(-1, cls.DEBIAN)
        return found


class Dataset:
    """A map-style dataset, as torch.utils.data.Dataset: subclasses define __getitem__(index)
    and __len__(), and any DataLoader batches them."""

    def __getitem__(self, index):
        raise NotImplementedError(f"{type(self).__name__} must define __getitem__")


class IterableDataset:
    """An iterable-style dataset, as torch.utils.data.IterableDataset: subclasses define
    __iter__() (and may define __len__()); a DataLoader batches what it yields, in order."""

    def __iter__(self):
        raise NotImplementedError(f"{type(self).__name__} must define __iter__")


class TensorDataset(Dataset):
    """Samples are rows of the given tensors (or numpy arrays), all of one length:
    `TensorDataset(x, y)[i] == (x[i], y[i])`."""

    def __init__(self, *tensors):
        if not tensors:
            raise ValueError("TensorDataset needs at least one tensor")
        lengths = {len(t) for t in tensors}
        if len(lengths) != 1:
            raise ValueError(f"TensorDataset: the tensors differ in length: "
                             f"{[len(t) for t in tensors]}")
        self.tensors = tensors

    def __len__(self):
        return len(self.tensors[0])

    def __getitem__(self, i):
        return tuple(t[i] for t in self.tensors)


class Subset(Dataset):
    """The samples of `dataset` at `indices`, in that order, as torch.utils.data.Subset:
    `Subset(ds, [4, 2])[1] == ds[2]`. A Subset of an array-backed dataset (MNIST, a
    TensorDataset) stays on the device path of DataLoader: only its rows go to the device."""

    def __init__(self, dataset, indices):
        n = len(dataset)
        idx = np.asarray(indices.numpy() if isinstance(indices, Tensor) else list(indices))
        if idx.size == 0:
            idx = idx.astype(np.int64)
        if idx.ndim != 1 or not (np.issubdtype(idx.dtype, np.integer)):
            raise TypeError(f"Subset: indices must be a sequence of ints, got {idx.dtype} "
                            f"with shape {idx.shape}")
        if idx.size and (idx.min() < -n or idx.max() >= n):
            raise IndexError(f"Subset: index {int(idx.max() if idx.max() >= n else idx.min())} "
                             f"is out of range for a dataset of {n} samples")
        self.dataset, self.indices = dataset, [int(i) % n for i in idx]

    def __len__(self):
        return len(self.indices)

    def __getitem__(self, i):
        if isinstance(i, (list, tuple)):
            return [self.dataset[self.indices[j]] for j in i]
        return self.dataset[self.indices[i]]


class ConcatDataset(Dataset):
    """The samples of several map-style datasets one after another, as
    torch.utils.data.ConcatDataset: `ConcatDataset([a, b])[len(a)] == b[0]`."""

    def __init__(self, datasets):
        self.datasets = list(datasets)
        if not self.datasets:
            raise ValueError("ConcatDataset: needs at least one dataset")
        for d in self.datasets:
            if isinstance(d, IterableDataset) or not hasattr(d, "__len__"):
                raise TypeError(f"ConcatDataset: {type(d).__name__} is not a map-style dataset "
                                f"(__getitem__ and __len__)")
        self.cumulative_sizes = np.cumsum([len(d) for d in self.datasets]).tolist()

    def __len__(self):
        return self.cumulative_sizes[-1]

    def __getitem__(self, i):
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"ConcatDataset: index {i} is out of range for {n} samples")
        i %= n
        k = int(np.searchsorted(self.cumulative_sizes, i, side="right"))
        return self.datasets[k][i - (self.cumulative_sizes[k - 1] if k else 0)]


def random_split(dataset, lengths, generator=None):
    """`dataset` split at random into Subsets of the given lengths, as
    torch.utils.data.random_split: ints that sum to len(dataset), or fractions that sum to 1
    (the remainder goes one sample at a time to the first parts, as torch). The order comes
    from td.manual_seed's stream, or from `generator` (an int seed, or an object with
    initial_seed() such as a torch.Generator), so a seeded split is the same on every run."""
    n = len(dataset)
    lengths = list(lengths)
    if lengths and all(isinstance(x, float) for x in lengths) and \
            math.isclose(sum(lengths), 1.0, abs_tol=1e-6) and sum(lengths) <= 1 + 1e-6:
        if any(not 0 <= x <= 1 for x in lengths):
            raise ValueError(f"random_split: fractions must lie in [0, 1], got {lengths}")
        counts = [int(math.floor(n * f)) for f in lengths]
        for k in range(n - sum(counts)):
            counts[k % len(counts)] += 1
        lengths = counts
    if any(not isinstance(x, numbers.Integral) or x < 0 for x in lengths) or sum(lengths) != n:
        raise ValueError(f"random_split: lengths must be non-negative ints that sum to the "
                         f"dataset's {n} samples (or fractions that sum to 1), got {lengths}")
    order = _permutation(n, generator)
    parts, start = [], 0
    for length in lengths:
        parts.append(Subset(dataset, order[start:start + length].tolist()))
        start += length
    return parts


def _permutation(n, generator) -> np.ndarray:
    """A permutation of range(n) from `generator` (int seed or .initial_seed()), else from
    td.manual_seed's Philox stream."""
    if generator is None:
        return randperm_numpy(n, *rng.take(n))
    seed = generator.initial_seed() if hasattr(generator, "initial_seed") else generator
    if not isinstance(seed, numbers.Integral) or isinstance(seed, bool) or seed < 0:
        raise TypeError(f"random_split: generator must be a non-negative int seed or have "
                        f"initial_seed(), got {generator!r}")
    return randperm_numpy(n, int(seed), 0)


# ---------------------------------------------------------------------- collation
def default_collate(batch):
    """A list of samples as one batch, as torch's default_collate: Tensors are stacked into
    [B, *shape] (on their device), numpy arrays likewise into a CPU Tensor of their dtype,
    numbers into a CPU Tensor [B] (int64, float64 or bool, as torch), strings into a list;
    tuples, lists and dicts are batched position by position (key by key).
    `default_collate([(x0, 3), (x1, 5)]) == (stack([x0, x1]), tensor([3, 5]))`"""
    if not batch:
        raise ValueError("default_collate: an empty batch")
    return _collate(list(batch), "")


def _collate(samples, where):
    elem = samples[0]
    here = f" at {where}" if where else ""
    if isinstance(elem, Tensor):
        return _stack(samples, here)
    if isinstance(elem, (np.ndarray, np.generic, numbers.Number)):
        kinds = {isinstance(s, np.ndarray) for s in samples}
        if len(kinds) != 1 or not all(isinstance(s, (np.ndarray, np.generic, numbers.Number))
                                      for s in samples):
            raise TypeError(f"default_collate: the samples mix arrays, numbers and other "
                            f"types{here}: {sorted({type(s).__name__ for s in samples})}")
        shapes = {np.shape(s) for s in samples}
        if len(shapes) != 1:
            raise ValueError(f"default_collate: the arrays{here} differ in shape: "
                             f"{[np.shape(s) for s in samples]}")
        values = np.stack([np.asarray(s) for s in samples])
        if isinstance(elem, (bool, int, float)) and not isinstance(elem, np.generic):
            # Python numbers batch as torch batches them: int64, float64 or bool
            kind = values.dtype.kind
            values = values.astype({"b": np.bool_, "i": np.int64, "u": np.int64,
                                    "f": np.float64}.get(kind, values.dtype))
        return tensor(values, device="cpu")
    if isinstance(elem, (str, bytes)):
        return list(samples)
    if isinstance(elem, dict):
        keys = list(elem)
        for i, s in enumerate(samples):
            if not isinstance(s, dict) or set(s) != set(keys):
                raise ValueError(f"default_collate: sample {i}{here} has keys "
                                 f"{sorted(map(str, s)) if isinstance(s, dict) else type(s)}, "
                                 f"sample 0 has {sorted(map(str, keys))}")
        return {k: _collate([s[k] for s in samples], f"{where}[{k!r}]") for k in keys}
    if isinstance(elem, (tuple, list)):
        lengths = {len(s) if isinstance(s, (tuple, list)) else -1 for s in samples}
        if len(lengths) != 1:
            raise ValueError(f"default_collate: the samples{here} are sequences of different "
                             f"lengths (or not all sequences)")
        columns = [_collate(list(column), f"{where}[{i}]")
                   for i, column in enumerate(zip(*samples))]
        if hasattr(elem, "_fields"):  # a namedtuple
            return type(elem)(*columns)
        return tuple(columns) if isinstance(elem, tuple) else columns
    raise TypeError(f"default_collate: cannot batch samples of type {type(elem).__name__}"
                    f"{here}; samples may hold Tensors, numpy arrays, numbers, strings and "
                    f"tuples, lists and dicts of them (pass collate_fn= for others)")


def _stack(tensors, here):
    """Tensors of one shape, dtype and device stacked into a new leading dimension: on the CPU
    with numpy, elsewhere with our copy kernel into slices of the result."""
    first = tensors[0]
    for i, t in enumerate(tensors):
        if not isinstance(t, Tensor):
            raise TypeError(f"default_collate: sample {i} holds a {type(t).__name__}{here} "
                            f"where sample 0 holds a Tensor")
        if (t.shape, t.dtype, t.device) != (first.shape, first.dtype, first.device):
            raise ValueError(f"default_collate: the tensors{here} differ: sample 0 is "
                             f"{first.dtype.name} {first.shape} on {first.device}, sample {i} "
                             f"is {t.dtype.name} {t.shape} on {t.device}")
    if first.device.type == "cpu":  # NOTE: numpy() gives bfloat16 as exact float32 values
        return Tensor._wrap(raw_from_numpy(np.stack([t.numpy() for t in tensors]), first.dtype))
    backend = get_backend()
    out = backend.empty((len(tensors), *first.shape), first.dtype, first.device)
    for i, t in enumerate(tensors):
        backend.copy_(out[i], t._data)
    return Tensor._wrap(out)


def _moved(batch, device):
    """A collated batch with every Tensor in it on `device`."""
    if isinstance(batch, Tensor):
        return batch.to(device)
    if isinstance(batch, dict):
        return {k: _moved(v, device) for k, v in batch.items()}
    if isinstance(batch, (tuple, list)):
        items = [_moved(v, device) for v in batch]
        if hasattr(batch, "_fields"):
            return type(batch)(*items)
        return type(batch)(items) if isinstance(batch, tuple) else items
    return batch


# ---------------------------------------------------------------------- DataLoader
def _check_shard(shard):
    """DataLoader's shard=: None or (rank, count) with 0 <= rank < count."""
    if shard is None:
        return None
    try:
        rank, count = shard
        ok = all(isinstance(v, numbers.Integral) and not isinstance(v, bool)
                 for v in (rank, count)) and 0 <= rank < count
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise ValueError(f"DataLoader: shard must be (rank, count) with 0 <= rank < count, got "
                         f"{shard!r}; tritonad.distributed.shard() gives this process's")
    return int(rank), int(count)


def _rows(values, rows):
    """values[rows] for a slice or an int64 index array; a Tensor is indexed where it lives."""
    if isinstance(rows, np.ndarray) and isinstance(values, Tensor):
        return values[from_numpy(rows, device=values.device)] if len(rows) else values[:0]
    return values[rows]


def _to_device(values, device) -> Tensor:
    if isinstance(values, Tensor):
        return values.detach().to(device)
    return from_numpy(np.ascontiguousarray(values), device=device)


class DataLoader:
    """Batches of a dataset, as torch.utils.data.DataLoader; array-backed datasets stay on the
    device from start to end.

    DataLoader(dataset, batch_size=1, shuffle=False, *, drop_last=False, collate_fn=None,
               generator=None, num_workers=0, pin_memory=False, persistent_workers=False,
               device=None, normalize=True, flatten=False, limit=None)

    Device-resident path (the fast one): MNIST, FashionMNIST and other datasets with `images`
    and `labels` arrays and no __getitem__ of their own (they yield (images, labels)), and
    TensorDataset (one batch per tensor), with no collate_fn, no target_transform, and no
    transform or one that starts with ToTensor (see transforms.resident_plan). The images go to `device` once, as uint8, and are converted
    there by our kernels: float32 / 255, then (x - MEAN) / STD if `normalize` and the dataset
    has MEAN/STD (with a transform: its ToTensor and leading Normalize instead, and its
    augmentations on each batch); `flatten` gives [N, C*H*W] instead of [N, C, H, W]. Each
    epoch draws a permutation on the device and every batch is gathered with our gather kernel.
    The resident tensors are `loader.images` and `loader.labels` (`loader.tensors` for a
    TensorDataset); `loader.batch_transform` is what each batch of images goes through.

    Per-sample path: any other map-style dataset (__getitem__ and __len__) gives each batch as
    collate_fn([dataset[i] for i in its indices]) (default_collate), moved to `device`; an
    iterable-style one (IterableDataset, or anything with only __iter__) is batched in the
    order it yields (no shuffle).

    shuffle: a new order each epoch, drawn from td.manual_seed's Philox stream, or from
    `generator` (an int seed, or an object with initial_seed() such as a torch.Generator) with
    the loader's own counter, so that its orders do not depend on other random draws.
    num_workers, pin_memory and persistent_workers are accepted for PyTorch code and change
    nothing: samples are loaded in the calling process (there are no worker processes) and
    batches are put on `device` (default: the backend's device) by the loader itself.
    `limit=n` keeps the first n samples.

    shard=(rank, count): data-parallel training (tritonad.distributed), this process's part of
    every epoch. All processes draw the same order of all samples (same seed), and process
    `rank` takes every count-th sample of it from position rank on, as torch's
    DistributedSampler(drop_last=True): the parts are disjoint, the same size
    (num_samples = N // count; the N % count samples left over change from epoch to epoch), so
    every process takes the same number of steps, and batch b of the processes together is
    batch b of one process with batch_size * count. `batch_size` is per process.
    `shard=tritonad.distributed.shard()` gives this process's (rank, world size).
    """

    def __init__(self, dataset, batch_size=1, shuffle=False, *, drop_last=False,
                 collate_fn=None, generator=None, num_workers=0, pin_memory=False,
                 persistent_workers=False, sampler=None, batch_sampler=None, device=None,
                 normalize=True, flatten=False, limit=None, shard=None):
        if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
            raise ValueError(f"DataLoader: batch_size must be a positive int, got {batch_size!r}")
        if limit is not None and (not isinstance(limit, int) or limit < 0):
            raise ValueError(f"DataLoader: limit must be a non-negative int, got {limit!r}")
        if not isinstance(num_workers, int) or num_workers < 0:
            raise ValueError(f"DataLoader: num_workers must be a non-negative int, got "
                             f"{num_workers!r}")
        if sampler is not None or batch_sampler is not None:
            raise NotImplementedError("DataLoader: sampler= and batch_sampler= are not "
                                      "supported yet; use shuffle=True/False (and generator= "
                                      "for an order of its own)")
        if collate_fn is not None and not callable(collate_fn):
            raise TypeError(f"DataLoader: collate_fn must be callable, got "
                            f"{type(collate_fn).__name__}")
        self.shard = _check_shard(shard)
        self.dataset, self.batch_size, self.limit = dataset, batch_size, limit
        self.shuffle, self.drop_last = bool(shuffle), bool(drop_last)
        self.num_workers, self.pin_memory = num_workers, bool(pin_memory)
        self.collate_fn = collate_fn or default_collate
        self.generator = generator
        self._stream_seed, self._stream_offset = self._generator_seed(), 0
        self.device = _device(device)
        self.images = self.labels = self.tensors = self.batch_transform = None
        self._flatten_batches, self._identity = False, None
        self._iterable = isinstance(dataset, IterableDataset) or (
            not hasattr(dataset, "__getitem__") and hasattr(dataset, "__iter__"))
        if self._iterable and self.shuffle:
            raise ValueError("DataLoader: an iterable-style dataset gives its samples in its own "
                             "order; shuffle=True is not possible (shuffle inside __iter__)")
        if self._iterable and self.shard is not None:
            raise ValueError("DataLoader: an iterable-style dataset cannot be sharded (its "
                             "samples have no order to split); shard=... needs a map-style "
                             "dataset (__getitem__ and __len__)")
        plan = self._resident_plan(dataset, collate_fn)
        if plan is not None:
            self._make_resident(dataset, plan, normalize, flatten)
            self.num_samples = len(self.tensors[0])
        elif self._iterable:
            self.num_samples = min(len(dataset), limit if limit is not None else len(dataset)) \
                if hasattr(dataset, "__len__") else None
        elif hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__"):
            if flatten:
                raise ValueError("DataLoader: flatten=True applies to the device-resident path "
                                 f"only; flatten in the dataset's transform for a "
                                 f"{type(dataset).__name__}")
            self.num_samples = min(len(dataset), limit if limit is not None else len(dataset))
        else:
            raise TypeError(f"DataLoader: expected a dataset (a class with __getitem__ and "
                            f"__len__, or with __iter__), got {type(dataset).__name__}")
        # all samples of an epoch's order, before this process takes its part of them
        self.total_samples = self.num_samples
        if self.shard is not None:
            rank, count = self.shard
            if self.num_samples < count:
                raise ValueError(f"DataLoader: {self.num_samples} samples cannot be shared by "
                                 f"{count} processes (shard={self.shard}): each needs at least "
                                 "one")
            self.num_samples //= count

    # ------------------------------------------------------------------ the resident path
    @staticmethod
    def _resident_plan(dataset, collate_fn):
        """(once, per_batch) transforms when the dataset can stay on the device, else None."""
        if collate_fn is not None:
            return None
        if isinstance(dataset, Subset) and type(dataset).__getitem__ is Subset.__getitem__:
            return DataLoader._resident_plan(dataset.dataset, collate_fn)  # its rows only
        # NOTE: a class with a __getitem__ of its own gets its samples from it, arrays or not
        getitem = getattr(type(dataset), "__getitem__", None)
        if isinstance(dataset, TensorDataset) and getitem is TensorDataset.__getitem__:
            return [], []
        if not (hasattr(dataset, "images") and hasattr(dataset, "labels")) or \
                getitem not in (None, MNIST.__getitem__) or \
                getattr(dataset, "target_transform", None) is not None:
            return None
        transform = getattr(dataset, "transform", None)
        return ([], []) if transform is None else resident_plan(transform)

    def _make_resident(self, dataset, plan, normalize, flatten):
        once, per_batch = plan
        rows = slice(None, self.limit)
        if isinstance(dataset, Subset):  # the rows it picks (a Subset of a Subset: compose)
            picked = np.arange(len(dataset))
            while isinstance(dataset, Subset):
                picked = np.asarray(dataset.indices, dtype=np.int64)[picked]
                dataset = dataset.dataset
            rows = picked[:self.limit]
        with no_grad():
            if isinstance(dataset, TensorDataset):
                self.tensors = tuple(_to_device(_rows(t, rows), self.device)
                                     for t in dataset.tensors)
                return
            images = _to_device(_rows(dataset.images, rows), self.device)
            if once:  # the dataset's ToTensor, then its Normalize steps, on the whole array
                images = once[0].batch(images)
                for t in once[1:]:
                    images = t(images)
            else:
                if images.ndim == 3:  # [N, H, W] -> [N, 1, H, W]
                    images = images.reshape(images.shape[0], 1, *images.shape[1:])
                mean, std = getattr(dataset, "MEAN", None), getattr(dataset, "STD", None)
                images = _normalize(images, mean if normalize else None, std)
            if per_batch:
                self.batch_transform = Compose(per_batch)
                self._flatten_batches = bool(flatten)
            elif flatten:
                images = images.reshape(images.shape[0], -1)
            self.images = images
            self.labels = _to_device(_rows(dataset.labels, rows), self.device).long()
            if len(self.labels) != len(self.images):
                raise ValueError(f"DataLoader: the dataset has {len(self.images)} images but "
                                 f"{len(self.labels)} labels")
            self.tensors = (self.images, self.labels)

    # ------------------------------------------------------------------ order
    def _generator_seed(self):
        g = self.generator
        if g is None:
            return None
        if isinstance(g, int) and not isinstance(g, bool):
            seed = g
        elif callable(getattr(g, "initial_seed", None)):
            seed = g.initial_seed()
        else:
            raise TypeError(f"DataLoader: generator must be an int seed or have an "
                            f"initial_seed() method (a torch.Generator), got {type(g).__name__}")
        if not isinstance(seed, int) or seed < 0:
            raise ValueError(f"DataLoader: the generator's seed must be a non-negative int, got "
                             f"{seed!r}")
        return seed

    def _draw(self, n):
        """(seed, offset) for a permutation of n: from the loader's generator (restarting its
        counter when the seed changes) or from the global stream."""
        seed = self._generator_seed()
        if seed is None:
            return rng.take(n)
        if seed != self._stream_seed:
            self._stream_seed, self._stream_offset = seed, 0
        offset = self._stream_offset
        self._stream_offset += max(n, 1)
        return seed, offset

    def permutation(self) -> Tensor:
        """The sample order of one epoch, int64 [N] on the device: a fresh random permutation
        if shuffling (one draw from the generator or td.manual_seed's stream), else 0..N-1;
        with shard=(rank, count), this process's part of it, [N // count]."""
        n = self.total_samples
        if self.shuffle:
            backend = get_backend()
            backend.check_device("randperm", self.device)
            order = backend.randperm(n, *self._draw(n), self.device)
            if self.shard is not None:  # this process's part, contiguous for the batch gathers
                order = backend.contiguous(order[self._shard_slice()])
            return Tensor._wrap(order)
        if self._identity is None:
            self._identity = arange(n, device=self.device) if self.shard is None else \
                arange(*self._shard_slice().indices(n), device=self.device)
        return self._identity

    def _shard_slice(self) -> slice:
        """The positions of an epoch's order that are this process's part: every count-th
        from rank on, num_samples of them."""
        rank, count = self.shard
        return slice(rank, count * self.num_samples, count)

    def _host_order(self) -> np.ndarray:
        """The per-sample path's order of one epoch: the same stream as permutation(), drawn
        on the host (the indices go to __getitem__)."""
        n = self.total_samples
        order = randperm_numpy(n, *self._draw(n)) if self.shuffle else np.arange(n)
        return order if self.shard is None else order[self._shard_slice()]

    # ------------------------------------------------------------------ batches
    def __len__(self):
        """The number of batches in an epoch."""
        if self.num_samples is None:
            raise TypeError(f"DataLoader: the iterable-style {type(self.dataset).__name__} has "
                            "no __len__, so the number of batches is not known")
        if self.drop_last:
            return self.num_samples // self.batch_size
        return -(-self.num_samples // self.batch_size)

    def __iter__(self):
        if self.tensors is not None:
            return self._resident_batches()
        if self._iterable:
            return self._iterable_batches()
        return self._sample_batches()

    def _resident_batches(self):
        order = self.permutation()
        for b in range(len(self)):
            index = order[b * self.batch_size:(b + 1) * self.batch_size]
            # NOTE: no_grad must not stay entered across the yield: the loop body trains
            with no_grad():
                batch = tuple(t[index] for t in self.tensors)  # our gather_rows kernel
                if self.batch_transform is not None:
                    images = self.batch_transform(batch[0])
                    if self._flatten_batches:
                        images = images.reshape(images.shape[0], -1)
                    batch = (images,) + batch[1:]
            yield batch

    def _sample_batches(self):
        order = self._host_order()
        for b in range(len(self)):
            indices = order[b * self.batch_size:(b + 1) * self.batch_size]
            yield _moved(self.collate_fn([self.dataset[int(i)] for i in indices]), self.device)

    def _iterable_batches(self):
        batch, count = [], 0
        for sample in self.dataset:
            if self.limit is not None and count >= self.limit:
                break
            batch.append(sample)
            count += 1
            if len(batch) == self.batch_size:
                yield _moved(self.collate_fn(batch), self.device)
                batch = []
        if batch and not self.drop_last:
            yield _moved(self.collate_fn(batch), self.device)

    def __repr__(self):
        path = "resident" if self.tensors is not None else \
            "iterable" if self._iterable else "per sample"
        part = "" if self.shard is None else \
            f" (part {self.shard[0]} of {self.shard[1]} of {self.total_samples})"
        return (f"DataLoader({path}: batches of {self.batch_size} from {self.num_samples} "
                f"samples{part} on {self.device}, shuffle={self.shuffle})")


__all__ = ["MNIST", "FashionMNIST", "Dataset", "IterableDataset", "TensorDataset", "DataLoader",
           "default_collate", "read_idx", "parse_idx", "read_file", "download_file",
           "DataFileError", "DownloadError", "IDX_TYPES"]


def __getattr__(name):  # a missing PyTorch name says what to use instead (see _hints.py)
    from ._hints import missing
    raise missing(__name__, name, globals())
