"""Learning-rate schedules, as torch.optim.lr_scheduler: the same recurrences, so the same lr
sequence to the last bit (and the same get_last_lr(), last_epoch and state_dict()).

    sched = lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=len(loader) * epochs)
    for x, y in loader: ...; opt.step(); sched.step()

    # warm-up chaining: 5 steps of linear warm-up, then cosine annealing
    warmup = lr_scheduler.LinearLR(opt, start_factor=0.1, total_iters=5)
    cosine = lr_scheduler.CosineAnnealingLR(opt, T_max=95)
    sched = lr_scheduler.SequentialLR(opt, [warmup, cosine], milestones=[5])

Available: StepLR, MultiStepLR, ExponentialLR, LinearLR, ConstantLR, LambdaLR,
CosineAnnealingLR, OneCycleLR and SequentialLR. They work with every tritonad optimizer, fused
or hand-written. A scheduler writes param_groups[i]["lr"] (and OneCycleLR the momentum or
beta1; a tensor lr is filled in place), then copies the changed values into the optimizer's
device scalars (`sync`), so a training step captured in a CUDA graph reads the new learning
rate at its next replay. Adam's betas are frozen at capture (see tritonad.optim): cycling
beta1 with a captured Adam step needs cycle_momentum=False or a fresh capture.
"""
from __future__ import annotations

import bisect
import collections
import math
import types
import warnings

from ..autodiff.grad_mode import no_grad
from ..tensor import Tensor


def _value(value):
    """A copy of a group value that never aliases it (a tensor lr is filled in place)."""
    return value.clone() if isinstance(value, Tensor) else value


def _set_group_value(group, key, value):
    """group[key] = value; a tensor group[key] is filled in place, so whoever reads it on the
    device (a captured step) sees the new value."""
    if isinstance(group[key], Tensor):
        with no_grad():
            group[key].fill_(value)
    else:
        group[key] = value


class LRScheduler:
    """Base class: `step()` advances last_epoch and sets every group's lr to get_lr().

    Subclasses implement get_lr() (the next lrs from the current ones, as torch's chainable
    form) and may implement _get_closed_form_lr() (the lrs at last_epoch from base_lrs, used by
    the deprecated step(epoch) and by SequentialLR at its milestones)."""

    _is_initial = False  # True during the first step() that the constructor makes

    def __init__(self, optimizer, last_epoch=-1):
        if not hasattr(optimizer, "param_groups"):
            raise TypeError(f"{type(self).__name__}: expected an optimizer, got "
                            f"{type(optimizer).__name__}")
        self.optimizer = optimizer
        if last_epoch == -1:
            for group in optimizer.param_groups:
                group.setdefault("initial_lr", _value(group["lr"]))
        else:
            for i, group in enumerate(optimizer.param_groups):
                if "initial_lr" not in group:
                    raise KeyError(f"{type(self).__name__}: param_groups[{i}] has no "
                                   "'initial_lr': resuming a scheduler (last_epoch >= 0) needs "
                                   "the optimizer state it ran with")
        self.base_lrs = [_value(group["initial_lr"]) for group in optimizer.param_groups]
        self.last_epoch = last_epoch
        self._initial_step()

    def _initial_step(self):
        """Reset the step count and take the first step, which records the starting lrs."""
        self._step_count = 0
        self._is_initial = True
        try:
            self.step()
        finally:
            self._is_initial = False

    def get_lr(self):
        raise NotImplementedError

    def step(self, epoch=None):
        """Advance one step (or epoch) and set the new learning rates. (`epoch`, deprecated
        in torch too, jumps to that epoch, by the closed form where there is one.)"""
        self._step_count += 1
        if epoch is not None:
            warnings.warn(f"{type(self).__name__}.step(epoch) is deprecated (as in torch); call "
                          "step() once per step", UserWarning, stacklevel=2)
        self._update_lr(epoch)

    def _update_lr(self, epoch=None):
        if epoch is None:
            self.last_epoch += 1
            lrs = self.get_lr()
        else:
            self.last_epoch = epoch
            closed_form = getattr(self, "_get_closed_form_lr", None)
            lrs = closed_form() if closed_form is not None else self.get_lr()
        for group, lr in zip(self.optimizer.param_groups, lrs):
            _set_group_value(group, "lr", lr)
        self._last_lr = self._current_lrs()
        sync = getattr(self.optimizer, "sync", None)
        if sync is not None:
            sync()

    def get_last_lr(self):
        """The learning rates set by the last step()."""
        return list(self._last_lr)

    def _current_lrs(self):
        return [_value(group["lr"]) for group in self.optimizer.param_groups]

    def state_dict(self):
        """Everything but the optimizer, as plain numbers, strings, lists and dicts."""
        return {key: value for key, value in self.__dict__.items() if key != "optimizer"}

    def load_state_dict(self, state_dict):
        self.__dict__.update(state_dict)


