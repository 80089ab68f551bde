"""The staged path's chunk schedule: a device tensor through host buffers, three stages deep.

Behaviour
    ``cut(nbytes, chunk_bytes, itemsize)`` cuts a tensor's bytes into chunks on element
    boundaries (every rank cuts alike, so chunk k is the same bytes everywhere). ``run_staged``
    moves each chunk through three stages, each given as a callable so the CUDA layer plugs in
    without this module knowing of CUDA:

    - ``copy_down(chunk, buffer) -> Pending``: *start* the device -> host copy of the chunk into
      a pool buffer (CUDA: a non-blocking copy on the group's stream, which first waited on the
      caller's stream through an event; the Pending is an event recorded after it);
    - ``network(chunk, buffer)``: the host step on that buffer, in place and blocking (the CPU
      collective or the send/receive of those bytes);
    - ``copy_up(chunk, buffer) -> Pending``: *start* the host -> device copy back.

    At step s it starts copy_up(s - 2), starts copy_down(s), then waits for copy_down(s - 1)
    and runs network(s - 1): while chunk k is on the network, chunk k+1 comes down and chunk
    k-1 goes up. A chunk holds one buffer from copy_down until its copy_up is complete. The
    network steps run in chunk order whatever the pool's size (every rank calls the same
    sequence of host steps).

    Buffers come from a bounded PinnedPool. The schedule holds at most ``pool.max_buffers``
    (and at most ``depth``, 3 by default: more buys no overlap). It *waits* on the pool only
    while it holds no buffer; holding some, it takes a free one if there is one, else first
    completes its own oldest copy_up and reuses that buffer. So a call never waits for
    buffers that only it could release (no self-deadlock), a pool of one buffer still
    finishes (serially), and several calls sharing a pool each make progress.

Cost
    With chunk times d (down), n (network), u (up) and c chunks: about
    d + u + c * max(d, n, u) instead of c * (d + n + u); memory: at most min(depth,
    max_buffers) buffers of the pool at once. Per chunk, three callable calls and at most
    two Pending waits on the host (a CUDA event query loop against the deadline).

Failure modes
    An exception from a stage stops the schedule: it waits (against the deadline) for the
    copies already started, so no copy writes a buffer after it is back in the pool, releases
    every buffer it holds, and re-raises. A Pending that does not finish by the deadline, or a
    pool wait past it, raises OpTimeoutError; buffers whose copies may still run (a wait that
    timed out or failed) are then *not* returned to the pool (kept out, counted in
    ``pool.out``) rather than reused under a copy in flight. A chunk larger than the pool's
    buffers raises ValueError before anything starts.
"""
from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar

from ..core.deadline import Deadline
from .pinned_pool import PinnedPool

B = TypeVar("B")

#: Stages in flight at once: one chunk coming down, one on the network, one going up.
DEPTH = 3


class Pending(Protocol):
    """A started asynchronous copy (CUDA: an event recorded after it on the group's stream)."""

    def wait(self, deadline: Deadline) -> None:
        """Return once the copy is complete; OpTimeoutError past ``deadline`` (never a wait
        that ignores it: CUDA polls the event's query against the deadline)."""


@dataclasses.dataclass(frozen=True)
class Chunk:
    """Bytes [offset, offset + nbytes) of the tensor, the ``index``-th chunk."""

    index: int
    offset: int
    nbytes: int


def cut(nbytes: int, chunk_bytes: int, itemsize: int = 1) -> list[Chunk]:
    """``nbytes`` in chunks of at most ``chunk_bytes``, each a whole number of ``itemsize``
    elements (chunk_bytes rounded down to one, at least one element); none for 0 bytes."""
    if nbytes < 0 or itemsize < 1 or nbytes % itemsize:
        raise ValueError(f"cannot cut {nbytes} bytes in elements of {itemsize} bytes")
    step = max(itemsize, chunk_bytes - chunk_bytes % itemsize)
    if chunk_bytes < itemsize:
        raise ValueError(f"a chunk of {chunk_bytes} bytes holds no element of {itemsize} bytes")
    return [Chunk(i, offset, min(step, nbytes - offset)) for i, offset in enumerate(range(0, nbytes, step))]


