"""Striping, sans-IO: a large message split over a peer's lanes (one connection per interface).

Part ``k`` of a message travels on lane ``k`` as an ordinary frame whose tag carries the part
number in its top byte (``part_key``), so each lane keeps its own FIFO order and the matcher
pairs parts like any other message. Both ends split a message the same way because they
know its size (collectives only: their sizes agree whenever their call fingerprints do).
"""
from __future__ import annotations

import threading

from ..base import MessageKey, Request

PART_SHIFT = 56  # algorithms' tags stay far below 2**56
ALIGN = 4096  # parts start on page boundaries


def part_key(key: MessageKey, part: int) -> MessageKey:
    """The key of part ``part`` (0-based) of a striped message sent under ``key``."""
    return MessageKey(key.group, key.seq, key.tag ^ ((part + 1) << PART_SHIFT))


def bounds(nbytes: int, lanes: int) -> list[tuple[int, int]]:
    """(start, stop) of each lane's part: equal shares, page aligned, the last takes the rest."""
    share = -(-nbytes // lanes // ALIGN) * ALIGN
    edges = [min(k * share, nbytes) for k in range(lanes)] + [nbytes]
    return [(edges[k], edges[k + 1]) for k in range(lanes) if edges[k] < edges[k + 1]]


def join(whole: Request, parts: list[Request]) -> None:
    """Complete ``whole`` when every one of ``parts`` has (with the first error any part has)."""
    left, lock = [len(parts)], threading.Lock()

    def part_done(part: Request) -> None:
        if part.error is not None:
            whole.complete(part.error)
            return
        with lock:
            left[0] -= 1
            last = left[0] == 0
        if last:
            whole.complete()

    for part in parts:
        part.add_callback(part_done)
