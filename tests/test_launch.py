"""The launch path: bound launches (KernelLaunch) and the lean C launcher (fastlaunch.c).

On a CPU the C launcher is only compiled (it needs a GPU to run); on a GPU, launches through it
are checked against launches through Triton's own launcher, parameter type by parameter type.
"""
import os
import shutil

import pytest
import torch

import tritonad as td
from tritonad.kernels import launch, plans


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
    triton_launched = [kl.kernel.fn.__name__ for kl in _bound_launches() if kl._fast is None]
    assert not triton_launched, triton_launched  # (kernels with scratch included)


def _bound_launches():
    """Every KernelLaunch of every recorded plan."""
    for cache in plans.PlanCache.ALL:
        for plan in list(cache.values()):
            for kl, _ in getattr(plan, "steps", ()):
                yield kl


def _descriptor_kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def scaled_copy(out_ptr, x_ptr, rows, cols, scale, BLOCK_R: tl.constexpr,
                    BLOCK_C: tl.constexpr):
        # descriptors made on the device: Triton asks for global scratch at every launch
        x_desc = tl.make_tensor_descriptor(x_ptr, shape=[rows, cols], strides=[cols, 1],
                                           block_shape=[BLOCK_R, BLOCK_C])
        out_desc = tl.make_tensor_descriptor(out_ptr, shape=[rows, cols], strides=[cols, 1],
                                             block_shape=[BLOCK_R, BLOCK_C])
        r, c = tl.program_id(0) * BLOCK_R, tl.program_id(1) * BLOCK_C
        out_desc.store([r, c], x_desc.load([r, c]) * scale)

    return scaled_copy


@gpu
def test_gpu_the_lean_launcher_gives_descriptor_kernels_their_scratch():
    """A kernel that builds TMA descriptors on the device needs global scratch (one tensormap
    per descriptor and program): the lean launcher takes it from torch's allocator on each
    launch. Replays with other arrays, eagerly and inside a CUDA graph, give the right results;
    with FAST_SCRATCH off the launch stays on Triton's launcher and agrees."""
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("device-side tensor descriptors need Hopper")
    kernel = _descriptor_kernel()
    rows, cols = 300, 200  # (a ragged last tile in both directions)
    grid = (launch.cdiv(rows, 64), launch.cdiv(cols, 64))
    x, out = torch.randn(rows, cols, device="cuda"), torch.zeros(rows, cols, device="cuda")
    launch.ensure_allocator()
    kl = launch.KernelLaunch(kernel, grid, [out, x, rows, cols, 2.0],
                             {"BLOCK_R": 64, "BLOCK_C": 64}, dynamic=(0, 1, 4))
    assert kl._scratch > 0 and kl._fast is not None, launch.FAST_SKIPPED
    torch.testing.assert_close(out, x * 2.0)
    for _ in range(3):
        x2, out2 = torch.randn(rows, cols, device="cuda"), torch.zeros(rows, cols, device="cuda")
        kl(out2, x2, -0.5)
        torch.testing.assert_close(out2, x2 * -0.5)
    x3, out3 = torch.randn(rows, cols, device="cuda"), torch.zeros(rows, cols, device="cuda")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):  # (the scratch then comes from the graph's pool)
        kl(out3, x3, 3.0)
    for _ in range(2):
        x3.copy_(torch.randn(rows, cols, device="cuda"))
        graph.replay()
        torch.testing.assert_close(out3, x3 * 3.0)
    saved = launch.FAST_SCRATCH
    launch.FAST_SCRATCH = False
    try:
        through_triton = launch.KernelLaunch(kernel, grid, [out, x, rows, cols, 1.0],
                                             {"BLOCK_R": 64, "BLOCK_C": 64}, dynamic=(0, 1, 4))
    finally:
        launch.FAST_SCRATCH = saved
    assert through_triton._fast is None
    through_triton(out2, x2, 4.0)
    torch.testing.assert_close(out2, x2 * 4.0)

