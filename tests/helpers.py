"""One checker for every op: a backend primitive or a differentiable op against the numpy
reference, forward and backward under a random cotangent, with readable failure messages."""
from __future__ import annotations

import numpy as np
import torch

import tritonad as td
from tritonad import dtypes
from tritonad.reference import from_numpy as raw_from_numpy
from tritonad.reference import to_numpy

# relative and absolute tolerances by dtype (kernels against the float64 reference)
TOLERANCE = {
    "float64": (1e-10, 1e-12),
    "float32": (1e-5, 1e-6),
    "tf32": (1e-3, 1e-4),
    "float16": (5e-3, 1e-3),
    "bfloat16": (3e-2, 1e-2),
}


def tolerance(dtype):
    name = dtype if isinstance(dtype, str) else dtypes.get_dtype(dtype).name
    return TOLERANCE.get(name, (0, 0))


def as_numpy(x):
    """Values of a Tensor, a raw torch array, or anything numpy takes, as float64 or exact ints."""
    if isinstance(x, td.Tensor):
        x = x.numpy()
    elif isinstance(x, torch.Tensor):
        x = to_numpy(x.detach().cpu())
    a = np.asarray(x)
    return a.astype(np.float64) if a.dtype.kind == "f" else a


def assert_close(actual, expected, rtol=1e-5, atol=1e-6, name="value", equal_nan=True):
    """Values agree within rtol/atol; on failure say how many differ and where."""
    a, e = as_numpy(actual), as_numpy(expected)
    assert a.shape == e.shape, f"{name}: shape {a.shape} != expected {e.shape}"
    a, e = np.atleast_1d(a), np.atleast_1d(e)
    assert a.shape == e.shape, f"{name}: shape {a.shape} != expected {e.shape}"
    if a.dtype.kind in "biu" and e.dtype.kind in "biu":
        bad = a != e
    else:
        bad = ~np.isclose(a, e, rtol=rtol, atol=atol, equal_nan=equal_nan)
    if bad.any():
        where = list(zip(*np.nonzero(bad)))[:5]
        detail = "; ".join(f"{tuple(int(j) for j in i)}: got {a[i]!r} expected {e[i]!r}"
                           for i in where)
        raise AssertionError(f"{name}: {int(bad.sum())} of {bad.size} elements differ "
                             f"(rtol={rtol}, atol={atol}); first: {detail}")


def reference_inputs(args, upcast=True):
    """CPU copies of raw arrays for the numpy backend (floats widened to float64 if upcast)."""
    out = []
    for a in args:
        if isinstance(a, torch.Tensor):
            v = to_numpy(a.detach().cpu())
            kind = dtypes.get_dtype(a.dtype)
            target = dtypes.float64 if (upcast and kind.is_floating_point) else kind
            out.append(raw_from_numpy(np.array(v), target))
        else:
            out.append(a)
    return out


def check_primitive(name, *args, rtol=None, atol=None, upcast=True, check_dtype=True, **kwargs):
    """Run backend primitive `name` on the current (triton) backend and on the numpy reference
    (inputs widened to float64 when upcast) and compare every output. Returns the outputs."""
    got = getattr(td.get_backend(), name)(*args, **kwargs)
    ref = getattr(td.reference.NumpyBackend(), name)(*reference_inputs(args, upcast), **kwargs)
    got_t = got if isinstance(got, tuple) else (got,)
    ref_t = ref if isinstance(ref, tuple) else (ref,)
    float_in = [a for a in args if isinstance(a, torch.Tensor) and a.dtype.is_floating_point]
    default = tolerance(float_in[0].dtype) if float_in else (0, 0)
    for i, (g, r) in enumerate(zip(got_t, ref_t)):
        if g is None or r is None:
            assert g is None and r is None, f"{name}: output {i} is {g!r}, reference {r!r}"
            continue
        if check_dtype and not upcast:
            assert g.dtype == r.dtype, f"{name}: output {i} dtype {g.dtype} != reference {r.dtype}"
        assert_close(g, r, rtol if rtol is not None else default[0],
                     atol if atol is not None else default[1], name=f"{name} output {i}")
    return got


