"""Errors in the data (a class index out of range, a row index out of bounds) are found by the
kernels without a host sync and raised at the next read of the device (kernels/errors.py).

On the CPU the triton backend runs under the interpreter with the same flags as on a GPU, so
these tests check the asynchronous path itself: no raise at the op, a clear raise at the read
(.item(), .numpy(), printing), the flags cleared after it, and the synchronous debugging mode.
"""
import numpy as np
import pytest
import torch

import tritonad as td
import tritonad.nn.functional as F
from tritonad import nn, optim


@pytest.fixture
def triton_backend():
    with td.use_backend("triton"):
        yield
    td.set_sync_checks(False)


def test_a_bad_label_in_an_eager_training_step_raises_at_the_next_read(triton_backend):
    model = nn.Sequential(nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 3))
    opt = optim.SGD(model.parameters(), lr=0.1)
    x = td.randn(4, 6)
    good, bad = td.tensor([0, 2, 1, 0]), td.tensor([0, 2, 7, 0])
    loss = F.cross_entropy(model(x), bad)  # no raise here: nothing was read back
    opt.zero_grad()
    loss.backward()
    opt.step()
    with pytest.raises(ValueError, match=r"^cross_entropy: target 7 is outside \[0, 3\) \(at "
                                         r"row 2\); found on the device"):
        loss.item()
    # reported once: the next read is clean, and training goes on
    loss = F.cross_entropy(model(x), good)
    assert np.isfinite(loss.item())


@pytest.mark.parametrize("read", ["item", "numpy", "tolist", "repr"])
def test_every_host_read_reports(triton_backend, read):
    logits = td.randn(3, 4)
    loss = F.cross_entropy(logits, td.tensor([1, -2, 0]))
    with pytest.raises(ValueError, match="cross_entropy: target -2"):
        {"item": loss.item, "numpy": loss.numpy, "tolist": loss.tolist,
         "repr": lambda: repr(loss)}[read]()


def test_ignored_rows_are_not_errors(triton_backend):
    logits = td.randn(3, 4)
    loss = F.cross_entropy(logits, td.tensor([1, -100, 0]))
    assert np.isfinite(loss.item())


def test_a_bad_row_index_raises_at_the_next_read(triton_backend):
    x = td.arange(12.0).reshape(4, 3)
    rows = x[td.tensor([1, 9, -1])]  # gathers, clamps the bad index, reports it
    assert rows.shape == (3, 3)
    with pytest.raises(IndexError, match=r"gather_rows: index 9 is out of bounds for dimension "
                                         r"0 with size 4 \(at position 1\)"):
        rows.numpy()
    assert x[td.tensor([-4, 3])].tolist() == [[0.0, 1.0, 2.0], [9.0, 10.0, 11.0]]


def test_nll_loss_checks_its_targets_without_a_sync(triton_backend):
    log_probs = td.randn(4, 3).log_softmax(1)
    loss = F.nll_loss(log_probs, td.tensor([0, 3, 1, 2]))
    with pytest.raises(ValueError, match=r"nll_loss: target 3 is outside \[0, 3\) \(at row 1\)"):
        loss.item()


def test_synchronous_checks_raise_at_the_op(triton_backend):
    td.set_sync_checks(True)
    assert td.sync_checks()
    logits = td.randn(3, 4)
    with pytest.raises(ValueError, match="cross_entropy: target 9"):
        F.cross_entropy(logits, td.tensor([1, 9, 0]))
    with pytest.raises(IndexError, match="gather_rows: index -7"):
        logits[td.tensor([-7])]
    td.set_sync_checks(False)
    F.cross_entropy(logits, td.tensor([1, 9, 0]))  # deferred again
    with pytest.raises(ValueError, match="cross_entropy: target 9"):
        logits.sum().item()  # any read of the device reports it


def test_the_numpy_backend_raises_at_the_op():
    with td.use_backend("numpy"):
        with pytest.raises(ValueError, match="cross_entropy: target 9"):
            F.cross_entropy(td.randn(3, 4), td.tensor([1, 9, 0]))


def test_the_trainer_reports_a_bad_label_at_the_end_of_the_epoch(triton_backend):
    from tritonad import train

    class Tiny:  # an array-backed dataset, as MNIST is
        images = np.random.default_rng(0).random((24, 5)).astype(np.float32)
        labels = np.array([0, 1, 2] * 8)

    Tiny.labels[17] = 5  # one mislabelled sample
    loader = td.data.DataLoader(Tiny(), batch_size=8)
    model = nn.Sequential(nn.Linear(5, 4), nn.ReLU(), nn.Linear(4, 3))
    for fuse in (False, True):  # the per-op step and the fused MLP step
        trainer = train.Trainer(model, optim.SGD(model.parameters(), lr=0.1), loader, fuse=fuse)
        assert trainer.fused == fuse
        with pytest.raises(ValueError, match=r"target 5 .*is outside \[0, 3\)"):
            trainer.train_epoch(progress=False)


def test_error_flags_made_inside_compile_ahead_start_at_zero(monkeypatch):
    """The error flags made on first use inside a compile_ahead block (train's precompile, where
    launches only compile) are zeroed for real: the allocator's leftovers would otherwise be
    read back as errors that never happened (an IndexError from garbage, seen on an H100)."""
    from tritonad.kernels import errors, launch, plans

    device = torch.device("cpu")
    monkeypatch.setattr(errors, "_FLAGS", {})
    real_empty = errors.torch.empty
    monkeypatch.setattr(errors.torch, "empty",
                        lambda *args, **kwargs: real_empty(*args, **kwargs).fill_(7))
    with td.use_backend("triton"), plans.compile_ahead():
        flags = errors._flags(device)
    assert not flags.any()
