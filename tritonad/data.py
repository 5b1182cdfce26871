"""Datasets (MNIST, FashionMNIST, TensorDataset) and a DataLoader that lives on the device.

    train = td.data.MNIST(train=True)                  # numpy uint8 images [60000, 28, 28]
    loader = td.data.DataLoader(train, batch_size=128, shuffle=True, device="cuda")
    for images, labels in loader: ...                  # [128, 1, 28, 28] float32, [128] int64

Where the files come from, first match wins:
  1. `root=` (the CLI's --data-dir), else the environment variable TRITONAD_DATA: that folder only;
  2. otherwise the copy shipped with the repository (data/mnist/), then ~/.cache/tritonad.
A folder holds a dataset if the files lie in it or in its subfolder named after the dataset
("mnist", "fashion-mnist"); gzipped (.gz) and plain IDX files both work. Missing files are
downloaded (download=True) into <folder>/<dataset>/ from the public mirrors, written atomically
and checked against pinned checksums before they are kept.
"""
from __future__ import annotations

import gzip
import hashlib
import math
import os
import secrets
import struct
import sys
import time
import urllib.error
import urllib.request
import zlib
from http.client import HTTPException
from pathlib import Path

import numpy as np

from . import dtypes
from .autodiff import no_grad
from .tensor import Tensor, _device, arange, from_numpy, randperm, tensor

try:
    from tqdm import tqdm as _tqdm
except ImportError:  # a plain progress line on stderr instead
    _tqdm = None

DOWNLOAD_TIMEOUT_S = 30


class DataFileError(ValueError):
    """A data file is corrupt, truncated, or not the file it should be."""


class DownloadError(RuntimeError):
    """A file could not be fetched from any mirror."""


# ---------------------------------------------------------------------- IDX files
# IDX (LeCun's format), big endian: two zero bytes, a type code, the number of dims d,
# d uint32 sizes, then the values in C order.
IDX_TYPES = {0x08: np.dtype("u1"), 0x09: np.dtype("i1"), 0x0B: np.dtype(">i2"),
             0x0C: np.dtype(">i4"), 0x0D: np.dtype(">f4"), 0x0E: np.dtype(">f8")}
_FIX = "delete it to download it again, or replace it"


