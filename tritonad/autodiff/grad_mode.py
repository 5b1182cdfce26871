"""Whether operations record history: `no_grad`, `enable_grad`, `set_grad_enabled`."""
from __future__ import annotations

import functools
import threading


class _GradMode(threading.local):
    """Per thread: whether ops record history (read on every op: Function.apply)."""

    def __init__(self):
        self.enabled = True


grad_mode = _GradMode()


def is_grad_enabled() -> bool:
    return grad_mode.enabled


def _set_enabled(mode: bool) -> None:
    grad_mode.enabled = mode


class set_grad_enabled:
    """Turn recording on or off for a block (`with`) or a function (decorator)."""

    def __init__(self, mode: bool = True):
        self.mode = bool(mode)
        self._previous = []

    def __enter__(self):
        self._previous.append(is_grad_enabled())
        _set_enabled(self.mode)
        return self

    def __exit__(self, *exc):
        _set_enabled(self._previous.pop())
        return False

    def __call__(self, fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with self.__class__(self.mode) if type(self) is set_grad_enabled else self.__class__():
                return fn(*args, **kwargs)
        return wrapper


class _BareDecorator(set_grad_enabled):
    """A mode usable as `with mode():`, `@mode()` and, as torch's, the bare `@mode`."""

    def __new__(cls, orig_func=None):
        if orig_func is None:
            return super().__new__(cls)
        if not callable(orig_func):
            raise TypeError(f"{cls.__name__}() takes no arguments, or decorates a function; got "
                            f"{type(orig_func).__name__}")
        return cls()(orig_func)

    def __init__(self, orig_func=None):
        super().__init__(self._mode)


class no_grad(_BareDecorator):
    """Ops inside record no history: `with td.no_grad(): ...`, `@td.no_grad()` or
    `@td.no_grad`."""
    _mode = False


class enable_grad(_BareDecorator):
    """Re-enable recording inside a no_grad block (`with`, `@td.enable_grad()` or bare)."""
    _mode = True
