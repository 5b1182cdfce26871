"""Drive PyTorch's operator database (OpInfo) through tritonad.torch_backend.

For an OpInfo, `check_opinfo` runs its `sample_inputs` twice, with PyTorch alone and with the
plugin enabled, forward and backward (`torch.autograd.grad` under a fixed random cotangent,
where the OpInfo supports autograd and the dtype is floating), and compares at FlagGems-class
tolerances (`tolerances`); in a half type, a mismatch passes where tritonad's result is no
farther from PyTorch's float64 result on the same values than PyTorch's own is (`_no_worse`). It counts, through `torch_backend.COUNTS`, how many samples ran one
of the target aten operators on tritonad, so that a test cannot pass by falling back:

    from torch_backend_harness import opinfo_params, check_opinfo

    @pytest.mark.parametrize("info", opinfo_params({"add", "mul"}), ids=str)
    def test_ops(info):
        report = check_opinfo(info.op, DEVICE, torch.float32, targets=info.targets)
        assert report.covered, report.why_not

- `opinfo_params(packets, extra)`: the OpInfos whose operator is one of the aten packet names
  (OpInfo.name / aten_name, with "nn.functional." and "_refs." dropped), plus `extra`
  ({opinfo name: {aten packet names}} for the OpInfos whose aten operators are named otherwise:
  "softmax" lands on "_softmax"); each as a `Target(op, targets)`, printed as its test id.
- `check_opinfo(op, device, dtype, targets, max_samples=None, backward=True, inplace=True)`:
  returns a `Report` (samples run, covered, fell back, skipped, with reasons); raises
  AssertionError naming the op, the sample and the mismatch when values differ.
- `ci_dtypes(op, device)` / `all_dtypes(op, device)`: the dtypes to run (a few in CI, every
  supported one tritonad holds on the GPU).
- `check_target(target, runs, device, deliberate)`: the test body, as tests/test_torch_backend.py
  uses it: runs [(dtype, max_samples, with backward and in-place)], asserts coverage, skips
  the deliberate fallbacks with their reason.

The plugin runs cpu tensors under Triton's interpreter on a machine without a GPU, so the same
checks run in CPU CI on small samples (max_samples) and on CUDA tensors at full size.
"""
from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import sys
import types
import unittest

import torch

import tritonad.torch_backend as tb
from tritonad.torch_backend import registry

if importlib.util.find_spec("expecttest") is None:
    # common_utils imports expecttest (a test-only package) for its TestCase base
    _stub = types.ModuleType("expecttest")
    _stub.TestCase = unittest.TestCase
    sys.modules["expecttest"] = _stub

from torch.testing._internal.common_methods_invocations import op_db  # noqa: E402

HELD = (torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64, torch.int32,
        torch.uint8, torch.bool)
# FlagGems' resolutions: float32's relative tolerance is scaled by the reduction size
RESOLUTION = {torch.float16: 1e-3, torch.bfloat16: 0.016, torch.float32: 1.3e-6,
              torch.float64: 1e-7}
ATOL = 1e-4


@dataclasses.dataclass
class Target:
    op: object          # the OpInfo
    targets: frozenset  # aten packet names ("add", "_softmax") whose handlers it should run

    def __str__(self):
        v = self.op.variant_test_name
        return self.op.name + (f".{v}" if v else "")


@dataclasses.dataclass
class Report:
    samples: int = 0
    covered: int = 0        # samples in which a target operator ran on tritonad
    fell_back: dict = dataclasses.field(default_factory=dict)  # aten name -> first reason
    skipped: list = dataclasses.field(default_factory=list)

    @property
    def why_not(self):
        return (f"{self.samples} samples, none ran a target operator on tritonad; fell back: "
                f"{self.fell_back}; skipped: {self.skipped[:3]}")


def _packet(name):
    for prefix in ("nn.functional.", "_refs.", "special.", "linalg."):
        name = name.removeprefix(prefix)
    return name


