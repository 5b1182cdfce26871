"""Scaled dot-product attention (autodiff/attention_ops.py: the composite, and flash attention in
kernels/attention.py), nn.MultiheadAttention and the transformer encoder (nn/transformer.py),
against torch's CPU implementations (the spec) on both backends.

CPU: the flash kernels run under Triton's interpreter at 16 x 16 tiles, so lengths such as 19
and 23 cover partial blocks and several blocks. The composite (which the numpy backend runs)
is checked against float64 finite differences; the fused form against the composite with the
same random stream (dropout keeps exactly the same weights) and against torch.
GPU (`pytest -m gpu -k attention`): T = 1024, head dims 64 and 128, bf16 / fp16 / float32
against torch's CUDA attention, and the peak memory of a forward and backward.
"""
import importlib.util
import sys
import types

import numpy as np
import pytest
import torch
from helpers import assert_close
from hypothesis import given, settings
from hypothesis import strategies as st

import tritonad as td
import tritonad.nn.functional as F
from tritonad import nn
from tritonad.autodiff.gradcheck import gradcheck
from tritonad.autodiff.attention_ops import scaled_dot_product_attention as sdpa

HAS_GPU = torch.cuda.is_available()
DEVICE = "cuda" if HAS_GPU else "cpu"   # the triton backend's device
TF = torch.nn.functional


def rand(*shape, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=dtype)


def ours(x, requires_grad=False, transpose=None):
    """A tritonad tensor of torch CPU x on the current backend's device; `transpose`: made as
    the transposed layout and transposed back (a non-contiguous view of the same values)."""
    if transpose is not None:
        t = td.tensor(x.transpose(*transpose).contiguous().numpy()).transpose(*transpose)
        return t.requires_grad_(requires_grad) if requires_grad else t
    return td.tensor(x.numpy(), requires_grad=requires_grad)


def torch_attention(q, k, v, dout, **kwargs):
    """torch's output and (dq, dk, dv) under the cotangent dout (float64 CPU)."""
    q, k, v = (t.double().requires_grad_() for t in (q, k, v))
    mask = kwargs.get("attn_mask")
    if mask is not None and mask.dtype != torch.bool:
        kwargs["attn_mask"] = mask.double()
    out = TF.scaled_dot_product_attention(q, k, v, **kwargs)
    out.backward(dout.double())
    return out.detach(), (q.grad, k.grad, v.grad)


# (B, Hq, Hk, L, S, E, Ev, options): odd lengths, partial and several 16-wide blocks
CASES = {
    "plain": ((1, 2, 2, 19, 23, 32, 32), {}),
    "causal": ((1, 2, 2, 19, 23, 32, 16), {"is_causal": True}),   # (strided test's case)
    "causal_long_queries": ((1, 1, 1, 37, 20, 32, 32), {"is_causal": True}),
    "bool_mask": ((2, 1, 1, 19, 23, 32, 32), {"mask": "bool"}),
    "additive_mask": ((1, 2, 2, 19, 23, 64, 64), {"mask": "additive"}),
    "gqa": ((1, 2, 1, 17, 33, 32, 32), {"enable_gqa": True, "is_causal": True}),
    "scale_and_small_dims": ((1, 2, 2, 5, 3, 8, 12), {"scale": 0.7}),
}


def make_case(name):
    (B, Hq, Hk, L, S, E, Ev), opts = CASES[name]
    q, k, v = rand(B, Hq, L, E, seed=1), rand(B, Hk, S, E, seed=2), rand(B, Hk, S, Ev, seed=3)
    kwargs = {key: opts[key] for key in ("is_causal", "enable_gqa", "scale") if key in opts}
    if opts.get("mask") == "bool":  # [L, S], broadcast over batch and heads; no empty row
        mask = rand(L, S, seed=4) > -0.5
        mask[:, 0] = True
        kwargs["attn_mask"] = mask
    elif opts.get("mask") == "additive":  # [B, 1, L, S], broadcast over heads
        kwargs["attn_mask"] = rand(B, 1, L, S, seed=4)
    return q, k, v, kwargs, rand(B, Hq, L, Ev, seed=5)


