"""A sender that runs ahead of its receiver over TCP is held back: the receiver keeps at most
about PYDIST_MAX_UNEXPECTED_BYTES of a peer's unposted messages, then stops reading it until
receives are posted; everything then arrives intact."""
from __future__ import annotations

import threading

import numpy as np
import pytest

import pydist as dist
from pydist.groups import world as _world
from pydist.testing import run_threads

LIMIT = 4 << 20
MESSAGE = 1 << 20
COUNT = 64  # 64 MiB sent ahead: far more than the limit plus the kernel's socket buffers


def _run_ahead(rank: int, size: int, sent: threading.Event, settled: threading.Event,
               counted: threading.Event) -> dict:
    if rank == 0:
        works = [dist.isend(np.full(MESSAGE // 4, i, np.float32), dst=1, tag=i) for i in range(COUNT)]
        sent.set()
        assert settled.wait(60)
        unfinished = sum(not work.is_completed() for work in works)
        counted.set()
        for work in works:
            work.wait()
        return {"unfinished": unfinished}
    assert sent.wait(60)
    matcher = _world.current().transport.matcher
    _wait_quiet(matcher)
    held = matcher.throttle.held.get(0, 0)
    settled.set()
    assert counted.wait(60)
    received = [np.empty(MESSAGE // 4, np.float32) for _ in range(COUNT)]
    for i, buffer in enumerate(received):
        dist.recv(buffer, src=0, tag=i)
    return {"held": held, "intact": all((buffer == i).all() for i, buffer in enumerate(received))}


def _wait_quiet(matcher, seconds: float = 2.0) -> None:
    """Let the I/O thread read what it will: return once the held bytes did not change for
    ``seconds``/4 (a generous settling time; the test asserts no upper bound on time)."""
    quiet = threading.Event()
    last = None
    while not quiet.wait(seconds / 4):
        now = matcher.throttle.held.get(0, 0)
        if now == last:
            return
        last = now


@pytest.mark.slow
def test_a_receiver_holds_a_bounded_amount_and_the_sender_waits(monkeypatch):
    monkeypatch.setenv("PYDIST_MAX_UNEXPECTED_BYTES", str(LIMIT))
    events = [threading.Event() for _ in range(3)]
    sender, receiver = run_threads(2, _run_ahead, *events, transport="tcp", hosts=["a", "b"], timeout=120)
    assert receiver["intact"]
    assert receiver["held"] <= LIMIT + MESSAGE, f"held {receiver['held']} bytes (limit {LIMIT})"
    assert sender["unfinished"] > 0, "every send completed although the receiver posted nothing"
