"""c10d agents of one machine starting together: exactly one hosts the rendezvous store and
the others reach it, over 400 forked pairs started at once (``make soak``: statistical, ~30 s).
Linux lets two SO_REUSEADDR sockets that bind one port at the same time both fail to listen
(EADDRINUSE) or both listen; agents that raced so took it for "another agent hosts it" and
were refused for connect_timeout, or hosted two stores on one port. The turn that prevents it
is tested deterministically in test_launcher_endpoint.py."""
from __future__ import annotations

import mmap
import os
import struct
import time

import pytest

from pydist.run.config import LaunchConfig
from pydist.run.endpoint import open_store
from pydist.testing import free_port

pytestmark = [pytest.mark.soak, pytest.mark.slow]  # hundreds of forked pairs

AGENTS = 2
ROUNDS = 400  # the kernel's race hits ~0.7% of simultaneous starts (measured): ~94% to see it


def _agent(shared: mmap.mmap, slot: int, round_: int, port: int) -> None:
    """Wait for the round's start, open the endpoint, write 1 (hosting), 2 (client that
    reached the host's store) or 3 (failed) into ``slot``; hold the store until the round ends."""
    config = LaunchConfig(nproc_per_node=1, command=["true"], node_rank=-1, master_addr="127.0.0.1",
                          master_port=port, connect_timeout=2.0)
    while struct.unpack_from("i", shared, 0)[0] < round_:
        pass
    try:
        store, hosting = open_store(config)
    except Exception:
        outcome, store = 3, None
    else:
        outcome = 1 if hosting else 2
    struct.pack_into("i", shared, 4 * (1 + slot), outcome)
    while struct.unpack_from("i", shared, 0)[0] == round_:  # the parent ends the round
        time.sleep(0.001)
    if store is not None:
        store.close()


def test_simultaneous_agents_elect_one_host():
    shared = mmap.mmap(-1, 4096)
    outcomes: dict[tuple[int, ...], int] = {}
    for round_ in range(1, ROUNDS + 1):
        port = free_port()
        struct.pack_into("i" * AGENTS, shared, 4, *[0] * AGENTS)
        pids = []
        for slot in range(AGENTS):
            pid = os.fork()
            if pid == 0:
                try:
                    _agent(shared, slot, round_, port)
                finally:
                    os._exit(0)
            pids.append(pid)
        time.sleep(0.02)  # both are waiting (the interpreter forked is warm)
        struct.pack_into("i", shared, 0, round_)
        while 0 in struct.unpack_from("i" * AGENTS, shared, 4):
            time.sleep(0.001)
        result = tuple(sorted(struct.unpack_from("i" * AGENTS, shared, 4)))
        outcomes[result] = outcomes.get(result, 0) + 1
        struct.pack_into("i", shared, 0, -round_)  # the round ends: the agents close their stores
        for pid in pids:
            os.waitpid(pid, 0)
        struct.pack_into("i", shared, 0, round_)
    assert outcomes == {(1, 2): ROUNDS}  # one host and one client every time
