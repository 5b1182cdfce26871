import pytest
from test_torch_backend import TARGETS, TIE_ORDER, CI_SLOW, _check, DEVICE
from torch_backend_harness import all_dtypes

@pytest.mark.parametrize("target", TARGETS, ids=str)
def test_opinfo_full_cpu(target):
    if target.op.name in CI_SLOW:
        pytest.skip("slow")
    dtypes = all_dtypes(target.op, DEVICE)
    if target.op.name in TIE_ORDER:
        dtypes = [d for d in dtypes if d.is_floating_point]
    _check(target, [(d, None, True) for d in dtypes])
