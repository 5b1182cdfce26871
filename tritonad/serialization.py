"""td.save / td.load: checkpoints as safetensors files (no pickled code), readable elsewhere.

    td.save(model.state_dict(), "model.safetensors")    # safetensors / PyTorch users can read it
    td.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "epoch": 3}, "ckpt.td")
    state = td.load("ckpt.td", map_location="cpu")

File layout: the safetensors format, written and parsed by the `safetensors` package:
    0     header length H, uint64 little endian
    8     the header: H bytes of UTF-8 JSON,
          {name: {"dtype": "F32", "shape": [...], "data_offsets": [begin, end]}, ...,
           "__metadata__": {str: str}}
    8+H   the tensors' bytes, C order, little endian (bfloat16 as safetensors' BF16)
Every tensor and numpy array in the saved object is one named tensor of the file. Its name is
the path of keys that leads to it, joined by "." (a list item's index counts as a key): a state
dict's tensors keep their own keys ("fc.weight"), those of {"model": state_dict} are named
"model.fc.weight"; "#2", "#3", ... is appended where two paths would give one name. So
`safetensors.torch.load_file` reads a saved state dict with the keys that
`torch.nn.Module.load_state_dict` expects. The object around the tensors is kept in the header's
__metadata__ (whose values must be strings):
    "format": "pt"          (the tensors have PyTorch's layouts, as Hugging Face tools expect)
    "tritonad": JSON        {"version": 2, "object": <the saved object, encoded>}
        None, bool, int, float, str, list   as themselves
        tuple                               {"tuple": [items]}
        dict (keys of any of these types)   {"dict": [[key, value], ...]}   (order kept)
        Tensor                              {"tensor": {"name", "dtype", "device",
                                                        "requires_grad", "crc32"}}
        numpy array                         {"ndarray": {"name", "dtype", "crc32"}}
        tritonad dtype                      {"dtype": "float32"}
    "name" is the file tensor holding the values, "crc32" the CRC-32 of its bytes (checked on
    reading, since the format itself has no checksum).
Each tensor is stored on its own (views sharing memory are saved as separate copies).

Reading: a safetensors file without "tritonad" metadata (safetensors.torch.save_file of a torch
state dict, say) loads as {name: Tensor} in the file's order. Files of tritonad's first format
(they start with b"TRITONAD": a preamble, a JSON header, 64-byte aligned data, CRC-32s) are still
read. Writes are atomic: a temporary file beside the target, flushed to disk, renamed over it.
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
import safetensors
import torch

from . import dtypes
from .autodiff import no_grad
from .backend import use_backend
from .tensor import Tensor, _device

VERSION = 2  # of the "tritonad" metadata; format 1 is the first, safetensors-less layout
MAGIC = b"TRITONAD"  # how files of format 1 start
_LEGACY_PREAMBLE = struct.Struct("<8sIQI")  # magic, version, header length, header CRC-32
_LEGACY_ALIGN = 64
_LENGTH = struct.Struct("<Q")  # a safetensors file's header length
_MAX_HEADER = 100_000_000  # the safetensors format's own bound on that length
# tritonad dtype -> the little-endian numpy type of its stored bytes
_STORED = {d.name: d.numpy.newbyteorder("<") for d in dtypes.ALL if d is not dtypes.bfloat16}
_STORED["bfloat16"] = np.dtype("<i2")
# safetensors' dtype codes -> the numpy type of the bytes (BF16: bit patterns, as int16)
_CODES = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "BF16": "<i2", "I64": "<i8", "I32": "<i4",
          "I16": "<i2", "I8": "i1", "U64": "<u8", "U32": "<u4", "U16": "<u2", "U8": "u1",
          "BOOL": "?"}
# safetensors' dtype codes of the types that tritonad tensors have
_TENSOR_CODES = {"F64": dtypes.float64, "F32": dtypes.float32, "F16": dtypes.float16,
                 "BF16": dtypes.bfloat16, "I64": dtypes.int64, "I32": dtypes.int32,
                 "U8": dtypes.uint8, "BOOL": dtypes.bool_}


class CheckpointError(ValueError):
    """A file is not a checkpoint, or is truncated or corrupt."""


# ---------------------------------------------------------------------- save
def save(obj, path) -> None:
    """Write `obj` (nested dict/list/tuple of tensors, numpy arrays, str, int, float, bool,
    None) to `path` as a safetensors file, atomically: a crash mid-write leaves any previous
    file at `path` intact. GPU tensors are copied to the host to be written."""
    path = Path(os.fspath(path))
    arrays = {}  # file tensor name -> (contiguous little-endian numpy array, safetensors dtype)
    tree = _encode(obj, "obj", (), arrays, set())
    metadata = {"format": "pt",
                "tritonad": json.dumps({"version": VERSION, "object": tree},
                                       separators=(",", ":"))}
    _write_atomic(path, lambda tmp: _serialize_file(arrays, tmp, metadata))


def _encode(obj, where, keys, arrays, active):
    """The JSON form of obj; tensor values go into `arrays` under a name made of `keys` (the
    path to obj). `where` names obj for errors; `active` holds the ids of the containers being
    encoded (to catch cycles)."""
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, np.generic) and obj.dtype.kind in "biuf":
        return obj.item()
    if isinstance(obj, dtypes.DType):
        return {"dtype": obj.name}
    if isinstance(obj, Tensor):
        values = _host_values(obj)
        name = _add_array(keys, values, obj.dtype.name, arrays)
        return {"tensor": {"name": name, "dtype": obj.dtype.name, "device": str(obj.device),
                           "requires_grad": obj.requires_grad, "crc32": _crc(values)}}
    if isinstance(obj, np.ndarray):
        if obj.dtype.kind not in "biuf" or obj.dtype.itemsize > 8:
            raise TypeError(f"save: cannot save a numpy array of dtype {obj.dtype} at {where}; "
                            "only bool, integer and floating point arrays (up to 64 bits) can "
                            "be saved")
        stored = obj.dtype.newbyteorder("<") if obj.dtype.itemsize > 1 else obj.dtype
        values = np.ascontiguousarray(obj, dtype=stored).reshape(obj.shape)
        name = _add_array(keys, values, stored.name, arrays)
        return {"ndarray": {"name": name, "dtype": stored.str, "crc32": _crc(values)}}
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
                items.append([_encode(key, f"{where} key {key!r}", keys + (key,), arrays,
                                      active),
                              _encode(value, f"{where}[{key!r}]", keys + (key,), arrays,
                                      active)])
            out = {"dict": items}
        else:
            encoded = [_encode(v, f"{where}[{i}]", keys + (i,), arrays, active)
                       for i, v in enumerate(obj)]
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
    # NOTE: ascontiguousarray makes 0-d arrays 1-d; the reshape keeps the tensor's shape
    return np.ascontiguousarray(values, dtype=_STORED[t.dtype.name]).reshape(t.shape)


def _add_array(keys, values, dtype_name, arrays) -> str:
    """Store values under the name its key path gives (made unique); returns the name."""
    base = ".".join(str(k) for k in keys) if keys else "obj"
    name, n = base, 1
    while name in arrays or name == "__metadata__":
        n += 1
        name = f"{base}#{n}"
    arrays[name] = (values, dtype_name)
    return name


def _crc(values: np.ndarray) -> int:
    return zlib.crc32(values.reshape(-1).view(np.uint8).data)


def _serialize_file(arrays, filename, metadata) -> None:
    """The `safetensors` package writes the file. We hand it our host arrays with their dtype
    names, as safetensors.numpy.save_file does, because numpy has no bfloat16 to name."""
    if hasattr(safetensors, "TensorSpec"):  # safetensors >= 0.8
        specs = {name: safetensors.TensorSpec(dtype=dtype, shape=values.shape,
                                              data_ptr=values.ctypes.data, data_len=values.nbytes)
                 for name, (values, dtype) in arrays.items()}
    else:
        specs = {name: {"dtype": dtype, "shape": list(values.shape), "data": values.tobytes()}
                 for name, (values, dtype) in arrays.items()}
    safetensors.serialize_file(specs, str(filename), metadata=metadata)


def _write_atomic(path: Path, write) -> None:
    """write(tmp) fills a temporary file beside path; flush it to disk, then rename it over
    path. On any failure the temporary file is removed and path is left as it was."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
    try:
        write(tmp)
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
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
    """Read a checkpoint written by `save`, any safetensors file, or a file of tritonad's first
    format.

    map_location: "cpu", "cuda", "cuda:1" or a torch.device puts every tensor there. None (the
    default) puts each tensor where it was saved if that device exists here (a CUDA device
    number this machine lacks becomes the current CUDA device), else on the CPU; the tensors of
    a safetensors file written elsewhere go to the CPU.
    """
    path = Path(os.fspath(path))
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise FileNotFoundError(f"load: checkpoint {path} does not exist") from None
    target = _device(map_location) if map_location is not None else None
    if data[:len(MAGIC)] == MAGIC:
        header, start = _read_legacy_header(data, path)
        leaf = _legacy_leaf(data, start, target, path)
        return _decode_tree(header, "object", leaf, path)
    tensors, metadata = _read_safetensors(data, path)
    if "tritonad" not in metadata:
        device = target or torch.device("cpu")
        return {name: _tensor_of(name, code, values, device, path)
                for name, (code, values) in tensors.items()}
    try:
        header = json.loads(metadata["tritonad"])
        version = int(header["version"])
    except (ValueError, KeyError, TypeError) as err:
        raise CheckpointError(f"{path} is corrupt: unreadable tritonad metadata ({err})") from None
    if version > VERSION:
        raise CheckpointError(f"{path} was written by a newer tritonad (metadata version "
                              f"{version}; this one reads up to {VERSION}); upgrade tritonad")
    return _decode_tree(header, "object", _safetensors_leaf(tensors, target, path), path)


