"""Tensor: creation, metadata, views without copies, indexing, conversion, printing, errors."""
import numpy as np
import pytest
import torch

import tritonad as td
from helpers import assert_close


def test_tensor_from_nested_lists_infers_default_dtypes():
    assert td.tensor([[1.0, 2.0], [3.0, 4.0]]).dtype is td.float32
    assert td.tensor([1, 2, 3]).dtype is td.int64
    assert td.tensor([True, False]).dtype is td.bool
    assert td.tensor(3.5).shape == ()
    assert td.tensor(np.arange(3, dtype=np.int32)).dtype is td.int32
    assert td.tensor([1, 2], dtype=td.float16).dtype is td.float16


def test_tensor_rejects_ragged_and_unknown_dtypes():
    with pytest.raises(ValueError, match="ragged"):
        td.tensor([[1, 2], [3]])
    with pytest.raises(TypeError, match="unknown dtype"):
        td.tensor([1.0], dtype="float128")


def test_creation_functions(backend_name):
    assert td.zeros(2, 3).tolist() == [[0.0] * 3] * 2
    assert td.ones((2,), dtype=td.int32).tolist() == [1, 1]
    assert td.full((2, 2), 7.0).numpy().sum() == 28.0
    assert td.empty(4, 5).shape == (4, 5)
    assert td.arange(5).tolist() == [0, 1, 2, 3, 4]
    assert td.arange(1, 2, 0.25).tolist() == [1.0, 1.25, 1.5, 1.75]
    assert td.zeros_like(td.ones(3, dtype=td.float16)).dtype is td.float16


def test_random_is_reproducible_and_seeded(backend_name):
    td.manual_seed(123)
    a, b = td.rand(1000), td.randn(1000)
    td.manual_seed(123)
    assert_close(td.rand(1000), a, 0, 0)
    assert_close(td.randn(1000), b, 1e-6, 1e-6)
    u = a.numpy()
    assert 0.0 <= u.min() and u.max() < 1.0 and abs(u.mean() - 0.5) < 0.05
    z = b.numpy()
    assert abs(z.mean()) < 0.1 and abs(z.std() - 1.0) < 0.1
    assert sorted(td.randperm(50).tolist()) == list(range(50))


def test_both_backends_draw_the_same_numbers():
    streams = {}
    for name in ("numpy", "triton"):
        with td.use_backend(name):
            td.manual_seed(7)
            streams[name] = (td.rand(64).numpy(), td.randn(64).numpy(), td.randperm(33).tolist())
    np.testing.assert_array_equal(streams["numpy"][0], streams["triton"][0])
    np.testing.assert_allclose(streams["numpy"][1], streams["triton"][1], rtol=1e-5, atol=1e-5)
    assert streams["numpy"][2] == streams["triton"][2]


def test_metadata():
    x = td.zeros(2, 3, 4)
    assert (x.shape, x.ndim, x.numel(), x.size(1), x.stride()) == ((2, 3, 4), 3, 24, 3, (12, 4, 1))
    assert x.dtype is td.float32 and x.device.type in ("cpu", "cuda")
    assert x.is_leaf and not x.requires_grad and x.grad_fn is None
    assert len(x) == 2 and x.is_contiguous() and x.element_size() == 4


def test_views_share_memory_and_need_no_copy():
    x = td.arange(24, dtype=td.float32).reshape(2, 3, 4)
    views = [x.reshape(6, 4), x.view(4, 6), x.transpose(0, 2), x.permute(2, 0, 1), x.T,
             x.unsqueeze(1), x[1], x[:, 1:3], x[..., 0], x[None], x.flatten(),
             td.ones(3, 1).expand(3, 5), x[0, :, ::2]]
    for v in views:
        assert v.torch().untyped_storage().data_ptr() in (
            x.torch().untyped_storage().data_ptr(),
            v.torch().untyped_storage().data_ptr()) and v.torch()._base is not None or v is x
    t = x.transpose(0, 2)
    assert t.shape == (4, 3, 2) and t.stride() == (1, 4, 12)
    np.testing.assert_array_equal(t.numpy(), np.arange(24).reshape(2, 3, 4).transpose(2, 1, 0))
    e = td.ones(3, 1).expand(3, 5)
    assert e.stride() == (1, 0)
    assert x.unsqueeze(0).squeeze(0).shape == x.shape
    assert td.ones(1, 3, 1).squeeze().shape == (3,)
    assert x.flatten(1).shape == (2, 12)


