"""Recurrent cells and layers (tritonad/nn/rnn.py, autodiff/rnn_ops.py, kernels/rnn.py) against
PyTorch's CPU modules, the spec: torch's weights copied into ours by name, then outputs, final
states and every gradient compared under random cotangents, on both backends (numpy runs the
composites, triton the fused sequence kernels under the interpreter). The composites' own
gradients are checked against float64 central differences.
"""
import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import tritonad as td
from tritonad import nn
from tritonad.autodiff import gradcheck, rnn_ops

TORCH = {"LSTM": torch.nn.LSTM, "GRU": torch.nn.GRU, "RNN": torch.nn.RNN,
         "LSTMCell": torch.nn.LSTMCell, "GRUCell": torch.nn.GRUCell, "RNNCell": torch.nn.RNNCell}
OURS = {"LSTM": nn.LSTM, "GRU": nn.GRU, "RNN": nn.RNN,
        "LSTMCell": nn.LSTMCell, "GRUCell": nn.GRUCell, "RNNCell": nn.RNNCell}
RTOL, ATOL = 1e-4, 1e-5  # float32, a few steps of accumulation


def pair(kind, *args, seed=0, dtype=td.float32, **kwargs):
    """(torch module, our module with torch's weights) of one kind and configuration."""
    torch.manual_seed(seed)
    theirs = TORCH[kind](*args, **kwargs)
    ours = OURS[kind](*args, **kwargs)
    assert [n for n, _ in ours.named_parameters()] == [n for n, _ in theirs.named_parameters()]
    ours.load_state_dict({n: td.tensor(p.detach().numpy()) for n, p in theirs.named_parameters()})
    if dtype != td.float32:
        ours.to(dtype)
    return theirs, ours


def leaf(array, requires_grad=True):
    return td.tensor(array, requires_grad=requires_grad)


def flat(out):
    """The tensors of a module's result, in order: (y, h) or (y, (h, c)) or h or (h, c)."""
    if isinstance(out, (tuple, list)):
        return [t for o in out for t in flat(o)]
    return [out]


def compare(theirs, ours, inputs, state=None, seed=1, rtol=RTOL, atol=ATOL):
    """Run both on `inputs` (numpy arrays: the input, then the states as the module takes them:
    `state` "pair" (LSTM), "one" or None), compare the results, then backpropagate one random
    cotangent per result through both and compare the inputs' and parameters' gradients."""
    t_in = [torch.tensor(a, requires_grad=True) for a in inputs]
    o_in = [leaf(a) for a in inputs]

    def call(module, args):
        if state is None:
            return module(args[0])
        return module(args[0], tuple(args[1:]) if state == "pair" else args[1])

    t_out, o_out = flat(call(theirs, t_in)), flat(call(ours, o_in))
    assert len(t_out) == len(o_out)
    rng = np.random.default_rng(seed)
    cotangents = [rng.standard_normal(tuple(t.shape)).astype(np.float32) for t in t_out]
    for i, (t, o) in enumerate(zip(t_out, o_out)):
        assert tuple(o.shape) == tuple(t.shape), f"result {i}: {o.shape} vs {tuple(t.shape)}"
        np.testing.assert_allclose(o.detach().float().numpy(), t.detach().numpy(), rtol=rtol,
                                   atol=atol, err_msg=f"result {i}")
    torch.autograd.backward(t_out, [torch.tensor(u) for u in cotangents])
    from tritonad.autodiff import run_backward
    run_backward(o_out, [td.tensor(u, dtype=o.dtype) for u, o in zip(cotangents, o_out)])
    for i, (t, o) in enumerate(zip(t_in, o_in)):
        np.testing.assert_allclose(o.grad.float().numpy(), t.grad.numpy(), rtol=rtol, atol=atol,
                                   err_msg=f"gradient of input {i}")
    for (name, t), (_, o) in zip(theirs.named_parameters(), ours.named_parameters()):
        np.testing.assert_allclose(o.grad.float().numpy(), t.grad.numpy(), rtol=rtol, atol=atol,
                                   err_msg=f"gradient of {name}")
    return o_out


