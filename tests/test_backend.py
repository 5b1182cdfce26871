"""Backend selection and the numpy reference's own correctness (it is every kernel's oracle)."""
import math

import numpy as np
import pytest
import torch

import tritonad as td
from tritonad import backend as backend_module
from tritonad.reference import (NumpyBackend, feistel_bits, philox, pool_output_size,
                                randperm_numpy)

REF = NumpyBackend()


def raw(values, dtype=td.float32):
    return td.tensor(values, dtype=dtype).torch()


def test_selection_and_context_manager():
    start = td.get_backend().name
    with td.use_backend("numpy") as b:
        assert b.name == "numpy" and td.get_backend() is b
        with td.use_backend("triton"):
            assert td.get_backend().name == "triton"
        assert td.get_backend().name == "numpy"
    assert td.get_backend().name == start
    td.set_backend("numpy")
    assert td.get_backend().name == "numpy"
    td.set_backend(start)


def test_default_backend_rule(monkeypatch):
    monkeypatch.delenv("TRITONAD_BACKEND", raising=False)
    expected = "triton" if torch.cuda.is_available() else "numpy"
    assert backend_module.default_backend_name() == expected
    monkeypatch.setenv("TRITONAD_BACKEND", "triton")
    assert backend_module.default_backend_name() == "triton"


def test_every_primitive_is_implemented_by_both_backends():
    primitives = [n for n, v in vars(td.Backend).items()
                  if callable(v) and not n.startswith("_") and n not in ("check_device",)]
    for name in ("numpy", "triton"):
        cls = type(backend_module._instance(name))
        missing = [p for p in primitives if getattr(cls, p) is getattr(td.Backend, p)
                   and _raises_not_implemented(getattr(td.Backend, p))]
        assert not missing, f"{name} backend lacks {missing}"


def _raises_not_implemented(fn):
    import inspect

    return "raise NotImplementedError" in inspect.getsource(fn)


def test_matmul_precision_setting():
    assert td.matmul_precision() == "highest"
    td.set_matmul_precision("high")
    assert td.matmul_precision() == "high"
    td.set_matmul_precision("highest")
    with pytest.raises(ValueError, match="precision"):
        td.set_matmul_precision("tf32")


# ------------------------------------------------------------------------ the reference itself


def test_philox_known_answers():
    """The Random123 known-answer vectors for Philox4x32-10."""
    def words(ctr, key):
        return [int(w[0]) for w in philox(np.uint32([ctr[0]]), np.uint32([ctr[1]]), ctr[2], ctr[3],
                                          key)]
    assert words((0, 0, 0, 0), 0) == [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]
    assert words((0xFFFFFFFF,) * 4, 0xFFFFFFFFFFFFFFFF) == \
        [0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD]
    assert words((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344),
                 (0x299F31D0 << 32) | 0xA4093822) == [0xD16CFE09, 0x94FDCCEB, 0x5001E420,
                                                      0x24126EA1]


@pytest.mark.parametrize("n", [1, 2, 3, 5, 17, 64, 1000, 60000])
def test_randperm_is_a_permutation(n):
    p = randperm_numpy(n, seed=11, offset=3)
    assert sorted(p.tolist()) == list(range(n))
    assert 2 ** feistel_bits(n) >= n
    if n >= 17:
        assert not np.array_equal(p, np.arange(n))
        assert not np.array_equal(p, randperm_numpy(n, seed=12, offset=3))


def test_sigmoid_is_stable_at_extremes():
    y = REF.sigmoid(raw([-1000.0, -100.0, 0.0, 100.0, 1000.0]))
    assert y.tolist() == [0.0, pytest.approx(3.7e-44, rel=0.1), 0.5, 1.0, 1.0]


def test_bfloat16_round_trip():
    x = raw([1.0, 1.00390625, 1.01171875, -2.5, float("inf"), float("nan")], td.bfloat16)
    values = td.Tensor._wrap(x).numpy()
    assert values[:5].tolist() == [1.0, 1.0, 1.015625, -2.5, math.inf] and np.isnan(values[5])


