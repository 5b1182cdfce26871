"""Handlers: aten operators on tritonad's primitives. One module per family is imported here."""
from . import elementwise  # noqa: F401
