"""The timing loop of the per-layer scripts: best of 3 runs of N calls, after a barrier."""
import sys
import time

import pydist as dist

N = int(sys.argv[1]) if len(sys.argv) > 1 else 3000


def best(call, per_call: int = 1) -> float:
    """Microseconds per call of ``call`` (divided by ``per_call``), the best of 3 x N."""
    times = []
    for _ in range(3):
        dist.barrier()
        start = time.perf_counter()
        for _ in range(N):
            call()
        times.append((time.perf_counter() - start) / N / per_call * 1e6)
    return min(times)
