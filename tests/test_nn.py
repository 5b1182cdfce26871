"""nn: Module bookkeeping, state dicts, layers and losses against torch.nn, initialisation."""
import math

import numpy as np
import pytest
import torch

import tritonad as td
from helpers import assert_close
from tritonad import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 2, 3)
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(8, 3))
        self.scale = 2.0
        self.register_buffer("steps", td.zeros(1))

    def forward(self, x):
        return self.head(self.conv(x).relu()) * self.scale


def test_registration_and_traversal():
    net = Net()
    assert [n for n, _ in net.named_parameters()] == ["conv.weight", "conv.bias",
                                                      "head.1.weight", "head.1.bias"]
    assert [type(m).__name__ for m in net.children()] == ["Conv2d", "Sequential"]
    assert [n for n, _ in net.named_modules()] == ["", "conv", "head", "head.0", "head.1"]
    # torch's order: a module's own parameters and buffers, then its children's
    assert list(net.state_dict()) == ["steps", "conv.weight", "conv.bias", "head.1.weight",
                                      "head.1.bias"]
    assert all(p.requires_grad and p.is_leaf for p in net.parameters())
    assert net.scale == 2.0 and "scale" not in net._parameters
    with pytest.raises(AttributeError, match="no attribute 'missing'"):
        net.missing


def test_attributes_assigned_after_none_resolve_to_the_registered_value():
    # as torch.nn.Module: the later registration is what the attribute reads
    for lib in (nn, torch.nn):
        ones = td.ones if lib is nn else torch.ones

        class Block(lib.Module):
            def __init__(self):
                super().__init__()
                self.short = None
                self.scale = None
                self.register_buffer("count", None)
                self.short = lib.Sequential(lib.Linear(2, 2))
                self.scale = lib.Parameter(ones(2))
                self.count = ones(1)

        block = Block()
        assert isinstance(block.short, lib.Sequential)
        assert block.scale is block._parameters["scale"]
        assert block.count is block._buffers["count"]
        assert list(block.state_dict()) == ["scale", "count", "short.0.weight", "short.0.bias"]
        block.short = None                      # None keeps the name registered
        assert block.short is None and "short" in block._modules
        assert [n for n, _ in block.named_parameters()] == ["scale"]


def test_super_init_is_required():
    class Bad(nn.Module):
        def __init__(self):
            self.w = nn.Parameter(td.ones(1))

    with pytest.raises(AttributeError, match="super"):
        Bad()


def test_state_dict_round_trip_keeps_parameter_identity():
    a, b = Net(), Net()
    weight = b.conv.weight
    b.load_state_dict(a.state_dict())
    assert b.conv.weight is weight
    for (n1, p1), (n2, p2) in zip(a.state_dict().items(), b.state_dict().items()):
        assert n1 == n2 and p1.tolist() == p2.tolist()


def test_load_state_dict_lists_every_problem():
    net = Net()
    state = net.state_dict()
    state["extra"] = td.ones(1)
    del state["conv.bias"]
    state["head.1.weight"] = td.ones(4, 4)
    with pytest.raises(RuntimeError) as err:
        net.load_state_dict(state)
    message = str(err.value)
    assert "missing keys: conv.bias" in message and "unexpected keys: extra" in message
    assert "head.1.weight: checkpoint (4, 4) vs model (3, 8)" in message
    del state["head.1.weight"]
    missing, unexpected = net.load_state_dict(state, strict=False)
    assert missing == ["conv.bias", "head.1.weight"] and unexpected == ["extra"]


def test_train_eval_zero_grad_and_repr():
    net = Net()
    assert net.training and net.head.training
    net.eval()
    assert not net.training and not net.head[1].training
    out = net(td.randn(2, 1, 4, 4)).sum()
    out.backward()
    assert net.conv.weight.grad is not None
    net.zero_grad()
    assert all(p.grad is None for p in net.parameters())
    assert "(conv): Conv2d(1, 2, kernel_size=(3, 3), stride=(1, 1))" in repr(net)
    assert "(1): Linear(in_features=8, out_features=3, bias=True)" in repr(net)


def test_to_changes_dtype_in_place():
    net = Net()
    weight = net.conv.weight
    net.to(td.float64)
    assert net.conv.weight is weight and weight.dtype is td.float64
    assert net.steps.dtype is td.float64


