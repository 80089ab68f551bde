"""pydist-run is closed by default: a per-job secret guards its stores and its ranks.

A single-node job without PYDIST_AUTH_TOKEN gets a random secret, handed to the workers in
their environment only: an outsider that reaches the job's store (the agent's rendezvous
store or the workers' store at MASTER_ADDR:MASTER_PORT) can neither read (``tcp/token``,
the ranks' addresses) nor write (a stop record) it, and the job ends right. The secret
appears in no output, log file, store key or value. A multi-node job without a token says
once that it is open. A malformed record in the rendezvous store is an error naming the key.
"""
from __future__ import annotations

import json
import os
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest

from pydist.core.deadline import Deadline
from pydist.net.auth import AuthenticationError
from pydist.run.agent_rendezvous import MalformedRecord, NodeRecord, Rendezvous, RendezvousSettings, Round
from pydist.run.config import LaunchConfig
from pydist.run.secret import job_secret
from pydist.run.worker_store import WorkerStore
from pydist.store import HashStore, TCPStore
from pydist.testing import commands, free_port
from pydist.transport.tcp.mesh import PeerRecord, connect_to

SCRIPTS = Path(__file__).parent / "run_scripts"
PROBE = str(SCRIPTS / "secure_probe.py")
WORKER = str(SCRIPTS / "worker.py")
LAUNCHER = [sys.executable, "-m", "pydist.run"]
SHORT = timedelta(seconds=5)
OPEN_WARNING = "WARNING: this multi-node job has no shared secret"


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYDIST_AUTH_TOKEN", "PYDIST_TLS_"))}
    env.update(PYDIST_SHM="0", PYTHONPATH=os.pathsep.join([str(SCRIPTS), *sys.path]), **extra)
    env.pop("OMP_NUM_THREADS", None)
    return env


def _wait_for(path: Path, proc, timeout: float = 90) -> str:
    """The text of ``path`` once a worker wrote it (bounded; fails early if the launcher exited)."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            out = commands.finish([proc], 10)[0]
            raise AssertionError(f"no {path.name} from the workers (exit {proc.returncode}):\n{out.stderr[-3000:]}")
        time.sleep(0.05)
    return path.read_text()


def _refused(host: str, port: int) -> None:
    """An outsider without the secret (no token, a wrong one) cannot open the store at all, so
    it can read no key (tcp/token, tcp/0, rdzv/...) and write none (a stop record)."""
    for token in ("", "guessed"):
        with pytest.raises(AuthenticationError):
            TCPStore(host, port, is_master=False, timeout=SHORT, auth_token=token)


def _an_impostor_cannot_dial_rank_0(store: TCPStore) -> None:
    """Even knowing what the workers' store holds (the job's world token and rank 0's
    address, which an outsider cannot read), a connection with a wrong secret claiming to be
    rank 1 is refused by rank 0's listener, which listens on (PYDIST_TCP_CONNECT=lazy: ranks
    connect when they first talk, so the listener stays up for the job's whole life)."""
    keys = store.list_keys()
    [world_key] = [key for key in keys if key.endswith("tcp/token")]
    [rank0_key] = [key for key in keys if key.endswith("tcp/0")]
    record = PeerRecord(**json.loads(store.get(rank0_key)))
    with pytest.raises(AuthenticationError):
        connect_to(record, 1, store.get(world_key).decode(), Deadline.after(10), b"guessed")


def _torchs_client_is_refused(host: str, port: int, insider: TCPStore) -> None:
    """torch's C++ client cannot authenticate: the store drops it, so it cannot read a key
    that is there (its constructor fails on the closed connection, after its timeout)."""
    import torch.distributed as tdist

    insider.set("probe/torch", "readable")
    with pytest.raises(tdist.DistNetworkError, match="Connection was likely closed"):
        tdist.TCPStore(host, port, is_master=False, timeout=timedelta(seconds=2)).get("probe/torch")