def random_array(shape, dtype=dtypes.float32, device=None, low=-3.0, high=3.0, seed=0):
    """A raw torch array of random values (integers in [low, high) for integer dtypes)."""
    rng = np.random.default_rng(seed)
    dtype = dtypes.get_dtype(dtype)
    if dtype is dtypes.bool_:
        values = rng.random(shape) < 0.5
    elif dtype.is_floating_point:
        values = rng.uniform(low, high, size=shape)
    else:
        values = rng.integers(int(low), int(high), size=shape)
    raw = raw_from_numpy(np.asarray(values), dtype)
    return raw.to(device or td.get_backend().default_device)


def check_op(fn, *inputs, rtol=None, atol=None, seed=0):
    """Compare a differentiable op on the current backend with the numpy backend in float64:
    the forward values, then the gradients of every float input under a random cotangent.

    inputs: numpy arrays (float ones become leaves that require grad) or other arguments.
    """
    dtype = td.float32
    rng = np.random.default_rng(seed)

    def run(backend, as_dtype):
        with td.use_backend(backend):
            leaves = [td.tensor(x, dtype=as_dtype).requires_grad_() if
                      isinstance(x, np.ndarray) and x.dtype.kind == "f" else
                      (td.tensor(x) if isinstance(x, np.ndarray) else x) for x in inputs]
            out = fn(*leaves)
            outs = out if isinstance(out, tuple) else (out,)
            cot = [rng_cot[i] for i in range(len(outs))]
            wanted = [t for t in leaves if isinstance(t, td.Tensor) and t.requires_grad]
            live = [(o, td.tensor(c, dtype=o.dtype)) for o, c in zip(outs, cot) if o.requires_grad]
            grads = td.grad([o for o, _ in live], wanted, [c for _, c in live],
                            allow_unused=True) if live and wanted else []
            return [o.numpy() for o in outs], [None if g is None else g.numpy() for g in grads]

    with td.no_grad():
        with td.use_backend("numpy"):
            probe = fn(*[td.tensor(x, dtype=td.float64) if isinstance(x, np.ndarray) and
                         x.dtype.kind == "f" else (td.tensor(x) if isinstance(x, np.ndarray)
                                                   else x) for x in inputs])
    probe = probe if isinstance(probe, tuple) else (probe,)
    rng_cot = [rng.standard_normal(p.shape) for p in probe]
    got_out, got_grads = run(td.get_backend().name, dtype)
    ref_out, ref_grads = run("numpy", td.float64)
    r, a = tolerance(dtype)
    r, a = rtol if rtol is not None else r * 10, atol if atol is not None else a * 10
    for i, (g, e) in enumerate(zip(got_out, ref_out)):
        assert_close(g, e, r, a, name=f"forward output {i}")
    for i, (g, e) in enumerate(zip(got_grads, ref_grads)):
        assert (g is None) == (e is None), f"gradient {i}: one backend gave None"
        if g is not None:
            assert_close(g, e, r, a, name=f"gradient of input {i}")


def read_device(array):
    """Do what the host does where it reads the device: raise the errors that kernels found in
    the data since the last read (kernels/errors.py; the numpy backend raises at the op)."""
    device = array.device
    td.backend.backend_for(device).check_errors(device)
    return array


def cli_error(capsys, argv, *names):
    """Run the command line in-process on argv, expecting a user's mistake: exit status 2, stderr
    ending in one line `error: ...` (and no other error line, no traceback) that mentions every
    string in names. Returns that line."""
    from tritonad import cli

    capsys.readouterr()
    try:
        cli.main([str(a) for a in argv])
    except SystemExit as stop:
        code = stop.code
    else:
        code = 0
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code == 2, f"{argv}: exit status {code}, stderr:\n{err}"
    assert lines and lines[-1].startswith("error: "), f"{argv}: stderr:\n{err}"
    assert sum(line.startswith("error") for line in lines) == 1, f"{argv}: stderr:\n{err}"
    assert "Traceback" not in err, f"{argv}: stderr:\n{err}"
    for name in names:
        assert str(name) in lines[-1], f"{argv}: {name!r} is not in {lines[-1]!r}"
    return lines[-1]
