"""Shared launch helpers for the kernel families: bound launches (KernelLaunch), the lean C
launcher that replays them (fastlaunch.c), programmatic dependent launch (PDL), pointer helpers.

Importing this module decides how Triton runs: compiled on a CUDA GPU, or under Triton's
interpreter on CPU tensors when no GPU is present (TRITON_INTERPRET=1 must be set before triton
is imported, so tritonad imports this first). The plans that keep KernelLaunches per signature,
and the recording and dry-run state (empty, run, planned, compile_ahead, ...), are in plans.py,
which imports this module (and not the reverse).
"""
from __future__ import annotations

import contextlib
import gc
import inspect
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
# Floating-point fusion (a * b + c as one FMA): on in Triton 3.6, on by default with a warning in
# 3.9, off by default from 3.10. Keep it on, as every tolerance and tuned plan was measured
# (a user's own setting wins).
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402,F401

from .. import dtypes  # noqa: E402

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def cdiv(a, b):
    """ceil(a / b) for ints (triton.cdiv is a jit-aware function, ~3 us a call on the host)."""
    return -(-a // b)


next_power_of_2 = triton.next_power_of_2


def _pdl_available() -> bool:
    """Programmatic dependent launch: compiled Triton on a Hopper-or-newer GPU, unless
    TRITONAD_PDL=0."""
    if INTERPRET or os.environ.get("TRITONAD_PDL", "1") in ("", "0"):
        return False
    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 9


# Programmatic dependent launch (PDL). A kernel launched with launch_pdl may be scheduled while
# the kernel before it in the stream still runs; its first statements must then be
#     if GDC:
#         tl.extra.cuda.gdc_wait()                # the kernels before have finished, memory visible
#         tl.extra.cuda.gdc_launch_dependents()   # the next kernel may be scheduled now
# before any load or store (a write could otherwise race a read of the kernel before). Inside a
# CUDA graph this hides most of the launch latency of each dependent kernel: a chain of tiny
# kernels took 0.70-0.95 us per kernel instead of 0.97-1.38 us on an H200
# (benchmarks/probe_pdl.py, 2026-11-21). Launch such kernels with `**PDL`.
PDL = {"GDC": True, "launch_pdl": True} if _pdl_available() else {"GDC": False}


@contextlib.contextmanager
def gc_paused(collect=True):
    """Around a CUDA graph capture: collect garbage first (unless collect=False), then keep the
    collector off until the capture ends. A CUDA graph that is garbage in a reference cycle
    (say a dropped Trainer's captured step) would otherwise be destroyed whenever the collector
    runs, possibly in the middle of this capture, which invalidates it (torch's `graph` context
    no longer collects before capturing)."""
    if collect:
        gc.collect()
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def dtype_of(x) -> dtypes.DType:
    return dtypes.get_dtype(x.dtype)


def check_same_shape(op, *arrays):
    shapes = {tuple(a.shape) for a in arrays}
    if len(shapes) > 1:
        raise ValueError(f"{op}: shapes differ: {' vs '.join(str(tuple(a.shape)) for a in arrays)}")


def num_warps_for(block: int) -> int:
    """A deterministic warp count for a 1-d block of `block` elements."""
    if block >= 8192:
        return 16 if not INTERPRET else 1
    if block >= 2048:
        return 8
    if block >= 1024:
        return 4
    return 4 if block >= 512 else 2


# ----------------------------------------------------------------------------- bound launches
# An eager op pays for every line of Python between the Tensor method and the GPU. Triton's own
# launch path (JITFunction.run) binds the arguments, computes their specialization and looks up
# the compiled kernel on every call: ~10-30 us with our kernels' 20-40 arguments. A launcher
# that has seen a signature once (op, shapes, strides, dtypes, device: its "plan") already knows
# the grid, the constant arguments and the compiled kernel, so it keeps a KernelLaunch and from
# then on calls the compiled kernel's launcher directly with the few arguments that change.
#
# The rule that keeps this right: a KernelLaunch is reused only for calls whose arguments Triton
# would specialize the same way. Triton specializes pointers on 16-byte alignment and integers
# on divisibility by 16, equality to 1 and width (i32 below 2**31, i64 above). Shapes and
# strides are in a plan's key; what varies per call (the pointers, and scalar values passed as
# `do_not_specialize` arguments) must put its alignment or width class into the key too: every
# plan key holds each array's 16-byte alignment (plans.array_key), and the per-call integers
# are typed tl.int64 in the kernels, so that no value changes their width.
# TRITONAD_CHECK_LAUNCHES=1 re-derives the compiled kernel through Triton at every launch and
# fails loudly if a plan ever picked the wrong one.

CHECK_LAUNCHES = os.environ.get("TRITONAD_CHECK_LAUNCHES", "0") not in ("", "0")

if not INTERPRET:
    try:
        _current_stream = torch._C._cuda_getCurrentRawStream
        _current_device = torch._C._cuda_getDevice
        _RAW_ALLOC = torch._C._cuda_cudaCachingAllocator_raw_alloc    # (bytes, stream) -> address
        _RAW_DELETE = torch._C._cuda_cudaCachingAllocator_raw_delete  # (address)
    except AttributeError:  # a CPU build of torch (scripts/compile_check.py imports us there)
        _current_stream = _current_device = _RAW_ALLOC = _RAW_DELETE = None

from triton import knobs as _knobs  # noqa: E402  (Triton 3.6 and 3.9: launch hooks live here)

_RUNTIME = _knobs.runtime


_PARAMETERS = {}


def _parameters(kernel):
    """The @triton.jit function's parameters (name -> inspect.Parameter), in order."""
    fn = kernel.fn
    if fn not in _PARAMETERS:
        _PARAMETERS[fn] = inspect.signature(fn).parameters
    return _PARAMETERS[fn]


class _State:
    """What plans.py switches while a plan is recorded (`recorder`: each launch becomes one of
    its steps) or a block is compiled ahead (`ahead`: launches compile and run nothing); here,
    below plans.py, so that KernelLaunch reads it without importing plans."""

    __slots__ = ("recorder", "ahead")

    def __init__(self):
        self.recorder = self.ahead = None


STATE = _State()


class KernelLaunch:
    """One kernel launch bound once, then replayed with new values in a few argument positions.

        launch = KernelLaunch(kernel, grid, args, meta, dynamic=(0, 1))  # launches once
        launch(out, x)             # the same kernel and grid, args[0] = out, args[1] = x

    `args` are the positional (non-constexpr) arguments, `meta` the constexpr arguments and
    launch options by keyword, as for `kernel[grid](*args, **meta)`. `dynamic` names the positions
    that change from call to call; their values must specialize as the first call's did (see
    above). Building it launches the kernel through Triton, which compiles it or loads it from the
    cache; later calls launch the compiled kernel directly on the current stream. Triton 3.6 and
    3.9 launch compiled kernels the same way (CompiledKernel.run); under the interpreter a replay
    is a plain `kernel[grid](...)` call.
    """

    __slots__ = ("kernel", "grid", "meta", "args", "dynamic", "compiled", "_run", "_function",
                 "_packed", "_bound", "_tail", "_prefix", "_device", "_g0", "_g1", "_g2",
                 "_style", "_launch", "_coop", "_pdl", "_annotations", "_signature", "_fast",
                 "_scratch")

    def __init__(self, kernel, grid, args, meta, dynamic=()):
        grid = tuple(grid)
        if _NOTE_KERNELS:
            _note_kernel(kernel, args, meta)
        self.kernel, self.grid, self.meta = kernel, grid, meta
        ahead = STATE.ahead
        if ahead is not None:  # compile_ahead: compile (in the background), launch nothing
            ahead.submit(kernel, grid, args, meta)
            self.compiled = None
            return
        self.args, self.dynamic = list(args), tuple(dynamic)
        ensure_allocator()
        self.compiled = kernel[grid](*args, **meta)
        if not INTERPRET:
            self._bind()
        recorder = STATE.recorder
        if recorder is not None:  # a plan being recorded: the launch is one of its steps
            recorder.launched(self)
        self._forget()

    def _forget(self):
        """Drop the first call's values at the dynamic positions (every call brings its own):
        a plan must not keep that call's arrays alive."""
        for i in self.dynamic:
            self.args[i] = None
            if not INTERPRET:
                self._bound[i] = None

    def _bind(self):
        kernel, args, meta, grid = self.kernel, self.args, self.meta, self.grid
        parameters = _parameters(kernel)
        names = list(parameters)
        bound = list(args)
        for name in names[len(args):]:
            if name in meta:
                bound.append(meta[name])
            elif parameters[name].default is not parameters[name].empty:
                bound.append(parameters[name].default)
            else:
                raise TypeError(f"KernelLaunch: {kernel.fn.__name__} needs argument {name}")
        self._bound = bound
        k = len(self.dynamic)
        self._prefix = self.dynamic == tuple(range(k))
        self._tail = tuple(bound[k:])
        compiled = self.compiled
        self._run, self._function = compiled.run, compiled.function
        self._packed = compiled.packed_metadata
        self._device = _current_device()
        self._g0, self._g1, self._g2 = (grid + (1, 1))[:3]
        self._direct(self._run)

    def _direct(self, launcher):
        """Call the compiled kernel's C launcher itself rather than Triton's Python wrapper
        around it (CudaLauncher.__call__, ~1.5 us), where the wrapper has nothing to do (no
        scratch memory, no sanitizer). The wrapper passes its arguments on differently in
        Triton 3.6 and 3.9: _style says which (0: call the wrapper). Where it can, bind the
        lean launcher too (_fast, see fastlaunch.c), which replaces Triton's C launcher."""
        self._style = 0
        self._fast = None
        self._scratch = 0
        if type(launcher).__name__ != "CudaLauncher" or getattr(launcher, "gsan_enabled", False):
            return
        if getattr(launcher, "profile_scratch_size", 1):
            return
        self._coop, self._pdl = launcher.launch_cooperative_grid, launcher.launch_pdl
        scratch = getattr(launcher, "global_scratch_size", 1)
        if scratch:  # (device-side tensor descriptors): only the lean launcher takes it on
            if not FAST_SCRATCH or _ALLOCATOR is None:
                return
            if _ALLOCATOR.get() not in (_NO_ALLOCATOR, _scratch):  # (Triton's launcher calls it)
                FAST_SKIPPED[self.kernel.fn.__name__] = "the program set its own Triton allocator"
                return
            self._scratch = self._g0 * self._g1 * self._g2 * scratch * \
                getattr(self.compiled.metadata, "num_ctas", 1)
            self._fast = _bind_fast(self)
            return
        params = list(inspect.signature(type(launcher).__call__).parameters)
        self._launch = launcher.launch
        if params[:7] == ["self", "gridX", "gridY", "gridZ", "stream", "function", "args"]:
            self._style = 36  # launch(grid, stream, fn, coop, pdl, scratch x2, meta, hooks, *args)
        elif "kernel_metadata" in params and hasattr(launcher, "arg_annotations"):
            self._style = 39  # launch(grid, stream, fn, coop, pdl, meta, hooks, scratch x2, ...)
            self._annotations = launcher.arg_annotations
            self._signature = launcher.kernel_signature
        if self._style:
            self._fast = _bind_fast(self)

    def rebind(self, dynamic):
        """The same launch with other positions changing per call (no compile, no launch)."""
        other = object.__new__(KernelLaunch)
        for name in KernelLaunch.__slots__:
            if hasattr(self, name):
                setattr(other, name, getattr(self, name))
        other.dynamic = tuple(dynamic)
        other.args = list(self.args)
        if not INTERPRET:
            other._bound = list(self._bound)
            k = len(other.dynamic)
            other._prefix = other.dynamic == tuple(range(k))
            other._tail = tuple(self._bound[k:])
            if self._fast is not None:
                other._fast = _bind_fast(other)
        other._forget()
        return other

    def __call__(self, *values):
        hook = _RUNTIME.launch_enter_hook
        if INTERPRET or CHECK_LAUNCHES or (hook is not None and getattr(hook, "calls", True)):
            return self._through_triton(values)
        device = self._device
        fast = self._fast
        if fast is not None and _current_device() == device:
            if not self._scratch:
                return _FAST_LAUNCH(fast, _current_stream(device), *values)
            # global scratch from torch's caching allocator on this stream, handed back once
            # the launch is queued, as Triton's launcher does with its allocator's array
            stream = _current_stream(device)
            address = _RAW_ALLOC(self._scratch, stream)
            try:
                return _FAST_LAUNCH(fast, stream, *values, address)
            finally:
                _RAW_DELETE(address)
        if self._prefix:
            args = values + self._tail
        else:
            args = list(self._bound)
            for i, v in zip(self.dynamic, values):
                args[i] = v
        if _current_device() != device:
            with torch.cuda.device(device):
                self._go(_current_stream(device), args)
        elif self._style == 36:  # the common case inline (one Python frame less)
            self._launch(self._g0, self._g1, self._g2, _current_stream(device), self._function,
                         self._coop, self._pdl, None, None, self._packed, None, None, None,
                         *args)
        else:
            self._go(_current_stream(device), args)

    def _go(self, stream, args):
        style = self._style
        if style == 36:
            self._launch(self._g0, self._g1, self._g2, stream, self._function, self._coop,
                         self._pdl, None, None, self._packed, None, None, None, *args)
        elif style == 39:
            self._launch(self._g0, self._g1, self._g2, stream, self._function, self._coop,
                         self._pdl, self._packed, None, None, None, None, None,
                         self._annotations, self._signature, tuple(args))
        else:  # (Triton's launcher: a kernel with scratch among others, see ensure_allocator)
            ensure_allocator()
            self._run(self._g0, self._g1, self._g2, stream, self._function, self._packed, None,
                      None, None, *args)

    def _through_triton(self, values):
        ensure_allocator()
        args = list(self.args)
        for i, v in zip(self.dynamic, values):
            args[i] = v
        compiled = self.kernel[self.grid](*args, **self.meta)
        if CHECK_LAUNCHES and not INTERPRET and compiled is not self.compiled:
            raise AssertionError(
                f"KernelLaunch: a cached launch of {self.kernel.fn.__name__} would have run a "
                "kernel specialized for other arguments (a plan key misses an alignment or an "
                "int width)")


# ----------------------------------------------------------------------------- the lean launcher
# Triton's C launcher (~3.8-4.4 us a call: benchmarks/probe_host.py, an H100 host, 2026-11-24)
# parses every kernel argument on every call; fastlaunch.c packs a bound launch's constant
# parameters once and takes only the values that change. It is built on first need with Triton's
# own build helper (cached in Triton's cache, like Triton's launchers), in a background thread
# started at import so that a first run does not wait for the C compiler. TRITONAD_FAST_LAUNCH=0
# keeps Triton's launcher; a kernel whose parameters it cannot pack (a type it does not know, a
# count or size the driver disagrees with) keeps Triton's launcher too, noted in FAST_SKIPPED.

FAST_LAUNCH = not INTERPRET and os.environ.get("TRITONAD_FAST_LAUNCH", "1") not in ("", "0")
# Kernels that build tensor descriptors on the device (the TMA matmul, the window GEMM) need
# global scratch at each launch: the lean launcher takes it from torch's caching allocator on
# the launch's stream (raw_alloc / raw_delete) where Triton's launcher would call its allocator
# (ensure_allocator's _scratch, a torch.empty) from its Python wrapper (an eager conv2 forward
# on the window GEMM took 36 us of host time a call this way, 45 through Triton's launcher:
# benchmarks/probe_conv_host.py, H100, Triton 3.6, 2026-11-24). Both hand the memory back as
# soon as the launch is queued: stream order makes that safe, and under CUDA graph capture the
# memory is the graph's (torch's allocator serves capture streams from the graph's pool). FAST_SCRATCH = False (read when a launch is bound) keeps such kernels
# on Triton's launcher.
FAST_SCRATCH = True
FAST_SKIPPED: dict = {}   # kernel name -> why its launches go through Triton's launcher
_FAST_MODULE = None       # the built module; False when it could not be built
_FAST_LAUNCH = None       # its launch(bound, stream, *values)
_FAST_LOCK = __import__("threading").Lock()
_KINDS = {"i1": "i", "i8": "b", "i16": "h", "i32": "i", "i64": "q", "u1": "I", "u8": "B",
          "u16": "H", "u32": "I", "u64": "Q", "fp32": "f", "f32": "f", "fp64": "d"}


def _fast_module():
    """The built fastlaunch module, or None where it cannot be built (no C compiler, no GPU)."""
    global _FAST_MODULE, _FAST_LAUNCH
    if _FAST_MODULE is None:
        with _FAST_LOCK:
            if _FAST_MODULE is None:
                try:
                    from triton.runtime.build import compile_module_from_src
                    from triton.backends.nvidia import driver

                    path = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                        "fastlaunch.c")
                    with open(path) as f:
                        source = f.read()
                    module = compile_module_from_src(source, "fastlaunch",
                                                     include_dirs=list(driver.include_dirs),
                                                     libraries=["dl"])
                    _FAST_LAUNCH = module.launch
                    _FAST_MODULE = module
                except Exception as err:  # noqa: BLE001  Triton's launcher still works
                    FAST_SKIPPED["(all kernels)"] = f"fastlaunch could not be built: {err}"
                    _FAST_MODULE = False
    return _FAST_MODULE or None


