"""What an abort tells the peers: the dead rank named once, however many ranks relay it, with
the ranks known dead; a failure that is not a death names the aborting rank."""
from __future__ import annotations

from pydist.core.errors import GroupAbortedError, OpTimeoutError, PeerFailedError
from pydist.transport.abort import abort_payload, aborted_by

DEATH = "rank 0 on h0 closed its connection to rank 2 unexpectedly: its process exited or was killed"


def test_a_relayed_death_names_the_dead_rank_once():
    first = PeerFailedError(DEATH, rank=0, host="h0")
    relayed = aborted_by(2, "h2", abort_payload(first, known_dead=[0]))
    again = aborted_by(1, "h1", abort_payload(relayed, known_dead=[0]))
    for error in (relayed, again):
        assert isinstance(error, PeerFailedError) and error.rank == 0 and error.host == "h0"
        assert str(error).count("closed its connection") == 1 and str(error).count("saw it") == 1, str(error)
    assert "rank 2 on h2 saw it" in str(again)  # the first witness, not the last relay


def test_the_ranks_known_dead_are_listed():
    error = aborted_by(2, "h2", abort_payload(PeerFailedError(DEATH, rank=0, host="h0"), known_dead=[3, 0]))
    assert "ranks known dead: 0, 3" in str(error)
    single = aborted_by(2, "h2", abort_payload(PeerFailedError(DEATH, rank=0, host="h0"), known_dead=[0]))
    assert "known dead" not in str(single)


def test_another_failure_names_the_rank_that_aborted():
    error = aborted_by(1, "h1", abort_payload(OpTimeoutError("all_reduce (seq 2) on rank 1 timed out")))
    assert isinstance(error, GroupAbortedError) and error.rank == 1
    assert str(error) == "rank 1 (h1) failed and aborted the group: all_reduce (seq 2) on rank 1 timed out"
    relayed = aborted_by(3, "h3", abort_payload(error))
    assert str(relayed).count("failed and aborted the group") == 1 and relayed.rank == 1, str(relayed)
