"""Launch plans: what a launcher's first call with a signature leaves for later calls to replay.

A plan holds the KernelLaunches (launch.py) that the signature's first call bound and replays
them with a later call's arrays; a PlanCache maps each signature to its plan. Two forms share
the Plan type: a launcher decorated with @planned is recorded as it runs (its allocations,
launches and results: RecordedPlan), and the elementwise launchers, which bind their one or two
launches themselves, keep them as an OperandPlan. This module also holds the state that turns
launches into something else for a while: the recording of a plan, and compile_ahead's dry run.
"""
from __future__ import annotations

import contextlib
import functools
import operator
import os

import torch

from .. import dtypes
from .launch import (_NOTE_KERNELS, STATE, INTERPRET, RAW_POINTERS, KernelLaunch, _note_kernel,
                     ensure_allocator, offset_ptr, ptr)

PLANS_ENABLED = os.environ.get("TRITONAD_PLANS", "1") not in ("", "0")  # 0: Triton's path always

# ----------------------------------------------------------------------------- recorded plans
# Most launchers are a few lines of planning around one to four kernel launches, with
# temporaries (split-K slices, staged operands) in between. Rather than restructure each into
# "plan" and "run" halves, a primitive decorated with @planned runs its launcher once per
# signature under a recorder, which notes every allocation (empty) and every launch
# (KernelLaunch, or run for a plain kernel[grid](...) call) and where each pointer
# argument points: into which of the call's arrays or temporaries, at which byte offset. The
# plan then replays that: allocate the temporaries, launch each kernel with the new pointers,
# return the results as the same arrays (or views) of the new memory.
#
# What a recorded launcher must not do: read the device back or decide anything from values
# (data-dependent checks go through the device-side error flags instead), launch a kernel
# other than through KernelLaunch / run, or allocate other than through empty. Scalar
# kernel arguments are replayed as recorded, so they must follow from the plan's key (shapes,
# strides, dtypes, the arguments that are not arrays, the settings named by `settings`).
# Memory that outlives calls (error flags, device constants) is registered with persistent().

_PERSISTENT = {}  # storage data_ptr -> array: memory a plan may point at directly
_UNPLANNABLE = object()


class PlanCache(dict):
    """Plans of one op family by signature. Bounded: a program that makes endless new shapes
    starts over rather than growing without end. While a plan is being recorded, lookups miss
    (_record swaps `get`), so that the launches of nested primitives are recorded into it."""

    LIMIT = 4096
    ALL: list = []  # every cache, for clear_plans()

    def __init__(self):
        super().__init__()
        PlanCache.ALL.append(self)

    def keep(self, key, plan):
        if STATE.ahead is not None:  # compile_ahead ran nothing: nothing to replay
            return plan
        if len(self) >= self.LIMIT:
            self.clear()
        self[key] = plan
        return plan


def clear_plans():
    """Forget every plan (tests that swap a kernel or a setting the keys do not see)."""
    for cache in PlanCache.ALL:
        cache.clear()


def empty(shape, dtype, device) -> torch.Tensor:
    """Uninitialised contiguous output memory; dtype may be a tritonad DType or a torch dtype.
    Launchers allocate through this, so that a plan being recorded knows the memory."""
    torch_dtype = dtype.torch if isinstance(dtype, dtypes.DType) else dtype
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    out = torch.empty(shape, dtype=torch_dtype, device=device)
    if STATE.recorder is not None:
        STATE.recorder.allocated(out)
    return out


def run(kernel, grid, *args, **meta):
    """kernel[grid](*args, **meta), recorded into the plan being made, if any (compiled only,
    inside compile_ahead)."""
    if STATE.ahead is not None:
        return STATE.ahead.submit(kernel, grid, args, meta)
    if STATE.recorder is not None:
        return KernelLaunch(kernel, grid, args, meta)
    if _NOTE_KERNELS:
        _note_kernel(kernel, args, meta)
    ensure_allocator()
    return kernel[grid](*args, **meta)