def randn(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


# ---------------------------------------------------------------------------- cells


@pytest.mark.parametrize("kind, kwargs", [("LSTMCell", {}), ("GRUCell", {}),
                                          ("RNNCell", {}), ("RNNCell", {"nonlinearity": "relu"}),
                                          ("GRUCell", {"bias": False})])
def test_cells_match_torch(backend_name, kind, kwargs):
    theirs, ours = pair(kind, 3, 5, **kwargs)
    x, h, c = randn(2, 3), randn(2, 5, seed=1), randn(2, 5, seed=2)
    state = "pair" if kind == "LSTMCell" else "one"
    states = [h, c] if kind == "LSTMCell" else [h]
    compare(theirs, ours, [x] + states, state)
    if backend_name == "triton" and kind != "LSTMCell":
        return  # (the interpreter is slow: the module's paths below once, on the fused LSTM)
    # unbatched, and without a state (zeros)
    theirs.zero_grad()
    ours.zero_grad()
    compare(theirs, ours, [x[0]] + [s[0] for s in states], state)
    theirs.zero_grad()
    ours.zero_grad()
    compare(theirs, ours, [x])


# ---------------------------------------------------------------------------- layers

LAYERS = [
    # kind, constructor kwargs, batched, with initial states; the first three on both backends
    ("LSTM", dict(bidirectional=True, batch_first=True), True, True),
    ("GRU", dict(num_layers=2), True, False),
    ("RNN", dict(nonlinearity="relu"), False, True),
    ("LSTM", dict(num_layers=2, bidirectional=True, batch_first=True), True, True),
    ("GRU", dict(num_layers=2, bidirectional=True, batch_first=True), True, True),
    ("RNN", dict(bias=False, num_layers=2), True, True),
    ("LSTM", dict(bias=False), False, False),
    ("LSTM", dict(num_layers=3, bidirectional=True), False, True),
]


def check_layer(kind, kwargs, batched, with_state, T=3, B=2, seed=0):
    theirs, ours = pair(kind, 3, 4, **kwargs)
    x = randn(*((B, T, 3) if kwargs.get("batch_first") else (T, B, 3)), seed=seed) if batched \
        else randn(T, 3, seed=seed)
    layers = kwargs.get("num_layers", 1) * (2 if kwargs.get("bidirectional") else 1)
    inputs = [x]
    if with_state:
        shape = (layers, B, 4) if batched else (layers, 4)
        inputs += [randn(*shape, seed=1)] + ([randn(*shape, seed=2)] if kind == "LSTM" else [])
    compare(theirs, ours, inputs, ("pair" if kind == "LSTM" else "one") if with_state else None)


@pytest.mark.parametrize("kind, kwargs, batched, with_state", LAYERS[:3])
def test_layers_match_torch(backend_name, kind, kwargs, batched, with_state):
    check_layer(kind, kwargs, batched, with_state, T=2 if backend_name == "triton" else 3)


@pytest.mark.parametrize("kind, kwargs, batched, with_state", LAYERS[3:])
def test_more_layers_match_torch_numpy(kind, kwargs, batched, with_state):
    with td.use_backend("numpy"):
        check_layer(kind, kwargs, batched, with_state)


def test_second_call_replays_with_new_data():
    # the triton backend replays the first call's recorded plans, here with new data
    with td.use_backend("triton"):
        check_layer("RNN", {}, True, True, T=2)
        check_layer("RNN", {}, True, True, T=2, seed=5)


def test_tiles_and_masks_at_odd_sizes():
    # batch 17 and hidden 17: two row and two column tiles of 16 under the interpreter, so
    # every gate's columns (q H + n) cross a tile edge
    with td.use_backend("triton"):
        theirs, ours = pair("LSTM", 1, 17)
        compare(theirs, ours, [randn(1, 17, 1), randn(1, 17, 17, seed=1),
                               randn(1, 17, 17, seed=2)], "pair")


@given(kind=st.sampled_from(["LSTM", "GRU", "RNN"]), T=st.sampled_from([1, 2, 4]),
       B=st.sampled_from([1, 3]), I=st.sampled_from([1, 2, 5]), H=st.sampled_from([1, 3]),
       bidirectional=st.booleans(), with_state=st.booleans())
def test_any_small_layer_matches_torch_numpy(kind, T, B, I, H, bidirectional, with_state):
    with td.use_backend("numpy"):
        theirs, ours = pair(kind, I, H, bidirectional=bidirectional)
        inputs = [randn(T, B, I)]
        if with_state:
            shape = (2 if bidirectional else 1, B, H)
            inputs += [randn(*shape, seed=1)] + ([randn(*shape, seed=2)] if kind == "LSTM"
                                                  else [])
        compare(theirs, ours, inputs, ("pair" if kind == "LSTM" else "one") if with_state
                else None)


def test_strided_input():
    with td.use_backend("triton"):
        theirs, ours = pair("GRU", 3, 4)
        wide = randn(3, 2, 7)
        y = ours(td.tensor(wide)[:, :, 1:7:2])[0]
        expected = theirs(torch.tensor(wide)[:, :, 1:7:2])[0]
        np.testing.assert_allclose(y.numpy(), expected.detach().numpy(), rtol=RTOL, atol=ATOL)


def test_fused_sequence_matches_composite_without_grad():
    # no gradient recorded: the forward saves no activations and the result is the same
    with td.use_backend("triton"):
        _, ours = pair("LSTM", 3, 4)
        x = td.tensor(randn(2, 2, 3))
        with td.no_grad():
            y, (h, c) = ours(x)
            weights = [getattr(ours, n) for n in ours._names[0]]
            y2, h2, c2 = rnn_ops.rnn_layer.composed(x, None, None, *weights, "LSTM")
        for a, b in ((y, y2), (h[0], h2), (c[0], c2)):
            np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=RTOL, atol=ATOL)


