"""`bench mnist --cpu`: the numpy backend against PyTorch CPU runs without a GPU and writes its
table; the other benchmarks refuse --cpu with one line; a benchmark's own options pass
through."""
import json
import os

import pytest
from helpers import cli_error

from tritonad import cli

BENCHMARKS = os.path.join(os.path.dirname(__file__), "..", "benchmarks")


@pytest.fixture
def bench_mnist(monkeypatch):
    monkeypatch.syspath_prepend(BENCHMARKS)
    import bench_mnist

    return bench_mnist


def test_bench_cpu_is_for_mnist_only(capsys, tmp_path):
    cli_error(capsys, ["bench", "softmax", "--cpu", "--out", tmp_path], "--cpu",
              "bench mnist --cpu")


def test_bench_mnist_cpu_reaches_the_benchmark(bench_mnist, monkeypatch, tmp_path):
    seen = []
    monkeypatch.setattr(bench_mnist, "main", seen.append)
    cli.main(["bench", "mnist", "--cpu", "--quick", "--out", str(tmp_path)])
    assert seen == [["--out", str(tmp_path), "--quick", "--cpu"]]


def test_bench_passes_a_benchmarks_own_options(monkeypatch, tmp_path, capsys):
    """Options bench does not know go to the one benchmark named (bench conv --layers ...); with
    `all` they are a one-line error, and other commands still refuse unknown options."""
    monkeypatch.syspath_prepend(BENCHMARKS)
    import bench_conv

    seen = []
    monkeypatch.setattr(bench_conv, "main", seen.append)
    cli.main(["bench", "conv", "--layers", "mnist-conv2", "--out", str(tmp_path),
              "--precisions=tf32"])
    assert seen == [["--out", str(tmp_path), "--layers", "mnist-conv2", "--precisions=tf32"]]
    cli_error(capsys, ["bench", "all", "--layers", "mnist-conv2", "--out", tmp_path],
              "bench all: --layers mnist-conv2 are options of one benchmark")
    cli_error(capsys, ["train", "--layers", "x"], "unrecognized arguments: --layers x")


def test_bench_mnist_cpu_table(bench_mnist, tmp_path, capsys):
    """One round of one step and one evaluation of the mlp, for both frameworks; the backend
    and PyTorch's thread count are left as they were."""
    import torch

    import tritonad as td

    before = (td.get_backend().name, torch.get_num_threads())
    rows = bench_mnist.main(["--cpu", "--models", "mlp", "--steps", "1", "--rounds", "1",
                             "--out", str(tmp_path)])
    assert [r["measure"] for r in rows] == ["train step (batch 128)",
                                            "test evaluation (10000 images)"]
    for r in rows:
        assert r["tritonad_ms"] > 0 and r["torch_ms"] > 0
        assert r["ratio"] == pytest.approx(r["tritonad_ms"] / r["torch_ms"])
    saved = json.loads((tmp_path / "bench_mnist_cpu.json").read_text())
    assert saved["rows"] == rows and saved["meta"]["threads"] >= 1
    assert "tritonad / PyTorch time" in capsys.readouterr().out
    assert (td.get_backend().name, torch.get_num_threads()) == before


def test_bench_says_where_the_plans_came_from(monkeypatch):
    """The line bench prints after its tables (the tuners only run on a GPU: the interpreter
    has one plan, so their records are set here)."""
    from tritonad.kernels import conv, matmul, tuning

    for t in tuning.Tuner.ALL:
        monkeypatch.setattr(t, "sources", {})
    assert cli._plan_sources() == ""
    monkeypatch.setattr(matmul.tuner, "sources", {"a": "table", "b": "table", "c": "heuristic"})
    monkeypatch.setattr(conv.tuner, "sources", {"d": "tuned"})
    assert cli._plan_sources() == ("plans: matmul 1 by the shape heuristic, 2 from the shipped "
                                   "table; conv 1 tuned now")


def test_bench_pair_alternates_and_takes_medians(monkeypatch):
    """bench_pair times both sides each round, the first side changing every round, and
    returns each side's median (an outlying round of either side does not move it)."""
    monkeypatch.syspath_prepend(BENCHMARKS)
    import common

    def ours():
        pass

    def theirs():
        pass

    calls, times = [], {ours: iter([5.0, 1.0, 2.0]), theirs: iter([3.0, 4.0, 90.0])}

    def timer(fn):
        calls.append("ours" if fn is ours else "theirs")
        return next(times[fn])

    assert common.bench_pair(ours, theirs, rounds=3, timer=timer) == (2.0, 4.0)
    assert calls == ["ours", "theirs", "theirs", "ours", "ours", "theirs"]