if FAST_LAUNCH and torch.cuda.is_available():
    __import__("threading").Thread(target=_fast_module, name="tritonad-fastlaunch",
                                   daemon=True).start()


def _bind_fast(kl):
    """A fastlaunch binding of KernelLaunch `kl` (its compiled kernel, grid and constant
    arguments, the dynamic positions as parameter indices), or None (Triton's launcher then)."""
    if not FAST_LAUNCH:
        return None
    module = _fast_module()
    if module is None:
        return None
    compiled = kl.compiled
    name = kl.kernel.fn.__name__
    types = list(compiled.src.signature.values())
    if len(types) != len(kl._bound):
        FAST_SKIPPED[name] = f"{len(types)} signature entries for {len(kl._bound)} arguments"
        return None
    kinds, values, index = [], [], {}
    for i, (kind, value) in enumerate(zip(types, kl._bound)):
        if kind == "constexpr":
            continue
        code = "p" if isinstance(kind, str) and kind.startswith("*") else _KINDS.get(kind)
        if code is None:
            FAST_SKIPPED[name] = f"a parameter of type {kind}"
            return None
        index[i] = len(kinds)
        kinds.append(code)
        if isinstance(value, torch.Tensor):
            value = value.data_ptr()
        elif value is None:
            value = 0
        elif isinstance(value, bool):
            value = int(value)
        values.append(value)
    try:
        dynamic = tuple(index[i] for i in kl.dynamic)
    except KeyError:
        FAST_SKIPPED[name] = "a per-call argument that Triton made a constant"
        return None
    meta = compiled.metadata
    config = (compiled.function, kl._g0, kl._g1, kl._g2, 32 * meta.num_warps, meta.shared,
              getattr(meta, "num_ctas", 1), bool(kl._pdl), bool(kl._coop))
    if kl._scratch:  # the global scratch pointer comes last among the values of a call
        dynamic += (len(kinds),)
    error = None
    for scratch in (2, 0) if not kl._scratch else (2,):  # Triton appends two scratch pointers
        try:  # (global, profile)
            return module.make(*config, "".join(kinds + ["p"] * scratch).encode(),
                               tuple(values + [0] * scratch), dynamic)
        except (ValueError, TypeError, OverflowError) as err:
            error = err
    FAST_SKIPPED[name] = str(error)
    return None


