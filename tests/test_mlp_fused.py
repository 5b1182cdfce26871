"""The fused MLP step (Backend.mlp_cross_entropy_grads_, tritonad/kernels/mlp.py): the numpy
reference against the per-op autodiff path, the Triton kernels against the reference (every way
of naming the batch, split-K slices, several row blocks, strided x), the argument checks, and the
Trainer's fused path against its per-op path."""
import numpy as np
import pytest
import torch
from helpers import read_device

import tritonad as td
from tritonad import models, nn, optim, train
from tritonad.autodiff import nn_ops
from tritonad.kernels import mlp as fused
from tritonad.reference import NumpyBackend

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # the triton backend's
REFERENCE = NumpyBackend()


def problem(n, dims, seed=0, device=DEVICE):
    """x [n, D], target [n], weights and biases of a dims[0]-...-dims[-1] MLP, as raw arrays."""
    rng = np.random.default_rng(seed)
    x = torch.from_numpy(rng.standard_normal((n, dims[0])).astype(np.float32)).to(device)
    t = torch.from_numpy(rng.integers(0, dims[-1], n)).to(device)
    ws = [torch.from_numpy((rng.standard_normal((o, i)) / np.sqrt(i)).astype(np.float32))
          .to(device) for i, o in zip(dims[:-1], dims[1:])]
    bs = [torch.from_numpy((0.3 * rng.standard_normal(o)).astype(np.float32)).to(device)
          for o in dims[1:]]
    return x, t, ws, bs


def run(be, x, t, ws, bs, rows=None, cursor=None, advance=False, device=DEVICE):
    """(mean loss, gradients, loss total, correct count) of one call of the primitive."""
    gw = [torch.full_like(w, float("nan")) for w in ws]  # overwritten, never read
    gb = [torch.full_like(b, float("nan")) for b in bs]
    metrics = (torch.full((), 1.5, device=device), torch.full((), 3, dtype=torch.int64,
                                                                device=device))
    loss = be.mlp_cross_entropy_grads_(x, t, ws, bs, gw, gb, metrics, rows=rows, cursor=cursor,
                                       advance=advance)
    return (float(loss.item()), [g.cpu().numpy() for g in gw + gb], float(metrics[0].item()),
            int(metrics[1].item()))


def cpu(*arrays):
    return [a.cpu() if isinstance(a, torch.Tensor) else [b.cpu() for b in a] for a in arrays]


def assert_same(got, ref, rtol=2e-5):
    assert got[0] == pytest.approx(ref[0], rel=rtol)
    assert got[2] == pytest.approx(ref[2], rel=rtol)
    assert got[3] == ref[3]
    for g, r in zip(got[1], ref[1]):
        scale = max(np.abs(r).max(), 1e-6)
        assert np.abs(g - r).max() <= rtol * scale, (g.shape, np.abs(g - r).max(), scale)


# ------------------------------------------------------------------ the reference vs autodiff


@pytest.mark.parametrize("dims", [(13, 11, 9, 5), (20, 17, 3)], ids=["3 layers", "2 layers"])
def test_reference_matches_the_autodiff_path(dims):
    """The numpy primitive gives the gradients, loss and metrics of model -> cross_entropy ->
    backward on the numpy backend, for a batch of gathered rows (negative ones included)."""
    with td.use_backend("numpy"):
        x, t, ws, bs = problem(30, dims, seed=1, device="cpu")
        rows = torch.tensor([3, -1, 7, 7, 0, 29, -30, 12, 5], dtype=torch.int64)
        layers = []
        for w, b in zip(ws, bs):
            layer = nn.Linear(w.shape[1], w.shape[0])
            layer.weight.data, layer.bias.data = td.Tensor._wrap(w), td.Tensor._wrap(b)
            layers.append(layer)
        blocks = [m for layer in layers for m in (layer, nn.ReLU())][:-1]
        model = nn.Sequential(*blocks)
        totals = td.zeros(()), td.zeros((), dtype="int64")
        xt, tt = td.Tensor._wrap(x), td.Tensor._wrap(t)
        index = td.Tensor._wrap(rows)
        loss = nn_ops.cross_entropy_with_metrics(model(xt[index]), tt[index], *totals)
        loss.backward()
        expected = [p.grad.numpy().copy() for layer in layers
                    for p in (layer.weight, layer.bias)]
        model.zero_grad(set_to_none=True)
        fused_totals = td.zeros(()), td.zeros((), dtype="int64")
        fused_loss = nn_ops.mlp_cross_entropy_grads(layers, xt, tt, *fused_totals, rows=rows)
        got = [p.grad.numpy() for layer in layers for p in (layer.weight, layer.bias)]
        assert fused_loss.item() == pytest.approx(loss.item(), rel=1e-6)
        assert fused_totals[0].item() == pytest.approx(totals[0].item(), rel=1e-6)
        assert fused_totals[1].item() == totals[1].item()
        for g, e in zip(got, expected):
            np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-7)
        # a second call adds to the gradients, as backward() would
        nn_ops.mlp_cross_entropy_grads(layers, xt, tt, *fused_totals, rows=rows)
        for layer, e in zip([p for layer in layers for p in (layer.weight, layer.bias)],
                            expected):
            np.testing.assert_allclose(layer.grad.numpy(), 2 * e, rtol=1e-5, atol=1e-7)


