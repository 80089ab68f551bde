"""When this process's last ``init_process_group`` reached each of its steps (for pydist-bench --scale).

``mark(step)`` records ``time.time()`` (wall clock: comparable across the processes of one
machine) under ``step``; ``marks()`` returns a copy. A handful of calls per init, each one
dict store: nothing else runs, whether or not anyone reads them. A new init starts over at
``INIT_START``. The steps, in order:

- ``INIT_START``: init_process_group was called;
- ``STORE_READY``: the rendezvous store is connected (env://: every rank counted in);
- ``RECORDS_EXCHANGED``: the tcp transport has every rank's record (address, host) from the store;
- ``TRANSPORT_READY``: the world transport is built (its connections made);
- ``INIT_DONE``: init_process_group is about to return (a rank joining a running job,
  PYDIST_JOIN=1, marks only the first two).
"""
from __future__ import annotations

import time

INIT_START, STORE_READY, RECORDS_EXCHANGED, TRANSPORT_READY, INIT_DONE = (
    "init_start", "store_ready", "records_exchanged", "transport_ready", "init_done")
STEPS = (INIT_START, STORE_READY, RECORDS_EXCHANGED, TRANSPORT_READY, INIT_DONE)

_marks: dict[str, float] = {}


def mark(step: str) -> None:
    """Record now as the time ``step`` was reached (``INIT_START`` forgets the earlier ones)."""
    if step == INIT_START:
        _marks.clear()
    _marks[step] = time.time()


def marks() -> dict[str, float]:
    """The steps reached so far, step -> ``time.time()`` then."""
    return dict(_marks)
