"""Real PyTorch programs, unmodified, on tritonad's kernels (tritonad.torch_backend): each trains
with the plugin on to the same losses as with PyTorch's own kernels.

- examples/mnist_pytorch.py as written, run with runpy after `enable()`;
- a resnet18-shaped CNN (BasicBlocks, BatchNorm, channels-last, bf16 autocast, SGD);
- a GPT (LayerNorm, causal scaled_dot_product_attention, GELU MLP, AdamW fused).
The models are benchmarks/bench_torch_backend.py's (torchvision is not installed).

On the GPU (`pytest -m gpu`) every program runs at real size with `enable(strict=True)`: an
operator without a tritonad kernel fails the test. On a CPU machine the plugin runs CPU tensors
under Triton's interpreter, so the programs run tiny and enable the network operators whose
interpreted kernels fit CI's time (the MNIST script's convolutions and pooling take minutes
there and stay on PyTorch's kernels; the GPU test runs them), and assert that those ran on
tritonad.
"""
import contextlib
import io
import json
import os
import re
import runpy
import shutil
import sys

import pytest
import torch

import tritonad.torch_backend as tb

from conftest import DEVICE, HAS_GPU

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    try:
        import bench_torch_backend
    finally:
        sys.path.pop(0)
    return bench_torch_backend


def _assert_any_ran(*ops):
    """At least one of the operators (the forms PyTorch picks among) ran on tritonad."""
    cov = tb.coverage()
    assert any(cov.get(op, {}).get("tritonad", 0) for op in ops), (ops, cov)


def _assert_ran(ops):
    """Each operator ran on tritonad and never fell back (a tuple: forms PyTorch picks among,
    one of which ran)."""
    cov = tb.coverage()
    for op in ops:
        forms = op if isinstance(op, tuple) else (op,)
        assert any(cov.get(o, {}).get("tritonad", 0) for o in forms), \
            f"{op} did not run on tritonad: {cov}"
        assert not any(cov.get(o, {}).get("pytorch", 0) for o in forms), f"{op} fell back: {cov}"


# ---------------------------------------------------------------------------------------- MNIST


def run_mnist(args, enable=None):
    """examples/mnist_pytorch.py with `args`, after tb.enable(**enable) if given: (the training
    losses it printed, its JSON summary)."""
    script = os.path.join(ROOT, "examples", "mnist_pytorch.py")
    saved_argv, out = sys.argv, io.StringIO()
    sys.argv = [script] + args
    sys.path.insert(0, os.path.dirname(script))  # (its mnist_files fallback for torchvision)
    try:
        if enable is not None:
            tb.enable(**enable)
        with contextlib.redirect_stdout(out):
            runpy.run_path(script, run_name="__main__")
    finally:
        if enable is not None:
            tb.disable()
        sys.argv = saved_argv
        sys.path.remove(os.path.dirname(script))
    text = out.getvalue()
    losses = [float(v) for v in re.findall(r"Loss: ([0-9.]+)", text)]
    return losses, json.loads(text.strip().splitlines()[-1])


MNIST_CPU_OPS = ["aten::nll_loss_forward.default", "aten::nll_loss_backward.default"]


@pytest.mark.skipif(HAS_GPU, reason="the CPU's run (test_mnist_script_one_epoch_strict_gpu)")
def test_mnist_script_cpu():
    args = ["--data", os.path.join(ROOT, "data"), "--epochs", "1", "--limit", "8",
            "--batch-size", "4", "--test-batch-size", "8", "--log-interval", "1", "--no-accel"]
    ref_losses, ref = run_mnist(args)
    tb.reset_coverage()
    losses, got = run_mnist(args, dict(include=MNIST_CPU_OPS))
    _assert_ran(MNIST_CPU_OPS)
    assert len(losses) == len(ref_losses) == 2
    assert losses == pytest.approx(ref_losses, rel=1e-4)
    assert got["accuracy"] == ref["accuracy"]


def _torchvision_layout(folder):
    """A data folder as torchvision's MNIST reads it (MNIST/raw/*.gz, which it checks and
    unpacks instead of downloading), made of the repository's MNIST files."""
    raw = folder / "MNIST" / "raw"
    raw.mkdir(parents=True)
    for name in os.listdir(os.path.join(ROOT, "data", "mnist")):
        if name.endswith(".gz"):
            shutil.copy(os.path.join(ROOT, "data", "mnist", name), raw / name)
    return str(folder)


@pytest.mark.gpu
def test_mnist_script_one_epoch_strict_gpu(tmp_path):
    """One epoch of the script, every operator on tritonad (strict): the test accuracy within
    0.3 points of PyTorch's own (dropout draws other masks, so not bit for bit). Where
    torchvision is installed the script reads the files through it, in its layout."""
    args = ["--data", _torchvision_layout(tmp_path), "--epochs", "1", "--quiet"]
    _, ref = run_mnist(args)
    tb.reset_coverage()
    _, got = run_mnist(args, dict(strict=True))
    _assert_ran(["aten::convolution.default", "aten::convolution_backward.default",
                 "aten::native_dropout.default", "aten::nll_loss_forward.default"])
    assert abs(got["accuracy"] - ref["accuracy"]) <= 0.003, (got, ref)


# ----------------------------------------------------------------------------------- CNN and GPT


