"""The open-job warning in proportion (issue 48): a job without a secret whose store and rank
listeners are bound to loopback only (the one-rank ``tcp://127.0.0.1:0`` of getting started,
env:// on MASTER_ADDR=127.0.0.1) says so in one short line; a job reachable from the network
(a store bound to every interface, torch's TCPStore, a listener on another address) keeps the
whole warning. docs/guide/security.md says why."""
from __future__ import annotations

import os
import sys

import pytest

from pydist.net import auth
from pydist.store import FileStore, HashStore, TCPStore
from pydist.testing.commands import run_command

ONE_RANK = """
import numpy as np
import pydist as dist
dist.init_process_group("pydist", init_method="tcp://{host}:0", rank=0, world_size=1)
t = np.arange(4, dtype=np.float32)
dist.all_reduce(t)
dist.destroy_process_group()
"""


@pytest.fixture
def fresh(monkeypatch, caplog):
    """No token, no launcher, nothing said yet; the records logged on "pydist"."""
    for name in ("PYDIST_AUTH_TOKEN", "PYDIST_RUN_WORKER", "PYDIST_TLS_CERT", "PYDIST_TLS_KEY", "PYDIST_TLS_CA"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(auth, "_warned_open", False)
    caplog.set_level("WARNING", logger="pydist")
    return caplog


@pytest.mark.parametrize("store_host, listening", [("127.0.0.1", ["127.0.0.1"]), ("localhost", ["::1"])])
def test_a_job_bound_to_loopback_gets_one_short_line(fresh, store_host, listening):
    store = TCPStore(store_host, 0, 1, is_master=True, auth_token="")
    try:
        assert auth.warn_if_open(store, listening)
    finally:
        store.close()
    assert [r.getMessage() for r in fresh.records] == [auth.LOCAL_JOB_NOTICE]
    assert len(auth.LOCAL_JOB_NOTICE) <= 160 and "\n" not in auth.LOCAL_JOB_NOTICE
    assert "PYDIST_AUTH_TOKEN" in auth.LOCAL_JOB_NOTICE and "this machine" in auth.LOCAL_JOB_NOTICE


def test_in_process_and_file_stores_count_as_local(fresh, tmp_path):
    assert auth.reaches_only_this_machine(HashStore(), ["127.0.0.1"])
    assert auth.reaches_only_this_machine(FileStore(str(tmp_path / "store"), 1), ["127.0.0.1"])


def test_a_store_on_every_interface_or_a_listener_elsewhere_keeps_the_warning(fresh):
    everywhere = TCPStore("0.0.0.0", 0, 1, is_master=True, auth_token="")
    try:
        assert not auth.reaches_only_this_machine(everywhere, ["127.0.0.1"])
        assert auth.warn_if_open(everywhere, ["127.0.0.1"])
    finally:
        everywhere.close()
    assert not auth.reaches_only_this_machine(HashStore(), ["127.0.0.1", "10.1.2.3"])
    assert [r.getMessage() for r in fresh.records] == [auth.OPEN_JOB_WARNING]


def test_a_client_of_a_store_served_elsewhere_keeps_the_warning(fresh):
    """Where that server listens is not known here (torchrun's agent store listens everywhere)."""
    server = TCPStore("127.0.0.1", 0, 1, is_master=True, auth_token="")
    client = TCPStore("127.0.0.1", server.port, 1, is_master=False, auth_token="")
    try:
        assert not auth.reaches_only_this_machine(client, ["127.0.0.1"])
    finally:
        client.close()
        server.close()


@pytest.mark.slow
def test_getting_started_s_one_rank_job_prints_at_most_one_short_line():
    NO_TOKEN = {k: v for k, v in os.environ.items() if k != "PYDIST_AUTH_TOKEN"}
    result = run_command([sys.executable, "-c", ONE_RANK.format(host="127.0.0.1")], timeout=60,
                         env=NO_TOKEN)
    assert result.returncode == 0, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) <= 1 and all(len(line) <= 160 for line in lines), result.stderr
    wide = run_command([sys.executable, "-c", ONE_RANK.format(host="0.0.0.0")], timeout=60,
                       env=NO_TOKEN)
    assert wide.returncode == 0 and auth.OPEN_JOB_WARNING in wide.stderr, wide.stderr
