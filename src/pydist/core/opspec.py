"""OpSpec: what one collective call is, described once by the public function that took it.

The same value goes to ``ProcessGroup.run``, the flight recorder and the timeline (what the
call was), the engine (``OpContext.spec``: its plan for the call, and the desync fingerprint
``call`` that every message and arena sync carries). Nothing learns what a call is any other
way. A spec holds no array (a recorder entry keeps it after the call); this run of the call
(its sequence number, deadline) is the OpContext's.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .buffers import Buffer, dtype_name
from .fingerprint import fingerprint
from .ops import RedOpType, ReduceOp, as_reduce_op, check_op_dtype


@dataclass(frozen=True, slots=True, eq=False)
class OpSpec:
    """One call. ``name``: the public function ("all_gather_into_tensor"); ``kind``: the
    engine collective it runs ("all_gather"); ``dtype``: the data's dtype name as the user
    gave it (torch's or numpy's), None without data; ``count``: the elements per rank that
    describe it (the buffer of broadcast/all_reduce/reduce, the largest part of an all_gather,
    the output of scatter/reduce_scatter, the input of gather, the total input of all_to_all);
    ``root``: a group rank, -1 when unrooted; ``reduce_op``: the reduction's kind; ``call``:
    the fingerprint (``_fingerprint``); ``op``: the checked ReduceOp of every call of this
    spec, None without a reduction or for PREMUL_SUM, whose factor is each call's (``op_of``).
    Specs compare and hash by identity: ``describe`` hands out one object per distinct call
    (bounded), so an engine can cache per spec cheaply."""
    name: str
    kind: str
    dtype: str | None = None
    count: int = 0
    root: int = -1
    reduce_op: RedOpType | None = None
    call: int = 0
    op: ReduceOp | None = None


_SPECS: dict[tuple, OpSpec] = {}  # calls repeat: the same description is reused (bounded, see describe)
_SPECS_KEPT = 4096


def describe(name: str, kind: str, data: Buffer | np.ndarray | None = None, count: int | None = None,
             root: int = -1, op: Any = None) -> OpSpec:
    """The OpSpec of a call of ``name`` running engine collective ``kind`` on ``data`` (whose
    dtype it carries, None: no data); ``count`` defaults to the data's size. ``op``: the
    reduce op as the caller gave it, checked against the data's dtype the first time
    (TypeError/ValueError, as ``as_reduce_op`` and ``check_op_dtype``)."""
    array: np.ndarray | None
    dtype: str | None
    if isinstance(data, Buffer):
        array, dtype = data.array, data.dtype_name
    else:
        array, dtype = data, None if data is None else dtype_name(data.dtype)
    if count is None:
        count = 0 if array is None else array.size
    key = (name, kind, dtype, None if array is None else array.dtype, count, root, op)
    try:
        return _SPECS[key]
    except (KeyError, TypeError):  # (TypeError: an unhashable op object, keyed by its ReduceOp below)
        pass
    given = key
    checked = None
    if op is not None:
        if array is None or dtype is None:
            raise TypeError(f"{name}: a reduce op needs data to reduce")
        checked = as_reduce_op(op)
        check_op_dtype(checked, array.dtype, dtype)
        shared = checked.factor is None  # PREMUL_SUM: one spec for every factor
        key = key[:-1] + (checked if shared else RedOpType.PREMUL_SUM,)
    spec = _SPECS.get(key)
    if spec is None:
        reduce_op = None if checked is None else checked.op
        spec = OpSpec(name, kind, dtype, count, root, reduce_op,
                      fingerprint(kind, None if array is None else array.dtype, count, root, reduce_op or 0),
                      checked if checked is not None and checked.factor is None else None)
        if len(_SPECS) >= _SPECS_KEPT:
            _SPECS.clear()
        _SPECS[key] = spec
    if checked is not None and checked.factor is None and given is not key:
        try:  # the op as given (another object, or torch's, than the spec's): found at once next time
            _SPECS[given] = spec
        except TypeError:
            pass
    return spec


def op_of(spec: OpSpec, op: Any) -> ReduceOp:
    """The ReduceOp of one call of ``spec`` given ``op``: the spec's own, or (PREMUL_SUM)
    this call's with its factor."""
    return spec.op if spec.op is not None else as_reduce_op(op)
