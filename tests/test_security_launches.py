"""What an outsider can reach of a running job, per way of starting it (the table of
docs/guide/security.md): where the job listens, what its shared memory lets other users do,
and the limits of a job without a secret (a rank's place taken at startup, a store port
taken first, an open store's clients), each shown against a real job or real connections.
"""
from __future__ import annotations

import ipaddress
import os
import select
import socket
import subprocess
import sys
import threading
from datetime import timedelta
from pathlib import Path

import pytest
from launch_ways import env, skip_unless_available, start, wait_for
from test_security_peers import _Gated, _record, _recv, _run, _world

from pydist import TCPStore
from pydist.core.deadline import Deadline
from pydist.store._protocol import hello
from pydist.store.hash import HashStore
from pydist.testing import commands, free_port
from pydist.testing.procfs import family, listening
from pydist.transport.tcp.mesh import build_mesh, connect_to

pytestmark = pytest.mark.adversarial  # what an outsider can and cannot do to a running job

SCRIPTS = Path(__file__).parent / "run_scripts"
SECONDS = 90  # every wait's bound: generous (a loaded machine), under pytest-timeout's 120 s
NOBODY = 65534


# -- where a running job listens, and its segments ------------------------------------------------
def _segments(pid: int) -> dict[str, os.stat_result]:
    """The pydist segments ``pid`` has mapped (they are unlinked from /dev/shm once every
    member mapped them): path as /proc shows it -> the file's stat."""
    found = {}
    with open(f"/proc/{pid}/maps") as maps:
        for line in maps:
            fields = line.split(maxsplit=5)
            if len(fields) == 6 and fields[5].startswith("/dev/shm/pydist-"):
                found[fields[5].strip()] = os.stat(f"/proc/{pid}/map_files/{fields[0]}")
    return found


def _loopback(address: str) -> bool:
    return ipaddress.ip_address(address).is_loopback


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0, reason="reading another process's map_files needs root")
@pytest.mark.parametrize("launch", ["pydist-run", "env", "env-token", "torchrun", "mpiexec"])
def test_where_a_one_host_job_listens_and_who_may_open_its_segments(launch, tmp_path):
    """Started on one host the usual way (MASTER_ADDR 127.0.0.1, pydist-run's default), what
    pydist listens on is on loopback only (rank 0's store by hand and under mpiexec,
    pydist-run's stores; ranks' listeners close once their connections are made): nobody on
    the network reaches a pydist port. torchrun's agent store (torch's TCPStore) listens on
    every interface. The segments the ranks map are regular files of the job's user, mode
    0600, already unlinked from /dev/shm: no other user may open them."""
    skip_unless_available(launch)
    signals = tmp_path / "signals"
    signals.mkdir()
    api = "torch" if launch.startswith("torchrun") else "pydist"
    procs = start(launch, [str(SCRIPTS / "waiting_rank.py"), api, str(signals)])
    try:
        ranks = {int(wait_for(signals / f"ready{rank}", procs, SECONDS)) for rank in range(2)}
        launchers = set().union(*(family(proc.pid) for proc in procs)) - ranks
        of_ranks, of_launchers = listening(ranks, launchers), listening(launchers)
        segments = {path: stat for pid in ranks for path, stat in _segments(pid).items()}
    finally:
        (signals / "go").write_text("")
    done = commands.finish(procs, SECONDS)
    assert all(d.returncode == 0 for d in done), [d.stderr[-2000:] for d in done]
    print(f"{launch}: the ranks listen on {sorted(of_ranks)}, the launcher on {sorted(of_launchers)}; "
          f"segments mapped: {sorted((path, oct(stat.st_mode), stat.st_uid) for path, stat in segments.items())}")
    assert all(_loopback(address) for address, _ in of_ranks), of_ranks
    if launch == "pydist-run":
        assert of_launchers and all(_loopback(address) for address, _ in of_launchers), of_launchers
    if launch == "torchrun":  # torch's agent store, on every interface
        assert any(not _loopback(address) for address, _ in of_launchers), of_launchers
    assert segments, "the ranks mapped no segment"  # the host's rings at least
    for path, stat in segments.items():
        assert path.endswith(" (deleted)"), path
        assert oct(stat.st_mode) == "0o100600" and stat.st_uid == os.geteuid(), (path, oct(stat.st_mode))


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a process as another user")
def test_another_local_user_cannot_capture_loopback_traffic():
    """What a job on loopback sends between its ranks is not readable by another local user:
    capturing packets takes CAP_NET_RAW (root)."""
    child = subprocess.run([sys.executable, "-c", f"""
import os, socket
os.setgid({NOBODY}); os.setuid({NOBODY})
try:
    socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(3))
    print("captured")
except PermissionError as error:
    print("refused:", error)
"""], capture_output=True, text=True, timeout=SECONDS)
    assert child.stdout.startswith("refused: [Errno 1] Operation not permitted"), child.stdout + child.stderr