def persistent(array):
    """Register memory that lives as long as the process (plans may keep pointing at it)."""
    _PERSISTENT[array.untyped_storage().data_ptr()] = array
    return array


@contextlib.contextmanager
def not_recording():
    """Launches in this block are not part of the plan being recorded (a tuner's trials)."""
    saved, STATE.recorder = STATE.recorder, None
    try:
        yield
    finally:
        STATE.recorder = saved


# ----------------------------------------------------------------------------- compiling ahead
# A first training step compiles each of its kernels as it reaches it, one after another: tens of
# kernels at a few hundred milliseconds to seconds each, while the GPU idles and the other CPU
# cores too. The kernels a step needs follow from shapes, dtypes and layouts alone, never from
# values, so a dry run of the step can name them all before any runs. compile_ahead() runs a
# block so: every launch becomes a compile request, handed to Triton's asynchronous compilation
# (triton.runtime._async_compile, in Triton 3.6 and 3.9) on a thread pool, and nothing is
# launched or kept. When the block ends, every kernel is in Triton's caches (memory and disk)
# and the real step launches them at once.



class _Ahead:
    """The compile requests of one compile_ahead block."""

    def __init__(self):
        self.kernels = 0

    def submit(self, kernel, grid, args, meta):
        if INTERPRET:  # nothing to compile under the interpreter
            return None
        try:
            kernel.warmup(*args, grid=grid, **meta)
        except Exception:  # noqa: BLE001  the real launch will raise it, with its context
            return None
        self.kernels += 1
        return None


@contextlib.contextmanager
def launching():
    """Inside a compile_ahead block: launch for real (memory that must hold what a kernel
    writes, such as the error flags' zeros, made there on first use). Outside one: nothing."""
    ahead, STATE.ahead = STATE.ahead, None
    try:
        yield
    finally:
        STATE.ahead = ahead


@contextlib.contextmanager
def compile_ahead(workers=None):
    """Run a block for the kernels it launches only: each launch compiles its kernel, several
    at a time on a thread pool where Triton compiles asynchronously, and nothing is computed or
    kept (no plans); the block's results are garbage and its side effects on Python state
    (gradients, optimizer state) are the caller's to avoid or undo. Yields an object whose
    `kernels` counts the compile requests."""
    if STATE.ahead is not None:
        yield STATE.ahead
        return
    mode = None
    pool = None
    if not INTERPRET:
        try:
            from triton.runtime._async_compile import AsyncCompileMode
            import concurrent.futures

            pool = concurrent.futures.ThreadPoolExecutor(workers or min(16, os.cpu_count() or 4))
            # a failed compile is the real launch's to report, with its context
            mode = AsyncCompileMode(pool, ignore_errors=True)
        except ImportError:  # a Triton without asynchronous compilation: one after another
            mode = None
    ahead = _Ahead()
    STATE.ahead = ahead
    try:
        if mode is not None:
            with mode:
                yield ahead
        else:
            yield ahead
    finally:
        STATE.ahead = None
        if pool is not None:
            pool.shutdown(wait=True)


def compiling_ahead() -> bool:
    return STATE.ahead is not None


# ----------------------------------------------------------------------------- plans

_empty_like = torch.empty_like
_empty_strided = torch.empty_strided  # (less host time than torch.empty: probe_host.py)


class Plan:
    """What a PlanCache keeps for one signature, replayed by calling it with a later call's
    arrays. `steps`: [(KernelLaunch, where its per-call pointers come from)], each KernelLaunch
    bound with its per-call positions dynamic, holding none of the first call's arrays."""

    __slots__ = ("steps",)


