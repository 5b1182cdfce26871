"""tritonad.data: the IDX parser, MNIST/FashionMNIST files (finding, checking, downloading from a
local HTTP server) and the device-resident DataLoader on both backends."""
import functools
import gzip
import hashlib
import http.server
import os
import re
import shutil
import socket
import struct
import threading
from pathlib import Path

import numpy as np
import pytest

import tritonad as td
from tritonad import data, datafiles
from tritonad.kernels import TritonBackend

from helpers import assert_close

REPO_MNIST = Path(td.__file__).parents[1] / "data" / "mnist"
TRAIN_COUNTS = [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949]
TEST_COUNTS = [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]


# ---------------------------------------------------------------------- references
def idx_bytes(array: np.ndarray, code: int) -> bytes:
    """An IDX file's contents, written independently of the parser: big endian throughout."""
    big = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}[code]
    header = bytes([0, 0, code, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    return header + array.astype(big).tobytes()


def write(path: Path, content: bytes, gz: bool) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(content) if gz else content)
    return path


def normalized(images_uint8, mean, std):
    """torchvision's ToTensor + Normalize in float32."""
    x = images_uint8.astype(np.float32) / np.float32(255)
    return (x - np.float32(mean)) / np.float32(std)


def needs_triton(*primitives):
    missing = [p for p in primitives if p not in vars(TritonBackend)]
    return pytest.mark.skipif(bool(missing), reason=f"triton kernels not written yet: {missing}")


# the triton primitives a DataLoader uses
LOADER_PRIMITIVES = ("copy_", "div", "sub", "randperm", "arange", "gather_rows")


# ---------------------------------------------------------------------- IDX parsing
@pytest.mark.parametrize("code,dtype", [(0x08, np.uint8), (0x09, np.int8), (0x0B, np.int16),
                                        (0x0C, np.int32), (0x0D, np.float32), (0x0E, np.float64)])
@pytest.mark.parametrize("shape", [(7,), (3, 5), (2, 3, 4), (0, 4)])
@pytest.mark.parametrize("gz", [True, False])
def test_read_idx_round_trip(tmp_path, code, dtype, shape, gz):
    rng = np.random.default_rng(0)
    info = np.iinfo(dtype) if np.dtype(dtype).kind in "iu" else None
    values = (rng.integers(info.min, info.max, size=shape, endpoint=True) if info else
              rng.standard_normal(shape) * 1e3).astype(dtype)
    path = write(tmp_path / ("x.idx.gz" if gz else "x.idx"), idx_bytes(values, code), gz)
    got = data.read_idx(path)
    assert got.dtype == np.dtype(dtype) and got.dtype.isnative and got.shape == shape
    np.testing.assert_array_equal(got, values)
    got[...] = 0  # a writable copy, not a view of the file's bytes


def test_read_idx_errors_name_the_file(tmp_path):
    good = idx_bytes(np.arange(60, dtype=np.uint8).reshape(3, 4, 5), 0x08)
    with pytest.raises(FileNotFoundError, match="nothere.gz"):
        data.read_idx(tmp_path / "nothere.gz")
    cases = {
        "cut.gz": (gzip.compress(good)[:-12], "corrupt or truncated gzip"),
        "garbled.gz": (gzip.compress(good)[:10] + b"\xff" * 30 + gzip.compress(good)[40:],
                       "corrupt or truncated gzip"),
        "plain-named.gz": (good, "not a gzip file"),
        "magic.idx": (b"\x12\x34" + good[2:], "bad magic number 0x1234"),
        "typecode.idx": (good[:2] + b"\x07" + good[3:], "bad magic number"),
        "empty.idx": (b"", "bad magic number"),
        "header.idx": (good[:9], "truncated: its header needs 16 bytes"),
        "short.idx": (good[:-1], r"truncated: the header says \(3, 4, 5\)"),
        "long.idx": (good + b"\0", "too long"),
    }
    for name, (content, message) in cases.items():
        (tmp_path / name).write_bytes(content)
        with pytest.raises(data.DataFileError, match=message) as err:
            data.read_idx(tmp_path / name)
        assert name in str(err.value), str(err.value)


# ---------------------------------------------------------------------- the real MNIST files
@pytest.fixture(scope="module")
def mnist_test():
    return data.MNIST(root=REPO_MNIST, train=False, download=False)


def test_real_mnist_files(mnist_test, monkeypatch):
    train = data.MNIST(root=REPO_MNIST, train=True, download=False)
    for ds, n, counts in ((train, 60000, TRAIN_COUNTS), (mnist_test, 10000, TEST_COUNTS)):
        assert ds.images.shape == (n, 28, 28) and ds.images.dtype == np.uint8
        assert ds.labels.shape == (n,) and ds.labels.dtype == np.int64 and len(ds) == n
        assert np.bincount(ds.labels).tolist() == counts
    assert len(train.classes) == 10
    # with no root and no TRITONAD_DATA the repository's copy is used
    monkeypatch.delenv("TRITONAD_DATA", raising=False)
    assert data.MNIST(train=False, download=False).folder.resolve() == REPO_MNIST.resolve()


def test_mnist_getitem(mnist_test):
    image, label = mnist_test[3]
    assert isinstance(image, td.Tensor) and image.shape == (1, 28, 28)
    assert image.dtype is td.float32 and isinstance(label, int) and label == mnist_test.labels[3]
    assert_close(image, normalized(mnist_test.images[3][None], 0.1307, 0.3081), 1e-6, 1e-6)


def test_checksum_mismatch_is_a_clear_error(tmp_path):
    shutil.copy(REPO_MNIST / "t10k-images-idx3-ubyte.gz", tmp_path)
    labels = gzip.decompress((REPO_MNIST / "t10k-labels-idx1-ubyte.gz").read_bytes())
    changed = labels[:100] + bytes([(labels[100] + 1) % 10]) + labels[101:]  # still a valid file
    write(tmp_path / "t10k-labels-idx1-ubyte.gz", changed, gz=True)
    with pytest.raises(data.DataFileError, match="checksum mismatch") as err:
        data.MNIST(root=tmp_path, train=False, download=False)
    message = str(err.value)
    assert "t10k-labels-idx1-ubyte.gz" in message and "27ae3e4e09519cfbb04c329615203637" in message
    assert "delete it" in message


def test_fashion_checks_decompressed_content(tmp_path, monkeypatch):
    """Fashion-MNIST is checked by the MD5 of its decompressed contents, as MNIST: a copy
    recompressed with other gzip settings (other .gz bytes) or decompressed passes; a copy with
    one value changed fails. The pinned checksums are those of small fake files here."""
    images = np.random.default_rng(1).integers(0, 256, (6, 28, 28), dtype=np.uint8)
    labels = np.array([0, 9, 3, 3, 1, 2], dtype=np.uint8)
    content = {"t10k-images-idx3-ubyte": idx_bytes(images, 0x08),
               "t10k-labels-idx1-ubyte": idx_bytes(labels, 0x08)}
    assert set(content) < set(data.FashionMNIST.CONTENT_MD5)
    monkeypatch.setattr(data.FashionMNIST, "CONTENT_MD5",
                        {name: hashlib.md5(c).hexdigest() for name, c in content.items()})
    copies = {"fast": lambda c: gzip.compress(c, compresslevel=1, mtime=0),
              "best": lambda c: gzip.compress(c, compresslevel=9, mtime=12345),
              "plain": lambda c: c}
    gz_bytes = set()
    for kind, compress in copies.items():
        for name, c in content.items():
            suffix = "" if kind == "plain" else ".gz"
            (tmp_path / kind).mkdir(exist_ok=True)
            (tmp_path / kind / (name + suffix)).write_bytes(compress(c))
            gz_bytes.add(hashlib.md5(compress(c)).hexdigest())
        ds = data.FashionMNIST(root=tmp_path / kind, train=False, download=False)
        np.testing.assert_array_equal(ds.images, images)
        assert ds.labels.tolist() == labels.tolist() and ds.classes[9] == "Ankle boot"
    assert len(gz_bytes) == 6  # the copies really differ in their bytes
    assert (ds.MEAN, ds.STD) == (0.2860, 0.3530)
    altered = images.copy()
    altered[3, 14, 14] ^= 1
    write(tmp_path / "altered" / "t10k-images-idx3-ubyte.gz", idx_bytes(altered, 0x08), gz=True)
    write(tmp_path / "altered" / "t10k-labels-idx1-ubyte.gz", content["t10k-labels-idx1-ubyte"],
          gz=True)
    with pytest.raises(data.DataFileError, match="checksum mismatch: the MD5 of its decompressed "
                                                  "contents") as err:
        data.FashionMNIST(root=tmp_path / "altered", train=False, download=False)
    assert "t10k-images-idx3-ubyte.gz" in str(err.value)
    write(tmp_path / "short" / "t10k-images-idx3-ubyte", content["t10k-images-idx3-ubyte"], False)
    write(tmp_path / "short" / "t10k-labels-idx1-ubyte", idx_bytes(labels[:5], 0x08), False)
    monkeypatch.setattr(data.FashionMNIST, "CONTENT_MD5", {})
    with pytest.raises(data.DataFileError, match="6 images but .* 5 labels"):
        data.FashionMNIST(root=tmp_path / "short", train=False, download=False)


def test_files_of_other_element_types(tmp_path):
    """An IDX file of another element type holding MNIST's exact values (int32, int16,
    float32, float64) loads as the uint8 file and passes its checksum; one whose values are not
    whole numbers in range is refused, naming the file and its type."""
    plain = {name: gzip.decompress((REPO_MNIST / (name + ".gz")).read_bytes())
             for name in ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")}
    original = data.MNIST(root=REPO_MNIST, train=False, download=False)
    for code in (0x0B, 0x0C, 0x0D, 0x0E):
        folder = tmp_path / f"type{code}"
        for name, content in plain.items():
            write(folder / name, idx_bytes(data.parse_idx(content), code), gz="labels" in name)
        ds = data.MNIST(root=folder, train=False, download=False)
        assert ds.images.dtype == np.uint8 and ds.labels.dtype == np.int64
        np.testing.assert_array_equal(ds.images, original.images)
        np.testing.assert_array_equal(ds.labels, original.labels)
    images = np.random.default_rng(3).integers(0, 256, (4, 28, 28))
    labels = np.array([1, 2, 3, 4])
    cases = [  # images, their IDX type, labels, theirs: the type named in the error
        (images / 255, 0x0D, labels, 0x08, "pixel values as float32 (IDX type 0x0D)"),
        (images + 256, 0x0C, labels, 0x08, "pixel values as int32 (IDX type 0x0C)"),
        (images, 0x0E, labels + 0.5, 0x0E, "labels as float64 (IDX type 0x0E)"),
        (images, 0x08, -labels, 0x0B, "labels as int16 (IDX type 0x0B)"),
        (images, 0x08, labels + 9, 0x09, "labels as int8 (IDX type 0x09)")]
    for k, (x, x_code, y, y_code, message) in enumerate(cases):
        folder = tmp_path / f"bad{k}"
        write(folder / "tiny-images-idx3-ubyte", idx_bytes(x, x_code), gz=False)
        write(folder / "tiny-labels-idx1-ubyte", idx_bytes(y, y_code), gz=False)
        with pytest.raises(data.DataFileError, match=re.escape(message) + ", and not all") as err:
            Unpinned(root=folder, download=False)
        assert str(folder) in str(err.value)
    labels = labels.astype(np.uint8)
    write(tmp_path / "wide" / "tiny-images-idx3-ubyte", idx_bytes(np.zeros((2, 28, 30),
                                                                            np.uint8), 0x08), False)
    write(tmp_path / "wide" / "tiny-labels-idx1-ubyte", idx_bytes(labels[:2], 0x08), False)
    with pytest.raises(data.DataFileError, match=r"shape \(2, 28, 30\), expected images of shape "
                                                  r"\[N, 28, 28\]"):
        Unpinned(root=tmp_path / "wide", download=False)


# ---------------------------------------------------------------------- finding and downloading
TINY_IMAGES = np.random.default_rng(2).integers(0, 256, (5, 28, 28), dtype=np.uint8)
TINY_LABELS = np.array([4, 0, 9, 1, 1], dtype=np.uint8)
TINY_CONTENT = {"tiny-images-idx3-ubyte": idx_bytes(TINY_IMAGES, 0x08),
                "tiny-labels-idx1-ubyte": idx_bytes(TINY_LABELS, 0x08)}


class Tiny(data.MNIST):
    """MNIST's code path on two small files, checksummed like MNIST (decompressed MD5)."""
    NAME = "tiny"
    FILES = {True: tuple(TINY_CONTENT), False: tuple(TINY_CONTENT)}
    CONTENT_MD5 = {name: hashlib.md5(c).hexdigest() for name, c in TINY_CONTENT.items()}
    MIRRORS = ()


class Unpinned(Tiny):
    """Tiny's files with no checksums: any content of the right form loads."""
    CONTENT_MD5: dict = {}


def write_tiny(folder: Path, gz=True):
    for name, content in TINY_CONTENT.items():
        write(folder / (name + (".gz" if gz else "")), content, gz)


class _Handler(http.server.SimpleHTTPRequestHandler):
    def do_GET(self):
        if self.path.startswith("/short/"):  # promises more bytes than it sends
            self.send_response(200)
            self.send_header("Content-Length", "100000")
            self.end_headers()
            self.wfile.write(b"\x1f\x8b" + b"\0" * 100)
            return
        super().do_GET()

    def log_message(self, *args):
        pass


@pytest.fixture
def server(tmp_path):
    """An HTTP server on 127.0.0.1 serving tmp_path/served; yields its base URL."""
    served = tmp_path / "served"
    served.mkdir()
    httpd = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(_Handler, directory=str(served)))
    thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", served
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture
def closed_port_url():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    return f"http://127.0.0.1:{port}/"


@pytest.fixture
def no_tqdm(monkeypatch):
    monkeypatch.setattr(datafiles, "_tqdm", None)  # the plain bar, whatever is installed


def test_download_falls_back_through_mirrors(tmp_path, server, closed_port_url, monkeypatch,
                                             capsys, no_tqdm):
    url, served = server
    write_tiny(served / "good")
    for name, content in TINY_CONTENT.items():  # valid IDX files with the wrong contents
        write(served / "bad" / (name + ".gz"), content[:-1] + b"\x07", gz=True)
    mirrors = (closed_port_url, f"{url}/missing/", f"{url}/short/", f"{url}/bad/", f"{url}/good/")
    monkeypatch.setattr(Tiny, "MIRRORS", mirrors)
    root = tmp_path / "root"
    ds = Tiny(root=root)
    assert ds.folder == root / "tiny"
    np.testing.assert_array_equal(ds.images, TINY_IMAGES)
    assert ds.labels.tolist() == TINY_LABELS.tolist()
    assert sorted(p.name for p in (root / "tiny").iterdir()) == [n + ".gz" for n in TINY_CONTENT]
    err = capsys.readouterr().err
    assert "downloading tiny-images-idx3-ubyte.gz" in err and "100%" in err
    # once there, nothing is downloaded again
    monkeypatch.setattr(Tiny, "MIRRORS", (closed_port_url,))
    assert Tiny(root=root).labels.tolist() == TINY_LABELS.tolist()


def test_download_failures_are_clear_and_leave_nothing(tmp_path, server, closed_port_url,
                                                       monkeypatch, no_tqdm):
    url, served = server
    write_tiny(served / "bad", gz=False)  # served under the .gz name below, but not gzip
    for name in TINY_CONTENT:
        os.rename(served / "bad" / name, served / "bad" / (name + ".gz"))
    mirrors = (closed_port_url, f"{url}/missing/", f"{url}/short/", f"{url}/bad/")
    monkeypatch.setattr(Tiny, "MIRRORS", mirrors)
    with pytest.raises(data.DownloadError) as err:
        Tiny(root=tmp_path / "root")
    message = str(err.value)
    assert message.startswith("could not download tiny-images-idx3-ubyte.gz from any mirror")
    for mirror in mirrors:
        assert mirror in message
    assert "404" in message and "not a gzip file" in message
    assert f"put the files in {tmp_path / 'root' / 'tiny'}" in message
    assert "--data-dir / TRITONAD_DATA" in message
    assert list((tmp_path / "root" / "tiny").iterdir()) == []  # no partial or unchecked files
    with pytest.raises(FileNotFoundError, match="download=True"):
        Tiny(root=tmp_path / "root", download=False)


def test_download_real_mnist_test_split(tmp_path, server, monkeypatch, capsys, no_tqdm):
    url, served = server
    for name in ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"):
        shutil.copy(REPO_MNIST / name, served / name)
    monkeypatch.setattr(data.MNIST, "MIRRORS", (f"{url}/",))
    monkeypatch.setenv("TRITONAD_DATA", str(tmp_path / "env"))
    ds = data.MNIST(train=False)
    assert ds.folder == tmp_path / "env" / "mnist"
    assert np.bincount(ds.labels).tolist() == TEST_COUNTS
    assert "100% 1.6/1.6 MB" in capsys.readouterr().err


def test_folder_resolution(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("TRITONAD_DATA", raising=False)
    for folder in ("direct", "sub/tiny", "env/tiny", "home/.cache/tritonad/tiny"):
        write_tiny(tmp_path / folder)
    write_tiny(tmp_path / "plain", gz=False)
    assert Tiny(root=tmp_path / "direct").folder == tmp_path / "direct"
    assert Tiny(root=str(tmp_path / "sub")).folder == tmp_path / "sub" / "tiny"
    assert Tiny(root=tmp_path / "plain").files[0].name == "tiny-images-idx3-ubyte"
    # no root: the cache (there is no data/tiny in the repository)
    assert Tiny().folder == tmp_path / "home" / ".cache" / "tritonad" / "tiny"
    # TRITONAD_DATA beats the default places; an explicit root beats TRITONAD_DATA
    monkeypatch.setenv("TRITONAD_DATA", str(tmp_path / "env"))
    assert Tiny().folder == tmp_path / "env" / "tiny"
    assert Tiny(root=tmp_path / "direct").folder == tmp_path / "direct"
    assert data.MNIST.roots() == [tmp_path / "env"]
    monkeypatch.delenv("TRITONAD_DATA")
    assert data.MNIST.roots() == [REPO_MNIST.parent.resolve(),
                                  tmp_path / "home" / ".cache" / "tritonad"]


def test_not_found_says_which_setting_won(tmp_path, monkeypatch, closed_port_url):
    monkeypatch.setenv("TRITONAD_DATA", str(tmp_path / "env"))
    with pytest.raises(FileNotFoundError) as err:
        Tiny(root=tmp_path / "mine", download=False)
    message = str(err.value)
    assert f"looked in {tmp_path / 'mine'}, {tmp_path / 'mine' / 'tiny'}, " \
           f"{tmp_path / 'mine' / 'Tiny' / 'raw'} (the root argument, " \
           f"which takes precedence over TRITONAD_DATA={tmp_path / 'env'})" in message
    assert "pass another root" in message and "\n" not in message
    with pytest.raises(FileNotFoundError, match=r"\(TRITONAD_DATA=.*env\); .* or point "
                                                r"TRITONAD_DATA elsewhere"):
        Tiny(download=False)
    monkeypatch.setattr(Tiny, "MIRRORS", (closed_port_url,))
    with pytest.raises(data.DownloadError, match="the folder came from the root argument, which "
                                                 "takes precedence over TRITONAD_DATA="):
        Tiny(root=tmp_path / "mine")
    monkeypatch.delenv("TRITONAD_DATA")
    with pytest.raises(FileNotFoundError, match=r"\(the root argument\); pass download=True"):
        Tiny(root=tmp_path / "mine", download=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    with pytest.raises(FileNotFoundError, match="the default places: .*pass root= "
                                                r"\(--data-dir\) or set TRITONAD_DATA"):
        Tiny(download=False)


# ---------------------------------------------------------------------- DataLoader
class Indexed:
    """A dataset whose label is the sample's index: batches show which rows were gathered."""
    MEAN, STD = 0.5, 0.25

    def __init__(self, n):
        self.images = np.random.default_rng(n).integers(0, 256, (n, 4, 3), dtype=np.uint8)
        self.labels = np.arange(n)


def check_epoch(loader, dataset, batch_sizes, flat=False, in_order=False):
    """Every batch has the right shapes, dtypes and values; returns the labels in order.
    The rows a batch should hold are named by its labels (Indexed) or in_order."""
    reference = normalized(dataset.images, dataset.MEAN, dataset.STD)
    batches = list(loader)
    assert [len(y) for _, y in batches] == batch_sizes and len(loader) == len(batch_sizes)
    start = 0
    for x, y in loader:
        assert td.is_grad_enabled()  # the loop body may train
        break
    for x, y in batches:
        assert x.dtype is td.float32 and y.dtype is td.int64 and x.device == loader.device
        shape = (reference.shape[1] * reference.shape[2],) if flat else (1,) + reference.shape[1:]
        assert x.shape == (len(y),) + shape
        rows = np.arange(start, start + len(y)) if in_order else y.numpy()
        assert_close(x, reference[rows].reshape(x.shape), 1e-6, 1e-6, name="batch")
        assert_close(y, dataset.labels[rows], name="labels")
        start += len(y)
    return np.concatenate([y.numpy() for _, y in batches])


def test_loader_mnist_batches(mnist_test):
    loader = td.data.DataLoader(mnist_test, batch_size=256, limit=1000)
    assert loader.images.shape == (1000, 1, 28, 28) and loader.labels.shape == (1000,)
    labels = check_epoch(loader, mnist_test, [256, 256, 256, 232], in_order=True)
    np.testing.assert_array_equal(labels, mnist_test.labels[:1000])  # unshuffled: in order
    x, _ = next(iter(loader))
    assert_close(x, normalized(mnist_test.images[:256, None], 0.1307, 0.3081), 1e-6, 1e-6)
    dropped = td.data.DataLoader(mnist_test, batch_size=256, limit=1000, drop_last=True)
    check_epoch(dropped, mnist_test, [256, 256, 256], in_order=True)


def test_loader_shuffles_a_new_permutation_each_epoch():
    ds = Indexed(50)
    td.manual_seed(7)
    loader = td.data.DataLoader(ds, batch_size=8, shuffle=True)
    first = check_epoch(loader, ds, [8] * 6 + [2])
    second = check_epoch(loader, ds, [8] * 6 + [2])
    assert sorted(first) == list(range(50)) and sorted(second) == list(range(50))
    assert not np.array_equal(first, second) and not np.array_equal(first, np.arange(50))
    td.manual_seed(7)
    np.testing.assert_array_equal(check_epoch(loader, ds, [8] * 6 + [2]), first)
    td.manual_seed(7)
    assert loader.permutation().tolist() == first.tolist()
    dropped = td.data.DataLoader(ds, batch_size=8, shuffle=True, drop_last=True)
    assert len(set(check_epoch(dropped, ds, [8] * 6))) == 48


def test_loader_options_and_errors():
    ds = Indexed(10)
    flat = td.data.DataLoader(ds, batch_size=4, flatten=True)
    check_epoch(flat, ds, [4, 4, 2], flat=True)
    raw = td.data.DataLoader(ds, batch_size=10, normalize=False)
    assert_close(next(iter(raw))[0], ds.images[:, None] / np.float32(255), 1e-7, 1e-7)
    big = td.data.DataLoader(ds, batch_size=64)
    assert len(big) == 1 and len(td.data.DataLoader(ds, batch_size=64, drop_last=True)) == 0
    with pytest.raises(ValueError, match="batch_size"):
        td.data.DataLoader(ds, batch_size=0)
    with pytest.raises(TypeError, match=r"expected a dataset \(a class with __getitem__ and "
                                        r"__len__, or with __iter__\), got int"):
        td.data.DataLoader(42)


def test_tensor_dataset_loader():
    x = np.arange(14, dtype=np.float32).reshape(7, 2)
    y = td.tensor([0, 1, 0, 1, 1, 0, 1])
    ds = td.data.TensorDataset(x, y)
    assert len(ds) == 7 and ds[2][0].tolist() == [4.0, 5.0]
    td.manual_seed(3)
    batches = list(td.data.DataLoader(ds, batch_size=3, shuffle=True))
    assert [len(b[1]) for b in batches] == [3, 3, 1]
    rows = np.concatenate([b[0].numpy() for b in batches])
    assert sorted(rows[:, 0].tolist()) == x[:, 0].tolist()
    index = (rows[:, 0] // 2).astype(int)
    np.testing.assert_array_equal(np.concatenate([b[1].numpy() for b in batches]),
                                  y.numpy()[index])
    with pytest.raises(ValueError, match="differ in length"):
        td.data.TensorDataset(x, y[:3])


@needs_triton(*LOADER_PRIMITIVES)
def test_loader_on_triton_backend(mnist_test):
    with td.use_backend("triton"):
        td.manual_seed(0)
        ds = Indexed(20)
        loader = td.data.DataLoader(ds, batch_size=8, shuffle=True)
        labels = check_epoch(loader, ds, [8, 8, 4])
        assert sorted(labels) == list(range(20))
        mnist = td.data.DataLoader(mnist_test, batch_size=16, limit=24)
        np.testing.assert_array_equal(check_epoch(mnist, mnist_test, [16, 8], in_order=True),
                                      mnist_test.labels[:24])


@pytest.mark.gpu
def test_loader_full_mnist_on_gpu():
    train = data.MNIST(train=True)
    with td.use_backend("triton"):
        loader = td.data.DataLoader(train, batch_size=128, shuffle=True, device="cuda")
        assert loader.images.device.type == "cuda" and loader.images.shape == (60000, 1, 28, 28)
        td.manual_seed(0)
        order = loader.permutation().numpy()
        assert sorted(order.tolist()) == list(range(60000))
        td.manual_seed(0)  # the epoch below draws the same permutation
        seen = []
        for b, (x, y) in enumerate(loader):
            rows = order[b * 128:(b + 1) * 128]
            assert_close(y, train.labels[rows], name="labels")
            if b % 100 == 0:
                assert_close(x, normalized(train.images[rows][:, None], 0.1307, 0.3081),
                             1e-6, 1e-6)
            seen.append(y.numpy())
        assert len(seen) == len(loader) == 469
        assert np.bincount(np.concatenate(seen)).tolist() == TRAIN_COUNTS


def test_torchvision_data_folder_works_as_it_is(tmp_path):
    """A PyTorch user's data folder (torchvision keeps root/MNIST/raw/<plain IDX files>) is read
    in place, with the checksums of the shipped copy."""
    raw = tmp_path / "MNIST" / "raw"
    raw.mkdir(parents=True)
    for name in ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"):
        (raw / name).write_bytes(gzip.decompress((REPO_MNIST / (name + ".gz")).read_bytes()))
    ds = data.MNIST(root=tmp_path, train=False, download=False)
    assert ds.folder == raw and len(ds.images) == 10000
    np.testing.assert_array_equal(ds.labels, data.MNIST(root=REPO_MNIST, train=False,
                                                        download=False).labels)
    with pytest.raises(FileNotFoundError, match="FashionMNIST/raw"):
        data.FashionMNIST(root=tmp_path, train=False, download=False)
