"""The command line and training end to end on small subsets, and cross-backend training."""
import gzip
import json
import pathlib

import numpy as np
import pytest

import tritonad as td
from helpers import assert_close
from tritonad import cli, models, nn, optim
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


def test_predict_rejects_what_is_not_an_image(tmp_path, capsys):
    ckpt = tmp_path / "m.tdckpt"
    run_cli(capsys, "train", "--model", "logreg", "--epochs", "1", "--limit", "500", "--backend",
            "numpy", "--quiet", "--save", str(ckpt))
    text = tmp_path / "notes.png"
    text.write_text("not a picture")
    with pytest.raises(SystemExit, match="is not an image"):
        cli.main(["predict", "--checkpoint", str(ckpt), "--backend", "numpy", str(text)])
    with pytest.raises(SystemExit, match="no such image"):
        cli.main(["predict", "--checkpoint", str(ckpt), "--backend", "numpy", "missing.png"])


def test_bad_arguments_print_usage(capsys):
    with pytest.raises(SystemExit) as err:
        cli.main(["train", "--model", "resnet"])
    assert err.value.code == 2 and "invalid choice" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main([])


def test_missing_data_names_the_folder(tmp_path):
    with pytest.raises(Exception, match=str(tmp_path)):
        cli.main(["train", "--model", "logreg", "--data-dir", str(tmp_path), "--backend",
                  "numpy", "--quiet", "--epochs", "1"])


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
