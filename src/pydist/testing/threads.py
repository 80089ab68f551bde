"""Ranks as threads of this process (see pydist.testing)."""
from __future__ import annotations

import sys
import threading
import traceback
from datetime import timedelta
from typing import Any, Callable

from ..api.groups import destroy_process_group, init_process_group, is_initialized
from ..core.deadline import Deadline
from ..core.settings import settings
from ..groups.state import GroupStates
from ..groups.world import World, use_world
from ..store import HashStore
from ..transport.loopback import LoopbackFabric
from ..transport.world import WorldTransport


class RankFailed(RuntimeError):
    """A rank of run_threads/run_processes raised; ``rank`` names it, ``__cause__`` is its error."""

    def __init__(self, rank: int, message: str):
        super().__init__(f"rank {rank} failed: {message}")
        self.rank = rank


def _stacks(threads: list[threading.Thread]) -> str:
    frames = sys._current_frames()
    text = []
    for thread in threads:
        if thread.is_alive() and thread.ident in frames:
            text.append(f"--- {thread.name} ---\n" + "".join(traceback.format_stack(frames[thread.ident])))
    return "\n".join(text)


def run_threads(world_size: int, fn: Callable[..., Any], *args: Any, transport: str = "loopback",
                timeout: float = 60.0, pg_timeout: float = 30.0, hosts: list[str] | None = None,
                **kwargs: Any) -> list[Any]:
    """Run ``fn(rank, world_size, *args, **kwargs)`` on ``world_size`` thread-ranks in one
    default group; ``transport`` is "loopback" (in-process) or "tcp" (the real world
    transport: sockets, and shared memory between ranks of one host). ``hosts`` gives each
    rank a host identity, so one process poses as several hosts."""
    if transport not in ("loopback", "tcp"):
        raise ValueError(f"transport: expected 'loopback' or 'tcp', got {transport!r}")
    if hosts is not None and len(hosts) != world_size:
        raise ValueError(f"hosts: expected {world_size} host identities, got {len(hosts)}")
    store = HashStore()
    fabric = LoopbackFabric(world_size, hosts) if transport == "loopback" else None
    results: list[Any] = [None] * world_size
    errors: dict[int, BaseException] = {}

    def loopback(r: int, size: int, s: Any, deadline: Deadline, events: GroupStates) -> WorldTransport:
        assert fabric is not None  # transport == "loopback"
        return fabric.world_transport(r, events, settings(), deadline)

    def tcp(r: int, size: int, s: Any, deadline: Deadline, events: GroupStates) -> WorldTransport:
        return WorldTransport(r, size, s, deadline, events, settings(), "127.0.0.1", "localhost",
                              hosts[r] if hosts else "this-host", shares_interpreter=True)

    def body(rank: int) -> None:
        use_world(World(transport_factory=loopback if fabric is not None else tcp))
        try:
            init_process_group(store=store, rank=rank, world_size=world_size,
                               timeout=timedelta(seconds=pg_timeout))
            results[rank] = fn(rank, world_size, *args, **kwargs)
        except BaseException as error:  # noqa: BLE001 - reported to the caller
            errors[rank] = error
        finally:
            try:
                if is_initialized():
                    destroy_process_group()
            finally:
                use_world(None)

    threads = [threading.Thread(target=body, args=(r,), name=f"rank-{r}", daemon=True) for r in range(world_size)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout)  # real time: the harness's bound, which a test's fake clock must not shorten
    if any(thread.is_alive() for thread in threads):
        raise TimeoutError(f"thread-ranks did not finish within {timeout} s:\n{_stacks(threads)}")
    if errors:
        rank = min(errors)
        others = "".join(f"\n  rank {r}: {type(e).__name__}: {e}" for r, e in sorted(errors.items()) if r != rank)
        raise RankFailed(rank, f"{type(errors[rank]).__name__}: {errors[rank]}" + others) from errors[rank]
    return results