def train_losses(make, steps, enable=None):
    """The losses of `steps` steps of make()'s step function, with tb.enable(**enable) on."""
    step = make()
    ctx = tb.use(**enable) if enable is not None else contextlib.nullcontext()
    losses = []
    with ctx:
        for _ in range(steps):
            losses.append(step().detach())
    return [float(v) for v in losses]  # (read back after the mode: .item() is not ours)


def compare_training(make, steps, enable, rel):
    ref = train_losses(make, steps)
    tb.reset_coverage()
    got = train_losses(make, steps, enable)
    assert got == pytest.approx(ref, rel=rel), (got, ref)
    return got


CNN_OPS = ["aten::convolution.default", "aten::convolution_backward.default",
           ("aten::native_batch_norm.default", "aten::cudnn_batch_norm.default"),
           ("aten::native_batch_norm_backward.default",
            "aten::cudnn_batch_norm_backward.default"),
           "aten::max_pool2d_with_indices.default",
           "aten::max_pool2d_with_indices_backward.default"]
ENABLED_CNN_OPS = [o for op in CNN_OPS for o in (op if isinstance(op, tuple) else (op,))]


def _cnn(bench, batch, size, width, blocks, classes, device, fused=False):
    def make():
        torch.manual_seed(0)
        model = bench.ResNet(classes, width, blocks).to(device).to(
            memory_format=torch.channels_last)
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, fused=fused)
        x = torch.randn(batch, 3, size, size, device=device).to(
            memory_format=torch.channels_last)
        y = torch.randint(0, classes, (batch,), device=device)
        return lambda: bench.resnet_step(model, opt, x, y)
    return make


def test_cnn_channels_last_bf16_cpu(bench):
    # resnet18's stem (conv 7x7 / 2, BatchNorm, relu, max pool) and its classifier, tiny
    compare_training(_cnn(bench, 2, 8, 4, (), 5, DEVICE), 2, dict(include=ENABLED_CNN_OPS),
                     rel=3e-2)
    _assert_ran(CNN_OPS)


GPT_OPS = ["aten::embedding.default", "aten::embedding_dense_backward.default",
           "aten::native_layer_norm.default", "aten::native_layer_norm_backward.default",
           "aten::_fused_adamw_.default"]


def _gpt(bench, batch, context, device, dtype, **sizes):
    def make():
        torch.manual_seed(0)
        model = bench.GPT(context=context, **sizes).to(device).train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
        idx = torch.randint(0, 65, (batch, context), device=device)
        targets = torch.randint(0, 65, (batch, context), device=device)
        return lambda: bench.gpt_step(model, opt, idx, targets, dtype)
    return make


@pytest.mark.skipif(HAS_GPU, reason="the CPU's attention form (test_gpt_step_strict_gpu)")
def test_gpt_cpu(bench):
    # (the fused AdamW step is tested on its own in test_torch_backend_nn.py)
    ops = GPT_OPS[:4] + ["aten::_scaled_dot_product_flash_attention_for_cpu.default",
                         "aten::_scaled_dot_product_flash_attention_for_cpu_backward.default"]
    compare_training(_gpt(bench, 2, 8, DEVICE, torch.float32, layers=1, heads=2, width=16), 2,
                     dict(include=ops), rel=1e-4)
    _assert_ran(ops)


@pytest.mark.gpu
def test_resnet18_step_strict_gpu(bench):
    """resnet18 at batch 32, 224 x 224, bf16 autocast, channels-last, fused SGD: five steps with
    every operator on tritonad, the losses within bf16 noise of PyTorch's."""
    compare_training(_cnn(bench, 32, 224, 64, (2, 2, 2, 2), 1000, "cuda", fused=True), 5,
                     dict(strict=True), rel=5e-2)
    _assert_ran(CNN_OPS)


@pytest.mark.gpu
def test_gpt_step_strict_gpu(bench):
    """The gpt recipe's model (6 blocks, width 384, context 256) at batch 16 in bf16: five AdamW
    steps with every operator on tritonad."""
    compare_training(_gpt(bench, 16, 256, "cuda", torch.bfloat16), 5, dict(strict=True),
                     rel=3e-2)
    _assert_ran(GPT_OPS)
    _assert_any_ran(*(f"aten::_scaled_dot_product_{form}_attention_backward.default"
                      for form in ("flash", "efficient", "cudnn")))


@pytest.mark.gpu
def test_gpt_recipe_with_dropout_strict_gpu(bench):
    """The recipe's dropout 0.2 (on the embeddings, the attention weights and after the
    projections) runs on tritonad too; other masks than PyTorch's, so the losses agree to
    dropout's noise only."""
    make = _gpt(bench, 16, 256, "cuda", torch.bfloat16, dropout=0.2)
    ref = train_losses(make, 5)
    tb.reset_coverage()
    got = train_losses(make, 5, dict(strict=True))
    assert got == pytest.approx(ref, rel=0.1), (got, ref)
    _assert_ran(["aten::native_dropout.default", "aten::native_dropout_backward.default"])


def test_benchmark_parses_and_refuses_without_gpu(bench):
    args = bench.common.parse_args("x", ["--quick", "--steps", "2", "--only", "gpt"],
                                   extra=bench._extra)
    assert args.quick and args.steps == 2 and args.only == "gpt"
    if not HAS_GPU:
        with pytest.raises(SystemExit, match="CUDA GPU"):
            bench.main(["--quick"])