def read_file(path, name=None) -> bytes:
    """The contents of a file, gunzipped if it is gzip (by its first bytes). `name` is what
    errors call the file (its path by default)."""
    path = Path(path)
    name = name or str(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise FileNotFoundError(f"data file {name} does not exist") from None
    if raw[:2] == b"\x1f\x8b":
        try:
            return gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as err:
            raise DataFileError(f"{name} is a corrupt or truncated gzip file ({err}); "
                                f"{_FIX}") from None
    if name.endswith(".gz"):
        raise DataFileError(f"{name} is not a gzip file (it starts with {raw[:4]!r}); {_FIX}")
    return raw


def parse_idx(content: bytes, name="<bytes>") -> np.ndarray:
    """The array an IDX file's (decompressed) contents hold, in native byte order."""
    if len(content) < 4 or content[:2] != b"\0\0" or content[2] not in IDX_TYPES:
        raise DataFileError(f"{name} is not an IDX file: bad magic number 0x{content[:4].hex()} "
                            f"(expected 00 00, a type code in {sorted(IDX_TYPES)}, a dim count); "
                            f"{_FIX}")
    dtype, ndim = IDX_TYPES[content[2]], content[3]
    start = 4 + 4 * ndim
    if len(content) < start:
        raise DataFileError(f"{name} is truncated: its header needs {start} bytes, the file has "
                            f"{len(content)}; {_FIX}")
    shape = struct.unpack(f">{ndim}I", content[4:start])
    count = math.prod(shape)
    expected, found = count * dtype.itemsize, len(content) - start
    if found != expected:
        what = "truncated" if found < expected else "too long"
        raise DataFileError(f"{name} is {what}: the header says {shape} values of {dtype.name}, "
                            f"{expected} bytes, but {found} bytes follow it; {_FIX}")
    values = np.frombuffer(content, dtype, count=count, offset=start).reshape(shape)
    return values.astype(dtype.newbyteorder("="))  # a writable native-endian copy


def read_idx(path) -> np.ndarray:
    """An IDX file (.gz or plain) as a numpy array: `read_idx("t10k-labels-idx1-ubyte.gz")`."""
    return parse_idx(read_file(path), str(path))


# ---------------------------------------------------------------------- downloads
class _PlainProgress:
    """`name:  42% 4.1/9.9 MB` on stderr, redrawn at most ten times a second."""

    def __init__(self, total, desc):
        self.total, self.desc, self.done, self.shown = total, desc, 0, 0.0

    def update(self, n):
        self.done += n
        if time.monotonic() - self.shown > 0.1:
            self._draw()

    def _draw(self):
        self.shown = time.monotonic()
        size = f"{self.done / 1e6:.1f}" + (f"/{self.total / 1e6:.1f}" if self.total else "")
        percent = f"{100 * self.done // self.total:3d}% " if self.total else ""
        sys.stderr.write(f"\r{self.desc}: {percent}{size} MB")
        sys.stderr.flush()

    def close(self):
        self._draw()
        sys.stderr.write("\n")


def _progress(total, desc):
    if _tqdm is not None:
        return _tqdm(total=total, desc=desc, unit="B", unit_scale=True, file=sys.stderr)
    return _PlainProgress(total, desc)


def download_file(filename, folder, mirrors, verify=None, hint="") -> Path:
    """Fetch `filename` into `folder` from the first mirror that serves it intact.

    Each attempt streams into a temporary file in `folder`, checks it with `verify(tmp, url)`
    (which raises DataFileError if the contents are wrong) and only then renames it into place,
    so an interrupted or bad download never leaves a file that looks complete.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    dest, failures = folder / filename, []
    for mirror in mirrors:
        url = mirror.rstrip("/") + "/" + filename
        tmp = folder / f".{filename}.{secrets.token_hex(4)}.part"
        try:
            request = urllib.request.Request(url, headers={"User-Agent": "tritonad"})
            with urllib.request.urlopen(request, timeout=DOWNLOAD_TIMEOUT_S) as response, \
                    open(tmp, "wb") as f:
                total = int(response.headers.get("Content-Length") or 0) or None
                bar = _progress(total, f"downloading {filename}")
                try:
                    while chunk := response.read(1 << 16):
                        f.write(chunk)
                        bar.update(len(chunk))
                finally:
                    bar.close()
                f.flush()
                os.fsync(f.fileno())
            if total is not None and tmp.stat().st_size != total:
                raise DataFileError(f"{url}: the download stopped after {tmp.stat().st_size} of "
                                    f"{total} bytes")
            if verify is not None:
                verify(tmp, url)
            os.replace(tmp, dest)
            return dest
        except urllib.error.HTTPError as err:
            failures.append(f"{url}: {err}")
        except urllib.error.URLError as err:
            failures.append(f"{url}: {err.reason}")
        except (OSError, ValueError, HTTPException) as err:
            failures.append(f"{url}: {err}")
        finally:
            tmp.unlink(missing_ok=True)
    raise DownloadError(f"could not download {filename} from any mirror ({'; '.join(failures)}); "
                        f"put the files in {folder} or pass --data-dir / TRITONAD_DATA{hint}")


def repo_data_root() -> Path:
    """data/ of the repository this package sits in (it carries data/mnist/)."""
    return Path(__file__).resolve().parents[1] / "data"


def cache_root() -> Path:
    return Path.home() / ".cache" / "tritonad"


# ---------------------------------------------------------------------- datasets
def _normalize(images: Tensor, mean, std) -> Tensor:
    """uint8 pixels -> float32 in [0, 1] (-> (x - mean) / std), on images' device, as
    torchvision's ToTensor + Normalize."""
    x = images.float() / 255 if images.dtype is dtypes.uint8 else images.float()
    return (x - mean) / std if mean is not None else x


class MNIST:
    """The MNIST digits: `images` numpy uint8 [N, 28, 28], `labels` numpy int64 [N].

    MNIST(root=None, train=True, download=True): the 60000 training or 10000 test images, from
    `root` / TRITONAD_DATA / the repository's data/mnist / ~/.cache/tritonad (module docstring).
    Checksums: the MD5 of each file's decompressed contents (mirrors differ in their gz bytes).
    `ds[i]` gives (normalised float32 Tensor [1, 28, 28], int label), as torchvision does.
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
    GZ_MD5: dict = {}  # MD5 of the .gz bytes, for datasets with one canonical source
    classes = ["0 - zero", "1 - one", "2 - two", "3 - three", "4 - four", "5 - five", "6 - six",
               "7 - seven", "8 - eight", "9 - nine"]
    MEAN, STD = 0.1307, 0.3081

    def __init__(self, root=None, train=True, download=True):
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
        folders = [f for r in roots for f in (r, r / self.NAME)]
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

    def _checksum_problem(self, name, path, content):
        """What is wrong with a file's checksum (None if nothing): `name` is the file name the
        checksum is pinned under, `path` the file on disk, `content` its decompressed bytes."""
        base = name[:-3] if name.endswith(".gz") else name
        if base in self.CONTENT_MD5:
            found, expected = hashlib.md5(content).hexdigest(), self.CONTENT_MD5[base]
            what = "decompressed contents"
        elif name.endswith(".gz") and name in self.GZ_MD5:
            found, expected = hashlib.md5(path.read_bytes()).hexdigest(), self.GZ_MD5[name]
            what = "gz file"
        else:
            return None
        return None if found == expected else f"the MD5 of its {what} is {found}, expected " \
                                                f"{expected}"

    def _verify_download(self, tmp, url):
        content = read_file(tmp, name=url)
        problem = self._checksum_problem(url.rsplit("/", 1)[-1], tmp, content)
        if problem:
            raise DataFileError(f"checksum mismatch ({problem})")
        parse_idx(content, url)

    def _load(self, path, ndim) -> np.ndarray:
        content = read_file(path)
        problem = self._checksum_problem(path.name, path, content)
        if problem:
            raise DataFileError(f"{path}: checksum mismatch: {problem}; the file is corrupt or not "
                                f"the {type(self).__name__} file of that name; {_FIX}")
        values = parse_idx(content, str(path))
        if values.ndim != ndim:
            raise DataFileError(f"{path} holds an array of shape {values.shape}, expected "
                                f"{ndim} dims; {_FIX}")
        return values

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        """(image float32 Tensor [1, 28, 28], normalised with MEAN/STD, int label)."""
        with no_grad():
            image = _normalize(tensor(self.images[i][None]), self.MEAN, self.STD)
        return image, int(self.labels[i])

    def __repr__(self):
        split = "train" if self.train else "test"
        return f"{type(self).__name__}({split}, {len(self)} images from {self.folder})"


class FashionMNIST(MNIST):
    """Zalando's Fashion-MNIST: MNIST's format and sizes, 10 kinds of clothing.

    Checksums: the MD5 of each .gz file as published by its one official source (the same bytes
    on every copy of it); plain (decompressed) files are checked for format and size only.
    """

    NAME = "fashion-mnist"
    MIRRORS = ("http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",)
    CONTENT_MD5: dict = {}
    GZ_MD5 = {"train-images-idx3-ubyte.gz": "8d4fb7e6c68d591d4c3dfef9ec88bf0d",
              "train-labels-idx1-ubyte.gz": "25c81989df183df01b3e8a0aad5dffbe",
              "t10k-images-idx3-ubyte.gz": "bef4ecab320f06d8554ea6380940ec79",
              "t10k-labels-idx1-ubyte.gz": "bb300cfdad3c16e7a12a480ee83cd310"}
    classes = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt",
               "Sneaker", "Bag", "Ankle boot"]
    MEAN, STD = 0.2860, 0.3530


class TensorDataset:
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


# ---------------------------------------------------------------------- DataLoader
def _to_device(values, device) -> Tensor:
    if isinstance(values, Tensor):
        return values.detach().to(device)
    return from_numpy(np.ascontiguousarray(values), device=device)


class DataLoader:
    """Batches of a dataset that stays on the device from start to end.

    DataLoader(dataset, batch_size=1, shuffle=False, drop_last=False, device=None,
               normalize=True, flatten=False, limit=None)

    The images go to `device` once, as uint8, and are converted there by our kernels: float32
    / 255, then (x - MEAN) / STD if `normalize` and the dataset has MEAN/STD; `flatten` gives
    [N, H*W] instead of [N, 1, H, W]. Each epoch draws a permutation on the device
    (td.randperm, seeded by td.manual_seed) and every batch is gathered with our gather kernel.
    `limit=n` keeps the first n samples. The resident tensors are `loader.images` and
    `loader.labels` (`loader.tensors` for a TensorDataset).

    Datasets: anything with `images` and `labels` arrays (yields (images, labels)), or a
    TensorDataset (yields one batch per tensor, as given).
    """

    def __init__(self, dataset, batch_size=1, shuffle=False, drop_last=False, device=None,
                 normalize=True, flatten=False, limit=None):
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"DataLoader: batch_size must be a positive int, got {batch_size!r}")
        if limit is not None and (not isinstance(limit, int) or limit < 0):
            raise ValueError(f"DataLoader: limit must be a non-negative int, got {limit!r}")
        self.dataset, self.batch_size = dataset, batch_size
        self.shuffle, self.drop_last = bool(shuffle), bool(drop_last)
        self.device = _device(device)
        self.images = self.labels = None
        with no_grad():
            if isinstance(dataset, TensorDataset):
                self.tensors = tuple(_to_device(t[:limit], self.device) for t in dataset.tensors)
            elif hasattr(dataset, "images") and hasattr(dataset, "labels"):
                images = _to_device(dataset.images[:limit], self.device)
                if images.ndim == 3:  # [N, H, W] -> [N, 1, H, W]
                    images = images.reshape(images.shape[0], 1, *images.shape[1:])
                mean, std = getattr(dataset, "MEAN", None), getattr(dataset, "STD", None)
                self.images = _normalize(images, mean if normalize else None, std)
                if flatten:
                    self.images = self.images.reshape(self.images.shape[0], -1)
                self.labels = _to_device(dataset.labels[:limit], self.device).long()
                if len(self.labels) != len(self.images):
                    raise ValueError(f"DataLoader: the dataset has {len(self.images)} images but "
                                     f"{len(self.labels)} labels")
                self.tensors = (self.images, self.labels)
            else:
                raise TypeError(f"DataLoader: expected a dataset with `images` and `labels` "
                                f"arrays or a TensorDataset, got {type(dataset).__name__}")
        self.num_samples = len(self.tensors[0])
        self._identity = None

    def __len__(self):
        """The number of batches in an epoch."""
        if self.drop_last:
            return self.num_samples // self.batch_size
        return -(-self.num_samples // self.batch_size)

    def permutation(self) -> Tensor:
        """The sample order of one epoch, int64 [N] on the device: a fresh random permutation
        if shuffling (one draw from td.manual_seed's generator), else 0..N-1."""
        if self.shuffle:
            return randperm(self.num_samples, device=self.device)
        if self._identity is None:
            self._identity = arange(self.num_samples, device=self.device)
        return self._identity

    def __iter__(self):
        order = self.permutation()
        for b in range(len(self)):
            index = order[b * self.batch_size:(b + 1) * self.batch_size]
            # NOTE: no_grad must not stay entered across the yield: the loop body trains
            with no_grad():
                batch = tuple(t[index] for t in self.tensors)  # our gather_rows kernel
            yield batch

    def __repr__(self):
        return (f"DataLoader({len(self)} batches of {self.batch_size} from {self.num_samples} "
                f"samples on {self.device}, shuffle={self.shuffle})")


__all__ = ["MNIST", "FashionMNIST", "TensorDataset", "DataLoader", "read_idx", "parse_idx",
           "read_file", "download_file", "DataFileError", "DownloadError", "IDX_TYPES"]


def __getattr__(name):  # a missing PyTorch name says what to use instead (see _hints.py)
    from ._hints import missing
    raise missing(__name__, name, globals())
