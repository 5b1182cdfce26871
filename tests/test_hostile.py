"""Hostile inputs: what a careless or unlucky user feeds the API and the command line.

Every mistake must end in an error of the right type whose message names the op, the option or
the file; the command line must exit with status 2 and one line `error: ...` on stderr, no
traceback. Edge values (empty tensors, NaN, inf) must give what PyTorch gives, on both backends.
The command line runs in-process on the numpy backend with tiny --limit runs, so this file stays
fast.
"""
import gzip
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import tritonad as td
import tritonad.nn.functional as F
from helpers import assert_close, cli_error
from tritonad import cli, data, datafiles, nn, optim, serialization, train

REPO = Path(td.__file__).resolve().parents[1]
MNIST = REPO / "data" / "mnist"


# ---------------------------------------------------------------------- the API: wrong arguments
def _linear():
    return nn.Linear(2, 3)


API_MISTAKES = [  # (what, call, error type, regex the message must match: it names the op)
    ("randperm(-1)", lambda: td.randperm(-1), ValueError, "randperm: n must be non-negative"),
    ("randperm(2.5)", lambda: td.randperm(2.5), TypeError, "randperm: n must be an int"),
    ("zeros(-1)", lambda: td.zeros(-1), ValueError, r"zeros: negative dimension in shape \(-1,\)"),
    ("ones(2.5)", lambda: td.ones(2.5), TypeError, "ones: sizes must be integers"),
    ("full((2, -3))", lambda: td.full((2, -3), 1.0), ValueError, "full: negative dimension"),
    ("empty('a')", lambda: td.empty("a"), TypeError, "empty: sizes must be integers"),
    ("randn(-2, 3)", lambda: td.randn(-2, 3), ValueError, "randn: negative dimension"),
    ("rand(1.5)", lambda: td.rand(1.5), TypeError, "rand: sizes must be integers"),
    ("arange(nan)", lambda: td.arange(float("nan")), ValueError, "arange: end must be a finite"),
    ("arange(0, inf)", lambda: td.arange(0, math.inf), ValueError, "arange: end must be a finite"),
    ("arange(step=0)", lambda: td.arange(0, 5, 0), ValueError, "arange: step must be nonzero"),
    ("arange('a')", lambda: td.arange("a"), TypeError, "arange: end must be a number"),
    ("tensor(ragged)", lambda: td.tensor([[1, 2], [3]]), ValueError, r"tensor\(\): .*ragged"),
    ("tensor(str)", lambda: td.tensor(["a"]), TypeError, r"tensor\(\): cannot make a tensor"),
    ("dtype", lambda: td.tensor([1.0], dtype="float7"), TypeError, "unknown dtype 'float7'"),
    ("load_state_dict(list)", lambda: _linear().load_state_dict([1, 2]), TypeError,
     "load_state_dict: expected a dict .* got list"),
    ("load_state_dict(None)", lambda: _linear().load_state_dict(None), TypeError,
     "load_state_dict: expected a dict .* got NoneType"),
    ("load_state_dict(lists)", lambda: _linear().load_state_dict(
        {"weight": [[0.0, 0.0]] * 3, "bias": [0.0] * 3}), TypeError,
     r"load_state_dict into Linear: these values are not Tensors: weight \(list\), bias \(list\)"),
    ("load_state_dict(shape)", lambda: _linear().load_state_dict(
        {"weight": td.zeros(2, 3), "bias": td.zeros(3)}), RuntimeError,
     r"load_state_dict into Linear failed: shape mismatches: weight"),
    ("linear shapes", lambda: F.linear(td.randn(3, 4), td.randn(2, 5)), ValueError,
     r"linear: input of shape \(3, 4\) does not match weight"),
    ("matmul shapes", lambda: td.randn(3, 4) @ td.randn(5, 2), ValueError,
     "matmul: inner dimensions differ"),
    ("broadcast", lambda: td.randn(3, 4) + td.randn(3, 5), ValueError,
     r"add: shapes \(3, 4\) and \(3, 5\) cannot be broadcast"),
    ("conv2d channels", lambda: F.conv2d(td.randn(1, 2, 5, 5), td.randn(3, 1, 3, 3)),
     ValueError, "conv2d: input of shape"),
    ("conv2d kernel", lambda: F.conv2d(td.randn(1, 1, 2, 2), td.randn(3, 1, 3, 3)), ValueError,
     "conv2d: kernel .* is larger than the padded input"),
    ("max_pool2d kernel 0", lambda: F.max_pool2d(td.randn(1, 1, 4, 4), 0), ValueError,
     "max_pool2d: kernel_size must be positive"),
    ("max_pool2d stride 0", lambda: F.max_pool2d(td.randn(1, 1, 4, 4), 2, 0), ValueError,
     "max_pool2d: stride must be >= 1"),
    ("softmax dim", lambda: F.softmax(td.randn(3, 4), 2), IndexError,
     "softmax: dimension 2 is out of range"),
    ("softmax ints", lambda: F.softmax(td.tensor([1, 2]), 0), TypeError,
     "softmax: expected floating point"),
    ("cross_entropy target", lambda: F.cross_entropy(td.randn(3, 4), td.tensor([0, 4, 0])).item(),
     ValueError, r"cross_entropy: target 4 is outside \[0, 4\)"),
    ("cross_entropy float target", lambda: F.cross_entropy(td.randn(3, 4),
                                                            td.tensor([0.0, 1.0, 0.0])),
     TypeError, "cross_entropy: target must be an int64"),
    ("cross_entropy shapes", lambda: F.cross_entropy(td.randn(3, 4), td.tensor([0, 1])),
     ValueError, r"cross_entropy: expected logits \[N, C\] and target \[N\]"),
    ("dropout p", lambda: F.dropout(td.randn(3), 1.5, True), ValueError,
     r"dropout: p must be in \[0, 1\], got 1.5"),
    ("dropout nan", lambda: F.dropout(td.randn(3), math.nan, True), ValueError,
     r"dropout: p must be in \[0, 1\], got nan"),
    ("reshape", lambda: td.zeros(6).reshape(4, 2), RuntimeError,
     r"reshape: shape \(4, 2\) is invalid for a tensor of 6 elements"),
    ("index", lambda: td.zeros(3)[5], IndexError, "indexing: index 5 is out of bounds"),
    ("float index", lambda: td.zeros(3)[1.5], TypeError, "indexing: unsupported index 1.5"),
    ("gather", lambda: td.zeros(3)[td.tensor([0, 7])], IndexError,
     "gather_rows: index 7 is out of bounds"),
    ("mean of ints", lambda: td.tensor([1, 2]).mean(), TypeError,
     "mean: expected a floating point tensor"),
    ("sum dim", lambda: td.zeros(3).sum(2), IndexError, "sum: dimension 2 is out of range"),
    ("backward", lambda: td.zeros(3, requires_grad=True).exp().backward(), RuntimeError,
     "backward: a gradient can be created implicitly only for a scalar output"),
    ("SGD lr nan", lambda: optim.SGD(_linear().parameters(), lr=math.nan), ValueError,
     "SGD: invalid lr nan"),
    ("SGD lr -1", lambda: optim.SGD(_linear().parameters(), lr=-1), ValueError,
     "SGD: invalid lr -1"),
    ("SGD no params", lambda: optim.SGD([], lr=0.1), ValueError, "SGD got an empty parameter"),
    ("Adam betas", lambda: optim.Adam(_linear().parameters(), betas=(1.5, 0.9)), ValueError,
     r"Adam: invalid betas \(1.5, 0.9\)"),
    ("Linear(-1)", lambda: nn.Linear(-1, 3), ValueError, "in_features must be positive"),
    ("Conv2d(kernel 0)", lambda: nn.Conv2d(1, 2, 0), ValueError,
     "Conv2d: kernel_size must be >= 1"),
    ("manual_seed(-1)", lambda: td.manual_seed(-1), ValueError,
     "manual_seed: expected a non-negative int"),
    ("set_backend", lambda: td.set_backend("jax"), ValueError, "unknown backend 'jax'"),
    ("save a function", lambda: td.save({"f": print}, os.devnull), TypeError,
     r"save: cannot save an object of type builtin_function_or_method at obj\['f'\]"),
    ("DataLoader batch 0", lambda: td.data.DataLoader(td.data.TensorDataset(np.zeros(3)), 0),
     ValueError, "DataLoader: batch_size must be a positive int, got 0"),
    ("DataLoader limit", lambda: td.data.DataLoader(td.data.TensorDataset(np.zeros(3)), 1,
                                                   limit=-1),
     ValueError, "DataLoader: limit must be a non-negative int"),
]


