"""td.save / td.load (tritonad.serialization): round trips, atomic writes, clear errors."""
import json
import math
import os
import struct
import zlib

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import tritonad as td
from tritonad import serialization
from tritonad.serialization import CheckpointError, load, save

from conftest import HAS_GPU


def assert_same(a, b, where="obj"):
    """Equal structure, types and values (tensors: dtype, shape, device, requires_grad, bits)."""
    assert type(a) is type(b) or (isinstance(a, td.Tensor) and isinstance(b, td.Tensor)), \
        f"{where}: {type(a).__name__} != {type(b).__name__}"
    if isinstance(a, td.Tensor):
        assert (a.dtype, a.shape, a.requires_grad) == (b.dtype, b.shape, b.requires_grad), where
        bits = (lambda t: t.torch().detach().cpu().view(torch.int16).numpy()) \
            if a.dtype is td.bfloat16 else (lambda t: t.numpy())
        np.testing.assert_array_equal(bits(a), bits(b), err_msg=where)
    elif isinstance(a, np.ndarray):
        assert a.dtype.newbyteorder("=") == b.dtype and a.shape == b.shape, where
        np.testing.assert_array_equal(a, b, err_msg=where)
    elif isinstance(a, dict):
        assert list(a) == list(b), where
        for k in a:
            assert_same(a[k], b[k], f"{where}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{where}[{i}]")
    elif isinstance(a, float) and math.isnan(a):
        assert math.isnan(b), where
    else:
        assert a == b, where


def training_state():
    """What a training run saves: weights of several dtypes, optimizer state, counters."""
    weight = td.randn(4, 3, requires_grad=True)
    return {
        "model": {"fc.weight": weight, "fc.bias": td.zeros(4), "half": td.randn(2, 3).half(),
                  "bf16": td.tensor([1.0, -2.5, 3.14159, 1e-30, float("inf")]).bfloat16(),
                  "steps": td.arange(5), "mask": td.tensor([True, False, True]),
                  "bytes": td.tensor(np.arange(6, dtype=np.uint8)), "i32": td.arange(3).int(),
                  "scalar": td.tensor(0.5), "empty": td.zeros(0, 3),
                  "transposed": td.randn(3, 5).T, "sliced": td.arange(20)[3:15:4]},
        "optimizer": {"state": {0: {"step": 10, "exp_avg": td.randn(4, 3)}, 1: {"step": 10}},
                      "param_groups": [{"lr": 0.01, "betas": (0.9, 0.999), "params": [0, 1],
                                        "nesterov": False, "weight_decay": 0.0}]},
        "epoch": 3, "best": float("nan"), "big": 2 ** 64 + 1, "name": "mlp — ünïcode",
        "none": None, "nested": [[1, (2, 3)], {"a": []}, ()], (1, "x"): "tuple key",
        "rng": td.get_rng_state(), "dtype": td.bfloat16,
        "array": np.arange(12, dtype=">i4").reshape(3, 4), "bools": np.array([True, False]),
    }


def test_round_trip_of_a_training_state(tmp_path):
    state = training_state()
    save(state, tmp_path / "ckpt.td")
    back = load(str(tmp_path / "ckpt.td"))
    assert_same(state, back)
    assert back["model"]["fc.weight"].is_leaf and back["model"]["fc.weight"].requires_grad
    assert back["array"].dtype == np.dtype("int32") and back["array"].dtype.isnative
    back["model"]["fc.bias"].add_(1.0)  # loaded tensors own writable memory
    back["array"][0, 0] = 7


def test_the_file_is_safetensors(tmp_path):
    """The layout by hand: 8-byte header length, JSON header, raw little-endian bytes."""
    save({"w": td.tensor([1.0, 2.0, 3.0]), "k": "v", "inner": [td.arange(2)]}, tmp_path / "c.td")
    raw = (tmp_path / "c.td").read_bytes()
    (header_len,) = struct.unpack_from("<Q", raw)
    header = json.loads(raw[8:8 + header_len])
    assert header["w"]["dtype"] == "F32" and header["w"]["shape"] == [3]
    begin, end = header["w"]["data_offsets"]
    assert np.frombuffer(raw[8 + header_len + begin:8 + header_len + end], "<f4").tolist() == \
        [1, 2, 3]
    assert header["inner.0"]["dtype"] == "I64"  # named by the path of keys to it
    meta = header["__metadata__"]
    assert meta["format"] == "pt"
    tree = json.loads(meta["tritonad"])
    assert tree["version"] == serialization.VERSION
    (key, tensor), (_, value), _ = tree["object"]["dict"]
    assert key == "w" and tensor["tensor"]["name"] == "w" and value == "v"