class RecordedPlan(Plan):
    """A call recorded by @planned: allocate its temporaries, replay its launches (each pointer
    as (slot, byte offset, view) into the call's arrays and temporaries), rebuild its results.
    plan(arrays, args), or plan.replay(slots, args) with a list it may extend."""

    __slots__ = ("temps", "raw", "spec", "result")

    def __init__(self, temps, steps, spec):
        self.temps, self.steps, self.spec = temps, steps, spec
        # for replays that pass raw pointers: each launch with its pointers as (slot, byte
        # offset), or, where every offset is 0 (most), a C getter of the slots' pointers
        self.raw = [(launch, _picker(sources)) for launch, sources in steps]
        self.result = _result_maker(spec)

    def __call__(self, arrays, args=()):
        return self.replay(list(arrays), args)

    def replay(self, slots, args):
        """Run the plan on `slots`, a new list of the call's arrays (extended in place with the
        temporaries); `args`: the call's positional arguments (results that are arguments)."""
        for shape, strides, dtype, device in self.temps:
            slots.append(_empty_strided(shape, strides, dtype=dtype, device=device))
        if RAW_POINTERS:
            pointers = [s.data_ptr() for s in slots]
            for launch, pick in self.raw:
                launch(*pick(pointers))
        else:
            for launch, sources in self.steps:
                launch(*[_view(slots[i], view) for i, _, view in sources])
        if self.result is not None:
            return self.result(slots)
        return self._rebuild(self.spec, slots, args)

    def _rebuild(self, spec, slots, args):
        kind = spec[0]
        if kind == "array":
            return _view(slots[spec[1]], spec[3])
        if kind == "seq":
            return spec[1](self._rebuild(s, slots, args) for s in spec[2])
        if kind == "arg":
            return args[spec[1]]
        return spec[1]


def _view(slot, view):
    if view is None:
        return slot
    shape, strides, offset, _ = view
    return slot.as_strided(shape, strides, slot.storage_offset() + offset)


def _result_maker(spec):
    """A fast rebuild of the common results (one array, or a tuple of arrays and None, each a
    whole slot): a function of the slots; None for the others (RecordedPlan._rebuild does
    them)."""
    def whole(item):
        return item[0] == "array" and item[3] is None

    if spec[0] == "array" and whole(spec):
        i = spec[1]
        return lambda slots: slots[i]
    if spec[0] == "seq" and spec[1] is tuple and all(
            whole(item) or item == ("value", None) for item in spec[2]):
        picks = [item[1] if item[0] == "array" else None for item in spec[2]]
        return lambda slots: tuple(None if i is None else slots[i] for i in picks)
    return None


def _picker(sources):
    """pointers -> the pointer arguments of one launch, from [(slot, byte offset, view)]."""
    if not sources:
        return lambda pointers: ()
    if all(offset == 0 for _, offset, _ in sources):
        getter = operator.itemgetter(*[i for i, _, _ in sources])
        return getter if len(sources) > 1 else lambda pointers: (getter(pointers),)
    pairs = [(i, offset) for i, offset, _ in sources]
    return lambda pointers: [pointers[i] + offset for i, offset in pairs]


# OperandPlan.form: one launch over the whole arrays, with a (and b) the only array operands
# (unary and binary ops), with any other operands (fill_, where, 2 - x); several launches
_A, _AB, _ONE, _SEVERAL = 0, 1, 2, 3


