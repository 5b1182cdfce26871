"""Weight gradients on a second stream, beside the backward pass's chain of input gradients.

In a backward pass, the gradient of a layer's weight is a leaf of the work: nothing later in
the pass reads it, only the optimizer after it. The input gradients form a chain, each waiting
for the one before. While a CUDA graph is being captured, the engine runs the pass in a *side
region*: a layer (linear or convolution) whose backward writes its weight gradient straight
into the optimizer's gradient buffer, and whose input gradient continues the chain, queues the
weight gradient on a side stream, forked from the main stream where dy is ready, and the main
stream goes on down the chain (nn_ops). The region's end joins the side stream back into the
main one, before anything (the optimizer, gradient clipping, an all-reduce) can read a
gradient. The captured graph then has two branches that the GPU runs at once: on an H200,
MNIST conv2's weight and input gradients took 60 us side by side against 27 + 52 in order,
and the cnn step went 259 -> 238 us, 241 with the linear layers' in order (benchmarks/
profile_step.py, back-to-back graph replays, H200, Triton 3.6, 2026-11-24; notes/PERF.md).

Only under capture: in eager mode each fork and join costs host time (an event record and a
wait, a few microseconds) on a path that is bound by host time at these sizes.

Memory: the side stream reads arrays the main stream allocated (the incoming gradient, the
saved inputs). The region keeps them alive until the join, so that torch's caching allocator
cannot hand their memory to a later main-stream kernel while the side stream may still read it.
What the side stream allocates (workspaces, scratch) it frees and reuses in its own order: the
allocator reuses a block only on the stream it was allocated on.

Launch plans (plans.py) replay on the current stream, so a plan recorded on one stream
replays correctly on the other; the fork happens outside the planned calls (nn_ops).
"""
from __future__ import annotations

import contextlib

import torch


class _Region:
    """The open side region, if any: the streams forked so far and what they read."""

    def __init__(self):
        self.open = False
        self.forked = {}   # device index -> (main stream, side stream)
        self.kept = []     # arrays the side streams read, alive until the join


_REGION = _Region()
_SIDE_STREAMS = {}         # device index -> this process's side stream on that device
forks = 0                  # how many times work went beside (tests, profiles)


def is_open() -> bool:
    return _REGION.open


@contextlib.contextmanager
def region():
    """A backward pass whose weight gradients may run beside it; joined at the end (also when
    the pass raises). A region inside an open one adds nothing: the outer one joins."""
    if _REGION.open:
        yield
        return
    _REGION.open = True
    try:
        yield
    finally:
        _REGION.open = False
        try:
            for main, side in _REGION.forked.values():
                main.wait_stream(side)
        finally:
            _REGION.forked.clear()
            _REGION.kept.clear()


class Beside:
    """`with Beside(arrays):` the launches inside go to the side stream of the arrays' device,
    after everything the main stream has queued so far. Enter only inside an open region."""

    __slots__ = ("reads", "_stream")

    def __init__(self, reads):
        self.reads = [r for r in reads if r is not None]
        self._stream = None

    def __enter__(self):
        global forks
        forks += 1
        device = self.reads[0].device
        index = device.index if device.index is not None else torch.cuda.current_device()
        main = torch.cuda.current_stream(index)
        side = _SIDE_STREAMS.get(index)
        if side is None:
            side = _SIDE_STREAMS[index] = torch.cuda.Stream(index)
        side.wait_stream(main)
        _REGION.forked[index] = (main, side)
        _REGION.kept.extend(self.reads)
        self._stream = torch.cuda.stream(side)
        self._stream.__enter__()
        return self

    def __exit__(self, *exc):
        self._stream.__exit__(*exc)
        self._stream = None
        return False
