"""examples/: the PyTorch MNIST script and its tritonad port differ only in their import lines
(and docstring), and both run, here on a few hundred images on the CPU."""
import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
EXAMPLES = ROOT / "examples"


def body(path):
    """The script without its docstring and imports: what must not change in a port."""
    tree = ast.parse(path.read_text())
    kept = [node for node in tree.body
            if not isinstance(node, (ast.Import, ast.ImportFrom, ast.Try))
            and not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant))]
    return [ast.unparse(node) for node in kept]


def test_the_port_changes_import_lines_only():
    torch_script, port = EXAMPLES / "mnist_pytorch.py", EXAMPLES / "mnist_tritonad.py"
    assert body(torch_script) == body(port)
    assert len(body(port)) >= 5  # Net, train, test, main and the __main__ guard


@pytest.mark.parametrize("script", ["mnist_tritonad.py", "mnist_pytorch.py"])
def test_the_scripts_train_on_the_cpu(script, tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT), TRITONAD_DATA="")
    env.pop("TRITON_INTERPRET", None)  # --no-accel: the numpy backend, no interpreter needed
    out = subprocess.run([sys.executable, str(EXAMPLES / script), "--data", str(ROOT / "data"),
                          "--no-accel", "--limit", "192", "--epochs", "2", "--quiet",
                          "--save-model"], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert len(result["accuracies"]) == 2 and 0.15 < result["accuracy"] <= 1  # it learns
    assert (tmp_path / "mnist_cnn.pt").stat().st_size > 4 * 1_199_882  # every weight saved
