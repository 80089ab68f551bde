"""Mutual TLS on the tcp mesh (PYDIST_TLS_CERT/KEY/CA): jobs run encrypted; a certificate of
another CA, an expired one, a plain peer and a TLS peer of a plain rank are each refused: the
connecting rank fails at once naming the other rank and its host; the accepting rank drops
the connection (it proved nothing, so it may be a stray: tests/test_security_peers.py), keeps
waiting, and its timeout error lists the refused attempt. The store is a
FileStore here, so that only the mesh is tested (the TCPStore's TLS: test_store_tls.py)."""
from __future__ import annotations

import os
import socket
import ssl
import subprocess
import sys

import numpy as np
import pytest

from pydist.testing import run_processes, run_threads

pytest.importorskip("cryptography")
from pydist.testing.tls import Authority  # noqa: E402

#: Seconds: a refused rank fails at once, long before the job's 600 s timeout (generous:
#: a loaded machine can stall a process for seconds).
FAST = 120

JOB = """
import sys, datetime, numpy as np, pydist
rank = int(sys.argv[1])
pydist.init_process_group("pydist", init_method=sys.argv[2], rank=rank, world_size=2,
                          timeout=datetime.timedelta(seconds=float(sys.argv[3])))
buf = np.ones(4) * (rank + 1)
pydist.all_reduce(buf)
print("SUM", buf.tolist())
pydist.destroy_process_group()
"""


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    job, other = Authority(str(tmp_path_factory.mktemp("ca"))), Authority(str(tmp_path_factory.mktemp("other")),
                                                                                  "another CA")
    return {"good": job.issue("rank").env(), "good2": job.issue("rank2").env(), "other_ca": other.issue("rank").env(),
            "expired": job.issue("old", expired=True).env(), "plain": {}}


def _sum(rank, size):
    from pydist.groups.world import current
    from pydist.transport.tcp.tls_socket import TlsSocket
    buf = np.arange(300_000, dtype=np.float32) + rank
    import pydist
    pydist.all_reduce(buf)
    small = np.ones(3) * rank
    pydist.all_reduce(small)
    connections = current().transport.network.connections()
    return bool(np.all(buf == np.arange(300_000) * size + sum(range(size)))), small.tolist(), \
        all(isinstance(c.sock, TlsSocket) for c in connections)


@pytest.mark.slow
def test_a_job_over_tls_runs(certs):
    results = run_processes(3, _sum, init="file", env={"PYDIST_SHM": "0", **certs["good"]}, timeout=120)
    assert results == [(True, [3.0] * 3, True)] * 3


def _tls_in_threads(rank, size):
    return _sum(rank, size)


def test_thread_ranks_over_tls(certs, monkeypatch):
    for name, value in certs["good"].items():
        monkeypatch.setenv(name, value)
    results = run_threads(2, _tls_in_threads, transport="tcp", hosts=["a", "b"], timeout=60)
    assert results == [(True, [1.0] * 3, True)] * 2


def _start_job(tmp_path, env0: dict, env1: dict, timeout: float = 600) -> list[subprocess.Popen]:
    """Both ranks of JOB (file:// store in ``tmp_path``), rank r with ``env_r``, init ``timeout`` seconds."""
    init = f"file://{tmp_path}/store"
    base = {k: v for k, v in os.environ.items() if not k.startswith("PYDIST_TLS_")}
    return [subprocess.Popen([sys.executable, "-c", JOB, str(r), init, str(timeout)], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, env={**base, "PYDIST_SHM": "0", **env})
            for r, env in enumerate((env0, env1))]


def _outcomes(procs: list[subprocess.Popen]) -> list[tuple[int, str]]:
    """(exit code, output) of each process of ``_start_job``."""
    return [(p.wait(FAST), p.communicate()[0]) for p in procs]


def _job(tmp_path, env0: dict, env1: dict, timeout: float = 600) -> list[tuple[int, str]]:
    """Both ranks of JOB, run to the end: (exit code, output) each."""
    return _outcomes(_start_job(tmp_path, env0, env1, timeout))


#: seconds rank 0 waits at init in the refusal tests (it then times out listing the refusal)
REFUSED_INIT = 15
WAITED = "rank 0 timed out waiting for connections from ranks [1]; refused meanwhile: 127.0.0.1:"
#: the refusal jobs, by case: (rank 0's identity, rank 1's); "plain, good" is a TLS peer of a plain rank
REFUSALS = {"other_ca": ("good", "other_ca"), "expired": ("good", "expired"), "plain": ("good", "plain"),
            "plain, good": ("plain", "good")}


