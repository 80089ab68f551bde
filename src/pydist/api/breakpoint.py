"""``breakpoint(rank=0, skip=0, timeout_s=3600)``: torch.distributed's debugger stop on one rank.

The flow is torch 2.13's: rank ``rank`` (a global rank) opens pdb, reading commands from
/dev/stdin so that it works in a rank a launcher started with stdin closed; every rank then
enters a barrier of the default group, so the others wait there until the debugging rank
continues. ``skip`` lets the first ``skip`` calls pass (logged, and with no barrier: every rank
skips the same calls). ``timeout_s`` (seconds, None: the group's timeout) is that barrier's
timeout, so that a short group timeout does not end the session; torch sets it as the timeout
of every group instead, and keeps it after.

One difference: torch counts skipped calls by the text of the exception being handled (in
effect one count for the whole process); pydist counts them per call site (file and line) and
per rank, as "skip the first calls to this breakpoint" says.
"""
from __future__ import annotations

import logging
import sys
import threading
import weakref
from datetime import timedelta
from typing import Any

from ..groups.world import current
from .collectives import barrier
from .groups import get_rank

_log = logging.getLogger("pydist")

#: Where the debugger reads its commands (tests replace it).
_STDIN = "/dev/stdin"

#: {world: {(file, line): calls seen}}: skip counts, per rank (thread-ranks have Worlds of their own)
_calls: weakref.WeakKeyDictionary[Any, dict[tuple[str, int], int]] = weakref.WeakKeyDictionary()
_calls_lock = threading.Lock()


def _make_distributed_pdb() -> Any:
    """A pdb that reads /dev/stdin while it interacts (torch's ``_make_distributed_pdb``)."""
    import pdb

    class _DistributedPdb(pdb.Pdb):
        def interaction(self, *args: Any, **kwargs: Any) -> None:
            stdin = sys.stdin
            try:
                with open(_STDIN) as sys.stdin:
                    pdb.Pdb.interaction(self, *args, **kwargs)
            finally:
                sys.stdin = stdin

    return _DistributedPdb()


def breakpoint(rank: int = 0, skip: int = 0, timeout_s: float | None = 3600) -> None:
    """Stop in pdb on global rank ``rank`` only; every rank then waits in a barrier until it
    continues. ``skip``: let the first ``skip`` calls from this line pass. ``timeout_s``: how
    long the other ranks wait (seconds; None: the default group's timeout)."""
    if skip > 0:
        caller = sys._getframe(1)
        site = (caller.f_code.co_filename, caller.f_lineno)
        with _calls_lock:
            seen = _calls.setdefault(current(), {})
            counter = seen[site] = seen.get(site, 0) + 1
        if counter <= skip:
            _log.warning("Skip the breakpoint, counter=%d", counter)
            return
    if get_rank() == rank:
        debugger = _make_distributed_pdb()
        debugger.message("\n!!! ATTENTION !!!\n\n"
                         f"Type 'up' to get to the frame that called dist.breakpoint(rank={rank})\n")
        debugger.set_trace()
    barrier(timeout=None if timeout_s is None else timedelta(seconds=timeout_s))
