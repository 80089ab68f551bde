"""scatter on one host's devices: the root writes one piece per rank, each rank copies its own.

A first barrier exchanges sizes (the root's part size per rank, every rank's output size),
checked alike on every rank (pydist.algorithms._shm_sizes). A slot is cut into one piece per
rank. Per round (a piece's worth of the longest part): the root copies the chunk of part j
into piece j of its slot, a barrier, every rank copies its piece into its output. The
engine's only device scatter on one host. The protocol: device_slots.
"""
from __future__ import annotations

from typing import Any

from . import _shm_sizes
from .device_slots import DeviceCall, count_of, dtype_of, exchange_sizes, piece_elements


def scatter(call: DeviceCall, output: Any, inputs: list[Any] | None, root: int) -> None:
    """``output`` on rank i = ``inputs[i]`` of rank ``root`` (a rank of the slots)."""
    slots, device, stream = call.slots, call.device, call.stream
    out = device.flat(output)
    parts = [device.flat(part) for part in inputs] if inputs is not None else None
    name, n = dtype_of(device, out), slots.size
    sizes = [count_of(device, part) for part in parts] if parts is not None else [0] * n
    mine = count_of(device, out)
    tables = exchange_sizes(call, sizes + [mine])
    if n > 1:
        _shm_sizes.check_rooted(call.operation, tables, root, owner_sends=True)
    per = piece_elements(slots, name)
    for a, b in call.rounds(int(max(tables[root][:n])), per):
        round_ = slots.begin(stream)
        if parts is not None:
            for member, part in enumerate(parts):
                stop = min(b, sizes[member])
                if stop > a:
                    device.copy(slots.view(root, round_, name, stop - a, member * per), part[a:stop], stream)
        slots.publish(call, round_)
        slots.await_peers(stream, round_, [root])
        if min(b, mine) > a:
            device.copy(out[a:min(b, mine)], slots.view(root, round_, name, min(b, mine) - a, slots.rank * per),
                        stream)
        slots.finish(stream, round_)