def run_ours(q, k, v, kwargs, dout, transpose=None):
    a, b, c = (ours(t, True, transpose) for t in (q, k, v))
    kw = dict(kwargs)
    if "attn_mask" in kw:
        kw["attn_mask"] = ours(kw["attn_mask"])
    out = F.scaled_dot_product_attention(a, b, c, **kw)
    grads = td.grad([out], [a, b, c], [ours(dout)])
    return out, grads


@pytest.mark.parametrize("case", sorted(set(CASES) - {"causal"}))
def test_sdpa_matches_torch(backend_name, case):
    q, k, v, kwargs, dout = make_case(case)
    out, grads = run_ours(q, k, v, kwargs, dout)
    if backend_name == "triton":  # the fused kernels ran, not the composite
        assert out.grad_fn.name == "FlashAttentionBackward"
    want, want_grads = torch_attention(q, k, v, dout, **kwargs)
    assert out.dtype == td.float32 and out.shape == tuple(want.shape)
    assert_close(out, want, 1e-5, 1e-5, name=f"{case} out")
    for name, g, w in zip("qkv", grads, want_grads):
        assert_close(g, w, 1e-4, 1e-5, name=f"{case} d{name}")


def test_sdpa_strided_and_batched_inputs(backend_name):
    # [B, L, H, E] storage read as [B, H, L, E] (what MultiheadAttention hands over), and
    # 3-d inputs [N, L, E]
    q, k, v, kwargs, dout = make_case("causal")
    out, grads = run_ours(q, k, v, kwargs, dout, transpose=(1, 2))
    want, want_grads = torch_attention(q, k, v, dout, **kwargs)
    assert_close(out, want, 1e-5, 1e-5, name="strided out")
    for name, g, w in zip("qkv", grads, want_grads):
        assert_close(g, w, 1e-4, 1e-5, name=f"strided d{name}")
    q, k, v, kwargs, dout = make_case("scale_and_small_dims")
    out3, grads3 = run_ours(q[0], k[0], v[0], kwargs, dout[0])
    want3, want3_grads = torch_attention(q[0], k[0], v[0], dout[0], **kwargs)
    assert_close(out3, want3, 1e-5, 1e-5, name="3-d out")
    assert_close(grads3[1], want3_grads[1], 1e-4, 1e-5, name="3-d dk")


def test_flash_attention_uneven_blocks(monkeypatch):
    # the GPU's tile shapes: forward and dQ with more queries than keys a tile, dK/dV with
    # more keys than queries (the causal diagonal crosses several query blocks of a key block);
    # S = 32 leaves no partial key block
    from tritonad.kernels import attention as kernels
    from tritonad.kernels.plans import clear_plans

    monkeypatch.setattr(kernels, "INTERPRET_BLOCKS", ((32, 16, 1, 1), (16, 32, 1, 1),
                                                      (32, 16, 1, 1)))
    clear_plans()
    try:
        with td.use_backend("triton"):
            for S, causal in ((32, False), (45, True)):
                q, k, v = rand(1, 1, 37, 16, seed=1), rand(1, 1, S, 16, seed=2), \
                    rand(1, 1, S, 16, seed=3)
                dout = rand(1, 1, 37, 16, seed=4)
                out, grads = run_ours(q, k, v, {"is_causal": causal}, dout)
                want, want_grads = torch_attention(q, k, v, dout, is_causal=causal)
                assert_close(out, want, 1e-5, 1e-5, name=f"causal={causal} out")
                for name, g, w in zip("qkv", grads, want_grads):
                    assert_close(g, w, 1e-4, 1e-5, name=f"causal={causal} d{name}")
    finally:
        clear_plans()


