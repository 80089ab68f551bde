"""One malformed frame from an authenticated peer (issue 46, item 4): a 48-byte header
claiming a 2 GiB heartbeat, or a data frame of 128 TiB for a receive nobody posted, costs
rank 0 less than 256 MiB and ends in an error naming the sender within 30 s, whether the
bytes come over TCP (a tcp-only job, or the tcp connection of a shared-memory job) or
through the shared-memory ring. On ab324a2 the heartbeat grew rank 0 by 2 GiB and the data
frame raised MemoryError in its I/O thread (or a bare MemoryError from ``recv``); either
way rank 0 waited for its 45 s timeout."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pydist.testing import free_port

RANK = str(Path(__file__).parent / "run_scripts" / "hostile_frame_rank.py")
SRC = str(Path(__file__).resolve().parent.parent / "src")
#: what one header may cost rank 0 (the issue's acceptance)
BUDGET = 256 << 20
#: how soon rank 0 must raise (the issue's acceptance; the job's timeout is 45 s, so a rank
#: that only times out fails this; a loaded machine takes a second or two)
WITHIN = 30.0

pytestmark = [pytest.mark.slow, pytest.mark.adversarial]  # two real processes each


@pytest.mark.parametrize("attack", ["beat", "data"])
@pytest.mark.parametrize("carrier, env", [("tcp", {"PYDIST_SHM": "0"}), ("tcp", {}), ("ring", {})],
                         ids=["tcp", "tcp-of-shm-job", "shm-ring"])
def test_a_malformed_header_is_cheap_and_names_its_sender(attack, carrier, env):
    port = free_port()
    procs = [subprocess.Popen([sys.executable, RANK, attack, carrier],
                              env={**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                                   "RANK": str(rank), "WORLD_SIZE": "2", "PYTHONPATH": SRC, **env},
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
             for rank in range(2)]
    try:
        ready = [json.loads(p.stdout.readline()) for p in procs]
        assert ready[0]["shm"] == (env.get("PYDIST_SHM") != "0"), ready
        procs[1].stdin.write("go\n")
        procs[1].stdin.flush()
        sent = json.loads(procs[1].stdout.readline())["sent"]
        report = json.loads(procs[0].stdout.readline())
        growth = report["hwm_after"] - report["rss_before"]
        print(f"{attack} over {carrier} {env}: rank 0 grew {growth / 2**20:.1f} MiB (peak over before), "
              f"raised {report['raised'] - sent:.2f} s after the header: {report['type']}: {report['message']}")
        assert growth < BUDGET, report
        assert report["type"] == "PeerFailedError", report
        assert "rank 1" in report["message"] and "malformed frame" in report["message"], report
        assert report["raised"] - sent < WITHIN, report
        assert procs[0].wait(30) == 0
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
