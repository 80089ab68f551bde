"""broadcast on one host's devices: the root writes its slot, every other rank copies it out.

Per round (a slot's worth of elements): the root copies its chunk into its slot, a barrier,
every other rank copies the root's slot into its tensor. One barrier and one chunk into
each rank per round. The engine's only device broadcast on one host. The protocol:
device_slots.
"""
from __future__ import annotations

from typing import Any

from .device_slots import DeviceCall, count_of, dtype_of


def broadcast(call: DeviceCall, array: Any, root: int) -> None:
    """``array`` on every rank = ``array`` of rank ``root`` (a rank of the slots)."""
    slots, device, stream = call.slots, call.device, call.stream
    flat = device.flat(array)
    name = dtype_of(device, flat)
    for a, b in call.rounds(count_of(device, flat), slots.capacity(name)):
        round_ = slots.begin(stream)
        if slots.rank == root and b > a:
            device.copy(slots.view(root, round_, name, b - a), flat[a:b], stream)
        slots.publish(call, round_)
        if slots.rank != root:
            slots.await_peers(stream, round_, [root])
            if b > a:
                device.copy(flat[a:b], slots.view(root, round_, name, b - a), stream)
        slots.finish(stream, round_)