def test_flash_attention_wide_offsets_and_negative_scale(monkeypatch):
    # int64 row offsets (taken where a head's offsets may pass 2**31; forced here by a lowered
    # limit) and a large negative scale, where the largest scaled score is the scaled smallest
    # dot product (2^(s - m) overflows for a wrong m); a partial last key block
    from tritonad.kernels import attention as kernels
    from tritonad.kernels.plans import clear_plans

    monkeypatch.setattr(kernels, "ROW_INT32_LIMIT", 0)
    clear_plans()
    try:
        with td.use_backend("triton"):
            q, k, v = rand(1, 1, 21, 16, seed=1), rand(1, 1, 18, 16, seed=2), \
                rand(1, 1, 18, 16, seed=3)
            dout = rand(1, 1, 21, 16, seed=4)
            out, grads = run_ours(q, k, v, {"scale": -40.0}, dout)
            assert out.grad_fn.name == "FlashAttentionBackward"
            want, want_grads = torch_attention(q, k, v, dout, scale=-40.0)
            assert_close(out, want, 1e-5, 1e-5, name="out")
            for name, g, w in zip("qkv", grads, want_grads):   # (dS: P (dP - delta), a
                assert_close_norm(g, w, 1e-4, name=f"d{name}")  # difference of near equals)
    finally:
        clear_plans()


@pytest.mark.parametrize("dtype,tol", [("bfloat16", (2e-2, 5e-2))])   # (float16: on the GPU)
def test_flash_attention_half_precision(dtype, tol):
    # half inputs: float32 softmax statistics, P rounded to the input type for P @ V, O and
    # the gradients in the input type (against torch in float32, errors relative to the max)
    with td.use_backend("triton"):
        raw = [rand(1, 2, 19, 16, seed=i).to(DEVICE, getattr(torch, dtype)) for i in range(4)]
        a, b, c = (td.from_torch(t).requires_grad_() for t in raw[:3])
        out = F.scaled_dot_product_attention(a, b, c, is_causal=True)
        assert out.dtype.name == dtype and out.grad_fn.name == "FlashAttentionBackward"
        grads = td.grad([out], [a, b, c], [td.from_torch(raw[3])])
        q, k, v = (t.cpu().float().requires_grad_() for t in raw[:3])
        want = TF.scaled_dot_product_attention(q, k, v, is_causal=True)
        want.backward(raw[3].cpu().float())
        assert_close_norm(out, want, tol[0], name="out")
        for name, got, w in zip("qkv", grads, (q.grad, k.grad, v.grad)):
            assert got.dtype.name == dtype
            assert_close_norm(got, w, tol[1], name=f"d{name}")


def test_sdpa_fully_masked_rows_give_zero(backend_name, monkeypatch):
    # torch's CPU attention gives 0 (output and gradients) where a query sees no key
    q, k, v = rand(1, 1, 18, 16, seed=1), rand(1, 1, 20, 16, seed=2), rand(1, 1, 20, 16, seed=3)
    mask = rand(18, 20, seed=4) > 0
    mask[3] = False
    mask[17] = False
    dout = rand(1, 1, 18, 16, seed=5)
    out, grads = run_ours(q, k, v, {"attn_mask": mask}, dout)
    want, want_grads = torch_attention(q, k, v, dout, attn_mask=mask)
    assert np.all(out.detach().numpy()[0, 0, [3, 17]] == 0)
    assert_close(out, want, 1e-5, 1e-5, name="out")
    for name, g, w in zip("qkv", grads, want_grads):
        assert_close(g, w, 1e-4, 1e-5, name=f"d{name}")
    # (the additive mask through int64 offsets, the path of masks past 2**31 elements a head)
    from tritonad.kernels import attention as kernels
    from tritonad.kernels.plans import clear_plans

    monkeypatch.setattr(kernels, "MASK_INT32_LIMIT", 0)
    clear_plans()
    additive = ours(torch.where(mask, 0.0, float("-inf")))
    out = F.scaled_dot_product_attention(ours(q), ours(k), ours(v), attn_mask=additive)
    clear_plans()
    assert_close(out, want, 1e-5, 1e-5, name="additive -inf out")


