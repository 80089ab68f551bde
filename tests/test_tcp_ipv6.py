"""IPv6: tcp://[addr]:port and MASTER_ADDR as an IPv6 address, the transport listening and
dialling in the family of the route, pydist-run's --rdzv-endpoint [addr]:port, and a clear
error on a host without IPv6."""
from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from pydist.net.addresses import family_of, host_port
from pydist.run import cli
from pydist.testing import run_processes
from pydist.testing.conformance import run_suite
from pydist.testing.netns import Network, require_netns

needs_ipv6_loopback = pytest.mark.skipif(not socket.has_ipv6, reason="Python built without IPv6")


@pytest.mark.parametrize("endpoint, expected", [
    ("[::1]:29400", ("::1", 29400)), ("[fd00::7]", ("fd00::7", 29401)), ("fd00::7", ("fd00::7", 29401)),
    ("node:5", ("node", 5)), ("node", ("node", 29401)), ("", ("127.0.0.1", 29401)),
])
def test_rdzv_endpoint_reads_ipv6_in_brackets_as_torchrun(endpoint, expected):
    assert cli._host_port(endpoint, 29401) == expected


@pytest.mark.parametrize("endpoint", ["[::1]x", "[::1]:port", "node:70000"])
def test_rdzv_endpoint_bad_port_is_a_clear_error(endpoint):
    with pytest.raises(ValueError, match="--rdzv-endpoint"):
        cli._host_port(endpoint, 29400)


def test_addresses_of_both_families():
    assert family_of("::1") == family_of("fe80::1%eth0") == socket.AF_INET6
    assert family_of("10.0.0.1") == family_of("node") == socket.AF_INET
    assert host_port("::1", 5) == "[::1]:5" and host_port("10.0.0.1", 5) == "10.0.0.1:5"


@pytest.mark.slow
@needs_ipv6_loopback
@pytest.mark.parametrize("init", ["tcp", "env", "store"])
def test_init_over_ipv6_loopback(init):
    results = run_processes(2, _sum, init=init, host="::1", env={"PYDIST_SHM": "0"}, timeout=120)
    assert results == [[3.0] * 5] * 2


def _sum(rank, size):
    import numpy as np

    import pydist
    buf = np.full(5, rank + 1.0)
    pydist.all_reduce(buf)
    return buf.tolist()


@pytest.mark.slow
@needs_ipv6_loopback
@pytest.mark.parametrize("size", [2, 3, 4])
def test_conformance_over_tcp_on_ipv6_loopback(size):
    """The conformance matrix with every byte on tcp over ::1."""
    env = {"PYDIST_SEGMENT_BYTES": "64", "PYDIST_SHM": "0"}
    failures = run_processes(size, run_suite, init="tcp", host="::1", env=env, timeout=300)
    assert [f for per_rank in failures for f in per_rank] == []


@pytest.mark.slow
def test_ipv6_on_a_host_without_it_is_a_clear_error():
    """A store (and so a job) on ::1 where IPv6 is disabled: DistNetworkError saying so."""
    require_netns()
    program = ("import pydist\n"
               "try:\n"
               "    pydist.TCPStore('::1', 0, 1, True)\n"
               "except Exception as error:\n"
               "    print(type(error).__name__, error)\n")
    with Network(hosts=1) as net:
        net.run(0, ["sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1"], check=True)
        net.run(0, ["sysctl", "-qw", "net.ipv6.conf.lo.disable_ipv6=1"], check=True)
        out = net.run(0, [sys.executable, "-c", program], timeout=60, check=True).stdout
    assert out.startswith("DistNetworkError cannot use the IPv6 address ::1: this host has no IPv6"), out


@pytest.mark.slow
def test_pydist_run_with_an_ipv6_rendezvous_endpoint(tmp_path):
    script = tmp_path / "job.py"
    script.write_text("import os, numpy as np, pydist\n"
                      "pydist.init_process_group('pydist')\n"
                      "buf = np.ones(3) * (pydist.get_rank() + 1)\n"
                      "pydist.all_reduce(buf)\n"
                      "print('MASTER_ADDR', os.environ['MASTER_ADDR'], buf.tolist())\n"
                      "pydist.destroy_process_group()\n")
    from pydist.testing import free_port
    port = free_port("::1")
    done = subprocess.run([sys.executable, "-m", "pydist.run", "--nnodes", "1", "--nproc-per-node", "2",
                           "--rdzv-backend", "c10d", "--rdzv-endpoint", f"[::1]:{port}", str(script)],
                          capture_output=True, text=True, timeout=120, env=_env(PYDIST_SHM="0"))
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("MASTER_ADDR ::1 [3.0, 3.0, 3.0]") == 2, done.stdout


def _env(**extra):
    import os
    return {**os.environ, **extra}