# Kernels that build tensor descriptors on the device (the TMA matmul) need global scratch,
# which Triton's launcher takes at each launch from the allocator of triton.set_allocator. Triton
# keeps it per thread (a ContextVar, unset in a new thread), so each launching thread gets ours
# before its first such launch, unless the program set its own: Triton's launches (run, a
# first KernelLaunch) and the replays that go through Triton's launcher (the kernels with
# scratch; the lean launcher takes none).
try:
    from triton.runtime import _allocation

    _ALLOCATOR = _allocation._allocator
    _NO_ALLOCATOR = __import__("contextvars").Context().run(_ALLOCATOR.get)  # (its default)
except (ImportError, AttributeError):  # a Triton without allocators: nothing to set
    _ALLOCATOR = None


def _scratch(size, alignment, stream):
    """Triton's global scratch for one launch, on the current device (torch's caching allocator
    orders its reuse on the stream)."""
    return torch.empty(size, dtype=torch.int8, device="cuda")


def ensure_allocator():
    if _ALLOCATOR is not None and _ALLOCATOR.get() is _NO_ALLOCATOR:
        triton.set_allocator(_scratch)


# TRITONAD_NOTE_KERNELS=FILE appends every kernel specialization launched (the kernel, its
# argument types and constexprs) to FILE as JSON lines: scripts/compile_check.py compiles them
# for a GPU target on a machine without one, so that a CPU test run under the interpreter also
# proves that each kernel it ran compiles.
_NOTE_KERNELS = os.environ.get("TRITONAD_NOTE_KERNELS")
_TYPES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16",
          torch.float64: "fp64", torch.int64: "i64", torch.int32: "i32", torch.int16: "i16",
          torch.int8: "i8", torch.uint8: "u8", torch.bool: "i1"}
