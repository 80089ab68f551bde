"""The heartbeat (PYDIST_PEER_TIMEOUT, TCP keepalive and user timeout on every peer
connection): a host that vanishes without closing its sockets (its link set down in the
netns harness) is named by every survivor (within 5 s on an idle machine), long before the
group's 60 s timeout; a process that is only stopped (SIGSTOP, its kernel still answers)
is not declared dead."""
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
            assert "rank 2 on" in report["message"] and "stopped answering" in report["message"], report
            # "stopped answering": the heartbeat (PYDIST_PEER_TIMEOUT 3 s), not the group's 60 s
            # timeout (vanish_rank.py); the bound is generous for a loaded machine
            assert report["raised"] - gone < 30.0, report


def test_a_stopped_process_is_not_declared_dead():
    """Rank 1 is stopped for twice the peer timeout while rank 0 waits for it in an
    all_reduce; resumed, both finish it (a live host's kernel answers the probes)."""
    port = free_port()
    env = {"PYDIST_PEER_TIMEOUT": "1", "PYDIST_SHM": "0"}  # over tcp, where the heartbeat is
    procs = [subprocess.Popen([sys.executable, RANK, "once"], env={**_env("127.0.0.1", port, r, 2), **env},
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) for r in range(2)]
    try:
        ready = [json.loads(p.stdout.readline()) for p in procs]  # rank 0 is in the all_reduce, rank 1 waits
        os.kill(ready[1]["pid"], signal.SIGSTOP)
        procs[1].stdin.write("go\n")
        procs[1].stdin.flush()
        time.sleep(2.0)  # the scenario: stopped for twice the peer timeout
        os.kill(ready[1]["pid"], signal.SIGCONT)
        done = [json.loads(p.stdout.readline()) for p in procs]
        assert [d.get("sum") for d in done] == [2.0, 2.0], done
        assert [p.wait(30) for p in procs] == [0, 0]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
