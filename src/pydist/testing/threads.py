"""Ranks as threads of this process (see pydist.testing)."""
from __future__ import annotations

import contextlib
import sys
import threading
import traceback
from collections.abc import Callable, Iterator, Sequence
from datetime import timedelta
from typing import Any

from ..api.groups import is_initialized
from ..api.grow import join_running_job
from ..api.init import destroy_process_group, init_process_group
from ..core.deadline import Deadline
from ..core.settings import settings
from ..groups.state import GroupStates
from ..groups.world import World, current, use_world
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
                joiners: Sequence[tuple[Callable[[Callable[[], None]], Any], str | None]] = (),
                **kwargs: Any) -> list[Any]:
    """Run ``fn(rank, world_size, *args, **kwargs)`` on ``world_size`` thread-ranks in one
    default group; ``transport`` is "loopback" (in-process) or "tcp" (the real world
    transport: sockets, and shared memory between ranks of one host). ``hosts`` gives each
    rank a host identity, so one process poses as several hosts. ``joiners``: (function,
    host identity or None) of each further thread-rank that joins the running job: it runs
    ``function(join)`` and calls ``join()`` (init_process_group of a joining process) when it
    wants (``join.store`` is the job's store); the joiners' results follow the ranks' in the
    list returned."""
    if transport not in ("loopback", "tcp"):
        raise ValueError(f"transport: expected 'loopback' or 'tcp', got {transport!r}")
    if hosts is not None and len(hosts) != world_size:
        raise ValueError(f"hosts: expected {world_size} host identities, got {len(hosts)}")
    store = HashStore()
    fabric = LoopbackFabric(world_size, hosts) if transport == "loopback" else None
    results: list[Any] = [None] * (world_size + len(joiners))
    errors: dict[int, BaseException] = {}
    joining_host = threading.local()  # a joiner thread's host identity (None: rank 0's)

    def host_of(r: int, joining: bool) -> str | None:
        if joining:
            return getattr(joining_host, "host", None)
        return hosts[r] if hosts else None

    def loopback(r: int, size: int, s: Any, deadline: Deadline, events: GroupStates,
                 joining: bool) -> WorldTransport:
        assert fabric is not None  # transport == "loopback"
        if joining:
            fabric.add_rank(r, host_of(r, True))
        return fabric.world_transport(r, events, settings(), deadline, joining)

    def tcp(r: int, size: int, s: Any, deadline: Deadline, events: GroupStates, joining: bool) -> WorldTransport:
        return WorldTransport(r, size, s, deadline, events, settings(), "127.0.0.1", "localhost",
                              host_of(r, joining) or (hosts[0] if hosts else "this-host"),
                              shares_interpreter=True, joining=joining)

    def body(rank: int) -> None:
        with _thread_rank(rank, errors, loopback if fabric is not None else tcp):
            init_process_group(store=store, rank=rank, world_size=world_size,
                               timeout=timedelta(seconds=pg_timeout))
            results[rank] = fn(rank, world_size, *args, **kwargs)

    def joiner(index: int) -> None:
        function, host = joiners[index]

        def join() -> None:
            joining_host.host = host
            join_running_job(current(), store, pg_timeout, None)

        join.store = store  # type: ignore[attr-defined]  # the job's store, for tests of the joining steps

        with _thread_rank(world_size + index, errors, loopback if fabric is not None else tcp):
            results[world_size + index] = function(join)

    threads = [threading.Thread(target=body, args=(r,), name=f"rank-{r}", daemon=True) for r in range(world_size)]
    threads += [threading.Thread(target=joiner, args=(i,), name=f"joiner-{i}", daemon=True)
                for i in range(len(joiners))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout)  # real time: the harness's bound, which a test's fake clock must not shorten
    if any(thread.is_alive() for thread in threads):
        failed = "".join(f"\n  rank {r}: {type(e).__name__}: {e}" for r, e in sorted(errors.items()))
        raise TimeoutError(f"thread-ranks did not finish within {timeout} s"
                           + (f"; meanwhile these failed:{failed}" if failed else "") + f":\n{_stacks(threads)}")
    if errors:
        rank = min(errors)
        others = "".join(f"\n  rank {r}: {type(e).__name__}: {e}" for r, e in sorted(errors.items()) if r != rank)
        raise RankFailed(rank, f"{type(errors[rank]).__name__}: {errors[rank]}" + others) from errors[rank]
    return results


@contextlib.contextmanager
def _thread_rank(rank: int, errors: dict[int, BaseException], factory: Any) -> Iterator[None]:
    """This thread as a rank: a World of its own; its error recorded; its groups destroyed."""
    use_world(World(transport_factory=factory))
    try:
        yield
    except BaseException as error:  # noqa: BLE001 - reported to the caller
        errors[rank] = error
    finally:
        try:
            if is_initialized():
                destroy_process_group()
        finally:
            use_world(None)
