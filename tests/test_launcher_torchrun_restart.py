"""torchrun restarts of a pydist job: an attempt never reads what an earlier one left.

torchrun's agent keeps one store for every attempt (static rendezvous: its TCPStore; c10d:
the rendezvous's shared TCPStore) and torch names a group's keys alike in each attempt, so
the plugin keeps each attempt's keys under ``attempt/<run id>/<restart>/<world size>``
(groups.factory.launch_attempt). A published address that refuses connections is given up
after PYDIST_CONNECT_TIMEOUT, naming the rank and the address, not retried for the group's
30-minute timeout.
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from pydist.core.deadline import Deadline
from pydist.core.errors import DistNetworkError
from pydist.core.settings import parse
from pydist.groups.factory import launch_attempt
from pydist.testing.clock import MockClock
from pydist.testing.commands import kill_group
from pydist.transport.tcp.mesh import PeerRecord, connect_to


def test_each_attempt_of_an_elastic_launch_has_a_namespace_of_its_own(monkeypatch):
    for name in ("TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    assert launch_attempt() == ""  # not under an agent: the world's own generation keeps groups apart
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job7")
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert launch_attempt() == "attempt/job7/0/4"
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    assert launch_attempt() == "attempt/job7/1/4"
    monkeypatch.setenv("WORLD_SIZE", "8")  # a membership change (--nnodes 1:2) under one restart count
    assert launch_attempt() == "attempt/job7/1/8"


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]  # closed on return: connecting to it is refused


def test_an_address_that_keeps_refusing_is_given_up_after_the_connect_timeout():
    """An earlier attempt's address (nothing listens there): an error naming the rank and the
    address after PYDIST_CONNECT_TIMEOUT, long before the hour the deadline allows (fake clock)."""
    port = _closed_port()
    record = PeerRecord(0, "127.0.0.1", port, "node0", "h0", "lo")
    with MockClock().installed():
        deadline = Deadline.after(3600)
        with pytest.raises(DistNetworkError) as error:
            connect_to(record, 1, "token", deadline, refused_for=20.0)
        assert deadline.remaining() > 3000
    words = str(error.value)
    assert f"rank 1 could not connect to rank 0 at 127.0.0.1:{port}" in words
    assert "for 20 s (PYDIST_CONNECT_TIMEOUT)" in words and "left in the store by an earlier run" in words


def test_the_connect_timeout_is_a_setting():
    assert parse({}).connect_timeout == 20.0
    assert parse({"PYDIST_CONNECT_TIMEOUT": "2.5"}).connect_timeout == 2.5
    with pytest.raises(ValueError, match="PYDIST_CONNECT_TIMEOUT"):
        parse({"PYDIST_CONNECT_TIMEOUT": "soon"})


@pytest.mark.slow
@pytest.mark.parametrize("rdzv,nproc", [("static", 2), ("c10d", 2), ("static", 4), ("c10d", 4)])
def test_torchrun_restarts_a_pydist_job_whose_rank_exited(rdzv, nproc):
    """Attempt 0's last rank exits; in attempt 1 rank 0 starts late, so its peers reach the
    store first, where attempt 0's keys still are: every rank of attempt 1 gets the right sum."""
    torch = pytest.importorskip("torch")
    del torch
    from torchrun_support import torchrun_restart
    # 150 s: two attempts of up to four ranks importing torch on a loaded 2-core machine
    attempt = torchrun_restart("pydist", nproc, rdzv, late=1.5, cap=150)
    assert attempt.succeeded, f"exit {attempt.returncode}:\n{attempt.output[-4000:]}"


@pytest.mark.slow
@pytest.mark.timeout(400)  # two agents, six ranks importing torch one after another on 2 cores
@pytest.mark.parametrize("api", ["pydist", "pydist-api"])
def test_a_second_torchrun_agent_joining_later_restarts_the_workers_into_the_larger_world(api):
    """``--nnodes 1:2``: the first agent's 2 ranks start alone and all_reduce; a second agent
    joins; torchrun restarts both into a world of 4 (same restart count: a membership change),
    whose every rank gets the sum of 1..4, rank 0 coming late so that the others read the
    store first. ``api``: the torch plugin, or pydist's own init_process_group. With the
    share disabled each round's workers get a store of their own (torch's agent serves one
    on a free port per round), so no stale keys can be read here: the namespace of each
    round of one shared store is checked in process (test_torch_store_rendezvous, review
    finding 8).
    TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1: with two agents on one host, torch 2.13's shared
    rendezvous store loses the second round for gloo as for pydist (the agents wait 60 s for
    each other's keys and fail)."""
    pytest.importorskip("torch")
    import threading

    from torchrun_support import GROW_SCRIPT, free_port, results

    from pydist.testing.commands import finish, start_command

    port = free_port()
    command = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1:2", "--nproc-per-node", "2",
               "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", f"grow-{port}",
               "--rdzv-conf", "last_call_timeout=1", "--monitor-interval", "0.2", str(GROW_SCRIPT), "4", api]
    env = {**os.environ, "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
    first = start_command(command, env=env, stderr=subprocess.STDOUT)
    seen: list[str] = []
    small = threading.Event()

    def read() -> None:
        assert first.stdout is not None
        for line in first.stdout:
            seen.append(line)
            if "SMALL 2" in line:
                small.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert small.wait(120), "".join(seen)[-4000:]  # 120 s: two ranks importing torch on a loaded machine
        second = start_command(command, env=env)
        done, = finish([second], timeout=150)
        first.wait(timeout=60)
    finally:
        for proc in (first,):
            if proc.poll() is None:
                kill_group(proc)
    reader.join(10)
    assert (first.returncode, done.returncode) == (0, 0), "".join(seen)[-3000:] + done.stderr[-3000:]
    found = results("".join(seen) + done.stdout)
    assert {(rank, total) for rank, _, total in found} == {(r, (10.0,) * 4) for r in range(4)}, found
