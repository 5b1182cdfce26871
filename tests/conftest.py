"""Test configuration: hypothesis profiles, the gpu marker, the backend fixture.

- `pytest` (CPU): kernels run under Triton's interpreter on small shapes; tests marked `gpu`
  are skipped.
- `pytest -m gpu` (a CUDA machine): the same properties compiled, larger shapes.
Hypothesis: deadline off, examples bounded; derandomized when CI is set, so CI is repeatable.
"""
import os

import pytest
import torch
from hypothesis import HealthCheck, settings

import tritonad as td

HAS_GPU = torch.cuda.is_available()
DEVICE = "cuda" if HAS_GPU else "cpu"

_common = dict(deadline=None, print_blob=True,
               suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                      HealthCheck.function_scoped_fixture])
settings.register_profile("ci", max_examples=10, derandomize=True, **_common)
settings.register_profile("dev", max_examples=10, **_common)
settings.register_profile("gpu", max_examples=40, derandomize=True, **_common)
settings.register_profile("thorough", max_examples=200, **_common)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE")
                      or ("gpu" if HAS_GPU else "ci" if os.environ.get("CI") else "dev"))


def pytest_collection_modifyitems(config, items):
    if HAS_GPU:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run `pytest -m gpu` on one)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(params=["numpy", "triton"])
def backend_name(request):
    """Run the test once on each backend, on the backend's own device."""
    with td.use_backend(request.param):
        yield request.param


@pytest.fixture(autouse=True)
def _fresh_state():
    """Every test starts from the default backend and seed 0, with torch.backends' flags
    settable (importing PyTorch's op_db, as the torch_backend tests do, runs
    torch.testing._internal.common_utils, which freezes them for the rest of the process)."""
    torch.backends.flags_frozen.__globals__["__allow_nonbracketed_mutation_flag"] = True
    td.manual_seed(0)
    yield
    from tritonad.kernels import errors

    errors.clear()  # an error a test left on the device flags is not the next test's
