"""tritonad.gpt: the recipe's model at a small size: its key/value-cache sampling gives the
logits of a full forward, the head is tied to the token embedding, a few training steps lower
the loss on both backends, and `generate` streams from a checkpoint."""
import numpy as np
import pytest

import tritonad as td
from tritonad import cli, corpus, gpt

TEXT = "to be, or not to be, that is the question:\nwhether 'tis nobler in the mind to suffer\n"
SMALL = dict(layers=2, heads=2, width=16, context=12, dropout=0.0)


def _model(seed=0):
    td.manual_seed(seed)
    return gpt.GPT(len(set(TEXT)), **SMALL)


def test_the_head_is_the_token_embedding():
    model = _model()
    assert model.head.weight is model.tok.weight
    names = [n for n, _ in model.named_parameters()]
    assert "tok.weight" in names and "head.weight" not in names
    assert model.blocks[0].attn.proj.weight.numpy().std() < 0.02  # 0.02 / sqrt(2 * layers)


def test_the_cache_gives_the_full_forwards_logits(backend_name):
    with td.use_backend(backend_name):
        model = _model().eval()
        ids = td.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])
        with td.no_grad():
            full = model(ids).numpy()
            caches = [{} for _ in model.blocks]
            steps = [model(ids[:, :3], caches=caches, start=0).numpy()[:, -1]]
            for t in range(3, 8):
                steps.append(model(ids[:, t:t + 1], caches=caches, start=t).numpy()[:, -1])
        np.testing.assert_allclose(np.stack(steps, 1)[0], full[0, 2:], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("backend", ["numpy", pytest.param("triton", marks=pytest.mark.gpu)])
def test_a_few_steps_lower_the_loss(backend):  # (the interpreter takes 25 s: GPU tier)
    with td.use_backend(backend):
        text = corpus.CharCorpus(TEXT * 4)
        _, history = gpt.train(text, td.get_backend().default_device, steps=6, batch=4,
                               precision="fp32", eval_every=3, eval_batches=1,
                               **dict(SMALL, warmup=2, lr=3e-2))
        assert len(history) == 2 and history[-1]["train_loss"] < history[0]["train_loss"]
        assert np.isfinite(history[-1]["val_loss"]) and history[-1]["tokens_per_s"] > 0
        with pytest.raises(ValueError, match="precision must be fp32, bf16 or fp16"):
            gpt.train(text, "cpu", steps=1, precision="fp8")


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_low_precision_steps_follow_fp32(precision):
    """Autocast (and for fp16 the GradScaler, its step taken) on the numpy backend: the losses
    of the first steps stay within half-precision noise of fp32's, dropout on."""
    text = corpus.CharCorpus(TEXT * 4)
    settings = dict(SMALL, dropout=0.1, warmup=2, lr=3e-2)
    losses = {}
    for p in ("fp32", precision):
        startup = {}
        _, history = gpt.train(text, "cpu", steps=3, batch=4, precision=p, eval_every=1,
                               eval_batches=1, startup=startup, **settings)
        losses[p] = [e["train_loss"] for e in history]
        assert startup["graph"] is False and startup["first_step"] > 0
    np.testing.assert_allclose(losses[precision], losses["fp32"], rtol=2e-2)


def _gpu_losses(graph, precision, steps=20):
    text = corpus.CharCorpus(TEXT * 40)
    startup = {}
    _, history = gpt.train(text, "cuda", steps=steps, batch=8, precision=precision,
                           eval_every=1, eval_batches=1, graph=graph, startup=startup,
                           **dict(SMALL, context=32, dropout=0.2, warmup=5, lr=1e-2))
    assert startup["graph"] is graph
    return [e["train_loss"] for e in history], [e["val_loss"] for e in history], startup


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["bf16", "fp16", "fp32"])
def test_captured_steps_give_the_eager_losses(precision):
    """The whole step captured (random windows, dropout, clip, AdamW with the scheduled lr, the
    GradScaler) draws what the eager step draws: the first 20 losses agree within bf16 noise,
    and the validation pass between the replays (every step here) leaves the graph intact."""
    with td.use_backend("triton"):
        eager, eager_val, _ = _gpu_losses(False, precision)
        captured, captured_val, startup = _gpu_losses(True, precision)
    assert startup["capture"] > 0
    np.testing.assert_allclose(captured, eager, rtol=2e-2, atol=2e-2)
    np.testing.assert_allclose(captured_val, eager_val, rtol=2e-2, atol=2e-2)
    assert captured[-1] < captured[0]


def test_generate_streams_past_the_context_and_from_the_command_line(tmp_path, capsys):
    td.set_backend("numpy")
    model = _model()
    vocab = corpus.CharCorpus(TEXT)
    got = []
    td.manual_seed(5)
    ids = model.generate(td.tensor([vocab.encode("to be")]), 20, 0.8, 5, emit=got.append)
    assert len(ids) == 25 and ids[5:] == got and all(0 <= i < vocab.vocab_size for i in ids)
    path = tmp_path / "tiny.tdckpt"
    td.save({"format": "tritonad-gpt", "model": model.state_dict(), "config": model.config,
             "vocab": "".join(vocab.vocab), "history": []}, path)
    cli.main(["generate", "--checkpoint", str(path), "--prompt", "to be", "--tokens", "20",
              "--top-k", "5", "--seed", "5", "--backend", "numpy"])
    out = capsys.readouterr().out
    assert out == "to be" + vocab.decode(got) + "\n"
    with pytest.raises(SystemExit):
        cli.main(["generate", "--checkpoint", str(path), "--prompt", "€", "--backend", "numpy"])
    assert "--prompt: the checkpoint's vocabulary: characters ['€']" in capsys.readouterr().err
