"""The network operators of tritonad.torch_backend (torch_backend/nn_ops.py, attention_ops.py,
optim_ops.py) against PyTorch's own kernels.

Each check runs a PyTorch function twice on the same inputs, with the plugin off and on (only
the operators under test enabled, so a pass cannot come from a fallback), compares the forward
outputs and the gradients under a random cotangent, and asserts through coverage() that every
operator under test ran on tritonad and none fell back. On a CPU machine the plugin runs CPU
tensors on our kernels under Triton's interpreter (tiny shapes); the gpu-marked tests run the
same checks on CUDA tensors at real sizes.
"""
import importlib
import sys

import pytest
import torch
import torch.nn.functional as F

import tritonad.torch_backend as tb
from tritonad.torch_backend.nn_ops import B

from conftest import DEVICE, HAS_GPU

TOL = {torch.float32: dict(atol=2e-5, rtol=1e-4), torch.float64: dict(atol=1e-10, rtol=1e-9),
       torch.bfloat16: dict(atol=2e-2, rtol=1.6e-2), torch.float16: dict(atol=2e-3, rtol=1e-3)}


def _clone(args):
    return [a.detach().clone().requires_grad_(a.requires_grad) if isinstance(a, torch.Tensor)
            else a for a in args]


def _outputs(out):
    return [o for o in (out if isinstance(out, (tuple, list)) else (out,))
            if isinstance(o, torch.Tensor)]


def _run(fn, args, seeds):
    args = _clone(args)
    outs = _outputs(fn(*args))
    leaves = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
    grads = []
    if leaves:
        float_outs = [(o, s) for o, s in zip(outs, seeds) if o.dtype.is_floating_point
                      and o.requires_grad]
        grads = torch.autograd.grad([o for o, _ in float_outs], leaves,
                                    [s for _, s in float_outs], allow_unused=True)
    return outs, list(grads), args


def compare(fn, args, ops, dtype=None, check_format=True, norm_rtol=None, **tol):
    """fn(*args) and its gradients with the plugin on (only `ops` enabled) against off.
    Returns (reference, plugin) (outputs, grads, args) triples. norm_rtol: compare each
    result by the relative error of the whole, |g - r| / |r| (for half-precision gradients
    summed over ~1e5 elements, where elements that nearly cancel carry the rounding of every
    term)."""
    torch.manual_seed(1)
    probe = _outputs(fn(*_clone(args)))
    seeds = [torch.randn(o.shape, dtype=o.dtype, device=o.device) if o.dtype.is_floating_point
             else None for o in probe]
    ref = _run(fn, args, seeds)
    tb.reset_coverage()
    with tb.use(include=[o for op in ops for o in (op if isinstance(op, tuple) else (op,))]):
        got = _run(fn, args, seeds)
    cov = tb.coverage()
    for op in ops:  # (a tuple: the forms PyTorch picks among, one of which must run)
        forms = op if isinstance(op, tuple) else (op,)
        assert any(cov.get(o, {}).get("tritonad", 0) for o in forms), \
            f"{op} did not run on tritonad: {cov}"
        assert not any(cov.get(o, {}).get("pytorch", 0) for o in forms), \
            f"{op} fell back to PyTorch: {cov}"
    tol = tol or TOL[dtype or args[0].dtype]
    for kind, r_list, g_list in (("forward", ref[0], got[0]), ("backward", ref[1], got[1])):
        for i, (r, g) in enumerate(zip(r_list, g_list)):
            if r is None:
                assert g is None
                continue
            assert g.shape == r.shape and g.dtype == r.dtype, \
                f"{kind} {i}: {tuple(g.shape)} {g.dtype} against {tuple(r.shape)} {r.dtype}"
            if check_format and r.dim() == 4 and kind == "forward":
                last = torch.channels_last
                assert g.is_contiguous(memory_format=last) == r.is_contiguous(
                    memory_format=last), f"{kind} {i}: memory format differs"
            if norm_rtol is not None:
                err = ((g.float() - r.float()).norm() / r.float().norm().clamp_min(1e-30)).item()
                assert err <= norm_rtol, f"{kind} {i}: relative error {err:.2e} > {norm_rtol}"
                continue
            torch.testing.assert_close(g, r, **tol, msg=lambda m: f"{kind} {i}: {m}")
    return ref, got