@pytest.mark.parametrize("what,call,kind,message", API_MISTAKES, ids=[c[0] for c in API_MISTAKES])
def test_api_mistakes_are_named_errors(what, call, kind, message):
    with td.use_backend("numpy"), pytest.raises(kind, match=message):
        call()


@pytest.mark.parametrize("what", ["randperm(-1)", "zeros(-1)", "linear shapes",
                                  "cross_entropy target", "load_state_dict(lists)"])
def test_api_mistakes_on_the_triton_backend(what):
    _, call, kind, message = next(c for c in API_MISTAKES if c[0] == what)
    with td.use_backend("triton"), pytest.raises(kind, match=message):
        call()


# ---------------------------------------------------------------------- empty tensors, NaN, inf
def _compare(fn_td, fn_torch, *arrays, backend, grad=True):
    """fn on tritonad (backend) and torch: same output shape, values (NaN where torch has NaN)
    and, under a random cotangent, the same input gradients."""
    with td.use_backend(backend):
        xs = [td.tensor(a, requires_grad=grad and a.dtype.kind == "f") for a in arrays]
        ts = [torch.tensor(a, requires_grad=grad and a.dtype.kind == "f") for a in arrays]
        out, expected = fn_td(*xs), fn_torch(*ts)
        assert out.shape == tuple(expected.shape), f"{backend}: {out.shape} vs {expected.shape}"
        assert_close(out, expected.detach().numpy(), 1e-5, 1e-6, name=f"{backend} forward")
        if not grad or not expected.requires_grad:
            return
        cotangent = np.random.default_rng(0).standard_normal(out.shape).astype(np.float32)
        out.backward(td.tensor(cotangent))
        expected.backward(torch.tensor(cotangent))
        for x, t in zip(xs, ts):
            if t.requires_grad:
                assert x.grad is not None and x.grad.shape == tuple(t.grad.shape)
                assert_close(x.grad, t.grad.numpy(), 1e-5, 1e-6, name=f"{backend} gradient")


