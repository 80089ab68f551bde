"""The timing loop every backend's workers share (nccl-tests' method, median instead of mean).

Per size: allocate the buffers once, run the warm-up calls, then for each timed iteration
barrier, ``perf_counter()`` around one call. After the loop the per-iteration times are
reduced with MAX across ranks (the slowest rank counts), and the row's time is the median
of those maxima, divided by the transfers per call (2 for sendrecv's round trip).
"""
from __future__ import annotations

from collections.abc import Callable
from time import perf_counter
from typing import Any

import numpy as np

from .devices import place
from .ops import OPS, buffer_counts


def time_size(comm: Any, op: str, count: int, dtype: str, iters: int, warmup: int) -> float:
    """Seconds per operation of ``count`` elements of ``dtype`` (see the module note)."""
    n_in, n_out = buffer_counts(op, count, comm.size)
    inp = np.zeros(n_in, dtype)
    out = np.zeros(n_out, dtype) if n_out else None
    call = comm.call(op, inp, out)
    for _ in range(warmup):
        comm.barrier()
        call()
    times = np.zeros(iters)
    for i in range(iters):
        comm.barrier()
        start = perf_counter()
        call()
        times[i] = perf_counter() - start
    slowest = comm.max_across_ranks(times)
    return float(np.median(slowest)) / OPS[op].transfers_per_call


def run_plan(comm: Any, config: dict, emit: Callable[[dict], None] | None) -> None:
    """Time every (bytes, count, iters, warmup) of ``config["plan"]`` on ``config["device"]``'s
    buffers (.devices); rank 0 ``emit``s a "start" event before each size and a "row" event
    after it (others pass None)."""
    comm = place(comm, config.get("device", "cpu"))
    for index, (nbytes, count, iters, warmup) in enumerate(config["plan"]):
        if emit:
            emit({"event": "start", "index": index, "bytes": nbytes})
        seconds = time_size(comm, config["op"], count, config["dtype"], iters, warmup)
        if emit:
            emit({"event": "row", "index": index, "bytes": nbytes, "count": count, "seconds": seconds,
                  "iters": iters, "warmup": warmup})
