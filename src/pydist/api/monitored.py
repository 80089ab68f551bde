"""``monitored_barrier``: torch's barrier that names the ranks that did not arrive.

Group rank 0 waits (up to the timeout) for a token from every other rank, then answers
each; a rank that did not send in time is named in the error raised on rank 0 (the first
one, or all of them with ``wait_all_ranks``), and the other ranks, never answered, raise
naming rank 0. Without ``wait_all_ranks``, rank 0 raises "timed out in monitoredBarrier"
when its time ran out before it could wait for a rank. The errors are worded as gloo's (torch's tests match them).
Tokens travel as point-to-point messages with a reserved tag.
"""
from __future__ import annotations

from datetime import timedelta
from typing import Any

import numpy as np

from ..core.deadline import Deadline, to_seconds
from ..core.errors import DistBackendError, DistError
from ..groups.work import Work
from .groups import resolve_group
from .p2p import irecv, isend

#: The tag of monitored_barrier's tokens (user tags are unlikely to be the most negative int64).
TOKEN_TAG = -(1 << 63)


def _token(work: Work | None) -> Work:
    """A token send's or receive's Work (None only for a non-member, and this rank is one)."""
    assert work is not None
    return work


def monitored_barrier(group: Any = None, timeout: timedelta | float | None = None,
                      wait_all_ranks: bool = False) -> None:
    """Block until every rank of ``group`` arrived; DistBackendError naming the (global)
    ranks that did not within ``timeout`` (default: the group's)."""
    target = resolve_group(group)
    if target is None or target.size() == 1:
        return
    seconds = target.timeout if timeout is None else to_seconds(timeout)
    assert seconds is not None  # to_seconds keeps only None as None
    ranks, me = target.ranks, target.rank()
    if me != 0:
        try:
            _token(isend(np.ones(1, np.uint8), group=target, group_dst=0, tag=TOKEN_TAG)).wait(timeout=seconds)
            _token(irecv(np.zeros(1, np.uint8), group=target, group_src=0, tag=TOKEN_TAG)).wait(timeout=seconds)
        except DistError as error:
            raise DistBackendError(f"Rank {ranks[me]} successfully reached monitoredBarrier, but received errors "
                                   f"while waiting for send/recv from rank {ranks[0]}: it got no answer within "
                                   f"{_ms(seconds)} (rank {ranks[0]} reports the ranks that did not arrive): "
                                   f"{error}") from error
        return
    tokens = {peer: _token(irecv(np.zeros(1, np.uint8), group=target, group_src=peer, tag=TOKEN_TAG))
              for peer in range(1, target.size())}
    deadline, missing = Deadline.after(seconds), []
    for peer, token in tokens.items():
        left = deadline.remaining()
        assert left is not None  # seconds is never None
        if left <= 0 and not wait_all_ranks and not token.is_completed():  # as gloo: only then
            raise DistBackendError(f"Rank {ranks[0]} timed out in monitoredBarrier after {_ms(seconds)} "
                                   f"(before waiting for rank {ranks[peer]})")
        try:
            token.wait(timeout=left)
        except DistBackendError:
            missing.append(ranks[peer])
            if not wait_all_ranks:
                break
    if missing:
        which = "Ranks " + ", ".join(map(str, missing)) if len(missing) > 1 else f"Rank {missing[0]}"
        raise DistBackendError(f"[Rank {ranks[0]}]: {which} failed to pass monitoredBarrier in {_ms(seconds)}")
    for peer in tokens:
        _token(isend(np.ones(1, np.uint8), group=target, group_dst=peer, tag=TOKEN_TAG)).wait()


def _ms(seconds: float) -> str:
    """A timeout in gloo's unit: "1000 ms"."""
    return f"{max(0, round(seconds * 1000))} ms"
