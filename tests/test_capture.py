"""Captured training steps (CUDA graphs), the proof that only our kernels run, no leaks,
and the GPU accuracy gates of the training recipes. All GPU tier."""
import gc
import os
import tempfile

import numpy as np
import pytest
import torch

import tritonad as td
from helpers import assert_close
from tritonad import models, nn, optim, train
from tritonad.autodiff import conv_ops
from tritonad.capture import CaptureError, CapturedStep

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _on_gpu():
    with td.use_backend("triton"):
        yield


def _loader(limit, batch):
    train_set, _ = train.datasets("mnist")
    return td.data.DataLoader(train_set, batch, shuffle=True, device="cuda", limit=limit)


def _train_steps(name, graph, steps, schedule=False, seed=0, tensor_lr=False, epochs=1,
                 precision="fp32"):
    td.manual_seed(seed)
    loader = _loader(steps * 64 + 32, 64)
    model = models.build(name).to("cuda")
    lr = td.tensor([0.05], device="cuda") if tensor_lr else 0.05
    opt = optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    sched = optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5) if schedule else None
    trainer = train.Trainer(model, opt, loader, sched, graph=graph, precision=precision)
    for _ in range(epochs):
        trainer.train_epoch(progress=False)
    return {k: v.numpy() for k, v in model.state_dict().items()}, trainer


@pytest.mark.parametrize("name", ["mlp", "cnn"])
def test_captured_training_matches_eager(name):
    eager, _ = _train_steps(name, graph=False, steps=6, schedule=True)
    graphed, trainer = _train_steps(name, graph=True, steps=6, schedule=True)
    assert trainer.captured_step.captured
    for key in eager:
        assert_close(graphed[key], eager[key], 1e-4, 1e-5, name=key)


@pytest.mark.parametrize("name", ["mlp", "cnn"])
@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_captured_low_precision_training_matches_eager(name, precision):
    """Autocast (and fp16's GradScaler, its scale and flag on the device) inside the captured
    step: the weights after 6 steps and the device metrics as eager steps give them."""
    eager, eager_trainer = _train_steps(name, graph=False, steps=6, schedule=True,
                                        precision=precision)
    graphed, trainer = _train_steps(name, graph=True, steps=6, schedule=True,
                                    precision=precision)
    assert trainer.captured_step.captured and not trainer.fused
    for key in eager:
        assert_close(graphed[key], eager[key], 1e-3, 1e-4, name=key)
    assert trainer._mean_loss(6 * 64 + 32) == pytest.approx(
        eager_trainer._mean_loss(6 * 64 + 32), rel=1e-3)
    if precision == "fp16":
        assert trainer.scaler.get_scale() == eager_trainer.scaler.get_scale()


def test_captured_cnn_step_runs_weight_gradients_beside_the_chain():
    """While the cnn step is captured, the weight gradients of its layers after the first go
    to the side stream (kernels/streams.py), once per capture, and never in the eager steps;
    the trained weights are still those of eager steps (test_captured_training_matches_eager)."""
    from tritonad.kernels import streams

    before = streams.forks
    _train_steps("cnn", graph=False, steps=3)
    assert streams.forks == before
    _, trainer = _train_steps("cnn", graph=True, steps=4)
    assert trainer.captured_step.captured
    assert streams.forks == before + 3
    assert not streams.is_open() and not streams._REGION.kept


def test_captured_partial_batch_matches_eager():
    """Three epochs: the last, partial batch of each runs eagerly twice, then as its own graph
    (lr from sync(), the scheduler still stepping); weights, loss and accuracy as eager."""
    eager, eager_trainer = _train_steps("mlp", graph=False, steps=3, schedule=True, epochs=3)
    graphed, trainer = _train_steps("mlp", graph=True, steps=3, schedule=True, epochs=3)
    assert trainer._tail_step.captured
    for key in eager:
        assert_close(graphed[key], eager[key], 1e-4, 1e-5, name=key)
    assert trainer.correct.item() == eager_trainer.correct.item()
    assert trainer._mean_loss(3 * 64 + 32) == pytest.approx(
        eager_trainer._mean_loss(3 * 64 + 32), rel=1e-5)


def test_captured_training_with_a_tensor_learning_rate():
    """A tensor lr is read in place, so the trainer feeds no per-step table: still as eager."""
    eager, _ = _train_steps("mlp", graph=False, steps=5, tensor_lr=True)
    graphed, trainer = _train_steps("mlp", graph=True, steps=5, tensor_lr=True)
    assert trainer.captured_step.captured and not trainer._feed
    for key in eager:
        assert_close(graphed[key], eager[key], 1e-4, 1e-5, name=key)