# -- without a secret: what reading the store gives ----------------------------------------------
def _rank(store, rank: int, refused_for: float = 20.0):
    """One rank of a 2-rank job's eager connection setup (``refused_for``: PYDIST_CONNECT_TIMEOUT)."""
    return build_mesh(store, rank, 2, "127.0.0.1", f"host{rank}", f"id{rank}", Deadline.after(SECONDS),
                      refused_for=refused_for)[0]


def test_without_a_secret_an_outsider_who_reads_the_store_takes_a_rank_at_startup(monkeypatch, caplog):
    """The limit of a job without a secret (docs/guide/security.md): a process that reads an
    open store (rank 1's published claim, the world token) and dials rank 0 as rank 1 before
    rank 1 does is rank 1 for rank 0: what it sends is rank 1's data, what rank 0 sends to
    rank 1 goes to it. The real rank 1 fails at PYDIST_CONNECT_TIMEOUT (rank 0, its
    connections made, listens no more) naming rank 0."""
    monkeypatch.delenv("PYDIST_AUTH_TOKEN", raising=False)
    store, opened = HashStore(), threading.Event()
    thread0, result0 = _run(_rank, store, 0)
    thread1, result1 = _run(_rank, _Gated(store, opened), 1, 0.5)  # publishes its record, then waits
    impostor = connect_to(_record(store, 0), 1, _world(store), Deadline.after(SECONDS), None,
                          claim=_record(store, 1).claim)
    opened.set()
    for thread in (thread0, thread1):
        thread.join(SECONDS)
    assert "rank 1 could not connect to rank 0" in str(result1.get("error")), result1
    to_rank_0 = result0["value"][1][0]
    impostor.sendall(b"data rank 0 takes for rank 1's")
    assert _recv(to_rank_0, 30) == b"data rank 0 takes for rank 1's"
    to_rank_0.sendall(b"meant for rank 1")
    assert _recv(impostor, 16) == b"meant for rank 1"
    impostor.close()
    to_rank_0.close()


@pytest.mark.slow
def test_a_store_port_taken_before_an_env_job_starts_fails_it_naming_the_port(tmp_path):
    """env:// by hand (and mpiexec, whose port comes from the job id): a local user who binds
    MASTER_PORT first, a silent program, makes rank 0 fail at once naming the port; the other
    ranks, which meet the job at that port, fail at their timeout."""
    port = free_port()
    squatter = socket.create_server(("127.0.0.1", port))
    script = "import pydist, datetime; pydist.init_process_group(timeout=datetime.timedelta(seconds=10))"
    try:
        procs = [commands.start_command([sys.executable, "-c", script], env=env(
            RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))) for rank in range(2)]
        rank0, rank1 = commands.finish(procs, SECONDS)
    finally:
        squatter.close()
    assert rank0.returncode != 0 and f"127.0.0.1:{port}" in rank0.stderr, rank0.stderr[-2000:]
    assert "Address already in use" in rank0.stderr, rank0.stderr[-2000:]
    assert rank1.returncode != 0, rank1.stderr[-2000:]


def test_an_open_store_keeps_every_client_that_says_hello(monkeypatch):
    """Without a token a client that sends the store's hello has proven all it can: the
    handshake timeout no longer applies to it, so only the descriptor limit bounds how many
    an outsider holds (with a token, the same connections are unproven and dropped)."""
    monkeypatch.setenv("PYDIST_HANDSHAKE_TIMEOUT", "0.2")
    with TCPStore("127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=SECONDS)) as store:
        talkers = [socket.create_connection(("127.0.0.1", store.port), timeout=SECONDS) for _ in range(50)]
        try:
            for sock in talkers:
                sock.sendall(hello())
            with socket.create_connection(("127.0.0.1", store.port), timeout=SECONDS) as idle:
                assert idle.recv(1) == b""  # dropped at its deadline, after the 50's would have passed
            readable = select.select(talkers, [], [], 0)[0]
            closed = [sock for sock in readable if sock.recv(64, socket.MSG_PEEK) == b""]
            assert closed == [], f"{len(closed)} of 50 clients that said hello were dropped"
        finally:
            for sock in talkers:
                sock.close()