def test_resume_continues_the_random_stream(tmp_path):
    td.manual_seed(11)
    td.rand(5)
    save({"rng": td.get_rng_state()}, tmp_path / "rng.td")
    expected = td.rand(4).numpy()
    td.manual_seed(0)
    td.set_rng_state(load(tmp_path / "rng.td")["rng"])
    np.testing.assert_array_equal(td.rand(4).numpy(), expected)


def test_training_resumes_exactly(tmp_path):
    """Two runs: 4 steps straight, and 2 steps + checkpoint + a fresh process's 2 steps."""
    from tritonad import nn, optim

    def run(steps, model=None, opt=None):
        model = model or nn.Sequential(nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 3))
        opt = opt or optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        for _ in range(steps):
            x, y = td.randn(8, 6), (td.rand(8) * 3).long()
            opt.zero_grad()
            td.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
        return model, opt

    td.manual_seed(0)
    straight, _ = run(4)
    td.manual_seed(0)
    model, opt = run(2)
    save({"model": model.state_dict(), "optimizer": opt.state_dict(), "epoch": 2,
          "rng": td.get_rng_state()}, tmp_path / "resume.td")
    td.manual_seed(123)  # a new process: other weights, other random state
    fresh = nn.Sequential(nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 3))
    fresh_opt = optim.SGD(fresh.parameters(), lr=0.1, momentum=0.9)
    state = load(tmp_path / "resume.td")
    fresh.load_state_dict(state["model"])
    fresh_opt.load_state_dict(state["optimizer"])
    td.set_rng_state(state["rng"])
    resumed, _ = run(2, fresh, fresh_opt)
    for (name, a), (_, b) in zip(straight.state_dict().items(), resumed.state_dict().items()):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-6, err_msg=name)


def nested_values():
    scalars = st.none() | st.booleans() | st.integers(-2 ** 70, 2 ** 70) | \
        st.floats(width=32, allow_subnormal=False) | st.text(max_size=5)
    arrays = st.builds(lambda shape, dtype, seed: np.random.default_rng(seed).normal(
        size=shape).astype(dtype), st.sampled_from([(), (0,), (3,), (2, 3), (1, 2, 2)]),
        st.sampled_from(["float32", "float16", "int64", "uint8", "bool"]), st.integers(0, 99))
    tensors = st.builds(lambda a, bf16: td.tensor(a).bfloat16() if bf16 and a.dtype.kind == "f"
                        else td.tensor(a), arrays, st.booleans())
    leaves = scalars | arrays | tensors
    return st.recursive(leaves, lambda inner: st.lists(inner, max_size=3) |
                        st.tuples(inner, inner) |
                        st.dictionaries(st.text(max_size=3) | st.integers(0, 9), inner,
                                        max_size=3), max_leaves=8)


@given(nested_values())
def test_round_trip_property(tmp_path_factory, obj):
    path = tmp_path_factory.mktemp("prop") / "x.td"
    save(obj, path)
    assert_same(obj, load(path))


# ---------------------------------------------------------------------- atomic writes
def leftovers(folder):
    return sorted(p.name for p in folder.iterdir() if p.name != "ckpt.td")


