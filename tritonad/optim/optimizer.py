"""The optimizer base class and the flat buffers behind the fused updates.

At construction an optimizer copies the parameters of each group (per device) into one flat
float32 buffer and re-points every parameter at its slice (`p.data` becomes a view: the
parameter keeps its identity). A flat gradient buffer of the same layout is lent to the autodiff
engine as each parameter's `_grad_buffer`, so backward writes every `.grad` into it; the state
(momentum, Adam's moments) lives in flat buffers of the same layout, so one kernel launch updates
everything. Fused subclasses (tritonad/optim/__init__.py, adaptive.py) implement `_update`.

A hand-written optimizer (a subclass that implements `update(param, grad, state, group)` or
`step()` instead, see tritonad/optim/__init__.py) keeps its parameters as they are and its state
in per-parameter dicts, as torch's optimizers do.
"""
from __future__ import annotations

import collections
import contextlib
import copy

import torch

from .. import dtypes
from ..autodiff.grad_mode import enable_grad, no_grad
from ..backend import get_backend
from ..tensor import Tensor, tensor

ALIGN = 4  # elements: 16 bytes of float32, the pointer alignment Triton specialises on
PAD = 16   # flat buffers are padded to a multiple of this many elements

# What step() runs on the gradients before updating (tritonad.distributed adds its averaging
# across processes here): objects with reduce_bucket(bucket, present) -> present, called for
# each flat bucket once its gradients are collected, and reduce_params(params), called with a
# hand-written optimizer's parameters.
GRADIENT_HOOKS = []


def _capturing() -> bool:
    """Whether kernels launched now are recorded into a CUDA graph instead of running."""
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def _refuse_under_capture(what):
    if _capturing():
        raise RuntimeError(f"optimizer: {what} while a CUDA graph is being captured would be "
                           "replayed at every step; run one step() eagerly before capturing")


def _number(value):
    return value if isinstance(value, Tensor) else float(value)


def _same_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a is b or (a.data_ptr() == b.data_ptr() and a.shape == b.shape and
                      a.stride() == b.stride() and a.device == b.device and a.dtype == b.dtype)