def _r(*shape):
    return np.random.default_rng(len(shape)).standard_normal(shape).astype(np.float32)


EMPTY = [  # (what, tritonad fn, torch fn, inputs)
    ("softmax over a zero-size dim", lambda x: F.softmax(x, 1), lambda x: TF.softmax(x, 1),
     [_r(3, 0)]),
    ("log_softmax over a zero-size dim", lambda x: F.log_softmax(x, 1),
     lambda x: TF.log_softmax(x, 1), [_r(3, 0)]),
    ("softmax of no rows", lambda x: F.softmax(x, 1), lambda x: TF.softmax(x, 1), [_r(0, 5)]),
    ("max_pool2d on an empty batch", lambda x: F.max_pool2d(x, 2),
     lambda x: TF.max_pool2d(x, 2), [_r(0, 3, 4, 5)]),
    ("avg_pool2d on an empty batch", lambda x: F.avg_pool2d(x, 2),
     lambda x: TF.avg_pool2d(x, 2), [_r(0, 2, 4, 4)]),
    ("linear with no input features: the bias", F.linear, TF.linear, [_r(3, 0), _r(4, 0), _r(4)]),
    ("linear with no input features, 3-d", F.linear, TF.linear,
     [_r(2, 3, 0), _r(4, 0), _r(4)]),
    ("linear of no rows", F.linear, TF.linear, [_r(0, 5), _r(4, 5), _r(4)]),
    ("matmul over K = 0", lambda a, b: a @ b, lambda a, b: a @ b, [_r(3, 0), _r(0, 4)]),
    ("conv2d on an empty batch", lambda x, w: F.conv2d(x, w, padding=1),
     lambda x, w: TF.conv2d(x, w, padding=1), [_r(0, 1, 4, 4), _r(2, 1, 3, 3)]),
    ("sum of nothing", lambda x: x.sum(), lambda x: x.sum(), [_r(0, 3)]),
    ("sum over an empty dim", lambda x: x.sum(0), lambda x: x.sum(0), [_r(0, 3)]),
    ("mean of nothing is nan", lambda x: x.mean(), lambda x: x.mean(), [_r(0, 3)]),
    ("mean over an empty dim", lambda x: x.mean(0), lambda x: x.mean(0), [_r(0, 3)]),
    ("mean over a full dim of an empty tensor", lambda x: x.mean(1), lambda x: x.mean(1),
     [_r(0, 3)]),
    ("cross_entropy of no samples (mean: nan)", lambda x, y: F.cross_entropy(x, y),
     lambda x, y: TF.cross_entropy(x, y), [_r(0, 5), np.zeros(0, np.int64)]),
    ("cross_entropy of no samples (sum: 0)", lambda x, y: F.cross_entropy(x, y, reduction="sum"),
     lambda x, y: TF.cross_entropy(x, y, reduction="sum"), [_r(0, 5), np.zeros(0, np.int64)]),
    ("mse_loss of nothing", F.mse_loss, TF.mse_loss, [_r(0, 2), _r(0, 2)]),
]

