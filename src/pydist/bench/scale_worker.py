"""One rank of ``pydist-bench --scale``: join, measure, report one ``rank`` event.

Started by :mod:`.scale` as ``python -c BOOTSTRAP SPAWNED CONFIG``: the bootstrap imports
pydist first and notes when that finished, so the import is timed from the moment the
launcher started the process (``SPAWNED``, its ``time.time()``). Then the rank joins the
default group (env://), records its init steps (:mod:`pydist.core.init_marks`), its memory
and descriptors (:mod:`.proc_usage`) after init and after the all_reduces, and the times
of a first and of ``iters`` more all_reduces per size (each after a barrier). Rank 0, whose
process serves the store, also reports the store server's counts after every rank's init
(``store_init``) and at the end (``store_end``), then ``done``.
"""
from __future__ import annotations

import json
import os
from datetime import timedelta
from time import perf_counter

import numpy as np

from .proc_usage import usage
from .worker import emit, exit_when_orphaned, report_failure

#: What the launcher runs with ``python -c``; its arguments are SPAWNED and CONFIG.
BOOTSTRAP = ("import sys, time; import pydist; imported = time.time(); "
             "from pydist.bench.scale_worker import main; sys.exit(main(sys.argv[1:], imported))")
#: The all_reduce sizes timed, in bytes (float32 elements).
SIZES = (4, 1024)


def _time_all_reduce(dist, nbytes: int, iters: int) -> dict[str, object]:
    """Seconds of the first all_reduce of ``nbytes`` and of ``iters`` more, each after a barrier."""
    tensor = np.zeros(nbytes // 4, np.float32)
    times = []
    for _ in range(iters + 1):
        dist.barrier()
        start = perf_counter()
        dist.all_reduce(tensor)
        times.append(round(perf_counter() - start, 7))  # 0.1 µs: keeps the event line short
    return {"first": times[0], "times": times[1:]}


def _store_counts() -> dict | None:
    """The counts of the store server this process runs (rank 0 under env://), else None."""
    from ..groups.world import current
    counts = getattr(current().owned_store, "server_stats", None)
    return counts() if counts else None


def main(argv: list[str], imported: float) -> int:
    spawned, config = float(argv[0]), json.loads(argv[1])
    exit_when_orphaned()
    rank: int | str = os.environ.get("RANK", "?")
    try:
        import pydist as dist
        from pydist.core.init_marks import marks
        dist.init_process_group("pydist", timeout=timedelta(seconds=config["timeout"]))
        rank = dist.get_rank()
        emit({"event": "pid", "rank": rank, "pid": os.getpid()})
        after_init = usage()
        dist.barrier()  # every rank's init is over: the store's counts are init's
        store_init = _store_counts()
        timed = {str(n): _time_all_reduce(dist, n, config["iters"]) for n in SIZES}
        emit({"event": "rank", "rank": rank, "spawned": spawned, "imported": imported, "marks": marks(),
              "after_init": after_init, "after_all_reduce": usage(), "all_reduce": timed})
        dist.barrier()  # every rank's event is in the pipe before "done"
        if rank == 0:
            emit({"event": "store", "init": store_init, "end": _store_counts()})
            emit({"event": "done"})
        dist.destroy_process_group()
    except BaseException as error:  # noqa: BLE001 - reported to the launcher, then exit 1
        report_failure(rank, error)
        return 1
    return 0
