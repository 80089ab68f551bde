"""all_reduce on one host's devices, one shot: every rank reads every slot.

Per round (a slot's worth of elements): every rank copies its chunk into its slot (and
prescales it: PREMUL_SUM), one barrier, then every rank reduces all the slots into its tensor
in rank order (so every rank computes the same bits). Moves (p-1) chunks into each rank per
round, with one barrier: the latency path, and the engine's choice among two ranks and below
PYDIST_DEVICE_ONE_SHOT_BYTES (device_allreduce_twoshot above). This is device_reduce with
every rank a root. The protocol: device_slots.
"""
from __future__ import annotations

from typing import Any

from ..core.ops import ReduceOp
from .device_reduce import reduce_to


def all_reduce(call: Any, array: Any, op: ReduceOp) -> None:
    """``array`` (contiguous, this rank's device) = the reduction of every rank's ``array``."""
    reduce_to(call, array, op, range(call.slots.size))
