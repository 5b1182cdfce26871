"""Autodiff: every op's gradient, higher order, graph structure, backward semantics, errors.

Gradients are checked two ways:
- on the numpy backend with float64 central differences (tritonad.autodiff.gradcheck) under a
  random cotangent: this checks the numpy reference and the autodiff rules together;
- on the triton backend against the numpy backend (tests/helpers.check_op), so every kernel's
  forward and backward are compared with the checked reference.
The structural tests (re-use, long chains, backward twice, broadcasting, errors) run on both.
"""
import numpy as np
import pytest

import tritonad as td
import tritonad.nn.functional as F
from helpers import assert_close, check_op
from tritonad.autodiff import gradcheck, gradgradcheck

RNG = np.random.default_rng(0)


def arr(*shape, low=-2.0, high=2.0):
    return RNG.uniform(low, high, size=shape)


def positive(*shape):
    return RNG.uniform(0.5, 2.0, size=shape)


def no_ties(*shape):
    """Distinct values (so max/min and relu have unambiguous gradients)."""
    n = int(np.prod(shape)) if shape else 1
    v = RNG.permutation(n).astype(np.float64) - n / 2 + 0.25
    return (v / max(n, 1)).reshape(shape)


labels = np.array([2, 0, 3, 1, 3])

# name -> (function of tensors, input arrays)
CASES = {
    "add_broadcast": (lambda a, b: a + b, [arr(3, 4), arr(4)]),
    "sub_scalar": (lambda a: 2.5 - a, [arr(3, 4)]),
    "mul_broadcast": (lambda a, b: a * b, [arr(2, 1, 4), arr(3, 1)]),
    "div": (lambda a, b: a / b, [arr(3, 4), positive(3, 4)]),
    "rdiv_scalar": (lambda a: 1.0 / a, [positive(5)]),
    "pow_tensor": (lambda a, b: a ** b, [positive(3, 4), arr(3, 4)]),
    "pow_scalar": (lambda a: a ** 3, [arr(3, 4)]),
    "pow_half": (lambda a: a ** 0.5, [positive(6)]),
    "rpow": (lambda a: 2.0 ** a, [arr(4)]),
    "neg": (lambda a: -a, [arr(3)]),
    "exp": (lambda a: a.exp(), [arr(3, 4)]),
    "log": (lambda a: a.log(), [positive(3, 4)]),
    "sqrt": (lambda a: a.sqrt(), [positive(3, 4)]),
    "abs": (lambda a: a.abs(), [no_ties(3, 4)]),
    "relu": (lambda a: a.relu(), [no_ties(3, 4)]),
    "sigmoid": (lambda a: a.sigmoid(), [arr(3, 4)]),
    "tanh": (lambda a: a.tanh(), [arr(3, 4)]),
    "clamp": (lambda a: a.clamp(-0.5, 0.7), [no_ties(4, 5)]),
    "maximum": (lambda a, b: a.maximum(b), [arr(3, 4), arr(4)]),
    "minimum": (lambda a, b: td.minimum(a, b), [arr(3, 4), arr(3, 4)]),
    "where": (lambda a, b: td.where(a > 0, a, b), [no_ties(3, 4), arr(3, 4)]),
    "sum_all": (lambda a: a.sum(), [arr(3, 4)]),
    "sum_dims": (lambda a: a.sum((0, 2), keepdim=True), [arr(2, 3, 4)]),
    "mean_dim": (lambda a: a.mean(1), [arr(3, 4)]),
    "max_all": (lambda a: a.max(), [no_ties(3, 4)]),
    "max_dim": (lambda a: a.max(1).values, [no_ties(3, 4)]),
    "min_dim_keep": (lambda a: a.min(0, keepdim=True)[0], [no_ties(3, 4)]),
    "amax": (lambda a: a.amax((0, 1)), [no_ties(3, 4, 2)]),
    "var": (lambda a: a.var(1), [arr(3, 5)]),
    "var_all_biased": (lambda a: a.var(correction=0), [arr(4, 3)]),
    "reshape_T": (lambda a: a.reshape(4, 3).T * 1.5, [arr(3, 4)]),
    "permute": (lambda a: a.permute(2, 0, 1) * a.permute(2, 0, 1), [arr(2, 3, 4)]),
    "expand": (lambda a: a.expand(3, 4) * 2.0, [arr(1, 4)]),
    "getitem": (lambda a: a[1:, ::2] * 3.0, [arr(3, 5)]),
    "gather_rows": (lambda a: a[td.tensor([2, 0, 2, 1])], [arr(3, 4)]),
    "unsqueeze_squeeze": (lambda a: a.unsqueeze(1).squeeze(1) * a, [arr(3, 4)]),
    "matmul": (lambda a, b: a @ b, [arr(3, 4), arr(4, 5)]),
    "matmul_batch_broadcast": (lambda a, b: a @ b, [arr(2, 3, 4), arr(4, 2)]),
    "matmul_vec": (lambda a, b: a @ b, [arr(4), arr(4, 3)]),
    "linear": (lambda x, w, b: F.linear(x, w, b), [arr(5, 4), arr(3, 4), arr(3)]),
    "linear_relu": (lambda x, w, b: F.linear(x, w, b, activation="relu"),
                    [arr(5, 4), arr(3, 4), arr(3)]),
    "softmax": (lambda a: a.softmax(1), [arr(3, 5)]),
    "softmax_dim0": (lambda a: a.softmax(0), [arr(3, 5)]),
    "log_softmax": (lambda a: a.log_softmax(-1), [arr(3, 5)]),
    "cross_entropy": (lambda a: F.cross_entropy(a, td.tensor(labels)), [arr(5, 4)]),
    "cross_entropy_sum_smooth": (lambda a: F.cross_entropy(a, td.tensor(labels), reduction="sum",
                                                           label_smoothing=0.1), [arr(5, 4)]),
    "cross_entropy_none_ignore": (
        lambda a: F.cross_entropy(a, td.tensor([2, -100, 3, 1, -100]), reduction="none"),
        [arr(5, 4)]),
    "nll_loss": (lambda a: F.nll_loss(a.log_softmax(1), td.tensor(labels)), [arr(5, 4)]),
    "mse_loss": (lambda a, b: F.mse_loss(a, b), [arr(3, 4), arr(3, 4)]),
    "conv2d": (lambda x, w, b: F.conv2d(x, w, b, stride=2, padding=1),
               [arr(2, 3, 5, 5), arr(4, 3, 3, 3), arr(4)]),
    "conv2d_relu": (lambda x, w, b: F.conv2d(x, w, b, padding=1, activation="relu"),
                    [arr(2, 3, 5, 4), arr(4, 3, 3, 3), arr(4)]),
    "conv2d_dilated": (lambda x, w: F.conv2d(x, w, dilation=2, padding=2),
                       [arr(1, 2, 5, 4), arr(3, 2, 2, 3)]),
    "conv2d_groups": (lambda x, w: F.conv2d(x, w, groups=2), [arr(1, 4, 4, 4), arr(2, 2, 3, 3)]),
    "max_pool2d": (lambda x: F.max_pool2d(x, 2), [no_ties(2, 2, 4, 6)]),
    "max_pool2d_overlap": (lambda x: F.max_pool2d(x, 3, stride=1, padding=1), [no_ties(1, 2, 4, 4)]),
    "avg_pool2d": (lambda x: F.avg_pool2d(x, 3, stride=2, padding=1, count_include_pad=False),
                   [arr(1, 2, 5, 5)]),
    "avg_pool2d_ceil": (lambda x: F.avg_pool2d(x, 2, ceil_mode=True), [arr(1, 1, 5, 5)]),
    "unfold_fold": (lambda x: F.fold(F.unfold(x, 2, padding=1), (3, 4), 2, padding=1),
                    [arr(1, 2, 3, 4)]),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_gradient_matches_finite_differences(name):
    fn, inputs = CASES[name]
    with td.use_backend("numpy"):
        tensors = [td.tensor(a, dtype=td.float64, requires_grad=True) for a in inputs]
        assert gradcheck(fn, tensors, eps=1e-6, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("name", sorted(CASES))
def test_triton_backend_matches_reference(name):
    fn, inputs = CASES[name]
    with td.use_backend("triton"):
        check_op(fn, *inputs, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", ["mul_broadcast", "div", "exp", "log", "tanh", "sigmoid", "relu",
                                  "softmax", "log_softmax", "matmul", "linear_relu", "var",
                                  "pow_tensor", "sqrt", "where", "max_all", "getitem",
                                  "gather_rows", "mse_loss"])
def test_second_derivatives_match_finite_differences(name):
    fn, inputs = CASES[name]
    with td.use_backend("numpy"):
        tensors = [td.tensor(a, dtype=td.float64, requires_grad=True) for a in inputs]
        assert gradgradcheck(fn, tensors, eps=1e-6, atol=1e-5, rtol=1e-4)


def test_dropout_gradient_uses_the_same_mask(backend_name):
    x = td.ones(200, requires_grad=True)
    y = F.dropout(x, p=0.25)
    y.backward(td.ones(200))
    kept = y.numpy() != 0
    np.testing.assert_allclose(y.numpy()[kept], 1 / 0.75, rtol=1e-6)
    np.testing.assert_allclose(x.grad.numpy(), kept / 0.75, rtol=1e-6)
    assert 100 < kept.sum() < 190
    assert F.dropout(x, 0.5, training=False) is x


def test_third_derivative_of_cube(backend_name):
    x = td.tensor([-1.5, 0.5, 2.0], requires_grad=True)
    (g,) = td.grad((x ** 3).sum(), x, create_graph=True)
    (gg,) = td.grad(g.sum(), x, create_graph=True)
    (ggg,) = td.grad(gg.sum(), x)
    assert_close(g, 3 * x.numpy() ** 2, 1e-6, 1e-6)
    assert_close(gg, 6 * x.numpy(), 1e-6, 1e-6)
    assert_close(ggg, [6.0, 6.0, 6.0], 1e-6, 1e-6)


def test_node_reused_many_times(backend_name):
    x = td.tensor([0.5, -1.0], requires_grad=True)
    y = x * 1.0
    total = y
    for _ in range(49):
        total = total + y
    total.sum().backward()
    assert_close(x.grad, [50.0, 50.0], 1e-6, 1e-6)


def test_chain_of_ten_thousand_ops_has_no_recursion_limit():
    with td.use_backend("numpy"):
        x = td.tensor([1.0], dtype=td.float64, requires_grad=True)
        y = x
        for _ in range(10_000):
            y = y * 1.0001
        y.sum().backward()
        assert_close(x.grad, [1.0001 ** 10_000], 1e-9, 0)


def test_backward_twice_needs_retain_graph(backend_name):
    x = td.tensor([1.0, 2.0], requires_grad=True)
    y = (x * x).sum()
    y.backward(retain_graph=True)
    y.backward()
    assert_close(x.grad, [4.0, 8.0], 1e-6, 1e-6)  # gradients accumulate, as in torch
    with pytest.raises(RuntimeError, match="second time"):
        y.backward()


def test_leaf_grads_accumulate_and_are_never_shared(backend_name):
    a = td.tensor([1.0, 2.0], requires_grad=True)
    b = td.tensor([3.0, 4.0], requires_grad=True)
    (a + b).sum().backward()
    a.grad.mul_(10.0)
    assert b.grad.tolist() == [1.0, 1.0]
    (a * 2).sum().backward()
    assert a.grad.tolist() == [12.0, 12.0]


def test_broadcast_gradients_have_input_shapes(backend_name):
    a = td.ones(4, 1, 3, requires_grad=True)
    b = td.ones(5, 1, requires_grad=True)
    c = td.tensor(2.0, requires_grad=True)
    (a * b * c).sum().backward()
    assert a.grad.shape == (4, 1, 3) and b.grad.shape == (5, 1) and c.grad.shape == ()
    assert a.grad.numpy().max() == 10.0 and b.grad.numpy().max() == 24.0
    assert c.grad.item() == 60.0


def test_mixed_precision_gradient_keeps_input_dtype(backend_name):
    a = td.ones(3, dtype=td.float16, requires_grad=True)
    b = td.ones(3, requires_grad=True)
    y = a * b
    assert y.dtype is td.float32
    y.sum().backward()
    assert a.grad.dtype is td.float16 and b.grad.dtype is td.float32


def test_no_grad_and_enable_grad(backend_name):
    x = td.ones(2, requires_grad=True)
    with td.no_grad():
        y = x * 2
        with td.enable_grad():
            z = x * 2
    assert not y.requires_grad and y.grad_fn is None and z.requires_grad

    @td.no_grad()
    def f(t):
        return t * 3

    assert not f(x).requires_grad
    assert td.is_grad_enabled()


def test_detach_and_retain_grad(backend_name):
    x = td.tensor([1.0, 2.0], requires_grad=True)
    h = x * 3
    h.retain_grad()
    (h.detach() * h).sum().backward()
    assert_close(x.grad, 3 * h.numpy(), 1e-6, 1e-6)
    assert_close(h.grad, h.numpy(), 1e-6, 1e-6)


def test_grad_returns_without_touching_dot_grad(backend_name):
    x = td.tensor([1.0, 2.0], requires_grad=True)
    w = td.tensor([3.0, 4.0], requires_grad=True)
    y = (x * w).sum()
    gx, gw = td.grad(y, [x, w])
    assert gx.tolist() == [3.0, 4.0] and gw.tolist() == [1.0, 2.0] and x.grad is None
    u = td.tensor([1.0, -1.0])
    (gx,) = td.grad(x * w, x, grad_outputs=u)
    assert gx.tolist() == [3.0, -4.0]
    with pytest.raises(RuntimeError, match="not used"):
        td.grad((x * 2).sum(), [x, td.ones(1, requires_grad=True)])


def test_once_differentiable_ops_refuse_second_order(backend_name):
    x = td.tensor(arr(2, 4), requires_grad=True)
    (g,) = td.grad(F.cross_entropy(x, td.tensor([1, 3])), x, create_graph=True)
    with pytest.raises(RuntimeError, match="once-differentiable"):
        g.sum().backward()


def test_inplace_change_of_a_saved_tensor_is_detected(backend_name):
    x = td.tensor([1.0, 2.0], requires_grad=True)
    y = x * 1.0
    z = y * y
    with td.no_grad():
        y.add_(1.0)
    with pytest.raises(RuntimeError, match="modified by an in-place operation"):
        z.sum().backward()



# Views share their base's version counter: an in-place change made through any view of memory
# that autodiff saved is caught (as in PyTorch), never turned into a silently wrong gradient.
VIEW_CHANGES = {
    "slice": lambda a: a[0:2].mul_(10),
    "int index": lambda a: a[1].mul_(10),
    "view": lambda a: a.view(3, 1).mul_(10),
    "reshape": lambda a: a.reshape(1, 3).add_(1.0),
    "transpose": lambda a: a.reshape(3, 1).transpose(0, 1).fill_(2.0),
    "expand of a view": lambda a: a[:1].expand(1).copy_(td.tensor([5.0])),
    "detach": lambda a: a.detach().mul_(10),
    ".data": lambda a: a.data.zero_(),
    "view of a view": lambda a: a.reshape(3, 1)[1:].squeeze(1).sub_(1.0),
    "setitem on a view": lambda a: a[1:].__setitem__(0, 7.0),
}


@pytest.mark.parametrize("change", list(VIEW_CHANGES))
def test_inplace_change_through_a_view_of_a_saved_tensor_is_detected(backend_name, change):
    a = td.tensor([1.0, 2.0, 3.0])
    w = td.tensor([1.0, 1.0, 1.0], requires_grad=True)
    z = (a * w).sum()  # saves a: d z / d w = a
    VIEW_CHANGES[change](a)
    with pytest.raises(RuntimeError, match="modified by an in-place operation"):
        z.backward()
    assert w.grad is None


def test_inplace_change_of_the_base_of_a_saved_view_is_detected(backend_name):
    base = td.tensor([[1.0, 2.0], [3.0, 4.0]])
    w = td.tensor([1.0, 1.0], requires_grad=True)
    z = (base[0] * w).sum()  # saves the view base[0]
    base.mul_(2.0)
    with pytest.raises(RuntimeError, match="modified by an in-place operation"):
        z.backward()


def test_inplace_change_of_unrelated_memory_is_not_an_error(backend_name):
    a = td.tensor([1.0, 2.0, 3.0])
    w = td.tensor([1.0, 1.0, 1.0], requires_grad=True)
    z = (a * w).sum()
    a.clone().mul_(10)           # a copy, not a view
    td.tensor([1.0]).mul_(2.0)
    z.backward()
    assert_close(w.grad.numpy(), np.array([1.0, 2.0, 3.0]))


def test_a_filled_constant_is_forgotten_when_a_view_changes_it(backend_name):
    # cross-entropy's backward skips the multiply when the incoming gradient is the constant 1;
    # a seed changed through a view must not be taken for 1
    logits = td.tensor([[1.0, 2.0, 0.5]], requires_grad=True)
    loss = F.cross_entropy(logits, td.tensor([1]))
    seed = td.ones(())
    seed.reshape(1).mul_(3.0)
    loss.backward(seed)
    p = np.exp([1.0, 2.0, 0.5]) / np.exp([1.0, 2.0, 0.5]).sum()
    assert_close(logits.grad.numpy(), 3.0 * (p - np.array([0, 1, 0]))[None], rtol=1e-5)


def test_the_implicit_seed_is_the_constant_one(backend_name, monkeypatch):
    # backward() with no gradient seeds with 1, known as a constant: cross-entropy's backward
    # hands its saved gradient on without the multiply (one kernel less in a training step)
    logits = td.tensor([[1.0, 2.0, 0.5], [0.0, -1.0, 3.0]], requires_grad=True)
    loss = F.cross_entropy(logits, td.tensor([1, 2]))
    products = []
    real = td.Tensor.__mul__
    monkeypatch.setattr(td.Tensor, "__mul__", lambda a, b: products.append(b) or real(a, b))
    loss.backward()
    assert products == []
    e = np.exp([[1.0, 2.0, 0.5], [0.0, -1.0, 3.0]])
    p = e / e.sum(axis=1, keepdims=True)
    assert_close(logits.grad.numpy(), (p - np.array([[0, 1, 0], [0, 0, 1]])) / 2, rtol=1e-5)


def _fills(monkeypatch):
    """The values the backend fills arrays with from now on (full and fill_)."""
    backend, values = td.get_backend(), []
    real = backend.fill_
    monkeypatch.setattr(backend, "fill_", lambda x, v: values.append(v) or real(x, v))
    return values


def test_the_seed_of_cross_entropy_is_not_filled(backend_name, monkeypatch):
    # cross-entropy's backward never reads a seed of ones, so backward() does not fill one: a
    # training step launches one kernel less
    logits = td.tensor([[1.0, 2.0, 0.5], [0.0, -1.0, 3.0]], requires_grad=True)
    loss = F.cross_entropy(logits, td.tensor([1, 2]))
    fills = _fills(monkeypatch)
    loss.backward()
    assert fills == []
    e = np.exp([[1.0, 2.0, 0.5], [0.0, -1.0, 3.0]])
    p = e / e.sum(axis=1, keepdims=True)
    assert_close(logits.grad.numpy(), (p - np.array([[0, 1, 0], [0, 0, 1]])) / 2, rtol=1e-5)


def test_an_unfilled_seed_is_not_read_without_reduction(backend_name, monkeypatch):
    # a batch of one without reduction is a one-element loss: backward() seeds it implicitly,
    # and cross-entropy's backward must not multiply by the unfilled seed
    logits = td.tensor([[1.0, 2.0, 0.5]], requires_grad=True)
    loss = F.cross_entropy(logits, td.tensor([1]), reduction="none")
    fills = _fills(monkeypatch)
    loss.backward()
    assert fills == []
    p = np.exp([1.0, 2.0, 0.5]) / np.exp([1.0, 2.0, 0.5]).sum()
    assert_close(logits.grad.numpy(), (p - np.array([0, 1, 0]))[None], rtol=1e-5)


@pytest.mark.parametrize("seen_by", ["retain_grad", "inputs", "create_graph", "reduction none"])
def test_a_seed_that_someone_sees_is_filled(backend_name, monkeypatch, seen_by):
    # the root kept by retain_grad(), asked for in `inputs`, a graph of the backward, and a
    # backward that reads its gradient (cross-entropy without reduction, batch of one) each see
    # the seed: it holds ones there
    logits = td.tensor([[1.0, 2.0, 0.5]], requires_grad=True)
    reduction = "none" if seen_by == "reduction none" else "mean"
    loss = F.cross_entropy(logits, td.tensor([1]), reduction=reduction)
    if seen_by == "reduction none":
        loss = loss.sum()  # (sum's backward reads the seed)
    fills = _fills(monkeypatch)
    if seen_by == "retain_grad":
        loss.retain_grad()
        loss.backward()
        assert loss.grad.item() == 1.0
    elif seen_by == "inputs":
        loss.backward(inputs=[loss, logits])
        assert loss.grad.item() == 1.0
    else:
        loss.backward(create_graph=seen_by == "create_graph")
    assert fills == [1.0]
    p = np.exp([1.0, 2.0, 0.5]) / np.exp([1.0, 2.0, 0.5]).sum()
    assert_close(logits.grad.numpy(), (p - np.array([0, 1, 0]))[None], rtol=1e-5)


# ------------------------------------------------------------------------ bad input, clear errors


def test_error_broadcast_incompatible(backend_name):
    with pytest.raises(ValueError, match=r"add: shapes \(3, 4\) and \(3,\) cannot be broadcast"):
        td.ones(3, 4) + td.ones(3)


def test_error_matmul_inner_mismatch(backend_name):
    with pytest.raises(ValueError, match=r"matmul: inner dimensions differ: \(2, 3\) @ \(4, 5\)"):
        td.ones(2, 3) @ td.ones(4, 5)
    with pytest.raises(TypeError, match="dtypes differ"):
        td.ones(2, 2) @ td.ones(2, 2, dtype=td.float16)


def test_error_backward_non_scalar(backend_name):
    y = td.ones(2, 3, requires_grad=True) * 2
    with pytest.raises(RuntimeError, match=r"scalar output.*shape \(2, 3\)"):
        y.backward()


def test_error_backward_without_grad(backend_name):
    with pytest.raises(RuntimeError, match="does not require grad"):
        td.ones(2).sum().backward()


def test_error_requires_grad_on_integer(backend_name):
    with pytest.raises(RuntimeError, match="only floating point tensors can require gradients"):
        td.arange(3).requires_grad_()


def test_error_unknown_backend():
    with pytest.raises(ValueError, match=r"unknown backend 'cupy'; available: \['numpy', 'triton'\]"):
        td.set_backend("cupy")


def test_error_view_needs_copy(backend_name):
    with pytest.raises(RuntimeError, match=r"view: a tensor of shape \(3, 2\)"):
        td.ones(2, 3).T.view(6)


def test_error_different_devices():
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a GPU for a second device")
    with pytest.raises(RuntimeError, match="one device"):
        td.ones(2, device="cpu") + td.ones(2, device="cuda")


def test_error_inplace_on_leaf_requiring_grad(backend_name):
    x = td.ones(2, requires_grad=True)
    with pytest.raises(RuntimeError, match="in-place update of a leaf tensor"):
        x.add_(1.0)
    with td.no_grad():
        x.add_(1.0)
    assert x.tolist() == [2.0, 2.0]


def test_error_cross_entropy_target_out_of_range(backend_name):
    with pytest.raises(ValueError, match=r"cross_entropy: target 7 is outside \[0, 4\)"):
        F.cross_entropy(td.ones(2, 4), td.tensor([1, 7])).item()  # at the op or at the read
    with pytest.raises(TypeError, match="int64"):
        F.cross_entropy(td.ones(2, 4), td.tensor([1.0, 2.0]))


def test_error_conv_shapes(backend_name):
    with pytest.raises(ValueError, match="larger than the padded input"):
        F.conv2d(td.ones(1, 1, 3, 3), td.ones(1, 1, 5, 5))
    with pytest.raises(ValueError, match="stride must be >= 1"):
        F.conv2d(td.ones(1, 1, 3, 3), td.ones(1, 1, 1, 1), stride=0)
    with pytest.raises(ValueError, match="does not match weight"):
        F.conv2d(td.ones(1, 2, 3, 3), td.ones(1, 3, 1, 1))


def test_weight_gradients_run_beside_the_pass_where_they_land_in_buffers(backend_name,
                                                                          monkeypatch):
    """In a side region (on a GPU: while a CUDA graph is captured), the weight and bias
    gradients that go straight into an optimizer's buffers, of a layer whose input gradient
    continues the pass, are written inside Backend.beside, given every array they read; the
    input gradients, a first layer's weight gradient (no input gradient) and a weight used
    twice stay in order; the region closes before the leaves' gradients are read. Here a
    recording stand-in for the second stream: the gradients must be those of a pass without."""
    from tritonad import nn, optim
    from tritonad.autodiff import function

    events, side_open = [], [False]
    x_values = arr(2, 2, 10, 10)

    class Beside:
        def __init__(self, reads):
            self.reads = reads

        def __enter__(self):
            events.append(("beside", tuple(tuple(r.shape) for r in self.reads if r is not None)))

        def __exit__(self, *exc):
            events.append("back")

    class Region:
        def __enter__(self):
            side_open[0] = True

        def __exit__(self, *exc):
            side_open[0] = False
            events.append("join")

    def run(region, input_grad):
        td.manual_seed(0)
        model = nn.Sequential(nn.Conv2d(2, 3, 3, padding=1), nn.ReLU(),        # relu's gate
                              nn.Conv2d(3, 4, 3), nn.ReLU(), nn.MaxPool2d(2),  # fused with pool
                              nn.Flatten(), nn.Linear(64, 6), nn.ReLU(), nn.Linear(6, 5))
        optim.SGD(model.parameters(), lr=0.1)
        shared = nn.Linear(5, 5)  # used twice: its gradient is a sum, made in order
        x = td.tensor(x_values, dtype=td.float32, requires_grad=input_grad)
        with monkeypatch.context() as m:
            if region:
                m.setattr(function, "side_region", Region)
                m.setattr(type(td.get_backend()), "beside",
                          lambda self, *reads: Beside(reads) if side_open[0] else None)
            shared(shared(model(x))).sum().backward()
        for p in model.parameters():
            assert p.grad._data is p._grad_buffer
        return [p.grad.numpy() for p in model.parameters()] + \
            [shared.weight.grad.numpy(), shared.bias.grad.numpy()] + \
            ([x.grad.numpy()] if input_grad else [])

    # backward order: linear 2 (dy, x), linear 1 (dy, x, relu's gate), the fused conv-pool
    # (its gated dy, x), the first conv (dy after relu's gate, x; only when x needs a
    # gradient); then the join
    layers = [("beside", ((2, 5), (2, 6))), "back", ("beside", ((2, 6), (2, 64), (2, 6))),
              "back", ("beside", ((2, 4, 8, 8), (2, 3, 10, 10))), "back"]
    first = [("beside", ((2, 3, 10, 10), (2, 2, 10, 10))), "back"]
    for input_grad, expected in ((True, layers + first + ["join"]), (False, layers + ["join"])):
        want = run(False, input_grad)
        assert events == []
        got = run(True, input_grad)
        for g, w in zip(got, want):
            assert_close(g, w, 1e-5, 1e-6)
        assert events == expected
        events.clear()


def test_gradients_land_in_optimizer_buffers_without_copies(backend_name):
    """With an optimizer's flat gradient buffer, a Linear layer's backward writes dW and db
    straight into it; a weight used twice still gets the sum of both uses."""
    from tritonad import nn, optim

    layer = nn.Linear(4, 3)
    optim.SGD(layer.parameters(), lr=0.1)
    x = td.tensor(arr(5, 4), dtype=td.float32)
    layer(x).sum().backward()
    assert layer.weight.grad._data is layer.weight._grad_buffer
    assert layer.bias.grad._data is layer.bias._grad_buffer
    assert_close(layer.weight.grad, np.ones((5, 3)).T @ x.numpy(), 1e-5, 1e-6)

    shared = nn.Linear(4, 4)
    optim.SGD(shared.parameters(), lr=0.1)
    y = shared(shared(x))
    y.sum().backward()
    with td.no_grad(), td.use_backend("numpy"):
        w, b = shared.weight.numpy(), shared.bias.numpy()
    h = x.numpy() @ w.T + b
    g_h = np.ones((5, 4)) @ w
    expected = np.ones((5, 4)).T @ h + g_h.T @ x.numpy()
    assert_close(shared.weight.grad, expected, 1e-4, 1e-5)


def _torch_and_ours(fn, *arrays):
    """fn's value and input gradients (under a ones seed) in tritonad and in torch."""
    import torch

    ours = [td.tensor(a, requires_grad=True) for a in arrays]
    theirs = [torch.tensor(a, requires_grad=True) for a in arrays]
    results = []
    for lib, xs in ((td, ours), (torch, theirs)):
        y = fn(lib, *xs)
        y.sum().backward()
        results.append([y] + [x.grad for x in xs])
    return results


def _same(ours, theirs):
    for a, b in zip(ours, theirs):
        assert tuple(a.shape) == tuple(b.shape)
        assert_close(a, b.detach(), rtol=1e-6, atol=1e-6)


EMPTY_UNARY = {
    "exp": lambda lib, x: x.exp(), "tanh": lambda lib, x: x.tanh(),
    "relu": lambda lib, x: x.relu(), "abs": lambda lib, x: x.abs(),
    "cast": lambda lib, x: x.to(lib.float64), "sum over empty dims": lambda lib, x: x.sum((1, 2)),
}


@pytest.mark.parametrize("op", list(EMPTY_UNARY))
def test_backward_through_an_empty_tensor(backend_name, op):
    _same(*_torch_and_ours(EMPTY_UNARY[op], np.zeros((6, 0, 0, 0), np.float32)))


@pytest.mark.parametrize("pick", ["max", "min"])
@pytest.mark.parametrize("keepdim", [False, True])
def test_max_and_min_along_the_dim_of_a_0d_tensor(backend_name, pick, keepdim):
    fn = lambda lib, x: getattr(x, pick)(-1, keepdim=keepdim)[0]  # noqa: E731
    _same(*_torch_and_ours(fn, np.float32(3.0)))
    assert getattr(td.tensor(3.0), pick)(0).indices.item() == 0


def test_pow_gradients_at_zero_as_torch(backend_name):
    a = np.array([0, 0, 0, 0, 2, -2, 0], np.float32)
    b = np.array([0, -1, 2, 0.5, 0, 3, -0.5], np.float32)
    _same(*_torch_and_ours(lambda lib, x, e: x ** e, a, b))
    _same(*_torch_and_ours(lambda lib, e: 0.0 ** e, b))
    _same(*_torch_and_ours(lambda lib, e: 2.0 ** e, b))


VAR_NO_DOF = {  # n <= correction, or nothing to reduce: non-finite or empty gradients
    "var of one": (lambda lib, x: x.var(), (1,)),
    "std of one": (lambda lib, x: x.std(0), (1, 3)),
    "var, correction = n": (lambda lib, x: x.var(1, correction=4), (2, 4)),
    "var of an empty row": (lambda lib, x: x.var(1), (6, 0)),
    "std over an empty dim": (lambda lib, x: x.std(0), (0, 3)),
}


@pytest.mark.parametrize("case", list(VAR_NO_DOF))
def test_var_and_std_backward_without_degrees_of_freedom(backend_name, case):
    fn, shape = VAR_NO_DOF[case]
    a = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
    (y, g), (ty, tg) = _torch_and_ours(fn, a)
    assert y.shape == tuple(ty.shape) and g.shape == tuple(tg.shape)
    assert not np.isfinite(g.numpy()).any() and not np.isfinite(tg.numpy()).any()


INPLACE_WITH_HISTORY = {  # torch records in-place ops on tensors that are not leaves
    "clone().zero_()": lambda lib, x, w: (x * 2).clone().zero_() + w,
    "mul_ then add_ with alpha": lambda lib, x, w: (x * 1).mul_(w).add_(w, alpha=2),
    "clamp_": lambda lib, x, w: (x * w).clamp_(0, 5),
    "a constant takes an operand's history": lambda lib, x, w: lib.zeros(2).add_(w).mul_(x),
    "copy_": lambda lib, x, w: (x * 1).copy_(w) * x,
    "fill_": lambda lib, x, w: (x * 1).fill_(3.0) * w,
    "div_ and sub_": lambda lib, x, w: (x + 0).div_(w).sub_(x),
}


@pytest.mark.parametrize("case", list(INPLACE_WITH_HISTORY))
def test_inplace_ops_on_tensors_with_history_as_torch(backend_name, case):
    _same(*_torch_and_ours(INPLACE_WITH_HISTORY[case], np.array([1.0, 2.0], np.float32),
                           np.array([3.0, 4.0], np.float32)))


def test_inplace_change_of_a_tensor_whose_old_value_was_saved_fails_at_backward(backend_name):
    x = td.tensor([1.0, 2.0], requires_grad=True)
    y = x.exp()  # exp saves its output for the backward
    y.mul_(2)
    with pytest.raises(RuntimeError, match="modified by an in-place operation"):
        y.sum().backward()
