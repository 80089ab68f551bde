"""A transport thread never dies silently (issue 46): when the tcp I/O thread or the
shared-memory progress thread raises, every receive waiting on it (from one peer, or from any)
fails at once with an error that says so and carries the cause, and the death is logged once.
On ab324a2 the thread died with a traceback and every waiter waited out the group's timeout."""
from __future__ import annotations

import logging
import threading

import numpy as np
import pytest

import pydist as dist
from pydist.groups import world as _world
from pydist.testing import run_threads


class Injected(RuntimeError):
    """The exception forced into a transport thread."""


def _raise(*args, **kwargs):
    raise Injected("injected into the transport thread")


def _waiters_fail(rank: int, size: int, which: str, done: threading.Event) -> list | None:
    if rank == 1:
        assert done.wait(60)
        return None
    transport = _world.current().transport
    works = [dist.irecv(np.empty(4, np.float32), src=1, tag=3), dist.irecv(np.empty(4, np.float32), tag=4)]
    if which == "tcp":
        transport.network._heart.tick = _raise  # the I/O thread calls it after each wait
        transport.network._wake()
    else:
        signal = transport.host_local._signals[transport.host_local._me]
        signal.sleep = _raise  # the progress thread's nap, and nobody else's
        signal.wake()
    raised = []
    try:
        for work in works:
            with pytest.raises(dist.DistError) as caught:
                work.wait()
            raised.append(caught.value)
    finally:
        done.set()
    return raised


def _causes(error: BaseException | None) -> list[BaseException]:
    chain = []
    while error is not None:
        chain.append(error)
        error = error.__cause__
    return chain


@pytest.mark.parametrize("which, hosts, words", [("tcp", ["a", "b"], "tcp I/O thread died"),
                                                 ("shm", None, "shared-memory progress thread died")])
def test_a_transport_thread_that_dies_fails_every_waiter_with_the_cause(which, hosts, words, caplog):
    caplog.set_level(logging.ERROR, logger="pydist.transport")
    raised, _ = run_threads(2, _waiters_fail, which, threading.Event(), transport="tcp", hosts=hosts, timeout=60)
    for error in raised:  # the receive from rank 1, and the one from any rank
        assert words in str(error) and "injected into the transport thread" in str(error), error
        assert any(isinstance(cause, Injected) for cause in _causes(error)), _causes(error)
    deaths = [r for r in caplog.records if words in r.getMessage()]
    assert len(deaths) == 1 and deaths[0].exc_info is not None, [r.getMessage() for r in caplog.records]