def test_reference_against_finite_differences():
    """The reference's weight gradient is d(mean loss)/dW: float64 central differences."""
    x, t, ws, bs = problem(6, (5, 4, 3), seed=2, device="cpu")
    ws64 = [w.double().numpy() for w in ws]
    bs64 = [b.double().numpy() for b in bs]

    def loss_of(w0):
        h = np.maximum(x.double().numpy() @ w0.T + bs64[0], 0)
        z = h @ ws64[1].T + bs64[1]
        z = z - z.max(axis=1, keepdims=True)
        return float(np.mean(np.log(np.exp(z).sum(axis=1)) - z[np.arange(6), t.numpy()]))

    _, grads, _, _ = run(REFERENCE, x, t, ws, bs, device="cpu")
    eps = 1e-6
    for i, j in [(0, 0), (2, 3), (3, 1)]:
        up, down = ws64[0].copy(), ws64[0].copy()
        up[i, j] += eps
        down[i, j] -= eps
        numeric = (loss_of(up) - loss_of(down)) / (2 * eps)
        assert grads[0][i, j] == pytest.approx(numeric, rel=1e-3, abs=1e-6)


# ------------------------------------------------------------------ the kernels vs the reference


@pytest.fixture
def small_tiles():
    """Tiles small enough that odd shapes take several row blocks, K slices and weight tiles."""
    saved = dict(fused.CONFIG)
    fused.CONFIG.update(M1=16, N1=16, K1=16, SPLIT_K=16, M2=16, H2=16, O3=16, I3=16, B3=16)
    yield fused.CONFIG
    fused.CONFIG.clear()
    fused.CONFIG.update(saved)


@pytest.mark.parametrize("dims", [(37, 33, 19, 7), (21, 40, 10), (16, 16, 16, 16)],
                         ids=["3 layers odd", "2 layers", "3 layers even"])
@pytest.mark.parametrize("xt", [True, False], ids=["x^T", "gathered x"])
def test_kernels_match_the_reference(dims, xt, small_tiles):
    """All rows in order, a batch of 35 > 2 row blocks, split-K over 3 slices."""
    small_tiles["xt"] = xt
    with td.use_backend("triton") as be:
        x, t, ws, bs = problem(35, dims, seed=3)
        got = run(be, x, t, ws, bs)
    ref = run(REFERENCE, *cpu(x, t, ws, bs), device="cpu")
    assert_same(got, ref)


@pytest.mark.parametrize("mode", ["index", "table", "table+advance"])
def test_kernels_gather_the_batch(mode, small_tiles):
    """rows as sample indices (negative ones wrap) or as a table row at the cursor, from a
    strided x; the cursor advanced once when asked."""
    with td.use_backend("triton") as be:
        x, t, ws, bs = problem(50, (60, 24, 18, 9), seed=4)
        x = torch.cat([x, x], dim=1)[:, ::2]  # strided rows and columns
        rng = np.random.default_rng(5)
        table = torch.from_numpy(rng.integers(-50, 50, (3, 19))).to(DEVICE)
        rows, cursor, advance = table[1], None, False
        if mode != "index":
            rows, cursor, advance = table, torch.tensor([4], device=DEVICE), "advance" in mode
        got = run(be, x, t, ws, bs, rows, cursor, advance)
        if cursor is not None:
            assert int(cursor.item()) == 4 + int(advance)
    ref_cursor = None if cursor is None else torch.tensor([4])
    ref = run(REFERENCE, *cpu(x, t, ws, bs), rows.cpu(), ref_cursor, device="cpu")
    assert_same(got, ref)


