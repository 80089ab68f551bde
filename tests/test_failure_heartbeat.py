"""The heartbeat (PYDIST_PEER_TIMEOUT: every rank's tcp I/O thread sends a BEAT on a connection
idle for a third of it, and declares dead a peer it heard nothing from for all of it): a host
that vanishes without closing its sockets (its link set down in the netns harness) is named
by every survivor (within 5 s on an idle machine), long before the group's 60 s timeout; so
is a stopped process (SIGSTOP), which learns on waking that it was declared dead; a process
busy computing, or starved of CPU on the same host, is not."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pydist.testing import free_port
from pydist.testing.netns import Network, require_netns

RANK = str(Path(__file__).parent / "run_scripts" / "vanish_rank.py")
SRC = str(Path(__file__).resolve().parent.parent / "src")

pytestmark = pytest.mark.slow  # real processes, network namespaces and seconds of real time


def _env(master: str, port: int, rank: int, size: int) -> dict[str, str]:
    return {**os.environ, "MASTER_ADDR": master, "MASTER_PORT": str(port), "RANK": str(rank),
            "WORLD_SIZE": str(size), "PYTHONPATH": SRC}


def test_a_host_that_vanishes_mid_collective_is_named_by_the_heartbeat():
    require_netns()
    with Network(hosts=3) as net:
        port = free_port()
        procs = [net.popen(i, [sys.executable, RANK], env=_env(net.hosts[0].addr, port, i, 3),
                           stdout=subprocess.PIPE, text=True) for i in range(3)]
        for proc in procs:
            assert "ready" in json.loads(proc.stdout.readline())
        time.sleep(0.5)  # mid-collective: they all_reduce in a loop
        gone = time.time()
        net.link_down(2)
        for proc in procs[:2]:
            report = json.loads(proc.stdout.readline())
            assert report["type"] == "PeerFailedError" and report["dead"] == [2], report
            assert "rank 2 on" in report["message"] and "has not answered" in report["message"], report
            # "has not answered": the heartbeat (PYDIST_PEER_TIMEOUT 3 s), not the group's 60 s
            # timeout (vanish_rank.py); the bound is generous for a loaded machine
            assert report["raised"] - gone < 30.0, report


FROZEN = str(Path(__file__).parent / "run_scripts" / "frozen_rank.py")


def _ranks(size: int, args: list[str], env: dict[str, str]) -> list[subprocess.Popen]:
    port = free_port()
    return [subprocess.Popen([sys.executable, FROZEN, *args], env={**_env("127.0.0.1", port, r, size), **env},
                             stdout=subprocess.PIPE, text=True) for r in range(size)]


def _stop(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("env", [{"PYDIST_SHM": "0"}, {}], ids=["tcp", "shared memory"])
def test_a_stopped_process_is_named_by_every_survivor_and_learns_it_was_evicted(env):
    """Rank 1 of 4 is stopped (SIGSTOP) mid-all_reduce: its pydist threads stop too, so its
    heartbeat does; every survivor raises naming it ("has not answered"), at the default
    PYDIST_PEER_TIMEOUT of 3 s. Resumed, rank 1 learns it was declared dead (EvictedError)."""
    procs = _ranks(4, ["loop"], env)
    try:
        ready = [json.loads(p.stdout.readline()) for p in procs]
        time.sleep(0.5)  # mid-loop
        stopped = time.time()
        os.kill(ready[1]["pid"], signal.SIGSTOP)
        reports = [json.loads(procs[r].stdout.readline()) for r in (0, 2, 3)]
        for report in reports:
            assert report["type"] == "PeerFailedError" and 1 in report["dead"], report
            assert "rank 1 on" in report["message"], report
            # named by the heartbeat (3 s), not the group's 60 s timeout; generous for a loaded machine
            assert report["raised"] - stopped < 30.0, report
        assert all("has not answered" in r["message"] for r in reports), [r["message"] for r in reports]
        # the kernel's word (same host): stopped, not "stopped or stuck, or its host is gone"
        assert all("its process is stopped (SIGSTOP" in r["message"] for r in reports), [r["message"] for r in reports]
        os.kill(ready[1]["pid"], signal.SIGCONT)
        woke = json.loads(procs[1].stdout.readline())
        assert woke["type"] == "EvictedError" and "rank 1" in woke["message"], woke
        assert [p.wait(30) for p in procs] == [0, 0, 0, 0]
    finally:
        _stop(procs)


@pytest.mark.parametrize("how", ["busy", "starved"])
def test_a_busy_or_starved_live_process_is_not_declared_dead(how):
    """Rank 1 spends twice the peer timeout before each all_reduce while the others wait in it.
    busy: computing in Python, its heartbeat goes on (the pydist thread gets the GIL in turns).
    starved: in a C call holding the GIL, its pydist threads cannot run and its heartbeat
    stops, as a live process's does when a loaded machine gives it no CPU for that long (256
    ranks on 2 cores); on the same host the kernel says it runs (transport/tcp/liveness.py) and
    it is waited for. Either way nobody is declared dead and every all_reduce completes. Two
    rounds: a gap of twice the timeout is past it in each; the second starts after a gap was
    survived (five rounds added nothing but 6 s)."""
    procs = _ranks(3, [how, "2.0", "2"], {"PYDIST_PEER_TIMEOUT": "1", "PYDIST_SHM": "0"})
    try:
        [json.loads(p.stdout.readline()) for p in procs]
        done = [json.loads(p.stdout.readline()) for p in procs]
        assert [d.get("sum") for d in done] == [3.0, 3.0, 3.0], done
        assert [p.wait(30) for p in procs] == [0, 0, 0]
    finally:
        _stop(procs)