def test_reshape_copies_only_when_it_must():
    x = td.arange(6, dtype=td.float32).reshape(2, 3)
    t = x.T
    with pytest.raises(RuntimeError, match="cannot be viewed"):
        t.view(6)
    r = t.reshape(6)
    assert r.tolist() == [0.0, 3.0, 1.0, 4.0, 2.0, 5.0]
    assert x.reshape(3, -1).shape == (3, 2)
    with pytest.raises(RuntimeError, match="invalid"):
        x.reshape(4, 2)


def test_indexing_matches_numpy(backend_name):
    a = np.arange(60, dtype=np.float32).reshape(3, 4, 5)
    x = td.tensor(a)
    for key in [1, -1, (0, 2), (slice(None), 1), (slice(1, 3), slice(None), 4), (Ellipsis, 2),
                (None, 0), (slice(None, None, 2),), (1, slice(3, 0, None))]:
        np.testing.assert_array_equal(x[key].numpy(), a[key])
    idx = td.tensor([2, 0, 2])
    np.testing.assert_array_equal(x[idx].numpy(), a[[2, 0, 2]])
    np.testing.assert_array_equal(x[[1, 1], 2].numpy(), a[[1, 1], 2])
    mask = x[:, :, 0] > 20
    np.testing.assert_array_equal(x[mask].numpy(), a[a[:, :, 0] > 20])
    with pytest.raises(IndexError, match="out of bounds"):
        x[3]
    with pytest.raises(IndexError, match="too many"):
        x[0, 0, 0, 0]


def test_setitem_and_inplace(backend_name):
    x = td.zeros(3, 4)
    x[1] = 5.0
    x[:, 0] = td.tensor([1.0, 2.0, 3.0])
    x += 1
    x.mul_(2)
    expected = np.zeros((3, 4), np.float32)
    expected[1] = 5
    expected[:, 0] = [1, 2, 3]
    np.testing.assert_array_equal(x.numpy(), (expected + 1) * 2)
    x.zero_()
    assert x.numpy().sum() == 0
    with pytest.raises(RuntimeError, match="cannot be stored"):
        td.zeros(2, dtype=td.int64).add_(0.5)


def test_conversions(backend_name):
    x = td.tensor([[1.5, -2.0], [3.0, 4.25]])
    assert x.tolist() == [[1.5, -2.0], [3.0, 4.25]]
    assert td.tensor([2.5]).item() == 2.5 and isinstance(td.tensor(3).item(), int)
    assert x.to(td.int64).tolist() == [[1, -2], [3, 4]]
    assert x.half().dtype is td.float16 and x.bfloat16().float().tolist() == x.tolist()
    assert x.to(td.float64).dtype is td.float64
    assert float(td.tensor(2.0)) == 2.0 and int(td.tensor(7)) == 7
    assert td.tensor([1.0, 0.0]).bool().tolist() == [True, False]
    with pytest.raises(RuntimeError, match="cannot be converted"):
        x.item()
    with pytest.raises(RuntimeError, match="ambiguous"):
        bool(x)
    assert np.asarray(x).shape == (2, 2)


def test_bfloat16_rounds_to_nearest_even():
    x = td.tensor([1.0 + 2 ** -8, 1.0 + 3 * 2 ** -8, 3.14159], dtype=td.bfloat16)
    assert x.tolist() == [1.0, 1.015625, 3.140625]


def test_repr_is_readable():
    assert repr(td.tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad=True)) == \
        "tensor([[1., 2.],\n        [3., 4.]], requires_grad=True)"
    assert repr(td.tensor([1, 2])) == "tensor([1, 2])"
    assert "dtype=tritonad.float16" in repr(td.ones(2, dtype=td.float16))
    assert "grad_fn=<MulBackward>" in repr(td.ones(2, requires_grad=True) * 2)
    assert "size=(0, 3)" in repr(td.zeros(0, 3))


