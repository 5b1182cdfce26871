"""Learning-rate schedules, as torch.optim.lr_scheduler: the same recurrences, so the same lr
sequence to the last bit.

    sched = lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=len(loader) * epochs)
    for x, y in loader: ...; opt.step(); sched.step()

A scheduler writes param_groups[i]["lr"] (and OneCycleLR the momentum or beta1), then copies
the changed values into the optimizer's device scalars (`sync`), so a training
step captured in a CUDA graph reads the new learning rate at its next replay. Adam's betas are
frozen at capture (see tritonad.optim): cycling beta1 with a captured Adam step needs
cycle_momentum=False or a fresh capture.
"""
from __future__ import annotations

import math


class LRScheduler:
    """Base class: `step()` advances last_epoch and sets every group's lr to get_lr()."""

    def __init__(self, optimizer, last_epoch=-1):
        self.optimizer = optimizer
        if last_epoch == -1:
            for group in optimizer.param_groups:
                group.setdefault("initial_lr", group["lr"])
        else:
            for i, group in enumerate(optimizer.param_groups):
                if "initial_lr" not in group:
                    raise KeyError(f"param_groups[{i}] has no 'initial_lr': resuming a scheduler "
                                   "(last_epoch >= 0) needs the optimizer state it ran with")
        self.base_lrs = [group["initial_lr"] for group in optimizer.param_groups]
        self.last_epoch = last_epoch
        self._step_count = 0
        self._initial = True  # the first step() only records the starting learning rates
        self.step()
        self._initial = False

    def get_lr(self):
        raise NotImplementedError

    def step(self):
        """Advance one step (or epoch) and set the new learning rates."""
        self._step_count += 1
        self.last_epoch += 1
        lrs = self.get_lr()
        for group, lr in zip(self.optimizer.param_groups, lrs):
            group["lr"] = lr
        self._last_lr = [group["lr"] for group in self.optimizer.param_groups]
        sync = getattr(self.optimizer, "sync", None)
        if sync is not None:
            sync()

    def get_last_lr(self):
        """The learning rates set by the last step()."""
        return list(self._last_lr)

    def _current_lrs(self):
        return [group["lr"] for group in self.optimizer.param_groups]

    def state_dict(self):
        """Everything but the optimizer, as plain numbers, strings, lists and dicts."""
        return {key: value for key, value in self.__dict__.items() if key != "optimizer"}

    def load_state_dict(self, state_dict):
        self.__dict__.update(state_dict)


class StepLR(LRScheduler):
    """lr = initial_lr * gamma ** (epoch // step_size): multiplied by gamma every step_size steps.
    `StepLR(opt, step_size=30, gamma=0.1)`"""

    def __init__(self, optimizer, step_size, gamma=0.1, last_epoch=-1):
        if int(step_size) <= 0:
            raise ValueError(f"StepLR: step_size must be positive, got {step_size}")
        self.step_size, self.gamma = int(step_size), gamma
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        if self.last_epoch == 0 or self.last_epoch % self.step_size != 0:
            return self._current_lrs()
        return [lr * self.gamma for lr in self._current_lrs()]


class CosineAnnealingLR(LRScheduler):
    """lr = eta_min + (initial_lr - eta_min) (1 + cos(pi epoch / T_max)) / 2, computed as torch
    does: each step rescales the current lr (so outside changes to lr carry on), and past T_max
    the cosine continues (a period of 2 T_max). `CosineAnnealingLR(opt, T_max=100)`"""

    def __init__(self, optimizer, T_max, eta_min=0.0, last_epoch=-1):
        if T_max <= 0:
            raise ValueError(f"CosineAnnealingLR: T_max must be positive, got {T_max}")
        self.T_max, self.eta_min = T_max, eta_min
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        t, period, low = self.last_epoch, self.T_max, self.eta_min
        if self._initial:
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


def _per_group(name, groups, value):
    """One value per parameter group from a number or a list/tuple of them."""
    if isinstance(value, (list, tuple)):
        if len(value) != len(groups):
            raise ValueError(f"{name}: expected {len(groups)} values (one per parameter group), "
                             f"got {len(value)}")
        return list(value)
    return [value] * len(groups)
