"""Process-wide state: the default group, every group, the store, the transport, and what
this rank knows of its groups and peers (``states``).

One World per process (``current()``); ``pydist.testing`` gives each thread acting as a rank
a World of its own (``use_world``), so the public API runs unchanged with threads as ranks,
and the torch plugin gives its default group a World of its own (groups.factory.standalone_world),
whose groups its new_groups are (pydist.torch.placement).
A World's fields change only through its methods, each one transition:

    (empty) --join--> joined --renumber (the default group shrank or grew)--> joined
    joined --leave--> (empty)           groups come and go with add_group / remove_group

Ranks: ``rank``/``size`` are this process's global rank and the world's size (renumbered
0..n-1 by a shrink); ``transport_rank(global_rank)`` is the transport's number of a rank
(its launch rank, which the transport keeps after a shrink).
"""
from __future__ import annotations

import collections
import contextlib
import hashlib
import socket
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from . import farewell
from .state import GroupStates

if TYPE_CHECKING:
    from ..core.deadline import Deadline
    from ..store import Store
    from ..transport.world import WorldTransport
    from .process_group import ProcessGroup
    from .progress import ProgressBoard

#: how a world's transport is made: (rank, size, store, deadline, events, joining) -> WorldTransport
TransportFactory = Callable[[int, int, Any, "Deadline", GroupStates, bool], "WorldTransport"]


