"""The strict CPU stand-in for a GPU: what the device layer's tests run on (see .device)."""
from __future__ import annotations

from .device import StandinDevice
from .memory import StandinArray

__all__ = ["StandinArray", "StandinDevice"]