def test_init_bounds_match_torch():
    td.manual_seed(0)
    lin = nn.Linear(400, 50)
    bound = 1 / math.sqrt(400)
    w = lin.weight.numpy()
    assert w.min() >= -bound and w.max() <= bound and w.std() > 0.9 * bound / math.sqrt(3)
    conv = nn.Conv2d(3, 8, 5)
    assert conv.weight.numpy().max() <= 1 / math.sqrt(75)
    t = td.empty(300, 200)
    nn.init.kaiming_normal_(t, nonlinearity="relu")
    assert abs(t.numpy().std() - math.sqrt(2 / 200)) < 0.01
    nn.init.xavier_uniform_(t)
    assert abs(t.numpy().max() - math.sqrt(6 / 500)) < 0.01
    assert nn.init.calculate_gain("tanh") == 5 / 3


def _copy_to_torch(ours, theirs):
    with torch.no_grad():
        for (_, p), (_, q) in zip(ours.named_parameters(), theirs.named_parameters()):
            q.copy_(torch.from_numpy(p.numpy()))


@pytest.mark.parametrize("build", [
    lambda m: m.Linear(7, 5),
    lambda m: m.Conv2d(3, 4, 3, stride=2, padding=1),
    lambda m: m.Sequential(m.Linear(6, 4), m.ReLU(), m.Linear(4, 3), m.Tanh()),
    lambda m: m.Sequential(m.Conv2d(2, 3, 3, padding=1), m.ReLU(), m.MaxPool2d(2), m.Flatten(),
                           m.Linear(12, 2), m.Sigmoid()),
    lambda m: m.AvgPool2d(3, stride=2, padding=1),
], ids=["linear", "conv", "mlp", "cnn", "avgpool"])
def test_layers_match_torch_forward_and_backward(build, backend_name):
    td.manual_seed(1)
    ours, theirs = build(nn), build(torch.nn)
    _copy_to_torch(ours, theirs)
    shapes = {"Linear": (4, 7), "Conv2d": (2, 3, 5, 5), "AvgPool2d": (2, 2, 5, 5)}
    if type(ours).__name__ in shapes:
        in_shape = shapes[type(ours).__name__]
    else:
        in_shape = (3, 6) if type(ours[0]).__name__ == "Linear" else (2, 2, 4, 4)
    x = np.random.default_rng(0).standard_normal(in_shape).astype(np.float32)
    xo, xt = td.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    yo, yt = ours(xo), theirs(xt)
    cot = np.random.default_rng(1).standard_normal(yt.shape).astype(np.float32)
    yo.backward(td.tensor(cot))
    yt.backward(torch.tensor(cot))
    assert_close(yo, yt.detach().numpy(), 1e-4, 1e-5, name="forward")
    assert_close(xo.grad, xt.grad.numpy(), 1e-4, 1e-5, name="input grad")
    for (n, p), (_, q) in zip(ours.named_parameters(), theirs.named_parameters()):
        assert_close(p.grad, q.grad.numpy(), 1e-4, 1e-5, name=f"grad of {n}")


def test_sequential_fuses_linear_relu_with_the_same_result():
    td.manual_seed(2)
    seq = nn.Sequential(nn.Linear(5, 4), nn.ReLU())
    x = td.randn(3, 5)
    fused = seq(x)
    plain = seq[1](seq[0](x))
    assert fused.grad_fn.name == "LinearBackward"
    assert_close(fused, plain, 1e-6, 1e-6)


@pytest.mark.parametrize("pool", [nn.MaxPool2d(2), nn.MaxPool2d(3, 2, padding=1, ceil_mode=True),
                                  nn.MaxPool2d(2, 1, dilation=2)])
