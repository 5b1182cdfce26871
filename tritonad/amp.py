"""Mixed precision, as torch.amp: `td.amp.autocast` (also `td.autocast`), whose per-op policy
lives in autodiff/autocast.py."""
from .autodiff.autocast import (FLOAT32_OPS, autocast, get_autocast_dtype,  # noqa: F401
                                is_autocast_enabled)

__all__ = ["autocast", "is_autocast_enabled", "get_autocast_dtype", "FLOAT32_OPS"]
