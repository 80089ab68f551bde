"""Striping between two hosts joined by two networks (PYDIST_SOCKET_IFNAME naming both): the
loss of the second network, or the peer's death, mid-collective is an error naming the peer on
every rank within seconds, never a hang."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pydist.testing import free_port
from pydist.testing.conformance import CASES
from pydist.testing.netns import Network, require_netns

pytestmark = pytest.mark.slow  # network namespaces and real processes

RANK = str(Path(__file__).parent / "run_scripts" / "vanish_rank.py")
SRC = str(Path(__file__).resolve().parent.parent / "src")
#: both interfaces named; the loop's 4 KiB all_reduce is striped (every message over 1 KiB is)
STRIPED = {"PYDIST_SOCKET_IFNAME": "eth", "PYDIST_STRIPE_BYTES": "1024", "PYTHONPATH": SRC}


def start(net: Network, peer_timeouts: tuple[str, str] = ("3", "3")) -> tuple[list[subprocess.Popen], list[dict]]:
    port = free_port()
    procs = [net.popen(i, [sys.executable, RANK], stdout=subprocess.PIPE, text=True,
                       env={**os.environ, **STRIPED, "MASTER_ADDR": net.hosts[0].addr, "MASTER_PORT": str(port),
                            "RANK": str(i), "WORLD_SIZE": "2", "PYDIST_PEER_TIMEOUT": peer_timeouts[i]})
             for i in range(2)]
    ready = [json.loads(proc.stdout.readline()) for proc in procs]
    time.sleep(0.5)  # the scenario: mid-collective (they all_reduce in a loop)
    return procs, ready


@pytest.fixture
def two_networks():
    require_netns()
    with Network(hosts=2, interfaces=2) as net:
        yield net


SUMS = """
import json, numpy as np, pydist
from pydist.groups.world import current
pydist.init_process_group()
rank = pydist.get_rank()
sums = []
for count in (255, 4096, 1 << 20):  # under, at and far over PYDIST_STRIPE_BYTES
    buf = np.arange(count, dtype=np.float32) * (rank + 1)
    pydist.all_reduce(buf)
    sums.append(bool(np.array_equal(buf, np.arange(count, dtype=np.float32) * 3)))
record = current().transport.network.records[rank]
print("RESULT " + json.dumps([sums, [record.address, record.iface], [lane[2] for lane in record.lanes]]), flush=True)
pydist.destroy_process_group()
"""


def test_collectives_striped_over_both_networks_are_exact(two_networks, tmp_path):
    script = tmp_path / "sums.py"
    script.write_text(SUMS)
    port = free_port()
    procs = [two_networks.popen(i, [sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, env={**os.environ, **STRIPED, "MASTER_ADDR": two_networks.hosts[0].addr,
                                                "MASTER_PORT": str(port), "RANK": str(i), "WORLD_SIZE": "2"})
             for i in range(2)]
    outputs = [proc.communicate(timeout=120) for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0], [err[-2000:] for _, err in outputs]
    results = [json.loads(out.split("RESULT ", 1)[1]) for out, _ in outputs]
    for host, (sums, first, lanes) in zip(two_networks.hosts, results):
        assert sums == [True, True, True]
        assert first == [host.addrs[0], "eth0"] and lanes == ["eth1"]


def test_conformance_of_two_hosts_by_two_ranks_striping_every_message(two_networks):
    """Every collective and reduce op, 2 hosts x 2 ranks, every network message over 64 bytes
    striped over both networks (shared memory inside each host)."""
    port = free_port()
    command = [sys.executable, "-m", "pydist.run", "--nnodes", "2", "--nproc-per-node", "2", "--rdzv-backend",
               "c10d", "--rdzv-endpoint", f"{two_networks.hosts[0].addr}:{port}", "--rdzv-id", "stripes",
               "-m", "pydist.testing.conformance"]
    env = {**os.environ, **STRIPED, "PYDIST_STRIPE_BYTES": "64", "PYDIST_SEGMENT_BYTES": "256"}
    procs = [two_networks.popen(h, command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for h in range(2)]
    outputs = [proc.communicate(timeout=600) for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0], [out[-2000:] + err[-2000:] for out, err in outputs]
    summaries = re.findall(r"rank (\d)/4: (\d+) case groups, (\d+) failures", "".join(out for out, _ in outputs))
    assert sorted(int(rank) for rank, _, _ in summaries) == list(range(4))
    assert all(groups == str(len(CASES)) and failures == "0" for _, groups, failures in summaries)


@pytest.mark.parametrize("peer_timeouts", [("3", "3"), ("2", "8")])  # ("2", "8"): rank 0 finds out first
def test_losing_the_second_network_is_named_by_both_ranks(two_networks, peer_timeouts):
    procs, _ = start(two_networks, peer_timeouts)
    gone = time.time()
    two_networks.link_down(1, iface=1)
    reports = [json.loads(proc.stdout.readline()) for proc in procs]
    for rank, report in enumerate(reports):
        peer = 1 - rank
        if report["type"] == "EvictedError":  # the peer declared this rank dead first and told it
            assert report["evicted_by"] == peer and f"rank {peer} on" in report["message"], report
            assert f"{two_networks.hosts[rank].addrs[1]}, eth1)" in report["message"], report
        else:
            assert report["type"] == "PeerFailedError" and report["dead"] == [peer], report
            assert f"rank {peer} on" in report["message"], report
        # PYDIST_PEER_TIMEOUT is at most 8 s; the group's timeout (vanish_rank.py) 60 s: generous
        assert report["raised"] - gone < 30.0, report
    # the rank whose heartbeat fires first names the lost network; its notice (on every lane:
    # the first network carries it) tells the peer it was declared dead, and why
    assert any(r["type"] == "PeerFailedError" and "has not answered" in r["message"]
               and f"{two_networks.hosts[1 - r['rank']].addrs[1]}, eth1)" in r["message"] for r in reports), reports


def test_a_peer_killed_while_striping_is_named(two_networks):
    procs, ready = start(two_networks)
    os.kill(ready[1]["pid"], signal.SIGKILL)
    report = json.loads(procs[0].stdout.readline())
    assert report["type"] == "PeerFailedError" and report["dead"] == [1], report
    assert "rank 1 on" in report["message"] and "closed its connection" in report["message"], report