@pytest.fixture(autouse=True)
def full_float32():
    """PyTorch's float32 convolutions and products at float32 accuracy (cuDNN takes TF32 by
    default; the convolution handler follows the same flag), the oracle of a float32
    comparison; restored after."""
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


def rnd(*shape, dtype=torch.float32, grad=True, device=DEVICE):
    return torch.randn(*shape, dtype=dtype, device=device).requires_grad_(grad)


CONV = ["aten::convolution.default", "aten::convolution_backward.default"]


# ---------------------------------------------------------------------------------- convolution


@pytest.mark.parametrize("case", [
    dict(stride=2, padding=1),
    dict(padding=2, dilation=2, groups=2, bias=False),
    dict(channels_last=True, padding=1),
], ids=["stride", "groups-dilation", "channels-last"])
def test_conv2d(case):
    torch.manual_seed(0)
    case = dict(case)
    last, has_bias = case.pop("channels_last", False), case.pop("bias", True)
    x, w = rnd(2, 4, 7, 5), rnd(6, 4 // case.get("groups", 1), 3, 3)
    if last:
        x = x.detach().to(memory_format=torch.channels_last).requires_grad_()
    b = rnd(6) if has_bias else None
    compare(lambda x, w, b: F.conv2d(x, w, b, **case), [x, w, b], CONV)


def test_conv1d_and_transposed():
    torch.manual_seed(0)
    compare(lambda x, w, b: F.conv1d(x, w, b, stride=2, padding=1),
            [rnd(2, 3, 9), rnd(4, 3, 3), rnd(4)], CONV)
    compare(lambda x, w, b: F.conv_transpose2d(x, w, b, stride=2, padding=1, output_padding=1),
            [rnd(2, 4, 3, 4), rnd(4, 3, 3, 3), rnd(3)], CONV)


@pytest.mark.parametrize("tf32", [True, False])
def test_conv_precision_follows_pytorchs_flag(tf32, monkeypatch):
    """A float32 convolution runs at TF32 ("high") where cuDNN would (allow_tf32, PyTorch's
    default) and at float32 accuracy ("highest") where not; tritonad's setting is restored."""
    from tritonad import settings
    seen, conv2d = [], B.conv2d
    monkeypatch.setattr(B, "conv2d", lambda *a: seen.append(settings.conv_precision())
                        or conv2d(*a))
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", tf32)
    before = settings.conv_precision()
    with tb.use(include=CONV):
        F.conv2d(rnd(1, 2, 4, 4, grad=False), rnd(3, 2, 3, 3, grad=False))
    assert seen == ["high" if tf32 else "highest"] and settings.conv_precision() == before


def test_conv_3d_falls_back():
    x, w = rnd(1, 2, 3, 3, 3, grad=False), rnd(2, 2, 1, 1, 1, grad=False)
    tb.reset_coverage()
    with tb.use(include=CONV):
        y = F.conv3d(x, w)
    torch.testing.assert_close(y, F.conv3d(x, w))
    assert tb.coverage()["aten::convolution.default"] == {"tritonad": 0, "pytorch": 1}
    with pytest.raises(NotImplementedError, match="convolution"):
        with tb.use(include=CONV, strict=True):
            F.conv3d(x, w)


# -------------------------------------------------------------------------------------- pooling


def test_max_pool2d():
    torch.manual_seed(0)
    ops = ["aten::max_pool2d_with_indices.default",
           "aten::max_pool2d_with_indices_backward.default"]
    x = rnd(2, 3, 7, 6)
    ref, got = compare(lambda x: F.max_pool2d(x, 3, 2, 1, ceil_mode=True, return_indices=True),
                       [x], ops)
    assert torch.equal(ref[0][1], got[0][1])  # the indices, exactly
    last = x.detach().to(memory_format=torch.channels_last).requires_grad_()
    compare(lambda x: F.max_pool2d(x, 2), [last], ops)


def test_avg_pools():
    torch.manual_seed(0)
    ops = ["aten::avg_pool2d.default", "aten::avg_pool2d_backward.default"]
    compare(lambda x: F.avg_pool2d(x, 3, 2, 1, count_include_pad=False), [rnd(2, 3, 7, 6)], ops)
    compare(lambda x: F.avg_pool2d(x, 2, divisor_override=3), [rnd(3, 4, 6)], ops)
    ops = ["aten::_adaptive_avg_pool2d.default", "aten::_adaptive_avg_pool2d_backward.default"]
    compare(lambda x: F.adaptive_avg_pool2d(x, (2, 3)), [rnd(2, 3, 4, 6)], ops)


# -------------------------------------------------------------------------------------- norms


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_layer_norm(dtype):
    torch.manual_seed(0)
    ops = ["aten::native_layer_norm.default", "aten::native_layer_norm_backward.default"]
    x = rnd(3, 10, 6, dtype=dtype).detach().transpose(0, 1).requires_grad_()  # non-contiguous
    compare(lambda x, w, b: F.layer_norm(x, (6,), w, b), [x, rnd(6, dtype=dtype),
                                                         rnd(6, dtype=dtype)], ops)
    if dtype == torch.float32:
        compare(lambda x: F.layer_norm(x, (3, 5)), [rnd(4, 3, 5)], ops)


def test_group_norm():
    torch.manual_seed(0)
    ops = ["aten::native_group_norm.default", "aten::native_group_norm_backward.default"]
    compare(lambda x, w, b: F.group_norm(x, 2, w, b), [rnd(3, 4, 3, 5), rnd(4), rnd(4)], ops,
            atol=5e-5, rtol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_gpu(dtype):
    """F.rms_norm where PyTorch runs it as _fused_rms_norm (its CUDA kernel)."""
    ops = ["aten::_fused_rms_norm.default", "aten::_fused_rms_norm_backward.default"]
    tb.reset_coverage()
    with tb.use(include=[]):  # (nothing of ours: records which operators PyTorch calls)
        F.rms_norm(rnd(4, 64, dtype=dtype), (64,), rnd(64, dtype=dtype))
    if ops[0] not in tb.coverage():
        pytest.skip("this PyTorch composes rms_norm of smaller operators")
    compare(lambda x, w: F.rms_norm(x, (64,), w), [rnd(33, 64, dtype=dtype),
                                                   rnd(64, dtype=dtype)], ops)


# (CUDA runs batch norm as cuDNN's form where cuDNN takes it: either counts)
BN = [("aten::native_batch_norm.default", "aten::cudnn_batch_norm.default"),
      ("aten::native_batch_norm_backward.default", "aten::cudnn_batch_norm_backward.default")]


@pytest.mark.parametrize("layout", ["nchw", "channels-last", "2d", "eval"])
def test_batch_norm(layout):
    torch.manual_seed(0)
    x = rnd(4, 3, 5, 3) if layout != "2d" else rnd(6, 3)
    if layout == "channels-last":
        x = x.detach().to(memory_format=torch.channels_last).requires_grad_()
    training = layout != "eval"
    stats = [torch.randn(3, device=DEVICE), torch.rand(3, device=DEVICE) + 0.5]
    runs = {}

    def fn(x, w, b, tag=None):
        rm, rv = (s.clone() for s in stats)
        y = F.batch_norm(x, rm, rv, w, b, training, 0.3, 1e-5)
        runs.setdefault("stats", []).append((rm, rv))
        return y
    compare(fn, [x, rnd(3), rnd(3)], BN)
    (rm_ref, rv_ref), (rm_got, rv_got) = runs["stats"][-2], runs["stats"][-1]
    torch.testing.assert_close(rm_got, rm_ref)  # the running statistics' update too
    torch.testing.assert_close(rv_got, rv_ref)


def test_batch_norm_bf16_input_float32_parameters():
    torch.manual_seed(0)
    compare(lambda x, w, b: F.batch_norm(x, None, None, w, b, True),
            [rnd(4, 3, 4, 4, dtype=torch.bfloat16), rnd(3), rnd(3)], BN, dtype=torch.bfloat16)


# ------------------------------------------------------------------------- embedding and losses


def test_embedding():
    torch.manual_seed(0)
    ops = ["aten::embedding.default", "aten::embedding_dense_backward.default"]
    index = torch.tensor([[1, 4, 1], [0, 2, 4]], device=DEVICE)
    compare(lambda w: F.embedding(index, w, padding_idx=4), [rnd(6, 5)], ops)
    with pytest.raises(IndexError):
        with tb.use(include=ops):
            F.embedding(torch.tensor([6], device=DEVICE), rnd(6, 5, grad=False))
            B.check_errors(torch.device(DEVICE))


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_nll_loss(reduction):
    torch.manual_seed(0)
    ops = ["aten::nll_loss_forward.default", "aten::nll_loss_backward.default"]
    target = torch.tensor([1, 0, 3, 3, -100], device=DEVICE)
    weight = torch.rand(4, device=DEVICE) + 0.5
    compare(lambda x: F.nll_loss(x, target, weight, reduction=reduction), [rnd(5, 4)], ops)
    if reduction == "mean" and DEVICE == "cpu":  # (a GPU reports it at the next host read)
        with pytest.raises(IndexError, match="out of bounds"):  # PyTorch's own error
            with tb.use(include=ops):
                F.nll_loss(rnd(2, 3, grad=False), torch.tensor([0, 3], device=DEVICE))
    if reduction == "mean":
        ops = ["aten::nll_loss2d_forward.default", "aten::nll_loss2d_backward.default"]
        t2 = torch.tensor([[[0, 2], [1, 1], [2, -100]]], device=DEVICE)
        compare(lambda x: F.nll_loss(x, t2), [rnd(1, 3, 3, 2)], ops)


def test_regression_losses():
    torch.manual_seed(0)
    t = torch.rand(3, 4, device=DEVICE)
    compare(lambda x: F.mse_loss(x, t), [rnd(3, 4)],
            ["aten::mse_loss.default", "aten::mse_loss_backward.default"])
    p = (torch.rand(3, 4, device=DEVICE) * 0.9 + 0.05).requires_grad_()
    compare(lambda x: F.binary_cross_entropy(x, t, reduction="sum"), [p],
            ["aten::binary_cross_entropy.default",
             "aten::binary_cross_entropy_backward.default"])
    compare(lambda x: F.binary_cross_entropy_with_logits(x, t, pos_weight=t[0] + 1),
            [rnd(3, 4, grad=False)], ["aten::binary_cross_entropy_with_logits.default"])


def test_native_dropout():
    torch.manual_seed(0)
    ops = ["aten::native_dropout.default", "aten::native_dropout_backward.default"]
    x = torch.ones(64, 8, device=DEVICE, requires_grad=True)
    tb.reset_coverage()
    with tb.use(include=ops):
        y, mask = torch.ops.aten.native_dropout(x, 0.25, True)
        dx = torch.ops.aten.native_dropout_backward(torch.full_like(y, 3.0), mask, 1 / 0.75)
    assert tb.coverage()[ops[0]]["tritonad"] == 1 and tb.coverage()[ops[1]]["tritonad"] == 1
    assert mask.dtype == torch.bool and 0.6 < mask.float().mean().item() < 0.9
    torch.testing.assert_close(y, mask.float() / 0.75)
    torch.testing.assert_close(dx, mask.float() * 4.0)


# ----------------------------------------------------------------------------------- gpu sizes


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_network_ops_full_size_gpu(dtype, monkeypatch):
    """Full-size layers against PyTorch's kernels. float32: both sides at float32 accuracy
    (TF32 off: with it on, the two sides' TF32 roundings differ by up to 0.05 in a weight
    gradient summed over 100,352 products); bf16: the relative error of each whole result."""
    torch.manual_seed(0)
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    tol = dict(atol=2e-3, rtol=2e-3) if dtype == torch.float32 else dict(norm_rtol=1e-2)
    x = rnd(32, 64, 56, 56, dtype=dtype).detach().to(
        memory_format=torch.channels_last).requires_grad_()
    compare(lambda x, w: F.conv2d(x, w, padding=1), [x, rnd(64, 64, 3, 3, dtype=dtype)], CONV,
            **tol)
    compare(lambda x, w, b: F.batch_norm(x, None, None, w, b, True), [x, rnd(64), rnd(64)],
            BN, dtype=dtype, **tol)
    compare(lambda x: F.max_pool2d(x, 3, 2, 1), [x],
            ["aten::max_pool2d_with_indices.default",
             "aten::max_pool2d_with_indices_backward.default"], **tol)
    compare(lambda x, w, b: F.layer_norm(x, (768,), w, b),
            [rnd(8, 256, 768, dtype=dtype), rnd(768, dtype=dtype), rnd(768, dtype=dtype)],
            ["aten::native_layer_norm.default", "aten::native_layer_norm_backward.default"],
            **tol)


# ------------------------------------------------------------------------------------ attention

SDPA_CPU = ["aten::_scaled_dot_product_flash_attention_for_cpu.default",
            "aten::_scaled_dot_product_flash_attention_for_cpu_backward.default"]


@pytest.mark.skipif(HAS_GPU, reason="the CPU's attention form (test_sdpa_gpu: CUDA's)")
@pytest.mark.parametrize("case", ["causal", "mask-gqa"])
def test_sdpa_cpu(case):
    torch.manual_seed(0)
    if case == "causal":  # q, k, v as a GPT's attention cuts them from one projection
        def fn(qkv):
            q, k, v = (z.view(2, 5, 2, 8).transpose(1, 2) for z in qkv.split(16, dim=2))
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        args = [rnd(2, 5, 48)]
    else:
        args = [rnd(1, 4, 6, 8), rnd(1, 2, 7, 8), rnd(1, 2, 7, 8)]
        mask = torch.randn(6, 7) > -0.5
        fn = lambda q, k, v: F.scaled_dot_product_attention(  # noqa: E731
            q, k, v, attn_mask=mask, enable_gqa=True, scale=0.3)
    ref, got = compare(fn, args, SDPA_CPU)
    assert got[0][0].stride() == ref[0][0].stride()  # the output's layout, as PyTorch's


SDPA_FORMS = {"flash": "_scaled_dot_product_flash_attention",
              "efficient": "_scaled_dot_product_efficient_attention",
              "cudnn": "_scaled_dot_product_cudnn_attention"}


@pytest.mark.gpu
@pytest.mark.parametrize("form, dtype", [("flash", torch.bfloat16),
                                         ("efficient", torch.float32),
                                         ("efficient", torch.bfloat16),
                                         ("cudnn", torch.bfloat16)])
def test_sdpa_gpu(form, dtype):
    """Each CUDA form PyTorch may pick (forced with sdpa_kernel) runs on tritonad's flash
    attention, forward and backward, with the log-sum-exp in that form's shape."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    backend = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
               "cudnn": SDPBackend.CUDNN_ATTENTION}[form]
    torch.manual_seed(0)
    q, k, v = (rnd(4, 12, 256, 64, dtype=dtype) for _ in range(3))

    def fn(q, k, v):
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    try:
        fn(q, k, v)
    except RuntimeError as e:  # (this PyTorch build or GPU has no such form)
        pytest.skip(f"{form}: {e}")
    tol = dict(atol=2e-3, rtol=2e-3) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
    name = SDPA_FORMS[form]
    compare(fn, [q, k, v], [f"aten::{name}.default", f"aten::{name}_backward.default"], **tol)


def test_sdpa_dropout_backward_regenerates_the_mask():
    """Attention dropout (the memory-efficient form's handlers, called directly): the forward's
    draw is found again by the backward, which gives the gradients of softmax(q k^T s) * keep /
    (1 - p) @ v for the keep mask of that draw (Philox, the weights' element order)."""
    from tritonad.torch_backend import attention_ops
    torch.manual_seed(0)
    ops = ["aten::_scaled_dot_product_efficient_attention.default",
           "aten::_scaled_dot_product_efficient_attention_backward.default"]
    q, k, v = rnd(1, 2, 6, 8), rnd(1, 2, 6, 8), rnd(1, 2, 6, 8)
    g = torch.randn(1, 2, 6, 8, device=DEVICE)
    p, scale = 0.3, 8 ** -0.5
    tb.reset_coverage()
    with tb.use(include=ops):
        out = torch.ops.aten._scaled_dot_product_efficient_attention(q, k, v, None, True, p,
                                                                     True)
        grads = torch.autograd.grad(out[0], (q, k, v), g)
    assert tb.coverage()[ops[1]]["tritonad"] == 1
    seed, offset = attention_ops._DRAWS[(out[2].device, out[2].data_ptr())]
    keep = B.dropout(torch.ones(1, 2, 6, 6, device=DEVICE), p, seed, offset)[1]
    qr, kr, vr = (t.detach().clone().requires_grad_() for t in (q, k, v))
    causal = torch.ones(6, 6, dtype=torch.bool, device=DEVICE).tril()
    w = torch.softmax((qr @ kr.transpose(-1, -2) * scale).masked_fill(~causal, -torch.inf), -1)
    ref = (w * keep / (1 - p)) @ vr
    torch.testing.assert_close(out[0], ref, **TOL[torch.float32])
    for got, want in zip(grads, torch.autograd.grad(ref, (qr, kr, vr), g)):
        torch.testing.assert_close(got, want, **TOL[torch.float32])


# --------------------------------------------------------------------- PyTorch's OpInfo samples

OPINFO_OPS = {  # OpInfo name -> the aten operators of ours its samples reach
    "nn.functional.conv1d": CONV, "nn.functional.conv2d": CONV,
    "nn.functional.conv_transpose2d": CONV,
    "nn.functional.max_pool2d": ["aten::max_pool2d_with_indices.default"],
    "nn.functional.avg_pool2d": ["aten::avg_pool2d.default"],
    "nn.functional.adaptive_avg_pool2d": ["aten::_adaptive_avg_pool2d.default"],
    "nn.functional.layer_norm": ["aten::native_layer_norm.default"],
    "nn.functional.group_norm": ["aten::native_group_norm.default"],
    "nn.functional.batch_norm": ["aten::native_batch_norm.default",
                                 "aten::cudnn_batch_norm.default"],
    "nn.functional.embedding": ["aten::embedding.default"],
    "nn.functional.nll_loss": ["aten::nll_loss_forward.default",
                               "aten::nll_loss2d_forward.default"],
    "nn.functional.mse_loss": ["aten::mse_loss.default"],
    "nn.functional.binary_cross_entropy": ["aten::binary_cross_entropy.default"],
    "nn.functional.scaled_dot_product_attention": [
        "aten::_scaled_dot_product_flash_attention.default",
        "aten::_scaled_dot_product_efficient_attention.default",
        "aten::_scaled_dot_product_cudnn_attention.default"],
}


def _opinfo(name):
    try:
        importlib.import_module("expecttest")  # (torch.testing._internal imports it)
    except ImportError:  # (only for its TestCase base and ACCEPT flag: a stand-in does)
        import types
        import unittest
        stand_in = types.ModuleType("expecttest")
        stand_in.TestCase, stand_in.ACCEPT = unittest.TestCase, False
        sys.modules["expecttest"] = stand_in
    from torch.testing._internal.common_methods_invocations import op_db
    return next(op for op in op_db if op.name == name and op.variant_test_name == "")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", list(OPINFO_OPS))
def test_opinfo_samples_gpu(name, dtype):
    """Every sample PyTorch's OpInfo gives for the op: forward and gradients (all-ones
    cotangent) with the plugin on against off. A sample a handler leaves to PyTorch must still
    agree; at least one sample must run on tritonad."""
    check_opinfo(name, dtype, "cuda")


def check_opinfo(name, dtype, device, limit=None):
    info = _opinfo(name)
    if dtype not in info.supported_dtypes(device):
        pytest.skip(f"{name} does not take {dtype}")
    tol = TOL[dtype] if dtype != torch.float32 else dict(atol=1e-4, rtol=1e-4)
    samples = list(info.sample_inputs(device, dtype,
                                      requires_grad=info.supports_autograd))[:limit]
    ops = OPINFO_OPS[name]
    tb.reset_coverage()
    for sample in samples:
        if sample.kwargs.get("dropout_p") or sample.kwargs.get("training") and "dropout" in name:
            continue  # (other random masks than PyTorch's: test_sdpa_dropout_* checks those)

        def run(plugin):
            args = [sample.input] + list(sample.args)
            args = [a.detach().clone().requires_grad_(a.requires_grad)
                    if isinstance(a, torch.Tensor) else a for a in args]
            with (tb.use(include=_all_ours()) if plugin else _nothing()):
                torch.manual_seed(0)
                outs = _outputs(info.op(*args, **sample.kwargs))
                leaves = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
                diff = [o for o in outs if o.requires_grad]
                grads = torch.autograd.grad(diff, leaves, [torch.ones_like(o) for o in diff],
                                            allow_unused=True) if leaves and diff else []
            return outs, grads
        for r, g in zip(*(sum(map(list, run(p)), []) for p in (False, True))):
            if r is not None and g is not None:
                torch.testing.assert_close(g, r, **tol, equal_nan=True,
                                           msg=lambda m: f"{name} {sample}: {m}")
    cov = tb.coverage()
    assert any(cov.get(op, {}).get("tritonad", 0) for op in ops), (name, cov)


def _all_ours():
    from tritonad.torch_backend import registry
    mine = {f"tritonad.torch_backend.{m}"
            for m in ("nn_ops", "norm_ops", "loss_ops", "attention_ops", "optim_ops")}
    return [op for op, fn in registry.IMPLS.items() if fn.__module__ in mine]


def _nothing():
    import contextlib
    return contextlib.nullcontext()


# ----------------------------------------------------------------------------------- optimizers

OPTIMIZERS = {
    "adamw-fused": (lambda p: torch.optim.AdamW(p, lr=0.1, weight_decay=0.1, fused=True),
                    ["aten::_fused_adamw_.default"]),
    "adam-fused": (lambda p: torch.optim.Adam(p, lr=0.1, weight_decay=0.1, fused=True),
                   ["aten::_fused_adam_.default"]),
    "sgd-fused": (lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, nesterov=True,
                                            weight_decay=0.01, fused=True),
                  ["aten::_fused_sgd_.default"]),
    "adamw-foreach": (lambda p: torch.optim.AdamW(p, lr=0.1, weight_decay=0.1, foreach=True),
                      ["aten::_foreach_lerp_.Scalar", "aten::_foreach_addcmul_.Scalar",
                       "aten::_foreach_sqrt.default", "aten::_foreach_addcdiv_.ScalarList",
                       "aten::_foreach_div_.ScalarList", "aten::_foreach_add_.Scalar",
                       "aten::_foreach_mul_.Scalar"]),
    "sgd-foreach": (lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, foreach=True),
                    ["aten::_foreach_add_.List", "aten::_foreach_mul_.Scalar"]),
}


@pytest.mark.parametrize("kind", list(OPTIMIZERS))
def test_optimizer_steps(kind):
    """Three steps of torch.optim's fused or foreach path, the plugin on against off."""
    make, ops = OPTIMIZERS[kind]

    def trajectory(plugin):
        torch.manual_seed(0)
        params = [torch.randn(4, 3, device=DEVICE, requires_grad=True),
                  torch.randn(3, device=DEVICE, requires_grad=True)]
        opt = make(params)
        for _ in range(3):
            for p in params:
                p.grad = torch.randn_like(p)
            if plugin:
                with tb.use(include=ops + ["aten::_foreach_add_.Tensor"]):
                    opt.step()
            else:
                opt.step()
        return [p.detach() for p in params]
    ref = trajectory(False)
    tb.reset_coverage()
    got = trajectory(True)
    cov = tb.coverage()
    for op in ops:
        assert cov.get(op, {}).get("tritonad", 0) >= 1 and cov[op]["pytorch"] == 0, (op, cov)
    for r, g in zip(ref, got):
        torch.testing.assert_close(g, r, atol=1e-6, rtol=1e-5)


def test_clip_grad_norm():
    ops = ["aten::_foreach_norm.Scalar", "aten::_foreach_mul_.Tensor"]
    torch.manual_seed(0)
    grads = [torch.randn(5, 3, device=DEVICE) * 3, torch.randn(7, device=DEVICE)]

    def clip(plugin):
        params = [torch.zeros_like(g, requires_grad=True) for g in grads]
        for p, g in zip(params, grads):
            p.grad = g.clone()
        if plugin:
            with tb.use(include=ops):
                norm = torch.nn.utils.clip_grad_norm_(params, 1.0, foreach=True)
        else:
            norm = torch.nn.utils.clip_grad_norm_(params, 1.0, foreach=True)
        return [norm] + [p.grad for p in params]
    ref = clip(False)
    tb.reset_coverage()
    got = clip(True)
    for op in ops:
        assert tb.coverage()[op]["tritonad"] == 1, tb.coverage()
    for r, g in zip(ref, got):
        torch.testing.assert_close(g, r)


@pytest.mark.parametrize("found", [0.0, 1.0])
def test_fused_steps_with_a_grad_scaler(found):
    """grad_scale and found_inf as a GradScaler passes them: the gradients unscaled in place,
    the update skipped when found_inf is set."""
    def step(plugin):
        torch.manual_seed(0)
        params = [torch.randn(4, 3, device=DEVICE), torch.randn(5, device=DEVICE)]
        grads = [torch.randn_like(p) * 64 for p in params]
        m, v = [torch.zeros_like(p) for p in params], [torch.rand_like(p) for p in params]
        steps = [torch.full((), 3.0, device=DEVICE) for _ in params]
        scale = torch.full((1,), 64.0, device=DEVICE)
        found_inf = torch.full((1,), found, device=DEVICE)
        with (tb.use(include=["aten::_fused_adamw_.default"]) if plugin else _nothing()):
            torch.ops.aten._fused_adamw_(params, grads, m, v, [], steps, lr=0.1, beta1=0.9,
                                         beta2=0.99, weight_decay=0.1, eps=1e-8, amsgrad=False,
                                         maximize=False, grad_scale=scale, found_inf=found_inf)
        return params + m + v
    ref = step(False)
    tb.reset_coverage()
    got = step(True)
    assert tb.coverage()["aten::_fused_adamw_.default"]["tritonad"] == 1
    for r, g in zip(ref, got):
        torch.testing.assert_close(g, r, atol=1e-6, rtol=1e-5)


@pytest.mark.skipif(HAS_GPU, reason="CPU tensors under the interpreter (test_sdpa_gpu: CUDA's)")
def test_cudnn_form_with_dropout_hands_its_draw_to_the_backward():
    """The cuDNN attention form with dropout (PyTorch 2.11 picks it on an H200 for a GPT with
    attention dropout): the forward keeps its draw under the philox_seed tensor it returns,
    and the backward finds it there (the same gradients each time, and not those of no
    dropout)."""
    torch.manual_seed(0)
    q, k, v, do = (torch.randn(1, 2, 5, 8) for _ in range(4))
    op, back = (torch.ops.aten._scaled_dot_product_cudnn_attention.default,
                torch.ops.aten._scaled_dot_product_cudnn_attention_backward.default)

    def grads(out, p):
        return back(do, q, k, v, out[0], out[1], out[6], out[7], torch.empty(0), out[2],
                    out[3], 5, 5, p, True)
    tb.reset_coverage()
    with tb.use(strict=True):
        kept = op(q, k, v, None, True, 0.3, True, False)
        first, again = grads(kept, 0.3), grads(kept, 0.3)
        plain = op(q, k, v, None, True, 0.0, True, False)
        none = grads(plain, 0.0)
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    assert not torch.allclose(kept[0], plain[0]) and not torch.allclose(first[0], none[0])
    assert tb.coverage()["aten::_scaled_dot_product_cudnn_attention_backward.default"] == \
        {"tritonad": 3, "pytorch": 0}