EDGE_VALUES = [
    ("softmax of a NaN", lambda x: F.softmax(x, 0), lambda x: TF.softmax(x, 0),
     [np.array([np.nan, 1.0, -np.inf], np.float32)]),
    ("softmax of a -inf row", lambda x: F.softmax(x, 1), lambda x: TF.softmax(x, 1),
     [np.array([[-np.inf, -np.inf], [1.0, -np.inf]], np.float32)]),
    ("log_softmax of +-1e4", lambda x: F.log_softmax(x, 1), lambda x: TF.log_softmax(x, 1),
     [np.array([[1e4, -1e4, 0.0]], np.float32)]),
    ("cross_entropy of a NaN logit", F.cross_entropy, TF.cross_entropy,
     [np.array([[np.nan, 1.0], [0.0, 1.0]], np.float32), np.array([0, 1])]),
    ("relu of nan and inf", F.relu, TF.relu, [np.array([np.nan, np.inf, -np.inf, 0.0],
                                                       np.float32)]),
    ("exp overflow", lambda x: x.exp(), lambda x: x.exp(), [np.array([100.0, -100.0],
                                                                     np.float32)]),
    ("sum of inf and -inf", lambda x: x.sum(), lambda x: x.sum(),
     [np.array([np.inf, -np.inf, 1.0], np.float32)]),
    ("max_pool2d of NaN", lambda x: F.max_pool2d(x, 2), lambda x: TF.max_pool2d(x, 2),
     [np.array([[[[1.0, np.nan], [3.0, 2.0]]]], np.float32)]),
]


@pytest.mark.parametrize("backend", ["numpy", "triton"])
@pytest.mark.parametrize("what,fn,torch_fn,arrays", EMPTY + EDGE_VALUES,
                         ids=[c[0] for c in EMPTY + EDGE_VALUES])
def test_empty_and_edge_values_as_torch(what, fn, torch_fn, arrays, backend):
    # the gradients of NaN/inf inputs are torch's own business; forward only for them
    _compare(fn, torch_fn, *arrays, backend=backend, grad=what in {c[0] for c in EMPTY})


def test_max_over_an_empty_dim_is_an_error_naming_the_op(backend_name):
    with pytest.raises(RuntimeError, match=r"max: cannot reduce an empty tensor of shape "
                                           r"\(0, 3\)"):
        td.zeros(0, 3).max()
    with pytest.raises(RuntimeError, match="argmax: cannot reduce an empty tensor"):
        td.zeros(3, 0).argmax(1)


def test_huge_values_and_sizes():
    with td.use_backend("numpy"):
        x = np.random.default_rng(5).standard_normal((2, 1 << 17)).astype(np.float32) * 1e4
        assert_close(F.softmax(td.tensor(x), 1), TF.softmax(torch.tensor(x), 1).numpy(), 1e-5,
                     1e-7, name="softmax of a long row of large logits")
        td.manual_seed(2 ** 70)  # seeds wrap to 64 bits, as torch's
        assert td.randperm(5).shape == (5,)
        # a batch larger than the dataset: one short batch
        loader = td.data.DataLoader(td.data.TensorDataset(np.arange(3.0)), 10 ** 9)
        assert len(loader) == 1 and next(iter(loader))[0].shape == (3,)


