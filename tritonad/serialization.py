"""td.save / td.load: checkpoints in a small, safe format (JSON and raw bytes, no pickled code).

    td.save({"model": model.state_dict(), "epoch": 3}, "ckpt.td")
    state = td.load("ckpt.td", map_location="cpu")

File layout (integers little endian):
    0   magic b"TRITONAD"
    8   format version, uint32
    12  header length H, uint64
    20  CRC-32 of the header, uint32
    24  the header: H bytes of UTF-8 JSON
        the data section, from the next multiple of 64; each tensor starts at a multiple of 64
The header is {"object": <the saved object, encoded>, "data_nbytes": n, "data_crc32": c}:
    None, bool, int, float, str, list   as themselves
    tuple                               {"tuple": [items]}
    dict (keys of any of these types)   {"dict": [[key, value], ...]}   (order kept)
    Tensor                              {"tensor": {"dtype", "shape", "offset", "nbytes",
                                                    "device", "requires_grad"}}
    numpy array                         {"ndarray": {"dtype", "shape", "offset", "nbytes"}}
    tritonad dtype                      {"dtype": "float32"}
Tensor values are stored contiguous, little endian; bfloat16 as its int16 bit patterns.
Each tensor is stored on its own (views sharing memory are saved as separate copies).
"""
from __future__ import annotations

import json
import math
import os
import secrets
import struct
import zlib
from pathlib import Path

import numpy as np
import torch

from . import dtypes
from .autodiff import no_grad
from .backend import use_backend
from .tensor import Tensor, _device

MAGIC = b"TRITONAD"
VERSION = 1
ALIGN = 64
_PREAMBLE = struct.Struct("<8sIQI")  # magic, version, header length, header CRC-32
# tritonad dtype -> the little-endian numpy type of its stored bytes
_STORED = {d.name: d.numpy.newbyteorder("<") for d in dtypes.ALL if d is not dtypes.bfloat16}
_STORED["bfloat16"] = np.dtype("<i2")


class CheckpointError(ValueError):
    """A file is not a tritonad checkpoint, or is truncated or corrupt."""


# ---------------------------------------------------------------------- save
def save(obj, path) -> None:
    """Write `obj` (nested dict/list/tuple of tensors, numpy arrays, str, int, float, bool,
    None) to `path` atomically: a crash mid-write leaves any previous file at `path` intact.
    GPU tensors are copied to the host to be written."""
    path = Path(os.fspath(path))
    blobs = []  # (offset in the data section, little-endian contiguous numpy array)
    tree = _encode(obj, "obj", blobs, set())
    data_nbytes = blobs[-1][0] + blobs[-1][1].nbytes if blobs else 0
    crc = 0
    for chunk in _data_chunks(blobs):
        crc = zlib.crc32(chunk, crc)
    header = json.dumps({"object": tree, "data_nbytes": data_nbytes, "data_crc32": crc},
                        separators=(",", ":")).encode()
    preamble = _PREAMBLE.pack(MAGIC, VERSION, len(header), zlib.crc32(header))
    head = preamble + header
    head += b"\0" * (_aligned(len(head)) - len(head))
    _write_atomic(path, _file_chunks(head, blobs))