def _all_text(store: TCPStore) -> str:
    keys = store.list_keys()
    values = [store.get(key) for key in keys if store.check([key])]
    return "\n".join(keys) + "\n" + b"\n".join(values).decode("utf-8", "replace")


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["pydist", "gloo", "gloo-tcp"])
def test_a_default_job_refuses_an_outsider_and_leaks_no_secret(tmp_path, mode):
    """gloo-tcp: torch's tcp:// naming the workers' store works under the secret, as env:// does."""
    if mode != "pydist":
        pytest.importorskip("torch")
    port, logs = free_port(), tmp_path / "logs"
    proc = commands.start_command([*LAUNCHER, "--nproc-per-node", "2", "--master-port", str(port),
                                   "--log-dir", str(logs), "--tee", "3", PROBE, mode, str(tmp_path)],
                                  env=_env(PYDIST_TCP_CONNECT="lazy"))
    try:
        secret = _wait_for(tmp_path / "secret", proc)
        addr, worker_port = _wait_for(tmp_path / "store", proc).split()
        assert len(secret) == 64 and int(secret, 16) >= 0  # secrets.token_hex(32)
        _refused("127.0.0.1", port)  # the agent's rendezvous store (stop records live there)
        _refused(addr, int(worker_port))  # the workers' store (tcp/token, the ranks' addresses)
        for where in (("127.0.0.1", port), (addr, int(worker_port))):
            insider = TCPStore(*where, is_master=False, timeout=SHORT, auth_token=secret)
            if mode != "pydist" and where[1] == int(worker_port):
                _torchs_client_is_refused(addr, int(worker_port), insider)
            text = _all_text(insider)
            if mode == "pydist" and where[1] == int(worker_port):
                _an_impostor_cannot_dial_rank_0(insider)
            insider.close()
            assert text.strip() and secret not in text
    finally:
        (tmp_path / "go").write_text("go")
    done = commands.finish([proc], 120)[0]
    assert done.returncode == 0, done.stderr[-3000:]
    results = sorted(line for line in done.stdout.splitlines() if "RESULT" in line)
    assert results == ["[rank0]:RESULT 0 [3.0, 3.0, 3.0, 3.0]", "[rank1]:RESULT 1 [3.0, 3.0, 3.0, 3.0]"]
    assert secret not in done.stdout + done.stderr
    for file in logs.rglob("*"):
        if file.is_file():
            assert secret not in file.read_text(errors="replace"), file


@pytest.mark.slow
def test_a_malformed_stop_record_written_with_the_secret_is_an_error_naming_the_key(tmp_path):
    port = free_port()
    proc = commands.start_command([*LAUNCHER, "--nproc-per-node", "2", "--master-port", str(port),
                                   "--shutdown-timeout", "2", PROBE, "pydist", str(tmp_path)],
                                  env=_env(PYDIST_AUTH_TOKEN="known to the test"))
    try:
        assert _wait_for(tmp_path / "secret", proc) == "known to the test"  # the user's token, as given
        store = TCPStore("127.0.0.1", port, is_master=False, timeout=SHORT, auth_token="known to the test")
        [round_key] = [key for key in store.list_keys() if key.endswith("/round")]
        stop_key = round_key.removesuffix("round") + "r0/stop"
        store.set(stop_key, "not json")
        store.close()
        done = commands.finish([proc], 60)[0]
    finally:
        (tmp_path / "go").write_text("go")
        commands.kill_group(proc)
    assert done.returncode == 1, done.stderr[-3000:]
    assert f"malformed record at key '{stop_key}'" in done.stderr and "not JSON" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and "RESULT" not in done.stdout


def _two_nodes(port: int, **env: str) -> list:
    """Two launchers of one c10d job (a node each) on loopback, each worker using the store."""
    args = ["--nproc-per-node", "1", "--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint",
            f"127.0.0.1:{port}", "--rdzv-id", "two", "--rdzv-conf", "join_timeout=60,last_call_timeout=0.5",
            WORKER, "rendezvous"]
    return [commands.start_command([*LAUNCHER, *args], env=_env(**env)) for _ in range(2)]


@pytest.mark.slow
def test_a_multi_node_job_without_a_token_says_once_that_it_is_open():
    results = commands.finish(_two_nodes(free_port()), 120)
    assert [r.returncode for r in results] == [0, 0], [r.stderr[-2000:] for r in results]
    for result in results:
        assert result.stderr.count(OPEN_WARNING) == 1, result.stderr
        assert "PYDIST_AUTH_TOKEN" in result.stderr and "PYDIST_TLS_CERT" in result.stderr