def test_sdpa_mask_gradient():
    # a mask that takes a gradient (a learned bias) gets d(out)/d(mask) = dS, summed over its
    # broadcast dims (the composite's, on every backend)
    q, k, v, _, dout = make_case("plain")
    bias = rand(1, 1, 19, 23, seed=6)
    a, b, c, m = ours(q, True), ours(k, True), ours(v, True), ours(bias, True)
    out = F.scaled_dot_product_attention(a, b, c, attn_mask=m)
    grads = td.grad([out], [a, m], [ours(dout)])
    tq, tb = q.double().requires_grad_(), bias.double().requires_grad_()
    TF.scaled_dot_product_attention(tq, k.double(), v.double(), attn_mask=tb).backward(
        dout.double())
    assert_close(grads[0], tq.grad, 1e-4, 1e-5, name="dq")
    assert_close(grads[1], tb.grad, 1e-4, 1e-5, name="dmask")


def test_sdpa_composite_gradcheck():
    # the oracle's own gradients against float64 central differences (numpy backend)
    with td.use_backend("numpy"):
        q = td.randn(1, 1, 3, 4, dtype=td.float64, requires_grad=True)
        k = td.randn(1, 1, 4, 4, dtype=td.float64, requires_grad=True)
        v = td.randn(1, 1, 4, 2, dtype=td.float64, requires_grad=True)
        bias = td.randn(3, 4, dtype=td.float64, requires_grad=True)
        assert gradcheck(
            lambda *t: F.scaled_dot_product_attention(t[0], t[1], t[2], attn_mask=t[3]),
            (q, k, v, bias))
        assert gradcheck(
            lambda *t: F.scaled_dot_product_attention(*t, is_causal=True), (q, k, v))


def test_sdpa_dropout_is_the_composites_dropout():
    # the fused kernels draw the keep mask that the composite's dropout draws from the same
    # stream (on the numpy backend: the same Philox numbers on every backend)
    q, k, v, kwargs, dout = make_case("causal")
    results = []
    for backend in ("triton", "numpy"):
        with td.use_backend(backend):
            a, b, c = ours(q, True), ours(k, True), ours(v, True)
            td.manual_seed(7)
            out = F.scaled_dot_product_attention(a, b, c, dropout_p=0.3, **kwargs)
            assert out.grad_fn.name == ("FlashAttentionBackward" if backend == "triton" else
                                        "MatmulBackward")
            results.append((out, td.grad([out], [a, b, c], [ours(dout)])))
    (out, grads), (want, want_grads) = results
    assert_close(out, want, 1e-5, 1e-6, name="out")
    for name, g, w in zip("qkv", grads, want_grads):
        assert_close(g, w, 1e-4, 1e-5, name=f"d{name}")


def test_sdpa_dropout_statistics(backend_name):
    # with q = 0 every weight is 1 / S; with v the identity the output is the dropped weights:
    # each 0 or 1 / (S (1 - p)), zero with probability p
    L, S, p = 32, 16, 0.25
    q = td.zeros(1, 2, L, 16)
    v = td.tensor(np.broadcast_to(np.eye(S, dtype=np.float32), (1, 2, S, S)).copy())
    out = F.scaled_dot_product_attention(q, ours(rand(1, 2, S, 16)), v, dropout_p=p).numpy()
    kept = 1.0 / (S * (1 - p))
    assert np.all(np.isclose(out, 0) | np.isclose(out, kept, rtol=1e-5))
    dropped = np.isclose(out, 0).mean()
    assert abs(dropped - p) < 0.05, dropped
    assert np.array_equal(F.scaled_dot_product_attention(q, ours(rand(1, 2, S, 16)), v).numpy(),
                          np.full(out.shape, 1.0 / S, np.float32))


@settings(max_examples=2)
@given(L=st.sampled_from([1, 7, 17]), S=st.sampled_from([1, 16, 21]),
       causal=st.booleans(), seed=st.integers(0, 100))
