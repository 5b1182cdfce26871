"""Random numbers (tritonad/kernels/random.py) against the Philox stream of tritonad/philox.py.

The kernels implement the reference's Philox4x32-10 bit for bit: uniform float32 draws must be
*identical*, dropout masks and permutations identical, normals equal up to the float rounding of
log/sqrt/cos (exact under the interpreter, ~1e-6 compiled). The reference's Philox itself is
checked against the published Random123 known-answer vectors.
"""
import numpy as np
import pytest
import torch
from helpers import assert_close, random_array
from hypothesis import assume, given
from hypothesis import strategies as st

import tritonad as td
from tritonad.philox import philox
from tritonad.reference import NumpyBackend

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # the triton backend's
REFERENCE = NumpyBackend()
COMPILED = torch.cuda.is_available()
NORMAL_TOL = dict(rtol=1e-5, atol=2e-5) if COMPILED else dict(rtol=1e-6, atol=1e-6)
SEEDS = [0, 1, 123456789123, 2**64 - 1]
OFFSETS = [0, 5, 2**32 - 3, 2**40 + 7]  # 2**32 - 3: counters carry into the high word


@pytest.fixture(autouse=True)
def _triton_backend():
    with td.use_backend("triton"):
        yield


def backend():
    return td.get_backend()


def test_reference_philox_known_answers():
    """Random123's kat_vectors for philox4x32_10 (counter words, key words -> output words)."""
    def run(ctr, key):
        words = philox(np.array([ctr[0]], np.uint32), np.array([ctr[1]], np.uint32), ctr[2],
                       ctr[3], key[0] | key[1] << 32)
        return [int(w[0]) for w in words]
    assert run([0, 0, 0, 0], [0, 0]) == [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]
    assert run([0xFFFFFFFF] * 4, [0xFFFFFFFF] * 2) == [0x408F276D, 0x41C83B0E, 0xA20BC7C6,
                                                        0x6D5451FD]
    assert run([0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344], [0xA4093822, 0x299F31D0]) == [
        0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1]


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("offset", OFFSETS)
def test_uniform_bits_identical(seed, offset):
    got = backend().uniform((3, 37), 0.0, 1.0, seed, offset, td.float32, DEVICE)
    expected = REFERENCE.uniform((3, 37), 0.0, 1.0, seed, offset, td.float32, "cpu")
    assert torch.equal(got.cpu(), expected), "uniform float32 draws must match bit for bit"
    assert 0.0 <= float(got.min()) and float(got.max()) < 1.0


@given(shape=st.sampled_from([(), (1,), (5, 7), (2, 3, 4)]),
       bounds=st.sampled_from([(0.0, 1.0), (-2.0, 3.0), (5.0, 5.5)]),
       dtype=st.sampled_from([td.float32, td.float16, td.bfloat16, td.float64]),
       seed=st.sampled_from(SEEDS), offset=st.sampled_from(OFFSETS))
def test_uniform_against_reference(shape, bounds, dtype, seed, offset):
    assume(not (shape == () and dtype is td.bfloat16))  # the reference returns those as (1,)
    got = backend().uniform(shape, *bounds, seed, offset, dtype, DEVICE)
    expected = REFERENCE.uniform(shape, *bounds, seed, offset, dtype, "cpu")
    assert got.dtype == expected.dtype and tuple(got.shape) == tuple(expected.shape)
    exact = dtype is td.float32 and not COMPILED  # compiled, low + span * u may round once less
    assert_close(got, expected, rtol=0 if exact else 1e-6, atol=0 if exact else 1e-6)


@given(shape=st.sampled_from([(), (1,), (5, 7), (1001,)]),
       params=st.sampled_from([(0.0, 1.0), (2.0, 0.5), (-1.0, 3.0)]),
       dtype=st.sampled_from([td.float32, td.float16, td.bfloat16]),
       seed=st.sampled_from(SEEDS), offset=st.sampled_from(OFFSETS))
def test_normal_against_reference(shape, params, dtype, seed, offset):
    assume(not (shape == () and dtype is td.bfloat16))  # the reference returns those as (1,)
    got = backend().normal(shape, *params, seed, offset, dtype, DEVICE)
    expected = REFERENCE.normal(shape, *params, seed, offset, dtype, "cpu")
    assert got.dtype == expected.dtype
    tol = NORMAL_TOL if dtype is td.float32 else dict(rtol=1e-2, atol=1e-2)
    assert_close(got, expected, **tol)