@pytest.mark.slow
def test_a_multi_node_job_with_a_token_uses_it_and_is_silent():
    port = free_port()
    procs = _two_nodes(port, PYDIST_AUTH_TOKEN="shared by both")
    _refused_when_up(port, procs)
    results = commands.finish(procs, 120)
    assert [r.returncode for r in results] == [0, 0], [r.stderr[-2000:] for r in results]
    assert not any(OPEN_WARNING in r.stderr or "shared by both" in r.stdout + r.stderr for r in results)


def _refused_when_up(port: int, procs) -> None:
    """Once the job's store answers (it refuses a tokenless client), a wrong token is refused too."""
    deadline = time.monotonic() + 60
    while True:
        try:
            TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=1), auth_token="").close()
        except AuthenticationError:
            break
        except RuntimeError:  # not listening yet
            assert time.monotonic() < deadline and all(p.poll() is None for p in procs), "the store never came up"
    _refused("127.0.0.1", port)


# --- the pieces, in process -----------------------------------------------------------

def test_the_job_secret_is_the_users_token_else_random_for_one_node_else_none_with_a_note():
    one = LaunchConfig(1, ["x"], base_env={})
    first, note = job_secret(one)
    assert first is not None and len(first) == 64 and note is None and job_secret(one)[0] != first
    assert job_secret(LaunchConfig(1, ["x"], base_env={"PYDIST_AUTH_TOKEN": "mine"})) == ("mine", None)
    assert job_secret(LaunchConfig(1, ["x"], max_nodes=3, base_env={"PYDIST_AUTH_TOKEN": "mine"})) == ("mine", None)
    token, note = job_secret(LaunchConfig(1, ["x"], max_nodes=2, master_port=29400, base_env={}))
    assert token is None and note is not None and "127.0.0.1:29400" in note and "PYDIST_AUTH_TOKEN" in note
    tls = dict.fromkeys(("PYDIST_TLS_CERT", "PYDIST_TLS_KEY", "PYDIST_TLS_CA"), "/x.pem")
    assert job_secret(LaunchConfig(1, ["x"], max_nodes=2, base_env=tls)) == (None, None)


def test_the_workers_store_requires_the_job_secret():
    records = (NodeRecord("a", "h", "127.0.0.1", 1, -1),)
    rdzv = Rendezvous(HashStore(), RendezvousSettings("j", 1, 1), records[0])
    served = WorkerStore(rdzv, Round(0, 0, records), "127.0.0.1", 5, "the secret")
    try:
        _refused("127.0.0.1", served.address.port)
        TCPStore("127.0.0.1", served.address.port, is_master=False, timeout=SHORT, auth_token="the secret").close()
    finally:
        served.close()


MALFORMED = [
    ("r0/stop", "not json", "not JSON"),
    ("r0/stop", '{"reason": "done"}', "field 'reason'"),  # never a stop reason: the job would "succeed"
    ("r0/stop", '["failure"]', "expected a JSON object"),
    ("r0/stop", '{"reason": "signal", "signal": "15", "host": "h"}', "field 'signal': expected int"),
    ("r0/stop", '{"reason": "signal", "signal": 9999, "host": "h"}', "not a signal number"),
    ("r0/stop", '{"reason": "failure", "exit": {"rank": 0}, "restarts_used": 0}', "field 'exit'"),
    ("r0/stop", '{"reason": "join", "host": "h", "extra": 1}', "unexpected field 'extra'"),
]


@pytest.mark.parametrize("name, value, why", MALFORMED)
def test_a_malformed_stop_record_names_its_key(name, value, why):
    store = HashStore()
    rdzv = Rendezvous(store, RendezvousSettings("job", 1, 1), NodeRecord("a", "h", "x", 1, -1))
    store.set(f"rdzv/job/{name}", value)
    with pytest.raises(MalformedRecord, match=f"key 'rdzv/job/{name}'") as caught:
        rdzv.stop_record(0)
    assert why in str(caught.value)


