"""Data files: reading IDX files (gzipped or plain, checked for truncation and their declared
shape) and downloading a file from a list of mirrors, written atomically and checked against a
pinned checksum. The datasets in data.py find and read their files with these."""
from __future__ import annotations

import gzip
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

_tqdm = ...  # tqdm's bar, imported at the first download (None: not installed, a plain line)

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


def _exact_uint8(values, top, where, what, code) -> np.ndarray:
    """values as uint8 if they are whole numbers in 0..top, else a DataFileError naming the file
    and its element type."""
    whole = np.isfinite(values).all() and (values == np.round(values)).all() \
        if values.dtype.kind == "f" else True
    if not whole or (values.size and (values.min() < 0 or values.max() > top)):
        raise DataFileError(f"{where} stores its {what} as {IDX_TYPES[code].name} (IDX type "
                            f"0x{code:02X}), and not all of them are whole numbers in 0..{top}; "
                            f"{_FIX}")
    return values.astype(np.uint8)


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
    global _tqdm
    if _tqdm is ...:  # imported here, not at `import tritonad`, which never needs it
        try:
            from tqdm import tqdm as _tqdm
        except ImportError:
            _tqdm = None
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
