"""Neural-network building blocks."""
from . import functional  # noqa: F401