def test_bfloat16_layer_matches_torch():
    # half types: bf16 storage, float32 gate maths, one rounding per stored value
    with td.use_backend("triton"):
        theirs, ours = pair("LSTM", 3, 4, dtype=td.bfloat16)
        x = randn(2, 2, 3)
        xt = td.tensor(x).to(td.bfloat16).requires_grad_()
        xs = torch.tensor(x, requires_grad=True)
        y, (h, c) = ours(xt)
        expected = theirs(xs)[0]
        assert y.dtype == td.bfloat16 and h.dtype == td.bfloat16
        np.testing.assert_allclose(y.float().numpy(), expected.detach().numpy(), atol=2e-2)
        u = randn(2, 2, 4, seed=3)
        y.backward(td.tensor(u).to(td.bfloat16))
        expected.backward(torch.tensor(u))
        np.testing.assert_allclose(xt.grad.float().numpy(), xs.grad.numpy(), atol=3e-2)
        np.testing.assert_allclose(ours.weight_hh_l0.grad.float().numpy(),
                                   theirs.weight_hh_l0.grad.numpy(), atol=3e-2)


def check_autocast(device):
    # recurrent layers are among autocast's lower-precision ops (as PyTorch's): outputs in
    # bf16, gradients of the float32 weights in float32
    _, ours = pair("LSTM", 3, 4)
    if device == "cuda":
        ours.cuda()
    x = td.tensor(randn(3, 2, 3), device=device)
    with td.no_grad():
        full = ours(x)[0].numpy()
    with td.autocast(device_type=device, dtype=td.bfloat16):
        y, (h, c) = ours(x)
    assert y.dtype == td.bfloat16 and c.dtype == td.bfloat16
    np.testing.assert_allclose(y.float().numpy(), full, atol=3e-2)
    y.float().sum().backward()
    assert ours.weight_hh_l0.grad.dtype == td.float32
    assert np.abs(ours.weight_hh_l0.grad.numpy()).max() > 0


def test_autocast_runs_in_bfloat16():
    with td.use_backend("numpy"):
        check_autocast("cpu")


