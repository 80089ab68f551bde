"""gather on one host's devices: every rank writes its slot, the root copies them all out.

A first barrier exchanges sizes (the root's expected size per rank, every rank's input
size), checked alike on every rank (pydist.algorithms._shm_sizes). Per round (a slot's worth
of the longest part): every rank copies its chunk into its slot, a barrier, the root copies
every slot into its output for that rank. The engine's only device gather on one host. The
protocol: device_slots.
"""
from __future__ import annotations

from typing import Any

from . import _shm_sizes
from .device_slots import DeviceCall, count_of, dtype_of, exchange_sizes


def gather(call: DeviceCall, input: Any, outputs: list[Any] | None, root: int) -> None:
    """``outputs[i]`` on rank ``root`` (a rank of the slots) = rank i's ``input``."""
    slots, device, stream = call.slots, call.device, call.stream
    flat = device.flat(input)
    outs = [device.flat(out) for out in outputs] if outputs is not None else None
    name, n = dtype_of(device, flat), slots.size
    mine = count_of(device, flat)
    expected = [count_of(device, out) for out in outs] if outs is not None else [0] * n
    tables = exchange_sizes(call, expected + [mine])
    if n > 1:
        _shm_sizes.check_rooted(call.operation, tables, root, owner_sends=False)
    longest = int(max(table[n] for table in tables))
    for a, b in call.rounds(longest, slots.capacity(name)):
        round_ = slots.begin(stream)
        if min(b, mine) > a:
            device.copy(slots.view(slots.rank, round_, name, min(b, mine) - a), flat[a:min(b, mine)], stream)
        slots.publish(call, round_)
        if outs is not None:
            slots.await_peers(stream, round_, slots.peers)
            for member, out in enumerate(outs):
                stop = min(b, expected[member])
                if stop > a:
                    device.copy(out[a:stop], slots.view(member, round_, name, stop - a), stream)
        slots.finish(stream, round_)