def test_pool_output_size_matches_torch():
    for size, k, s, p, d, ceil in [(5, 2, 2, 0, 1, True), (6, 3, 2, 1, 1, True),
                                   (7, 3, 3, 1, 2, False), (4, 2, 3, 1, 1, True)]:
        x = torch.zeros(1, 1, size, size)
        expected = torch.nn.functional.max_pool2d(x, k, s, p, d, ceil_mode=ceil).shape[-1]
        assert pool_output_size(size, k, s, p, d, ceil) == expected


def test_reference_against_torch_on_ops_torch_defines():
    """Independent cross-check of the reference's trickier semantics against torch on CPU."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 3, 7, 6)).astype(np.float32)
    tx = torch.tensor(x)
    y, idx = REF.max_pool2d(raw(x), (3, 2), (2, 2), (1, 1), (1, 1), True)
    ty, tidx = torch.nn.functional.max_pool2d(tx, (3, 2), 2, 1, ceil_mode=True, return_indices=True)
    np.testing.assert_allclose(y.numpy(), ty.numpy())
    np.testing.assert_array_equal(idx.numpy(), tidx.numpy())
    for cip in (True, False):
        a = REF.avg_pool2d(raw(x), (3, 3), (2, 2), (1, 1), True, cip, None)
        ta = torch.nn.functional.avg_pool2d(tx, 3, 2, 1, ceil_mode=True, count_include_pad=cip)
        np.testing.assert_allclose(a.numpy(), ta.numpy(), rtol=1e-6)
    cols = REF.im2col(raw(x), (3, 2), (2, 1), (1, 0), (1, 2))
    tcols = torch.nn.functional.unfold(tx, (3, 2), dilation=(1, 2), padding=(1, 0), stride=(2, 1))
    np.testing.assert_allclose(cols.numpy(), tcols.numpy())
    back = REF.col2im(cols, (7, 6), (3, 2), (2, 1), (1, 0), (1, 2))
    tback = torch.nn.functional.fold(tcols, (7, 6), (3, 2), dilation=(1, 2), padding=(1, 0),
                                     stride=(2, 1))
    np.testing.assert_allclose(back.numpy(), tback.numpy(), rtol=1e-6)
    logits = rng.standard_normal((5, 4)).astype(np.float32) * 3
    target = np.array([1, -100, 3, 0, 2])
    loss, grad = REF.cross_entropy(raw(logits), raw(target, td.int64), "mean", -100, 0.2)
    tl = torch.tensor(logits, requires_grad=True)
    tloss = torch.nn.functional.cross_entropy(tl, torch.tensor(target), label_smoothing=0.2)
    tloss.backward()
    np.testing.assert_allclose(loss.numpy(), tloss.detach().numpy(), rtol=1e-6)
    np.testing.assert_allclose(grad.numpy(), tl.grad.numpy(), rtol=1e-5, atol=1e-7)


def test_cross_entropy_reference_is_stable_for_huge_logits():
    logits = raw([[1e4, -1e4, 0.0], [-1e4, -1e4, -1e4], [float("-inf"), 0.0, 1.0]])
    loss, grad = REF.cross_entropy(logits, raw([1, 2, 2], td.int64), "none", -100, 0.0)
    np.testing.assert_allclose(loss.numpy(), [2e4, math.log(3), math.log(1 + math.e ** -1)],
                               rtol=1e-6)
    assert np.isfinite(grad.numpy()).all()


def test_reference_errors_name_the_op():
    with pytest.raises(IndexError, match="gather_rows: index 5 is out of bounds"):
        REF.gather_rows(raw([[1.0], [2.0]]), raw([0, 5], td.int64))
    with pytest.raises(RuntimeError, match="max: cannot reduce an empty tensor"):
        REF.max(raw(np.zeros((0, 3))))