# ---------------------------------------------------------------------- bad and interrupted files
def test_bad_checkpoint_files(tmp_path):
    good = tmp_path / "good.td"
    td.save({"w": td.ones(3)}, good)
    raw = good.read_bytes()
    cases = {"truncated.td": (raw[:len(raw) // 2], serialization.CheckpointError, "truncated"),
             "random.td": (np.random.default_rng(0).bytes(200), serialization.CheckpointError,
                           "is not a checkpoint"),
             # random bytes with "{" at byte 8 (1 in 256 of them) once read as a truncated file
             "brace.td": (b"\x9f" * 8 + b"{" + bytes(191), serialization.CheckpointError,
                          "is not a checkpoint: its first 8 bytes give a header of"),
             "empty.td": (b"", serialization.CheckpointError, "is not a checkpoint"),
             "pickle.td": (b"\x80\x04" + raw[2:], serialization.CheckpointError, "pickle")}
    for name, (content, kind, message) in cases.items():
        (tmp_path / name).write_bytes(content)
        with pytest.raises(kind, match=message) as err:
            td.load(tmp_path / name)
        assert name in str(err.value)
    with pytest.raises(FileNotFoundError, match="missing.td"):
        td.load(tmp_path / "missing.td")
    with pytest.raises(IsADirectoryError):
        td.load(tmp_path)


def test_an_interrupted_checkpoint_write_keeps_the_last_one(tmp_path, capsys, monkeypatch):
    """Ctrl-C while `train --save` writes epoch 2's checkpoint: exit 130, one line, and the
    file still holds epoch 1 (no partial file, no temporary file left behind)."""
    ckpt = tmp_path / "run.tdckpt"
    write = serialization._serialize_file

    def interrupted(arrays, filename, metadata):
        write(arrays, filename, metadata)
        if ckpt.exists():  # the second save: stopped halfway through its data
            with open(filename, "r+b") as f:
                f.truncate(os.path.getsize(filename) // 2)
            raise KeyboardInterrupt

    monkeypatch.setattr(serialization, "_serialize_file", interrupted)
    with pytest.raises(SystemExit) as stop:
        cli.main(["train", "--model", "logreg", "--epochs", "2", "--limit", "300", "--backend",
                  "numpy", "--quiet", "--save", str(ckpt)])
    assert stop.value.code == 130
    assert capsys.readouterr().err.strip().splitlines() == ["error: interrupted"]
    assert td.load(ckpt)["epoch"] == 1 and os.listdir(tmp_path) == ["run.tdckpt"]


# ---------------------------------------------------------------------- the command line
@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A logreg checkpoint of a 1-epoch, 200-image run."""
    path = tmp_path_factory.mktemp("ckpt") / "logreg.tdckpt"
    cli.main(["train", "--model", "logreg", "--epochs", "1", "--limit", "200", "--backend",
              "numpy", "--quiet", "--save", str(path)])
    return path


@pytest.fixture
def offline(monkeypatch):
    """Downloads fail at once (a closed local port) instead of waiting on the network."""
    monkeypatch.setattr(datafiles, "DOWNLOAD_TIMEOUT_S", 1)
    for kind in (data.MNIST, data.FashionMNIST):
        monkeypatch.setattr(kind, "MIRRORS", ("http://127.0.0.1:9/",))


TRAIN = ["train", "--backend", "numpy", "--quiet", "--limit", "100", "--epochs", "1"]

# (argv, strings the error line must contain): every option of train with a bad value
TRAIN_MISTAKES = [
    (["--model", "vgg"], ["--model", "invalid choice"]),
    (["--epochs", "0"], ["--epochs must be a positive integer, got 0"]),
    (["--epochs", "-3"], ["--epochs must be a positive integer, got -3"]),
    (["--epochs", "two"], ["--epochs", "invalid int value: 'two'"]),
    (["--batch-size", "0"], ["--batch-size must be a positive integer, got 0"]),
    (["--batch-size", "1.5"], ["--batch-size", "invalid int value"]),
    (["--lr", "0"], ["--lr must be a positive finite number, got 0.0"]),
    (["--lr", "-0.1"], ["--lr must be a positive finite number, got -0.1"]),
    (["--lr", "nan"], ["--lr must be a positive finite number, got nan"]),
    (["--lr", "inf"], ["--lr must be a positive finite number, got inf"]),
    (["--lr", "fast"], ["--lr", "invalid float value"]),
    (["--optimizer", "lbfgs"], ["--optimizer", "invalid choice"]),
    (["--schedule", "linear"], ["--schedule", "invalid choice"]),
    (["--device", "tpu"], ["--device 'tpu' is not a device"]),
    (["--device", "cuda:x"], ["--device 'cuda:x' is not a device"]),
    (["--device", "cuda"], ["--device cuda"]),  # no GPU here; on a GPU: numpy runs on the CPU
    (["--backend", "jax"], ["--backend", "invalid choice"]),
    (["--seed", "-1"], ["--seed must be a non-negative integer, got -1"]),
    (["--seed", "x"], ["--seed", "invalid int value"]),
    (["--save", "{tmp}/no/such/folder/c.td"], ["--save", "the folder", "does not exist"]),
    (["--save", "{tmp}"], ["--save", "is a folder"]),
    (["--resume", "{tmp}/missing.td"], ["--resume", "missing.td: no such file"]),
    (["--resume", "{tmp}"], ["--resume", "is a folder"]),
    (["--resume", "{tmp}/garbage.td"], ["garbage.td is not a checkpoint"]),
    (["--resume", "{tmp}/plain.td"], ["--resume", "plain.td: not a tritonad training checkpoint"]),
    (["--data-dir", "{tmp}/garbage.td"], ["--data-dir", "is a file, not a folder"]),
    (["--data-dir", "{tmp}/empty"], ["could not download train-images-idx3-ubyte.gz",
                                     "empty"]),
    (["--data-dir", "{tmp}/corrupt"], ["train-images-idx3-ubyte.gz is a corrupt or truncated"]),
    (["--dataset", "cifar"], ["--dataset", "invalid choice"]),
    (["--plot", "{tmp}/no/such/folder/p.png"], ["--plot", "does not exist"]),
    (["--limit", "0"], ["--limit must be a positive integer, got 0"]),
    (["--limit", "-5"], ["--limit must be a positive integer, got -5"]),
    (["--no-graph=yes"], ["--no-graph", "ignored explicit argument"]),
    (["--no-fuse=1"], ["--no-fuse", "ignored explicit argument"]),
    (["--quiet=0"], ["--quiet", "ignored explicit argument"]),
    (["--frobnicate"], ["unrecognized arguments: --frobnicate"]),
]


@pytest.fixture
def bad_files(tmp_path):
    """{tmp}/garbage.td (not a checkpoint), plain.td (a checkpoint, not of a training run),
    empty/ (a data folder without files), corrupt/ (a truncated MNIST file)."""
    (tmp_path / "garbage.td").write_bytes(b"definitely not a checkpoint")
    td.save({"w": td.ones(2)}, tmp_path / "plain.td")
    (tmp_path / "empty").mkdir()
    (tmp_path / "corrupt").mkdir()
    raw = (MNIST / "train-images-idx3-ubyte.gz").read_bytes()
    (tmp_path / "corrupt" / "train-images-idx3-ubyte.gz").write_bytes(raw[:5000])
    (tmp_path / "corrupt" / "train-labels-idx1-ubyte.gz").symlink_to(
        MNIST / "train-labels-idx1-ubyte.gz")
    return tmp_path


@pytest.mark.parametrize("argv,names", TRAIN_MISTAKES, ids=[" ".join(a) for a, _ in TRAIN_MISTAKES])
def test_train_option_mistakes(argv, names, bad_files, capsys, offline):
    argv = [a.replace("{tmp}", str(bad_files)) for a in argv]
    cli_error(capsys, TRAIN + argv, *names)


def test_plot_is_checked_before_training(tmp_path, capsys):
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        cli_error(capsys, TRAIN + ["--plot", tmp_path / "p.png"], "--plot needs matplotlib")
    else:
        cli_error(capsys, TRAIN + ["--plot", tmp_path / "p.xyz"], "--plot", "cannot write .xyz")


def test_resume_mistakes(checkpoint, capsys):
    resume = ["train", "--backend", "numpy", "--quiet", "--resume", checkpoint]
    cli_error(capsys, resume, "has already trained 1 epoch(s) of a 1-epoch run",
              "--epochs 2 or more")
    cli_error(capsys, resume + ["--epochs", "1"], "already trained")
    for option, value, was in (("--model", "mlp", "--model logreg"), ("--lr", "0.1", "--lr 0.05"),
                               ("--batch-size", "64", "--batch-size 128"),
                               ("--optimizer", "adam", "--optimizer sgd"),
                               ("--schedule", "constant", "--schedule cosine"),
                               ("--dataset", "fashion-mnist", "--dataset mnist"),
                               ("--limit", "300", "--limit 200")):
        cli_error(capsys, resume + ["--epochs", "2", option, value], f"continues a run with {was}",
                  f"{option} {value} was given")


def test_a_checkpoint_whose_weights_do_not_fit(checkpoint, tmp_path, capsys):
    state = td.load(checkpoint)
    state["model"]["1.weight"] = td.zeros(10, 783)
    td.save(state, tmp_path / "bent.tdckpt")
    cli_error(capsys, ["eval", "--checkpoint", tmp_path / "bent.tdckpt", "--backend", "numpy"],
              "bent.tdckpt: its model does not fit", "shape mismatches: 1.weight")
    state["model_name"] = "transformer"
    td.save(state, tmp_path / "alien.tdckpt")
    cli_error(capsys, ["eval", "--checkpoint", tmp_path / "alien.tdckpt", "--backend", "numpy"],
              "unknown model 'transformer'")


EVAL_AND_PREDICT_MISTAKES = [
    (["eval"], ["--checkpoint", "required"]),
    (["eval", "--checkpoint", "nope.tdckpt"], ["--checkpoint nope.tdckpt: no such file"]),
    (["eval", "--checkpoint", "{tmp}/truncated.td"], ["truncated.td is truncated"]),
    (["eval", "--checkpoint", "{tmp}/plain.td"], ["not a tritonad training checkpoint"]),
    (["eval", "--checkpoint", "{tmp}"], ["--checkpoint", "is a folder"]),
    (["eval", "--checkpoint", "{ckpt}", "--data-dir", "{tmp}/plain.td"], ["--data-dir",
                                                                          "is a file"]),
    (["eval", "--checkpoint", "{ckpt}", "--data-dir", "{tmp}/empty"], ["could not download",
                                                                       "t10k-images"]),
    (["eval", "--checkpoint", "{ckpt}", "--device", "gpu0"], ["--device 'gpu0'"]),
    (["eval", "--checkpoint", "{ckpt}", "--backend", "cuda"], ["--backend", "invalid choice"]),
    (["predict", "--checkpoint", "nope.tdckpt", "x.png"], ["--checkpoint nope.tdckpt: no such"]),
    (["predict", "--checkpoint", "{ckpt}"], ["the following arguments are required: IMAGE"]),
    (["predict", "--checkpoint", "{ckpt}", "{tmp}/missing.png"], ["no such image file",
                                                                  "missing.png"]),
    (["predict", "--checkpoint", "{ckpt}", "{tmp}/plain.td"], ["plain.td is not an image"]),
    (["predict", "--checkpoint", "{ckpt}", "{tmp}/blank.png"], ["the image is blank"]),
    (["predict", "--checkpoint", "{ckpt}", "{tmp}"], ["no such image file"]),
    (["predict", "--checkpoint", "{ckpt}", "x.png", "--device", "cuda:1"], ["--device cuda:1"]),
    (["predict", "--checkpoint", "{ckpt}", "x.png", "--backend", "torch"], ["--backend"]),
    (["bench", "vgg"], ["invalid choice: 'vgg'"]),
    (["bench", "matmul", "--out", "{tmp}/plain.td"], ["--out", "is a file, not a folder"]),
    (["launch"], ["invalid choice: 'launch'"]),
    ([], ["the following arguments are required: command"]),
]


@pytest.mark.parametrize("argv,names", EVAL_AND_PREDICT_MISTAKES,
                         ids=[" ".join(a) or "nothing" for a, _ in EVAL_AND_PREDICT_MISTAKES])
def test_eval_predict_bench_mistakes(argv, names, checkpoint, bad_files, capsys, offline):
    from PIL import Image

    Image.new("L", (30, 30), 255).save(bad_files / "blank.png")
    raw = checkpoint.read_bytes()
    (bad_files / "truncated.td").write_bytes(raw[:100])
    argv = [a.replace("{tmp}", str(bad_files)).replace("{ckpt}", str(checkpoint)) for a in argv]
    if argv[:1] in (["eval"], ["predict"]) and "--backend" not in argv:
        argv += ["--backend", "numpy"]
    cli_error(capsys, argv, *names)


def test_predict_refuses_a_decompression_bomb(checkpoint, tmp_path, capsys, monkeypatch):
    from PIL import Image

    Image.new("L", (64, 64), 255).save(tmp_path / "big.png")
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)  # 64 x 64 is over twice that
    cli_error(capsys, ["predict", "--checkpoint", checkpoint, "--backend", "numpy",
                       tmp_path / "big.png"], "big.png is too large to read")


def test_bench_without_a_gpu_is_one_line(capsys, tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    cli_error(capsys, ["bench", "softmax", "--out", tmp_path], "need a CUDA GPU")


def test_debug_shows_the_traceback(tmp_path, monkeypatch, capsys):
    bad = tmp_path / "bad.td"
    bad.write_bytes(b"TRITONAD")
    argv = ["eval", "--checkpoint", str(bad), "--backend", "numpy"]
    with pytest.raises(serialization.CheckpointError, match="truncated"):
        cli.main(["--debug"] + argv)
    with pytest.raises(serialization.CheckpointError):
        cli.main(argv + ["--debug"])
    monkeypatch.setenv("TRITONAD_DEBUG", "1")
    with pytest.raises(serialization.CheckpointError):
        cli.main(argv)
    monkeypatch.setenv("TRITONAD_DEBUG", "0")
    cli_error(capsys, argv, "bad.td is truncated")


def test_bugs_keep_their_traceback(monkeypatch):
    """Errors that are not a user's mistake (raised by Python or numpy, not by a check in
    tritonad) are not dressed up as one."""
    def broken(*args, **kwargs):
        return np.zeros(3).reshape(2, 2)  # numpy's ValueError: a bug, not a bad option

    argv = TRAIN + ["--model", "logreg"]
    monkeypatch.setattr(train, "datasets", broken)
    with pytest.raises(ValueError, match="cannot reshape"):
        cli.main(argv)
    monkeypatch.setattr(train, "datasets", lambda *a: {}["x"])
    with pytest.raises(KeyError):
        cli.main(argv)
    monkeypatch.setattr(train, "datasets", lambda *a: None.shape)
    with pytest.raises(AttributeError):
        cli.main(argv)


def test_the_real_entry_point(tmp_path):
    """`python -m tritonad` itself: exit status 2, one line, no traceback."""
    run = subprocess.run([sys.executable, "-m", "tritonad", "predict", "--checkpoint",
                          str(tmp_path / "nope.tdckpt"), "x.png"], cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and run.stdout == ""
    assert run.stderr.strip().splitlines() == [f"error: --checkpoint {tmp_path / 'nope.tdckpt'}: "
                                               f"no such file"]


def test_a_corrupt_dataset_file_names_the_file(tmp_path, capsys):
    folder = tmp_path / "data"
    folder.mkdir()
    for name in ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
                 "t10k-images-idx3-ubyte.gz"):
        (folder / name).symlink_to(MNIST / name)
    labels = gzip.decompress((MNIST / "t10k-labels-idx1-ubyte.gz").read_bytes())
    (folder / "t10k-labels-idx1-ubyte").write_bytes(labels[:-3])  # plain and 3 bytes short
    cli_error(capsys, TRAIN + ["--model", "logreg", "--data-dir", folder],
              "t10k-labels-idx1-ubyte is truncated")