def _check_int(name, key, value, low):
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name}: {key} must be an int >= {low}, got {value!r}")


class StepLR(LRScheduler):
    """lr = initial_lr * gamma ** (epoch // step_size): multiplied by gamma every step_size steps.
    `StepLR(opt, step_size=30, gamma=0.1)`"""

    def __init__(self, optimizer, step_size, gamma=0.1, last_epoch=-1):
        _check_int("StepLR", "step_size", step_size, 1)
        self.step_size, self.gamma = step_size, gamma
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        if self.last_epoch == 0 or self.last_epoch % self.step_size != 0:
            return self._current_lrs()
        return [lr * self.gamma for lr in self._current_lrs()]

    def _get_closed_form_lr(self):
        return [base * self.gamma ** (self.last_epoch // self.step_size)
                for base in self.base_lrs]


class MultiStepLR(LRScheduler):
    """lr = initial_lr * gamma ** (number of milestones <= epoch): multiplied by gamma at each
    milestone (twice at a milestone given twice). `MultiStepLR(opt, milestones=[30, 80])`"""

    def __init__(self, optimizer, milestones, gamma=0.1, last_epoch=-1):
        milestones = list(milestones)
        for m in milestones:
            _check_int("MultiStepLR", "each milestone", m, 0)
        self.milestones = collections.Counter(milestones)
        self.gamma = gamma
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        if self.last_epoch not in self.milestones:
            return self._current_lrs()
        return [lr * self.gamma ** self.milestones[self.last_epoch]
                for lr in self._current_lrs()]

    def _get_closed_form_lr(self):
        milestones = sorted(self.milestones.elements())
        return [base * self.gamma ** bisect.bisect_right(milestones, self.last_epoch)
                for base in self.base_lrs]


class ExponentialLR(LRScheduler):
    """lr = initial_lr * gamma ** epoch: multiplied by gamma at every step.
    `ExponentialLR(opt, gamma=0.95)`"""

    def __init__(self, optimizer, gamma, last_epoch=-1):
        self.gamma = gamma
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        if self._is_initial:  # NOTE: as torch, a resumed scheduler starts from the current lr
            return self._current_lrs()
        return [lr * self.gamma for lr in self._current_lrs()]

    def _get_closed_form_lr(self):
        return [base * self.gamma ** self.last_epoch for base in self.base_lrs]


class ConstantLR(LRScheduler):
    """lr = initial_lr * factor for the first total_iters steps, then initial_lr (a constant
    warm-up). `ConstantLR(opt, factor=0.5, total_iters=4)`"""

    def __init__(self, optimizer, factor=1.0 / 3, total_iters=5, last_epoch=-1):
        if not 0 <= factor <= 1:
            raise ValueError(f"ConstantLR: factor must lie in [0, 1], got {factor!r}")
        _check_int("ConstantLR", "total_iters", total_iters, 0)
        self.factor, self.total_iters = factor, total_iters
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        if self.last_epoch == 0:
            return [lr * self.factor for lr in self._current_lrs()]
        if self.last_epoch != self.total_iters:
            return self._current_lrs()
        return [lr * (1.0 / self.factor) for lr in self._current_lrs()]

    def _get_closed_form_lr(self):
        return [base * (self.factor + (self.last_epoch >= self.total_iters) * (1 - self.factor))
                for base in self.base_lrs]


class LinearLR(LRScheduler):
    """lr = initial_lr * a factor going linearly from start_factor to end_factor over
    total_iters steps, then constant (a linear warm-up, or decay).
    `LinearLR(opt, start_factor=0.1, total_iters=5)`"""

    def __init__(self, optimizer, start_factor=1.0 / 3, end_factor=1.0, total_iters=5,
                 last_epoch=-1):
        if not 0 < start_factor <= 1:
            raise ValueError(f"LinearLR: start_factor must lie in (0, 1], got {start_factor!r}")
        if not 0 <= end_factor <= 1:
            raise ValueError(f"LinearLR: end_factor must lie in [0, 1], got {end_factor!r}")
        _check_int("LinearLR", "total_iters", total_iters, 1)
        self.start_factor, self.end_factor = start_factor, end_factor
        self.total_iters = total_iters
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        if self.last_epoch == 0:
            return [lr * self.start_factor for lr in self._current_lrs()]
        if self._is_initial or self.last_epoch > self.total_iters:
            return self._current_lrs()
        # the ratio of consecutive factors, applied to the current lr (torch's recurrence)
        rise = self.end_factor - self.start_factor
        ratio = 1.0 + rise / (self.total_iters * self.start_factor + (self.last_epoch - 1) * rise)
        return [lr * ratio for lr in self._current_lrs()]

    def _get_closed_form_lr(self):
        rise = self.end_factor - self.start_factor
        return [base * (self.start_factor
                        + rise * min(self.total_iters, self.last_epoch) / self.total_iters)
                for base in self.base_lrs]


class LambdaLR(LRScheduler):
    """lr = initial_lr * lr_lambda(epoch), one function for all groups or one per group.
    `LambdaLR(opt, lambda epoch: 0.95 ** epoch)`"""

    def __init__(self, optimizer, lr_lambda, last_epoch=-1):
        groups = optimizer.param_groups
        self.lr_lambdas = list(lr_lambda) if isinstance(lr_lambda, (list, tuple)) else \
            [lr_lambda] * len(groups)
        if len(self.lr_lambdas) != len(groups):
            raise ValueError(f"LambdaLR: expected {len(groups)} lr_lambdas (one per parameter "
                             f"group), got {len(self.lr_lambdas)}")
        for fn in self.lr_lambdas:
            if not callable(fn):
                raise TypeError(f"LambdaLR: lr_lambda must be callable, got {type(fn).__name__}")
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        return [base * fn(self.last_epoch) for fn, base in zip(self.lr_lambdas, self.base_lrs)]

    def state_dict(self):
        """As torch: plain functions are not saved (None); callable objects save __dict__."""
        state = {k: v for k, v in self.__dict__.items() if k not in ("optimizer", "lr_lambdas")}
        state["lr_lambdas"] = [None if isinstance(fn, types.FunctionType) else
                               dict(fn.__dict__) for fn in self.lr_lambdas]
        return state

    def load_state_dict(self, state_dict):
        state = dict(state_dict)
        saved = state.pop("lr_lambdas", [])
        self.__dict__.update(state)
        for fn, attributes in zip(self.lr_lambdas, saved):
            if attributes is not None:
                fn.__dict__.update(attributes)


class CosineAnnealingLR(LRScheduler):
    """lr = eta_min + (initial_lr - eta_min) (1 + cos(pi epoch / T_max)) / 2, computed as torch
    does: each step rescales the current lr (so outside changes to lr carry on), and past T_max
    the cosine continues (a period of 2 T_max). `CosineAnnealingLR(opt, T_max=100)`"""

    def __init__(self, optimizer, T_max, eta_min=0.0, last_epoch=-1):
        if isinstance(T_max, bool) or not isinstance(T_max, (int, float)) or not T_max > 0:
            raise ValueError(f"CosineAnnealingLR: T_max must be positive, got {T_max!r}")
        self.T_max, self.eta_min = T_max, eta_min
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        t, period, low = self.last_epoch, self.T_max, self.eta_min
        if self._is_initial:
            return self._current_lrs()
        if self._step_count == 1 and t > 0:  # resumed: the closed form
            return [low + (base - low) * (1 + math.cos(t * math.pi / period)) / 2
                    for base in self.base_lrs]
        if (t - 1 - period) % (2 * period) == 0:  # the trough: climb by the first step's drop
            return [lr + (base - low) * (1 - math.cos(math.pi / period)) / 2
                    for lr, base in zip(self._current_lrs(), self.base_lrs)]
        # the ratio of consecutive values of the closed form, applied to the current lr
        ratio = (1 + math.cos(math.pi * t / period)) / (1 + math.cos(math.pi * (t - 1) / period))
        return [ratio * (lr - low) + low for lr in self._current_lrs()]

    def _get_closed_form_lr(self):
        return [self.eta_min + (base - self.eta_min) *
                (1 + math.cos(math.pi * self.last_epoch / self.T_max)) / 2
                for base in self.base_lrs]


class OneCycleLR(LRScheduler):
    """The 1cycle policy (Smith & Topin): lr rises from max_lr / div_factor to max_lr over the
    first pct_start of total_steps, then anneals to initial_lr / final_div_factor (three_phase:
    back down to the initial lr first); momentum (SGD) or beta1 (Adam) cycles the opposite way
    between max_momentum and base_momentum. Step it after every batch.
    `OneCycleLR(opt, max_lr=0.1, epochs=10, steps_per_epoch=len(loader))`"""

    def __init__(self, optimizer, max_lr, total_steps=None, epochs=None, steps_per_epoch=None,
                 pct_start=0.3, anneal_strategy="cos", cycle_momentum=True, base_momentum=0.85,
                 max_momentum=0.95, div_factor=25.0, final_div_factor=1e4, three_phase=False,
                 last_epoch=-1):
        if total_steps is not None:
            if not isinstance(total_steps, int) or total_steps <= 0:
                raise ValueError(f"OneCycleLR: total_steps must be a positive int, got "
                                 f"{total_steps}")
            self.total_steps = total_steps
        elif epochs is not None and steps_per_epoch is not None:
            if not isinstance(epochs, int) or epochs <= 0 or not isinstance(steps_per_epoch, int) \
                    or steps_per_epoch <= 0:
                raise ValueError(f"OneCycleLR: epochs and steps_per_epoch must be positive ints, "
                                 f"got {epochs} and {steps_per_epoch}")
            self.total_steps = epochs * steps_per_epoch
        else:
            raise ValueError("OneCycleLR: give total_steps, or epochs and steps_per_epoch")
        if not 0 <= pct_start <= 1:
            raise ValueError(f"OneCycleLR: pct_start must lie in [0, 1], got {pct_start}")
        if anneal_strategy not in ("cos", "linear"):
            raise ValueError(f"OneCycleLR: anneal_strategy must be 'cos' or 'linear', got "
                             f"{anneal_strategy!r}")
        self.anneal_strategy = anneal_strategy
        # phases: (last step of the phase, lr from, lr to, momentum from, momentum to)
        up = float(pct_start * self.total_steps) - 1
        if three_phase:
            self.phases = [(up, "initial_lr", "max_lr", "max_momentum", "base_momentum"),
                           (float(2 * pct_start * self.total_steps) - 2, "max_lr", "initial_lr",
                            "base_momentum", "max_momentum"),
                           (self.total_steps - 1, "initial_lr", "min_lr", "max_momentum",
                            "max_momentum")]
        else:
            self.phases = [(up, "initial_lr", "max_lr", "max_momentum", "base_momentum"),
                           (self.total_steps - 1, "max_lr", "min_lr", "base_momentum",
                            "max_momentum")]
        groups = optimizer.param_groups
        if last_epoch == -1:
            for group, top in zip(groups, _per_group("max_lr", groups, max_lr)):
                group["initial_lr"] = top / div_factor
                group["max_lr"] = top
                group["min_lr"] = group["initial_lr"] / final_div_factor
        self.cycle_momentum = cycle_momentum
        if cycle_momentum:
            if "momentum" not in optimizer.defaults and "betas" not in optimizer.defaults:
                raise ValueError("OneCycleLR: cycle_momentum needs an optimizer with momentum or "
                                 "betas")
            self.use_beta1 = "betas" in optimizer.defaults
            if last_epoch == -1:
                for group, high, low in zip(groups,
                                            _per_group("max_momentum", groups, max_momentum),
                                            _per_group("base_momentum", groups, base_momentum)):
                    self._set_momentum(group, high)
                    group["max_momentum"], group["base_momentum"] = high, low
        super().__init__(optimizer, last_epoch)

    def _set_momentum(self, group, value):
        if self.use_beta1:
            group["betas"] = (value, *group["betas"][1:])
        else:
            group["momentum"] = value

    def _anneal(self, start, end, pct):
        if self.anneal_strategy == "cos":
            return end + (start - end) / 2.0 * (math.cos(math.pi * pct) + 1)
        return (end - start) * pct + start

    def get_lr(self):
        step = self.last_epoch
        if step > self.total_steps:
            raise ValueError(f"OneCycleLR: stepped {step} times, but total_steps is "
                             f"{self.total_steps}")
        lrs = []
        for group in self.optimizer.param_groups:
            start = 0.0
            for k, (end, lr_from, lr_to, mom_from, mom_to) in enumerate(self.phases):
                if step <= end or k == len(self.phases) - 1:
                    pct = (step - start) / (end - start)
                    lrs.append(self._anneal(group[lr_from], group[lr_to], pct))
                    if self.cycle_momentum:
                        self._set_momentum(group, self._anneal(group[mom_from], group[mom_to],
                                                               pct))
                    break
                start = end
        return lrs


class SequentialLR(LRScheduler):
    """Runs schedulers one after another: schedulers[i] from milestones[i - 1] on, each
    starting again from the initial lr (by its closed form) at its milestone. The usual use is
    a warm-up: `SequentialLR(opt, [LinearLR(opt, 0.1, total_iters=5),
    CosineAnnealingLR(opt, T_max=95)], milestones=[5])`"""

    def __init__(self, optimizer, schedulers, milestones, last_epoch=-1):
        schedulers, milestones = list(schedulers), list(milestones)
        if not schedulers:
            raise ValueError("SequentialLR: expects at least one scheduler, got none")
        for i, scheduler in enumerate(schedulers):
            if not isinstance(scheduler, LRScheduler):
                raise TypeError(f"SequentialLR: schedulers[{i}] is a {type(scheduler).__name__}, "
                                "not a tritonad lr scheduler")
            if scheduler.optimizer is not optimizer:
                raise ValueError(f"SequentialLR: schedulers[{i}] ({type(scheduler).__name__}) "
                                 "belongs to another optimizer than the one given")
        if len(milestones) != len(schedulers) - 1:
            raise ValueError(f"SequentialLR: expects one milestone fewer than schedulers, got "
                             f"{len(schedulers)} schedulers and {len(milestones)} milestones")
        for m in milestones:
            _check_int("SequentialLR", "each milestone", m, 0)
        if milestones != sorted(milestones):
            raise ValueError(f"SequentialLR: milestones must be increasing, got {milestones}")
        self._schedulers, self._milestones = schedulers, milestones
        self.last_epoch = last_epoch + 1
        self.optimizer = optimizer
        # undo the first steps the schedulers took when they were made, then start the first
        for group in optimizer.param_groups:
            _set_group_value(group, "lr", group["initial_lr"])
        for scheduler in schedulers:
            _undo_first_step(scheduler)
        first = self._schedulers[bisect.bisect_right(milestones, 0)]
        first._initial_step()
        self._last_lr = first.get_last_lr()

    def step(self):
        """Advance one step: the current scheduler steps, or the next one starts."""
        self.last_epoch += 1
        k = bisect.bisect_right(self._milestones, self.last_epoch)
        scheduler = self._schedulers[k]
        if k > 0 and self._milestones[k - 1] == self.last_epoch:
            scheduler._update_lr(0)  # as torch: from the initial lr, by the closed form
        else:
            scheduler.step()
        self._last_lr = scheduler.get_last_lr()

    def state_dict(self):
        """Its own state and each scheduler's (the optimizer left out)."""
        state = {k: v for k, v in self.__dict__.items() if k not in ("optimizer", "_schedulers")}
        state["_schedulers"] = [s.state_dict() for s in self._schedulers]
        return state

    def load_state_dict(self, state_dict):
        state = dict(state_dict)
        saved = state.pop("_schedulers")
        if len(saved) != len(self._schedulers):
            raise ValueError(f"SequentialLR.load_state_dict: the state has {len(saved)} "
                             f"schedulers, this one {len(self._schedulers)}")
        self.__dict__.update(state)
        for scheduler, entry in zip(self._schedulers, saved):
            scheduler.load_state_dict(entry)


def _undo_first_step(scheduler):
    """Take back the first step of a scheduler (of each inner one of a SequentialLR)."""
    if isinstance(scheduler, SequentialLR):
        for inner in scheduler._schedulers:
            _undo_first_step(inner)
    else:
        scheduler.last_epoch -= 1


def _per_group(name, groups, value):
    """One value per parameter group from a number or a list/tuple of them."""
    if isinstance(value, (list, tuple)):
        if len(value) != len(groups):
            raise ValueError(f"{name}: expected {len(groups)} values (one per parameter group), "
                             f"got {len(value)}")
        return list(value)
    return [value] * len(groups)
