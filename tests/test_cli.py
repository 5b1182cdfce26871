"""The command line and training end to end on small subsets, and cross-backend training."""
import gzip
import json
import pathlib

import numpy as np
import pytest
import torch

import tritonad as td
from helpers import assert_close, cli_error
from tritonad import cli, data, datafiles, models, nn, optim, train
from tritonad.autodiff import nn_ops

DATA = pathlib.Path(__file__).resolve().parents[1] / "data" / "mnist"


def run_cli(capsys, *argv):
    cli.main(list(argv))
    out = capsys.readouterr().out.strip().splitlines()
    return out


def test_train_save_and_eval(tmp_path, capsys):
    ckpt = tmp_path / "logreg.tdckpt"
    out = run_cli(capsys, "train", "--model", "logreg", "--epochs", "2", "--limit", "3000",
                  "--backend", "numpy", "--quiet", "--save", str(ckpt))
    metrics = json.loads(out[-1])
    assert metrics["backend"] == "numpy" and metrics["epochs"] == 2
    assert metrics["test_accuracy"] > 0.80 and ckpt.exists()
    evaluated = json.loads(run_cli(capsys, "eval", "--checkpoint", str(ckpt), "--backend",
                                   "numpy")[-1])
    assert evaluated["test_accuracy"] == pytest.approx(metrics["test_accuracy"])
    assert evaluated["epoch"] == 2


def test_resume_continues_exactly(tmp_path, capsys):
    """Two epochs in one go equal one epoch, a stop, and a resumed second epoch."""
    full, half = tmp_path / "full.tdckpt", tmp_path / "half.tdckpt"
    common = ["--model", "logreg", "--limit", "1500", "--backend", "numpy", "--quiet",
              "--schedule", "constant"]
    run_cli(capsys, "train", *common, "--epochs", "2", "--save", str(full))
    run_cli(capsys, "train", *common, "--epochs", "1", "--save", str(half))
    out = run_cli(capsys, "train", *common, "--epochs", "2", "--resume", str(half), "--save",
                  str(half))
    a, b = td.load(full), td.load(half)
    assert b["epoch"] == 2 and len(b["history"]) == 2
    for key in a["model"]:
        assert_close(b["model"][key], a["model"][key], 1e-6, 1e-7, name=key)
    assert json.loads(out[-1])["test_accuracy"] == pytest.approx(a["history"][-1]["test_accuracy"])


def _lr_sequence(monkeypatch):
    """The learning rate of every optimizer step the CLI takes from now on."""
    lrs, step = [], optim.SGD.step

    def recording_step(self, closure=None):
        lrs.append(self.param_groups[0]["lr"])
        return step(self, closure)

    monkeypatch.setattr(optim.SGD, "step", recording_step)
    return lrs


def test_resume_with_more_epochs_extends_the_cosine(tmp_path, capsys, monkeypatch):
    """1 epoch, then resumed to 2: the second epoch follows the 2-epoch cosine of a straight
    run (it does not climb back to the peak), and the log and the JSON say so."""
    ckpt = tmp_path / "one.tdckpt"
    common = ["--model", "logreg", "--limit", "700", "--batch-size", "100", "--backend", "numpy"]
    lrs = _lr_sequence(monkeypatch)
    run_cli(capsys, "train", *common, "--quiet", "--epochs", "2")
    straight = list(lrs)
    run_cli(capsys, "train", *common, "--quiet", "--epochs", "1", "--save", str(ckpt))
    del lrs[:]
    cli.main(["train", *common, "--epochs", "2", "--resume", str(ckpt)])
    out, err = capsys.readouterr()
    assert len(straight) == 14 and len(lrs) == 7
    assert_close(np.array(lrs), np.array(straight[7:]), 1e-12, 1e-15, name="resumed lrs")
    assert lrs[0] == pytest.approx(0.05 * (1 + np.cos(np.pi * 7 / 14)) / 2)
    assert "schedule now spans 14 steps (2 epochs) instead of 7" in err
    report = json.loads(out.strip().splitlines()[-1])
    assert report["schedule"] == {"name": "cosine", "steps": 14, "extended_from_steps": 7}
    assert report["epochs"] == 2 and report["resumed_from_epoch"] == 1
    assert td.load(ckpt)["history"][-1]["lr"] == pytest.approx(0.0, abs=1e-12)  # not resumed


