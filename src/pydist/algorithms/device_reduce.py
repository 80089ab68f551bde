"""reduce on one host's devices: every rank writes its slot, the root reduces them all.

Per round (a slot's worth of elements): every rank copies its chunk into its slot
(prescaled: PREMUL_SUM), a barrier, the root reduces every slot into its tensor in rank
order. One barrier per round; p-1 chunks into the root. The other ranks' tensors are left as
they were. The engine's only device reduce on one host; ``reduce_to`` with every rank a root
is the one-shot all_reduce. The protocol: device_slots.
"""
from __future__ import annotations

from collections.abc import Collection
from typing import Any

from ..core.ops import ReduceOp
from .device_slots import DeviceCall, combine, contribute, count_of, dtype_of


def reduce(call: DeviceCall, array: Any, root: int, op: ReduceOp) -> None:
    """``array`` on rank ``root`` (a rank of the slots) = the reduction of every rank's ``array``."""
    reduce_to(call, array, op, (root,))


def reduce_to(call: DeviceCall, array: Any, op: ReduceOp, roots: Collection[int]) -> None:
    """``array`` on each rank of ``roots`` = the reduction of every rank's ``array``."""
    slots, device, stream = call.slots, call.device, call.stream
    flat = device.flat(array)
    name = dtype_of(device, flat)
    receives = slots.rank in roots
    for a, b in call.rounds(count_of(device, flat), slots.capacity(name)):
        round_ = slots.begin(stream)
        if b > a:
            contribute(call, round_, name, flat[a:b], op)
        slots.publish(call, round_)
        if receives:
            slots.await_peers(stream, round_, slots.peers)
            if b > a:
                combine(call, round_, name, flat[a:b], op)
        slots.finish(stream, round_)
    if receives:
        device.postscale(flat, op, slots.size, stream)
