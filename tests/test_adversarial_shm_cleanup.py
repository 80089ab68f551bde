"""Attack: entries planted in /dev/shm by another local user. The stale-segment clean-up run
before each segment's creation must neither raise on them (one file used to stop every
job of 2+ ranks on the host) nor remove what is not this user's own pydist segment."""
import os
import subprocess
import sys

import numpy as np
import pytest
import shm_planting

import pydist as dist
from pydist.testing import run_processes
from pydist.transport.shm import atomics as _atomics
from pydist.transport.shm.segment import remove_stale

pytestmark = [pytest.mark.adversarial,
              pytest.mark.skipif(not _atomics.available(), reason="no libatomic/futex: shared memory is off")]

def _dead_pid() -> int:
    """The pid of a process that has exited (reused only after the kernel wraps around)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


@pytest.fixture
def planted():
    """The entries another user could leave in /dev/shm, all named like pydist's segments
    whose creator is gone or unparseable; removed at teardown."""
    dead = _dead_pid()
    with shm_planting.planted({
        "huge pid": f"/dev/shm/pydist-x-{'9' * 20}",
        "directory": "/dev/shm/pydist-x-4194000",
        "other user's": f"/dev/shm/pydist-0123456789ab-arena-{'ab' * 16}-{dead}",
        "symlink": f"/dev/shm/pydist-0123456789ab-host-{'cd' * 16}-{dead}",
        "not a number": "/dev/shm/pydist-x-1e5",
    }) as paths:
        yield paths


def test_remove_stale_leaves_planted_entries_alone_and_does_not_raise(planted):
    removed = remove_stale()
    assert not set(removed) & {os.path.basename(p) for p in planted.values()}
    assert [what for what, path in planted.items() if not os.path.lexists(path)] == []


def test_remove_stale_still_removes_this_users_segment_of_a_dead_creator():
    path = f"/dev/shm/pydist-0123456789ab-arena-{'ef' * 16}-{_dead_pid()}"
    with open(path, "wb"):
        pass
    try:
        assert os.path.basename(path) in remove_stale()
        assert not os.path.lexists(path)
    finally:
        if os.path.lexists(path):
            os.unlink(path)


def _all_reduce(rank, size):
    x = np.full(1000, rank + 1, np.float64)
    dist.all_reduce(x)
    return float(x[0])


@pytest.mark.slow
def test_a_two_rank_job_starts_beside_planted_entries(planted):
    """The job's segment creator runs the clean-up first: the planted entries stop nothing
    (on the old code, OverflowError from os.kill), and they are still there after it."""
    assert run_processes(2, _all_reduce) == [3.0, 3.0]
    assert [what for what, path in planted.items() if not os.path.lexists(path)] == []
