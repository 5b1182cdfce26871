"""The global random-number state: a seed and a counter (Philox is counter-based).

Each draw of n numbers takes the counters [offset, offset + n) and advances the offset, so the
same seed gives the same numbers on every backend, and saving (seed, offset) saves the stream.
"""
from __future__ import annotations

import contextlib
import time

import torch

_state = {"seed": 0, "offset": 0}
# inside counted_from(): the device base of the draws and the count drawn since entering
_counted = {"base": None, "used": 0}


def manual_seed(seed: int) -> None:
    """Seed every random draw that follows (`td.manual_seed(0)`)."""
    if not isinstance(seed, int) or seed < 0:
        raise ValueError(f"manual_seed: expected a non-negative int, got {seed!r}")
    _state["seed"] = seed & 0xFFFFFFFFFFFFFFFF
    _state["offset"] = 0


def seed() -> int:
    """Seed from the clock and return the seed used."""
    s = time.time_ns() & 0xFFFFFFFFFFFFFFFF
    manual_seed(s)
    return s


def initial_seed() -> int:
    return _state["seed"]


def take(n: int) -> tuple[int, int]:
    """(seed, offset) for a draw of n numbers; advances the counter past them. Inside
    counted_from() the offset is relative to the device base and the host counter stays."""
    if _counted["base"] is not None:
        used = _counted["used"]
        _counted["used"] = used + max(int(n), 1)
        return _state["seed"], used
    if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        raise RuntimeError("a random draw inside a captured CUDA graph would repeat the same "
                           "numbers at every replay; draw outside the captured step (or run "
                           "the step eagerly, e.g. `train --no-graph`)")
    seed_, offset = _state["seed"], _state["offset"]
    _state["offset"] = offset + max(int(n), 1)
    return seed_, offset


@contextlib.contextmanager
def counted_from(base):
    """Draws whose counters start at a device value: inside, a draw of n numbers from the global
    stream takes the counters base + [k, k + n), where base is an int64 [1] device array and k
    the count drawn inside before it. The random kernels read base when they run, so a CUDA
    graph captured inside draws new numbers at every replay once the caller writes the stream's
    offset into base before it (tritonad.capture.CapturedStep does, and then advances the host
    counter by the count): the replays draw what eager steps would have. The host counter does
    not move inside. Yields a dict whose "used" is the count drawn so far. td.Generator streams
    are not counted (a draw from one inside a capture raises, as before)."""
    if _counted["base"] is not None:
        raise RuntimeError("counted_from: already counting from a device base")
    _counted.update(base=base, used=0)
    try:
        yield _counted
    finally:
        _counted["base"] = None


def device_base():
    """The int64 [1] device array that draws are counted from (counted_from), or None."""
    return _counted["base"]


def advance(n: int) -> None:
    """Move the global stream's counter past n numbers (drawn where the host did not count
    them: a replayed graph's draws)."""
    _state["offset"] += int(n)


def get_rng_state() -> dict:
    return dict(_state)


def set_rng_state(state: dict) -> None:
    _state["seed"] = int(state["seed"])
    _state["offset"] = int(state["offset"])


# ---- td.Generator: a random stream of its own, for the functions that take generator=


class Generator:
    """A Philox stream of its own (a seed and a counter), as torch.Generator: give it as
    `generator=` to draw from it instead of the global stream; the same seed gives the same
    numbers on every backend.  `g = td.Generator().manual_seed(0); td.randint(10, (3,),
    generator=g)`"""

    def __init__(self, device="cpu"):
        self.device = device
        self._seed, self._offset = 67280421310721, 0  # (torch.Generator's default seed)

    def manual_seed(self, seed):
        if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
            raise ValueError(f"Generator.manual_seed: expected a non-negative int, got {seed!r}")
        self._seed, self._offset = seed & 0xFFFFFFFFFFFFFFFF, 0
        return self

    def seed(self):
        self.manual_seed(time.time_ns() & 0xFFFFFFFFFFFFFFFF)
        return self._seed

    def initial_seed(self):
        return self._seed

    def get_state(self):
        return {"seed": self._seed, "offset": self._offset}

    def set_state(self, state):
        self._seed, self._offset = int(state["seed"]), int(state["offset"])
        return self

    def take(self, n):
        """(seed, offset) for a draw of n numbers; advances this stream's counter past them."""
        if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
            raise RuntimeError("a random draw inside a captured CUDA graph would repeat the same "
                               "numbers at every replay; draw outside the captured step")
        offset = self._offset
        self._offset = offset + max(int(n), 1)
        return self._seed, offset


def take_from(generator, n):
    """(seed, offset) for a draw of n numbers from `generator` (a td.Generator), or from the
    global stream when it is None."""
    if generator is None:
        return take(n)
    if not isinstance(generator, Generator):
        raise TypeError(f"generator must be a td.Generator, got {type(generator).__name__}")
    return generator.take(n)
