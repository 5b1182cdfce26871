"""td.cat and td.stack against torch.cat / torch.stack: values exactly, gradients against the
numpy backend in float64 under a random cotangent (and that backend against finite
differences), on odd shapes, transposed and broadcast (stride-0) inputs, empty pieces and mixed
dtypes; a clear error for what torch refuses."""
import numpy as np
import pytest
import torch
from helpers import check_op
from hypothesis import given
from hypothesis import strategies as st

import tritonad as td
from tritonad.autodiff import gradcheck


def layout(values, kind):
    """A tensor holding `values` (numpy) as contiguous, transposed-in-memory or broadcast."""
    if kind == "transposed" and values.ndim >= 2:
        return td.tensor(np.ascontiguousarray(values.swapaxes(0, -1))).transpose(0, -1)
    if kind == "broadcast" and values.ndim >= 1:  # a stride-0 first dimension
        return td.tensor(values[:1]).expand(*values.shape) if len(values) else td.tensor(values)
    return td.tensor(values)


@given(base=st.sampled_from([(3,), (2, 5), (3, 1, 4), (1, 7, 2)]), n=st.integers(1, 4),
       dim=st.integers(-3, 2), kinds=st.lists(st.sampled_from(["plain", "transposed",
                                                                "broadcast"]), min_size=4,
                                               max_size=4),
       sizes=st.lists(st.integers(0, 3), min_size=4, max_size=4), seed=st.integers(0, 999))
def test_cat_as_torch(backend_name, base, n, dim, kinds, sizes, seed):
    if not -len(base) <= dim < len(base):
        dim = dim % len(base)
    rng = np.random.default_rng(seed)
    arrays = []
    for i in range(n):
        shape = list(base)
        shape[dim] = sizes[i]
        values = rng.standard_normal(shape).astype(np.float32)
        if kinds[i] == "broadcast" and values.ndim and len(values):
            values = np.broadcast_to(values[:1], values.shape).copy()
        arrays.append(values)
    got = td.cat([layout(a, k) for a, k in zip(arrays, kinds)], dim)
    expected = torch.cat([torch.from_numpy(a) for a in arrays], dim)
    assert got.shape == tuple(expected.shape) and got.dtype is td.float32
    np.testing.assert_array_equal(got.numpy(), expected.numpy())
    stacked = td.stack([layout(arrays[0], kinds[0])] * n, dim)
    np.testing.assert_array_equal(stacked.numpy(),
                                  torch.stack([torch.from_numpy(arrays[0])] * n, dim).numpy())


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_cat_and_stack_gradients(backend_name, dim):
    rng = np.random.default_rng(dim + 5)
    a, b, c = (rng.standard_normal(s) for s in ((3, 2, 4), (3, 2, 4), (3, 2, 4)))
    check_op(lambda x, y, z: td.cat([x, y.transpose(0, 1).transpose(0, 1), z], dim), a, b, c)
    check_op(lambda x, y: td.stack([x, y * 2], dim) * 3, a, b)
    check_op(lambda x: td.cat([x, x[:, :1]], 1).sum(0), a)  # one input twice: grads add up
    with td.use_backend("numpy"):
        leaves = [td.tensor(v, dtype=td.float64, requires_grad=True) for v in (a, b[:, :1])]
        assert gradcheck(lambda x, y: td.cat([y, x, y], 1).exp(), leaves)
        assert gradcheck(lambda x: td.stack([x, x.relu()], dim).sum(0), leaves[:1])


def test_cat_promotes_and_keeps_gradients_to_float_inputs(backend_name):
    ints, floats = td.tensor([[1, 2]], dtype=td.int32), td.tensor([[0.5, 1.5]], requires_grad=True)
    joined = td.cat([ints, floats])
    assert joined.dtype is td.float32 and joined.tolist() == [[1, 2], [0.5, 1.5]]
    assert td.cat([td.tensor([1], dtype=td.uint8), td.tensor([-1], dtype=td.int64)]).dtype \
        is td.int64
    assert td.cat([td.tensor([True]), td.tensor([2], dtype=td.uint8)]).tolist() == [1, 2]
    (joined * td.tensor([[1.0, 1], [3, 4]])).sum().backward()
    assert floats.grad.tolist() == [[3, 4]]
    only = td.cat([floats])  # one input: a copy, as torch's
    assert only.tolist() == [[0.5, 1.5]] and only._data.data_ptr() != floats._data.data_ptr()
    assert td.concat is td.cat and td.concatenate is td.cat
    empty = td.cat([td.zeros(0, 3), td.ones(2, 3)])
    assert empty.shape == (2, 3) and empty.sum().item() == 6


def test_cat_and_stack_errors(backend_name):
    with pytest.raises(ValueError, match=r"cat: tensor 1 has shape \(2, 4\), which does not "
                                         r"match tensor 0's \(2, 3\) outside dim 0"):
        td.cat([td.zeros(2, 3), td.zeros(2, 4)])
    with pytest.raises(IndexError, match="cat: dim 2 is out of range for 2-d tensors"):
        td.cat([td.zeros(2, 3)], 2)
    with pytest.raises(TypeError, match="cat: expected a non-empty list"):
        td.cat([])
    with pytest.raises(TypeError, match="cat: expected a non-empty list"):
        td.cat(td.zeros(2, 3))
    with pytest.raises(ValueError, match="cat: zero-dimensional"):
        td.cat([td.tensor(1.0), td.tensor(2.0)])
    with pytest.raises(ValueError, match=r"stack: tensor 1 has shape \(3,\), tensor 0 \(2,\)"):
        td.stack([td.zeros(2), td.zeros(3)])
    with pytest.raises(IndexError, match="stack: dim 2 is out of range for 1-d tensors"):
        td.stack([td.zeros(2)], 2)
    assert td.stack([td.tensor(1.0), td.tensor(2.0)]).tolist() == [1.0, 2.0]


@pytest.mark.gpu
def test_cat_across_devices_names_both():
    with pytest.raises(RuntimeError, match="cpu.*cuda|cuda.*cpu"):
        td.cat([td.zeros(2, device="cuda"), td.zeros(2, device="cpu")])
