"""all_to_all on one host's devices: every rank writes one piece per rank, each copies its own.

A first barrier exchanges every rank's send and receive sizes (parts may differ:
all_to_all_single with split sizes), so every rank checks every pair and runs the same
number of rounds (pydist.algorithms._shm_sizes). A slot is cut into one piece per rank. Per
round (a piece's worth of the longest part): every rank copies the chunk of its part for
rank j into piece j of its slot, a barrier, every rank copies piece r of every slot into
its output for that rank. The engine's only device all_to_all on one host. The protocol:
device_slots.
"""
from __future__ import annotations

from typing import Any

from . import _shm_sizes
from .device_slots import DeviceCall, count_of, dtype_of, exchange_sizes, piece_elements


def all_to_all(call: DeviceCall, outputs: list[Any], inputs: list[Any]) -> None:
    """``outputs[j]`` on rank i = ``inputs[i]`` of rank j (contiguous device arrays)."""
    slots, device, stream = call.slots, call.device, call.stream
    outs = [device.flat(out) for out in outputs]
    ins = [device.flat(part) for part in inputs]
    name, n, me = dtype_of(device, ins[0]), slots.size, slots.rank
    sent = [count_of(device, part) for part in ins]
    expected = [count_of(device, out) for out in outs]
    tables = exchange_sizes(call, sent + expected)
    for sender in range(n):
        for receiver in range(n):
            if tables[sender][receiver] != tables[receiver][n + sender]:
                raise _shm_sizes.mismatch(call.operation, sender, receiver, int(tables[sender][receiver]),
                                          int(tables[receiver][n + sender]))
    per = piece_elements(slots, name)
    for a, b in call.rounds(int(max(table.max() for table in tables)), per):
        round_ = slots.begin(stream)
        for member, part in enumerate(ins):
            stop = min(b, sent[member])
            if stop > a:
                device.copy(slots.view(me, round_, name, stop - a, member * per), part[a:stop], stream)
        slots.publish(call, round_)
        slots.await_peers(stream, round_, slots.peers)
        for member, out in enumerate(outs):
            stop = min(b, expected[member])
            if stop > a:
                device.copy(out[a:stop], slots.view(member, round_, name, stop - a, me * per), stream)
        slots.finish(stream, round_)
