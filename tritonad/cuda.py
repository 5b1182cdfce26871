"""`td.cuda`: the GPU queries PyTorch scripts use (`td.cuda.is_available()` and friends).

Tensors on a cuda device run on the triton backend; these only ask torch, which holds the
device memory, about the devices.
"""
from __future__ import annotations

import torch


def is_available() -> bool:
    """Whether a CUDA GPU is there (tensors with device="cuda" then run our compiled kernels)."""
    return torch.cuda.is_available()


def device_count() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def current_device() -> int:
    return torch.cuda.current_device()


def set_device(device) -> None:
    torch.cuda.set_device(device)


def get_device_name(device=None) -> str:
    return torch.cuda.get_device_name(device)


def synchronize(device=None) -> None:
    """Wait for every kernel queued on the device (a read of the device reports the errors
    kernels found in the data; see td.set_sync_checks)."""
    torch.cuda.synchronize(device)


def manual_seed(seed) -> None:
    """tritonad has one random stream for every device: the same as td.manual_seed(seed)."""
    from .generator import manual_seed as seed_all

    seed_all(seed)


manual_seed_all = manual_seed
