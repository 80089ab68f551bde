"""The element types the device layer moves and reduces, named as torch names them.

Behaviour
    ``DTYPES`` maps each name to its ``DType``: the size of an element, the numpy type that
    holds its bits (bfloat16, which numpy lacks, as uint16 bits; bool as one byte), the numpy
    type that computes with it (bfloat16 widened to float32), and the bits of its *poison*:
    the value the stand-in writes into an output that is not produced yet (a quiet NaN with
    payload 0xA5 for the floats, bytes 0xA5 for the integers and bool), so that a read
    missing a wait sees it. ``is_poison(bits, name)`` finds it element by element.
    ``host_matches(array, name)`` says whether a host numpy array can hold a device array of
    type ``name`` (bfloat16 as int16 or uint16 bits).

Failure modes
    ``dtype(name)`` raises TypeError listing the names for anything else.
"""
from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class DType:
    """One element type: its name, size, storage and compute numpy types, poison bits."""

    name: str
    itemsize: int
    storage: np.dtype
    compute: np.dtype
    poison: int

    @property
    def kind(self) -> str:
        """numpy's kind letter of the values: 'f', 'i', 'u' or 'b'."""
        return self.compute.kind


def _make(name: str, storage: str, compute: str, poison: int) -> DType:
    bits = np.dtype(storage)
    return DType(name, bits.itemsize, bits, np.dtype(compute), poison)


DTYPES: dict[str, DType] = {d.name: d for d in (
    _make("float32", "<u4", "<f4", 0x7FC0_A5A5),
    _make("float64", "<u8", "<f8", 0x7FF8_A5A5_A5A5_A5A5),
    _make("float16", "<u2", "<f2", 0x7EA5),
    _make("bfloat16", "<u2", "<f4", 0x7FE5),
    _make("int8", "u1", "i1", 0xA5),
    _make("int16", "<u2", "<i2", 0xA5A5),
    _make("int32", "<u4", "<i4", 0xA5A5_A5A5),
    _make("int64", "<u8", "<i8", 0xA5A5_A5A5_A5A5_A5A5),
    _make("uint8", "u1", "u1", 0xA5),
    _make("bool", "u1", "?", 0xA5),
)}


def dtype(name: object) -> DType:
    """The DType called ``name``; TypeError for a name the device layer does not move."""
    found = DTYPES.get(name) if isinstance(name, str) else None
    if found is None:
        raise TypeError(f"dtype: expected one of {', '.join(DTYPES)}, got {name!r}")
    return found


def is_poison(bits: np.ndarray, name: str) -> np.ndarray:
    """Which elements of ``bits`` (the storage view of an array of type ``name``) are poison."""
    kind = dtype(name)
    return np.asarray(bits).view(kind.storage) == kind.storage.type(kind.poison)


def host_matches(array: np.ndarray, name: str) -> bool:
    """Whether host ``array`` holds elements of the device type ``name``."""
    kind = dtype(name)
    if name == "bfloat16":
        return array.dtype in (np.dtype(np.int16), np.dtype(np.uint16))
    return array.dtype == kind.compute