def test_a_failed_save_leaves_the_previous_file_intact(tmp_path, monkeypatch):
    path = tmp_path / "ckpt.td"
    save({"epoch": 1, "w": td.ones(1000)}, path)
    before = path.read_bytes()
    original = serialization._serialize_file

    def interrupted(arrays, filename, metadata):  # the process dies halfway through the data
        original(arrays, filename, metadata)
        with open(filename, "r+b") as f:
            f.truncate(os.path.getsize(filename) // 2)
        raise KeyboardInterrupt

    monkeypatch.setattr(serialization, "_serialize_file", interrupted)
    with pytest.raises(KeyboardInterrupt):
        save({"epoch": 2, "w": td.zeros(1000)}, path)
    monkeypatch.undo()

    def disk_full(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", disk_full)
    with pytest.raises(OSError, match="No space"):
        save({"epoch": 3, "w": td.zeros(1000)}, path)
    monkeypatch.undo()
    with pytest.raises(TypeError):  # refused before anything is written
        save({"epoch": 4, "w": object()}, path)
    assert path.read_bytes() == before and leftovers(tmp_path) == []
    assert load(path)["epoch"] == 1
    save({"epoch": 5}, path)  # a save that succeeds replaces it
    assert load(path) == {"epoch": 5} and leftovers(tmp_path) == []


# ---------------------------------------------------------------------- errors
def test_unsupported_objects_name_their_place(tmp_path):
    cases = [({"model": {"layers": [1, object()]}}, TypeError,
              r"type object at obj\['model'\]\['layers'\]\[1\]"),
             ({"f": lambda x: x}, TypeError, r"type function at obj\['f'\]"),
             ({"a": {frozenset(): 1}}, TypeError, r"dict key of type frozenset at obj\['a'\]"),
             ({"a": np.array(["x"], dtype=object)}, TypeError, r"dtype object at obj\['a'\]"),
             ({"a": {1, 2}}, TypeError, "type set"),
             (torch.zeros(2), TypeError, "type Tensor at obj")]
    looped = [1]
    looped.append({"again": looped})
    cases.append((looped, ValueError, "circular"))
    for obj, kind, message in cases:
        with pytest.raises(kind, match=message):
            save(obj, tmp_path / "x.td")
    assert list(tmp_path.iterdir()) == []


def test_bad_files_are_clear_errors(tmp_path):
    path = tmp_path / "good.td"
    save({"w": td.randn(100), "note": "hello"}, path)
    good = path.read_bytes()
    (header_len,) = struct.unpack_from("<Q", good)
    data_start = 8 + header_len
    header = json.loads(good[8:data_start])

    def with_header(changed):
        text = json.dumps(changed).encode()
        return struct.pack("<Q", len(text)) + text + good[data_start:]

    lying = dict(header, w=dict(header["w"], shape=[50]))  # 50 floats claiming 400 bytes
    meta = json.loads(header["__metadata__"]["tritonad"])
    meta["object"]["dict"][0][1]["tensor"]["name"] = "x"
    missing = dict(header, __metadata__=dict(header["__metadata__"],
                                             tritonad=json.dumps(meta)))
    newer = dict(header, __metadata__=dict(header["__metadata__"],
                                           tritonad=json.dumps(dict(meta, version=99))))
    cases = {
        "text.td": (b"hello world, not a checkpoint", "not a checkpoint: neither a safetensors"),
        "empty.td": (b"", "not a checkpoint: 0 bytes"),
        "torch.pt": (b"PK\x03\x04" + b"\0" * 40, "PyTorch file; tritonad never unpickles"),
        "pickle.pkl": (b"\x80\x04\x95" + b"\0" * 40, "never unpickles"),
        "stub.td": (good[:6], "0 bytes|6 bytes, too short"),
        "header-cut.td": (good[:30], "truncated: the header needs"),
        "data-cut.td": (good[:-5], "truncated: it should be"),
        "trailing.td": (good + b"\0", "1 unexpected bytes after the data"),
        "header-garbled.td": (good[:8] + b"{!" + good[10:], "corrupt: unreadable safetensors"),
        "data-flip.td": (good[:data_start + 7] + bytes([good[data_start + 7] ^ 4]) +
                         good[data_start + 8:], "corrupt: the bytes of tensor 'w' do not match"),
        "lying.td": (with_header(lying), "lying.td is corrupt: "),  # in the package's words
        "missing.td": (with_header(missing), "names a tensor 'x' that the file does not hold"),
        "newer.td": (with_header(newer), "newer tritonad"),
    }
    for name, (content, message) in cases.items():
        (tmp_path / name).write_bytes(content)
        with pytest.raises(CheckpointError, match=message) as err:
            load(tmp_path / name)
        assert name in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(FileNotFoundError, match="absent.td"):
        load(tmp_path / "absent.td")


# ---------------------------------------------------------------------- tritonad's first format
def legacy_file(obj_tree, blobs):
    """A file of format 1, written from its description (independently of the reader): magic,
    version 1, header length, header CRC-32, JSON header, data from the next multiple of 64."""
    data = b"".join(blobs)
    header = json.dumps({"object": obj_tree, "data_nbytes": len(data),
                         "data_crc32": zlib.crc32(data)}).encode()
    head = struct.pack("<8sIQI", b"TRITONAD", 1, len(header), zlib.crc32(header)) + header
    return head + b"\0" * (-len(head) % 64) + data


def test_the_first_format_is_still_read(tmp_path):
    w = np.float32([1.5, -2.0, 3.25])
    bf16 = np.array([0x3FC0, 0xC020], "<u2")  # bfloat16 bits of 1.5 and -2.5
    arr = np.arange(6, dtype="<i2").reshape(2, 3)
    tree = {"dict": [["w", {"tensor": {"dtype": "float32", "shape": [3], "device": "cuda:3",
                                       "requires_grad": True, "offset": 0, "nbytes": 12}}],
                     ["b", {"tensor": {"dtype": "bfloat16", "shape": [2], "device": "cpu",
                                       "requires_grad": False, "offset": 64, "nbytes": 4}}],
                     ["arr", {"ndarray": {"dtype": "<i2", "shape": [2, 3], "offset": 128,
                                          "nbytes": 12}}],
                     ["meta", {"tuple": [1, "x", None, {"dtype": "float16"}]}]]}
    blobs = [w.tobytes() + b"\0" * 52, bf16.tobytes() + b"\0" * 60, arr.tobytes()]
    (tmp_path / "old.td").write_bytes(legacy_file(tree, blobs))
    back = load(tmp_path / "old.td", map_location="cpu")
    assert list(back) == ["w", "b", "arr", "meta"]
    assert back["w"].tolist() == [1.5, -2.0, 3.25] and back["w"].requires_grad
    assert back["b"].dtype is td.bfloat16 and back["b"].float().tolist() == [1.5, -2.5]
    np.testing.assert_array_equal(back["arr"], arr)
    assert back["meta"] == (1, "x", None, td.float16)
    good = legacy_file(tree, blobs)
    header_len = struct.unpack_from("<Q", good, 12)[0]
    data_start = -(-(24 + header_len) // 64) * 64
    liar = {"tensor": {"dtype": "float32", "shape": [1000], "offset": 0, "nbytes": 4000,
                       "device": "cpu"}}
    cases = {
        "preamble.td": (good[:20], "truncated: 20 bytes"),
        "header-cut.td": (good[:30], "truncated: the header needs"),
        "data-cut.td": (good[:-5], "truncated: it should be"),
        "header-flip.td": (good[:30] + bytes([good[30] ^ 1]) + good[31:],
                           "corrupt: the header's checksum"),
        "data-flip.td": (good[:data_start + 7] + bytes([good[data_start + 7] ^ 4]) +
                         good[data_start + 8:], "corrupt: the tensor data's checksum"),
        "version.td": (good[:8] + struct.pack("<I", 99) + good[12:], "says it is format 99"),
        "liar.td": (legacy_file(liar, []), "corrupt: an entry of shape"),
    }
    for name, (content, message) in cases.items():
        (tmp_path / name).write_bytes(content)
        with pytest.raises(CheckpointError, match=message) as err:
            load(tmp_path / name)
        assert name in str(err.value)


# ---------------------------------------------------------------------- other programs' files
def test_tensor_names_follow_the_keys(tmp_path):
    from safetensors.numpy import load_file

    state = {"model": {"fc.weight": td.ones(2)}, "model.fc": {"weight": td.zeros(2)},
             "runs": [td.arange(3), {"x": np.int8([1, -1])}], "int keys": {0: td.ones(1)}}
    save(state, tmp_path / "n.td")
    names = load_file(tmp_path / "n.td")
    assert sorted(names) == ["int keys.0", "model.fc.weight", "model.fc.weight#2", "runs.0",
                             "runs.1.x"]
    assert names["model.fc.weight#2"].tolist() == [0, 0] and names["runs.1.x"].dtype == np.int8
    assert_same(state, load(tmp_path / "n.td"))


def test_pytorch_reads_tritonad_weights(tmp_path):
    """A tritonad Linear / Conv2d state dict loads into the torch.nn module of the same shape,
    which then computes what the tritonad module computes."""
    from safetensors.torch import load_file

    from tritonad import nn

    td.manual_seed(2)
    x = np.random.default_rng(0).standard_normal((2, 3, 9, 8)).astype(np.float32)
    for ours, theirs, inputs in (
            (nn.Linear(8, 5), torch.nn.Linear(8, 5), x[:, 0, 0]),
            (nn.Conv2d(3, 4, 3, padding=1), torch.nn.Conv2d(3, 4, 3, padding=1), x)):
        save(ours.state_dict(), tmp_path / "w.safetensors")
        theirs.load_state_dict(load_file(tmp_path / "w.safetensors"))
        expected = ours(td.tensor(inputs)).numpy()
        np.testing.assert_allclose(theirs(torch.from_numpy(inputs)).detach().numpy(), expected,
                                   rtol=1e-5, atol=1e-5)


def test_tritonad_reads_pytorch_weights(tmp_path):
    from safetensors.torch import save_file

    from tritonad import nn

    torch.manual_seed(0)
    theirs = torch.nn.Sequential(torch.nn.Linear(6, 4), torch.nn.ReLU(), torch.nn.Linear(4, 3))
    save_file(theirs.state_dict(), tmp_path / "torch.safetensors")
    ours = nn.Sequential(nn.Linear(6, 4), nn.ReLU(), nn.Linear(4, 3))
    state = load(tmp_path / "torch.safetensors")
    assert sorted(state) == ["0.bias", "0.weight", "2.bias", "2.weight"]
    assert all(t.device.type == "cpu" and t.dtype is td.float32 for t in state.values())
    ours.load_state_dict(state)
    x = np.random.default_rng(1).standard_normal((5, 6)).astype(np.float32)
    np.testing.assert_allclose(ours(td.tensor(x)).numpy(),
                               theirs(torch.from_numpy(x)).detach().numpy(), rtol=1e-5, atol=1e-6)
    # every dtype a tritonad tensor has comes over bit for bit; others are a clear error
    tensors = {"bf16": torch.tensor([1.5, -2.5e-20]).bfloat16(), "f16": torch.tensor([0.1]).half(),
               "f64": torch.tensor([1 / 3], dtype=torch.float64), "i32": torch.tensor([-7]).int(),
               "u8": torch.tensor([255], dtype=torch.uint8), "b": torch.tensor([True, False])}
    save_file(tensors, tmp_path / "dtypes.safetensors")
    back = load(tmp_path / "dtypes.safetensors")
    for name, t in tensors.items():
        assert back[name].dtype is td.dtypes.get_dtype(t.dtype), name
        assert back[name].torch().view(torch.uint8).tolist() == t.view(torch.uint8).tolist()
    save_file({"odd": torch.tensor([1, 2], dtype=torch.int16)}, tmp_path / "odd.safetensors")
    with pytest.raises(CheckpointError, match="odd.safetensors: tensor 'odd' has dtype I16"):
        load(tmp_path / "odd.safetensors")


# ---------------------------------------------------------------------- devices
def test_map_location_cpu(tmp_path):
    on_cpu = {"w": td.tensor([1.0, 2.0, 3.0], device="cpu"),
              "b": td.tensor(np.float32([0.5, -1.0]), dtype=td.bfloat16, device="cpu")}
    save(on_cpu, tmp_path / "c.td")
    for where in ("cpu", torch.device("cpu"), None):
        back = load(tmp_path / "c.td", map_location=where)
        assert back["w"].device.type == "cpu" and back["b"].dtype is td.bfloat16
    if not HAS_GPU:
        with pytest.raises(RuntimeError, match="CUDA is not available"):
            load(tmp_path / "c.td", map_location="cuda")


@pytest.mark.gpu
def test_cuda_tensors_round_trip(tmp_path):
    with td.use_backend("triton"):
        state = {"w": td.randn(64, 33, device="cuda"),
                 "t": td.randn(33, 64, device="cuda").bfloat16().T,  # non-contiguous bf16
                 "i": td.arange(10, device="cuda"), "c": td.tensor([1.0, 2.0], device="cpu")}
        save(state, tmp_path / "gpu.td")
        back = load(tmp_path / "gpu.td")
        assert [back[k].device.type for k in "wtic"] == ["cuda", "cuda", "cuda", "cpu"]
        assert_same(state, back)
        on_cpu = load(tmp_path / "gpu.td", map_location="cpu")
        assert all(t.device.type == "cpu" for t in on_cpu.values())
        assert_same({k: v.cpu() for k, v in state.items()}, on_cpu)
        on_gpu = load(tmp_path / "gpu.td", map_location="cuda")
        assert all(t.device.type == "cuda" for t in on_gpu.values())