def test_capture_guard_rails():
    x = td.ones(4, 3, device="cuda")
    step = CapturedStep(lambda t: (t * 2.0).sum(), warmup=1)
    step(x)
    assert step(x).item() == 24.0 and step.captured
    x.fill_(2.0)
    assert step(x).item() == 48.0
    with pytest.raises(CaptureError, match="other arguments than at capture"):
        step(td.ones(5, 3, device="cuda"))
    with pytest.raises(CaptureError, match="other arguments"):
        step(td.ones(4, 3, dtype=td.float16, device="cuda"))
    drop = CapturedStep(lambda t: conv_ops.dropout(t, 0.5).sum(), warmup=1)
    drop(x)
    with pytest.raises(RuntimeError, match="repeat the same numbers"):
        drop(x)


def test_gradient_accumulation_under_capture():
    td.manual_seed(0)
    w = nn.Parameter(td.randn(5, 3, device="cuda"))
    opt = optim.SGD([w], lr=0.1)
    xs = [td.randn(4, 5, device="cuda") for _ in range(6)]

    def accumulate(x):
        ((x @ w) ** 2).mean().backward()

    step = CapturedStep(accumulate, warmup=1)
    w_ref = w.detach().numpy().copy()
    opt.zero_grad(set_to_none=False)
    for k in range(0, 6, 2):  # two micro-batches per update
        step(xs[k])
        step(xs[k + 1])
        opt.step()
        opt.zero_grad(set_to_none=False)
    for k in range(0, 6, 2):
        g = sum(2 * x.numpy().T @ (x.numpy() @ w_ref) / 12 for x in (xs[k], xs[k + 1]))
        w_ref = w_ref - 0.1 * g
    assert_close(w, w_ref, 1e-4, 1e-5)


@pytest.mark.parametrize("graph", [False, True])
def test_no_memory_leak_over_300_steps(graph):
    td.manual_seed(0)
    loader = _loader(300 * 32, 32)
    model = models.build("mlp").to("cuda")
    opt = optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    sched = optim.lr_scheduler.CosineAnnealingLR(opt, T_max=300)
    trainer = train.Trainer(model, opt, loader, sched, graph=graph)
    usage = {}
    for i, _ in enumerate(trainer.steps()):
        if i + 1 in (3, 300):
            gc.collect()
            torch.cuda.synchronize()
            usage[i + 1] = torch.cuda.memory_allocated()
    assert usage[300] == usage[3]
    assert trainer.captured_step is None or trainer.captured_step.captured


def _our_kernel_names():
    import importlib

    from tritonad.kernels import FAMILIES

    import pkgutil

    modules = []
    for family in FAMILIES:  # a family's module, or every module of a family's package (conv)
        module = importlib.import_module(f"tritonad.kernels.{family}")
        modules.append(module)
        for info in pkgutil.iter_modules(getattr(module, "__path__", [])):
            modules.append(importlib.import_module(f"{module.__name__}.{info.name}"))
    names = set()
    for module in modules:
        for value in vars(module).values():
            fn = getattr(value, "fn", None)
            while fn is not None and hasattr(fn, "fn"):
                fn = fn.fn
            if fn is not None and hasattr(fn, "__name__"):
                names.add(fn.__name__)
    return names


def test_a_captured_cnn_step_runs_only_our_kernels():
    from torch.profiler import ProfilerActivity, profile

    td.manual_seed(0)
    loader = _loader(10 * 100, 100)
    model = models.build("cnn").to("cuda")
    opt = optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    trainer = train.Trainer(model, opt, loader, graph=True)
    steps = trainer.steps()
    for _ in range(3):  # warm-up, capture
        next(steps)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        next(steps)
        torch.cuda.synchronize()
    assert trainer.captured_step.captured
    kernels = {e.name for e in prof.events() if e.device_type.name == "CUDA"}
    ours = _our_kernel_names()
    foreign = {k for k in kernels if k not in ours and not k.lower().startswith(("memcpy", "memset"))}
    assert kernels, "the profiler saw no kernels"
    assert not foreign, f"kernels that are not tritonad's: {sorted(foreign)}"


