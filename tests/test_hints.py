"""A missing PyTorch name in tritonad, tritonad.nn, tritonad.optim or tritonad.data raises an
AttributeError that says what to use instead (tritonad/_hints.py)."""
import importlib

import pytest

import tritonad as td
from tritonad import _hints, optim


@pytest.mark.parametrize("module_name", sorted(_hints.HINTS))
def test_every_hint_is_shown_for_a_missing_name(module_name):
    module = importlib.import_module(module_name)
    shown = 0
    for name, hint in _hints.HINTS[module_name].items():
        if name in vars(module):  # added since the table was written: nothing to hint
            continue
        with pytest.raises(AttributeError) as err:
            getattr(module, name)
        message = str(err.value)
        assert message.startswith(f"module {module_name!r} has no attribute {name!r}; {hint}")
        assert "\n" not in message
        assert not hasattr(module, name)
        shown += 1
    assert shown


def test_the_optimizers_listed_are_those_the_module_has(monkeypatch):
    with pytest.raises(AttributeError, match=r"'LBFGS'; not supported yet; tritonad.optim has "
                                             r"the optimizers .*SGD, Adam, AdamW.* and the "
                                             r"schedulers .*StepLR") as err:
        optim.LBFGS
    for name in ("Adadelta", "Adagrad", "RMSprop", "SGD", "Adam", "AdamW"):
        assert name in str(err.value)

    class Lion(optim.Optimizer):  # one added later (another module, a user's) shows up
        pass

    monkeypatch.setattr(optim, "Lion", Lion, raising=False)
    with pytest.raises(AttributeError, match=r"optimizers .*SGD, .*Lion and the schedulers"):
        optim.LBFGS


def test_names_without_a_hint_and_private_names_stay_plain():
    with pytest.raises(AttributeError, match=r"^module 'tritonad' has no attribute 'frobnicate'$"):
        td.frobnicate
    with pytest.raises(AttributeError, match=r"^module 'tritonad.nn' has no attribute "
                                             r"'__wrapped__'$"):
        td.nn.__wrapped__
    # a capitalised name (a class a user looked for) lists what there is
    with pytest.raises(AttributeError, match=r"'Conv4d'; tritonad.nn has .*Conv2d, .*Linear"):
        td.nn.Conv4d
    with pytest.raises(AttributeError, match=r"'CIFAR10'; not available; .*__getitem__.*"
                                             r"tritonad.data has DataLoader and the datasets "
                                             r"MNIST, FashionMNIST"):
        td.data.CIFAR10


def test_imports_still_work():
    from tritonad import data, nn  # noqa: F401
    from tritonad.nn import functional  # noqa: F401
    with pytest.raises(ImportError, match="cannot import name 'Adamax'"):
        from tritonad.optim import Adamax  # noqa: F401


def test_the_hinted_replacements_run():
    x = td.tensor([[-1.0, 0.5], [2.0, 0.0]])
    assert x.shape == (x * x.sigmoid()).shape
    assert abs((x - 1).abs().mean().item() - 1.125) < 1e-6
    assert (td.rand(100) * 7).long().max().item() < 7
    assert sorted(td.randperm(5).tolist()) == [0, 1, 2, 3, 4]
    assert td.clamp(x, -0.5, 0.5).max().item() == 0.5


def _torch_names_we_lack(theirs, ours, keep=lambda value: True):
    return [name for name in dir(theirs) if not name.startswith("_") and not hasattr(ours, name)
            and keep(getattr(theirs, name))]


def test_every_functional_of_torch_we_lack_gives_a_hint():
    import types

    import torch.nn.functional as torch_F

    import tritonad.nn.functional as F

    # callables only: torch_F also holds typing names and its dispatch helpers
    lacking = _torch_names_we_lack(torch_F, F, lambda v: callable(v) and not isinstance(
        v, (type, types.ModuleType)) and (getattr(v, "__module__", "") or "").startswith("torch")
        and "torch_function" not in getattr(v, "__name__", ""))
    assert lacking
    for name in lacking:
        if name in ("boolean_dispatch", "assert_int_or_pair"):  # torch's internal helpers
            continue
        with pytest.raises(AttributeError, match=rf"^module 'tritonad.nn.functional' has no "
                                                 rf"attribute '{name}'; \S"):
            getattr(F, name)


def test_every_tensor_method_of_torch_we_lack_gives_a_hint():
    import torch

    lacking = _torch_names_we_lack(torch.Tensor, td.Tensor)
    assert lacking
    x = td.ones(2)
    for name in lacking:
        with pytest.raises(AttributeError, match=rf"^'Tensor' object has no attribute '{name}'; "
                                                 rf"\S"):
            getattr(x, name)
    with pytest.raises(AttributeError, match="'exp_'; out of place, use x = x.exp"):
        x.exp_()
    with pytest.raises(AttributeError, match=r"^'Tensor' object has no attribute 'frobnicate'$"):
        x.frobnicate
    assert not hasattr(x, "__array_interface__")  # probes for private names stay plain
