"""The recipe benchmarks (benchmarks/torch_gpt.py, torch_resnet.py, bench_gpt.py,
bench_resnet.py): PyTorch's scripts hold tritonad's recipes (the same models, given the same
weights, compute the same losses; the same schedules, vocabulary, data and augmentation), they
run a few steps on the CPU at tiny sizes, and the benchmarks parse their options, run
tritonad's side through their workers and compute their ratios."""
import math
import os
import sys

import numpy as np
import pytest
import torch

import tritonad as td
from tritonad import cli, corpus, gpt, models, resnet

BENCHMARKS = os.path.join(os.path.dirname(__file__), "..", "benchmarks")
TINY_GPT = dict(layers=2, heads=2, width=16, context=12, dropout=0.0)
TINY_GPT_ARGS = ["--device", "cpu", "--layers", "1", "--heads", "2", "--width", "16",
                 "--context", "12", "--batch", "4", "--warmup", "2", "--eval-batches", "1"]
TINY_RESNET_ARGS = ["--device", "cpu", "--batch", "16", "--limit", "48", "--test-limit", "40",
                    "--widths", "4,8,8,8"]


@pytest.fixture
def bench(monkeypatch):
    monkeypatch.syspath_prepend(BENCHMARKS)
    import bench_gpt
    import bench_resnet
    import recipe_bench
    import torch_gpt
    import torch_resnet

    return type("Modules", (), dict(gpt=bench_gpt, resnet=bench_resnet, rb=recipe_bench,
                                    torch_gpt=torch_gpt, torch_resnet=torch_resnet))


def _copy_into(theirs, ours):
    """tritonad's parameters and buffers into the PyTorch module of the same names."""
    state = {k: torch.from_numpy(np.array(v.cpu().numpy())) for k, v in ours.state_dict().items()}
    missing = set(theirs.state_dict()) - set(state) - {"head.weight"}  # (tied: tok.weight)
    assert not missing, missing
    theirs.load_state_dict({k: state.get(k, state.get("tok.weight")) for k in
                            theirs.state_dict()}, strict=True)


def test_the_pytorch_gpt_is_tritonads(bench):
    """Same parameter names and shapes; given the same weights, the same loss (eval mode);
    the head is the token embedding; the init is the recipe's."""
    with td.use_backend("numpy"):
        td.manual_seed(0)
        ours = gpt.GPT(20, **TINY_GPT).eval()
        theirs = bench.torch_gpt.GPT(20, **TINY_GPT).eval()
        assert [(n, tuple(p.shape)) for n, p in ours.named_parameters()] == \
            [(n, tuple(p.shape)) for n, p in theirs.named_parameters()]
        assert theirs.head.weight is theirs.tok.weight
        _copy_into(theirs, ours)
        rng = np.random.default_rng(0)
        x, y = rng.integers(0, 20, (3, 12)), rng.integers(0, 20, (3, 12))
        with td.no_grad():
            want = ours(td.tensor(x), td.tensor(y))[1].item()
        with torch.no_grad():
            got = theirs(torch.from_numpy(x), torch.from_numpy(y)).item()
            last = theirs(torch.from_numpy(x))  # sampling: the last position's logits
        assert got == pytest.approx(want, rel=1e-5)
        with td.no_grad():
            np.testing.assert_allclose(last.numpy(), ours(td.tensor(x)).numpy()[:, -1],
                                       rtol=1e-4, atol=1e-5)
    torch.manual_seed(0)
    big = bench.torch_gpt.GPT(20, layers=2, heads=2, width=64, context=12)
    for name, p in big.named_parameters():
        std = p.detach().std().item()
        if name.endswith("bias"):
            assert not p.detach().any(), name
        elif name.endswith("proj.weight"):
            assert std == pytest.approx(0.02 / math.sqrt(4), rel=0.1), name
        elif p.ndim >= 2:
            assert std == pytest.approx(0.02, rel=0.1), name
        else:
            assert (p.detach() == 1).all(), name  # LayerNorm weights
    groups = big.decay_groups(0.1)
    assert [g["weight_decay"] for g in groups] == [0.1, 0.0]
    assert all(p.ndim >= 2 for p in groups[0]["params"]) and \
        all(p.ndim < 2 for p in groups[1]["params"])


