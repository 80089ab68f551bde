"""all_reduce on one host's devices in two shots: reduce-scatter, then all-gather.

Per round (a slot's worth of elements, cut in one block per rank): every rank copies its
chunk into its slot (prescaled: PREMUL_SUM), a barrier; rank r reduces block r of every slot
into block r of its own slot (which no peer reads before the next barrier), a barrier; every
rank copies block p of rank p's slot into its tensor. Moves 2(p-1)/p chunks into each rank
per round (one shot: p-1), with two barriers: the engine's choice from
PYDIST_DEVICE_ONE_SHOT_BYTES up. The protocol: device_slots.
"""
from __future__ import annotations

from typing import Any

from ..core.ops import ReduceOp
from ._partition import block_bounds
from .device_slots import DeviceCall, contribute, count_of, dtype_of


def all_reduce(call: DeviceCall, array: Any, op: ReduceOp) -> None:
    """``array`` (contiguous, this rank's device) = the reduction of every rank's ``array``."""
    slots, device, stream = call.slots, call.device, call.stream
    flat = device.flat(array)
    name = dtype_of(device, flat)
    me = slots.rank
    for a, b in call.rounds(count_of(device, flat), slots.capacity(name)):
        round_ = slots.begin(stream)
        blocks = block_bounds(b - a, slots.size)
        if b > a:
            contribute(call, round_, name, flat[a:b], op)
        slots.publish(call, round_, 0)
        slots.await_peers(stream, round_, slots.peers, 0)
        lo, hi = blocks[me]
        if hi > lo:
            acc = slots.view(me, round_, name, hi - lo, lo)
            for member in slots.peers:
                device.reduce_into(acc, slots.view(member, round_, name, hi - lo, lo), op, stream)
        slots.publish(call, round_, 1)
        slots.await_peers(stream, round_, slots.peers, 1)
        for member, (lo, hi) in enumerate(blocks):
            if hi > lo:
                device.copy(flat[a + lo:a + hi], slots.view(member, round_, name, hi - lo, lo), stream)
        slots.finish(stream, round_)
    device.postscale(flat, op, slots.size, stream)
