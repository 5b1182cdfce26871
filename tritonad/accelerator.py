"""`td.accelerator`: PyTorch's device-agnostic queries (`torch.accelerator`), for tritonad's one
kind of accelerator, CUDA GPUs."""
from __future__ import annotations

import torch


def is_available() -> bool:
    return torch.cuda.is_available()


def current_accelerator():
    """torch.device("cuda") when a GPU is there, else None."""
    return torch.device("cuda") if torch.cuda.is_available() else None


def device_count() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def synchronize(device=None) -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize(device)