def test_the_pytorch_resnet_is_tritonads(bench):
    """Same names and shapes; the same weights give the same logits in training mode (batch
    statistics) and eval mode (running statistics)."""
    widths = (4, 8, 8, 8)
    with td.use_backend("numpy"):
        td.manual_seed(0)
        ours = models.ResNet(widths=widths)
        theirs = bench.torch_resnet.ResNet(widths=widths)
        assert [(n, tuple(p.shape)) for n, p in ours.named_parameters()] == \
            [(n, tuple(p.shape)) for n, p in theirs.named_parameters()]
        _copy_into(theirs, ours)
        x = np.random.default_rng(1).standard_normal((5, 1, 28, 28)).astype(np.float32)
        for train in (True, False):
            ours.train(train)
            theirs.train(train)
            with td.no_grad():
                want = ours(td.tensor(x)).numpy()
            with torch.no_grad():
                got = theirs(torch.from_numpy(x).contiguous(
                    memory_format=torch.channels_last)).numpy()
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_the_schedules_data_and_augmentation_are_tritonads(bench):
    for s in (0, 1, 50, 99, 100, 101, 1000, 1998, 1999, 2500):
        assert bench.torch_gpt.lr_factor(s, 2000, 100, 1e-3, 1e-4) == \
            gpt.lr_factor(s, 2000, 100, 1e-3, 1e-4)
    for s in (0, 1, 279, 280, 281, 1000, 1403):
        assert bench.torch_resnet.lr_factor(s, 1404, 0.2) == resnet.lr_factor(s, 1404, 0.2)
    assert bench.torch_gpt.RECIPE.items() >= gpt.RECIPE.items()
    assert bench.torch_resnet.RECIPE == resnet.RECIPE
    ids, vocab = bench.torch_gpt.read_corpus()
    text = corpus.Shakespeare()
    assert vocab == text.vocab and len(vocab) == 84 and np.array_equal(ids, text.ids)

    images, labels = bench.torch_resnet.load(bench.torch_resnet._folder(None), "t10k", "cpu",
                                             limit=50)
    test = td.data.FashionMNIST(train=False)
    assert (bench.torch_resnet.MEAN, bench.torch_resnet.STD) == (test.MEAN, test.STD)
    np.testing.assert_allclose(images[:, 0].numpy(),
                               (test.images[:50] / 255 - test.MEAN) / test.STD, atol=1e-5)
    assert labels.dtype == torch.int64 and labels.tolist() == test.labels[:50].tolist()

    torch.manual_seed(0)
    x = torch.arange(6 * 5 * 7, dtype=torch.float32).reshape(6, 1, 5, 7) + 1
    out = bench.torch_resnet.augment(x, 2)
    padded = torch.nn.functional.pad(x, (2, 2, 2, 2))
    seen = set()
    for got, image in zip(out, padded):  # a 5x7 window of the padded image, perhaps mirrored
        found = [(dy, dx, f) for dy in range(5) for dx in range(5) for f in (0, 1)
                 if torch.equal(got, image[:, dy:dy + 5, dx:dx + 7].flip(2) if f
                                else image[:, dy:dy + 5, dx:dx + 7])]
        assert found, got
        seen.update(found)
    assert len(seen) > 3  # each image its own offset