def test_dropout_between_layers():
    theirs, ours = pair("GRU", 3, 4, num_layers=2, dropout=0.5)
    x = randn(3, 2, 3)
    ours.eval()
    theirs.eval()
    y_eval = ours(td.tensor(x))[0].numpy()
    np.testing.assert_allclose(y_eval, theirs(torch.tensor(x))[0].detach().numpy(), rtol=RTOL,
                               atol=ATOL)
    ours.train()
    td.manual_seed(3)
    y_train = ours(td.tensor(x))[0].numpy()
    assert not np.allclose(y_train, y_eval)
    td.manual_seed(3)
    np.testing.assert_array_equal(ours(td.tensor(x))[0].numpy(), y_train)


def test_lstm_is_its_cell_over_time():
    with td.use_backend("triton"):
        _, cell = pair("LSTMCell", 3, 4)
        layer = nn.LSTM(3, 4)
        layer.load_state_dict({n + "_l0": p for n, p in cell.state_dict().items()})
        x = td.tensor(randn(2, 2, 3))
        h = c = td.tensor(randn(2, 4, seed=1))   # (one tensor twice: plans must tell them apart)
        y, (h_n, c_n) = layer(x, (h[None], c[None]))
        for t in range(2):
            h, c = cell(x[t], (h, c))
            np.testing.assert_allclose(y[t].numpy(), h.numpy(), rtol=RTOL, atol=ATOL)
        np.testing.assert_allclose(c_n[0].numpy(), c.numpy(), rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("mode", rnn_ops.MODES)
def test_composite_gradients_float64(mode):
    rng = np.random.default_rng(0)
    G = {"LSTM": 4, "GRU": 3}.get(mode, 1)
    T, B, I, H = 2, 2, 2, 2

    def arr(*shape):
        return td.tensor(rng.uniform(-1, 1, shape), dtype=td.float64, requires_grad=True)

    x, h0, c0 = arr(T, B, I), arr(B, H), arr(B, H)
    weights = [arr(G * H, I), arr(G * H, H), arr(G * H), arr(G * H)]
    with td.use_backend("numpy"):
        if mode == "LSTM":
            gradcheck(lambda *a: rnn_ops.rnn_layer(*a[:3], *a[3:], mode, True),
                      (x, h0, c0, *weights))
        else:
            gradcheck(lambda *a: rnn_ops.rnn_layer(a[0], a[1], None, *a[2:], mode)[:2],
                      (x, h0, *weights))


@pytest.mark.parametrize("build, call, error, match", [
    (lambda: nn.LSTM(3, 4), lambda m: m(td.zeros(2, 2, 2, 3)), ValueError, "2D or 3D"),
    (lambda: nn.GRU(3, 4), lambda m: m(td.zeros(2, 2, 5)), RuntimeError, "input_size"),
    (lambda: nn.LSTM(3, 4), lambda m: m(td.zeros(2, 2, 3), (td.zeros(1, 3, 4), td.zeros(1, 3, 4))),
     RuntimeError, "Expected hidden size"),
    (lambda: nn.LSTM(3, 4), lambda m: m(td.zeros(2, 2, 3), td.zeros(1, 2, 4)), TypeError,
     "tuple"),
    (lambda: nn.RNN(3, 4), lambda m: m(td.zeros(0, 2, 3)), ValueError, "sequence length"),
    (lambda: nn.LSTMCell(3, 4), lambda m: m(td.zeros(2, 2, 3)), ValueError, "1D or 2D"),
    (lambda: nn.GRUCell(3, 4), lambda m: m(td.zeros(2, 3), td.zeros(3, 4)), RuntimeError,
     "hidden state"),
])
def test_bad_calls(build, call, error, match):
    with td.use_backend("numpy"):
        module = build()
        with pytest.raises(error, match=match):
            call(module)


@pytest.mark.parametrize("build, error, match", [
    (lambda: nn.LSTM(3, 4, proj_size=2), ValueError, "proj_size"),
    (lambda: nn.GRU(3, 4, dropout=1.5), ValueError, "dropout"),
    (lambda: nn.RNN(3, 4, nonlinearity="gelu"), ValueError, "nonlinearity"),
    (lambda: nn.LSTM(3, 0), ValueError, "hidden_size"),
    (lambda: nn.GRU(3, 4, num_layers=0), ValueError, "num_layers"),
])
def test_bad_constructors(build, error, match):
    with pytest.raises(error, match=match):
        build()


def test_initialisation_bounds():
    m = nn.GRU(5, 16, num_layers=2)
    for name, p in m.named_parameters():
        values = p.numpy()
        assert np.abs(values).max() <= 0.25 and values.std() > 0.1, name


# ---------------------------------------------------------------------------- GPU sizes


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["LSTM", "GRU", "RNN"])
def test_layers_match_torch_gpu_sizes(kind):
    td.set_matmul_precision("highest")
    theirs, ours = pair(kind, 40, 96, num_layers=2, bidirectional=True)
    ours.cuda()
    T, B = 20, 37
    x = randn(T, B, 40)
    t_in = torch.tensor(x, requires_grad=True)
    o_in = td.tensor(x, requires_grad=True, device="cuda")
    t_out = theirs(t_in)
    o_out = ours(o_in)
    t_flat, o_flat = flat(t_out), flat(o_out)
    for t, o in zip(t_flat, o_flat):
        np.testing.assert_allclose(o.cpu().numpy(), t.detach().numpy(), rtol=1e-3, atol=1e-4)
    rng = np.random.default_rng(0)
    us = [rng.standard_normal(tuple(t.shape)).astype(np.float32) for t in t_flat]
    torch.autograd.backward(t_flat, [torch.tensor(u) for u in us])
    from tritonad.autodiff import run_backward
    run_backward(o_flat, [td.tensor(u, device="cuda") for u in us])
    np.testing.assert_allclose(o_in.grad.cpu().numpy(), t_in.grad.numpy(), rtol=1e-3, atol=1e-4)
    for (name, t), (_, o) in zip(theirs.named_parameters(), ours.named_parameters()):
        np.testing.assert_allclose(o.grad.cpu().numpy(), t.grad.numpy(), rtol=1e-3, atol=2e-4,
                                   err_msg=name)