def test_resume_partway_keeps_the_cosine_exact(tmp_path, capsys, monkeypatch):
    """A 2-epoch cosine run stopped after epoch 1 and resumed (--epochs taken from the
    checkpoint) ends with the weights of the uninterrupted run."""
    full, half = tmp_path / "full.tdckpt", tmp_path / "half.tdckpt"
    common = ["--model", "logreg", "--limit", "600", "--backend", "numpy", "--quiet"]
    run_cli(capsys, "train", *common, "--epochs", "2", "--save", str(full))
    train_epoch = train.Trainer.train_epoch

    def stop_after_one(self, epoch, *args, **kwargs):
        if epoch == 2:
            raise KeyboardInterrupt
        return train_epoch(self, epoch, *args, **kwargs)

    monkeypatch.setattr(train.Trainer, "train_epoch", stop_after_one)
    with pytest.raises(SystemExit) as stop:
        cli.main(["train", *common, "--epochs", "2", "--save", str(half)])
    assert stop.value.code == 130 and "error: interrupted" in capsys.readouterr().err
    monkeypatch.setattr(train.Trainer, "train_epoch", train_epoch)
    out = run_cli(capsys, "train", "--resume", str(half), "--save", str(half), "--backend",
                  "numpy", "--quiet")
    a, b = td.load(full), td.load(half)
    assert b["epoch"] == 2 and json.loads(out[-1])["schedule"]["extended_from_steps"] is None
    for key in a["model"]:
        assert_close(b["model"][key], a["model"][key], 1e-6, 1e-7, name=key)


@pytest.mark.gpu
def test_extended_resume_with_captured_steps_on_the_gpu(tmp_path, capsys):
    """The re-spanned learning rate reaches the captured CUDA-graph steps: a resumed, extended
    run with graphs ends where the same run stepped eagerly does; --device is checked against
    the GPU and the backend."""
    ckpt = tmp_path / "one.tdckpt"
    common = ["--model", "logreg", "--limit", "2000", "--batch-size", "100", "--backend",
              "triton", "--quiet"]
    run_cli(capsys, "train", *common, "--epochs", "1", "--save", str(ckpt))
    ends = {}
    for flags in ([], ["--no-graph"]):
        out = tmp_path / f"two{len(flags)}.tdckpt"
        report = json.loads(run_cli(capsys, "train", *common, "--epochs", "2", "--resume",
                                    str(ckpt), "--save", str(out), *flags)[-1])
        assert report["graph"] == (not flags) and report["schedule"]["extended_from_steps"] == 20
        ends[bool(flags)] = td.load(out, map_location="cpu")
    for key, value in ends[True]["model"].items():
        assert_close(value, ends[False]["model"][key], 1e-5, 1e-6, name=key)
    assert ends[True]["history"][-1]["lr"] == pytest.approx(0.0, abs=1e-12)
    count = torch.cuda.device_count()
    train_cmd = ["train", "--model", "logreg", "--quiet", "--epochs", "1", "--limit", "100"]
    cli_error(capsys, train_cmd + ["--backend", "triton", "--device", "cpu"],
              "triton backend runs on the GPU")
    cli_error(capsys, train_cmd + ["--backend", "numpy", "--device", "cuda"],
              "numpy backend runs on the CPU only")
    cli_error(capsys, train_cmd + ["--device", f"cuda:{count}"], f"has {count} GPU(s)")


def _digit_png(path, index, dark_on_light=True, size=(112, 112)):
    from PIL import Image

    raw = gzip.open(DATA / "t10k-images-idx3-ubyte.gz").read()
    img = np.frombuffer(raw, np.uint8, offset=16).reshape(-1, 28, 28)[index]
    Image.fromarray(255 - img if dark_on_light else img).resize(size, Image.BILINEAR).save(path)
    labels = np.frombuffer(gzip.open(DATA / "t10k-labels-idx1-ubyte.gz").read(), np.uint8,
                           offset=8)
    return int(labels[index])


def test_predict_reads_a_png_of_a_test_digit(tmp_path, capsys):
    ckpt = tmp_path / "m.tdckpt"
    run_cli(capsys, "train", "--model", "logreg", "--epochs", "1", "--limit", "6000", "--backend",
            "numpy", "--quiet", "--save", str(ckpt))
    paths, labels = [], []
    for i in range(12):
        p = tmp_path / f"digit{i}.png"
        labels.append(_digit_png(p, i, dark_on_light=i % 2 == 0, size=(56 + 8 * i, 84)))
        paths.append(str(p))
    out = run_cli(capsys, "predict", "--checkpoint", str(ckpt), "--backend", "numpy", *paths)
    assert len(out) == 12 and all("%" in line for line in out)
    top = [int(line.split(": ")[1].split(" ")[0]) for line in out]
    assert sum(t == y for t, y in zip(top, labels)) >= 9
    probs = [float(p.split("(")[1].rstrip("%),")) for p in out[0].split(": ")[1].split(", ")]
    assert len(probs) == 3 and probs == sorted(probs, reverse=True)