def test_the_pytorch_scripts_run_a_few_steps_on_the_cpu(bench, capsys):
    result = bench.torch_gpt.main(TINY_GPT_ARGS + ["--mode", "eager-bf16", "--steps", "3",
                                                   "--eval-every", "2", "--generate", "4"])
    assert [h["step"] for h in result["history"]] == [2, 3] and result["steady"]
    assert result["step_ms"] == pytest.approx(1e3 * result["history"][1]["seconds"])
    assert np.isfinite(result["val_loss"]) and result["wall_s"] > result["startup"]["data"]
    assert result["generate"]["text"].startswith("ROMEO:") and \
        len(result["generate"]["text"]) == 10 and result["generate"]["tokens_per_s"] > 0
    result = bench.torch_resnet.main(TINY_RESNET_ARGS + ["--mode", "eager-fp32",
                                                         "--epochs", "2"])
    assert len(result["epoch_seconds"]) == 2 and result["epoch_s"] == result["epoch_seconds"][1]
    assert all(0 <= a <= 1 for a in result["test_accuracies"])
    assert len(capsys.readouterr().out.splitlines()) == 2  # one JSON line each on stdout
    for script, argv in ((bench.torch_gpt, ["--steps", "0"]),
                         (bench.torch_resnet, ["--widths", "4"]),
                         (bench.torch_resnet, ["--mode", "compile-fp16"])):
        with pytest.raises(SystemExit):
            script.parse_args(argv)


def test_the_bench_workers_run_tritonads_recipes(bench):
    with td.use_backend("numpy"):
        result = bench.gpt.worker(dict(
            precision="fp32", seed=0, steps=4, eval_every=2, eval_batches=1, generate=5,
            device="cpu", backend="numpy", batch=4,
            overrides=dict(layers=1, heads=2, width=16, context=12, warmup=2)))
        assert result["steady"] and result["step_ms"] > 0 and np.isfinite(result["val_loss"])
        assert result["generate"]["text"].startswith("ROMEO:") and \
            len(result["generate"]["text"]) == 11
        result = bench.resnet.worker(dict(precision="fp32", seed=0, epochs=2, device="cpu",
                                          backend="numpy", batch=16, limit=32, test_limit=20,
                                          widths=[4, 8, 8, 8]))
        assert result["epoch_s"] == result["epoch_seconds"][1] and result["steady"]
        assert 0 <= result["test_accuracy"] <= 1


def test_the_tables_average_seeds_and_take_ratios(bench):
    runs = [dict(framework="tritonad", mode="bf16", step_ms=4.0, val_loss=1.40, wall_s=20.0,
                 generate={"tokens_per_s": 3000.0}),
            dict(framework="tritonad", mode="bf16", step_ms=6.0, val_loss=1.42, wall_s=22.0),
            dict(framework="tritonad", mode="fp32", step_ms=10.0, val_loss=1.41, wall_s=30.0),
            dict(framework="torch", mode="eager-fp32", step_ms=30.0, val_loss=1.40, wall_s=70.0,
                 generate={"tokens_per_s": 500.0}),
            dict(framework="torch", mode="eager-bf16", step_ms=10.0, val_loss=1.39, wall_s=25.0,
                 generate={"tokens_per_s": 600.0}),
            dict(framework="torch", mode="compile-bf16", step_ms=12.0, val_loss=1.39,
                 wall_s=84.0)]
    rows = {r["mode"]: r for r in bench.gpt.table(runs)}
    assert rows["bf16"]["seeds"] == 2 and rows["bf16"]["step_ms"] == 5.0
    assert rows["bf16"]["ratio"] == 2.0 and rows["bf16"]["vs"] == "eager-bf16"
    assert rows["fp32"]["ratio"] == 1.0
    assert rows["bf16"]["quality_delta"] == pytest.approx(0.02)
    assert rows["eager-fp32"]["ratio"] == 3.0 and rows["eager-bf16"]["ratio"] == 2.0
    assert rows["compile-bf16"]["ratio"] == pytest.approx(2.4)
    assert rows["compile-bf16"]["wall_ratio"] == 4.0
    assert rows["eager-fp32"]["generate_ratio"] == 6.0 and rows["eager-bf16"]["generate_ratio"] \
        == 5.0 and "generate_ratio" not in rows["compile-bf16"]
    runs = [dict(framework="tritonad", mode="bf16", epoch_s=0.3, first_epoch_s=5.0,
                 test_accuracy=0.94, wall_s=10.0),
            dict(framework="torch", mode="eager-fp32", epoch_s=2.1, first_epoch_s=3.0,
                 test_accuracy=0.945, wall_s=30.0)]
    rows = {r["mode"]: r for r in bench.resnet.table(runs)}
    assert rows["eager-fp32"]["ratio"] == pytest.approx(7.0)  # (no fp32 run: against bf16)
    assert rows["bf16"]["ratio"] == pytest.approx(7.0) and "quality_delta" not in rows["bf16"]