@pytest.mark.parametrize("p", [0.0, 0.1, 0.5, 0.999, 1.0])
@pytest.mark.parametrize("dtype", [td.float32, td.float16, td.bfloat16])
def test_dropout_against_reference(p, dtype):
    x = random_array((6, 11), dtype, DEVICE, seed=3)
    y, mask = backend().dropout(x, p, 42, 2**32 - 10)
    y_ref, mask_ref = REFERENCE.dropout(x.cpu(), p, 42, 2**32 - 10)
    assert mask.dtype == torch.bool and torch.equal(mask.cpu(), mask_ref)
    assert y.dtype == x.dtype
    assert_close(y, y_ref, rtol=0, atol=0)
    if p == 0.0:
        assert bool(mask.all())
    if p == 1.0:
        assert not bool(mask.any()) and float(y.abs().max()) == 0.0


def test_dropout_strided_input_uses_logical_order():
    x = random_array((8, 5), td.float32, DEVICE, seed=4).t()  # (5, 8), transposed
    y, mask = backend().dropout(x, 0.3, 7, 0)
    y_ref, mask_ref = REFERENCE.dropout(x.cpu(), 0.3, 7, 0)
    assert torch.equal(mask.cpu(), mask_ref)
    assert_close(y, y_ref, rtol=0, atol=0)


@pytest.mark.parametrize("n", [0, 1, 2, 3, 5, 17, 64, 1000])
@pytest.mark.parametrize("seed,offset", [(0, 0), (2**64 - 1, 2**33 + 1)])
def test_randperm_identical_and_a_permutation(n, seed, offset):
    got = backend().randperm(n, seed, offset, DEVICE)
    expected = REFERENCE.randperm(n, seed, offset, "cpu")
    assert got.dtype == torch.int64 and torch.equal(got.cpu(), expected)
    assert sorted(got.cpu().tolist()) == list(range(n))


def test_same_seed_same_numbers_on_both_backends():
    draws = {}
    for name in ("numpy", "triton"):
        with td.use_backend(name):
            td.manual_seed(1234)
            draws[name] = (td.rand(4, 5).numpy(), td.randn(7).numpy(), td.randperm(9).numpy())
    assert np.array_equal(draws["numpy"][0], draws["triton"][0])
    assert_close(draws["triton"][1], draws["numpy"][1], **NORMAL_TOL)
    assert np.array_equal(draws["numpy"][2], draws["triton"][2])


def test_dropout_rejects_bad_p():
    with pytest.raises(ValueError, match="dropout"):
        backend().dropout(random_array((3,), td.float32, DEVICE), 1.5, 0, 0)


# ----------------------------------------------------------------------------- GPU tier


@pytest.mark.gpu
def test_gpu_large_draws_match_and_have_the_right_moments():
    n = 1 << 24
    u = backend().uniform((n,), 0.0, 1.0, 99, 12345, td.float32, DEVICE)
    assert torch.equal(u[-4096:].cpu(), REFERENCE.uniform((n,), 0.0, 1.0, 99, 12345, td.float32,
                                                          "cpu")[-4096:])
    assert abs(float(u.mean()) - 0.5) < 1e-3 and abs(float(u.var()) - 1 / 12) < 1e-3
    z = backend().normal((n,), 0.0, 1.0, 99, 0, td.float32, DEVICE)
    assert abs(float(z.mean())) < 2e-3 and abs(float(z.std()) - 1.0) < 2e-3
    assert_close(z[:100000], REFERENCE.normal((100000,), 0.0, 1.0, 99, 0, td.float32, "cpu"),
                 **NORMAL_TOL)
    _, mask = backend().dropout(torch.ones(n, device=DEVICE), 0.25, 5, 0)
    assert abs(float(mask.float().mean()) - 0.75) < 1e-3


@pytest.mark.gpu
def test_gpu_randperm_large():
    n = 60000
    got = backend().randperm(n, 3, 77, DEVICE)
    assert torch.equal(got.cpu(), REFERENCE.randperm(n, 3, 77, "cpu"))
    assert torch.equal(torch.sort(got).values.cpu(), torch.arange(n))