def test_from_numpy_and_torch_interop():
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    x = td.from_numpy(a)
    assert x.dtype is td.float32 and x.tolist() == a.tolist()
    t = torch.arange(4, dtype=torch.float32)
    y = td.from_torch(t)
    assert y.torch() is not None and y.torch().data_ptr() == t.data_ptr()


def test_requires_grad_only_on_floats():
    with pytest.raises(RuntimeError, match="only floating point"):
        td.tensor([1, 2]).requires_grad_()
    with pytest.raises(RuntimeError, match="int64"):
        td.zeros(2, dtype=td.int64, requires_grad=True)


def test_devices_must_match_and_exist():
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="CUDA is not available"):
            td.zeros(2, device="cuda")
    with pytest.raises(RuntimeError, match="unsupported device"):
        td.zeros(2, device="meta")


def test_numpy_backend_refuses_gpu_tensors():
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU to make a GPU tensor")
    with td.use_backend("numpy"):
        x = td.from_torch(torch.ones(2, device="cuda"))
        with pytest.raises(RuntimeError, match="numpy backend runs on the CPU"):
            x + 1


@pytest.mark.parametrize("case", [
    ("t", lambda x: x.t()), ("reciprocal", lambda x: x.reciprocal()),
    ("rsqrt", lambda x: x.abs().rsqrt()), ("norm", lambda x: x.norm()),
    ("norm dim 1", lambda x: x.norm(dim=1, keepdim=True)), ("norm p=1", lambda x: x.norm(p=1)),
    ("norm inf", lambda x: x.norm(p=float("inf"), dim=0)),
    ("masked_fill", lambda x: x.masked_fill(x > 0.5, -1.0)),
    ("masked_fill row mask", lambda x: x.masked_fill(x[:1] > 0, 2.0)),
    ("split", lambda x: x.split(2, 1)[-1]), ("split sizes", lambda x: x.split([1, 2], 0)[1]),
    ("chunk", lambda x: x.chunk(2, 1)[0]), ("repeat", lambda x: x.repeat(2, 1)),
    ("repeat new dims", lambda x: x.repeat(2, 1, 3)),
])
def test_composed_methods_as_torch(backend_name, case):
    """Values and gradients (under a random cotangent) against torch."""
    _, fn = case
    values = np.random.default_rng(1).standard_normal((3, 5))
    ours = td.tensor(values, dtype=td.float64, requires_grad=True)
    theirs = torch.tensor(values, dtype=torch.float64, requires_grad=True)
    got, want = fn(ours), fn(theirs)
    assert got.shape == tuple(want.shape)
    assert_close(got.numpy(), want.detach().numpy(), rtol=1e-12, atol=1e-12)
    cot = np.random.default_rng(2).standard_normal(tuple(want.shape))
    (g,) = td.grad(got, ours, td.tensor(cot))
    want.backward(torch.tensor(cot))
    assert_close(g.numpy(), theirs.grad.numpy(), rtol=1e-12, atol=1e-12)


def test_composed_methods_misc(backend_name):
    x = td.tensor([[1.0, float("nan")], [float("inf"), -2.0]])
    assert x.isnan().tolist() == [[False, True], [False, False]]
    assert x.isinf().tolist() == [[False, False], [True, False]]
    assert x.isfinite().tolist() == [[True, False], [False, True]]
    assert x.type() == "tritonad.float32" and x.type(td.int64).dtype is td.int64
    z = x.new_zeros(2, 3)
    assert z.shape == (2, 3) and z.dtype is td.float32 and z.device == x.device
    assert x.new_ones((1,), dtype=td.int32).tolist() == [1]
    assert x.new_full((2,), 7.0).tolist() == [7.0, 7.0] and x.new_empty(4).shape == (4,)
    assert x.new_tensor([1, 2]).dtype is td.float32
    assert [p.shape for p in td.arange(7).chunk(3)] == [(3,), (3,), (1,)]
    assert [p.tolist() for p in td.arange(5).split(2)] == [[0, 1], [2, 3], [4]]
    with pytest.raises(ValueError, match=r"split: sizes \[1, 1\] do not sum to dimension 0's "
                                         r"size 5"):
        td.arange(5).split([1, 1])
    with pytest.raises(ValueError, match="t\\(\\): expects a tensor of at most 2 dimensions"):
        td.zeros(2, 2, 2).t()
    with pytest.raises(ValueError, match="repeat: 1 sizes for a 2-d tensor"):
        td.zeros(2, 2).repeat(2)