class _FlatBucket:
    """The parameters of one group on one device, laid out in one flat buffer.

    Holds the flat parameter and gradient buffers, the lazily created state buffers, the device
    scalars of the hyperparameters, Adam's step counters and which slots have state.
    """

    def __init__(self, params, device, hyper_names=("lr",), dtype=dtypes.float32):
        backend = get_backend()
        # aligned sizes first: every slice of them starts on a 16-byte boundary (stable sort)
        self.params = sorted(params, key=lambda p: p.numel() % ALIGN != 0)
        self.offsets, total = [], 0
        for p in self.params:
            self.offsets.append(total)
            total += p.numel()
        # NOTE: the buffers end with zeros up to a multiple of 16 elements, so that the kernels'
        # length is divisible by 16 and Triton vectorises their masked loads; zero gradients
        # and zero state leave the zero padding unchanged under SGD and Adam
        self.numel, self.device, self.dtype = -(-total // PAD) * PAD, device, dtype
        self.flat = backend.empty([self.numel], dtype, device)
        backend.fill_(self.flat[total:], 0.0)
        self.grad_flat = backend.full([self.numel], 0.0, dtype, device)
        self.views = [self.slot(self.flat, i) for i in range(len(self.params))]
        self.grad_views = [self.slot(self.grad_flat, i) for i in range(len(self.params))]
        for i, p in enumerate(self.params):
            backend.copy_(self.views[i], p._data)
            p.data = self.views[i]
            p._grad_buffer = self.grad_views[i]
            if p.grad is not None:
                backend.copy_(self.grad_views[i], p.grad._data)
                p.grad = Tensor._wrap(self.grad_views[i])
        self.buffers = {}          # state name -> flat buffer
        # the device scalars of the hyperparameters: one slot per name in `hyper`, and the Python
        # value each slot holds; while `fed`, someone else writes the slots (see
        # Optimizer.fed_hyperparameters)
        self.hyper_names = tuple(hyper_names)
        self.hyper = backend.empty([len(self.hyper_names)], dtypes.float32, device)
        self.scalars = {}          # hyperparameter name -> the Python value in its slot
        self.fed = False
        self.initialized = [False] * len(self.params)   # slots that have state
        self.cohort = [0] * len(self.params)            # Adam: slots sharing a step counter
        self.counters = {}                              # cohort -> step count, float32 [1]

    def slot(self, flat, i):
        """Slot i of a flat buffer, shaped like parameter i."""
        start = self.offsets[i]
        return flat[start:start + self.params[i].numel()].view(self.params[i].shape)

    def span(self, flat, start, end):
        return flat if (start, end) == (0, self.numel) else flat[start:end]

    def spans(self, start, end, *flats):
        """span() of each flat buffer (None stays None)."""
        return [None if flat is None else self.span(flat, start, end) for flat in flats]

    def buffer(self, name):
        """A flat state buffer, zeros when first asked for."""
        if name not in self.buffers:
            _refuse_under_capture(f"creating the state {name!r}")
            self.buffers[name] = get_backend().full([self.numel], 0.0, self.dtype,
                                                    self.device)
        return self.buffers[name]

    def scalar(self, name, value):
        """The device scalar holding hyperparameter `name`, refilled when the value changed."""
        if isinstance(value, Tensor):
            if value.numel() != 1 or value.dtype is not dtypes.float32 or \
                    value.device != self.device:
                raise ValueError(f"a tensor {name} must hold one float32 value on {self.device}, "
                                 f"got shape {value.shape}, {value.dtype} on {value.device}")
            return value._data.reshape(1)
        slot = self.hyper_names.index(name)
        raw = self.hyper[slot:slot + 1]
        if self.fed:
            return raw
        if name in self.scalars and (self.scalars[name] == value or _capturing()):
            # NOTE: a captured step never refills: at replay it reads what sync() last wrote
            return raw
        if name not in self.scalars:
            _refuse_under_capture(f"setting the device scalar {name!r} for the first time")
        get_backend().fill_(raw, float(value))
        self.scalars[name] = value
        return raw

    def collect_grads(self):
        """Re-point parameters and gradients into the flat buffers; which slots have a grad."""
        backend = get_backend()
        present = []
        for i, p in enumerate(self.params):
            if not _same_memory(p._data, self.views[i]):   # p.data was replaced since
                if p.device != self.device:
                    raise RuntimeError(f"a parameter of shape {p.shape} moved from {self.device} "
                                       f"to {p.device} after the optimizer was made; make the "
                                       "optimizer after model.to(device)")
                backend.copy_(self.views[i], p._data)
                p.data = self.views[i]
            p._grad_buffer = self.grad_views[i]
            g = p.grad
            if g is None:
                present.append(False)
                continue
            if not _same_memory(g._data, self.grad_views[i]):  # a .grad assigned by hand
                if g.shape != p.shape:
                    raise RuntimeError(f"parameter of shape {p.shape} has a .grad of shape "
                                       f"{g.shape}")
                backend.copy_(self.grad_views[i], g.to(self.device)._data)
                p.grad = Tensor._wrap(self.grad_views[i])
            present.append(True)
        return present

    def runs(self, present, key=None):
        """(start, end, key) element ranges of consecutive slots that have a grad and equal
        keys (key: a list, one per slot, or None): the whole buffer in the usual case."""
        if all(present) and (key is None or key.count(key[0]) == len(key)):
            return [(0, self.numel, key[0] if key else None)]
        out = []
        for i, here in enumerate(present):
            k = key[i] if key else None
            end = self.offsets[i] + self.params[i].numel()
            if here and out and out[-1][1] == self.offsets[i] and out[-1][2] == k:
                out[-1] = (out[-1][0], end, k)
            elif here:
                out.append((self.offsets[i], end, k))
        return out

    def split_cohorts(self, present):
        """Before a step: the cohorts (slots sharing a step counter) that take it.

        Slots skipped at this step (no grad) split off into a cohort with a copy of the counter,
        so every parameter counts its own steps, as torch's per-parameter state["step"]."""
        if all(present):  # the usual case: nothing to split
            return sorted(set(self.cohort))
        stepping = sorted(set(k for k, here in zip(self.cohort, present) if here))
        for c in stepping:
            absent = [i for i, (k, here) in enumerate(zip(self.cohort, present))
                      if k == c and not here]
            if absent:
                split = max(self.cohort + list(self.counters)) + 1
                self.counters[split] = get_backend().contiguous(self.counter(c))
                for i in absent:
                    self.cohort[i] = split
        return stepping

    def advance_steps(self, present, keep=None):
        """Add 1 to the step counters of the slots that have a grad (one launch per cohort),
        for updates that read the count (Adam's bias corrections); keep: None, or a 1-element
        device array added instead (0 where a GradScaler skips the step, else 1)."""
        backend = get_backend()
        for c in self.split_cohorts(present):
            counter = self.counter(c)
            backend.add(counter, 1.0 if keep is None else keep, out=counter)

    def counted_runs(self, present):
        """runs() of the slots with a grad, one cohort each, as (start, end, counter or None)
        for updates that count their step in their own launch but never read the count: the
        first run of each cohort gets its counter to increment, later runs of it None."""
        self.split_cohorts(present)
        counted = set()
        for start, end, cohort in self.runs(present, self.cohort):
            yield start, end, None if cohort in counted else self.counter(cohort)
            counted.add(cohort)

    def counter(self, cohort):
        """The step counter of a cohort (zero when first asked for)."""
        if cohort not in self.counters:
            _refuse_under_capture("creating a step counter")
            self.counters[cohort] = get_backend().full([1], 0.0, dtypes.float32, self.device)
        return self.counters[cohort]

    def set_steps(self, steps):
        """Step counts per slot (numbers, from a state dict): one cohort per distinct value."""
        values = sorted(set(steps))
        self.cohort = [values.index(s) for s in steps]
        self.counters = {c: get_backend().full([1], float(v), dtypes.float32, self.device)
                         for c, v in enumerate(values)}

    def reset_state(self):
        self.buffers, self.counters = {}, {}
        self.initialized = [False] * len(self.params)
        self.cohort = [0] * len(self.params)


class Optimizer:
    """Base class of the optimizers: parameter groups, state, zero_grad, state_dict.

    Two kinds of subclass:
    - fused (SGD, Adam, ...): implement `_update(group, bucket, present)`, one launch per run of
      a flat bucket's slots that have a gradient (see _FlatBucket);
    - hand-written: implement `update(param, grad, state, group)` with tritonad ops (called
      under no_grad for each parameter that has a gradient; `state` is that parameter's dict,
      empty at first), or override `step()` as in torch, with `self.state[p]` as the dict.
      Slower (several launches per parameter) but any rule works, on parameters of any dtype.
    param_groups, state_dict, load_state_dict and the lr schedulers work the same for both.
    """

    _device_hyperparameters = ("lr",)  # group keys the kernels read from device scalars
    _state_names = ()                  # fused: the names of the flat state buffers
    _keeps_steps = False               # fused: state["step"] from the bucket's step counters
    _fused_dtypes = (dtypes.float32,)  # fused: the parameter dtypes its kernel updates
    # fused: its kernels read a device flag that skips the step (amp.GradScaler sets _skip to
    # (found_inf, keep) raw arrays for one step() so that no host read is needed)
    _reads_skip = False
    _skip = None

    def __init__(self, params, defaults):
        self.defaults = dict(defaults)
        self.param_groups = []
        self._buckets = []
        self._fused = type(self)._update is not Optimizer._update
        self._state = collections.defaultdict(dict)  # hand-written: {param: {name: value}}
        if isinstance(params, Tensor):
            raise TypeError(f"{type(self).__name__}: params must be an iterable of tensors or "
                            "of dicts, got a single tensor; pass [tensor]")
        groups = list(params)
        if not groups:
            raise ValueError(f"{type(self).__name__} got an empty parameter list")
        if not isinstance(groups[0], dict):
            groups = [{"params": groups}]
        for group in groups:
            self.add_param_group(group)

    def add_param_group(self, param_group):
        """Add a group ({"params": [...], and hyperparameters overriding the defaults})."""
        group = dict(param_group)
        params = group["params"]
        params = [params] if isinstance(params, Tensor) else list(params)
        seen = {id(p) for g in self.param_groups for p in g["params"]}
        for i, p in enumerate(params):
            if not isinstance(p, Tensor):
                raise TypeError(f"{type(self).__name__}: parameter {i} is a "
                                f"{type(p).__name__}, not a tritonad Tensor")
            if not p.is_leaf:
                raise ValueError(f"{type(self).__name__}: can't optimize a non-leaf tensor "
                                 f"(parameter {i}, shape {p.shape}); pass "
                                 "t.detach().requires_grad_()")
            if self._fused and p.dtype not in self._fused_dtypes:
                raise TypeError(f"{type(self).__name__}: parameter {i} (shape {p.shape}) has dtype "
                                f"{p.dtype}; it updates parameters of dtype "
                                f"{' or '.join(d.name for d in self._fused_dtypes)}")
            if id(p) in seen:
                raise ValueError(f"{type(self).__name__}: parameter {i} (shape {p.shape}) appears "
                                 "twice in the parameter groups")
            seen.add(id(p))
        group["params"] = params
        for key, value in self.defaults.items():
            group.setdefault(key, value)
        self._check_group(group)
        by_device = {}  # one flat bucket per device and dtype
        for p in params if self._fused else ():
            by_device.setdefault((p.device, p.dtype), []).append(p)
        buckets = [_FlatBucket(ps, device, self._device_hyperparameters, dtype)
                   for (device, dtype), ps in by_device.items()]
        self.param_groups.append(group)
        self._buckets.append(buckets)
        for bucket in buckets:
            self._init_state(group, bucket)

    def _check_group(self, group):
        if "lr" in group and not isinstance(group["lr"], Tensor):
            self._check_range(group, "lr")

    def _check_range(self, group, key, low=0.0, high=None, high_open=False):
        """A clear error unless low <= group[key] <= high (< high if high_open)."""
        value = group[key]
        try:
            ok = low <= value and (high is None or (value < high if high_open else value <= high))
        except TypeError:
            ok = False
        if not ok or isinstance(value, bool):
            bound = f">= {low}" if high is None else \
                f"in [{low}, {high}{')' if high_open else ']'}"
            raise ValueError(f"{type(self).__name__}: invalid {key} {value!r} (must be a number "
                             f"{bound})")

    def _init_state(self, group, bucket):
        """Fused: state that exists before the first step (Adagrad's sum), for a new bucket and
        after load_state_dict; slots that have it are marked initialized."""

    # -------------------------------------------------------------------- the update
    def sync(self):
        """Copy changed hyperparameters (lr, and momentum for SGD) of param_groups into the
        device scalars the kernels read; one fill launch per changed value. step() and the
        schedulers call it; call it yourself after changing lr by hand while replaying a
        captured step."""
        for group, buckets in zip(self.param_groups, self._buckets):
            for name in self._device_hyperparameters:
                if name == "momentum" and group.get("momentum", 0) == 0:
                    continue
                for bucket in buckets:
                    bucket.scalar(name, group[name])

    def hyperparameter_values(self):
        """The device hyperparameters, flat: for each group, each of its buckets (one per
        device), each name of _device_hyperparameters; numbers as floats (a tensor lr stays a
        Tensor). fed_hyperparameters() yields the device arrays that hold them, in this order."""
        return [_number(group.get(name, 0.0)) for group, buckets in
                zip(self.param_groups, self._buckets) for _ in buckets
                for name in self._device_hyperparameters]

    @contextlib.contextmanager
    def fed_hyperparameters(self):
        """Hand the device scalars of the hyperparameters to the caller for a while.

        Inside, sync() and step() never write them: the caller does, for instance a captured
        training step that copies each step's values from a table the host fills ahead
        (tritonad.train.Trainer: no launch per step for a learning-rate schedule). Yields the
        device arrays, one per bucket, holding hyperparameter_values() in order. On leaving,
        the next sync() writes every value again. Tensor hyperparameters cannot be fed.
        A hand-written optimizer has no device scalars: it yields an empty list."""
        for group in self.param_groups:
            for name in self._device_hyperparameters:
                if isinstance(group.get(name), Tensor):
                    raise ValueError(f"{type(self).__name__}: a tensor {name} is read in place "
                                     "and cannot be fed")
        buckets = [b for bs in self._buckets for b in bs]
        for bucket in buckets:
            bucket.fed = True
        try:
            yield [bucket.hyper for bucket in buckets]
        finally:
            for bucket in buckets:
                bucket.fed = False
                bucket.scalars.clear()

    def step(self, closure=None):
        """Update every parameter that has a gradient; returns closure()'s loss if given."""
        loss = None
        if closure is not None:
            with enable_grad():
                loss = closure()
        if not self._fused:
            for hook in GRADIENT_HOOKS:
                hook.reduce_params([p for group in self.param_groups for p in group["params"]])
            with no_grad():
                for group in self.param_groups:
                    for p in group["params"]:
                        if p.grad is not None:
                            self.update(p, p.grad, self._state[p], group)
            return loss
        self.sync()
        for group, buckets in zip(self.param_groups, self._buckets):
            for bucket in buckets:
                present = bucket.collect_grads()
                for hook in GRADIENT_HOOKS:
                    present = hook.reduce_bucket(bucket, present)
                if not any(present):
                    continue
                self._update(group, bucket, present)
                for i, here in enumerate(present):
                    if here:  # updated in place: saved copies of it are stale now
                        bucket.initialized[i] = True
                        bucket.params[i]._bump_version()
        return loss

    def update(self, param, grad, state, group):
        """Hand-written optimizers: update `param` in place from `grad` (tritonad ops; step()
        calls it under no_grad for every parameter that has a gradient). `state` is the
        parameter's own dict (empty at its first step): keep tensors and numbers there, they go
        into state_dict(). `group` is the parameter's group: read hyperparameters from it, as
        schedulers change them there."""
        raise NotImplementedError(f"{type(self).__name__}: implement update(param, grad, state, "
                                  "group) (or step()) to write an optimizer")

    def _update(self, group, bucket, present):
        raise NotImplementedError

    def zero_grad(self, set_to_none=True):
        """Forget the gradients (set_to_none=True, no launch) or zero them in place (one fill
        launch per flat gradient buffer, and one per gradient outside them)."""
        backend = get_backend()
        for group, buckets in zip(self.param_groups, self._buckets):
            if set_to_none:
                for p in group["params"]:
                    p.grad = None
                continue
            in_flat = set()
            for bucket in buckets:
                backend.fill_(bucket.grad_flat, 0.0)
                in_flat.update(id(p) for i, p in enumerate(bucket.params) if p.grad is not None
                               and _same_memory(p.grad._data, bucket.grad_views[i]))
            for p in group["params"]:
                if p.grad is not None and id(p) not in in_flat:
                    backend.fill_(p.grad._data, 0.0)

    # -------------------------------------------------------------------- state
    def _locate(self):
        """(index across groups, group, bucket, slot) for every parameter, in group order."""
        index = 0
        for group, buckets in zip(self.param_groups, self._buckets):
            where = {id(p): (b, i) for b in buckets for i, p in enumerate(b.params)}
            for p in group["params"]:
                yield (index, group) + where[id(p)]
                index += 1

    def _slot_state(self, bucket, i):
        """The state of one parameter as {name: Tensor}: views of the flat buffers (and the
        step count, a 0-d view of its counter, where the optimizer keeps one)."""
        state = {name: Tensor._wrap(bucket.slot(flat, i)) for name, flat in bucket.buffers.items()}
        if self._keeps_steps:
            state["step"] = Tensor._wrap(bucket.counter(bucket.cohort[i]).view(()))
        return state

    def _load_slot_state(self, bucket, i, entry):
        """Copy one parameter's saved state into the flat buffers; whether there was any."""
        loaded = False
        for name, value in entry.items():
            if name not in self._state_names or value is None:
                continue
            value = _raw(value, bucket.device)
            target = bucket.slot(bucket.buffer(name), i)
            if tuple(value.shape) != tuple(target.shape):
                raise ValueError(f"load_state_dict: state {name!r} has shape "
                                 f"{tuple(value.shape)}, its parameter {tuple(target.shape)}")
            get_backend().copy_(target, value)
            loaded = True
        return loaded

    @property
    def state(self):
        """{parameter: {name: Tensor}} as torch's optimizer.state (fused: views, not copies; a
        hand-written optimizer's own dicts)."""
        if not self._fused:
            return self._state
        state = {}
        for _, _, bucket, i in self._locate():
            entry = self._slot_state(bucket, i) if bucket.initialized[i] else None
            if entry:
                state[bucket.params[i]] = entry
        return state

    def state_dict(self):
        """{"state": {index: {name: Tensor}}, "param_groups": [{..., "params": [index]}]}, as
        torch's. Like torch's, the tensors share memory with the optimizer: clone to keep."""
        state, groups = {}, []
        if self._fused:
            for index, group, bucket, i in self._locate():
                entry = self._slot_state(bucket, i) if bucket.initialized[i] else None
                if entry:
                    state[index] = entry
        else:
            params = [p for group in self.param_groups for p in group["params"]]
            state = {index: dict(self._state[p]) for index, p in enumerate(params)
                     if self._state.get(p)}
        index = 0
        for group in self.param_groups:
            saved = {k: v for k, v in group.items() if k != "params"}
            saved["params"] = list(range(index, index + len(group["params"])))
            index += len(group["params"])
            groups.append(saved)
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict):
        """Restore hyperparameters and state saved by state_dict() (from a checkpoint too, or
        from torch.optim's state_dict of the same optimizer)."""
        saved_groups = state_dict["param_groups"]
        if len(saved_groups) != len(self.param_groups):
            raise ValueError(f"load_state_dict: the state dict has {len(saved_groups)} parameter "
                             f"groups, this optimizer {len(self.param_groups)}")
        for k, (saved, group) in enumerate(zip(saved_groups, self.param_groups)):
            if len(saved["params"]) != len(group["params"]):
                raise ValueError(f"load_state_dict: group {k} has {len(saved['params'])} "
                                 f"parameters in the state dict, {len(group['params'])} here")
        for saved, group in zip(saved_groups, self.param_groups):
            group.update({key: (tuple(v) if key == "betas" else v)
                          for key, v in saved.items() if key != "params"})
        state = {int(k): v for k, v in state_dict["state"].items()}
        saved_indices = [j for g in saved_groups for j in g["params"]]
        if not self._fused:
            params = [p for group in self.param_groups for p in group["params"]]
            self._state.clear()
            for p, saved_index in zip(params, saved_indices):
                if saved_index in state:
                    self._state[p] = {name: _copied(value, p.device)
                                      for name, value in state[saved_index].items()}
            return
        positions = {}
        for (index, group, bucket, i), saved_index in zip(self._locate(), saved_indices):
            positions[saved_index] = (bucket, i)
        for buckets in self._buckets:
            for bucket in buckets:
                bucket.reset_state()
        steps = {}
        for saved_index, entry in state.items():
            bucket, i = positions[saved_index]
            bucket.initialized[i] = self._load_slot_state(bucket, i, entry)
            if entry.get("step") is not None:
                steps.setdefault(id(bucket), (bucket, {}))[1][i] = float(entry["step"])
        for bucket, known in steps.values():
            bucket.set_steps([known.get(i, 0.0) for i in range(len(bucket.params))])
        for group, buckets in zip(self.param_groups, self._buckets):
            for bucket in buckets:
                self._init_state(group, bucket)

    def __repr__(self):
        lines = [f"{type(self).__name__} ("]
        for k, group in enumerate(self.param_groups):
            lines.append(f"Parameter Group {k}")
            lines += [f"    {key}: {group[key]}" for key in sorted(group) if key != "params"]
        return "\n".join(lines + [")"])


def torch_only_flags(name, differentiable=False):
    """torch.optim's switches between its implementations (foreach, fused, capturable) are
    accepted so that torch code runs unchanged, and ignored: tritonad's step is always fused and
    capturable. differentiable=True (gradients through the step) is refused."""
    if differentiable:
        raise NotImplementedError(f"{name}: differentiable=True (gradients through the "
                                  "optimizer step) is not supported")


def _raw(value, device):
    """A raw array on `device` from a Tensor, a torch tensor, a number or a numpy array."""
    if isinstance(value, torch.Tensor):
        value = Tensor._wrap(value)
    if not isinstance(value, Tensor):
        value = tensor(value, dtype=dtypes.float32)
    return value.to(device)._data


def _copied(value, device):
    """A loaded state value of a hand-written optimizer: tensors (tritonad's or torch's) as new
    tritonad tensors on the parameter's device (never sharing the state dict's memory); other
    values as they are."""
    if isinstance(value, torch.Tensor):
        value = Tensor._wrap(value)
    if isinstance(value, Tensor):
        return Tensor._wrap(get_backend().contiguous(value.to(device)._data))
    return copy.deepcopy(value)
