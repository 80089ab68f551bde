"""The injectable clock (pydist.core.deadline.set_clock) and MockClock: timeouts computed from a
Deadline expire on fake time, so tests of timeout logic take milliseconds, not the timeout."""
from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest

from pydist.core import deadline as _deadline
from pydist.core.deadline import Deadline
from pydist.store import FileStore, HashStore
from pydist.store._base import StoreTimeoutError
from pydist.testing.clock import MockClock

#: Real seconds these tests may take: far below the fake timeouts they run (60 s and more),
#: far above what a loaded machine adds.
REAL_BOUND = 30.0


def test_deadline_reads_the_installed_clock():
    with MockClock().installed() as clock:
        deadline = Deadline.after(60)
        assert 59 < deadline.remaining() <= 60 and not deadline.expired()
        clock.sleep(30)
        assert 29 < deadline.remaining() <= 30
        clock.sleep(30)
        assert deadline.expired() and deadline.remaining() == 0.0
    assert _deadline.now is time.monotonic  # the real clock is back


def test_a_timed_wait_jumps_to_its_deadline_and_a_done_wait_does_not():
    never, done = threading.Event(), threading.Event()
    done.set()
    with MockClock(autojump_threshold=0.01).installed() as clock:
        started = time.monotonic()
        assert Deadline.after(3600).wait(never.wait) is False
        assert time.monotonic() - started < REAL_BOUND and clock.jumps == 1
        assert Deadline.after(3600).wait(done.wait) is True and clock.jumps == 1


@pytest.mark.parametrize("kind", ["hash", "file"])
def test_store_wait_times_out_on_fake_time(kind, tmp_path):
    """HashStore waits on a condition (a timed wait on the clock), FileStore polls with backoff
    sleeps (sleeps on the clock): either way a 5-minute timeout passes on fake time."""
    with HashStore() if kind == "hash" else FileStore(str(tmp_path / "store")) as store:
        with MockClock(autojump_threshold=0.01).installed():
            started = time.monotonic()
            with pytest.raises(StoreTimeoutError, match="nokey"):
                store.wait(["nokey"], timedelta(minutes=5))
            assert time.monotonic() - started < REAL_BOUND