def test_sdpa_fused_matches_composite(L, S, causal, seed):
    # rows are convex combinations of v's rows: the fused form agrees with the composite at
    # lengths of one and around the block size
    with td.use_backend("triton"):
        q, k, v = rand(1, 1, L, 16, seed=seed), rand(1, 1, S, 16, seed=seed + 1), \
            rand(1, 1, S, 16, seed=seed + 2)
        a, b, c = ours(q), ours(k), ours(v)
        out = F.scaled_dot_product_attention(a, b, c, is_causal=causal)
        assert_close(out, sdpa.composed(a, b, c, is_causal=causal), 1e-5, 1e-5)
        o = out.numpy()
        assert np.all(o <= v.numpy().max(-2, keepdims=True) + 1e-5)
        assert np.all(o >= v.numpy().min(-2, keepdims=True) - 1e-5)


def test_sdpa_under_autocast(backend_name):
    # a LOW op, as PyTorch's: float32 operands (an additive mask too) run in the autocast
    # dtype; the gradient comes back to the float32 leaf
    device_type = "cuda" if backend_name == "triton" and HAS_GPU else "cpu"
    q, k, v, kwargs, dout = make_case("scale_and_small_dims")
    a = ours(q, True)
    with td.autocast(device_type=device_type, dtype=td.bfloat16):
        out = F.scaled_dot_product_attention(a, ours(k), ours(v), attn_mask=ours(rand(5, 3)),
                                             **kwargs)
    assert out.dtype == td.bfloat16
    if backend_name == "triton":
        assert out.grad_fn.name == "FlashAttentionBackward"
    out.float().sum().backward()
    assert a.grad.dtype == td.float32 and a.grad.shape == a.shape


def test_sdpa_errors(backend_name):
    q, k, v = td.randn(1, 2, 3, 4), td.randn(1, 2, 5, 4), td.randn(1, 2, 5, 6)
    with pytest.raises(ValueError, match="scaled_dot_product_attention.*shapes"):
        F.scaled_dot_product_attention(q, td.randn(1, 2, 5, 3), v)
    with pytest.raises(ValueError, match="multiple"):
        F.scaled_dot_product_attention(td.randn(1, 3, 3, 4), k, v, enable_gqa=True)
    with pytest.raises(TypeError, match="attn_mask"):
        F.scaled_dot_product_attention(q, k, v, attn_mask=td.zeros(3, 5, dtype=td.int64))
    with pytest.raises(ValueError, match="is_causal"):
        F.scaled_dot_product_attention(q, k, v, attn_mask=td.zeros(3, 5), is_causal=True)
    with pytest.raises(ValueError, match="dropout_p"):
        F.scaled_dot_product_attention(q, k, v, dropout_p=1.5)
    with pytest.raises(TypeError, match="dtype"):
        F.scaled_dot_product_attention(q, k.to(td.float64), v)
    with pytest.raises(ValueError, match="attn_mask|broadcast"):
        F.scaled_dot_product_attention(q, k, v, attn_mask=td.zeros(4, 5, dtype=td.bool))


# ------------------------------------------------------------------------------ modules


def copy_weights(torch_module, module):
    module.load_state_dict({name: td.tensor(t.detach().numpy())
                            for name, t in torch_module.state_dict().items()})


@pytest.mark.parametrize("backend,batch_first,need_weights,kdim", [
    ("numpy", False, True, None), ("numpy", True, False, None), ("numpy", True, True, 12),
    pytest.param("triton", True, False, None, marks=pytest.mark.gpu)])   # (slow interpreted)
def test_multihead_attention_matches_torch(backend, batch_first, need_weights, kdim):
    with td.use_backend(backend):
        check_multihead_attention(batch_first, need_weights, kdim)


