"""Start-up (issue 15): a first run compiles ahead and concurrently, plans need no tuning, the
import stays light, and `train` says where its start-up time went."""
import json
import subprocess
import sys

import numpy as np
import pytest

import tritonad as td
from tritonad import optim, train


def _tiny(name):
    nn = td.nn
    if name == "mlp":  # fused by the Trainer
        return nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.ReLU(), nn.Linear(16, 10))
    return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                         nn.Linear(64, 10))


@pytest.mark.parametrize("model_name", ["mlp", "conv"])
def test_precompile_is_a_dry_run(model_name):
    """Trainer.precompile runs a training step and an evaluation batch for their kernels only
    (kernels.launch.compile_ahead; under the interpreter nothing compiles): the parameters,
    their gradients, the metrics, the random numbers and the plan caches are left as they were,
    and training afterwards is unchanged."""
    from tritonad.kernels import launch, plans

    with td.use_backend("triton"):
        class Tiny:
            images = np.random.default_rng(0).integers(0, 255, (20, 8, 8), dtype=np.uint8)
            labels = np.arange(20) % 10
            MEAN, STD = 0.1, 0.3

        def trainer():
            td.manual_seed(1)
            model = _tiny(model_name)
            loader = td.data.DataLoader(Tiny(), 8, shuffle=True)
            return train.Trainer(model, optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                 loader), loader

        plain, _ = trainer()
        plain.train_epoch(progress=False)
        ahead, loader = trainer()
        before = [p.numpy().copy() for p in ahead.model.parameters()]
        rng = td.get_rng_state()
        plans_before = {id(c): len(c) for c in plans.PlanCache.ALL}
        plans.clear_plans()
        assert ahead.precompile(loader) == 0  # nothing to compile under the interpreter
        assert all(len(c) == 0 for c in plans.PlanCache.ALL), "a dry run kept a plan"
        assert td.get_rng_state() == rng and plans_before
        assert all(p.grad is None for p in ahead.model.parameters())
        for p, b in zip(ahead.model.parameters(), before):
            np.testing.assert_array_equal(p.numpy(), b)
        assert ahead.loss_sum.item() == 0 and ahead.correct.item() == 0
        ahead.train_epoch(progress=False)
        for p, q in zip(ahead.model.parameters(), plain.model.parameters()):
            np.testing.assert_allclose(p.numpy(), q.numpy(), rtol=1e-6, atol=1e-7)


def test_import_loads_nothing_it_does_not_need():
    """`import tritonad` brings torch, triton and numpy, not the command line, plotting, image
    decoding, the test or benchmark tools, the progress bar. `import torch` loads tqdm itself
    where it is installed (torch.hub): what torch loaded is forgotten before tritonad imports."""
    code = ("import sys, torch; heavy = ['matplotlib', 'PIL', 'tritonad.cli', 'tritonad.predict', "
            "'hypothesis', 'pytest', 'scipy', 'bench_mnist', 'common', 'tqdm']; "
            "[sys.modules.pop(m) for m in list(sys.modules) if m.split('.')[0] in heavy]; "
            "import tritonad; print([m for m in heavy if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]"


def test_train_reports_where_the_start_up_time_went(capsys):
    from tritonad import cli

    cli.main(["train", "--model", "logreg", "--epochs", "1", "--limit", "300", "--backend",
              "numpy"])
    captured = capsys.readouterr()
    line = next(l for l in captured.err.splitlines() if l.startswith("start-up:"))
    for phase in ("import", "data", "compile ahead", "tune", "capture", "first epoch"):
        assert phase in line
    startup = json.loads(captured.out.strip().splitlines()[-1])["startup"]
    assert set(startup) >= {"import", "data", "compile", "tune", "capture", "first_epoch",
                            "kernels_compiled_ahead", "plans"}
    assert startup["tune"] == 0 and startup["first_epoch"] > 0


def test_tuning_is_opt_in(monkeypatch):
    assert not td.autotuning()  # the default: shipped plans or the heuristic, no timing
    td.autotune(True)
    try:
        assert td.autotuning()
    finally:
        td.autotune(False)
    env = dict(__import__("os").environ, TRITONAD_AUTOTUNE="1")
    out = subprocess.run([sys.executable, "-c", "import tritonad; print(tritonad.autotuning())"],
                         capture_output=True, text=True, env=env, check=True).stdout
    assert out.strip() == "True"
