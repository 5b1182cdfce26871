"""The triton backend: our @triton.jit kernels, compiled on a GPU, interpreted on a CPU.

Each family module (elementwise.py, reduce.py, ...) holds its kernels and then their launchers,
and lists in PRIMITIVES the backend primitives (backend.py) its launchers implement, under the
same names and signatures. TritonBackend binds them all.
"""
from __future__ import annotations

import importlib

import torch

from . import launch  # sets TRITON_INTERPRET before triton is imported, where there is no GPU
from . import errors, streams
from ..backend import Backend, register_backend

FAMILIES = ("elementwise", "reduce", "random", "index", "matmul", "softmax", "conv", "pool",
            "conv_pool", "optim", "mlp", "augment", "head",
            "norm", "scatter", "attention", "scan", "rnn")  # the layers of small models

class TritonBackend(Backend):
    """Every primitive as our own Triton kernels."""

    name = "triton"
    device_types = ("cpu",) if launch.INTERPRET else ("cuda",)

    @property
    def default_device(self):
        return torch.device("cpu") if launch.INTERPRET else torch.device("cuda",
                                                                         torch.cuda.current_device())

    def check_device(self, op, device):
        device = torch.device(device)
        if launch.INTERPRET and device.type != "cpu":
            raise RuntimeError(f"{op}: Triton runs under its interpreter here (no GPU at import "
                               f"time), which needs CPU tensors, but got one on {device}")
        if not launch.INTERPRET and device.type != "cuda":
            raise RuntimeError(f"{op}: the triton backend runs on the GPU but got a tensor on "
                               f"{device}; move it with .cuda() or use the numpy backend")


    def check_errors(self, device):
        errors.check(device)

    def side_region(self):
        # weight gradients beside the chain only while a CUDA graph is captured (streams.py)
        if not launch.INTERPRET and torch.cuda.is_current_stream_capturing():
            return streams.region()
        return super().side_region()

    def beside(self, *reads):
        return streams.Beside(reads) if streams.is_open() else None


def _bind_families():
    for family in FAMILIES:
        module = importlib.import_module(f".{family}", __name__)
        for name in module.PRIMITIVES:
            setattr(TritonBackend, name, staticmethod(getattr(module, name)))


_bind_families()
register_backend("triton", TritonBackend)