def test_kernels_edge_values(small_tiles):
    """Logits of +-1e4 (one-hot softmax, loss 0 or 2e4) and ties for the first maximum."""
    with td.use_backend("triton") as be:
        x, t, ws, bs = problem(20, (8, 16, 4), seed=6)
        ws[1] = ws[1] * 0
        bs[1] = torch.tensor([1e4, -1e4, 1e4, 0.0], device=DEVICE)  # a tie at 0 and 2
        got = run(be, x, t, ws, bs)
    ref = run(REFERENCE, *cpu(x, t, ws, bs), device="cpu")
    assert_same(got, ref)
    assert np.isfinite(got[0])


@pytest.mark.parametrize("be_name", ["triton", "numpy"])
def test_bad_arguments_raise(be_name):
    device = DEVICE if be_name == "triton" else "cpu"
    with td.use_backend(be_name) as be:
        x, t, ws, bs = problem(12, (6, 5, 4, 3), seed=7, device=device)
        gw = [torch.empty_like(w) for w in ws]
        gb = [torch.empty_like(b) for b in bs]
        metrics = (torch.zeros((), device=device), torch.zeros((), dtype=torch.int64,
                                                               device=device))
        call = be.mlp_cross_entropy_grads_
        with pytest.raises(ValueError, match="2 or 3 layers"):
            call(x, t, ws[:1], bs[:1], gw[:1], gb[:1], metrics)
        with pytest.raises(ValueError, match=r"layer 2 takes 5 features"):
            call(x, t, [ws[0], ws[2], ws[1]], bs, gw, gb, metrics)
        with pytest.raises(TypeError, match="must be float32"):
            call(x.double(), t, ws, bs, gw, gb, metrics)
        with pytest.raises(ValueError, match="gradients of layer 1 must be contiguous"):
            call(x, t, ws, bs, [gw[0].t().contiguous().t()] + gw[1:], gb, metrics)
        with pytest.raises(ValueError, match="a 2-d rows table needs a cursor"):
            call(x, t, ws, bs, gw, gb, metrics, rows=torch.zeros((2, 3), dtype=torch.int64,
                                                                 device=device))
        with pytest.raises(ValueError, match="metrics loss_total"):
            call(x, t, ws, bs, gw, gb, (metrics[1], metrics[1]))
        # (the numpy backend runs the composed default: gather_rows and cross_entropy name the
        # index and the target, the fused kernels also their batch row and sample)
        with pytest.raises(IndexError, match=r"index 12\b.*out of bounds"):
            read_device(call(x, t, ws, bs, gw, gb, metrics,
                             rows=torch.tensor([0, 12, 3], device=device)))
        t[5] = 3
        with pytest.raises(ValueError, match=r"target 3\b.*outside \[0, 3\)"):
            read_device(call(x, t, ws, bs, gw, gb, metrics,
                             rows=torch.tensor([0, 5], device=device)))


# ------------------------------------------------------------------ the Trainer


def test_fusable_names_what_stops_fusion():
    with td.use_backend("numpy"):
        assert nn.fused.fusable(models.mlp(), (10, 1, 28, 28)) is None
        assert "Linear, ReLU, Linear" in nn.fused.fusable(models.logreg(), (10, 1, 28, 28))
        assert "Conv2d" in nn.fused.fusable(models.cnn(), (10, 1, 28, 28))
        assert "756 features" in nn.fused.fusable(models.mlp(), (10, 1, 28, 27))
        sig = nn.Sequential(nn.Linear(4, 3), nn.Sigmoid(), nn.Linear(3, 2))
        assert "Sigmoid" in nn.fused.fusable(sig, (10, 4))
        frozen = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))
        assert nn.fused.fusable(frozen, (10, 4)) is None
        frozen[0].weight.requires_grad_(False)
        assert "does not require grad" in nn.fused.fusable(frozen, (10, 4))
        wide = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 100))
        assert "100 classes" in nn.fused.fusable(wide, (10, 4))
        hidden = nn.Sequential(nn.Linear(4, 300), nn.ReLU(), nn.Linear(300, 300), nn.ReLU(),
                               nn.Linear(300, 5))
        assert "300 wide" in nn.fused.fusable(hidden, (10, 4))
        with pytest.raises(ValueError, match="FusedMLP.from_sequential: cannot fuse this "
                                             "network: .*100 classes"):
            nn.FusedMLP.from_sequential(wide)