@dataclasses.dataclass
class _Slot(Generic[B]):
    chunk: Chunk
    buffer: B
    down: Pending
    networked: bool = False
    up: Pending | None = None


class _Staging(Generic[B]):
    """One run of the schedule: its stages, and the chunks holding buffers, oldest first."""

    def __init__(self, pool: PinnedPool[B], deadline: Deadline, depth: int,
                 copy_down: Callable[[Chunk, B], Pending], network: Callable[[Chunk, B], None],
                 copy_up: Callable[[Chunk, B], Pending]):
        self.pool = pool
        self.deadline = deadline
        self.limit = max(1, min(depth, pool.max_buffers))
        self.copy_down = copy_down
        self.network = network
        self.copy_up = copy_up
        self.held: deque[_Slot[B]] = deque()

    def down(self, chunk: Chunk) -> None:
        """Start chunk's copy_down into a buffer got by the no-self-deadlock rule."""
        buffer: B | None = None
        if len(self.held) < self.limit:
            buffer = self.pool.acquire(self.deadline) if not self.held else self.pool.try_acquire()
        if buffer is None:  # full: finish our own oldest chunk and reuse its buffer
            oldest = self.held[0]
            self.up(oldest)
            assert oldest.up is not None
            oldest.up.wait(self.deadline)
            buffer = self.held.popleft().buffer
        try:
            started = self.copy_down(chunk, buffer)
        except BaseException:
            self.pool.release(buffer)  # nothing was started on it
            raise
        self.held.append(_Slot(chunk, buffer, started))

    def net(self, slot: _Slot[B]) -> None:
        """Run slot's network step once its copy_down is complete (once per chunk)."""
        if not slot.networked:
            slot.down.wait(self.deadline)
            self.network(slot.chunk, slot.buffer)
            slot.networked = True

    def up(self, slot: _Slot[B]) -> None:
        """Start slot's copy_up, after its network step (once per chunk)."""
        self.net(slot)
        if slot.up is None:
            slot.up = self.copy_up(slot.chunk, slot.buffer)

    def finish(self) -> None:
        """Send every chunk up, wait for each copy_up, and return the buffers."""
        while self.held:
            slot = self.held[0]
            self.up(slot)
            assert slot.up is not None
            slot.up.wait(self.deadline)
            self.pool.release(self.held.popleft().buffer)

    def abandon(self) -> None:
        """After a failure: let started copies end, then return the buffers; a copy that does
        not end by the deadline keeps its buffer (and every later one) out of the pool."""
        while self.held:
            slot = self.held[0]
            try:
                for pending in (slot.down, slot.up):
                    if pending is not None:
                        pending.wait(self.deadline)
            except Exception:  # OpTimeoutError, or the device's own error: the copy may run on
                return
            self.pool.release(self.held.popleft().buffer)


def run_staged(chunks: list[Chunk], pool: PinnedPool[B],
               copy_down: Callable[[Chunk, B], Pending],
               network: Callable[[Chunk, B], None],
               copy_up: Callable[[Chunk, B], Pending],
               deadline: Deadline, depth: int = DEPTH) -> None:
    """Move ``chunks`` down, through ``network`` and up, pipelined (module docstring). The
    network steps run in chunk order on every rank, whatever its pool's size."""
    for chunk in chunks:
        if chunk.nbytes > pool.buffer_bytes:
            raise ValueError(f"chunk {chunk.index} of {chunk.nbytes} bytes exceeds the pool's "
                             f"{pool.buffer_bytes}-byte buffers")
    run: _Staging[B] = _Staging(pool, deadline, depth, copy_down, network, copy_up)
    by_index: dict[int, _Slot[B]] = {}
    try:
        for step in range(len(chunks) + 2):
            going_up = by_index.pop(step - 2, None)
            if going_up is not None:
                run.up(going_up)
            if step < len(chunks):
                run.down(chunks[step])
                by_index[step] = run.held[-1]
            on_network = by_index.get(step - 1)
            if on_network is not None:
                run.net(on_network)
        run.finish()
    except BaseException:
        run.abandon()
        raise