def _aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def _encode(obj, where, blobs, active):
    """The JSON form of obj; tensor bytes are appended to blobs. `where` names obj for errors;
    `active` holds the ids of the containers being encoded (to catch cycles)."""
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, np.generic) and obj.dtype.kind in "biuf":
        return obj.item()
    if isinstance(obj, dtypes.DType):
        return {"dtype": obj.name}
    if isinstance(obj, Tensor):
        values = _host_values(obj)
        meta = {"dtype": obj.dtype.name, "shape": list(obj.shape), "device": str(obj.device),
                "requires_grad": obj.requires_grad}
        return {"tensor": _add_blob(values, meta, blobs)}
    if isinstance(obj, np.ndarray):
        if obj.dtype.kind not in "biuf":
            raise TypeError(f"save: cannot save a numpy array of dtype {obj.dtype} at {where}; "
                            "only bool, integer and floating point arrays can be saved")
        stored = obj.dtype.newbyteorder("<") if obj.dtype.itemsize > 1 else obj.dtype
        values = np.ascontiguousarray(obj, dtype=stored)
        meta = {"dtype": stored.str, "shape": list(obj.shape)}
        return {"ndarray": _add_blob(values, meta, blobs)}
    if isinstance(obj, (dict, list, tuple)):
        if id(obj) in active:
            raise ValueError(f"save: {where} contains itself (a circular reference)")
        active.add(id(obj))
        if isinstance(obj, dict):
            items = []
            for key, value in obj.items():
                if not (key is None or isinstance(key, (bool, int, float, str, tuple))):
                    raise TypeError(f"save: cannot save a dict key of type "
                                    f"{type(key).__name__} at {where}[{key!r}]")
                items.append([_encode(key, f"{where} key {key!r}", blobs, active),
                              _encode(value, f"{where}[{key!r}]", blobs, active)])
            out = {"dict": items}
        else:
            encoded = [_encode(v, f"{where}[{i}]", blobs, active) for i, v in enumerate(obj)]
            out = {"tuple": encoded} if isinstance(obj, tuple) else encoded
        active.discard(id(obj))
        return out
    raise TypeError(f"save: cannot save an object of type {type(obj).__name__} at {where}; a "
                    "checkpoint holds tensors, numpy arrays, str, int, float, bool and None in "
                    "nested dicts, lists and tuples (no code, no other objects)")


def _host_values(t: Tensor) -> np.ndarray:
    """t's values as a contiguous little-endian host array (bfloat16 as int16 bits)."""
    raw = t._data.detach()
    if raw.is_cuda and not raw.is_contiguous():
        with no_grad(), use_backend("triton"):  # our copy kernel, not torch's
            raw = t.detach().contiguous()._data
    if raw.dtype == torch.bfloat16:
        raw = raw.view(torch.int16)
    values = raw.cpu().numpy()
    return np.ascontiguousarray(values, dtype=_STORED[t.dtype.name])


def _add_blob(values, meta, blobs):
    offset = _aligned(blobs[-1][0] + blobs[-1][1].nbytes) if blobs else 0
    blobs.append((offset, values))
    return dict(meta, offset=offset, nbytes=values.nbytes)


def _data_chunks(blobs):
    """The data section's bytes: each blob, padded up to the next one's offset."""
    end = 0
    for offset, values in blobs:
        if offset > end:
            yield b"\0" * (offset - end)
        yield values.reshape(-1).view(np.uint8).data
        end = offset + values.nbytes


def _file_chunks(head, blobs):
    yield head
    yield from _data_chunks(blobs)