def _read_safetensors(data: bytes, path):
    """({name: (dtype code, little-endian numpy array)}, metadata) of a safetensors file, in
    the header's order, after the checks that make for a clear message."""
    looks_safetensors = len(data) > _LENGTH.size and data[_LENGTH.size:_LENGTH.size + 1] == b"{"
    if not looks_safetensors and (data[:1] == b"\x80" or data[:2] == b"PK"):
        # (a header of 128 + 256k bytes starts with 0x80 too: checked for "{" first)
        raise CheckpointError(f"{path} is not a tritonad checkpoint: it looks like a pickle or "
                              "PyTorch file; tritonad never unpickles (save the state dict "
                              "with safetensors.torch.save_file to bring it over)")
    if len(data) < _LENGTH.size:
        raise CheckpointError(f"{path} is not a checkpoint: {len(data)} bytes, too short for "
                              "a safetensors file")
    (header_len,) = _LENGTH.unpack_from(data)
    end = _LENGTH.size + header_len
    if data[_LENGTH.size:_LENGTH.size + 1] != b"{":
        raise CheckpointError(f"{path} is not a checkpoint: neither a safetensors file (8-byte "
                              f"length, then a JSON header) nor one of tritonad's first format "
                              f"(it starts with {data[:8]!r})")
    if header_len > _MAX_HEADER:
        raise CheckpointError(f"{path} is not a checkpoint: its first 8 bytes give a header of "
                              f"{header_len} bytes, more than a safetensors file allows "
                              f"({_MAX_HEADER})")
    if len(data) < end:
        raise CheckpointError(f"{path} is truncated: the header needs {end} bytes, the file has "
                              f"{len(data)}")
    try:
        header = json.loads(data[_LENGTH.size:end])
        entries = {k: v for k, v in header.items() if k != "__metadata__"}
        size = end + max((int(v["data_offsets"][1]) for v in entries.values()), default=0)
        metadata = header.get("__metadata__") or {}
        if not isinstance(metadata, dict):
            raise TypeError("__metadata__ is not an object")
    except (ValueError, KeyError, TypeError, AttributeError, IndexError) as err:
        raise CheckpointError(f"{path} is corrupt: unreadable safetensors header "
                              f"({type(err).__name__}: {err})") from None
    if len(data) < size:
        raise CheckpointError(f"{path} is truncated: it should be {size} bytes, it has "
                              f"{len(data)}")
    if len(data) > size:
        raise CheckpointError(f"{path} is corrupt: {len(data) - size} unexpected bytes after "
                              "the data")
    try:
        found = dict(safetensors.deserialize(data))
    except Exception as err:  # the package raises its own SafetensorError (and others)
        raise CheckpointError(f"{path} is corrupt: {err}") from None
    tensors = {}
    for name in entries:
        info = found[name]
        code = _code(info["dtype"])
        if code not in _CODES:
            raise CheckpointError(f"{path}: tensor {name!r} has dtype {info['dtype']}, which "
                                  "tritonad cannot hold")
        values = np.frombuffer(info["data"], _CODES[code]).reshape(info["shape"])
        tensors[name] = (code, values)
    return tensors, metadata


