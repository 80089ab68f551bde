"""The benchmarked operations: buffer layout, bus-bandwidth factor, iterations per size.

Sizes follow nccl-tests (doc/PERFORMANCE.md): ``bytes`` is the whole buffer of one rank —
for all_gather the gathered output, for reduce_scatter the input before scattering, for
all_to_all what one rank sends in total — so ops that split a buffer into one block per
rank round the element count down to a multiple of nproc (at least one element per rank).
``algbw = bytes / time``; ``busbw = algbw * factor`` with all_reduce 2(n-1)/n, all_gather,
reduce_scatter and all_to_all (n-1)/n, broadcast and sendrecv 1. sendrecv is a ping-pong
between ranks 0 and 1 whose time is one way: round trip / 2. barrier moves no data: one row,
0 bytes, whatever ``--sizes`` says.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

DTYPES = ("float16", "float32", "float64", "int8", "uint8", "int32", "int64")


@dataclass(frozen=True)
class OpSpec:
    """One operation: its name, busbw factor for n ranks, and whether buffers split by rank."""

    name: str
    bus_factor: Callable[[int], float]
    split: bool = False
    min_ranks: int = 1
    transfers_per_call: int = 1  # sendrecv's timed call is a round trip: two one-way transfers


OPS: dict[str, OpSpec] = {spec.name: spec for spec in (
    OpSpec("all_reduce", lambda n: 2 * (n - 1) / n),
    OpSpec("all_gather", lambda n: (n - 1) / n, split=True),
    OpSpec("reduce_scatter", lambda n: (n - 1) / n, split=True),
    OpSpec("broadcast", lambda n: 1.0),
    OpSpec("all_to_all", lambda n: (n - 1) / n, split=True),
    OpSpec("sendrecv", lambda n: 1.0, min_ranks=2, transfers_per_call=2),
    OpSpec("barrier", lambda n: 0.0),
)}


def element_count(op: str, nbytes: int, dtype: str, nproc: int) -> int:
    """Elements in one rank's whole buffer for a requested size (see the module note)."""
    count = max(nbytes // np.dtype(dtype).itemsize, 1)
    if OPS[op].split:
        count = max(count // nproc, 1) * nproc
    return count


def buffer_counts(op: str, count: int, nproc: int) -> tuple[int, int]:
    """(input, output) elements per rank; output 0 means the op works in place on the input."""
    if op in ("all_reduce", "broadcast", "sendrecv", "barrier"):
        return count, 0
    if op == "all_gather":
        return count // nproc, count
    if op == "reduce_scatter":
        return count, count // nproc
    return count, count


def size_plan(op: str, sizes: list[int], dtype: str, nproc: int) -> list[tuple[int, int]]:
    """(bytes, count) per benchmarked size: requested sizes after rounding, without repeats."""
    if op == "barrier":
        return [(0, 0)]
    itemsize = np.dtype(dtype).itemsize
    plan: list[tuple[int, int]] = []
    for nbytes in sizes:
        count = element_count(op, nbytes, dtype, nproc)
        if not plan or plan[-1][1] != count:
            plan.append((count * itemsize, count))
    return plan


def iterations(nbytes: int, iters: int, warmup: int, budget: int) -> tuple[int, int]:
    """(timed, warm-up) iterations at a size: ``iters``/``warmup`` capped so that about
    ``budget`` bytes pass per size (at least 3 timed, 1 warm-up; budget 0: no cap)."""
    if budget <= 0:
        return iters, warmup
    cap = budget // max(nbytes, 1)
    return max(min(iters, 3), min(iters, cap)), max(min(warmup, 1), min(warmup, cap // 4))


def bandwidths(op: str, nbytes: int, seconds: float, nproc: int) -> tuple[float, float]:
    """(algbw, busbw) in GB/s (1e9 bytes/s) for ``nbytes`` moved in ``seconds``."""
    algbw = nbytes / seconds / 1e9 if seconds > 0 else float("inf")
    return algbw, algbw * OPS[op].bus_factor(nproc)
