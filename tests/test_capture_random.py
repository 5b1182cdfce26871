"""Random draws inside a captured step: generator.counted_from makes every random kernel count
its Philox counters from a device value (uniform, dropout, the crop augmentation, attention
dropout forward and backward), bit for bit the draws of an eager run; on the GPU, a captured
step (capture.CapturedStep with random_base, capture.ScheduledStep) draws new numbers at every
replay, the ones eager steps draw, and reads each step's learning rate from its table."""
import numpy as np
import pytest
import torch

import tritonad as td
import tritonad.nn.functional as F
from tritonad import generator, optim, transforms
from tritonad.capture import ScheduledStep

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _draws():
    """One of each random kernel, with a gradient through attention's dropout."""
    a = td.rand(37, device=DEVICE)
    b = F.dropout(td.ones(5, 7, device=DEVICE), 0.3)
    images = td.arange(2 * 6 * 6, dtype=td.float32, device=DEVICE).reshape((2, 1, 6, 6))
    c = transforms.RandomCrop(6, padding=2)(images)
    q = td.randn(1, 2, 5, 4, device=DEVICE).requires_grad_()
    d = F.scaled_dot_product_attention(q, q, q, dropout_p=0.5, is_causal=True)
    d.sum().backward()
    return [v.detach().cpu().numpy() for v in (a, b, c, d, q.grad)]


def test_draws_counted_from_a_device_offset_equal_eager_draws():
    with td.use_backend("triton"):
        td.manual_seed(3)
        td.rand(11, device=DEVICE)  # (a stream partway)
        start = generator.get_rng_state()["offset"]
        eager = _draws()
        used = generator.get_rng_state()["offset"] - start
        td.manual_seed(3)
        td.rand(11, device=DEVICE)
        base = td.tensor([start], dtype=td.int64, device=DEVICE)
        with generator.counted_from(base._data) as counted:
            got = _draws()
            assert counted["used"] == used
            with pytest.raises(RuntimeError, match="randperm: .*device counter"):
                td.randperm(5, device=DEVICE)
        assert generator.get_rng_state()["offset"] == start  # (the host counter stayed)
        for e, g in zip(eager, got):
            np.testing.assert_array_equal(e, g)
        generator.advance(used)
        assert generator.get_rng_state()["offset"] == start + used
        with pytest.raises(RuntimeError, match="already counting"):
            with generator.counted_from(base._data), generator.counted_from(base._data):
                pass
        assert generator.device_base() is None


def _scheduled_run(graph, steps=6, device="cuda"):
    """SGD on one weight whose gradient is a fresh dropout mask each step, the lr halved every
    step: the weight after each step."""
    td.manual_seed(0)
    w = td.zeros(64, device=device).requires_grad_()
    opt = optim.SGD([w], lr=1.0)
    schedule = optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)

    def step():
        opt.zero_grad(set_to_none=True)
        (F.dropout(td.ones(64, device=device), 0.5) * w).sum().backward()
        opt.step()

    run, seen = ScheduledStep(step, opt, steps, device, graph=graph), []
    for _ in range(steps):
        run()
        schedule.step()
        seen.append(w.detach().cpu().numpy().copy())
    run.close()
    return seen, td.rand(3, device=device).cpu().numpy(), run


class _Graph:
    """A stand-in for torch.cuda.CUDAGraph on the CPU: the capture runs the step (its draws
    counted from the device base, as the capture records them) and stands for the first replay;
    each later replay runs the step again the same way, as the recorded kernels would."""

    def __init__(self):
        self.step, self.replays = None, 0

    def replay(self):
        self.replays += 1
        if self.replays > 1:
            with generator.counted_from(self.step.random_base):
                self.step.fn()

    def reset(self):
        pass


def test_a_scheduled_step_feeds_its_tables_and_offsets_on_the_cpu(monkeypatch):
    """ScheduledStep's tables, cursor and random offsets, with CUDA's graph API stood in for:
    the replays take each step's learning rate and random offset as eager steps do."""
    import contextlib
    import types

    from tritonad import capture

    made = []

    @contextlib.contextmanager
    def graph(g):
        g.step = made[-1]
        yield

    cuda = types.SimpleNamespace(is_available=lambda: True, synchronize=lambda: None,
                                 CUDAGraph=_Graph, graph=graph)
    fake = types.SimpleNamespace(cuda=cuda, int64=torch.int64, float32=torch.float32,
                                 empty=lambda *a, pin_memory=False, **k: torch.empty(*a, **k))
    init = capture.CapturedStep.__init__

    def remember(self, *args, **kwargs):
        init(self, *args, **kwargs)
        made.append(self)

    with td.use_backend("triton"):
        eager, after_eager, _ = _scheduled_run(graph=False, device="cpu")
        monkeypatch.setattr(capture, "torch", fake)
        monkeypatch.setattr(capture.CapturedStep, "__init__", remember)
        replayed, after_replays, run = _scheduled_run(graph=True, device="cpu")
    assert run.captured.captured and run.captured.graph.replays == 4
    assert run.captured.random_draws == 64
    for e, r in zip(eager, replayed):
        np.testing.assert_array_equal(r, e)
    np.testing.assert_array_equal(after_replays, after_eager)


@pytest.mark.gpu
def test_a_scheduled_step_replays_new_draws_and_learning_rates():
    eager, after_eager, _ = _scheduled_run(graph=False)
    captured, after_captured, run = _scheduled_run(graph=True)
    assert run.captured.captured and run.captured.random_draws == 64
    steps = [b - a for a, b in zip([np.zeros(64)] + eager, eager)]
    assert not np.array_equal(steps[3], steps[4] * 2)  # each step its own mask
    for e, c in zip(eager, captured):
        np.testing.assert_array_equal(c, e)
    np.testing.assert_array_equal(after_captured, after_eager)  # the stream moved alike
