"""Data-parallel training (tritonad.distributed): process groups of gloo processes on the CPU
(numpy backend) train exactly as one process with the same global batch; sharded loaders;
torchrun driving the command line; checkpoints moving between process counts. GPU tests run a
1-process NCCL group through captured training steps (and 2 GPUs where there are).

Groups run as subprocesses (this file is their script: `python test_distributed.py WORKER
...`), each with a time limit, and are killed as a whole on failure or timeout.
"""
import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import tempfile
import time

import numpy as np
import pytest
import torch

import tritonad as td
from helpers import assert_close
from tritonad import cli, distributed, models, nn, optim, train

HERE = pathlib.Path(__file__).resolve()
ROOT = HERE.parents[1]
COMMON = ["--model", "mlp", "--limit", "2560", "--backend", "numpy", "--quiet"]  # 20 steps of 128


# ---------------------------------------------------------------------- running groups
def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _environment(**extra):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(HERE.parent)]),
               OMP_NUM_THREADS="1", TQDM_DISABLE="1")
    env.update({k: str(v) for k, v in extra.items()})
    return env


def _run_group(world, *argv, timeout=120, **extra):
    """Run this file's worker argv[0] in `world` processes of one group; returns their
    (stdout, stderr). Any process failing (or the time running out) kills them all."""
    env = _environment(WORLD_SIZE=world, MASTER_ADDR="127.0.0.1", MASTER_PORT=_free_port(),
                       LOCAL_WORLD_SIZE=world, **extra)
    return _wait([[sys.executable, str(HERE), *map(str, argv)]] * world, timeout,
                 f"worker {argv[0]}", [dict(env, RANK=str(r), LOCAL_RANK=str(r))
                                       for r in range(world)])


