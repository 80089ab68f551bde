"""reduce_scatter on one host's devices: every rank writes all its parts, rank r reduces the r-th.

A slot is cut into one piece per rank. Per round (a piece's worth of elements): every rank
copies the chunk of its input part j into piece j of its slot (prescaled: PREMUL_SUM), a
barrier, rank r reduces piece r of every slot into its output in rank order. One barrier and
(p-1)/p of a slot into each rank per round. The engine's only device reduce_scatter on one
host. The protocol: device_slots.
"""
from __future__ import annotations

from typing import Any

from ..core.ops import ReduceOp
from .device_slots import DeviceCall, combine, contribute, count_of, dtype_of, piece_elements


def reduce_scatter(call: DeviceCall, output: Any, inputs: list[Any], op: ReduceOp) -> None:
    """``output`` on rank r = the reduction over ranks of their ``inputs[r]`` (each of the output's size)."""
    slots, device, stream = call.slots, call.device, call.stream
    out = device.flat(output)
    parts = [device.flat(part) for part in inputs]
    name = dtype_of(device, out)
    per = piece_elements(slots, name)
    at = slots.rank * per
    for a, b in call.rounds(count_of(device, out), per):
        round_ = slots.begin(stream)
        if b > a:
            for member, part in enumerate(parts):
                contribute(call, round_, name, part[a:b], op, member * per)
        slots.publish(call, round_)
        slots.await_peers(stream, round_, slots.peers)
        if b > a:
            combine(call, round_, name, out[a:b], op, at)
        slots.finish(stream, round_)
    device.postscale(out, op, slots.size, stream)