def test_the_benchmarks_parse_their_options_and_run_in_processes(bench, monkeypatch, tmp_path):
    args = bench.gpt.parse(["--quick"])
    assert (args.steps, args.eval_every, args.seeds, args.generate) == (200, 50, 1, 500)
    assert args.modes == ("eager-fp32", "eager-bf16", "compile-bf16")
    args = bench.gpt.parse(["--steps", "300", "--precisions", "bf16", "--modes", "eager-bf16"])
    assert (args.steps, args.eval_every, args.seeds, args.precisions) == (300, 250, 2, ("bf16",))
    args = bench.resnet.parse(["--out", str(tmp_path)])
    assert (args.epochs, args.seed_list) == (12, [0, 1, 2])
    assert bench.resnet.parse(["--quick"]).epochs == 2
    assert bench.resnet.parse(["--first-seed", "2", "--seeds", "1"]).seed_list == [2]
    for parse, argv in ((bench.gpt.parse, ["--modes", "eager-fp16"]),
                        (bench.resnet.parse, ["--seeds", "0"]),
                        (bench.resnet.parse, ["--precisions", "fp8"])):
        with pytest.raises(SystemExit):
            parse(argv)
    assert {"gpt", "resnet"} <= set(cli.BENCHMARKS)
    seen = []
    monkeypatch.setattr(bench.gpt, "main", seen.append)
    cli.main(["bench", "gpt", "--quick", "--seeds", "2", "--out", str(tmp_path)])
    assert seen == [["--out", str(tmp_path), "--quick", "--seeds", "2"]]
    ok = bench.rb.run_json([sys.executable, "-c", "print('x'); print('{\"a\": 1}')"])
    assert ok["a"] == 1 and ok["process_s"] > 0
    assert bench.rb.run_json([sys.executable, "-c", "raise SystemExit(3)"]) is None


@pytest.mark.gpu
def test_the_recipe_benchmarks_run_on_the_gpu(bench, tmp_path):
    """A few steps of each side, each in a fresh process as `bench gpt` / `bench resnet` run
    them, torch.compile included (a few minutes on an H200)."""
    rows = bench.gpt.main(["--steps", "6", "--eval-every", "3", "--seeds", "1", "--modes",
                           "eager-bf16,compile-bf16", "--precisions", "bf16", "--generate", "10",
                           "--out", str(tmp_path)])
    by_mode = {r["mode"]: r for r in rows}
    assert set(by_mode) == {"bf16", "eager-bf16", "compile-bf16"}
    assert all(np.isfinite(r["val_loss"]) and r["ratio"] > 0 for r in rows)
    assert by_mode["eager-bf16"]["generate_ratio"] > 0
    assert (tmp_path / "bench_gpt.json").is_file()
    rows = bench.resnet.main(["--epochs", "2", "--seeds", "1", "--modes",
                              "eager-fp32,compile-bf16", "--out", str(tmp_path)])
    assert [r["mode"] for r in rows] == ["bf16", "fp32", "eager-fp32", "compile-bf16"]
    assert all(0.5 < r["test_accuracy"] <= 1 and r["ratio"] > 0 for r in rows)
