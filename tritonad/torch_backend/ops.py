"""Handlers: aten operators on tritonad's primitives. Each module below registers its handlers
when imported (one line per module)."""
import importlib

for _module in (
    "elementwise",
    "reductions",
    "linalg",
    "copies",
    "softmax",
    "indexing",
):
    importlib.import_module(f".{_module}", __package__)
