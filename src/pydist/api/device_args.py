"""The checks of a call on device tensors, before anything is enqueued or sent.

``checked(target, what, named)`` proves that a call's tensors (``named``: (argument name,
tensor) pairs, the first a device tensor) are all on one device of this rank, of one dtype
pydist moves, and that the group can run them; it binds the group's device engine to that
device (its first call) and returns (engine, device, dtype name). Misuse raises at the call,
naming the argument and the device: a tensor on the host among device tensors, tensors on
two devices, a tensor on another device than the one this rank's group uses, a dtype the
device layer does not move. ``spec`` describes the call as the host's calls are described.
``flat`` and ``blocks`` view a tensor as 1-D and as one block per rank.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ..algorithms._partition import block_bounds, row_split
from ..core.buffers import Buffer
from ..core.opspec import OpSpec, describe
from ..device.arrays import device_for, kind_of, where
from ..device.interface import Device
from ..engines.device import DeviceEngine
from ..groups.device_engines import engine_of
from ..groups.process_group import ProcessGroup


def is_device(obj: Any) -> bool:
    """Whether ``obj`` is a device tensor (CUDA, or the test stand-in)."""
    return kind_of(obj) is not None


def _place(obj: Any) -> str:
    return where(obj) if is_device(obj) else "the host (CPU memory)"


def checked(target: ProcessGroup, what: str, named: list[tuple[str, Any]]) -> tuple[DeviceEngine, Device, str]:
    """(the group's device engine, the device, the dtype name) of a call on device tensors."""
    first_name, first = named[0]
    for name, obj in named[1:]:
        if not is_device(obj):
            raise ValueError(f"{what}: {name} is on {_place(obj)} while {first_name} is on {where(first)}; one "
                             "call's tensors must be on one device (move them with .to(device))")
    rank = target.ranks[target.rank()]
    device = device_for(first, rank)
    dtype_name = ""
    for name, obj in named:
        if obj is not first and device_for(obj, rank) is not device:
            raise ValueError(f"{what}: {name} is on {where(obj)} while {first_name} is on {where(first)}; one "
                             "call's tensors must be on one device")
        try:
            kind = device.describe(obj)[0]
        except (TypeError, ValueError) as error:
            raise type(error)(f"{what}: {name}: {error}") from None
        if not dtype_name:
            dtype_name = kind.name
        elif kind.name != dtype_name:
            raise TypeError(f"{what}: {name}: dtype {kind.name} differs from {first_name}'s {dtype_name}; all "
                            "tensors of one call must share a dtype")
    engine = engine_of(target)
    engine.bind(device, f"{what}: {first_name}", target.timeout)
    return engine, device, dtype_name


def count(device: Device, obj: Any) -> int:
    """The number of elements of a device tensor."""
    return int(np.prod(device.describe(obj)[1]))


def spec(name: str, kind: str, device: Device, obj: Any, dtype_name: str, elements: int | None = None,
         root: int = -1, op: Any = None) -> OpSpec:
    """The OpSpec of a call on device tensors (its fingerprint as a host call's of that dtype;
    ``op``: its reduce op)."""
    shape = device.describe(obj)[1]
    stand_in = Buffer(obj, name, np.empty(0, device.describe(obj)[0].compute), dtype_name, shape)
    return describe(name, kind, stand_in, count=count(device, obj) if elements is None else elements, root=root,
                    op=op)


def flat(device: Device, obj: Any, name: str) -> Any:
    """``obj`` as 1-D (ValueError naming it when it is not contiguous)."""
    try:
        return device.flat(obj)
    except ValueError:
        raise ValueError(f"{name}: expected a contiguous tensor (it is split into one part per rank); pass "
                         ".contiguous()") from None


def blocks(device: Device, obj: Any, parts: int, per_part: int, name: str) -> list[Any]:
    """``obj`` (of ``parts * per_part`` elements) as ``parts`` 1-D blocks."""
    whole = flat(device, obj, name)
    total = count(device, obj)
    if total != parts * per_part:
        raise ValueError(f"{name}: expected {parts} x {per_part} = {parts * per_part} elements (group size x the "
                         f"other tensor's size), got {total}")
    return [whole[start:stop] for start, stop in block_bounds(total, parts)]


def split(device: Device, obj: Any, sizes: list[int] | None, parts: int, name: str) -> list[Any]:
    """``obj`` split along dim 0 by ``sizes`` (rows), or evenly, as 1-D views."""
    whole = flat(device, obj, name)
    return [whole[a:b] for a, b in row_split(device.describe(obj)[1], count(device, obj), sizes, parts, name)]
