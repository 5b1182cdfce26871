"""tritonad.torch_backend against PyTorch's own operator database (OpInfo), and the mode itself.

Every OpInfo whose aten operator has a handler runs its samples forward and backward with the
plugin on and off (tests/torch_backend_harness.py); each must match at FlagGems' tolerances and
run a target operator on tritonad in at least one sample. In CPU CI the mode runs cpu tensors
under Triton's interpreter: a few samples of a few dtypes per op (CI_SAMPLES); the GPU tier
(`pytest -m gpu`) runs every sample of every supported dtype on CUDA tensors.
"""
import subprocess
import sys

import pytest
import torch

import tritonad.torch_backend as tb
from tritonad.torch_backend import registry

from conftest import DEVICE, HAS_GPU
from torch_backend_harness import all_dtypes, check_opinfo, ci_dtypes, opinfo_params

tb._load_handlers()
PACKETS = {op._opname for op in registry.IMPLS}
# OpInfos whose aten operators are named otherwise than the OpInfo
EXTRA = {
    "nn.functional.relu6": {"hardtanh"},
    "softmax": {"_softmax"}, "nn.functional.softmax": {"_softmax"},
    "log_softmax": {"_log_softmax"}, "nn.functional.log_softmax": {"_log_softmax"},
    "square": {"pow"}, "true_divide": {"div"}, "clip": {"clamp"},
    "__radd__": {"add"}, "__rmul__": {"mul"}, "__rsub__": {"rsub"}, "__rdiv__": {"div"},
    "__rpow__": {"pow"}, "linalg.vector_norm": {"linalg_vector_norm"},
    "norm": {"linalg_vector_norm"}, "matmul": {"mm", "bmm"}, "addmm.decomposed": {"mm"},
}
# the cases the handlers deliberately leave to PyTorch (they raise Fallback): these OpInfos
# run no sample on tritonad, and are skipped with the reason
DELIBERATE = {
    "div.floor_rounding": "floor division (PyTorch's fmod-based rounding) falls back",
    "floor_divide": "floor division falls back",
    "nn.functional.selu": "elu with scale falls back",
    "nn.functional.celu": "elu with input_scale falls back",
    "nn.functional.rrelu": "random slopes: not a handler",
    "bitwise_and": "bitwise ops of integers fall back (bools run)",
    "bitwise_or": "bitwise ops of integers fall back (bools run)",
    "bitwise_xor": "bitwise ops of integers fall back (bools run)",
}
TARGETS = opinfo_params(PACKETS, EXTRA)
CI_SAMPLES = 2


def _check(target, dtypes, max_samples):
    info = target.op
    report = None
    for dtype in dtypes:
        report = check_opinfo(info, DEVICE, dtype, target.targets, max_samples=max_samples,
                              report=report)
    if report is None or not report.covered:
        if str(target) in DELIBERATE:
            pytest.skip(DELIBERATE[str(target)])
        if report is not None and not report.samples:
            pytest.skip(f"PyTorch refuses every sample: {report.skipped[:1]}")
        raise AssertionError(f"{target}: {report.why_not if report else 'no dtype'}")


@pytest.mark.parametrize("target", TARGETS, ids=str)
def test_opinfo_ci(target):
    """A few samples of float32, a half type, an integer type and bool (CPU CI)."""
    if HAS_GPU:
        pytest.skip("the GPU tier runs test_opinfo_full")
    _check(target, ci_dtypes(target.op, DEVICE), CI_SAMPLES)


@pytest.mark.gpu
@pytest.mark.parametrize("target", TARGETS, ids=str)
def test_opinfo_full(target):
    """Every sample of every supported dtype tritonad holds, on CUDA tensors."""
    _check(target, all_dtypes(target.op, DEVICE), None)


def test_every_registered_operator_reaches_the_mode():
    """A CompositeImplicitAutograd operator is decomposed above the dispatch mode and never
    reaches a handler: registering one would overstate the coverage."""
    implicit = [registry.name_of(op) for op in registry.IMPLS if
                torch._C._dispatch_has_kernel_for_dispatch_key(op.name(),
                                                               "CompositeImplicitAutograd")]
    assert not implicit