_OPTIONS = ("num_warps", "num_stages", "num_ctas", "maxnreg", "enable_fp_fusion", "launch_pdl",
            "launch_cooperative_grid", "ir_override", "debug")


def _note_kernel(kernel, args, meta):
    import json

    if not hasattr(kernel, "fn"):  # a test's stand-in for a kernel
        return
    parameters = _parameters(kernel)
    names = list(parameters)
    values = dict(zip(names, args))
    values.update({k: v for k, v in meta.items() if k in parameters})
    signature, constexprs = {}, {}
    for name in names:
        param = parameters[name]
        value = values.get(name, param.default)
        annotation = param.annotation
        if annotation is tl.constexpr or "constexpr" in str(annotation):
            constexprs[name] = value
            signature[name] = "constexpr"
        elif isinstance(annotation, tl.dtype):
            signature[name] = {"int64": "i64", "int32": "i32", "float32": "fp32",
                               "float64": "fp64"}.get(str(annotation), str(annotation))
        elif isinstance(value, torch.Tensor):
            signature[name] = "*" + _TYPES[value.dtype]
        elif isinstance(value, bool):
            signature[name] = "i1"
        elif isinstance(value, int):
            signature[name] = "i32" if -2**31 <= value < 2**31 else "i64"
        elif isinstance(value, float):
            signature[name] = "fp32"
        elif value is None:
            constexprs[name] = None
            signature[name] = "constexpr"
        else:
            constexprs[name] = value
            signature[name] = "constexpr"
    for name, value in list(constexprs.items()):
        if isinstance(value, tl.constexpr):
            value = value.value
        if isinstance(value, tl.dtype):
            value = {"dtype": str(value)}
        elif getattr(value, "tritonad_formula", None):  # an elementwise table formula
            value = {"formula": value.tritonad_formula}
        elif not isinstance(value, (int, float, str, bool, type(None))):
            value = {"repr": repr(value)}
        constexprs[name] = value
    options = {k: v for k, v in meta.items() if k in _OPTIONS}
    fn = kernel.fn
    line = json.dumps({"module": fn.__module__, "name": fn.__name__, "signature": signature,
                       "constexprs": constexprs, "options": options}, sort_keys=True)
    with open(_NOTE_KERNELS, "a") as f:
        f.write(line + "\n")


# Replays pass device pointers as ints: the launcher then skips a data_ptr() call and a driver
# query per pointer (~1 us each). Under the interpreter, and when checking launches against
# Triton's own path, they pass the arrays themselves.
RAW_POINTERS = not INTERPRET and not CHECK_LAUNCHES


def _array_itself(x):
    return x


ptr = torch.Tensor.data_ptr if RAW_POINTERS else _array_itself


def offset_ptr(x, start):
    """ptr() of x's memory `start` elements in (x contiguous from there on)."""
    if RAW_POINTERS:
        return x.data_ptr() + start * x.element_size()
    return x.as_strided((x.numel() - start,), (1,), x.storage_offset() + start)
