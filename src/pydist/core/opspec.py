"""OpSpec: what one collective call is, described once by the public function that took it.

The same value goes to ``ProcessGroup.run``, the flight recorder and the timeline (what the
call was), the engine (``OpContext.spec``: its algorithm choice and the desync fingerprint
``call`` that every message and arena sync carries). Nothing learns what a call is any other
way. A spec holds no array (a recorder entry keeps it after the call); this run of the call
(its sequence number, deadline) is the OpContext's.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .buffers import Buffer, dtype_name
from .fingerprint import fingerprint
from .ops import RedOpType


@dataclass(frozen=True, slots=True, eq=False)
class OpSpec:
    """One call. ``name``: the public function ("all_gather_into_tensor"); ``kind``: the
    engine collective it runs ("all_gather"); ``dtype``: the data's dtype name as the user
    gave it (torch's or numpy's), None without data; ``count``: the elements per rank that
    describe it (the buffer of broadcast/all_reduce/reduce, the largest part of an all_gather,
    the output of scatter/reduce_scatter, the input of gather, the total input of all_to_all);
    ``root``: a group rank, -1 when unrooted; ``call``: the fingerprint (``_fingerprint``).
    Specs compare and hash by identity: ``describe`` hands out one object per distinct call
    (bounded), so an engine can cache per spec cheaply."""
    name: str
    kind: str
    dtype: str | None = None
    count: int = 0
    root: int = -1
    reduce_op: RedOpType | None = None
    call: int = 0


_SPECS: dict[tuple, OpSpec] = {}  # calls repeat: the same description is reused (bounded, see describe)
_SPECS_KEPT = 4096


def describe(name: str, kind: str, data: Buffer | np.ndarray | None = None, count: int | None = None,
             root: int = -1, reduce_op: RedOpType | None = None) -> OpSpec:
    """The OpSpec of a call of ``name`` running engine collective ``kind`` on ``data`` (whose
    dtype it carries, None: no data); ``count`` defaults to the data's size."""
    array: np.ndarray | None
    dtype: str | None
    if isinstance(data, Buffer):
        array, dtype = data.array, data.dtype_name
    else:
        array, dtype = data, None if data is None else dtype_name(data.dtype)
    if count is None:
        count = 0 if array is None else array.size
    key = (name, kind, dtype, None if array is None else array.dtype, count, root, reduce_op)
    spec = _SPECS.get(key)
    if spec is None:
        call = fingerprint(kind, None if array is None else array.dtype, count, root, reduce_op or 0)
        if len(_SPECS) >= _SPECS_KEPT:
            _SPECS.clear()
        spec = _SPECS[key] = OpSpec(name, kind, dtype, count, root, reduce_op, call)
    return spec