def _code(dtype: str) -> str:
    """safetensors' dtype code ("F32") from a code or a name ("float32")."""
    names = {"float64": "F64", "float32": "F32", "float16": "F16", "bfloat16": "BF16",
             "int64": "I64", "int32": "I32", "int16": "I16", "int8": "I8", "uint64": "U64",
             "uint32": "U32", "uint16": "U16", "uint8": "U8", "bool": "BOOL"}
    return names.get(dtype, dtype)


def _tensor_of(name, code, values, device, path) -> Tensor:
    """A Tensor on device owning a copy of a file tensor's values."""
    if code not in _TENSOR_CODES:
        raise CheckpointError(f"{path}: tensor {name!r} has dtype {code}, which tritonad tensors "
                              f"do not have (they have {', '.join(_TENSOR_CODES)})")
    dtype = _TENSOR_CODES[code]
    raw = torch.from_numpy(values.astype(values.dtype.newbyteorder("=")))  # a copy torch owns
    if dtype is dtypes.bfloat16:
        raw = raw.view(torch.bfloat16)
    return Tensor._wrap(raw.to(device))


def _safetensors_leaf(tensors, target, path):
    """Decodes the "tensor" and "ndarray" entries of format 2: the values are file tensors."""
    def leaf(kind, body):
        name = body["name"]
        if name not in tensors:
            raise CheckpointError(f"{path} is corrupt: its metadata names a tensor {name!r} "
                                  "that the file does not hold")
        code, values = tensors[name]
        if "crc32" in body and _crc(np.ascontiguousarray(values)) != int(body["crc32"]):
            raise CheckpointError(f"{path} is corrupt: the bytes of tensor {name!r} do not "
                                  "match their checksum")
        if kind == "ndarray":
            dtype = np.dtype(body["dtype"])
            if dtype.kind not in "biuf" or dtype.newbyteorder("<") != values.dtype:
                raise CheckpointError(f"{path} is corrupt: array {name!r} is stored as {code}, "
                                      f"its metadata says {dtype}")
            return values.astype(dtype.newbyteorder("="))  # a writable native-endian copy
        if _TENSOR_CODES.get(code) is not dtypes.get_dtype(body["dtype"]):
            raise CheckpointError(f"{path} is corrupt: tensor {name!r} is stored as {code}, its "
                                  f"metadata says {body['dtype']}")
        return _placed(_tensor_of(name, code, values, torch.device("cpu"), path), body, target)
    return leaf