@pytest.fixture(scope="module")
def refusals(certs, tmp_path_factory) -> dict[str, list[tuple[int, str]]]:
    """Every refusal job, started at once, run to the end: {case: (exit code, output) of each
    rank}. Each job's rank 0 waits out REFUSED_INIT seconds before it fails; side by side,
    the tests of this module wait for that once instead of once each."""
    procs = {case: _start_job(tmp_path_factory.mktemp("refused"), certs[env0], certs[env1], REFUSED_INIT)
             for case, (env0, env1) in REFUSALS.items()}
    try:
        return {case: _outcomes(pair) for case, pair in procs.items()}
    finally:
        for proc in (p for pair in procs.values() for p in pair):
            if proc.poll() is None:
                proc.kill()
                proc.communicate()


@pytest.mark.slow
@pytest.mark.parametrize("case, rank0_says, rank1_says", [
    ("other_ca", "its TLS failed: tlsv1 alert unknown ca", "rank 1 refused the certificate of rank 0 at 127.0.0.1:"),
    ("expired", "its TLS failed: certificate verify failed: certificate has expired", "rank 0 at 127.0.0.1:"),
    ("plain", "it does not use TLS and this rank does (its HELLO claims rank 1)",
     "it refused this rank: it requires TLS and this rank does not use it"),
])
def test_a_peer_tls_refuses_is_named_on_both_sides(refusals, case, rank0_says, rank1_says):
    (code0, out0), (code1, out1) = refusals[case]
    assert code0 != 0 and WAITED in out0 and rank0_says in out0, out0[-3000:]
    assert code1 != 0 and rank1_says in out1, out1[-3000:]


@pytest.mark.slow
def test_a_tls_peer_of_a_plain_rank_is_named_on_both_sides(refusals):
    (code0, out0), (code1, out1) = refusals["plain, good"]
    assert code0 != 0 and WAITED in out0 and "it uses TLS and this rank does not" in out0, out0[-3000:]
    assert code1 != 0 and "rank 0 at 127.0.0.1:" in out1 and "refused the TLS connection of rank 1" in out1 \
        and "it does not use TLS" in out1, out1[-3000:]


@pytest.mark.slow
def test_two_certificates_of_the_job_ca_work_together(certs, tmp_path):
    results = _job(tmp_path, certs["good"], certs["good2"])
    assert [code for code, _ in results] == [0, 0] and all("SUM [3.0, 3.0, 3.0, 3.0]" in out for _, out in results)


def test_tls_settings_must_come_together(certs, monkeypatch):
    from pydist.net.tls import contexts
    monkeypatch.setenv("PYDIST_TLS_CERT", certs["good"]["PYDIST_TLS_CERT"])
    for name in ("PYDIST_TLS_KEY", "PYDIST_TLS_CA"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ValueError, match="TLS needs PYDIST_TLS_CERT, PYDIST_TLS_KEY, PYDIST_TLS_CA together; "
                                         "PYDIST_TLS_KEY, PYDIST_TLS_CA are not set"):
        contexts()
    monkeypatch.setenv("PYDIST_TLS_KEY", "/nonexistent.key")
    monkeypatch.setenv("PYDIST_TLS_CA", certs["good"]["PYDIST_TLS_CA"])
    with pytest.raises(ValueError, match="TLS: cannot load PYDIST_TLS_CERT="):
        contexts()


def test_the_tls_socket_sends_and_receives_in_pieces(certs):
    """The adapter over a real TLS pair: a send larger than the socket buffers goes out in
    several calls (want-write retried with the same piece) and arrives whole."""
    import threading

    from pydist.net.tls import contexts
    from pydist.transport.tcp.tls_socket import TlsSocket
    os.environ.update(certs["good"])
    try:
        tls = contexts()
    finally:
        for name in certs["good"]:
            del os.environ[name]
    assert tls is not None
    a, b = socket.socketpair()
    server: list[ssl.SSLSocket] = []
    thread = threading.Thread(target=lambda: server.append(tls.server.wrap_socket(b, server_side=True)))
    thread.start()
    client = tls.client.wrap_socket(a)
    thread.join(30)
    sender, receiver = TlsSocket(client), TlsSocket(server[0])
    sender.setblocking(False)
    receiver.setblocking(False)
    data = np.random.default_rng(0).integers(0, 255, 3_000_000, dtype=np.uint8)
    sent, got, out = 0, 0, np.zeros_like(data)
    view = memoryview(data)
    while got < data.size:
        if sent < data.size:
            try:
                sent += sender.sendmsg([view[sent:]])
            except BlockingIOError:
                pass
        try:
            got += receiver.recv_into(memoryview(out)[got:])
        except BlockingIOError:
            pass
    assert np.array_equal(out, data)
    sender.close()
    receiver.close()