class World:
    """Everything init_process_group creates and destroy_process_group releases."""

    def __init__(self, transport_factory: TransportFactory | None = None, job: tuple[int, int] | None = None) -> None:
        """``transport_factory``: how this world's transport is made (tests); None: the
        registry's tcp and shared memory (groups.factory.default_transport). ``job``: see below."""
        self.default_group: ProcessGroup | None = None
        self.groups: list[ProcessGroup] = []
        self.store: Store | None = None
        self.owned_store: Store | None = None
        self.transport: WorldTransport | None = None
        self.progress: ProgressBoard | None = None  # the ProgressBoard of this rank, shared by its groups
        self.states = GroupStates()  # what this rank knows of its groups and peers
        self.rank = -1
        self.size = -1
        self.backend_name = ""
        self.generation = 0
        #: the transport rank of each global rank (None: the same numbers); a shrunk default
        #: group renumbers the world, the transport keeps its launch ranks
        self.transport_ranks: list[int] | None = None
        #: the transport rank whose process serves the store (env:// and tcp://: rank 0), or
        #: None when it is served elsewhere (a launcher's agent, a file, the caller's store)
        self.store_host: int | None = None
        #: (rank, size) in the whole job, under which the flight recorder files this world's
        #: groups (None: ``rank``/``size``); a torch default group's world is the job's
        self.job = job
        self.group_counts: collections.Counter = collections.Counter()
        #: ranks the job started with (the first joiner's transport rank), and the joiners
        #: this world has handled (admitted or refused), by transport rank
        self.started = 0
        self.joined = False  # this process joined a running job (a replacement)
        self.joiners_handled: set[int] = set()
        self.transport_factory = transport_factory

    # -- transitions ----------------------------------------------------------------------
    def next_generation(self, at_least: int = 0) -> int:
        """A new namespace number for this world's store keys (each init and each renumber;
        ``at_least``: the one the ranks already in the job chose, for a rank joining it)."""
        self.generation = max(self.generation + 1, at_least)
        return self.generation

    def join(self, rank: int, size: int, backend_name: str, store: Store | None = None,
             owned_store: Store | None = None, transport: WorldTransport | None = None,
             progress: ProgressBoard | None = None, store_host: int | None = None,
             transport_ranks: list[int] | None = None, started: int | None = None) -> None:
        """This process is rank ``rank`` of ``size`` on ``backend_name`` (the MPI engine has no
        store, transport nor progress board); ``owned_store``: closed by ``leave``;
        ``transport_ranks``: see the attribute (None: the global ranks); ``started``: the
        ranks the job started with (default ``size``: this world founds the job; otherwise
        this process joined a running job: ``joined``)."""
        self.rank, self.size, self.backend_name = rank, size, backend_name
        self.store, self.owned_store, self.store_host = store, owned_store, store_host
        self.transport, self.progress, self.transport_ranks = transport, progress, transport_ranks
        self.started = size if started is None else started
        self.joined = started is not None
        if transport is not None:
            farewell.track(self)
            self.states.carrier = transport
            transport.use_store(store)  # shared-memory arenas meet through the world's namespace

    def renumber(self, transport_ranks: list[int], store: Store, progress: ProgressBoard,
                 owned_store: Store | None = None, store_host: int | None = None) -> None:
        """The default group shrank or grew to ``transport_ranks``: global ranks 0..n-1 from now on,
        ``store`` (a new namespace, or a new store when the old one's host is gone: then
        ``owned_store`` and its ``store_host``), a new progress board. Every group must be
        gone already (a shrink of the default group destroys them)."""
        assert not self.groups and self.transport is not None  # a native world, its groups destroyed
        if self.progress is not None:
            self.progress.close()
        if owned_store is not None:
            if self.owned_store is not None:
                self.owned_store.close()
            self.owned_store, self.store_host = owned_store, store_host
        self.rank = transport_ranks.index(self.transport_rank(self.rank))
        self.size = len(transport_ranks)
        self.transport_ranks = list(transport_ranks)
        self.store, self.progress = store, progress
        self.transport.use_store(store)
        self.group_counts.clear()

    def handled(self, joiners: list[int]) -> None:
        """``joiners`` (transport ranks) were admitted or refused: not looked at again."""
        self.joiners_handled |= set(joiners)

    def add_group(self, group: ProcessGroup, default: bool = False) -> ProcessGroup:
        """Keep ``group`` (destroyed by ``leave``); ``default``: it is the default group."""
        self.groups.append(group)
        if default:
            self.default_group = group
        return group

    def remove_group(self, group: ProcessGroup) -> None:
        """``group`` was destroyed on its own."""
        if group in self.groups:
            self.groups.remove(group)

    def leave(self) -> None:
        """Destroy every group (newest first), then release the progress board, the transport
        and the store this world owns; the world is empty again."""
        for each in reversed(self.groups):
            each.destroy(timeout=each.timeout)
        self.groups.clear()
        self.default_group = None
        if self.progress is not None:
            self.progress.close()
        if self.transport is not None:  # None for MPI
            self.transport.close()
        if self.owned_store is not None:
            self.owned_store.close()
        self.store = self.owned_store = self.transport = self.progress = None
        self.rank = self.size = -1
        self.transport_ranks = self.store_host = None
        self.states = GroupStates()

    # -- queries --------------------------------------------------------------------------
    def transport_rank(self, global_rank: int) -> int:
        """The transport's rank of ``global_rank`` of this world."""
        return global_rank if self.transport_ranks is None else self.transport_ranks[global_rank]

    def members(self) -> list[int]:
        """The transport ranks of the world's global ranks 0..size-1."""
        return list(range(self.size)) if self.transport_ranks is None else list(self.transport_ranks)

    def job_rank_and_size(self) -> tuple[int, int]:
        """(rank, size) under which the flight recorder files this world's groups."""
        return self.job or (self.rank, self.size)

    def group_id(self, ranks: list[int]) -> tuple[int, str]:
        """An id and name for a group of these ranks, equal on every member (counted per
        rank list, so it does not depend on groups other ranks created)."""
        key = tuple(ranks)
        self.group_counts[key] += 1
        text = f"{self.generation}:{','.join(map(str, key))}:{self.group_counts[key]}"
        digest = group_digest(text)
        return digest, f"pg{self.group_counts[key]}-{digest:016x}"[:20]

    def split_id(self, parent_id: int, ranks: list[int]) -> int:
        """The id of a split of group ``parent_id`` holding ``ranks``, equal on every member."""
        key = ("split", parent_id, tuple(ranks))
        self.group_counts[key] += 1
        return group_digest(f"split:{parent_id:x}:{','.join(map(str, ranks))}:{self.group_counts[key]}")


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


@contextlib.contextmanager
def using_world(world: World) -> Iterator[World]:
    """This thread's World is ``world`` inside the block (the public API runs on it), and
    what it was before after the block."""
    before = _THREAD.world
    _THREAD.world = world
    try:
        yield world
    finally:
        _THREAD.world = before


def local_host() -> str:
    return socket.gethostname()
