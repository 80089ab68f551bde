"""A network partition between two hosts (namespace hosts x 2 ranks, all packets dropped both
ways while the ranks loop over all_reduce): every rank raises a DistError at its timeout;
the store's side says it has not heard from the other side lately (not that those ranks
never reached the operation); every process then exits promptly (it used to take another
8-13 s: destroy waited for a store call to the unreachable store host). The rank script:
tests/run_scripts/partitioned_rank.py."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import pydist
from pydist.testing import free_port
from pydist.testing.netns import Network, require_netns

pytestmark = pytest.mark.slow  # network namespaces, real timeouts

SCRIPT = Path(__file__).parent / "run_scripts" / "partitioned_rank.py"
TIMEOUT_S = 5.0
#: Seconds a process may take to exit after raising: destroy waits 0.5 s for a progress
#: record in flight and up to 2 s for the peers' goodbyes; the bound only tells a process that
#: exits from one stuck in its exit (until the 120 s bound below), generous for a loaded machine.
EXIT_S = 30.0


def _report(text: str) -> dict:
    return next(json.loads(line) for line in text.splitlines() if line.startswith("{"))


def test_a_partition_fails_every_rank_at_its_timeout_and_the_processes_exit(tmp_path):
    require_netns()
    with Network(hosts=2) as net:
        port, procs = free_port(), []
        for rank in range(4):
            # the heartbeat off: this is about what a timeout says (with it, the partition is a
            # vanished peer named after PYDIST_PEER_TIMEOUT: tests/test_failure_heartbeat.py)
            env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": "4", "MASTER_ADDR": net.hosts[0].addr,
                   "MASTER_PORT": str(port), "PYDIST_PEER_TIMEOUT": "0"}
            procs.append(net.popen(rank // 2, [sys.executable, str(SCRIPT), str(TIMEOUT_S), str(tmp_path)], env=env,
                                   stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   text=True))
        while len(list(tmp_path.glob("ready-*"))) < 4:
            assert all(p.poll() is None for p in procs), [p.communicate() for p in procs]
            time.sleep(0.1)
        time.sleep(1.0)  # the ranks are in the loop, publishing their progress
        net.shape(0, loss=1.0)
        net.shape(1, loss=1.0)
        exits: dict[int, float] = {}
        deadline = time.monotonic() + 120
        while len(exits) < 4 and time.monotonic() < deadline:
            for rank, proc in enumerate(procs):
                if rank not in exits and proc.poll() is not None:
                    exits[rank] = time.time()
            time.sleep(0.05)
        outputs = [proc.communicate() for proc in procs]
    reports = {rank: _report(out) for rank, (out, _) in enumerate(outputs)}
    for rank, report in reports.items():
        assert report["type"] in ("OpTimeoutError", "GroupAbortedError"), report
        assert issubclass(getattr(pydist, report["type"]), pydist.DistError), report
        assert exits[rank] - report["raised"] < EXIT_S, f"rank {rank} exited {exits[rank] - report['raised']:.1f} s " \
                                                        "after raising"
    for rank in (0, 1):  # the other side's records stopped at the cut: not passed off as current
        message = reports[rank]["message"]
        if rank == 1 and "the store failed" in message:
            # rank 0 (the store's process) raised first and exited before rank 1 timed out: then
            # rank 1 can only say that the store is gone
            assert reports[0]["raised"] < reports[1]["raised"], reports
            continue
        assert "not heard from lately (cut off from the store, or stopped): 2 (" in message, message
        assert "ranks that never reached it" not in message, message

