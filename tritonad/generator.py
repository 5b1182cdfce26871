"""The global random-number state: a seed and a counter (Philox is counter-based).

Each draw of n numbers takes the counters [offset, offset + n) and advances the offset, so the
same seed gives the same numbers on every backend, and saving (seed, offset) saves the stream.
"""
from __future__ import annotations

import time

import torch

_state = {"seed": 0, "offset": 0}


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
    """(seed, offset) for a draw of n numbers; advances the counter past them."""
    if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        raise RuntimeError("a random draw inside a captured CUDA graph would repeat the same "
                           "numbers at every replay; draw outside the captured step (or run "
                           "the step eagerly, e.g. `train --no-graph`)")
    seed_, offset = _state["seed"], _state["offset"]
    _state["offset"] = offset + max(int(n), 1)
    return seed_, offset


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