def _placed(t: Tensor, body, target) -> Tensor:
    """A loaded host tensor moved to target (or where it was saved) with its requires_grad."""
    out = Tensor._wrap(t._data.to(target if target is not None else _saved_device(body["device"])))
    return out.requires_grad_() if body.get("requires_grad") else out


def _decode_tree(header, key, leaf, path):
    """The saved object from its JSON form; leaf(kind, body) makes tensors and arrays."""
    def decode(node):
        if node is None or isinstance(node, (bool, int, float, str)):
            return node
        if isinstance(node, list):
            return [decode(v) for v in node]
        if not isinstance(node, dict) or len(node) != 1:
            raise CheckpointError(f"{path} is corrupt: unexpected header entry {node!r:.80}")
        (kind, body), = node.items()
        if kind == "tuple":
            return tuple(decode(v) for v in body)
        if kind == "dict":
            return {decode(k): decode(v) for k, v in body}
        if kind == "dtype":
            return dtypes.get_dtype(body)
        if kind in ("tensor", "ndarray"):
            return leaf(kind, body)
        raise CheckpointError(f"{path} is corrupt: unknown entry kind {kind!r}")

    try:
        return decode(header[key])
    except (KeyError, TypeError, ValueError) as err:
        if isinstance(err, CheckpointError):
            raise
        raise CheckpointError(f"{path} is corrupt: its header does not describe a valid object "
                              f"({type(err).__name__}: {err})") from None