def test_sequential_fuses_conv_relu_max_pool_with_the_same_result_and_gradients(pool):
    """Conv2d, ReLU, MaxPool2d run as one node whose pool backward applies relu' (the pool's
    output as the gate): the values and the gradients of x, weight and bias are those of the
    three modules one by one, to the bit, on tiling and overlapping windows."""
    td.manual_seed(3)
    seq = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), pool)
    x = td.randn(2, 3, 7, 6, requires_grad=True)
    fused = seq(x)
    assert fused.grad_fn.name == "Conv2dReluMaxPool2dBackward"
    inner = seq[0](x, activation="relu")
    assert inner.grad_fn.name == "Conv2dBackward"
    cot = td.randn(*fused.shape)
    (fused * cot).sum().backward()
    params = (x, seq[0].weight, seq[0].bias)
    got = [t.grad.numpy().copy() for t in params]
    for t in params:
        t.grad = None
    plain = seq[2](seq[1](seq[0](x)))
    assert plain.grad_fn.name == "MaxPool2dBackward"
    np.testing.assert_array_equal(fused.numpy(), plain.numpy())
    (plain * cot).sum().backward()
    for g, t in zip(got, params):
        np.testing.assert_array_equal(g, t.grad.numpy())
    with td.no_grad():  # nothing recorded: the convolution and the pool as they are
        np.testing.assert_array_equal(seq(x).numpy(), plain.numpy())
    seq[2].return_indices = True  # (the caller wants the indices: not fused)
    assert seq(x)[0].grad_fn.name == "MaxPool2dBackward"


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_losses_match_torch(reduction, backend_name):
    rng = np.random.default_rng(3)
    logits = rng.standard_normal((6, 4)).astype(np.float32)
    target = np.array([0, 3, 1, 1, 2, 0])
    pairs = [(nn.CrossEntropyLoss(reduction=reduction, label_smoothing=0.1),
              torch.nn.CrossEntropyLoss(reduction=reduction, label_smoothing=0.1)),
             (nn.NLLLoss(reduction=reduction), torch.nn.NLLLoss(reduction=reduction))]
    for ours, theirs in pairs:
        xo, xt = td.tensor(logits, requires_grad=True), torch.tensor(logits, requires_grad=True)
        lo = ours(xo, td.tensor(target))
        lt = theirs(xt, torch.tensor(target))
        assert_close(lo, lt.detach().numpy(), 1e-5, 1e-6)
        lo.sum().backward()
        lt.sum().backward()
        assert_close(xo.grad, xt.grad.numpy(), 1e-5, 1e-6)
    a, b = rng.standard_normal((2, 3, 2)).astype(np.float32)
    assert_close(nn.MSELoss(reduction)(td.tensor(a), td.tensor(b)),
                 torch.nn.MSELoss(reduction=reduction)(torch.tensor(a), torch.tensor(b)).numpy(),
                 1e-5, 1e-6)


def test_dropout_module_respects_mode():
    drop = nn.Dropout(0.5)
    x = td.ones(100)
    assert (drop(x).numpy() == 0).sum() > 10
    drop.eval()
    assert drop(x) is x
    with pytest.raises(ValueError, match="p must be in"):
        nn.Dropout(1.5)


def test_layer_argument_errors():
    with pytest.raises(ValueError, match="divisible by groups"):
        nn.Conv2d(3, 4, 3, groups=2)
    with pytest.raises(ValueError, match="in_features must be positive"):
        nn.Linear(0, 3)
    with pytest.raises(ValueError, match="linear: input of shape"):
        nn.Linear(3, 2)(td.ones(2, 4))
    with pytest.raises(TypeError, match="not a Module"):
        nn.Sequential(nn.ReLU(), lambda x: x)


def test_module_list_and_dict_register_as_torch():
    import torch

    def net(lib):
        class Net(lib.Module):
            def __init__(self):
                super().__init__()
                self.blocks = lib.ModuleList([lib.Linear(4, 4) for _ in range(2)])
                self.heads = lib.ModuleDict({"a": lib.Linear(4, 2), "b": lib.Linear(4, 3)})

            def forward(self, x):
                for block in self.blocks:
                    x = block(x).relu()
                return self.heads["a"](x), self.heads["b"](x)
        return Net()

    ours, theirs = net(nn), net(torch.nn)
    assert list(ours.state_dict()) == list(theirs.state_dict())
    ours.load_state_dict({k: td.tensor(v.detach().numpy())
                          for k, v in theirs.state_dict().items()})
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    for got, want in zip(ours(td.tensor(x)), theirs(torch.tensor(x))):
        np.testing.assert_allclose(got.numpy(), want.detach().numpy(), rtol=1e-5, atol=1e-6)
    blocks = ours.blocks
    blocks.append(nn.ReLU()).insert(0, nn.Identity())
    assert [type(m).__name__ for m in blocks] == ["Identity", "Linear", "Linear", "ReLU"]
    del blocks[0]
    assert list(blocks._modules) == ["0", "1", "2"] and isinstance(blocks[-1], nn.ReLU)
    assert len(blocks[:2]) == 2 and len(list(ours.parameters())) == 8
    assert "a" in ours.heads and list(ours.heads.keys()) == ["a", "b"]
    with pytest.raises(TypeError, match="ModuleList: item 3 is a int, not a Module"):
        blocks.append(3)
    with pytest.raises(IndexError, match="ModuleList: index 5 is out of range for 3 modules"):
        blocks[5]
    with pytest.raises(TypeError, match="ModuleDict: 'c' is a str, not a Module"):
        ours.heads["c"] = "layer"