LAUNCHED = """
import numpy as np, pydist
from pydist.groups.world import current
from pydist.transport.tcp.tls_socket import TlsSocket
pydist.init_process_group()
buf = np.ones(3) * (pydist.get_rank() + 1)
pydist.all_reduce(buf)
tls = all(isinstance(c.sock, TlsSocket) for c in current().transport.network.connections())
print("RESULT", buf.tolist(), tls, flush=True)
pydist.destroy_process_group()
"""


@pytest.mark.slow
def test_pydist_run_tls_flags_encrypt_the_whole_job(certs, tmp_path):
    script = tmp_path / "job.py"
    script.write_text(LAUNCHED)
    identity = certs["good"]
    base = {k: v for k, v in os.environ.items() if not k.startswith("PYDIST_TLS_")}
    done = subprocess.run([sys.executable, "-m", "pydist.run", "--standalone", "--nproc-per-node", "2",
                           "--tls-cert", identity["PYDIST_TLS_CERT"], "--tls-key", identity["PYDIST_TLS_KEY"],
                           "--tls-ca", identity["PYDIST_TLS_CA"], str(script)],
                          capture_output=True, text=True, timeout=FAST, env={**base, "PYDIST_SHM": "0"})
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("RESULT [3.0, 3.0, 3.0] True") == 2, done.stdout


@pytest.mark.slow
def test_pydist_run_tls_flags_must_come_together(certs):
    base = {k: v for k, v in os.environ.items() if not k.startswith("PYDIST_TLS_")}
    done = subprocess.run([sys.executable, "-m", "pydist.run", "--standalone", "--tls-cert",
                           certs["good"]["PYDIST_TLS_CERT"], "x.py"], capture_output=True, text=True, timeout=FAST,
                          env=base)
    assert done.returncode == 2
    assert "TLS needs PYDIST_TLS_CERT, PYDIST_TLS_KEY, PYDIST_TLS_CA together; PYDIST_TLS_KEY, PYDIST_TLS_CA are " \
        "not set" in done.stderr, done.stderr


@pytest.mark.slow
@pytest.mark.parametrize("kinds, victim", [(("all_reduce",), 2), (("broadcast",), 0), (("all_to_all", "sendrecv"), 3)])
def test_a_rank_killed_over_tls_is_named_by_every_survivor(certs, kinds, victim):
    """SIGKILL mid-operation on TLS connections (4 ranks, tcp only): as over plain tcp, every
    survivor raises naming the dead rank, before the timeout (tests/run_scripts/robust_ranks.py)."""
    from run_scripts import robust_ranks
    env = {"PYDIST_SHM": "0", **certs["good"]}
    results = [robust_ranks.kill_trial(trial, kinds=kinds, victim=victim, root=0 if kinds == ("broadcast",) else None,
                                       env=env, max_bytes=4 << 20, max_delay_s=0.75) for trial in range(3)]
    problems = [f"trial {r['trial']}: {p}" for r in results for p in robust_ranks.violations(r)]
    assert not problems, "\n".join(problems)


def _torch_sum(rank, size):
    import torch
    import torch.distributed as tdist
    from torch.distributed import distributed_c10d as c10d

    from pydist.transport.tcp.tls_socket import TlsSocket
    t = torch.ones(4) * (rank + 1)
    tdist.all_reduce(t)
    connections = c10d._get_default_group().pydist_world.transport.network.connections()
    return t.tolist(), all(isinstance(c.sock, TlsSocket) for c in connections)


@pytest.mark.slow
def test_torch_on_the_plugin_runs_its_pydist_connections_over_tls(certs):
    """torch.distributed on backend "pydist": pydist's peer connections use TLS (torch's own
    TCPStore, which pydist does not make, stays plain)."""
    pytest.importorskip("torch")
    results = run_processes(2, _torch_sum, init="torch", env={"PYDIST_SHM": "0", **certs["good"]}, timeout=120)
    assert results == [([3.0] * 4, True)] * 2