class OperandPlan(Plan):
    """A call of a launcher that binds its own launches (elementwise): a result of one shape,
    dtype and device, and launches of one kernel whose arguments start (out, a, b, c, d, pa,
    pb, pc, pd), up to four operands and four per-call scalars. `steps`: [(KernelLaunch, element
    offset)] over all the arrays' memory (two where a contiguous run is cut into a 16-aligned
    body and a tail, none for an empty result); an operand that is not an array (a number,
    None) passes out's pointer in its place.

        plan(out, a, b, c, pa, pb, pc[, d, pd])  # out None: a new result, laid out as a or b
                                                 # if `like`
    """

    __slots__ = ("shape", "strides", "dtype", "device", "arrays", "like", "single", "form")

    def __init__(self, shape, dtype, device, arrays, steps, like):
        self.shape, self.dtype, self.device = shape, dtype, device
        self.strides = _contiguous_strides(shape)
        self.arrays, self.steps = tuple(arrays), steps
        self.like = like  # 0 or 1: the result is laid out as operand a or b (empty_like: faster)
        self.single = steps[0][0] if len(steps) == 1 and steps[0][1] == 0 else None
        if self.single is None:
            self.form = _SEVERAL
        else:
            self.form = {(True, False, False, False): _A,
                         (True, True, False, False): _AB}.get(self.arrays, _ONE)

    def __call__(self, out, a, b, c, pa, pb, pc, d=None, pd=0):
        if out is None:
            like = self.like
            if like == 0:
                out = _empty_like(a)
            elif like == 1:
                out = _empty_like(b)
            else:
                out = _empty_strided(self.shape, self.strides, dtype=self.dtype,
                                     device=self.device)
        form = self.form
        if form == _AB:
            o = ptr(out)
            self.single(o, ptr(a), ptr(b), o, o, pa, pb, pc, pd)
        elif form == _A:
            o = ptr(out)
            self.single(o, ptr(a), o, o, o, pa, pb, pc, pd)
        elif form == _ONE:
            o = ptr(out)
            ta, tb, tc, td = self.arrays
            self.single(o, ptr(a) if ta else o, ptr(b) if tb else o, ptr(c) if tc else o,
                        ptr(d) if td else o, pa, pb, pc, pd)
        else:
            for launch, start in self.steps:
                o = offset_ptr(out, start) if start else ptr(out)
                pointers = [o, o, o, o]
                for i, (x, is_array) in enumerate(zip((a, b, c, d), self.arrays)):
                    if is_array:
                        pointers[i] = offset_ptr(x, start) if start else ptr(x)
                launch(o, *pointers, pa, pb, pc, pd)
        return out


def _contiguous_strides(shape):
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


def array_key(x):
    """What a plan depends on for one array argument: its dtype, shape, strides, device and
    whether its pointer is 16-byte aligned (Triton specializes pointers on that). The replay
    paths write it inline."""
    return x.dtype, x.shape, x.stride(), x.get_device(), x.data_ptr() % 16 == 0


# ----------------------------------------------------------------------------- recording


def _extent(x):
    """Bytes from x's first element to just past its last one (non-negative strides)."""
    if x.numel() == 0:
        return 0
    return (sum((n - 1) * abs(st) for n, st in zip(x.shape, x.stride())) + 1) * x.element_size()


class _Recorder:
    """Watches one call of a launcher: its arrays, the arrays it allocates, its launches."""

    def __init__(self, arrays, args=()):
        self.args = args               # the call's arguments (a result may be one of them)
        self.slots = list(arrays)      # the call's arrays, then each allocation
        self.temps = []                # (shape, strides, torch dtype, device) of each allocation
        self.steps = []                # (KernelLaunch, [(slot, byte offset, view)])
        self.failed = None             # why the call cannot be replayed

    def allocated(self, array):
        self.slots.append(array)
        self.temps.append((tuple(array.shape), array.stride(), array.dtype, array.device))

    def locate(self, x):
        """(slot, byte offset, view) of an array argument, or None if it points elsewhere.
        view: None when x is the slot itself, else (shape, strides, element offset, dtype) to
        rebuild it from the slot (replays that pass arrays rather than raw pointers)."""
        for i, s in enumerate(self.slots):
            if x is s:
                return i, 0, None
        base = x.untyped_storage().data_ptr()
        found = None
        start = x.data_ptr()
        for i, s in enumerate(self.slots):
            if s.untyped_storage().data_ptr() != base:
                continue
            # arrays of one storage (parameters in an optimizer's flat buffer): the one whose
            # memory holds x's first element
            if not s.data_ptr() <= start < s.data_ptr() + max(_extent(s), 1):
                continue
            if found is not None and s.data_ptr() != self.slots[found].data_ptr():
                self.failed = "an argument points into two of the call's arrays"
                return None
            if found is None:
                found = i
        if found is None:
            if base in _PERSISTENT:
                return -1, 0, x
            self.failed = "an argument points to memory the call did not allocate"
            return None
        s = self.slots[found]
        if x.dtype != s.dtype:
            self.failed = "an argument reinterprets an array's dtype"
            return None
        view = (tuple(x.shape), tuple(x.stride()), x.storage_offset() - s.storage_offset(),
                x.dtype)
        return found, x.data_ptr() - s.data_ptr(), view

    def launched(self, launch):
        positions, sources = [], []
        for i, a in enumerate(launch.args):
            if isinstance(a, torch.Tensor):
                where = self.locate(a)
                if where is None:
                    return
                if where[0] == -1:  # persistent memory: a constant argument
                    continue
                positions.append(i)
                sources.append(where)
        self.steps.append((launch.rebind(positions), sources))

    def finish(self, result):
        if self.failed:
            return None
        spec = self._result_spec(result)
        if spec is _UNPLANNABLE:
            return None
        return RecordedPlan(self.temps, self.steps, spec)

    def _result_spec(self, value):
        for i, a in enumerate(self.args):
            if value is a and not isinstance(a, (bool, int, float, str, type(None))):
                return ("arg", i)
        if isinstance(value, torch.Tensor):
            where = self.locate(value)
            if where is None or where[0] == -1:
                return _UNPLANNABLE
            return ("array",) + where
        if isinstance(value, (tuple, list)):
            items = [self._result_spec(v) for v in value]
            if any(i is _UNPLANNABLE for i in items):
                return _UNPLANNABLE
            return ("seq", type(value), items)
        if value is None or isinstance(value, (bool, int, float, str)):
            return ("value", value)
        return _UNPLANNABLE


