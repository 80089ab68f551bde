"""Real networks in namespaces: two interfaces per host (the one named carries the peers'
connections), IPv6-only hosts (the conformance matrix over tcp, a rendezvous at [addr]:port,
a host name that resolves only to IPv6)."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pydist.testing.conformance import CASES
from pydist.testing.netns import Network, require_netns

pytestmark = pytest.mark.slow  # network namespaces and real processes

PORT = 29400
FAST = "join_timeout=60,last_call_timeout=1,read_timeout=30"

#: Each rank's sum and the address every rank's peers dial (from the transport's records).
ADDRESSES = """
import json, numpy as np, pydist
from pydist.groups.world import current
pydist.init_process_group()
buf = np.ones(3) * (pydist.get_rank() + 1)
pydist.all_reduce(buf)
records = current().transport.network.records
print("RESULT " + json.dumps([buf.tolist(), [[r.address, r.iface] for r in records.values()]]), flush=True)
pydist.destroy_process_group()
"""


def launch(net: Network, host: int, endpoint: str, args: list[str], env: dict[str, str]) -> subprocess.Popen:
    command = [sys.executable, "-m", "pydist.run", "--nnodes", str(net.size), "--rdzv-backend", "c10d",
               "--rdzv-endpoint", endpoint, "--rdzv-id", "nw", "--rdzv-conf", FAST, *args]
    return net.popen(host, command, env={**os.environ, "PYTHONUNBUFFERED": "1", **env},
                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def run_job(net: Network, endpoint: str, args: list[str], env: dict[str, str] | None = None,
            timeout: float = 180) -> list[tuple[int, str, str]]:
    procs = [launch(net, h, endpoint, args, env or {}) for h in range(net.size)]
    deadline, results = time.monotonic() + timeout, []
    for proc in procs:
        out, err = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
        results.append((proc.returncode, out, err))
    return results


def results_of(results: list[tuple[int, str, str]]) -> list:
    assert [code for code, _, _ in results] == [0] * len(results), "\n".join(err[-3000:] for _, _, err in results)
    return [json.loads(found) for _, out, _ in results for found in re.findall(r"RESULT (.*)", out)]


@pytest.fixture
def two_nics():
    require_netns()
    with Network(hosts=2, interfaces=2) as net:
        yield net


@pytest.mark.parametrize("spec, iface", [("eth1", "eth1"), ("=eth0", "eth0"), ("^eth0", "eth1")])
def test_the_named_interface_carries_the_peers_connections(two_nics, tmp_path, spec, iface):
    """The store on eth0's subnet, PYDIST_SOCKET_IFNAME naming one interface: every rank
    advertises (and its peers dial) that interface's address."""
    script = tmp_path / "job.py"
    script.write_text(ADDRESSES)
    k = int(iface[-1])
    results = results_of(run_job(two_nics, f"{two_nics.hosts[0].addr}:{PORT}",
                                 ["--nproc-per-node", "1", str(script)], {"PYDIST_SOCKET_IFNAME": spec}))
    assert len(results) == 2 and all(sums == [3.0] * 3 for sums, _ in results)
    assert results[0][1] == [[host.addrs[k], iface] for host in two_nics.hosts]


def test_gloo_socket_ifname_is_honoured(two_nics, tmp_path):
    script = tmp_path / "job.py"
    script.write_text(ADDRESSES)
    results = results_of(run_job(two_nics, f"{two_nics.hosts[0].addr}:{PORT}",
                                 ["--nproc-per-node", "1", str(script)], {"GLOO_SOCKET_IFNAME": "eth1"}))
    assert results[0][1] == [[host.addrs[1], "eth1"] for host in two_nics.hosts]


def test_an_interface_matching_nothing_fails_every_rank_clearly(two_nics, tmp_path):
    script = tmp_path / "job.py"
    script.write_text(ADDRESSES)
    results = run_job(two_nics, f"{two_nics.hosts[0].addr}:{PORT}", ["--nproc-per-node", "1", str(script)],
                      {"PYDIST_SOCKET_IFNAME": "ib"})
    assert [code for code, _, _ in results] != [0, 0]
    for _, _, err in results:
        assert re.search(r"PYDIST_SOCKET_IFNAME=ib matches no interface with an address on .*; its interfaces: "
                         r".*eth0 \(10\.77\.\d+\.\d+\), eth1 \(10\.77\.\d+\.\d+\)", err), err[-3000:]


@pytest.fixture
def ipv6_only():
    require_netns(ipv6=True)
    with Network(hosts=2, ipv6="only") as net:
        yield net


def test_conformance_over_tcp_on_ipv6_only_hosts(ipv6_only):
    """Two IPv6-only hosts x 2 ranks: the rendezvous at [addr]:port, tcp between the hosts."""
    endpoint = f"[{ipv6_only.hosts[0].addr}]:{PORT}"
    results = run_job(ipv6_only, endpoint, ["--nproc-per-node", "2", "-m", "pydist.testing.conformance"],
                      {"PYDIST_SEGMENT_BYTES": "64"}, timeout=600)
    assert [code for code, _, _ in results] == [0, 0], [out[-2000:] + err[-2000:] for _, out, err in results]
    summaries = re.findall(r"rank (\d)/4: (\d+) case groups, (\d+) failures", "".join(out for _, out, _ in results))
    assert sorted(int(rank) for rank, _, _ in summaries) == list(range(4))
    assert all(groups == str(len(CASES)) and failures == "0" for _, groups, failures in summaries)


def test_master_addr_a_name_that_resolves_only_to_ipv6(ipv6_only, tmp_path):
    """MASTER_ADDR=node0, which the hosts' /etc/hosts (ip netns exec mounts /etc/netns/<ns>/)
    resolves to host 0's IPv6 address only."""
    script = tmp_path / "job.py"
    script.write_text(ADDRESSES)
    made = []
    for host in ipv6_only.hosts:
        directory = Path("/etc/netns") / host.name
        directory.mkdir(parents=True)
        made.append(directory)
        (directory / "hosts").write_text(f"::1 localhost\n{ipv6_only.hosts[0].addr} node0\n")
    try:
        procs = [ipv6_only.popen(i, [sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True, env={**os.environ, "MASTER_ADDR": "node0", "MASTER_PORT": str(PORT),
                                                 "RANK": str(i), "WORLD_SIZE": "2"}) for i in range(2)]
        outputs = [p.communicate(timeout=120) for p in procs]
        results = results_of([(p.returncode, out, err) for p, (out, err) in zip(procs, outputs)])
    finally:
        for directory in made:
            for file in directory.iterdir():
                file.unlink()
            directory.rmdir()
    assert [address for address, _ in results[0][1]] == [host.addr for host in ipv6_only.hosts]
