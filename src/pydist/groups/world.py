"""Process-wide state: the default group, every group, the store and the transport.

One World per process; ``pydist.testing`` gives each thread acting as a rank a World of
its own (``use_world``), so the public API runs unchanged with threads as ranks.
"""
from __future__ import annotations

import collections
import hashlib
import socket
import threading
from typing import TYPE_CHECKING, Callable

from .process_group import ProcessGroup

if TYPE_CHECKING:
    from .progress import ProgressBoard
    from ..store import Store
    from ..transport.base import Transport


class World:
    """Everything init_process_group creates and destroy_process_group releases."""

    def __init__(self) -> None:
        self.default_group: ProcessGroup | None = None
        self.groups: list[ProcessGroup] = []
        self.store: Store | None = None
        self.owned_store: Store | None = None
        self.transport: Transport | None = None
        self.progress: ProgressBoard | None = None  # the ProgressBoard of this rank, shared by its groups
        self.rank = -1
        self.size = -1
        self.backend_name = ""
        self.generation = 0
        #: the transport's rank of each rank of this world (None: the same numbers); a shrunk
        #: default group renumbers the world, the transport keeps its launch ranks
        self.transport_ranks: list[int] | None = None
        #: the transport rank whose process serves the store (env:// and tcp://: rank 0), or
        #: None when it is served elsewhere (a launcher's agent, a file, the caller's store)
        self.store_host: int | None = None
        self.group_counts: collections.Counter = collections.Counter()
        #: tests may replace how the transport is made: (rank, size, store, deadline) -> Transport
        self.transport_factory: Callable | None = None

    def transport_rank(self, rank: int) -> int:
        """The transport's rank of ``rank`` of this world."""
        return rank if self.transport_ranks is None else self.transport_ranks[rank]

    def group_id(self, ranks: list[int]) -> tuple[int, str]:
        """An id and name for a group of these ranks, equal on every member (counted per
        rank list, so it does not depend on groups other ranks created)."""
        key = tuple(ranks)
        self.group_counts[key] += 1
        text = f"{self.generation}:{','.join(map(str, key))}:{self.group_counts[key]}"
        digest = group_digest(text)
        return digest, f"pg{self.group_counts[key]}-{digest:016x}"[:20]


def group_digest(text: str) -> int:
    """A non-zero 64-bit group id from ``text`` (equal on every rank that hashes the same text)."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little") or 1


_PROCESS_WORLD = World()


class _ThreadWorld(threading.local):
    world: World | None = None  # a thread-rank's own World (tests); None: the process's


_THREAD = _ThreadWorld()


def current() -> World:
    """This thread's World (a thread-rank's own, in tests) or the process's."""
    return _THREAD.world or _PROCESS_WORLD


def process_world() -> World:
    """The process's World (what thread-ranks' own Worlds stand in for)."""
    return _PROCESS_WORLD


def use_world(world: World | None) -> None:
    """Make ``world`` this thread's World (None: back to the process's)."""
    _THREAD.world = world


def local_host() -> str:
    return socket.gethostname()