def check_multihead_attention(batch_first, need_weights, kdim):
    E, H, N, L, S = 16, 2, 2, 5, 7
    torch.manual_seed(0)
    tm = torch.nn.MultiheadAttention(E, H, batch_first=batch_first, kdim=kdim, vdim=kdim)
    m = nn.MultiheadAttention(E, H, batch_first=batch_first, kdim=kdim, vdim=kdim)
    assert list(m.state_dict()) == list(tm.state_dict())
    copy_weights(tm, m)
    d = kdim or E
    shape = (lambda n, e: (N, n, e)) if batch_first else (lambda n, e: (n, N, e))
    q, k, v = rand(*shape(L, E), seed=1), rand(*shape(S, d), seed=2), rand(*shape(S, d), seed=3)
    padding = torch.zeros(N, S, dtype=torch.bool)
    padding[0, -2:] = True
    mask = rand(L, S, seed=4) > 0.8
    mask[:, 0] = False
    want, want_w = tm(q, k, v, key_padding_mask=padding, attn_mask=mask,
                      need_weights=need_weights)
    want.backward(rand(*want.shape, seed=5))
    out, w = m(ours(q), ours(k), ours(v), key_padding_mask=ours(padding), attn_mask=ours(mask),
               need_weights=need_weights)
    assert_close(out, want, 1e-5, 1e-5, name="out")
    assert (w is None) == (want_w is None)
    if w is not None:
        assert_close(w, want_w, 1e-5, 1e-6, name="weights")
    out.backward(ours(rand(*want.shape, seed=5)))
    name = "in_proj_weight" if kdim is None else "k_proj_weight"
    assert_close(getattr(m, name).grad, getattr(tm, name).grad, 1e-4, 1e-5, name=f"d{name}")
    assert_close(m.out_proj.weight.grad, tm.out_proj.weight.grad, 1e-4, 1e-5)


def test_multihead_attention_unbatched_and_errors():
    with td.use_backend("numpy"):
        torch.manual_seed(0)
        tm, m = torch.nn.MultiheadAttention(8, 2), nn.MultiheadAttention(8, 2)
        copy_weights(tm, m)
        x = rand(5, 8)
        mask = torch.triu(torch.full((5, 5), float("-inf")), 1)
        want, want_w = tm(x, x, x, attn_mask=mask, average_attn_weights=False)
        out, w = m(ours(x), ours(x), ours(x), attn_mask=ours(mask), average_attn_weights=False)
        assert_close(out, want, 1e-5, 1e-6)
        assert_close(w, want_w, 1e-5, 1e-6)
        with pytest.raises(ValueError, match="divisible"):
            nn.MultiheadAttention(10, 3)
        with pytest.raises(ValueError, match="attn_mask"):
            m(ours(x), ours(x), ours(x), attn_mask=td.zeros(4, 5))
        with pytest.raises(ValueError, match="is_causal"):
            m(ours(x), ours(x), ours(x), is_causal=True)


class _LayerNorm(nn.Module):
    """LayerNorm as a composite, for these tests where nn.LayerNorm is not there."""

    def __init__(self, d, eps=1e-5, bias=True, device=None, dtype=None):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(td.ones(d))
        self.bias = nn.Parameter(td.zeros(d)) if bias else None

    def forward(self, x):
        mean = x.mean(-1, keepdim=True)
        var = ((x - mean) * (x - mean)).mean(-1, keepdim=True)
        y = (x - mean) / (var + self.eps).sqrt() * self.weight
        return y + self.bias if self.bias is not None else y


@pytest.fixture
def layer_norm(monkeypatch):
    """nn.LayerNorm where tritonad has it, else the composite above in its place."""
    if importlib.util.find_spec("tritonad.nn.normalization") is None:
        module = types.ModuleType("tritonad.nn.normalization")
        module.LayerNorm = _LayerNorm
        monkeypatch.setitem(sys.modules, "tritonad.nn.normalization", module)


