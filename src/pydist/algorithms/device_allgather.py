"""all_gather on one host's devices: every rank writes its slot, every rank copies them all out.

Per round (a slot's worth of the longest part): every rank copies its chunk into its slot,
a barrier, every rank copies each slot into its output for that rank. One barrier and p-1
chunks into each rank per round. Parts may differ in size (all_gather of a list). The
input may be one of the outputs (all_gather_into_tensor in place). The engine's only device
all_gather on one host. The protocol: device_slots.
"""
from __future__ import annotations

from typing import Any

from .device_slots import DeviceCall, count_of, dtype_of


def all_gather(call: DeviceCall, outputs: list[Any], input: Any) -> None:
    """``outputs[i]`` (contiguous) = rank i's ``input``, on every rank."""
    slots, device, stream = call.slots, call.device, call.stream
    flat = device.flat(input)
    outs = [device.flat(out) for out in outputs]
    name = dtype_of(device, flat)
    sizes = [count_of(device, out) for out in outs]
    mine = count_of(device, flat)
    for a, b in call.rounds(max(sizes), slots.capacity(name)):
        round_ = slots.begin(stream)
        if min(b, mine) > a:
            device.copy(slots.view(slots.rank, round_, name, min(b, mine) - a), flat[a:min(b, mine)], stream)
        slots.publish(call, round_)
        slots.await_peers(stream, round_, slots.peers)
        for member, (out, size) in enumerate(zip(outs, sizes)):
            if min(b, size) > a:
                device.copy(out[a:min(b, size)], slots.view(member, round_, name, min(b, size) - a), stream)
        slots.finish(stream, round_)