def test_malformed_node_round_and_workers_store_records_name_their_keys():
    settings = RendezvousSettings("job", 2, 2)
    me = NodeRecord("a", "h", "127.0.0.1", 1, -1)
    store = HashStore()
    store.set("rdzv/job/round", "zero")
    with pytest.raises(MalformedRecord, match="key 'rdzv/job/round'.*expected an integer"):
        Rendezvous(store, settings, me).join()
    store = HashStore()
    store.set("rdzv/job/r0/node/0", '{"agent_id": "b", "host": "h", "addr": "x", "nproc": "1", "node_rank": -1}')
    store.add("rdzv/job/r0/joined", 1)  # this agent joins as slot 1 of a round that closes with 2
    with pytest.raises(MalformedRecord, match="key 'rdzv/job/r0/node/0'.*field 'nproc': expected int"):
        Rendezvous(store, settings, me).join()
    store = HashStore()
    store.set("rdzv/job/r0/workers_store", '{"addr": "127.0.0.1", "port": 70000}')
    records = (me, NodeRecord("b", "h", "127.0.0.2", 1, -1))
    with pytest.raises(MalformedRecord, match="key 'rdzv/job/r0/workers_store'.*field 'port'"):
        WorkerStore(Rendezvous(store, settings, records[1]), Round(0, 1, records), "ignored", 5)


# --- started another way: rank 0 says once that the job is open ------------------------

OPEN_LOG = "pydist: this job has no shared secret, so it is open"
LOCAL_LOG = "pydist: no PYDIST_AUTH_TOKEN, so any process on this machine"  # bound to loopback only
BY_HAND = """
import sys
from datetime import timedelta
import numpy as np
import pydist as dist
dist.init_process_group(timeout=timedelta(seconds=60))
group = dist.new_group([0, 1])
data = np.ones(2)
dist.all_reduce(data, group=group)
dist.destroy_process_group()
print("RESULT", sys.argv[1], data.tolist(), flush=True)
"""


def _by_hand(**extra: str) -> list:
    port = free_port()
    procs = [commands.start_command([sys.executable, "-c", BY_HAND, str(rank)],
                                    env=_env(RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                                             MASTER_PORT=str(port), **extra)) for rank in range(2)]
    results = commands.finish(procs, 120)
    assert [r.returncode for r in results] == [0, 0], [r.stderr[-2000:] for r in results]
    assert [r.stdout.split()[-2:] for r in results] == [["[2.0,", "2.0]"]] * 2
    return results


@pytest.mark.slow
def test_a_job_started_by_hand_without_a_token_says_once_on_rank_0_that_it_is_open():
    """On MASTER_ADDR=127.0.0.1 the job is bound to loopback: the one short line."""
    rank0, rank1 = _by_hand()
    assert rank0.stderr.count(LOCAL_LOG) == 1 and OPEN_LOG not in rank0.stderr, rank0.stderr
    assert LOCAL_LOG not in rank1.stderr


@pytest.mark.slow
def test_a_job_started_by_hand_with_a_token_is_silent():
    assert not any(OPEN_LOG in r.stderr or LOCAL_LOG in r.stderr for r in _by_hand(PYDIST_AUTH_TOKEN="both ranks"))


def test_the_open_job_warning_is_logged_once_and_not_for_a_closed_or_launched_job(monkeypatch, caplog):
    from pydist.net import auth

    monkeypatch.delenv("PYDIST_AUTH_TOKEN", raising=False)
    monkeypatch.setattr(auth, "_warned_open", False)
    closed = HashStore()
    closed.auth_token = b"secret"  # type: ignore[attr-defined]
    with caplog.at_level("WARNING", logger="pydist"):
        assert not auth.warn_if_open(closed)
        monkeypatch.setenv("PYDIST_RUN_WORKER", "1")  # pydist-run said it for the job
        assert not auth.warn_if_open(HashStore())
        monkeypatch.delenv("PYDIST_RUN_WORKER")
        assert auth.warn_if_open(HashStore()) and not auth.warn_if_open(HashStore())
    assert [r.name for r in caplog.records] == ["pydist"] and LOCAL_LOG in caplog.text  # an in-process store