@pytest.mark.parametrize("norm_first,activation", [(False, "relu"), (True, "gelu")])
def test_transformer_encoder_matches_torch(layer_norm, norm_first, activation):
    # (numpy backend: under the interpreter the encoder's many small kernels take ~20 s; the
    # attention in it is tested on both above)
    d, nhead, T, N = 16, 2, 6, 2
    torch.manual_seed(0)
    tl_ = torch.nn.TransformerEncoderLayer(d, nhead, 32, dropout=0.0, activation=activation,
                                           batch_first=True, norm_first=norm_first)
    tenc = torch.nn.TransformerEncoder(tl_, 2, enable_nested_tensor=False)
    layer = nn.TransformerEncoderLayer(d, nhead, 32, dropout=0.0, activation=activation,
                                       batch_first=True, norm_first=norm_first)
    enc = nn.TransformerEncoder(layer, 2)
    assert list(enc.state_dict()) == list(tenc.state_dict())
    copy_weights(tenc, enc)
    x = rand(N, T, d, seed=1)
    mask = torch.nn.Transformer.generate_square_subsequent_mask(T)
    want = tenc(x, mask=mask, is_causal=True)
    want.backward(rand(N, T, d, seed=2))
    xs = ours(x)
    out = enc(xs, mask=ours(mask), is_causal=True)
    out.backward(ours(rand(N, T, d, seed=2)))
    assert_close(out, want, 1e-4, 1e-5, name="out")
    for name, p in tenc.named_parameters():
        if "in_proj_weight" in name or "linear1.weight" in name:
            assert_close(dict(enc.named_parameters())[name].grad, p.grad, 1e-3, 1e-4, name=name)


def test_transformer_encoder_trains(layer_norm):
    # a causal encoder layer with dropout learns a per-token regression (numpy backend)
    from tritonad import optim
    from tritonad.nn.transformer import generate_square_subsequent_mask

    with td.use_backend("numpy"):
        layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.1, activation="gelu",
                                           batch_first=True, norm_first=True)
        model = nn.Sequential(nn.TransformerEncoder(layer, 1), nn.Linear(16, 1))
        encoder, head = model[0], model[1]
        opt = optim.AdamW(model.parameters(), lr=1e-2)
        x = td.randn(8, 6, 16)
        y = x[:, :, :4].sum(-1, keepdim=True)
        mask = generate_square_subsequent_mask(6)
        losses = []
        for _ in range(12):
            opt.zero_grad()
            loss = F.mse_loss(head(encoder(x, mask=mask, is_causal=True)), y)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        assert losses[-1] < 0.5 * losses[0], losses


# ------------------------------------------------------------------------------- GPU


def assert_close_norm(actual, expected, tol, name="value"):
    """max |actual - expected| <= tol * max |expected|: the error measure of low-precision
    attention (elementwise tolerances fail on values near 0)."""
    a = actual.detach().float().numpy() if isinstance(actual, td.Tensor) else \
        actual.detach().float().cpu().numpy()
    e = expected.detach().float().numpy() if isinstance(expected, td.Tensor) else \
        expected.detach().float().cpu().numpy()
    assert a.shape == e.shape, f"{name}: shape {a.shape} != {e.shape}"
    err, scale = float(np.abs(a - e).max()), float(np.abs(e).max())
    assert np.isfinite(a).all() and err <= tol * scale, f"{name}: max error {err} > {tol} * {scale}"


GPU_TOL = {"bfloat16": (2e-2, 5e-2), "float16": (5e-3, 2e-2), "float32": (5e-3, 2e-2)}


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,D,causal", [("bfloat16", 64, False), ("bfloat16", 64, True),
                                            ("bfloat16", 128, True), ("bfloat16", 128, False),
                                            ("bfloat16", 96, True), ("float16", 128, False),
                                            ("float32", 64, True), ("float32", 128, False)])
def test_flash_attention_gpu(dtype, D, causal):
    # against torch's CUDA attention in float32 (float32 inputs run our dots as TF32)
    with td.use_backend("triton"):
        g = torch.Generator(device="cuda").manual_seed(0)
        raw = [torch.randn(2, 4, 1024, D, device="cuda", generator=g).to(getattr(torch, dtype))
               for _ in range(4)]
        a, b, c = (td.from_torch(t).requires_grad_() for t in raw[:3])
        out = F.scaled_dot_product_attention(a, b, c, is_causal=causal)
        assert out.grad_fn.name == "FlashAttentionBackward"
        assert out.dtype.name == dtype
        grads = td.grad([out], [a, b, c], [td.from_torch(raw[3])])
        q, k, v = (t.float().requires_grad_() for t in raw[:3])
        want = TF.scaled_dot_product_attention(q, k, v, is_causal=causal)
        want.backward(raw[3].float())
        tol_out, tol_grad = GPU_TOL[dtype]
        assert_close_norm(out, want, tol_out, name="out")
        for name, got, w in zip("qkv", grads, (q.grad, k.grad, v.grad)):
            assert_close_norm(got, w, tol_grad, name=f"d{name}")