def _write_atomic(path: Path, chunks) -> None:
    """Write to a temporary file beside path, flush it to disk, then rename it over path."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            for chunk in chunks:
                f.write(chunk)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    try:  # make the rename itself durable
        folder = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(folder)
        finally:
            os.close(folder)
    except OSError:
        pass


# ---------------------------------------------------------------------- load
def load(path, map_location=None):
    """Read a checkpoint written by `save`.

    map_location: "cpu", "cuda", "cuda:1" or a torch.device puts every tensor there. None (the
    default) puts each tensor where it was saved if that device exists here (a CUDA device
    number this machine lacks becomes the current CUDA device), else on the CPU.
    """
    path = Path(os.fspath(path))
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise FileNotFoundError(f"load: checkpoint {path} does not exist") from None
    target = _device(map_location) if map_location is not None else None
    header, start = _read_header(data, path)
    try:
        return _decode(header["object"], data, start, target, path)
    except (KeyError, TypeError, ValueError) as err:
        if isinstance(err, CheckpointError):
            raise
        raise CheckpointError(f"{path} is corrupt: its header does not describe a valid object "
                              f"({type(err).__name__}: {err})") from None


def _read_header(data: bytes, path):
    """(header dict, offset of the data section), after checking everything checkable."""
    if data[:len(MAGIC)] != MAGIC[:len(data)] or not data:
        hint = " (it looks like a pickle or PyTorch file; tritonad never unpickles)" \
            if data[:1] == b"\x80" or data[:2] == b"PK" else ""
        raise CheckpointError(f"{path} is not a tritonad checkpoint: it does not start with "
                              f"{MAGIC!r}{hint}")
    if len(data) < _PREAMBLE.size:
        raise CheckpointError(f"{path} is truncated: {len(data)} bytes, less than the "
                              f"{_PREAMBLE.size}-byte preamble")
    _, version, header_len, header_crc = _PREAMBLE.unpack_from(data)
    if version > VERSION:
        raise CheckpointError(f"{path} was written by a newer tritonad (format {version}; this "
                              f"one reads format {VERSION}); upgrade tritonad")
    end = _PREAMBLE.size + header_len
    if len(data) < end:
        raise CheckpointError(f"{path} is truncated: the header needs {end} bytes, the file has "
                              f"{len(data)}")
    header_bytes = data[_PREAMBLE.size:end]
    if zlib.crc32(header_bytes) != header_crc:
        raise CheckpointError(f"{path} is corrupt: the header's checksum does not match")
    try:
        header = json.loads(header_bytes)
        data_nbytes, data_crc = int(header["data_nbytes"]), int(header["data_crc32"])
    except (ValueError, KeyError, TypeError) as err:
        raise CheckpointError(f"{path} is corrupt: unreadable header ({err})") from None
    start = _aligned(end)
    if len(data) < start + data_nbytes:
        raise CheckpointError(f"{path} is truncated: it should be {start + data_nbytes} bytes, "
                              f"it has {len(data)}")
    if len(data) > start + data_nbytes:
        raise CheckpointError(f"{path} is corrupt: {len(data) - start - data_nbytes} unexpected "
                              "bytes after the data")
    if zlib.crc32(memoryview(data)[start:]) != data_crc:
        raise CheckpointError(f"{path} is corrupt: the tensor data's checksum does not match")
    return header, start


def _decode(node, data, start, target, path):
    if node is None or isinstance(node, (bool, int, float, str)):
        return node
    if isinstance(node, list):
        return [_decode(v, data, start, target, path) for v in node]
    if not isinstance(node, dict) or len(node) != 1:
        raise CheckpointError(f"{path} is corrupt: unexpected header entry {node!r:.80}")
    (kind, body), = node.items()
    if kind == "tuple":
        return tuple(_decode(v, data, start, target, path) for v in body)
    if kind == "dict":
        return {_decode(k, data, start, target, path): _decode(v, data, start, target, path)
                for k, v in body}
    if kind == "dtype":
        return dtypes.get_dtype(body)
    if kind == "ndarray":
        dtype = np.dtype(body["dtype"])
        if dtype.kind not in "biuf":
            raise CheckpointError(f"{path} is corrupt: array dtype {dtype} is not allowed")
        return _values(body, dtype, data, start, path)
    if kind == "tensor":
        dtype = dtypes.get_dtype(body["dtype"])
        raw = torch.from_numpy(_values(body, _STORED[dtype.name], data, start, path))
        if dtype is dtypes.bfloat16:
            raw = raw.view(torch.bfloat16)
        device = target if target is not None else _saved_device(body["device"])
        out = Tensor._wrap(raw.to(device))
        return out.requires_grad_() if body.get("requires_grad") else out
    raise CheckpointError(f"{path} is corrupt: unknown entry kind {kind!r}")


def _values(body, dtype, data, start, path) -> np.ndarray:
    """A writable array of the stored values that `body` describes."""
    shape, offset, nbytes = tuple(int(s) for s in body["shape"]), int(body["offset"]), \
        int(body["nbytes"])
    count = math.prod(shape)
    if nbytes != count * dtype.itemsize or offset < 0 or start + offset + nbytes > len(data):
        raise CheckpointError(f"{path} is corrupt: an entry of shape {shape} and dtype {dtype} "
                              f"claims bytes {offset}..{offset + nbytes} of the data section")
    values = np.frombuffer(data, dtype, count=count, offset=start + offset).reshape(shape)
    return values.astype(dtype.newbyteorder("="))  # a native-endian copy that torch can own


def _saved_device(name) -> torch.device:
    device = torch.device(name)
    if device.type != "cuda" or not torch.cuda.is_available():
        return torch.device("cpu")
    if device.index is not None and device.index >= torch.cuda.device_count():
        return _device("cuda")
    return _device(device)


__all__ = ["save", "load", "CheckpointError", "MAGIC", "VERSION"]