def _png(path, values, color_type):
    """A 16-bit PNG written by hand (Pillow writes 16 bits only for grey): values uint16
    [H, W] or [H, W, channels], color_type 0 grey, 2 RGB, 4 grey+alpha, 6 RGBA."""
    import struct
    import zlib

    h, w = values.shape[:2]
    rows = b"".join(b"\0" + values[y].astype(">u2").tobytes() for y in range(h))

    def chunk(kind, body):
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I",
                                                                        zlib.crc32(kind + body))
    path.write_bytes(b"\x89PNG\r\n\x1a\n"
                     + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 16, color_type, 0, 0, 0))
                     + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))


def _picture(kind, v8, v16, tmp_path):
    """A file holding the grey picture v8 (uint8 [H, W]; v16: the same at 16 bits) as `kind`."""
    from PIL import Image

    ink = 255 - v8  # for the pictures with transparency: how much stroke covers a pixel
    zero = np.zeros_like(v8)
    margin = v8 == v8[0, 0]  # the paper of a 4-pixel border
    margin[4:-4, 4:-4] = False
    files = {
        "I;16 png": lambda p: Image.fromarray(v16).save(p),
        "I;16B tiff": lambda p: Image.frombytes("I;16B", v16.shape[::-1],
                                                v16.astype(">u2").tobytes()).save(p),
        "I tiff": lambda p: Image.fromarray(v16.astype(np.int32)).save(p),
        "F tiff": lambda p: Image.fromarray(v8.astype(np.float32)).save(p),
        "RGB png": lambda p: Image.fromarray(np.stack([v8] * 3, -1)).save(p),
        "P png": lambda p: Image.fromarray(v8).convert("P").save(p),
        "RGB 16-bit png": lambda p: _png(p, np.stack([v16] * 3, -1), 2),
        "LA 16-bit png": lambda p: _png(p, np.stack([v16, np.full_like(v16, 65535)], -1), 4),
        # dark strokes on transparent paper (whose hidden colour is black)
        "RGBA dark strokes": lambda p: Image.fromarray(np.stack([zero] * 3 + [ink], -1)).save(p),
        # light strokes on transparent paper: they need dark paper under them
        "LA light strokes": lambda p: Image.fromarray(np.stack([zero + 255, ink], -1)).save(p),
        "RGBA 16-bit dark strokes": lambda p: _png(p, np.stack(
            [np.zeros_like(v16)] * 3 + [65535 - v16], -1), 6),
        # opaque paper with a transparent margin whose hidden colour is the picture inverted
        "RGBA margins": lambda p: Image.fromarray(np.stack(
            [np.where(margin, 255 - v8, v8)] * 3 + [np.where(margin, 0, 255).astype(np.uint8)],
            -1)).save(p),
        "1 png": lambda p: Image.fromarray(v8).convert("1", dither=Image.Dither.NONE).save(p),
    }
    suffix = ".tiff" if "tiff" in kind else ".png"
    path = tmp_path / (kind.replace(" ", "_").replace(";", "") + suffix)
    files[kind](path)
    return path


@pytest.mark.parametrize("kind", ["I;16 png", "I;16B tiff", "I tiff", "F tiff", "RGB png",
                                  "P png", "RGB 16-bit png", "LA 16-bit png",
                                  "RGBA dark strokes", "LA light strokes",
                                  "RGBA 16-bit dark strokes", "RGBA margins", "1 png"])