def opinfo_params(packets, extra=None):
    """[Target] for every OpInfo landing on one of `packets` (aten packet names) or named in
    `extra` ({opinfo name or "name.variant": set of aten packet names})."""
    extra = extra or {}
    found = []
    for info in op_db:
        key = info.name + (f".{info.variant_test_name}" if info.variant_test_name else "")
        if not any(d in HELD for d in info.dtypes):
            continue   # complex-only variants
        names = {_packet(info.name), _packet(info.aten_name or info.name)}
        targets = set(names & set(packets)) | set(extra.get(key, ())) | set(
            extra.get(info.name, ()))
        if targets:
            found.append(Target(info, frozenset(targets)))
    return found


def ci_dtypes(info, device):
    """float32 and one integer type (else bool), where the op supports them."""
    supported = info.supported_dtypes(device)
    chosen = [torch.float32]
    chosen += [d for d in (torch.int64, torch.int32, torch.bool) if d in supported][:1]
    return [d for d in chosen if d in supported]


def all_dtypes(info, device):
    supported = info.supported_dtypes(device)
    return [d for d in HELD if d in supported]


def _tensors(value):
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensors(v)]
    return []


def _clone(value, grad=True):
    """A deep copy of a sample's arguments: tensors cloned (leaves keep requires_grad when
    grad, else none requires it: an in-place variant writes into them)."""
    if isinstance(value, torch.Tensor):
        c = value.detach().clone()
        if value.stride() != c.stride():  # keep non-contiguous layouts as the sample has them
            c = torch.empty_strided(value.shape, value.stride(), dtype=value.dtype,
                                    device=value.device)
            c.copy_(value.detach())
        return c.requires_grad_(grad and value.requires_grad)
    if isinstance(value, list):
        return [_clone(v, grad) for v in value]
    if isinstance(value, tuple):
        return tuple(_clone(v, grad) for v in value)
    if isinstance(value, dict):
        return {k: _clone(v, grad) for k, v in value.items()}
    return value


def tolerances(dtype, reduce=1, backward=False):
    """(rtol, atol): FlagGems' resolution per dtype (float32 1.3e-6, bf16 0.016, fp16 1e-3),
    float32's and float64's scaled by the reduction size, and atol 1e-4 times the reduction
    size (FlagGems' default). A gradient in a half type also gets atol = the resolution: the
    forward's rounding (one ulp either way) flows into it through autograd's chain, where
    FlagGems compares each backward operator alone. Integers and bools: exact."""
    if dtype not in RESOLUTION:
        return 0.0, 0.0
    rtol = RESOLUTION[dtype]
    if dtype in (torch.float32, torch.float64):
        rtol *= reduce
    atol = ATOL * reduce
    if backward and dtype in (torch.float16, torch.bfloat16):
        atol = max(atol, RESOLUTION[dtype])
    return rtol, atol