def _two_copies(sizes, seed):
    """The same ReLU MLP twice (a FusedMLP and a plain Sequential, separate parameters)."""
    td.manual_seed(seed)
    layers = [nn.Flatten()]
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        layers += [nn.Linear(a, b)] + ([nn.ReLU()] if i < len(sizes) - 2 else [])
    plain = nn.Sequential(*layers)
    fused_model = nn.FusedMLP.from_sequential(plain)
    other = nn.Sequential(*[type(m)(*((m.in_features, m.out_features) if type(m) is nn.Linear
                                      else ())) for m in layers])
    other.load_state_dict(plain.state_dict())
    return fused_model, other


@pytest.mark.parametrize("backend_name", ["numpy", "triton"])
@pytest.mark.parametrize("sizes", [(12, 9, 4), (10, 8, 7, 3)], ids=["2 layers", "3 layers"])
def test_fused_mlp_loss_and_grads_match_backward(backend_name, sizes):
    """loss_and_grads gives the loss of F.cross_entropy(model(x), y) and accumulates the same
    gradients into .grad (twice: the second call adds to the first, as backward does)."""
    with td.use_backend(backend_name):
        model, other = _two_copies(sizes, seed=3)
        x = td.randn(6, 1, sizes[0])  # flattened by the model
        y = td.tensor([v % sizes[-1] for v in (0, 1, 2, 3, 1, 0)])
        for _ in range(2):
            loss = model.loss_and_grads(x, y)
            want = td.nn.functional.cross_entropy(other(x), y)
            want.backward()
            assert loss.grad_fn is None and loss.shape == ()
            assert loss.item() == pytest.approx(want.item(), rel=1e-5)
        for (name, p), q in zip(model.named_parameters(), other.parameters()):
            np.testing.assert_allclose(p.grad.numpy(), q.grad.numpy(), rtol=2e-5, atol=1e-6,
                                       err_msg=name)


def test_fused_mlp_is_its_sequential():
    with td.use_backend("numpy"):
        plain = models.mlp()
        fused_model = nn.FusedMLP.from_sequential(plain)
        assert isinstance(fused_model, nn.Sequential)
        assert list(fused_model.state_dict()) == list(plain.state_dict())
        for a, b in zip(fused_model.parameters(), plain.parameters()):
            assert a is b  # shared: training one trains the other
        back = fused_model.to_sequential()
        assert type(back) is nn.Sequential and list(back.state_dict()) == list(plain.state_dict())
        x = td.randn(3, 1, 28, 28)
        np.testing.assert_array_equal(fused_model(x).numpy(), plain(x).numpy())
        direct = nn.FusedMLP(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))
        assert list(direct.state_dict()) == ["0.weight", "0.bias", "2.weight", "2.bias"]
        with pytest.raises(ValueError, match="FusedMLP: cannot fuse this network: .*Sigmoid"):
            nn.FusedMLP(nn.Linear(4, 3), nn.Sigmoid(), nn.Linear(3, 2))