def _wait(commands, timeout, what, envs):
    """Start the commands (each in a session of its own, its output into files, so that no
    pipe fills up), wait for all, and kill every one still running once one fails or the time
    is up. Returns their (stdout, stderr)."""
    files = [(tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")) for _ in commands]
    procs = [subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=err, text=True,
                              start_new_session=True)
             for cmd, env, (out, err) in zip(commands, envs, files)]
    deadline = time.monotonic() + timeout
    try:
        while any(p.poll() is None for p in procs):
            failed = [p for p in procs if p.poll() not in (None, 0)]
            if failed or time.monotonic() > deadline:
                break
            time.sleep(0.05)
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    outputs = []
    for out, err in files:
        outputs.append(tuple(f.seek(0) or f.read() for f in (out, err)))
        out.close()
        err.close()
    report = [f"process {i}: exit status {p.returncode}"
              f"{' (killed: time out, or another process failed)' if p.returncode == -9 else ''}"
              f"\n{err[-3000:]}" for i, (p, (_, err)) in enumerate(zip(procs, outputs))
              if p.returncode != 0]
    assert not report, f"{what}:\n" + "\n".join(report)
    return outputs


def _torchrun(nproc, *argv, timeout=120):
    """`torchrun --standalone --nproc_per_node=nproc -m tritonad ...`: (stdout, stderr)."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc_per_node={nproc}", "-m", "tritonad", *map(str, argv)]
    ((out, err),) = _wait([command], timeout, "torchrun", [_environment()])
    return out, err


def _cli_json(capsys, *argv):
    cli.main([str(a) for a in argv])
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def _assert_same_checkpoint(a, b, rtol=1e-5, atol=1e-6):
    a, b = td.load(a), td.load(b)
    for key in a["model"]:
        assert_close(b["model"][key], a["model"][key], rtol, atol, name=key)
    for index, state in a["optimizer"]["state"].items():
        for name, value in state.items():
            assert_close(b["optimizer"]["state"][index][name], value, rtol, atol,
                         name=f"optimizer state {index} {name}")
    assert a["rng"] == b["rng"] and a["epoch"] == b["epoch"]


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    """The reference: the MNIST mlp trained by one process, 20 steps of 128 (epoch 1), then
    resumed for a second epoch."""
    folder = tmp_path_factory.mktemp("one")
    first, second = folder / "epoch1.tdckpt", folder / "epoch2.tdckpt"
    cli.main(["train", *COMMON, "--epochs", "1", "--save", str(first)])
    cli.main(["train", *COMMON, "--epochs", "2", "--resume", str(first), "--save", str(second)])
    return first, second


# ---------------------------------------------------------------------- the figure
def test_two_gloo_processes_train_as_one_with_the_same_global_batch(one_process, tmp_path,
                                                                     capsys):
    """torchrun, 2 gloo processes on the numpy backend, global batch 128 (64 each): after 20
    steps the parameters (and momenta) are those of one process, to float32 rounding; only
    process 0 prints; its checkpoint resumes in one process as the one-process run's does."""
    two = tmp_path / "two.tdckpt"
    out, err = _torchrun(2, "train", *COMMON, "--epochs", "1", "--save", two)
    reports = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert len(reports) == 1, out  # process 0's only
    report = reports[0]
    assert report["processes"] == 2 and report["batch_size"] == 128
    assert report["schedule"]["steps"] == 20
    _assert_same_checkpoint(one_process[0], two)
    reference = td.load(one_process[0])["history"][-1]
    assert report["train_loss"] == pytest.approx(reference["loss"], rel=1e-5)
    assert report["train_accuracy"] == reference["accuracy"]  # summed over both processes
    assert report["test_accuracy"] == pytest.approx(reference["test_accuracy"], abs=2e-4)
    # a checkpoint of 2 processes goes on in 1
    resumed = tmp_path / "two-then-one.tdckpt"
    cli.main(["train", *COMMON, "--epochs", "2", "--resume", str(two), "--save", str(resumed)])
    _assert_same_checkpoint(one_process[1], resumed)
    capsys.readouterr()


# ---------------------------------------------------------------------- the API in 2 processes
def _toy(n=90):
    rng = np.random.default_rng(7)
    return (rng.standard_normal((n, 12)).astype(np.float32), rng.integers(0, 5, n))


def _toy_model(seed):
    td.manual_seed(seed)
    return nn.Sequential(nn.Linear(12, 9), nn.ReLU(), nn.Linear(9, 5))


class _MomentumSGD(optim.Optimizer):
    """A hand-written optimizer (per-parameter update, no flat buffers)."""

    def __init__(self, params, lr=0.1, momentum=0.9):
        super().__init__(params, dict(lr=lr, momentum=momentum))

    def update(self, param, grad, state, group):
        if "buf" not in state:
            state["buf"] = grad.clone()
        else:
            state["buf"].mul_(group["momentum"]).add_(grad)
        param.sub_(state["buf"] * group["lr"])


_OPTIMIZERS = {"sgd": lambda ps: optim.SGD(ps, lr=0.1, momentum=0.9),
               "adam": lambda ps: optim.Adam(ps, lr=0.01),
               "hand-written": lambda ps: _MomentumSGD(ps)}


def _loop(model, opt, loader, epochs=2, explicit=False, clip=None):
    """A user's loop; returns (sum of the batch losses times their sizes, correct count)."""
    F = nn.functional
    loss_sum, correct = 0.0, 0
    for _ in range(epochs):
        for x, y in loader:
            logits = model(x)
            loss = F.cross_entropy(logits, y)
            opt.zero_grad()
            loss.backward()
            if explicit:
                model.reduce_gradients()
            if clip is not None:
                optim.clip_grad_norm_(model.parameters(), clip)
            opt.step()
            loss_sum += loss.item() * len(y)
            correct += int((logits.argmax(1) == y).sum().item())
    return loss_sum, correct


def worker_api(folder, resume_from):
    """Rank-local checks in a group of 2; each process writes its failures to rank<r>.json."""
    distributed.init_process_group("cpu", timeout_s=60)
    rank, world = distributed.shard()
    td.set_backend("numpy")
    failures = []

    def check(ok, what):
        if not ok:
            failures.append(what)

    def same(a, b, what, rtol=1e-5, atol=1e-6):
        a, b = np.asarray(a), np.asarray(b)
        check(np.allclose(a, b, rtol=rtol, atol=atol),
              f"{what}: max difference {np.abs(a - b).max()}")

    x, y = _toy()
    data = td.data.TensorDataset(x, y)

    # sharding: disjoint parts of equal size that make up the order
    loader = td.data.DataLoader(data, 8, shuffle=True, generator=3, shard=(rank, world))
    parts = [torch.empty(45, dtype=torch.int64) for _ in range(world)]
    torch.distributed.all_gather(parts, loader.permutation()._data)
    seen = np.concatenate([p.numpy() for p in parts])
    check(sorted(seen.tolist()) == list(range(90)), f"the shards are not a partition: {seen}")

    # the parameters of process 0 everywhere
    model = distributed.DistributedDataParallel(_toy_model(seed=rank))
    for (name, p), q in zip(model.module.named_parameters(), _toy_model(0).parameters()):
        check(np.array_equal(p.numpy(), q.numpy()), f"{name} is not rank 0's")
    check(list(model.state_dict())[0] == "module.0.weight", "state_dict keys lack 'module.'")
    inner = _toy_model(0)
    inner.register_buffer("count", td.tensor([float(rank + 3)]))
    model = distributed.DistributedDataParallel(inner)
    check(inner.count.tolist() == [3.0], f"buffer not broadcast: {inner.count.tolist()}")
    inner.count.add_(rank)  # drifts on process 1; the next forward takes process 0's again
    model(td.tensor(x[:2]))
    check(inner.count.tolist() == [3.0], f"buffer not broadcast at forward: {inner.count}")

    # a user's loop with each optimizer equals one process with the global batch of 16
    for kind, make in _OPTIMIZERS.items():
        for explicit, clip in ((False, None), (True, 0.5)):
            ref = _toy_model(1)  # rank 0's seed below
            ref_stats = _loop(ref, make(list(ref.parameters())),
                              td.data.DataLoader(data, 16, shuffle=True, generator=5), clip=clip)
            model = distributed.DistributedDataParallel(_toy_model(rank + 1))
            stats = _loop(model, make(list(model.parameters())),
                          td.data.DataLoader(data, 8, shuffle=True, generator=5,
                                             shard=(rank, world)), explicit=explicit, clip=clip)
            totals = torch.tensor(stats, dtype=torch.float64)
            torch.distributed.all_reduce(totals)
            what = f"{kind}{' reduce_gradients + clip' if explicit else ''}"
            for p, q in zip(model.parameters(), ref.parameters()):
                same(p.numpy(), q.numpy(), f"{what}: parameters")
            same(totals.numpy(), ref_stats, f"{what}: loss and accuracy summed")

    # the Trainer: replicated model, sharded loader, metrics summed over the processes
    images = np.random.default_rng(1).integers(0, 256, (96, 4, 4)).astype(np.uint8)
    pictures = type("Pictures", (), {"images": images, "labels": np.arange(96) % 5})()
    for fuse in (True, False):
        runs = {}
        for shard in ((rank, world), None):
            td.manual_seed(11)
            model = nn.Sequential(nn.Flatten(), nn.Linear(16, 7), nn.ReLU(), nn.Linear(7, 5))
            opt = optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
            loader = td.data.DataLoader(pictures, 24 if shard is None else 12, shuffle=True,
                                        generator=9, shard=shard)
            if shard is None:  # the reference: one process's loop over the global batches
                stats = _loop(model, opt, loader, epochs=1)
                runs["one"] = (model, stats[0] / 96, stats[1] / 96)
                continue
            trainer = train.Trainer(model, opt, loader, fuse=fuse)
            check(trainer.fused == fuse, f"fuse={fuse} took the other path")
            result = trainer.train_epoch(progress=False)
            runs["two"] = (model, result["loss"], result["accuracy"])
        for p, q in zip(runs["two"][0].parameters(), runs["one"][0].parameters()):
            same(p.numpy(), q.numpy(), f"Trainer fuse={fuse}: parameters")
        same(runs["two"][1:], runs["one"][1:], f"Trainer fuse={fuse}: loss and accuracy")
    try:
        model = _toy_model(0)
        train.Trainer(model, optim.SGD(model.parameters(), lr=0.1),
                      td.data.DataLoader(pictures, 8))
        check(False, "Trainer took an unsharded loader")
    except ValueError as err:
        check("not sharded" in str(err) and "shard=" in str(err), f"Trainer error: {err}")

    # the command line: the global batch must split, and a 1-process checkpoint resumes in 2
    try:
        cli.main(["train", *COMMON, "--epochs", "1", "--batch-size", "129"])
        check(False, "--batch-size 129 was taken by 2 processes")
    except SystemExit as stop:
        check(stop.code == 2, f"--batch-size 129: exit status {stop.code}")
    cli.main(["train", *COMMON, "--epochs", "2", "--resume", resume_from, "--save",
              os.path.join(folder, "one-then-two.tdckpt")])
    check(not torch.distributed.is_initialized(), "the command left the group initialized")
    with open(os.path.join(folder, f"rank{rank}.json"), "w") as f:
        json.dump({"failures": failures}, f)


def test_a_users_loop_and_the_trainer_in_two_processes(one_process, tmp_path):
    """In 2 gloo processes: sharded orders partition the samples; DistributedDataParallel
    starts everyone from process 0's parameters; a user's loop (fused SGD, Adam, a hand-written
    optimizer; reduce_gradients + gradient clipping) and the Trainer (fused and per-op steps)
    end as one process with the global batch, their metrics summed; the command line refuses a
    global batch that does not split, and resumes a 1-process checkpoint in 2 processes."""
    outputs = _run_group(2, "worker_api", tmp_path, one_process[0], timeout=180)
    for rank in range(2):
        failures = json.loads((tmp_path / f"rank{rank}.json").read_text())["failures"]
        assert not failures, f"process {rank}:\n" + "\n".join(failures)
    assert "does not split evenly over 2 processes" in outputs[0][1]
    _assert_same_checkpoint(one_process[1], tmp_path / "one-then-two.tdckpt")


# ---------------------------------------------------------------------- one process, in here
@pytest.fixture
def group_of_one(monkeypatch):
    """This process as a gloo group of one (left again afterwards)."""
    for name, value in dict(RANK=0, WORLD_SIZE=1, LOCAL_RANK=0, MASTER_ADDR="127.0.0.1",
                            MASTER_PORT=_free_port()).items():
        monkeypatch.setenv(name, str(value))
    device = distributed.init_process_group("cpu", timeout_s=30)
    try:
        yield device
    finally:
        distributed.destroy_process_group()


def test_in_a_group_of_one(group_of_one):
    assert group_of_one == torch.device("cpu")
    assert distributed.init_process_group() == group_of_one  # again: the same device
    assert distributed.shard() == (0, 1) and distributed.is_main_process()
    model = distributed.DistributedDataParallel(_toy_model(0))
    assert "world_size=1" in repr(model)
    x, y = (td.tensor(v) for v in _toy(10))
    # a parameter without a gradient counts as a zero one: every process takes the same steps
    opt = optim.SGD(model.parameters(), lr=0.1)
    nn.functional.cross_entropy(model.module[0](x).sum(1, keepdim=True) * model.module[2].bias,
                                y * 0).backward()
    assert model.module[2].weight.grad is None
    opt.step()
    assert np.array_equal(model.module[2].weight.grad.numpy(), np.zeros((5, 9), np.float32))
    with model.no_sync():
        pass
    # an optimizer group mixing replicated and other parameters would drift apart
    extra = td.zeros(3, requires_grad=True)
    mixed = optim.SGD(list(model.parameters()) + [extra], lr=0.1)
    (model(x).sum() + extra.sum()).backward()
    with pytest.raises(RuntimeError, match=r"mixes parameters of a DistributedDataParallel "
                                           r"model with 1 other\(s\) \(shapes \[\(3,\)\]\)"):
        mixed.step()
    with pytest.raises(NotImplementedError, match="process_group= is not supported"):
        distributed.DistributedDataParallel(_toy_model(0), process_group=object())


def test_mistakes_outside_a_group(monkeypatch):
    assert not distributed.is_initialized() and distributed.shard() == (0, 1)
    with pytest.raises(RuntimeError, match=r"no process group; call tritonad.distributed."
                                           r"init_process_group\(\) first"):
        distributed.DistributedDataParallel(_toy_model(0))
    with pytest.raises(TypeError, match="expected a tritonad nn.Module, got list"):
        distributed.DistributedDataParallel([])
    monkeypatch.delenv("RANK", raising=False)
    with pytest.raises(RuntimeError, match="RANK is not set; launch with torchrun"):
        distributed.init_process_group()
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "two")
    with pytest.raises(RuntimeError, match=r"WORLD_SIZE='two' is not an integer"):
        distributed.init_process_group()
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "2")
    for name in ("MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.setenv(name, "1")
    with pytest.raises(RuntimeError, match=r"RANK=2 is not in 0..WORLD_SIZE-1"):
        distributed.init_process_group()
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(ValueError, match="NCCL connects GPUs"):
        distributed.init_process_group("cpu", backend="nccl")
    with pytest.raises(ValueError, match="device 'tpu' is neither cuda nor cpu"):
        distributed.init_process_group("tpu")
    with pytest.raises(ValueError, match="backend 'mpi'; use nccl"):
        distributed.init_process_group("cpu", backend="mpi")
    images = np.zeros((8, 2, 2), np.uint8)
    pictures = type("Pictures", (), {"images": images, "labels": np.arange(8) % 2})()
    model = nn.Sequential(nn.Flatten(), nn.Linear(4, 2))
    with pytest.raises(RuntimeError, match="process 0 of 2 that torchrun started, but there is "
                                           "no process group"):
        train.Trainer(model, optim.SGD(model.parameters(), lr=0.1),
                      td.data.DataLoader(pictures, 4))
    with pytest.raises(AttributeError, match="has no attribute 'DistributedSampler'; use "
                                             r"DataLoader\(..., shard="):
        distributed.DistributedSampler  # noqa: B018


# ---------------------------------------------------------------------- sharded loaders
@pytest.mark.parametrize("n, count", [(90, 2), (91, 2), (10, 3), (7, 7)])
def test_shards_partition_each_epoch(n, count):
    """Every process draws the same order; the parts are disjoint, of equal size, cover all
    but n % count samples, and together give one process's batches; a new order each epoch."""
    x, y = _toy(n)
    data = td.data.TensorDataset(x, y)
    loaders = [td.data.DataLoader(data, 4, shuffle=True, generator=2, shard=(r, count))
               for r in range(count)]
    whole = td.data.DataLoader(data, 4 * count, shuffle=True, generator=2)
    for epoch in range(2):
        order = whole.permutation().numpy()
        parts = [loader.permutation().numpy() for loader in loaders]
        assert all(len(p) == n // count for p in parts)
        merged = np.stack(parts, 1).reshape(-1)  # batch b of all processes = batch b of one
        assert np.array_equal(merged, order[:len(merged)])
        assert len(set(merged.tolist())) == len(merged)
        if epoch == 0:
            first = parts[0]
    assert not np.array_equal(first, parts[0]) or n // count < 2
    assert len(loaders[0]) == -(-(n // count) // 4) and "part 0 of" in repr(loaders[0])


def test_shards_of_other_loaders():
    """No shuffle, the per-sample path and the resident path agree; mistakes are named."""
    x, y = _toy(11)
    plain = td.data.DataLoader(td.data.TensorDataset(x, y), 2, shard=(1, 3))
    assert plain.permutation().tolist() == [1, 4, 7]
    per_sample = type("Samples", (td.data.Dataset,), {"__len__": lambda self: 11,
                                                      "__getitem__": lambda self, i: (x[i], i)})()
    for shuffle in (False, True):
        resident = td.data.DataLoader(td.data.TensorDataset(x, np.arange(11)), 2, shuffle=shuffle,
                                      generator=4, shard=(1, 3))
        samples = td.data.DataLoader(per_sample, 2, shuffle=shuffle, generator=4, shard=(1, 3))
        got = [b[1].tolist() for b in samples]
        assert got == [b[1].tolist() for b in resident] and sum(map(len, got)) == 3
    for bad in ((3, 3), (-1, 2), (0, 0), 2, (0.0, 2), (True, 2), (0, 1, 2)):
        with pytest.raises(ValueError, match=r"shard must be \(rank, count\) with 0 <= rank < "
                                             r"count, got"):
            td.data.DataLoader(td.data.TensorDataset(x, y), 2, shard=bad)
    with pytest.raises(ValueError, match="11 samples cannot be shared by 12 processes"):
        td.data.DataLoader(td.data.TensorDataset(x, y), 2, shard=(0, 12))

    class Stream(td.data.IterableDataset):
        def __iter__(self):
            return iter(range(5))

    with pytest.raises(ValueError, match="an iterable-style dataset cannot be sharded"):
        td.data.DataLoader(Stream(), 2, shard=(0, 2))


# ---------------------------------------------------------------------- GPUs
def worker_nccl_capture(folder):
    """A 1-process NCCL group: the Trainer's captured steps (fused MLP and per-op) with the
    all-reduce recorded in the graph end as the same steps without a group."""
    td.set_backend("triton")
    calls = []
    all_reduce = distributed.dist.all_reduce

    def counting(tensor, *args, **kwargs):
        calls.append(torch.cuda.is_current_stream_capturing())
        return all_reduce(tensor, *args, **kwargs)

    results = {}
    for grouped in (False, True):
        if grouped:
            distributed.init_process_group(timeout_s=60)
            distributed.dist.all_reduce = counting
        for fuse in (True, False):
            td.manual_seed(0)
            model = models.mlp().cuda()
            opt = optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
            loader = td.data.DataLoader(td.data.MNIST(), 100, shuffle=True, device="cuda",
                                        limit=1050, shard=(0, 1) if grouped else None)
            sched = optim.lr_scheduler.CosineAnnealingLR(opt, T_max=2 * len(loader))
            trainer = train.Trainer(model, opt, loader, sched, graph=True, fuse=fuse)
            stats = [trainer.train_epoch(e, 2, progress=False) for e in (1, 2)]
            results[(grouped, fuse)] = ([p.numpy().tolist() for p in model.parameters()],
                                        stats[-1]["loss"], trainer.captured_step.captured)
    distributed.destroy_process_group()
    with open(os.path.join(folder, "nccl.json"), "w") as f:
        json.dump({"results": {repr(k): v for k, v in results.items()},
                   "captured_all_reduces": sum(calls), "all_reduces": len(calls)}, f)


@pytest.mark.gpu
def test_captured_all_reduce_in_a_one_process_nccl_group(tmp_path):
    _run_group(1, "worker_nccl_capture", tmp_path, timeout=400)
    report = json.loads((tmp_path / "nccl.json").read_text())
    results = {k: v for k, v in report["results"].items()}
    assert report["captured_all_reduces"] >= 2, report  # one per captured graph and path
    for fuse in (True, False):
        alone, grouped = results[repr((False, fuse))], results[repr((True, fuse))]
        assert grouped[2] and alone[2], "the step was not captured"
        for a, b in zip(grouped[0], alone[0]):
            assert_close(np.array(a), np.array(b), 1e-5, 1e-6, name=f"fuse={fuse}")
        assert grouped[1] == pytest.approx(alone[1], rel=1e-5)


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_two_gpus_train_as_one(tmp_path, capsys):
    common = ["--model", "cnn", "--limit", "6000", "--batch-size", "200", "--epochs", "1",
              "--quiet"]
    one, two = tmp_path / "one.tdckpt", tmp_path / "two.tdckpt"
    single = _cli_json(capsys, "train", *common, "--save", one)
    out, _ = _torchrun(2, "train", *common, "--save", two, timeout=400)
    report = json.loads(out.strip().splitlines()[-1])
    assert report["processes"] == 2 and report["graph"]
    # TF32 convolutions over other batch splits: close, not equal
    _assert_same_checkpoint(one, two, rtol=1e-2, atol=1e-3)
    assert abs(report["test_accuracy"] - single["test_accuracy"]) < 0.01


if __name__ == "__main__":  # a process of a group started by _run_group
    globals()[sys.argv[1]](*sys.argv[2:])
