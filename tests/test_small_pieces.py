"""The small pieces a PyTorch user reaches for (tritonad/conveniences.py, linalg.py,
nn/container.py, nn/dropout_shape.py, and Module.register_buffer, no_grad, Tensor.norm /
unbind / unflatten) against PyTorch's behaviour, computed values on both backends."""
import numpy as np
import pytest
import torch
from helpers import assert_close

import tritonad as td
import tritonad.nn.functional as F
from tritonad import nn

INF = float("inf")
RNG = np.random.default_rng(0)
pytestmark = pytest.mark.filterwarnings("ignore:.*encountered in:RuntimeWarning")


# ----------------------------------------------------------------------------- grad modes


def test_no_grad_as_a_bare_decorator_and_called():
    x = td.ones(2, requires_grad=True)

    @td.no_grad
    def bare(t):
        return t * 2, td.is_grad_enabled()

    @td.no_grad()
    def called(t):
        return t * 2

    y, enabled = bare(x)
    assert not y.requires_grad and not enabled and bare.__name__ == "bare"
    assert not called(x).requires_grad and td.is_grad_enabled()
    with td.no_grad():
        @td.enable_grad
        def inside(t):
            return t * 2
        assert inside(x).requires_grad and not td.is_grad_enabled()
    with pytest.raises(TypeError, match="no_grad"):
        td.no_grad(3)


# ----------------------------------------------------------------------------- modules


