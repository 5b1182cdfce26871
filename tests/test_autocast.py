"""td.autocast: the per-op precision policy (as torch.autocast's), gradients back to float32
weights, the per-block cast cache, nesting, the decorator form and bad arguments. On the CPU
the numpy backend and the triton backend under the interpreter; torch.autocast on the CPU is
the reference for which op runs in which dtype."""
import numpy as np
import pytest

import tritonad as td
import tritonad.nn as nn
import tritonad.nn.functional as F
from tritonad.autodiff import autocast as ac


def _kind():
    """The device type of new tensors on the backend in use (cuda for triton on a GPU)."""
    return td.get_backend().default_device.type


def _model(seed=0):
    td.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 12), nn.ReLU(), nn.Linear(12, 3))


# PyTorch's CUDA autocast policy (its "Autocast Op Reference"): the lower-precision ops, the
# float32 ops, and ops that run in their inputs' promoted type. (torch.autocast on the CPU has
# a list of its own, softmax in bf16 among others, so it is no oracle for this.)
LOW, FLOAT32, PROMOTED = ("linear", "matmul", "conv2d"), \
    ("softmax", "log_softmax", "sum", "exp", "cross_entropy", "pow", "layer_norm"), \
    ("add", "relu")


@pytest.mark.parametrize("dtype", [td.bfloat16, td.float16])
def test_policy(backend_name, dtype):
    """Which dtype each op returns under autocast."""
    with td.use_backend(backend_name):
        x = td.randn(4, 6)
        w = td.randn(5, 6, requires_grad=True)
        img, k = td.randn(1, 2, 5, 5), td.randn(3, 2, 3, 3)
        with td.autocast(_kind(), dtype=dtype):
            h = x @ w.t()
            ours = {"linear": F.linear(x, w), "matmul": h, "conv2d": F.conv2d(img, k),
                    "softmax": F.softmax(h, 1), "log_softmax": F.log_softmax(h, 1),
                    "sum": h.sum(), "exp": td.exp(h), "pow": h ** 2, "add": h + td.randn(4, 5),
                    "relu": h.relu(), "cross_entropy": F.cross_entropy(h, td.tensor([0, 1, 2, 3])),
                    "layer_norm": F.layer_norm(h, (5,))}
        for name in LOW:
            assert ours[name].dtype == dtype, name
        for name in FLOAT32:
            assert ours[name].dtype == td.float32, name
        assert ours["add"].dtype == td.float32 and ours["relu"].dtype == dtype
        np.testing.assert_allclose(ours["matmul"].float().numpy(), (x @ w.t()).numpy(),
                                   rtol=0.02, atol=0.05)


def test_values_and_gradients_are_the_low_precision_computation(backend_name):
    """An autocast forward equals the same model run by hand on bf16 copies of its weights,
    and the gradients land on the float32 weights in float32, equal to the hand-cast ones."""
    with td.use_backend(backend_name):
        model = _model()
        x, y = td.randn(5, 6), td.tensor([0, 2, 1, 1, 0])
        with td.autocast(_kind(), dtype=td.bfloat16):
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        ws = [p.detach().to(td.bfloat16).requires_grad_() for p in model.parameters()]
        h = F.linear(x.to(td.bfloat16), ws[0], ws[1]).relu()
        manual = F.cross_entropy(F.linear(h, ws[2], ws[3]).float(), y)
        manual.backward()
        assert loss.dtype == td.float32
        np.testing.assert_allclose(loss.numpy(), manual.numpy(), rtol=1e-6)
        for p, w in zip(model.parameters(), ws):
            assert p.grad.dtype == td.float32
            np.testing.assert_allclose(p.grad.numpy(), w.grad.float().numpy(), rtol=1e-6,
                                       atol=1e-7)


def test_a_weight_is_cast_once_per_block_and_again_after_it_changes():
    td.set_backend("numpy")
    w = td.randn(4, 4, requires_grad=True)
    x = td.randn(2, 4)
    with td.autocast("cpu"):
        x @ w
        first = ac.state.cache[id(w)][2]
        x @ w
        assert ac.state.cache[id(w)][2] is first  # reused
        with td.no_grad():
            w.mul_(2.0)
        x @ w
        assert ac.state.cache[id(w)][2] is not first  # the weight changed: cast again
    assert ac.state.cache == {}  # emptied when the block exits
    with td.autocast("cpu", cache_enabled=True):
        (x @ w).sum()
        (x @ w).sum()
    assert ac.state.cache == {}


def test_nesting_decorator_and_device_type():
    td.set_backend("numpy")
    a = td.randn(3, 3)
    with td.autocast("cpu"):
        assert (a @ a).dtype == td.bfloat16
        assert td.is_autocast_enabled("cpu") and td.get_autocast_dtype("cpu") == td.bfloat16
        with td.autocast("cpu", enabled=False):
            assert (a @ a).dtype == td.float32
        assert (a @ a).dtype == td.bfloat16
    assert not td.is_autocast_enabled("cpu")
    with td.autocast("cuda", dtype=td.bfloat16):  # cpu tensors: not under a cuda autocast
        assert (a @ a).dtype == td.float32

    @td.autocast("cpu", dtype=td.float16)
    def f(t):
        return t @ t

    assert f(a).dtype == td.float16 and (a @ a).dtype == td.float32
    with td.amp.autocast("cpu"):  # (td.amp's name too)
        assert (a @ a).dtype == td.bfloat16


def test_bad_arguments():
    with pytest.raises(ValueError, match="autocast: dtype must be td.float16 or td.bfloat16"):
        td.autocast("cpu", dtype=td.float32)
    with pytest.raises(ValueError, match="autocast: device_type must be 'cuda' or 'cpu'"):
        td.autocast("tpu")