@pytest.mark.gpu
def test_captured_lstm_training_step_matches_eager():
    # the recorded plans replay T launches a layer without Python per step: capturable
    from tritonad import optim
    from tritonad.capture import CapturedStep

    x = td.tensor(randn(6, 4, 8), device="cuda")
    target = td.tensor(randn(6, 4, 1, seed=1), device="cuda")
    runs = []
    for graph in (False, True):
        td.manual_seed(0)
        model = nn.LSTM(8, 32, num_layers=2, bidirectional=True).cuda()
        head = nn.Linear(64, 1).cuda()
        opt = optim.SGD(list(model.parameters()) + list(head.parameters()), lr=0.1)

        def step(x, target):
            opt.zero_grad(set_to_none=True)
            loss = td.nn.functional.mse_loss(head(model(x)[0]), target)
            loss.backward()
            opt.step()
            return loss

        runner = CapturedStep(step) if graph else step
        runs.append([float(runner(x, target).item()) for _ in range(6)])
        if graph:
            assert runner.captured
    np.testing.assert_allclose(runs[1], runs[0], rtol=1e-5, atol=1e-6)
    assert runs[0][-1] < runs[0][0]


@pytest.mark.gpu
def test_autocast_runs_in_bfloat16_gpu():
    with td.use_backend("triton"):
        check_autocast("cuda")


@pytest.mark.gpu
def test_lstm_bfloat16_gpu():
    theirs, ours = pair("LSTM", 64, 128, num_layers=2)
    ours.cuda().to(td.bfloat16)
    x = randn(16, 32, 64)
    o_in = td.tensor(x, device="cuda").to(td.bfloat16).requires_grad_()
    y, (h, c) = ours(o_in)
    expected = theirs(torch.tensor(x))[0].detach().numpy()
    np.testing.assert_allclose(y.float().cpu().numpy(), expected, rtol=0, atol=5e-2)
    y.float().sum().backward()
    assert o_in.grad is not None and np.isfinite(o_in.grad.float().cpu().numpy()).all()
