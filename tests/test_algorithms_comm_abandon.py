"""Comm.abandon after an error withdraws every receive still posted, in a hierarchy's stages too."""
import numpy as np

from pydist.algorithms.comm import Comm, Hierarchy
from pydist.core.deadline import Deadline
from pydist.transport.base import Request


class RecordingTransport:
    """Posts receives that never complete; records which were cancelled."""

    def __init__(self):
        self.cancelled: list[Request] = []

    def irecv(self, peer, data, key, call=0) -> Request:
        return Request(peer, data, call)

    def cancel(self, request: Request) -> None:
        self.cancelled.append(request)


def _comm(transport, ranks, rank) -> Comm:
    return Comm(transport, 7, ranks, rank, 1, Deadline(None), "all_reduce")


def test_abandon_cancels_the_receives_of_the_local_leader_and_rail_stages():
    transport = RecordingTransport()
    top = _comm(transport, [0, 1, 2, 3], 0)
    local, leaders, rail = _comm(transport, [0, 1, 2, 3], 0), _comm(transport, [0, 2], 0), _comm(transport, [0, 2], 0)
    top.hierarchy = Hierarchy(local, leaders, [[0, 1], [2, 3]], 0, rail, None)
    posted = [comm.irecv(1, np.zeros(4, np.float32)) for comm in (top, leaders, rail)]
    top.abandon()
    assert transport.cancelled == posted