def test_fused_mlp_falls_back_outside_its_limits():
    """Parameters frozen, or a float64 network after conversion, or a batch cut by rows: the
    per-op path gives the same loss and gradients (and counts the metrics)."""
    with td.use_backend("numpy"):
        model, other = _two_copies((6, 5, 3), seed=4)
        model[1].bias.requires_grad_(False)
        other[1].bias.requires_grad_(False)
        x, y = td.randn(5, 6), td.tensor([0, 2, 1, 1, 0])
        rows = td.tensor([4, 0, -1])
        totals = (td.zeros(()), td.zeros((), dtype=td.int64))
        loss = model.loss_and_grads(x, y, rows=rows, metrics=totals)
        want = td.nn.functional.cross_entropy(other(x[rows]), y[rows])
        want.backward()
        assert loss.item() == pytest.approx(want.item(), rel=1e-6)
        assert totals[0].item() == pytest.approx(3 * want.item(), rel=1e-5)
        assert model[1].bias.grad is None
        np.testing.assert_allclose(model[1].weight.grad.numpy(), other[1].weight.grad.numpy(),
                                   rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("backend_name", ["numpy", "triton"])
def test_trainer_fused_matches_per_op(backend_name):
    """Two epochs of 70 images (batches of 32 and a partial one) with momentum and a cosine
    schedule: the fused step and the per-op step end with the same weights and metrics."""
    device = DEVICE if backend_name == "triton" else "cpu"
    results = {}
    with td.use_backend(backend_name):
        for fuse in (True, False):
            td.manual_seed(0)
            train_set, _ = train.datasets("mnist")
            loader = td.data.DataLoader(train_set, 32, shuffle=True, device=device, limit=70)
            model = models.mlp().to(device)
            opt = optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
            sched = optim.lr_scheduler.CosineAnnealingLR(opt, T_max=6)
            trainer = train.Trainer(model, opt, loader, sched, fuse=fuse)
            assert trainer.fused == fuse
            stats = [trainer.train_epoch(e, 2, progress=False) for e in (1, 2)]
            results[fuse] = ([p.numpy().copy() for p in model.parameters()], stats)
    (fused_params, fused_stats), (per_op_params, per_op_stats) = results[True], results[False]
    for a, b in zip(fused_params, per_op_params):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
    for a, b in zip(fused_stats, per_op_stats):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-5)
        assert a["accuracy"] == b["accuracy"]


# ------------------------------------------------------------------ GPU


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["highest", "high"])
def test_gpu_mnist_shapes_match_the_reference(precision):
    """The MNIST MLP's shapes with the tuned tiles, a batch of 128 gathered at the cursor:
    "highest" (3xTF32) at float32 accuracy elementwise. "high" (TF32, ~1e-3 per product)
    is checked by the loss and by each gradient's direction and norm: chained through three
    layers into sums of 128 rows that cancel, single TF32 elements were 2-16% of the largest
    gradient off on an H200, so an elementwise bound would say little."""
    previous = td.matmul_precision()
    td.set_matmul_precision(precision)
    try:
        with td.use_backend("triton") as be:
            x, t, ws, bs = problem(3000, (784, 256, 100, 10), seed=8)
            order = torch.randperm(3000, generator=torch.Generator().manual_seed(9))
            table = order[:2944].view(23, 128).to(DEVICE)
            cursor = torch.tensor([22], device=DEVICE)
            got = run(be, x, t, ws, bs, table, cursor, True)
            assert int(cursor.item()) == 23
    finally:
        td.set_matmul_precision(previous)
    ref = run(REFERENCE, *cpu(x, t, ws, bs), table.cpu(), torch.tensor([22]), device="cpu")
    if precision == "highest":
        assert_same(got, ref, rtol=2e-5)
        return
    assert got[0] == pytest.approx(ref[0], rel=1e-3)
    for g, r in zip(got[1], ref[1]):
        g, r = g.ravel().astype(np.float64), r.ravel().astype(np.float64)
        assert g @ r / (np.linalg.norm(g) * np.linalg.norm(r)) > 0.999
        assert np.linalg.norm(g) == pytest.approx(np.linalg.norm(r), rel=1e-2)


@pytest.mark.gpu
def test_gpu_captured_fused_step_matches_per_op():
    """A captured epoch of the fused step ends where the per-op captured epoch does."""
    results = {}
    for fuse in (True, False):
        td.manual_seed(0)
        train_set, _ = train.datasets("mnist")
        loader = td.data.DataLoader(train_set, 128, shuffle=True, device="cuda", limit=2000)
        model = models.mlp().to("cuda")
        opt = optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        trainer = train.Trainer(model, opt, loader, graph=True, fuse=fuse)
        stats = trainer.train_epoch(1, 1, progress=False)
        assert trainer.captured_step.captured
        results[fuse] = ([p.numpy().copy() for p in model.parameters()], stats)
    for a, b in zip(results[True][0], results[False][0]):
        np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-5)
    assert results[True][1]["loss"] == pytest.approx(results[False][1]["loss"], rel=1e-4)
