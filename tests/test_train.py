"""train.evaluate: the mean loss and accuracy over every sample, in eval mode and without
autodiff, the same in slices (numpy backend) as over the loader's batches, on both backends."""
import numpy as np
import pytest
import torch
from helpers import assert_close

import tritonad as td
from tritonad import nn, train


class Digits:
    """A small MNIST-like dataset (images and labels arrays): the device-resident path."""
    MEAN, STD = 0.5, 0.25

    def __init__(self, n, seed=0):
        rng = np.random.default_rng(seed)
        self.images = rng.integers(0, 256, (n, 6, 5)).astype(np.uint8)
        self.labels = rng.integers(0, 3, n).astype(np.int64)

    def __len__(self):
        return len(self.labels)


class Probe(nn.Module):
    """Dropout and a linear layer; remembers whether autodiff was on and whether it ran in
    training mode."""

    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Dropout(0.5), nn.Linear(30, 3))
        self.seen = []

    def forward(self, x):
        self.seen.append((td.is_grad_enabled(), self.training, x.shape[0]))
        return self.net(x)


def _expected(model, data):
    """Loss and accuracy over all samples at once, in torch, from the model's parameters."""
    lin = model.net[2]
    x = (torch.tensor(data.images, dtype=torch.float64) / 255 - data.MEAN) / data.STD
    logits = x.reshape(len(x), -1) @ torch.tensor(lin.weight.numpy(), dtype=torch.float64).T \
        + torch.tensor(lin.bias.numpy(), dtype=torch.float64)
    y = torch.tensor(data.labels)
    loss = torch.nn.functional.cross_entropy(logits, y).item()
    return loss, (logits.argmax(1) == y).double().mean().item()


@pytest.mark.parametrize("batch_size, slice_size", [(7, None), (100, None), (4, 9)])
def test_evaluate_every_sample_without_autodiff(backend_name, batch_size, slice_size):
    data = Digits(23)
    loader = td.data.DataLoader(data, batch_size, shuffle=True)
    model = Probe()
    loss, acc = train.evaluate(model, loader, slice_size)
    want_loss, want_acc = _expected(model, data)
    assert_close(loss, want_loss, 1e-5, 1e-6, name="loss")
    assert acc == pytest.approx(want_acc)
    assert model.training  # restored
    assert all(not grad and not training for grad, training, _ in model.seen)
    assert sum(n for _, _, n in model.seen) == 23
    if backend_name == "numpy" and slice_size:
        assert [n for _, _, n in model.seen] == [9, 9, 5]


def test_evaluate_slices_on_numpy_cap_the_batch(monkeypatch):
    monkeypatch.setattr(train, "CPU_EVAL_BATCH", 10)
    with td.use_backend("numpy"):
        model = Probe()
        train.evaluate(model, td.data.DataLoader(Digits(23), 1000))
        assert [n for _, _, n in model.seen] == [10, 10, 3]


def test_evaluate_an_empty_loader_is_an_error():
    with td.use_backend("numpy"), pytest.raises(ValueError, match="evaluate: .*no samples"):
        train.evaluate(Probe(), td.data.DataLoader(Digits(5), 2, limit=0))


def _mlp_epoch(precision, fuse=True):
    td.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(30, 8), nn.ReLU(), nn.Linear(8, 3))
    opt = td.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    loader = td.data.DataLoader(Digits(48), 16, shuffle=True)
    trainer = train.Trainer(model, opt, loader, precision=precision, fuse=fuse)
    stats = trainer.train_epoch(progress=False)
    return trainer, stats, train.evaluate(model, loader, precision=precision)


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_trainer_in_low_precision_follows_fp32(precision):
    """Autocast (fp16: and loss scaling) on the numpy backend: the fused MLP step and the fused
    head give way to their per-op forms, and loss, accuracy and evaluation stay within
    half-precision noise of fp32's."""
    with td.use_backend("numpy"):
        base, want, want_eval = _mlp_epoch("fp32")
        trainer, got, got_eval = _mlp_epoch(precision)
    assert base.fused and not trainer.fused and "per-op" in trainer.precision_note
    assert trainer.scaler.is_enabled() == (precision == "fp16")
    if precision == "fp16":  # no inf/nan: every step taken, the scale untouched
        assert trainer.scaler.get_scale() == 2.0 ** 16
    assert got["loss"] == pytest.approx(want["loss"], rel=2e-2)
    assert got_eval[0] == pytest.approx(want_eval[0], rel=2e-2)
    assert abs(got["accuracy"] - want["accuracy"]) <= 2 / 48


def test_a_captured_fp16_step_needs_an_optimizer_that_reads_the_flag():
    model = nn.Sequential(nn.Flatten(), nn.Linear(30, 3))
    loader = td.data.DataLoader(Digits(8), 4)
    with td.use_backend("numpy"), pytest.raises(ValueError, match="Adadelta reads it on the host"):
        train.Trainer(model, td.optim.Adadelta(model.parameters()), loader, graph=True,
                      precision="fp16")


def test_the_command_line_trains_in_fp16_and_keeps_it_on_resume(tmp_path, capsys):
    import json

    from tritonad import cli

    ckpt = tmp_path / "logreg.tdckpt"
    common = ["train", "--model", "logreg", "--limit", "64", "--batch-size", "32", "--backend",
              "numpy", "--quiet"]
    cli.main(common + ["--epochs", "1", "--precision", "fp16", "--save", str(ckpt)])
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    saved = td.load(ckpt)
    assert out["precision"] == "fp16" and saved["precision"] == "fp16"
    assert saved["run"]["precision"] == "fp16" and saved["scaler"]["scale"] == 2.0 ** 16
    with pytest.raises(SystemExit):
        cli.main(common + ["--epochs", "2", "--resume", str(ckpt), "--precision", "bf16"])
    assert "continues a run with --precision fp16" in capsys.readouterr().err
