"""The launch path: bound launches (KernelLaunch) and the lean C launcher (fastlaunch.c).

On a CPU the C launcher is only compiled (it needs a GPU to run); on a GPU, launches through it
are checked against launches through Triton's own launcher, parameter type by parameter type.
"""
import os
import shutil

import pytest
import torch

import tritonad as td
from tritonad.kernels import launch


@pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None,
                    reason="no C compiler on this machine")
def test_the_lean_launcher_compiles(tmp_path, monkeypatch):
    """fastlaunch.c builds with Triton's build helper against the cuda.h Triton ships (what a
    GPU machine does at import), so that a C mistake shows on the CPU tier too."""
    from triton.backends.nvidia import driver
    from triton.runtime.build import compile_module_from_src

    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    path = os.path.join(os.path.dirname(launch.__file__), "fastlaunch.c")
    with open(path) as f:
        module = compile_module_from_src(f.read(), "fastlaunch",
                                         include_dirs=list(driver.include_dirs),
                                         libraries=["dl"])
    assert callable(module.make) and callable(module.launch)
    with pytest.raises(TypeError, match="launch"):
        module.launch(object(), 0)


gpu = pytest.mark.gpu


def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def mixed(out_ptr, x_ptr, i32, i64, f32, g32, flag, one, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        x = tl.load(x_ptr + offs, mask=mask)
        value = x * f32 + g32 + i32 + (i64 // 1000000000000).to(tl.float32)
        value = tl.where(flag, value, -value) * one
        tl.store(out_ptr + offs, value, mask=mask)

    return mixed


@gpu
def test_gpu_the_lean_launcher_passes_every_parameter_type():
    """One kernel with pointer, i32, i64, fp32 and bool parameters and an int equal to 1
    (which Triton turns into a constant): bound once, then replayed with other pointers and
    other scalars at non-leading positions, each result against torch."""
    kernel = _kernel()
    n = 1000
    x = torch.randn(n, device="cuda")
    out = torch.empty(n, device="cuda")
    big = 7 * 10 ** 12  # an i64 value
    args = [out, x, 3, big, 0.5, 2.25, True, 1, n]
    kl = launch.KernelLaunch(kernel, (4,), args, {"BLOCK": 256}, dynamic=(0, 1, 2, 4, 6))
    assert kl._fast is not None, launch.FAST_SKIPPED
    torch.testing.assert_close(out, x * 0.5 + 2.25 + 3 + 7)
    x2, out2 = torch.randn(n, device="cuda"), torch.empty(n, device="cuda")
    kl(out2.data_ptr(), x2.data_ptr(), -5, 1.5, False)
    torch.testing.assert_close(out2, -(x2 * 1.5 + 2.25 - 5 + 7))
    kl(out2, x2, 4, -2.0, True)  # arrays rather than addresses are taken too
    torch.testing.assert_close(out2, x2 * -2.0 + 2.25 + 4 + 7)


@gpu
def test_gpu_training_steps_launch_everything_through_the_lean_launcher():
    """Eager mlp and cnn training steps (forward, loss, backward, SGD) bind every one of their
    kernels to the lean launcher: none falls back to Triton's (FAST_SKIPPED names any that
    would, and why)."""
    import tritonad.nn.functional as F
    from tritonad import models, optim

    launch.FAST_SKIPPED.clear()
    td.manual_seed(0)
    for name, shape in (("mlp", (128, 1, 28, 28)), ("cnn", (100, 1, 28, 28))):
        model = models.build(name).to("cuda")
        opt = optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        x = td.randn(*shape, device="cuda")
        y = td.from_torch(torch.randint(0, 10, (shape[0],), device="cuda"))
        for _ in range(2):
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        assert loss.item() == loss.item()
    assert not launch.FAST_SKIPPED, launch.FAST_SKIPPED
