"""td.amp.GradScaler against torch.amp.GradScaler (CPU): the same scales and parameters over
steps with and without inf/NaN gradients, for the optimizers that skip on the device (SGD,
Adam, AdamW: no host read in step or update) and one that reads the flag on the host; the
unscale and update primitives on both backends; errors and state."""
import numpy as np
import pytest
import torch

import tritonad as td
import tritonad.nn as nn
from tritonad.backend import get_backend

OPTIMIZERS = {"SGD": dict(lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-2),
              "Adam": dict(lr=0.05), "AdamW": dict(lr=0.05, weight_decay=0.1),
              "RMSprop": dict(lr=0.01)}


def _pair(name):
    td.manual_seed(0)
    ours = nn.Sequential(nn.Linear(4, 5), nn.ReLU(), nn.Linear(5, 3))
    theirs = torch.nn.Sequential(torch.nn.Linear(4, 5), torch.nn.ReLU(), torch.nn.Linear(5, 3))
    with torch.no_grad():
        for p, q in zip(ours.parameters(), theirs.parameters()):
            q.copy_(torch.from_numpy(p.numpy()))
    return (ours, getattr(td.optim, name)(ours.parameters(), **OPTIMIZERS[name]),
            theirs, getattr(torch.optim, name)(theirs.parameters(), **OPTIMIZERS[name]))


# every optimizer on the numpy backend; the two device-skip kernels (SGD's, Adam's) under the
# interpreter too (4 s each there)
CASES = [("numpy", name) for name in OPTIMIZERS] + [("triton", "SGD"), ("triton", "AdamW")]


@pytest.mark.parametrize("backend_name, name", CASES)
def test_matches_torch_over_skipped_and_taken_steps(backend_name, name, monkeypatch):
    with td.use_backend(backend_name):
        ours, opt, theirs, topt = _pair(name)
        scaler = td.amp.GradScaler(init_scale=2.0 ** 12, growth_interval=3)
        tscaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 12, growth_interval=3)
        for step in range(8):
            x = np.random.RandomState(step).randn(6, 4).astype(np.float32)
            if step in (0, 4):  # the first step skipped too: Adam's count must not advance
                x[1, 2] = np.inf if step == 0 else np.nan
            for model, o, s, t in ((ours, opt, scaler, td.tensor),
                                   (theirs, topt, tscaler, torch.from_numpy)):
                o.zero_grad()
                s.scale((model(t(x)) ** 2).mean()).backward()
                if step == 5:  # unscaled first, then clipped, as a user would
                    s.unscale_(o)
                    clip = td.nn.utils.clip_grad_norm_ if s is scaler else \
                        torch.nn.utils.clip_grad_norm_
                    clip(model.parameters(), 0.5)
                if s is scaler and name != "RMSprop":  # no host read in step() or update()
                    monkeypatch.setattr(td.Tensor, "item", _no_host_read)
                s.step(o)
                s.update()
                monkeypatch.undo()
            assert scaler.get_scale() == tscaler.get_scale(), step
        for p, q in zip(ours.parameters(), theirs.parameters()):
            # (float32 rounding, which Adam's normalised steps carry: 1.4e-6 on the GPU)
            np.testing.assert_allclose(p.numpy(), q.detach().numpy(), rtol=2e-5, atol=5e-6)


def _no_host_read(self):
    raise AssertionError("a host read during GradScaler.step / update")


@pytest.mark.parametrize("dtype", [td.float32, td.bfloat16])
def test_unscale_and_update_primitives(backend_name, dtype):
    with td.use_backend(backend_name):
        be = get_backend()
        x = td.tensor([1.0, -2.0, 8.0, 0.5]).to(dtype)
        scale, tracker, found = (td.tensor([v]) for v in (4.0, 0.0, 0.0))
        be.amp_unscale_([x._data], scale._data, found._data)
        np.testing.assert_array_equal(x.float().numpy(), [0.25, -0.5, 2.0, 0.125])
        assert found.item() == 0.0
        y = td.tensor([1.0, float("nan"), 3.0])
        be.amp_unscale_([y._data], scale._data, found._data)
        assert found.item() == 1.0
        be.amp_update_scale_(scale._data, tracker._data, found._data, 2.0, 0.25, 2)
        assert (scale.item(), tracker.item(), found.item()) == (1.0, 0.0, 0.0)
        for expected in ((1.0, 1.0), (2.0, 0.0), (2.0, 1.0)):  # two good steps grow it
            be.amp_update_scale_(scale._data, tracker._data, found._data, 2.0, 0.25, 2)
            assert (scale.item(), tracker.item()) == expected


def test_errors_state_and_disabled():
    td.set_backend("numpy")
    model = nn.Linear(3, 2)
    opt = td.optim.SGD(model.parameters(), lr=0.1)
    scaler = td.amp.GradScaler(init_scale=8.0)
    with pytest.raises(RuntimeError, match="no loss was scaled yet"):
        scaler.unscale_(opt)
    scaler.scale(model(td.ones(1, 3)).sum()).backward()
    scaler.unscale_(opt)
    with pytest.raises(RuntimeError, match="already been called on this optimizer"):
        scaler.unscale_(opt)
    scaler.step(opt)
    scaler.update()
    state = scaler.state_dict()
    assert state == {"scale": 8.0, "growth_factor": 2.0, "backoff_factor": 0.5,
                     "growth_interval": 2000, "_growth_tracker": 1}
    other = td.amp.GradScaler()
    other.load_state_dict(state)
    assert other.get_scale() == 8.0
    with pytest.raises(ValueError, match="growth_factor must be > 1"):
        td.amp.GradScaler(growth_factor=1.0)
    off = td.amp.GradScaler(enabled=False)
    loss = model(td.ones(1, 3)).sum()
    assert off.scale(loss) is loss and off.get_scale() == 1.0 and off.state_dict() == {}
