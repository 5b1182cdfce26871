"""scripts/compile_check.py: the kernels a CPU run launched under the interpreter compile for a
GPU (sm_90) on a machine without one, the elementwise table's formulas included (a launch names
its formula, which the check makes again in its own process)."""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROGRAM = """
import tritonad as td
import tritonad.nn.functional as F
td.set_backend("triton")
x = td.randn(5, 7, requires_grad=True)
F.gelu(x, approximate="tanh").sum().backward()
"""


def test_a_table_formula_launch_compiles_for_the_gpu(tmp_path):
    notes = tmp_path / "kernels.jsonl"
    env = dict(os.environ, TRITONAD_NOTE_KERNELS=str(notes), PYTHONPATH=ROOT,
               TRITON_INTERPRET="1")
    subprocess.run([sys.executable, "-c", PROGRAM], env=env, check=True, cwd=ROOT,
                   timeout=300)
    entries = [json.loads(line) for line in notes.read_text().splitlines()]
    formulas = {e["constexprs"]["FN"]["formula"] for e in entries
                if e["name"] == "_elementwise_kernel" and e["constexprs"].get("FN")}
    assert {"gelu_tanh", "gelu_tanh_backward_x"} <= formulas
    done = subprocess.run([sys.executable, "scripts/compile_check.py", str(notes), "-j", "1"],
                          env=dict(os.environ, PYTHONPATH=ROOT), cwd=ROOT, timeout=600,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert " 0 failed" in done.stdout