class _WithBuffers(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(2, 2)
        self.register_buffer("kept", td.ones(2))
        self.register_buffer("scratch", td.zeros(3), persistent=False)


def test_register_buffer_persistent_false_stays_out_of_state_dict():
    m = _WithBuffers()
    assert set(m.state_dict()) == {"lin.weight", "lin.bias", "kept"}
    assert [n for n, _ in m.named_buffers()] == ["kept", "scratch"]
    m.scratch = td.full((3,), 5.0)  # assigning keeps it a non-persistent buffer
    assert "scratch" not in m.state_dict() and m.scratch.tolist() == [5.0] * 3
    m.to(td.float64)
    assert m.scratch.dtype is td.float64  # moved and cast with the module
    other = _WithBuffers()
    other.load_state_dict(m.to(td.float32).state_dict())  # strict: no missing keys
    m.register_buffer("scratch", td.zeros(3))  # registered again, persistent
    assert "scratch" in m.state_dict()
    with pytest.raises(KeyError, match="'a.b'"):
        m.register_buffer("a.b", td.zeros(1))


def test_parameter_list_and_dict_register_their_parameters():
    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.scales = nn.ParameterList([nn.Parameter(td.ones(2)), td.zeros(3)])
            self.heads = nn.ParameterDict({"a": nn.Parameter(td.ones(1))})

        def forward(self, x):
            return x * self.scales[0] + self.scales[1].sum() + self.heads["a"]

    m = Model()
    assert list(m.state_dict()) == ["scales.0", "scales.1", "heads.a"]
    assert isinstance(m.scales[1], nn.Parameter)  # a plain tensor is wrapped, as torch
    m.scales.append(td.ones(4))
    m.heads["b"] = td.ones(2)
    m.scales[0] = nn.Parameter(td.full((2,), 2.0))
    assert [n for n, _ in m.named_parameters()] == ["scales.0", "scales.1", "scales.2",
                                                   "heads.a", "heads.b"]
    assert len(m.scales) == 3 and len(m.heads) == 2 and "b" in m.heads
    assert list(m.heads.keys()) == ["a", "b"] and m.scales[-1].shape == (4,)
    opt = td.optim.SGD(m.parameters(), lr=0.5)
    m(td.ones(2)).sum().backward()
    opt.step()
    assert m.scales[0].tolist() == [1.5, 1.5] and m.heads["a"].tolist() == [0.0]
    assert m.heads.pop("b").shape == (2,) and len(m.heads) == 1
    with pytest.raises(TypeError, match="ParameterList: item 3 is a int"):
        m.scales.append(3)
    with pytest.raises(TypeError, match="keys must be strings"):
        m.heads[1] = td.ones(1)
    with pytest.raises(IndexError, match="out of range"):
        m.scales[5]


def test_channel_dropout(backend_name):
    """Whole channels zeroed, the others scaled by 1 / (1 - p); the gradient is the mask;
    identity in eval mode."""
    x = td.tensor(RNG.uniform(1, 2, (4, 6, 2, 3)), requires_grad=True)
    m = nn.Dropout2d(0.5)
    y = m(x)
    ratio = (y / x).detach().numpy().reshape(4, 6, -1)
    assert np.all((ratio == 0) | (np.abs(ratio - 2.0) < 1e-6))
    assert np.all(ratio.min(-1) == ratio.max(-1))  # one value per channel
    assert 0 < (ratio[:, :, 0] == 0).sum() < 24
    y.sum().backward()
    assert_close(x.grad, ratio[:, :, :1].repeat(6, -1).reshape(4, 6, 2, 3), 1e-6, 1e-6)
    seq = td.tensor(RNG.uniform(1, 2, (5, 7)))
    mask = F.dropout1d(seq, 0.3).numpy() / seq.numpy()  # [C, L]: one value per row
    assert np.allclose(mask.min(1), mask.max(1), rtol=1e-6)
    assert set(np.round(mask[:, 0], 5)) <= {0.0, round(1 / 0.7, 5)}
    m.eval()
    assert m(x) is x and nn.Dropout1d(0.2).eval()(seq) is seq
    with pytest.raises(ValueError, match=r"dropout2d: expected input \[N, C, H, W\]"):
        F.dropout2d(td.ones(2, 3))
    with pytest.raises(ValueError, match="p must be in"):
        nn.Dropout1d(1.5)


def test_unflatten_and_unbind():
    x = td.arange(24.0).reshape(2, 12)
    t = torch.arange(24.0).reshape(2, 12)
    assert nn.Unflatten(1, (3, -1))(x).shape == tuple(torch.nn.Unflatten(1, (3, -1))(t).shape)
    assert x.unflatten(-1, (2, 2, 3)).tolist() == t.unflatten(-1, (2, 2, 3)).tolist()
    with pytest.raises(ValueError, match="unflatten: sizes"):
        x.unflatten(1, (5, -1))
    leaf = td.tensor(RNG.normal(0, 1, (2, 3)), requires_grad=True)
    parts = leaf.unbind(-1)
    assert len(parts) == 3 and parts[1].tolist() == leaf.detach()[:, 1].tolist()
    (parts[0] * 2 + parts[2]).sum().backward()
    assert leaf.grad.tolist() == [[2.0, 0.0, 1.0]] * 2
    assert [p.tolist() for p in td.unbind(x[:, :2], 0)] == [[0.0, 1.0], [12.0, 13.0]]
    assert [p.shape for p in td.split(x, [5, 7], dim=1)] == [(2, 5), (2, 7)]
    assert [p.shape for p in td.chunk(x, 5, dim=1)] == [(2, 3)] * 4
    with pytest.raises(IndexError, match="unbind"):
        td.tensor(1.0).unbind()


# ----------------------------------------------------------------------------- factories


def test_eye_linspace_logspace(backend_name):
    assert td.eye(3).tolist() == torch.eye(3).tolist()
    assert td.eye(2, 4, dtype=td.int64).tolist() == torch.eye(2, 4, dtype=torch.int64).tolist()
    assert td.eye(0).shape == (0, 0)
    for start, end, steps in ((0, 1, 5), (3.5, -2.0, 7), (-1, 1, 1), (0, 1, 0), (2, 9, 8)):
        got, want = td.linspace(start, end, steps), torch.linspace(start, end, steps)
        assert got.dtype is td.float32
        assert_close(got, want, 1e-6, 1e-6)
    assert td.linspace(0, 10, 4, dtype=td.int64).tolist() == \
        torch.linspace(0, 10, 4, dtype=torch.int64).tolist()
    assert_close(td.logspace(-2, 2, 5), torch.logspace(-2, 2, 5), 1e-6, 0)
    assert_close(td.logspace(0, 3, 4, base=2.0), torch.logspace(0, 3, 4, base=2.0), 1e-6, 0)
    with pytest.raises(ValueError, match="steps must be non-negative"):
        td.linspace(0, 1, -1)


def test_randint(backend_name):
    """[low, high) of int64, every value drawn, the same numbers on both backends and from a
    td.Generator of the same seed; torch's call forms."""
    draws = td.randint(3, 7, (4000,))
    values = draws.numpy()
    assert draws.dtype is td.int64 and values.min() == 3 and values.max() == 6
    assert np.all(np.abs(np.bincount(values - 3) - 1000) < 150)
    assert td.randint(5, (2, 3)).shape == (2, 3)
    assert td.randint(2, 4, size=(3,)).shape == (3,)
    assert td.randint(high=4, size=(2,), dtype=td.float32).dtype is td.float32
    wide = td.randint(-2**40, 2**40, (64,)).numpy()
    assert wide.min() >= -2**40 and wide.max() < 2**40 and np.abs(wide).max() > 2**36
    g = td.Generator().manual_seed(7)
    first = td.randint(0, 1000, (6,), generator=g).tolist()
    assert td.randint(0, 1000, (6,), generator=g).tolist() != first
    g.manual_seed(7)
    assert td.randint(0, 1000, (6,), generator=g).tolist() == first
    other = "triton" if backend_name == "numpy" else "numpy"
    with td.use_backend(other):
        assert td.randint(0, 1000, (6,), generator=td.Generator().manual_seed(7)).tolist() \
            == first
    with pytest.raises(ValueError, match="low < high"):
        td.randint(5, 5, (2,))
    with pytest.raises(TypeError, match="needs high and size"):
        td.randint(5)


def test_isclose_and_allclose(backend_name):
    a = [1.0, INF, -INF, float("nan"), 1.0, 0.0, 1e-9, 100.0]
    b = [1.0 + 1e-6, INF, INF, float("nan"), INF, 1e-9, 0.0, 100.01]
    for kwargs in ({}, {"equal_nan": True}, {"rtol": 1e-3, "atol": 0.0}):
        want = torch.isclose(torch.tensor(a), torch.tensor(b), **kwargs).tolist()
        assert td.isclose(td.tensor(a), td.tensor(b), **kwargs).tolist() == want
    assert td.isclose(td.tensor([1, 5]), td.tensor([1, 6]), atol=1).tolist() == [True, True]
    assert td.allclose(td.tensor(a[:3]), td.tensor(a[:3])) is True
    assert td.allclose(td.tensor(a), td.tensor(a)) is False  # NaN
    assert td.allclose(td.tensor(a), td.tensor(a), equal_nan=True) is True
    with pytest.raises(TypeError, match="same dtype"):
        td.isclose(td.tensor([1.0]), td.tensor([1]))


def test_legacy_constructors():
    assert td.LongTensor([1, 2]).dtype is td.int64 and td.LongTensor([1, 2]).tolist() == [1, 2]
    assert td.FloatTensor(2, 3).shape == (2, 3) and td.FloatTensor().shape == (0,)
    assert td.BoolTensor([True, False]).dtype is td.bool
    assert td.DoubleTensor(td.tensor([1, 2])).dtype is td.float64
    assert td.FloatTensor(np.array([1.5])).tolist() == [1.5]
    assert isinstance(td.ones(2), td.FloatTensor) and not isinstance(td.ones(2), td.LongTensor)


# ----------------------------------------------------------------------------- norms


NORMS = [  # (ours, torch's) on a [3, 4] matrix
    (lambda x: td.linalg.norm(x), lambda x: torch.linalg.norm(x)),
    (lambda x: td.linalg.norm(x, dim=1), lambda x: torch.linalg.norm(x, dim=1)),
    (lambda x: td.linalg.norm(x, INF), lambda x: torch.linalg.norm(x, INF)),
    (lambda x: td.linalg.norm(x, -1, keepdim=True), lambda x: torch.linalg.norm(x, -1,
                                                                                keepdim=True)),
    (lambda x: td.linalg.norm(x, "fro", dim=(1, 0)), lambda x: torch.linalg.norm(x, "fro",
                                                                                 dim=(1, 0))),
    (lambda x: td.linalg.matrix_norm(x, 1), lambda x: torch.linalg.matrix_norm(x, 1)),
    (lambda x: td.linalg.vector_norm(x, 3, dim=0), lambda x: torch.linalg.vector_norm(x, 3,
                                                                                      dim=0)),
    (lambda x: td.linalg.vector_norm(x, -INF), lambda x: torch.linalg.vector_norm(x, -INF)),
    (lambda x: td.linalg.vector_norm(x, 0, dim=1), lambda x: torch.linalg.vector_norm(x, 0,
                                                                                      dim=1)),
    (lambda x: x.norm(), lambda x: x.norm()),
    (lambda x: x.norm(1, dim=1, keepdim=True), lambda x: x.norm(1, dim=1, keepdim=True)),
    (lambda x: x.norm(0.5, dim=(0, 1)), lambda x: x.norm(0.5, dim=(0, 1))),
]


def test_norms_against_torch(backend_name):
    """Values and gradients; a zero row's 2-norm has gradient 0 (not NaN), as PyTorch's.
    The triton backend runs the 2-norm, the inf norms and a matrix norm."""
    x = RNG.normal(0, 1, (3, 4))
    x[1] = 0.0
    x[0, 1] = 0.0
    cases = NORMS if backend_name == "numpy" else [NORMS[i] for i in (1, 3, 6)]
    for ours, theirs in cases:
        mine = td.tensor(x, requires_grad=True)
        spec = torch.tensor(x, requires_grad=True)
        got, want = ours(mine), theirs(spec)
        assert_close(got, want.detach(), 1e-9, 1e-12)
        assert got.requires_grad == (want.grad_fn is not None and theirs is not NORMS[8][1])
        if got.requires_grad:  # (ord 0: PyTorch's gradient is 0, ours is not recorded)
            cot = RNG.standard_normal(tuple(want.shape))
            (got * td.tensor(cot)).sum().backward()
            (want * torch.tensor(cot)).sum().backward()
            assert_close(mine.grad, spec.grad, 1e-9, 1e-12, name="gradient")


@pytest.mark.parametrize("dtype", [td.float16, td.bfloat16])
def test_half_norms_compute_in_float32(backend_name, dtype):
    """A float16 square overflows from 256 on and |x|^6 underflows below 0.2: powers and sums
    run in float32, the result in the input's type, as PyTorch's."""
    x = td.tensor([300.0, -400.0], dtype=dtype, requires_grad=True)
    n = td.linalg.vector_norm(x)
    n.backward()
    assert n.dtype is dtype and n.item() == 500.0
    assert_close(x.grad.float(), np.array([0.6, -0.8]), 1e-2, 1e-2, name="gradient")
    small = td.tensor([0.0674], dtype=dtype)
    assert abs(td.linalg.vector_norm(small, 6).item() - small.float().item()) < 1e-3


def test_norm_errors():
    with pytest.raises(NotImplementedError, match="singular values"):
        td.linalg.norm(td.ones(2, 2), "nuc")
    with pytest.raises(NotImplementedError, match="singular values"):
        td.linalg.matrix_norm(td.ones(2, 2), 2)
    with pytest.raises(ValueError, match="1-d or 2-d"):
        td.linalg.norm(td.ones(2, 2, 2), 1)
    with pytest.raises(TypeError, match="floating point"):
        td.linalg.vector_norm(td.tensor([1, 2]))
    with pytest.raises(ValueError, match="empty"):
        td.linalg.vector_norm(td.ones(0, 2), INF, dim=0)
    with pytest.raises(IndexError, match="dimension 2"):
        td.ones(2, 2).norm(dim=2)


@pytest.mark.gpu
def test_randint_and_norms_at_gpu_sizes():
    """A million draws cover [0, 10) evenly; row norms of a [4096, 1000] matrix as torch's."""
    draws = td.randint(0, 10, (1_000_000,), device="cuda").cpu().numpy()
    assert np.all(np.abs(np.bincount(draws, minlength=10) - 100_000) < 2_000)
    x = torch.randn(4096, 1000, device="cuda")
    got = td.linalg.vector_norm(td.from_torch(x), dim=1)
    assert_close(got.cpu(), torch.linalg.vector_norm(x, dim=1).cpu(), 1e-5, 1e-5)
