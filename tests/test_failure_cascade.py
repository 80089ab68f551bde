"""A rank that shuts down its process group after it heard that a peer failed says so in its
goodbye: a rank still waiting on it names the failed rank, not only "rank N has shut down
its process group". Survivors of torch jobs often destroy their group in an except block
while other ranks still wait on them, and those may not have heard of the failure yet (its
ABORT frames are behind megabytes of data, or never concerned them)."""
from __future__ import annotations

import re

import numpy as np
import pytest

import pydist
from pydist.groups import farewell
from pydist.groups.factory import leave
from pydist.groups.world import current
from pydist.testing import run_threads

THREE_HOSTS = ["a", "b", "c"]  # every pair over TCP


def _cascade(rank: int, size: int) -> str:
    """Rank 0 fails (its process ends on an error); rank 1 hears of it in a group of ranks 0
    and 1 only (so its abort reaches nobody else), then leaves; rank 2, receiving from rank 1
    in the default group, returns what it raised."""
    pair = pydist.new_group([0, 1])
    pydist.barrier()
    if rank == 0:
        farewell.say_goodbye(current(), "ValueError: rank zero broke")
        leave(current(), finished=False)
    elif rank == 1:
        with pytest.raises(pydist.DistError, match="rank 0"):
            pydist.recv(np.zeros(2), src=0, group=pair)
        pydist.destroy_process_group()
    else:
        with pytest.raises(pydist.PeerFailedError) as raised:
            pydist.recv(np.zeros(2), src=1)
        pydist.destroy_process_group()
    pydist.init_process_group(store=pydist.HashStore(), rank=0, world_size=1)  # the harness destroys it
    return str(raised.value) if rank == 2 else ""


def test_a_rank_that_shuts_down_after_a_failure_names_the_failed_rank():
    *_, error = run_threads(3, _cascade, transport="tcp", hosts=THREE_HOSTS, timeout=60)
    assert "rank 1 on" in error and "has shut down its process group (destroy_process_group)" in error, error
    assert re.search(r"destroy_process_group\) after rank 0 on [^;]* failed; rank 2 cannot", error), error


def test_a_shutdown_without_a_failure_heard_reads_as_before():
    """The goodbye of a rank that heard of no failure is the plain shutdown's."""
    def plain(rank: int, size: int) -> str:
        pydist.barrier()
        if rank == 1:
            pydist.destroy_process_group()
            pydist.init_process_group(store=pydist.HashStore(), rank=0, world_size=1)
            return ""
        if rank == 2:
            with pytest.raises(pydist.PeerFailedError) as raised:
                pydist.recv(np.zeros(2), src=1)
            return str(raised.value)
        return ""
    *_, error = run_threads(3, plain, transport="tcp", hosts=THREE_HOSTS, timeout=60)
    assert "has shut down its process group (destroy_process_group); rank 2 cannot" in error, error