def _reduce_size(inputs, outputs):
    """How many values one output element sums at most, roughly: the largest input (or
    output gradient) over the smallest output."""
    big = max((t.numel() for t in inputs), default=1)
    small = min((max(1, t.numel()) for t in outputs), default=1)
    return max(1, big // small)


def assert_close(ours, ref, dtype, reduce, what, backward=False):
    """Compare at the tolerances of each output's own dtype (exp of an int64 sample is float32);
    `dtype` is the sample's, named in messages."""
    if isinstance(ref, torch.Tensor):
        rtol, atol = tolerances(ref.dtype, reduce, backward)
        if not isinstance(ours, torch.Tensor):
            raise AssertionError(f"{what}: expected a tensor, got {type(ours).__name__}")
        torch.testing.assert_close(ours, ref, rtol=rtol, atol=atol, equal_nan=True,
                                   msg=lambda m: f"{what}: {m}")
    elif isinstance(ref, (list, tuple)):
        if len(ours) != len(ref):
            raise AssertionError(f"{what}: {len(ours)} outputs, expected {len(ref)}")
        for i, (a, b) in enumerate(zip(ours, ref)):
            assert_close(a, b, dtype, reduce, f"{what}[{i}]", backward)
    elif ref != ours and not (ref != ref and ours != ours):
        raise AssertionError(f"{what}: {ours!r} != {ref!r}")


@contextlib.contextmanager
def plugin():
    """The plugin enabled (no fallback note); yields {aten packet: calls} run on tritonad."""
    before = dict(registry.COUNTS.ours)
    ran = {}
    tb.enable(note=False)
    try:
        yield ran
    finally:
        tb.disable()
        for op, n in registry.COUNTS.ours.items():
            if n != before.get(op, 0):
                ran[op._opname] = ran.get(op._opname, 0) + n - before.get(op, 0)


def _fallbacks_of(mode_counts_before, targets):
    return {registry.name_of(op): n for op, n in registry.COUNTS.theirs.items()
            if op._opname in targets and n != mode_counts_before.get(op, 0)}


def _copies(sample, grad):
    return _clone(sample.input, grad), _clone(sample.args, grad), _clone(sample.kwargs, grad)


def _forward(fn, sample, copies):
    inp, args, kwargs = copies
    return fn(inp, *args, **kwargs)


def _grad_pairs(sample, out, copies):
    """(outputs to differentiate, leaves) of a forward run."""
    outs = [t for t in _tensors(sample.output_process_fn_grad(out))
            if t.requires_grad and t.dtype.is_floating_point]
    return outs, [t for t in _tensors(copies) if t.requires_grad]


def _cotangents(outs, seed, rounded_to=None):
    """Random cotangents for outs; rounded_to: a dtype the values pass through first (the
    float64 run uses the half run's values)."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    return [torch.randn(t.shape, generator=g, dtype=torch.float32).to(t.device, rounded_to or
                                                                      t.dtype).to(t.dtype)
            for t in outs]


def _run(fn, sample, grad, seed, plugin_on, widen=None):
    """fn on a fresh copy of the sample -> (output, gradients or None), with the plugin on (a
    dict of the operators that ran on tritonad) or off (None). widen: the sample's half type,
    to run PyTorch on float64 copies of its floating tensors instead (the same values)."""
    copies = _copies(sample, grad)
    if widen is not None:
        copies = _widened(copies)
    context = plugin() if plugin_on else contextlib.nullcontext({})
    with context as ran:
        out = _forward(fn, sample, copies)
        grads = None
        if grad:
            outs, leaves = _grad_pairs(sample, out, copies)
            if outs and leaves:
                with _paused() if plugin_on else contextlib.nullcontext():
                    cotangents = _cotangents(outs, seed, rounded_to=widen)
                grads = torch.autograd.grad(outs, leaves, cotangents, allow_unused=True)
    return out, grads, ran


def _widened(value):
    """The copies with every floating tensor as float64 (leaves stay leaves)."""
    if isinstance(value, torch.Tensor):
        if not value.dtype.is_floating_point:
            return value
        return value.detach().double().requires_grad_(value.requires_grad)
    if isinstance(value, (list, tuple)):
        return type(value)(_widened(v) for v in value)
    if isinstance(value, dict):
        return {k: _widened(v) for k, v in value.items()}
    return value


def _no_worse(ours, theirs, exact, dtype):
    """Where ours and PyTorch's half-precision results differ, whether ours is as near the
    float64 result as PyTorch's is, within the dtype's tolerance: PyTorch rounds each step of a
    composite (its CPU log_softmax, rsqrt's backward) to the half type, tritonad's kernels once,
    so at FlagGems' tolerances the more accurate result can differ from PyTorch's."""
    pairs = zip(_slots(ours), _slots(theirs), _slots(exact))
    rtol, atol = tolerances(dtype, backward=True)
    for a, b, e in pairs:
        if a is None or b is None or e is None or not a.dtype.is_floating_point:
            continue
        e = e.detach().double()
        mine = (a.detach().double() - e).abs()
        reference = (b.detach().double() - e).abs()
        allowed = reference + atol + rtol * e.abs()
        ok = (mine <= allowed) | (mine != mine) & (reference != reference)
        if not bool(ok.all()):
            return False
    return True


def _slots(value):
    """The tensors of an output or gradient list in order, None where another value stands
    (an unused input's gradient), so that two runs' lists line up."""
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _slots(v)]
    return [value if isinstance(value, torch.Tensor) else None]


def _compare(ours, ref, dtype, reduce, what, exact, backward=False):
    """assert_close; for a half type a mismatch passes where ours is no farther from float64
    (exact(): the float64 run, made on demand) than PyTorch's result is."""
    try:
        assert_close(ours, ref, dtype, reduce, what, backward)
    except AssertionError:
        if dtype not in (torch.float16, torch.bfloat16):
            raise
        wide = exact()
        if wide is None or not _no_worse(ours, ref, wide, dtype):
            raise


@contextlib.contextmanager
def _paused():
    """The plugin off for a moment (making cotangents inside a plugin block)."""
    from torch.utils._python_dispatch import _pop_mode, _push_mode
    mode = _pop_mode()
    try:
        yield
    finally:
        _push_mode(mode)


def check_opinfo(info, device, dtype, targets, max_samples=None, backward=True,
                 inplace=True, report=None):
    """Run `info`'s samples for (device, dtype) with and without the plugin and compare (see
    the module docstring); returns the Report (pass one in to accumulate)."""
    report = report or Report()
    grad = backward and info.supports_autograd and dtype.is_floating_point and \
        dtype in info.supported_backward_dtypes(torch.device(device).type)
    torch.manual_seed(0)
    # the OpInfo's generator itself: sample_inputs() wraps it in a tracker that walks the
    # Python stack at every sample (half of this harness's CPU time)
    samples = info.sample_inputs_func(info, device, dtype, grad)
    variants = [("", info.op)]
    if inplace and info.inplace_variant is not None:
        variants.append(("inplace ", info.inplace_variant))
    for index, sample in enumerate(samples):
        if max_samples is not None and index >= max_samples:
            break
        for label, fn in variants:
            use_grad = grad and not label
            what = f"{info.name} {label}{dtype} sample {index} ({sample.summary()})"
            try:
                ref, ref_grads, _ = _run(fn, sample, use_grad, index, False)
            except Exception as e:  # PyTorch refuses this sample (an in-place type change)
                report.skipped.append(f"{what}: PyTorch raises {type(e).__name__}")
                continue
            theirs_before = dict(registry.COUNTS.theirs)
            ours, our_grads, ran = _run(fn, sample, use_grad, index, True)
            report.samples += 1
            if targets & set(ran):
                report.covered += 1
            for name, _ in _fallbacks_of(theirs_before, targets).items():
                report.fell_back.setdefault(name, what)
            inputs = _tensors((sample.input, sample.args, sample.kwargs))
            reduce = _reduce_size(inputs, _tensors(ref))
            wide = []

            def exact(fn=fn, sample=sample, use_grad=use_grad, index=index, wide=wide):
                if not wide:  # (once a sample; PyTorch may refuse float64 for the op)
                    try:
                        wide.append(_run(fn, sample, use_grad, index, False, widen=dtype))
                    except Exception:  # noqa: BLE001
                        wide.append(None)
                return wide[0]

            _compare(ours, ref, dtype, reduce, f"{what} forward",
                     lambda: exact() and exact()[0])
            if ref_grads is not None:
                greduce = max(reduce, _reduce_size(_tensors(ref), [g for g in ref_grads
                                                                  if g is not None]))
                _compare(our_grads, ref_grads, dtype, greduce, f"{what} backward",
                         lambda: exact() and exact()[1], backward=True)
    return report


def check_target(target, runs, device, deliberate=None):
    """Run a Target's OpInfo for each (dtype, max_samples, full) in runs (full: backward and
    in-place variants too) and require that some sample ran a target operator on tritonad;
    an OpInfo named in `deliberate` ({test id: reason}) that ran none is skipped with its
    reason (a case the handlers deliberately leave to PyTorch), as is one whose every sample
    PyTorch itself refuses. Returns the Report."""
    import pytest

    report = None
    for dtype, max_samples, full in runs:
        report = check_opinfo(target.op, device, dtype, target.targets, max_samples=max_samples,
                              backward=full, inplace=full, report=report)
    if report is None or not report.covered:
        if deliberate and str(target) in deliberate:
            pytest.skip(deliberate[str(target)])
        if report is not None and not report.samples:
            pytest.skip(f"PyTorch refuses every sample: {report.skipped[:1]}")
        raise AssertionError(f"{target}: {report.why_not if report else 'no dtype to run'}")
    return report