_Tensor = torch.Tensor
# tuples of ints met as arguments (sizes, strides, pairs): a set lookup then stands for the
# element-by-element type check (~10x faster). Equal tuples compare equal whatever their element
# types, so only tuples that start with an int are looked up (a float pair takes the slow path);
# a mixed tuple such as (2, 2.0) would be keyed like (2, 2), which launches the same kernels.
_INT_TUPLES: dict = {}  # (a dict used as a set)


def _known_int_tuple(v):
    try:
        return v in _INT_TUPLES
    except TypeError:  # an unhashable element (a list)
        return False


def _signature(values, arrays):
    """The key a plan depends on for a sequence of arguments (arrays: dtype, shape, strides,
    device and pointer alignment; sequences item by item; anything else by type and value),
    appending the arrays met, in order, to `arrays`."""
    key = []
    for v in values:
        t = type(v)
        if t is _Tensor or isinstance(v, _Tensor):
            arrays.append(v)
            key.append((v.dtype, v.shape, v.stride(), v.get_device(), v.data_ptr() % 16 == 0))
        elif t is tuple or t is list:
            if t is tuple and (not v or type(v[0]) is int) and _known_int_tuple(v):
                key.append(v)
            elif t is tuple and all(type(e) is int for e in v):  # sizes, strides, pairs
                if len(_INT_TUPLES) < 4096:
                    _INT_TUPLES[v] = True
                key.append(v)
            else:
                key.append((t, _signature(v, arrays)))
        else:
            key.append((t, v))
    return tuple(key)


