"""Polls bounded by a Deadline pause on pydist's clock, so a fake clock ends them at their
timeout (a pause in real time with a deadline on the fake one never reaches it)."""
from __future__ import annotations

import pytest

from pydist import HashStore
from pydist.core.deadline import Deadline
from pydist.core.errors import DistStoreError, OpTimeoutError
from pydist.groups import admission
from pydist.testing.clock import MockClock
from pydist.transport.shm.sharing import _wait_for_name

FAKE_TIMEOUT = 5.0  # fake seconds, reached by jumps of the clock at each pause
JUMP_AFTER = 0.005  # real seconds the one waiting thread idles before the clock jumps (the test's pace)


def test_a_creator_that_never_comes_times_out_on_the_fake_clock():
    looks = []
    with MockClock(autojump_threshold=JUMP_AFTER).installed():
        with pytest.raises(OpTimeoutError, match="rank 0 to create the shared memory"):
            _wait_for_name(HashStore(), "arena/name", 0, Deadline.after(FAKE_TIMEOUT), lambda: looks.append(1))
    assert len(looks) > 1


def test_a_decision_that_never_comes_times_out_on_the_fake_clock():
    ticket = admission.Ticket(transport_rank=3, namespace="ns", size=3)
    with MockClock(autojump_threshold=JUMP_AFTER).installed():
        with pytest.raises(DistStoreError, match="no decision about it"):
            admission.await_decision(HashStore(), ticket, FAKE_TIMEOUT)