def test_eager_cnn_steps_never_copy_to_the_host():
    """A user's own eager loop (loader batch, forward, cross_entropy, backward, SGD step) asks
    the GPU nothing: no device-to-host copy and no synchronisation among a few steps' events
    (the target check of cross_entropy writes a device flag instead, kernels/errors.py)."""
    from torch.profiler import ProfilerActivity, profile

    import tritonad.nn.functional as F

    td.manual_seed(0)
    loader = _loader(8 * 100, 100)
    model = models.build("cnn").to("cuda")
    opt = optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def step(images, labels):
        loss = F.cross_entropy(model(images), labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss

    batches = iter(loader)
    for _ in range(3):  # warm-up: kernels compile, plans are recorded
        step(*next(batches))
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        with torch.profiler.record_function("steps"):
            for _ in range(3):
                loss = step(*next(batches))
        torch.cuda.synchronize()  # (outside the steps: the profiler's own wait for the GPU)
    events = prof.events()
    (steps,) = [e for e in events if e.name == "steps" and e.device_type.name == "CPU"]
    start, end = steps.time_range.start, steps.time_range.end
    host = [e.name for e in events if e.device_type.name == "CPU"
            and start <= e.time_range.start <= end]
    # a copy's GPU-side record runs after the host range ends: all of them count
    copies = sorted({e.name for e in events if "DtoH" in e.name or "Device -> " in e.name})
    waits = sorted({n for n in host if n in ("cudaStreamSynchronize", "cudaDeviceSynchronize",
                                             "cudaEventSynchronize")})
    assert not copies, f"device-to-host copies in eager steps: {copies}"
    assert not waits, f"the host waited for the GPU inside eager steps: {waits}"
    seen = [e.name for e in _profiled(lambda: loss.item())]  # (which ends in a synchronize)
    assert any("DtoH" in n for n in seen) and "cudaDeviceSynchronize" in seen, \
        "the profiler does not show device-to-host copies or waits at all (the check is blind)"


def _profiled(fn):
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return prof.events()


@pytest.mark.parametrize("name,gate", [("mlp", 0.980), ("cnn", 0.992)])
def test_recipes_reach_their_accuracy(name, gate):
    _, acc, _ = _bench_run(name)
    assert acc >= gate, f"{name} reached {acc:.4f} < {gate}"


def _bench_run(name):
    import sys

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
    import bench_mnist

    return bench_mnist.run_tritonad(name, 10, graph=True)


def test_predict_gets_200_test_digits_right(tmp_path):
    """200 MNIST test digits, saved as PNG files of other sizes and both polarities, are read
    back through `predict`'s preprocessing and classified by a trained cnn."""
    import gzip
    import pathlib

    from PIL import Image

    from tritonad.predict import load_digit

    data = pathlib.Path(__file__).resolve().parents[1] / "data" / "mnist"
    images = np.frombuffer(gzip.open(data / "t10k-images-idx3-ubyte.gz").read(), np.uint8,
                           offset=16).reshape(-1, 28, 28)
    labels = np.frombuffer(gzip.open(data / "t10k-labels-idx1-ubyte.gz").read(), np.uint8,
                           offset=8)
    td.manual_seed(0)
    loader = _loader(None, 100)
    model = models.build("cnn").to("cuda")
    opt = optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    sched = optim.lr_scheduler.CosineAnnealingLR(opt, T_max=2 * len(loader))
    trainer = train.Trainer(model, opt, loader, sched, graph=True)
    for e in range(2):
        trainer.train_epoch(progress=False)
    rng = np.random.default_rng(0)
    pictures = []
    for i in range(200):
        side = int(rng.integers(40, 200))
        img = images[i] if i % 2 else 255 - images[i]
        path = tmp_path / f"{i}.png"
        Image.fromarray(img).resize((side, side), Image.BILINEAR).save(path)
        pictures.append(load_digit(str(path)))
    x = td.tensor((np.stack(pictures)[:, None] - 0.1307) / 0.3081, device="cuda")
    model.eval()
    with td.no_grad():
        predicted = model(x).argmax(1).numpy()
    assert (predicted == labels[:200]).mean() >= 0.95


def test_programmatic_dependent_launch_keeps_the_stream_order():
    """On Hopper our kernels launch with PDL (the next kernel is scheduled while this one runs,
    and waits before touching memory). Replayed from a graph, a chain of dependent kernels must
    still see every result before it, and a kernel that overwrites a buffer must not overtake
    the (many-wave) kernel still reading it."""
    from tritonad.kernels import launch

    backend = td.get_backend()
    assert launch.PDL["GDC"] == (torch.cuda.get_device_capability()[0] >= 9)
    x = torch.arange(1 << 24, dtype=torch.float32, device="cuda")
    copy = torch.empty_like(x)
    chain = [torch.zeros(1000, device="cuda") for _ in range(30)]

    def step():
        backend.copy_(copy, x)        # reads all of x ...
        backend.fill_(x, -1.0)        # ... before this overwrites it
        for a, b in zip(chain, chain[1:]):
            backend.add(a, 1.0, out=b)

    step()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for _ in range(3):
        backend.copy_(x, torch.arange(1 << 24, dtype=torch.float32, device="cuda"))
        chain[0].fill_(5.0)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(copy, torch.arange(1 << 24, dtype=torch.float32, device="cuda"))
        assert (x == -1).all() and (chain[-1] == 5.0 + 29).all()