def planned(settings=None, arrays=0):
    """Decorate a launcher (a backend primitive) so that it runs from a recorded plan per
    signature. `settings`: a function returning the global settings the launcher reads (they
    join the key). `arrays`: how many leading positional arguments are arrays (or None, for
    an optional one such as a bias). Calls with no keywords and no arrays after those then take
    a lean path: a key of the arrays' attributes and the other arguments as they are, one dict
    lookup, the plan's replay of those arrays (~2 us less Python a call than the general
    signature). Any other call, and a first call, take the general path. (Equal numbers key
    alike there: a replay for 2.0 where 2 was recorded launches what 2 launched.)"""
    def decorate(fn):
        plans = PlanCache()
        lean = PlanCache()  # (its lookups miss while a plan is recorded, as plans' do)

        @functools.wraps(fn)
        def general(*args, **kwargs):
            if STATE.recorder is not None or STATE.ahead is not None or not PLANS_ENABLED:
                return fn(*args, **kwargs)
            found = []
            key = _signature(args, found)
            if kwargs:
                names = sorted(kwargs)
                key = (key, tuple(names), _signature([kwargs[k] for k in names], found))
            if len(found) > 1:
                key = (key, _aliases([a.data_ptr() for a in found]))
            if settings is not None:
                key = (key, settings())
            try:
                plan = plans.get(key)
            except TypeError:  # an unhashable argument: no plan
                return fn(*args, **kwargs)
            if plan is not None:
                if plan is _UNPLANNABLE:
                    return fn(*args, **kwargs)
                return plan(found, args)
            result = _record(plans, key, found, fn, args, kwargs)
            if arrays and not kwargs and len(args) >= arrays and \
                    len(found) == sum(type(a) is _Tensor for a in args[:arrays]):
                plan = plans.get(key)
                if isinstance(plan, RecordedPlan):  # the arrays were the leading ones: lean too
                    try:
                        lean.keep(_lean_key(args, arrays, settings), plan)
                    except TypeError:  # an unhashable argument (a list): the general path only
                        pass
            return result

        if not arrays:
            general.plans = plans
            return general

        if arrays == 1:
            @functools.wraps(fn)
            def launcher(x, *rest, **kwargs):
                if not kwargs and type(x) is _Tensor and STATE.ahead is None:
                    key = (x.dtype, x.shape, x.stride(), x.get_device(), x.data_ptr() % 16 == 0,
                           rest, settings() if settings is not None else None)
                    try:
                        plan = lean.get(key)
                    except TypeError:  # an unhashable argument
                        plan = None
                    if plan is not None:
                        return plan.replay([x], (x,) + rest)
                return general(x, *rest, **kwargs)
        else:
            @functools.wraps(fn)
            def launcher(*args, **kwargs):
                if not kwargs and STATE.ahead is None and len(args) >= arrays:
                    try:
                        plan = lean.get(_lean_key(args, arrays, settings))
                    except (TypeError, AttributeError):  # unhashable, or not an array
                        plan = None
                    if plan is not None:
                        return plan.replay([a for a in args[:arrays] if a is not None], args)
                return general(*args, **kwargs)

        launcher.plans = plans
        launcher.lean = lean
        return launcher
    return decorate


def _lean_key(args, arrays, settings):
    """planned's lean key: each leading array's dtype, shape, strides, device and alignment,
    then the other arguments as they are, then the settings (one array: flat, as the lean
    launcher writes it inline)."""
    if arrays == 1:
        x = args[0]
        if type(x) is not _Tensor:
            raise TypeError("not an array")
        return (x.dtype, x.shape, x.stride(), x.get_device(), x.data_ptr() % 16 == 0,
                tuple(args[1:]), settings() if settings is not None else None)
    key, starts = [], []
    for x in args[:arrays]:
        if x is None:
            key.append(None)
            continue
        if type(x) is not _Tensor:
            raise TypeError("not an array")
        start = x.data_ptr()
        starts.append(start)
        key.append((x.dtype, x.shape, x.stride(), x.get_device(), start % 16 == 0))
    return (tuple(key), tuple(args[arrays:]), settings() if settings is not None else None,
            _aliases(starts))


def _aliases(starts):
    """Which of a call's arrays start at one address (x @ x, an LSTM given (h, h)), as the index
    of the first array starting there, or () when all start apart (the usual case). A recorded
    launch points at the first array that holds its pointer, so a plan recorded with two arrays
    aliased must not replay two apart, nor the reverse: this joins the key."""
    if len(starts) < 2 or len(set(starts)) == len(starts):
        return ()
    return tuple(starts.index(p) for p in starts)


def _miss(self, key, default=None):
    return default


def _record(plans, key, arrays, fn, args, kwargs):
    recorder = _Recorder(arrays, args)
    STATE.recorder = recorder
    PlanCache.get = _miss  # while recording, every lookup misses (dict.get, C, otherwise)
    try:
        result = fn(*args, **kwargs)
    finally:
        STATE.recorder = None
        del PlanCache.get
    plan = recorder.finish(result)
    plans.keep(key, plan if plan is not None else _UNPLANNABLE)
    return result