@pytest.mark.parametrize("dtype", ["int64", "int32", "uint8", "bool"])
def test_invert_is_bitwise_not_as_torch(backend_name, dtype):
    values = [True, False, True] if dtype == "bool" else [0, 1, 5, 127]
    ours = ~td.tensor(values, dtype=getattr(td, dtype))
    theirs = ~torch.tensor(values, dtype=getattr(torch, dtype))
    assert ours.dtype is getattr(td, dtype) and ours.tolist() == theirs.tolist()
    with pytest.raises(TypeError, match="bitwise not.*float32"):
        ~td.ones(2)


def test_add_and_sub_scale_the_operand_by_alpha(backend_name):
    a, b = np.array([1.0, 2.0], np.float32), np.array([3.0, -4.0], np.float32)
    for lib in (td, torch):
        x, y = lib.tensor(a), lib.tensor(b)
        got = [x.add(y, alpha=2), x.sub(y, alpha=0.5), x.clone().add_(y, alpha=3),
               x.clone().sub_(y, alpha=-1)]
        if lib is td:
            ours = [t.tolist() for t in got]
        else:
            assert ours == [t.tolist() for t in got]


@pytest.mark.parametrize("mode", ["trunc", "floor"])
@pytest.mark.parametrize("kind", ["float", "int"])
def test_div_rounding_modes_as_torch(backend_name, mode, kind):
    if kind == "float":
        a, b = [7.0, -7.0, 7.5, -7.5, -0.5, float("nan"), 1e20], [2.0, 2.0, -2.0, 2.0, 1.0, 1.0, 3.0]
    else:
        a, b = [7, -7, 7, -7, 0], [2, 2, -2, -2, 3]
    ours = [td.div(td.tensor(a), td.tensor(b), rounding_mode=mode),
            td.tensor(a).div(3, rounding_mode=mode)]
    theirs = [torch.div(torch.tensor(a), torch.tensor(b), rounding_mode=mode),
              torch.tensor(a).div(3, rounding_mode=mode)]
    for o, t in zip(ours, theirs):
        assert o.dtype.name == str(t.dtype).removeprefix("torch.")
        np.testing.assert_array_equal(o.numpy(), t.numpy())
    with pytest.raises(ValueError, match="rounding_mode"):
        td.tensor(a).div(2, rounding_mode="round")


def test_add_and_sub_functions_take_alpha(backend_name):
    x, y = td.tensor([1.0, 2.0]), td.tensor([3.0, 4.0])
    assert td.add(x, y, alpha=3).tolist() == [10.0, 14.0]
    assert td.sub(x, 1, alpha=2).tolist() == [-1.0, 0.0]


@pytest.mark.parametrize("name", ["any", "all"])
@pytest.mark.parametrize("dim, keepdim", [(None, False), (0, False), (1, True), (-1, False)])
def test_any_and_all_along_a_dim_as_torch(backend_name, name, dim, keepdim):
    a = np.array([[0, 1, 0], [0, 0, 0], [2, 3, float("nan")]], np.float32)
    args = () if dim is None else (dim, keepdim)
    for ours, theirs in ((getattr(td.tensor(a), name)(*args), getattr(torch.tensor(a), name)(*args)),
                         (getattr(td, name)(td.tensor(a), *args),
                          getattr(torch, name)(torch.tensor(a), *args))):
        assert ours.dtype is td.bool and ours.tolist() == theirs.tolist()