# ---------------------------------------------------------------------- format 1 (reading only)
def _read_legacy_header(data: bytes, path):
    """(header dict, offset of the data section) of a format-1 file, after checking everything
    checkable. Format 1: magic b"TRITONAD", version uint32, header length H uint64, CRC-32 of
    the header uint32, H bytes of JSON ({"object", "data_nbytes", "data_crc32"}), then the data
    from the next multiple of 64 (tensor entries carry "offset" and "nbytes" into it)."""
    if len(data) < _LEGACY_PREAMBLE.size:
        raise CheckpointError(f"{path} is truncated: {len(data)} bytes, less than the "
                              f"{_LEGACY_PREAMBLE.size}-byte preamble")
    _, version, header_len, header_crc = _LEGACY_PREAMBLE.unpack_from(data)
    if version != 1:
        raise CheckpointError(f"{path} starts like a tritonad checkpoint of the first format but "
                              f"says it is format {version}; it is corrupt or from an unknown "
                              "tritonad")
    end = _LEGACY_PREAMBLE.size + header_len
    if header_len > _MAX_HEADER:
        raise CheckpointError(f"{path} is not a checkpoint: its first 8 bytes give a header of "
                              f"{header_len} bytes, more than a safetensors file allows "
                              f"({_MAX_HEADER})")
    if len(data) < end:
        raise CheckpointError(f"{path} is truncated: the header needs {end} bytes, the file has "
                              f"{len(data)}")
    header_bytes = data[_LEGACY_PREAMBLE.size:end]
    if zlib.crc32(header_bytes) != header_crc:
        raise CheckpointError(f"{path} is corrupt: the header's checksum does not match")
    try:
        header = json.loads(header_bytes)
        data_nbytes, data_crc = int(header["data_nbytes"]), int(header["data_crc32"])
    except (ValueError, KeyError, TypeError) as err:
        raise CheckpointError(f"{path} is corrupt: unreadable header ({err})") from None
    start = -(-end // _LEGACY_ALIGN) * _LEGACY_ALIGN
    if len(data) < start + data_nbytes:
        raise CheckpointError(f"{path} is truncated: it should be {start + data_nbytes} bytes, "
                              f"it has {len(data)}")
    if len(data) > start + data_nbytes:
        raise CheckpointError(f"{path} is corrupt: {len(data) - start - data_nbytes} unexpected "
                              "bytes after the data")
    if zlib.crc32(memoryview(data)[start:]) != data_crc:
        raise CheckpointError(f"{path} is corrupt: the tensor data's checksum does not match")
    return header, start


def _legacy_leaf(data, start, target, path):
    """Decodes the "tensor" and "ndarray" entries of format 1: byte ranges of the data."""
    def leaf(kind, body):
        if kind == "ndarray":
            dtype = np.dtype(body["dtype"])
            if dtype.kind not in "biuf":
                raise CheckpointError(f"{path} is corrupt: array dtype {dtype} is not allowed")
            return _legacy_values(body, dtype, data, start, path)
        dtype = dtypes.get_dtype(body["dtype"])
        raw = torch.from_numpy(_legacy_values(body, _STORED[dtype.name], data, start, path))
        if dtype is dtypes.bfloat16:
            raw = raw.view(torch.bfloat16)
        return _placed(Tensor._wrap(raw), body, target)
    return leaf


def _legacy_values(body, dtype, data, start, path) -> np.ndarray:
    """A writable array of the stored values that a format-1 entry describes."""
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