def test_predict_reads_any_bit_depth_and_mode(tmp_path, kind):
    """Each kind of picture is prepared as its 8-bit grey version is (to rounding): 16-bit
    values are scaled by 65535 (not clipped at 255) and transparency is put on suitable paper."""
    from PIL import Image

    from tritonad.predict import load_digit

    rng = np.random.default_rng(len(kind))
    raw = gzip.open(DATA / "t10k-images-idx3-ubyte.gz").read()
    for index, dark_on_light in ((0, True), (1, False)):
        digit = np.frombuffer(raw, np.uint8, offset=16 + 784 * index).reshape(-1, 28, 28)[0]
        v8 = np.asarray(Image.fromarray(digit).resize((45, 61), Image.BILINEAR))
        if dark_on_light or "strokes" in kind:
            v8 = 255 - v8
        # 16-bit values that round to v8: not multiples of 257
        noise = rng.integers(-128, 129, v8.shape)
        v16 = np.clip(v8.astype(np.int64) * 257 + noise, 0, 65535).astype(np.uint16)
        if kind == "1 png":  # one bit: as the 8-bit picture thresholded
            v8 = np.where(v8 >= 128, 255, 0).astype(np.uint8)
        Image.fromarray(v8).save(tmp_path / "eight.png")
        expected = load_digit(tmp_path / "eight.png")
        if "light strokes" in kind:  # the strokes are light: as a light-on-dark 8-bit picture
            Image.fromarray(255 - v8).save(tmp_path / "eight.png")
            expected = load_digit(tmp_path / "eight.png")
        got = load_digit(_picture(kind, v8, v16, tmp_path))
        assert_close(got, expected, 0, 3 / 255, name=f"{kind}, digit {index}")
        assert got.max() == pytest.approx(1.0, abs=0.02)  # strokes at full strength, not clipped


def test_predict_rejects_what_is_not_an_image(tmp_path, capsys):
    ckpt = tmp_path / "m.tdckpt"
    run_cli(capsys, "train", "--model", "logreg", "--epochs", "1", "--limit", "500", "--backend",
            "numpy", "--quiet", "--save", str(ckpt))
    text = tmp_path / "notes.png"
    text.write_text("not a picture")
    predict = ["predict", "--checkpoint", ckpt, "--backend", "numpy"]
    cli_error(capsys, predict + [text], text, "is not an image")
    cli_error(capsys, predict + ["missing.png"], "missing.png", "no such image")


def test_bad_arguments_are_one_line_errors(capsys):
    cli_error(capsys, ["train", "--model", "vgg"], "--model", "invalid choice", "--help")
    cli_error(capsys, [], "required")


def test_missing_data_names_the_folder(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(datafiles, "DOWNLOAD_TIMEOUT_S", 1)
    monkeypatch.setattr(data.MNIST, "MIRRORS", ("http://127.0.0.1:9/",))  # nothing listens
    cli_error(capsys, ["train", "--model", "logreg", "--data-dir", tmp_path, "--backend",
                       "numpy", "--quiet", "--epochs", "1"], tmp_path, "could not download")


# ------------------------------------------------------------------------ both backends agree


def _tiny(kind):
    if kind == "mlp":
        return nn.Sequential(nn.Flatten(), nn.Linear(16, 12), nn.ReLU(), nn.Linear(12, 5))
    return nn.Sequential(nn.Conv2d(1, 3, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(12, 5))


@pytest.mark.parametrize("kind", ["mlp", "cnn"])
def test_backends_train_step_for_step_alike(kind):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((6, 1, 4, 4)).astype(np.float32)
    y = rng.integers(0, 5, size=6)
    runs = {}
    for backend in ("numpy", "triton"):
        with td.use_backend(backend):
            td.manual_seed(3)  # both backends draw the same initial weights
            model = _tiny(kind)
            opt = optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
            losses = []
            for _ in range(4):
                loss = nn_ops.cross_entropy(model(td.tensor(x)), td.tensor(y))
                opt.zero_grad()
                loss.backward()
                opt.step()
                losses.append(loss.item())
            runs[backend] = losses, {k: v.numpy() for k, v in model.state_dict().items()}
    assert_close(runs["triton"][0], runs["numpy"][0], 1e-4, 1e-5, name="losses")
    for key, value in runs["numpy"][1].items():
        assert_close(runs["triton"][1][key], value, 1e-4, 1e-5, name=key)
    assert runs["numpy"][0][-1] < runs["numpy"][0][0]


def test_recipes_are_the_documented_models():
    shapes = {name: [tuple(p.shape) for p in models.build(name).parameters()]
              for name in ("logreg", "mlp", "cnn")}
    assert shapes["logreg"] == [(10, 784), (10,)]
    assert shapes["mlp"] == [(256, 784), (256,), (100, 256), (100,), (10, 100), (10,)]
    assert shapes["cnn"] == [(32, 1, 5, 5), (32,), (64, 32, 5, 5), (64,), (512, 3136), (512,),
                             (10, 512), (10,)]
    assert models.RECIPES["mlp"].batch_size == 128 and models.RECIPES["cnn"].lr == 0.01