@pytest.mark.gpu
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_flash_attention_gpu_tiles_odd_lengths(D, causal):
    # the GPU tile menu (kernels/attention.py _blocks) at lengths off every tile: a partial
    # last query block and key block in each kernel, and L != S where not causal
    L, S = (1037, 1037) if causal else (1037, 517)
    with td.use_backend("triton"):
        g = torch.Generator(device="cuda").manual_seed(1)
        raw = [torch.randn(2, 3, n, D, device="cuda", generator=g).to(torch.bfloat16)
               for n in (L, S, S, L)]
        a, b, c = (td.from_torch(t).requires_grad_() for t in raw[:3])
        out = F.scaled_dot_product_attention(a, b, c, is_causal=causal)
        assert out.grad_fn.name == "FlashAttentionBackward"
        grads = td.grad([out], [a, b, c], [td.from_torch(raw[3])])
        q, k, v = (t.float().requires_grad_() for t in raw[:3])
        want = TF.scaled_dot_product_attention(q, k, v, is_causal=causal)
        want.backward(raw[3].float())
        assert_close_norm(out, want, 2e-2, name="out")
        for name, got, w in zip("qkv", grads, (q.grad, k.grad, v.grad)):
            assert_close_norm(got, w, 5e-2, name=f"d{name}")


@pytest.mark.gpu
@pytest.mark.parametrize("D", [64, 128])   # (dropout has tiles of its own at each)
def test_flash_attention_gpu_gqa_mask_dropout(D):
    # grouped heads, a key length off the tiles, a broadcast bool mask, dropout with causal:
    # against the composite in float32 on the same random stream
    with td.use_backend("triton"):
        q = td.randn(2, 8, 1024, D, device="cuda").to(td.bfloat16).requires_grad_()
        k = td.randn(2, 2, 1000, D, device="cuda").to(td.bfloat16).requires_grad_()
        v = td.randn(2, 2, 1000, D, device="cuda").to(td.bfloat16).requires_grad_()
        mask = td.rand(1024, 1000, device="cuda") > 0.1
        dout = td.randn(2, 8, 1024, D, device="cuda").to(td.bfloat16)
        wide = [t.detach().to(td.float32).requires_grad_() for t in (q, k, v)]
        for kwargs in ({"attn_mask": mask}, {"dropout_p": 0.2, "is_causal": True}):
            td.manual_seed(3)
            out = F.scaled_dot_product_attention(q, k, v, enable_gqa=True, **kwargs)
            assert out.grad_fn.name == "FlashAttentionBackward"
            grads = td.grad([out], [q, k, v], [dout])
            td.manual_seed(3)
            want = sdpa.composed(*wide, enable_gqa=True, **kwargs)
            want_grads = td.grad([want], wide, [dout.to(td.float32)])
            assert_close_norm(out, want, 2e-2, name="out")
            for name, g, w in zip("qkv", grads, want_grads):
                assert_close_norm(g, w, 5e-2, name=f"d{name}")


@pytest.mark.gpu
def test_flash_attention_gpu_memory():
    # no L x S buffer: a causal forward and backward at T = 8192 allocates a few q-sized
    # arrays (O, dQ, dK, dV), where one [B, H, T, T] bfloat16 matrix would be 128 of them
    with td.use_backend("triton"):
        B, H, T, D = 1, 16, 8192, 64
        q, k, v = (td.randn(B, H, T, D, device="cuda").to(td.bfloat16).requires_grad_()
                   for _ in range(3))
        dout = td.randn(B, H, T, D, device="cuda").to(td.bfloat16)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        td.grad([out], [q, k, v], [dout])
        del out
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        td.grad([out], [q, k, v], [dout])
        torch.cuda.synchronize()
        assert torch.cuda.max_memory_allocated() - base < 8 * B * H * T * D * 2
